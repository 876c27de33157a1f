// Package wire is the request protocol that the weir client and services
// speak over the rings of package ring, and the control messages the
// services exchange over NATS. Both the client and the services import it;
// it imports neither.
//
// Ring requests: a descriptor's opcode, Handle, Offset and Arg carry the
// fixed arguments; variable ones (paths, names) travel in the request's arena
// buffer, encoded little-endian:
//
//	u8/u16/u32/u64/i64   fixed width, little-endian
//	str                  u16 length, then that many bytes (no terminator)
//	attr                 64 bytes: ino u64, mode u32, uid u32, gid u32,
//	                     nlink u32, size i64, atime i64, mtime i64,
//	                     ctime i64, blob u64 (times in Unix nanoseconds)
//
// A service writes its response body over the request body in the same
// buffer, so a client sizes the buffer for the larger of the two; bytes after
// the request's fields are response space and are ignored. The completion's
// Result is the response length (or -errno), Aux an opcode-specific value.
// Every body is decoded with Dec, which never reads past the buffer and
// reports a short body as EINVAL.
package wire

import (
	"encoding/binary"
	"syscall"

	"github.com/weir-storage/weir/ring"
)

// Metadata ring opcodes (the metadata service's sessions).
const (
	// OpHello: no body in; out: u64 session id, 32-byte token. The token
	// binds this client's IO session to this metadata session.
	OpHello = ring.OpFirstService + iota
	// OpStat: in: str path; out: attr.
	OpStat
	// OpOpen: Arg = open flags (syscall O_*); in: u32 perm, str path;
	// out: u64 handle, attr, u8 created, u8 granted (the IO service
	// already accepts the handle; otherwise send OpGrant before the first
	// data request).
	OpOpen
	// OpClose: Handle = handle; no body.
	OpClose
	// OpMkdir: in: u32 perm, str path; out: attr.
	OpMkdir
	// OpRmdir: in: str path.
	OpRmdir
	// OpUnlink: in: str path.
	OpUnlink
	// OpRename: in: str old, str new.
	OpRename
	// OpChmod: in: u32 mode, str path.
	OpChmod
	// OpChown: in: i64 uid, i64 gid (-1 = unchanged), str path.
	OpChown
	// OpChtimes: in: i64 atime, i64 mtime, str path; TimeOmit leaves a
	// time unchanged.
	OpChtimes
	// OpReadDir: in: str path, str after (resume after this name; "" =
	// from the start); out: u32 count, count x {u64 ino, u32 mode, str
	// name}. Aux = 1 if more entries follow.
	OpReadDir
	// OpFStat: Handle = handle; out: attr.
	OpFStat
	// OpSyncMeta: make every metadata change so far durable.
	OpSyncMeta
	// OpGrant: Handle = handle of a regular file; the metadata service
	// grants it at the IO service. Idempotent.
	OpGrant
)

// IO ring opcodes (the IO service's sessions).
const (
	// OpAttach: in: u64 session id, 32-byte token from OpHello.
	OpAttach = ring.OpFirstService + iota
	// OpRead: Handle, Offset; the payload segments receive the data.
	// Result = bytes read; short at end of file.
	OpRead
	// OpWrite: Handle, Offset, Arg = WriteAppend or 0; payload = data.
	// Result = bytes written; Aux = the offset written at.
	OpWrite
	// OpTruncate: Handle, Offset = new size.
	OpTruncate
	// OpSync: Handle. Data and size durable, metadata told.
	OpSync
	// OpGetAttr: Handle; out: i64 size, i64 mtime, u8 changed (mtime is
	// meaningful only if the blob changed since it was opened).
	OpGetAttr
)

// TimeOmit in OpChtimes leaves that time unchanged (UTIME_OMIT); it is
// the namespace's ns.TimeOmit, passed through.
const TimeOmit = -1 << 63

// WriteAppend in OpWrite's Arg: write at the end of the file, atomically
// with respect to other appends.
const WriteAppend = 1

// Sizes of fixed parts.
const (
	AttrSize  = 64
	TokenSize = 32
	// MaxPath is the longest path a request may carry (PATH_MAX - 1).
	MaxPath = 4095
)

// Attr is an inode's attributes as they travel on the wire.
type Attr struct {
	Ino                 uint64
	Mode                uint32 // syscall.S_IF* type bits | permission bits
	UID, GID            uint32
	Nlink               uint32
	Size                int64
	Atime, Mtime, Ctime int64 // Unix nanoseconds
	Blob                uint64
}

// Enc appends encoded fields to a byte slice.
type Enc struct{ B []byte }

func (e *Enc) U8(v uint8)   { e.B = append(e.B, v) }
func (e *Enc) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }
func (e *Enc) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }
func (e *Enc) I64(v int64)  { e.U64(uint64(v)) }
func (e *Enc) Bytes(p []byte) {
	e.B = append(e.B, p...)
}

// Str appends a length-prefixed string. Callers keep strings under 64 KiB
// (paths are bounded by MaxPath before they are encoded).
func (e *Enc) Str(s string) {
	e.B = binary.LittleEndian.AppendUint16(e.B, uint16(len(s)))
	e.B = append(e.B, s...)
}

func (e *Enc) Attr(a *Attr) {
	e.U64(a.Ino)
	e.U32(a.Mode)
	e.U32(a.UID)
	e.U32(a.GID)
	e.U32(a.Nlink)
	e.I64(a.Size)
	e.I64(a.Atime)
	e.I64(a.Mtime)
	e.I64(a.Ctime)
	e.U64(a.Blob)
}

// Dec reads fields from an untrusted byte slice. After a failed read every
// later read returns zero values and Err reports EINVAL.
type Dec struct {
	b   []byte
	bad bool
}

// NewDec decodes b.
func NewDec(b []byte) *Dec { return &Dec{b: b} }

func (d *Dec) take(n int) []byte {
	if d.bad || n < 0 || len(d.b) < n {
		d.bad = true
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *Dec) U8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *Dec) U32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *Dec) U64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *Dec) I64() int64 { return int64(d.U64()) }

// Bytes returns the next n bytes (aliasing the input).
func (d *Dec) Bytes(n int) []byte { return d.take(n) }

// Str returns a copy of the next length-prefixed string.
func (d *Dec) Str() string {
	p := d.take(2)
	if p == nil {
		return ""
	}
	return string(d.take(int(binary.LittleEndian.Uint16(p))))
}

func (d *Dec) Attr() Attr {
	return Attr{
		Ino: d.U64(), Mode: d.U32(), UID: d.U32(), GID: d.U32(), Nlink: d.U32(),
		Size: d.I64(), Atime: d.I64(), Mtime: d.I64(), Ctime: d.I64(), Blob: d.U64(),
	}
}

// Err is EINVAL if any read ran past the end, nil otherwise.
func (d *Dec) Err() error {
	if d.bad {
		return syscall.EINVAL
	}
	return nil
}
