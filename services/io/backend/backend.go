// Package backend defines how the IO service stores file data: one blob per
// file, named by a BlobID, behind the Backend interface.
//
// The interface is shaped so that SPDK Blobstore fits it unchanged: a blob is
// the whole data of one file; creating, deleting and resizing a blob are
// metadata operations (on SPDK they run on the one thread that loaded the
// blobstore); reads and writes go through handles that the IO service's
// polling workers use concurrently (on SPDK, through per-worker IO channels).
// Every implementation must therefore be safe for concurrent use, both of a
// Backend and of each Blob handle.
//
// Implementations: backend/file (the default: one file per blob, O_DIRECT
// where the file system allows it), backend/mem (sparse, in memory, for
// tests), backend/faulty (a wrapper that injects errors) and, later, the SPDK
// backend. backend/backendtest is the conformance suite all of them pass.
//
// Errors are syscall.Errno values wrapped with context, so callers test them
// with errors.Is(err, syscall.ENOENT) and the IO service can return the errno
// to a client unchanged:
//
//	EINVAL  blob id 0, negative offset or size
//	EFBIG   offset+length overflows int64 or ends beyond MaxBlobSize
//	EEXIST  Create of a blob that exists
//	ENOENT  Open or Delete of a blob that does not exist
//	EBUSY   Delete while a Blob handle of that blob is open
//	EBADF   any use of a Blob after its Close, or of a Backend after its Close
//	EIO     and others: whatever the storage reports
package backend

import (
	"syscall"

	"github.com/weir-storage/weir/internal/control"
)

// Reporter is implemented by backends with counters worth showing in the
// IO service's stats (weir status).
type Reporter interface {
	Counters() map[string]uint64
}

// Auditor is implemented by backends whose storage can hold objects that
// are not weir blobs, or that claim a blob id another object claims too
// (SPDK: blobs without a valid weir.id xattr, or two with the same one).
// Strays describes each, for weir check; the backend serves neither.
type Auditor interface {
	Strays() []string
}

// MemRegistrar is implemented by backends that can move data straight
// between a device and memory registered with them (SPDK DMAs only from
// registered memory). The IO service registers each session's ring region
// when the session starts, so that payloads go from the client's arena to
// the device without a copy, and unregisters it after the session's last
// request and before the region is unmapped.
//
// HugePages says whether the backend wants regions backed by huge pages
// (MFD_HUGETLB): SPDK registers memory in 2 MiB units. RegisterMem's mem
// must stay mapped until UnregisterMem(mem) returns. A backend that cannot
// register a region returns an error and must still serve reads and writes
// of that memory, through a copy (a bounce buffer) it counts in Counters.
type MemRegistrar interface {
	HugePages() bool
	RegisterMem(mem []byte) error
	UnregisterMem(mem []byte) error
}

// BlobID names one blob: the data of one file. 0 is never a valid id.
type BlobID uint64

// StagingBlob is the blob that holds the IO service's staging log (the
// fsync records of internal/staging), not a file's: the metadata
// service allocates ids up to its inode limit (2^48), far below it, the IO
// service refuses grants and deletes of it, and fsck checks it as the log.
const StagingBlob BlobID = 1<<64 - 2

// MaxBlobSize is the largest size a blob may have, in bytes (64 TiB). A read,
// write or truncate that would end beyond it fails with EFBIG. A backend may
// refuse smaller sizes with the error its storage reports (ext4, for
// example, stops at 16 TiB with 4 KiB blocks).
const MaxBlobSize int64 = 1 << 46

// Backend stores blobs. Shaped so that SPDK Blobstore fits it unchanged (one
// blob per file; create/delete/resize are metadata operations; reads and
// writes go through per-worker channels): implementations must be safe for
// concurrent use.
type Backend interface {
	// Create makes a new empty blob; EEXIST if present.
	Create(id BlobID) error
	// Open returns a handle to an existing blob; ENOENT if missing. Many
	// opens of one blob are allowed, and their handles share the blob's
	// data and size.
	Open(id BlobID) (Blob, error)
	// Delete removes a blob; ENOENT if missing, EBUSY while any Blob handle
	// of it is open.
	Delete(id BlobID) error
	// List returns every blob, ascending (for fsck).
	List() ([]BlobID, error)
	// Sync makes the creates and deletes so far durable. It does not sync
	// blob data: that is Blob.Sync. The IO service calls it at an fsync
	// when a blob was created since its last call, so that a file
	// created, written and fsynced survives a power cut
	// (TestFsyncSurvivesPowerCut, package powercut).
	Sync() error
	// Close releases the backend. Blob handles still open become unusable
	// (EBADF); every later call on the backend returns EBADF.
	Close() error
	// Name is the backend's short name: "file", "mem".
	Name() string
	// Identity returns the stack a store belongs to, as SetIdentity
	// recorded it; ok is false when none is recorded (a new store, or one
	// written before identities existed).
	Identity() (id Identity, ok bool, err error)
	// SetIdentity records, durably, that the store belongs to stack id;
	// EEXIST if another identity is recorded (the same one is a no-op),
	// EROFS on a read-only backend.
	SetIdentity(id Identity) error
}

