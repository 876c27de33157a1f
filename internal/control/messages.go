package control

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// Control messages between services on NATS, JSON-encoded. They carry
// grants, revocations, attributes, blob lifecycle and session checks,
// never file data and never a client's namespace request. Every subject is
// request-reply; a reply with a non-empty Error field is a refusal.
//
// Every subject of a stack starts with the stack's NATS namespace
// (nats.namespace in the configuration; DefaultNamespace unless set), so
// that stacks sharing one NATS server never answer each other:
// "weir.io.grant" in the default namespace, "prod-a.io.grant" in the
// namespace "prod-a". (This NATS namespace has nothing to do with the file
// namespace the metadata service keeps.)
//
// The metadata service's requests to the IO service all match
// "<namespace>.io.*", which the IO service takes on one subscription: NATS
// delivers the messages of one connection to one subscription in the order
// they were published, so io applies grants and revocations in the order
// metadata sent them. Each grant and revoke also carries the file's
// version (Ver) and io ignores one that is not newer than the last it
// applied to the file, so a duplicate or a straggler cannot undo a later
// change.

// DefaultNamespace is the NATS namespace of a stack that sets none; its
// subjects are "weir.io.grant" and so on.
const DefaultNamespace = "weir"

// MaxNamespaceLen bounds a NATS namespace's length in bytes, so that subjects
// stay short (NATS itself has no such limit).
const MaxNamespaceLen = 64

