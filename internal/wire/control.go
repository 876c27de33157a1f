package wire

import (
	"errors"
	"fmt"
	"strings"
)

// Control messages between services on NATS, JSON-encoded. They carry
// grants, revocations and attributes, never file data and never a client's
// namespace request. Subjects are request-reply; a reply with a non-empty
// Error field is a refusal.
//
// Every subject of a stack starts with the stack's NATS namespace
// (nats.namespace in the configuration; DefaultNamespace unless set), so
// that stacks sharing one NATS server never answer each other:
// "weir.io.grant" in the default namespace, "prod-a.io.grant" in the
// namespace "prod-a". (This NATS namespace has nothing to do with the file
// namespace the metadata service keeps.)

// DefaultNamespace is the NATS namespace of a stack that sets none; its
// subjects are "weir.io.grant" and so on.
const DefaultNamespace = "weir"

// MaxNamespaceLen bounds a NATS namespace's length in bytes, so that subjects
// stay short (NATS itself has no such limit).
const MaxNamespaceLen = 64

// Subjects are the control subjects of one stack.
type Subjects struct {
	// Grant: metadata -> io, Grant; io replies Ack (with the blob's
	// current LiveAttr) once the grant is enforceable.
	Grant string
	// Revoke: metadata -> io, Revoke; io replies Ack with the blob's live
	// size and mtime after in-flight requests on the handle finish.
	Revoke string
	// Live: metadata -> io, LiveQuery: the live size and mtime of a blob
	// that has write grants outstanding.
	Live string
	// Delete: metadata -> io, Delete: the blob's last name and last open
	// are gone.
	Delete string
	// Session: io -> metadata, SessionQuery: who owns this session?
	Session string
	// SetLive: io -> metadata, SetLive: a file's size and mtime after an
	// fsync (Sync = true: durable before the reply) or at io shutdown.
	SetLive string
}

// SubjectsIn returns the control subjects of the stack whose NATS
// namespace is namespace ("" means DefaultNamespace). Check the namespace
// first with CheckNamespace.
func SubjectsIn(namespace string) Subjects {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	p := namespace + "."
	return Subjects{
		Grant:   p + "io.grant",
		Revoke:  p + "io.revoke",
		Live:    p + "io.live",
		Delete:  p + "io.delete",
		Session: p + "meta.session",
		SetLive: p + "meta.setlive",
	}
}

// CheckNamespace accepts a NATS namespace: one or more tokens separated by
// dots, each made of ASCII letters, digits, '-' and '_', at most
// MaxNamespaceLen bytes in all. That excludes the wildcards '*' and '>',
// white space, empty tokens and the '$' of the server's own subjects.
func CheckNamespace(namespace string) error {
	if namespace == "" {
		return errors.New("must not be empty")
	}
	if len(namespace) > MaxNamespaceLen {
		return fmt.Errorf("%q is %d bytes long; at most %d", namespace, len(namespace), MaxNamespaceLen)
	}
	for tok := range strings.SplitSeq(namespace, ".") {
		if tok == "" {
			return fmt.Errorf("%q has an empty token (a leading, trailing or double dot)", namespace)
		}
		for _, r := range tok {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("%q: %q is not allowed; use letters, digits, '-', '_' and dots between tokens", namespace, r)
			}
		}
	}
	return nil
}

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