// SyncAller is a backend that can make every byte written to any blob so
// far durable at once, for syncfs (proto.OpSyncFS): the first syncfs after
// io starts calls it, so that what an earlier incarnation wrote and never
// synced (its list of such blobs died with it) is covered too. It is
// optional: a backend whose writes are not cached between the device and
// itself has nothing to add.
type SyncAller interface {
	SyncAll() error
}

// Reserver is a blob whose room on the store can be allocated before its
// bytes are written: the IO service reserves a cached write's range when
// it takes the write, so that the write fails with ENOSPC then, as the
// kernel's delayed allocation does at write(2), and writing it home later,
// or replaying a staging record into it, needs no new room. Optional: a
// blob without it is written home where the device has room.
type Reserver interface {
	// Reserve allocates the room of [off, off+n) without changing the
	// blob's size or bytes; ENOSPC when the store has none.
	Reserve(off, n int64) error
	// Dense reports whether every byte below the blob's size has its
	// room (no hole).
	Dense() bool
	// Trim gives back the room Reserve allocated past the blob's size,
	// up to end.
	Trim(end int64) error
}

// IdleKeeper is a backend that keeps a blob's descriptor open after its
// last handle closes (the file backend's idle files, so that opening it
// again costs no system call). The IO service bounds them within its
// descriptor budget and takes them back under pressure. Optional.
type IdleKeeper interface {
	// SetIdleLimit bounds the idle blobs kept open (0: none).
	SetIdleLimit(n int)
	// DropIdle closes up to n idle blobs, least recently used first, and
	// returns how many it closed.
	DropIdle(n int) int
}

// Spacer is a backend that can say how much room its store has, for
// statfs(2) through the IO service (proto.OpStatFS). It is optional: the
// service answers EOPNOTSUPP for a backend without it.
type Spacer interface {
	// Space returns the store's size and what is left of it, in bytes.
	Space() (Space, error)
}

// Space is a store's room in bytes: Free to the superuser, Avail to
// anyone (statfs's f_bfree and f_bavail).
type Space struct {
	Total, Free, Avail uint64
}

// Identity names a stack: the UUID its metadata service chose when its
// namespace was created (the boot record's stack id). A store records the
// identity of the one stack it belongs to, and the IO service serves it
// only to that stack's metadata service, so that a new namespace never
// reads an old namespace's blobs.
type Identity [16]byte

// String formats the identity as a UUID (control.FormatStack).
func (id Identity) String() string { return control.FormatStack(id) }

// ParseIdentity reads what String wrote.
func ParseIdentity(s string) (Identity, error) {
	id, err := control.ParseStack(s)
	return Identity(id), err
}

// Blob is an open handle to one blob. Its methods are safe for concurrent
// use; concurrent writes to disjoint byte ranges never lose each other's
// bytes, even when the ranges share a device block.
type Blob interface {
	// ID returns the blob's id.
	ID() BlobID
	// ReadAt reads len(p) bytes at off. Holes read as zeros; a read reaching
	// past Size returns the bytes up to Size and io.EOF.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes p at off, which may be any offset; it extends Size to
	// off+len(p) if that is larger. An empty p changes nothing.
	WriteAt(p []byte, off int64) (int, error)
	// Size returns the blob's size in bytes.
	Size() int64
	// Truncate sets the size: it shrinks, or grows with zeros.
	Truncate(size int64) error
	// Sync makes this blob's data and size durable. A failed sync is
	// sticky: every later Sync returns the error.
	Sync() error
	// Close releases the handle; later calls on it return EBADF.
	Close() error
}

// DurableWriter is a Blob that can write a range and make it durable in
// one call, for less than WriteAt then Sync (the file backend: one
// O_DIRECT write with RWF_DSYNC, no page cache and one system call). It
// makes durable only what it writes, not earlier WriteAts of the blob,
// and writes only inside the blob's size. errors.ErrUnsupported: not on
// this blob, or not this range (the caller writes and syncs instead).
// The staging log's lone appends use it (internal/staging).
type DurableWriter interface {
	WriteAtDurable(p []byte, off int64) (int, error)
}

// CheckID returns EINVAL for the invalid id 0 and nil otherwise.
func CheckID(id BlobID) error {
	if id == 0 {
		return syscall.EINVAL
	}
	return nil
}

// CheckRange validates an access of n bytes at off: EINVAL for a negative
// off, EFBIG when off+n overflows or ends beyond MaxBlobSize. Backends call
// it before touching storage and wrap the errno with their context.
func CheckRange(off int64, n int) error {
	if off < 0 || n < 0 {
		return syscall.EINVAL
	}
	if off > MaxBlobSize || int64(n) > MaxBlobSize-off {
		return syscall.EFBIG
	}
	return nil
}

// CheckSize validates a size given to Truncate: EINVAL when negative, EFBIG
// beyond MaxBlobSize.
func CheckSize(size int64) error {
	if size < 0 {
		return syscall.EINVAL
	}
	if size > MaxBlobSize {
		return syscall.EFBIG
	}
	return nil
}