// Subjects are the control subjects of one stack.
type Subjects struct {
	Namespace string
	// IO is the wildcard every metadata -> io subject below matches.
	IO string
	// Grant: metadata -> io, Grant; io replies Ack (with the blob's
	// current size and mtime) once the grant is enforceable.
	Grant string
	// Revoke: metadata -> io, Revoke; io stops taking new requests on the
	// handle, waits for the ones in flight, then replies Ack with the
	// blob's final size and mtime.
	Revoke string
	// Live: metadata -> io, LiveQuery: the live size and mtime of a blob
	// that has write grants outstanding.
	Live string
	// Delete: metadata -> io, Delete: the blob's last name and last open
	// are gone.
	Delete string
	// Resync: metadata -> io at every start of the IO service's service
	// session, Resync: io drops every grant, waits for the requests in
	// flight on them and replies ResyncReply with the sizes they left.
	Resync string
	// Alloc: metadata -> io, Alloc: blob ids below Limit are allocated.
	Alloc string
	// DirGen: metadata -> io, DirGen: the directory generation is now
	// Gen; io refuses every direct open (proto.OpClaimDir) of an earlier
	// one from the moment it acks (Ack), before metadata applies the
	// change that made it move.
	DirGen string
	// Blobs: metadata -> io, BlobsQuery: a page of the blob ids the
	// backend holds (to find and reclaim orphans).
	Blobs string
	// Session: io -> metadata, SessionQuery: who owns this session?
	Session string
	// SetLive: io -> metadata, SetLive: a file's size and mtime after an
	// fsync (Sync = true: durable before the reply), at io shutdown, or
	// after a resync dropped its grants.
	SetLive string
	// SetLiveBatch: journal -> metadata, SetLiveBatch: the sizes and
	// mtimes of a checkpoint's files, made durable in one WAL commit
	// before the reply (SetLiveBatchReply).
	SetLiveBatch string
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
		Namespace: namespace,
		IO:        p + "io.*",
		Grant:     p + "io.grant",
		Revoke:    p + "io.revoke",
		Live:      p + "io.live",
		Delete:    p + "io.delete",
		Resync:    p + "io.resync",
		Alloc:     p + "io.alloc",
		DirGen:    p + "io.dirgen",
		Blobs:     p + "io.blobs",
		Session:   p + "meta.session",
		SetLive:   p + "meta.setlive",

		SetLiveBatch: p + "meta.setlivebatch",
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

// SyncMode is how a handle's writes are made durable: as they come (none),
// or each write followed by what fdatasync (O_DSYNC) or fsync (O_SYNC)
// does.
type SyncMode uint8

// Sync modes of a grant.
const (
	SyncNone SyncMode = 0
	SyncData SyncMode = 1 // O_DSYNC
	SyncAll  SyncMode = 2 // O_SYNC
)

// Grant lets a session use a handle on a blob.
type Grant struct {
	Session  uint64   `json:"session"`
	Handle   uint64   `json:"handle"`
	Ino      uint64   `json:"ino"`
	Blob     uint64   `json:"blob"`
	Read     bool     `json:"read"`
	Write    bool     `json:"write"`
	Truncate bool     `json:"truncate,omitempty"` // O_TRUNC: empty the blob first
	Sync     SyncMode `json:"sync,omitempty"`     // O_SYNC / O_DSYNC
	Ver      uint64   `json:"ver"`                // the file's version of this change
	// Fresh: the file was created since this metadata service started and
	// was never granted, so it has no blob: io refuses the grant if it
	// finds one (a blob of another namespace, or a bug), rather than
	// serve its contents as the new file's.
	Fresh bool `json:"fresh,omitempty"`
}

// Revoke ends a handle's grant, or with Handle 0 every grant of the
// session (Blob and Ver are then 0).
type Revoke struct {
	Session uint64 `json:"session"`
	Handle  uint64 `json:"handle"`
	Blob    uint64 `json:"blob,omitempty"`
	Ver     uint64 `json:"ver,omitempty"`
}

// LiveQuery asks for a blob's live attributes.
type LiveQuery struct {
	Blob uint64 `json:"blob"`
}

// Delete removes a blob.
type Delete struct {
	Blob uint64 `json:"blob"`
}

// Resync tells io that the metadata service started as Incarnation: io
// drops every grant of an earlier one, answers ESTALE to sessions of an
// earlier one, and refuses grants of blobs at or above AllocLimit.
type Resync struct {
	Incarnation uint32 `json:"incarnation"`
	AllocLimit  uint64 `json:"alloc_limit"`
	// DVFloor is the newest data version metadata has applied: io's data
	// versions from now on are above it, whatever its clock did.
	DVFloor uint64 `json:"dv_floor,omitempty"`
	// Stack is the namespace's identity (a UUID, FormatStack): io serves
	// only a store that records it, or claims a store that records none.
	// Empty says the namespace holds no file and owes no blob delete: a
	// store without an identity that holds blobs is then another
	// namespace's, and refused.
	Stack string `json:"stack"`
	Empty bool   `json:"empty,omitempty"`
	// DirGen is the directory generation (DirGen); 0 before any.
	DirGen uint64 `json:"dir_gen,omitempty"`
}

// DirGen moves io's directory generation forward (a smaller or equal Gen
// changes nothing and is acked all the same).
type DirGen struct {
	Incarnation uint32 `json:"incarnation"` // the metadata incarnation that moves it
	Gen         uint64 `json:"gen"`
}

// ResyncReply answers Resync once every request in flight on a dropped
// grant is done: Live holds the size and mtime of every file whose blob
// dropped grants wrote (at most MaxResyncLive; io reports the rest with
// SetLive).
type ResyncReply struct {
	Live []SetLive `json:"live,omitempty"`
	// CapKey is the key of read capabilities for this io epoch
	// (internal/grantcap; empty: none, every grant goes through Grant).
	CapKey []byte `json:"cap_key,omitempty"`
	// LiveTable is the path of io's live table (internal/livetab), and
	// LiveTableID the id in its header; "": none.
	LiveTable   string `json:"live_table,omitempty"`
	LiveTableID uint64 `json:"live_table_id,omitempty"`
	Error       string `json:"error,omitempty"`
}

// Err is the refusal a ResyncReply carries, or nil.
func (r *ResyncReply) Err() error {
	if r.Error == "" {
		return nil
	}
	return &Refusal{Msg: r.Error}
}

// MaxResyncLive bounds ResyncReply.Live, so that the reply stays well
// within NATS's default maximum payload (1 MiB).
const MaxResyncLive = 4096

// Alloc raises the allocation limit: blob ids below Limit are allocated.
type Alloc struct {
	Limit uint64 `json:"limit"`
}

// BlobsQuery asks for up to Max blob ids above After, ascending.
type BlobsQuery struct {
	After uint64 `json:"after"`
	Max   int    `json:"max"`
}

// BlobsReply answers BlobsQuery; More says whether ids follow the last.
type BlobsReply struct {
	Blobs []uint64 `json:"blobs"`
	More  bool     `json:"more,omitempty"`
	Error string   `json:"error,omitempty"`
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

// SetLive reports a file's live attributes to the metadata service. DV is
// io's data version of the blob at the time of the report: the metadata
// service applies a report only if its DV is newer than the last one it
// applied to the file, so a size never goes backwards.
type SetLive struct {
	Ino  uint64 `json:"ino"`
	Size int64  `json:"size"`
	// Mtime 0 keeps the mtime recorded (io knows of no write since: a
	// checkpoint of a file it opened only to sync it).
	Mtime int64  `json:"mtime"`
	DV    uint64 `json:"dv"`
	Sync  bool   `json:"sync,omitempty"`
}

// MaxLiveBatch bounds a SetLiveBatch's files.
const MaxLiveBatch = 4096

// SetLiveBatch reports the files of one checkpoint of the staging log:
// the journal service's commit of their inode fields. The metadata
// service applies each as a SetLive and makes them durable with one sync
// of its WAL before it replies.
type SetLiveBatch struct {
	Live []SetLive `json:"live"`
}

// SetLiveBatchReply answers SetLiveBatch: Gone lists the inodes that are
// no longer files (removed since; their reports need nothing more).
type SetLiveBatchReply struct {
	Gone  []uint64 `json:"gone,omitempty"`
	Error string   `json:"error,omitempty"`
}

// Err is the refusal the reply carries, or nil.
func (r *SetLiveBatchReply) Err() error {
	if r.Error == "" {
		return nil
	}
	return &Refusal{Msg: r.Error}
}

// Ack answers a control request.
type Ack struct {
	Size  int64  `json:"size,omitempty"`
	Mtime int64  `json:"mtime,omitempty"`
	DV    uint64 `json:"dv,omitempty"`    // io's data version of the blob at Size and Mtime
	Wrote bool   `json:"wrote,omitempty"` // the blob changed since io opened it
	// Unused: a revoke's answer for a grant that served no request
	// (metadata protects its holder's next grant: services/metadata/groups.go).
	Unused bool   `json:"unused,omitempty"`
	Error  string `json:"error,omitempty"`
	// Errno is the errno to pass on to a client, when a refusal has one
	// (0: EIO).
	Errno int `json:"errno,omitempty"`
}

// Err is the refusal an Ack carries, or nil.
func (a *Ack) Err() error {
	if a.Error == "" {
		return nil
	}
	return &Refusal{Msg: a.Error, Errno: a.Errno}
}

// Err is the refusal a SessionInfo carries, or nil.
func (s *SessionInfo) Err() error {
	if s.Error == "" {
		return nil
	}
	return &Refusal{Msg: s.Error}
}

// Err is the refusal a BlobsReply carries, or nil.
func (b *BlobsReply) Err() error {
	if b.Error == "" {
		return nil
	}
	return &Refusal{Msg: b.Error}
}

// Refusal is a control request the other service refused.
type Refusal struct {
	Msg   string
	Errno int
}

func (r *Refusal) Error() string { return "refused: " + r.Msg }

// Decode decodes a control message strictly: unknown fields, trailing
// data and a body that is not one JSON object are errors. Every control
// message is read with it.
func Decode(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("data after the message")
	}
	return nil
}

// FormatStack formats a stack identity (16 bytes, the metadata service's
// stack id) as a UUID: xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func FormatStack(id [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16])
}

