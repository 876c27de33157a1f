package wire

import "errors"

// Control messages between services on NATS, JSON-encoded. They carry
// grants, revocations and attributes, never file data and never a client's
// namespace request. Subjects are request-reply; a reply with a non-empty
// Error field is a refusal.
const (
	// SubjGrant: metadata -> io, Grant; io replies Ack (with the blob's
	// current LiveAttr) once the grant is enforceable.
	SubjGrant = "weir.io.grant"
	// SubjRevoke: metadata -> io, Revoke; io replies Ack with the blob's
	// live size and mtime after in-flight requests on the handle finish.
	SubjRevoke = "weir.io.revoke"
	// SubjLive: metadata -> io, LiveQuery: the live size and mtime of a
	// blob that has write grants outstanding.
	SubjLive = "weir.io.live"
	// SubjDelete: metadata -> io, Delete: the blob's last name and last
	// open are gone.
	SubjDelete = "weir.io.delete"
	// SubjSession: io -> metadata, SessionQuery: who owns this session?
	SubjSession = "weir.meta.session"
	// SubjSetLive: io -> metadata, SetLive: a file's size and mtime after
	// an fsync (Sync = true: durable before the reply) or at io shutdown.
	SubjSetLive = "weir.meta.setlive"
)

// Grant lets a session use a handle on a blob.
type Grant struct {
	Session  uint64 `json:"session"`
	Handle   uint64 `json:"handle"`
	Ino      uint64 `json:"ino"`
	Blob     uint64 `json:"blob"`
	Read     bool   `json:"read"`
	Write    bool   `json:"write"`
	Truncate bool   `json:"truncate,omitempty"` // O_TRUNC: empty the blob first
}

// Revoke ends a handle's grant; Handle 0 ends every grant of the session.
type Revoke struct {
	Session uint64 `json:"session"`
	Handle  uint64 `json:"handle"`
}

// LiveQuery asks for a blob's live attributes.
type LiveQuery struct {
	Blob uint64 `json:"blob"`
}

// Delete removes a blob.
type Delete struct {
	Blob uint64 `json:"blob"`
}

// SessionQuery asks the metadata service to vouch for a session.
type SessionQuery struct {
	Session uint64 `json:"session"`
	Token   []byte `json:"token"`
}

// SessionInfo is who owns a session, as the kernel told the metadata
// service at its handshake.
type SessionInfo struct {
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
	PID   int32  `json:"pid"`
	Error string `json:"error,omitempty"`
}

// SetLive reports a file's live attributes to the metadata service.
type SetLive struct {
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"`
	Sync  bool   `json:"sync,omitempty"`
}

// Ack answers a control request.
type Ack struct {
	Size  int64  `json:"size,omitempty"`
	Mtime int64  `json:"mtime,omitempty"`
	Wrote bool   `json:"wrote,omitempty"` // the blob changed since the grant
	Error string `json:"error,omitempty"`
}

// Err is the refusal an Ack carries, or nil.
func (a *Ack) Err() error {
	if a.Error == "" {
		return nil
	}
	return errors.New(a.Error)
}

// Err is the refusal a SessionInfo carries, or nil.
func (s *SessionInfo) Err() error {
	if s.Error == "" {
		return nil
	}
	return errors.New(s.Error)
}