// ParseStack reads what FormatStack wrote; the zero identity is refused.
func ParseStack(s string) ([16]byte, error) {
	var id [16]byte
	hexs := strings.ReplaceAll(s, "-", "")
	if len(s) != 36 || len(hexs) != 32 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, fmt.Errorf("stack identity %q: not a UUID: %w", s, syscall.EINVAL)
	}
	if _, err := hex.Decode(id[:], []byte(hexs)); err != nil || id == ([16]byte{}) {
		return id, fmt.Errorf("stack identity %q: not a UUID, or zero: %w", s, syscall.EINVAL)
	}
	return id, nil
}

// LeaseInfo is one kept lease, as the metadata service's leases endpoint
// lists it (`weir lease ls`).
type LeaseInfo struct {
	Lease   uint64 `json:"lease"`   // the lease id: the handle io knows its grant by
	Session uint64 `json:"session"` // the metadata session holding it
	PID     int32  `json:"pid"`     // that session's process
	UID     uint32 `json:"uid"`
	Ino     uint64 `json:"ino"`
	Handles int    `json:"handles"` // open handles using it (0: idle)
	Doomed  bool   `json:"doomed"`  // ends at its last close
	Epoch   uint64 `json:"epoch"`   // the io epoch of its grant
	// Mode is "shared" (a kept read lease, which stays after close) or
	// "exclusive" (a write grant: its trust group's lease of the file,
	// held while the handle is open).
	Mode   string `json:"mode"`
	Group  string `json:"group"`            // the trust group of its session
	Tenure uint64 `json:"tenure,omitempty"` // an exclusive lease's lease epoch
}

// LeaseRevokeRequest asks the metadata service's lease-revoke endpoint to
// end one lease (Lease) or every lease of a file (Ino); exactly one is set.
type LeaseRevokeRequest struct {
	Lease uint64 `json:"lease,omitempty"`
	Ino   uint64 `json:"ino,omitempty"`
}

// LeaseRevokeReply says what a lease-revoke did: leases ended now (idle
// ones) and leases doomed (in use: each ends at its last close, as an
// open descriptor keeps its access).
type LeaseRevokeReply struct {
	Ended  int `json:"ended"`
	Doomed int `json:"doomed"`
	// Exclusive counts the exclusive leases named: held by open writers,
	// each ends at its close or when another trust group's grant recalls it.
	Exclusive int `json:"exclusive"`
}
