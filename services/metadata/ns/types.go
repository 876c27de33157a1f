package ns

import (
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/vfs"
)

// Cred is the identity a request runs with, as the kernel reported it for
// the peer (SO_PEERCRED) plus its supplementary groups. UID 0 is root.
type Cred struct {
	UID, GID uint32
	Groups   []uint32 // supplementary groups
	// Mounted: the client mounts the namespace inside a larger tree (the
	// C shim's WEIR_MOUNT), so ".." of the root leads out of it: a walk
	// that climbs there answers a *FollowError with Above set, where
	// otherwise ".." of the root is the root (as under chroot).
	Mounted bool
}

// isRoot reports whether c has the capabilities root has on Linux
// (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_CHOWN).
func (c *Cred) isRoot() bool { return c.UID == 0 }

// inGroup is the kernel's in_group_p: gid is the caller's group or one of
// its supplementary groups.
func (c *Cred) inGroup(gid uint32) bool {
	if c.GID == gid {
		return true
	}
	for _, g := range c.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// Ino is an inode number. Numbers are never reused.
type Ino uint64

// RootIno is the inode number of the root directory.
const RootIno Ino = 1

// MaxIncarnation is the largest incarnation the namespace hands out: the
// clients' protocol carries it in the top 24 bits of every session id and
// handle, whose highest bit only io's direct-open handles set
// (proto.MaxIncarnation).
const MaxIncarnation = 1<<23 - 1

// Attr is the persistent attributes of an inode.
type Attr struct {
	Ino                 Ino
	Mode                uint32 // syscall.S_IFDIR, S_IFREG or S_IFLNK | permission bits, setuid, setgid, sticky
	UID, GID            uint32
	Nlink               uint32
	Size                int64
	Atime, Mtime, Ctime int64  // Unix nanoseconds
	Blob                uint64 // data blob of a regular file (== uint64(Ino)); 0 for directories and symbolic links
}

// IsDir reports whether a is a directory.
func (a *Attr) IsDir() bool { return a.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// IsLink reports whether a is a symbolic link (its Size is the length of
// its target, its mode S_IFLNK|0777).
func (a *Attr) IsLink() bool { return a.Mode&syscall.S_IFMT == syscall.S_IFLNK }

// IsReg reports whether a is a regular file.
func (a *Attr) IsReg() bool { return a.Mode&syscall.S_IFMT == syscall.S_IFREG }

// FollowError is the answer of a path operation that met a symbolic link
// it must follow: the component path[Start:End] is a link to Target. The
// namespace follows no link itself (a target may lead out of weir, into
// the host's file system, which only the client can reach); the client
// resolves path[:Start] + Target + path[End:] again (an absolute Target
// replaces path[:Start]), at most 40 times, as Linux bounds a walk
// (ELOOP). Every component before Start is a directory the caller may
// search, so the new path means what the kernel's walk would.
type FollowError struct {
	Start, End int
	Target     string
	Second     bool // the link is in the second path (Rename's and Link's new one)
	// Above: path[Start:End] is a ".." of the root, for a Mounted caller:
	// the path goes on at the mount's parent with path[End:] (Target is
	// empty).
	Above bool
}

// second marks a *FollowError as met in an operation's second path.
func second(err error) error {
	if fe, ok := err.(*FollowError); ok {
		c := *fe
		c.Second = true
		return &c
	}
	return err
}

// Error describes the link.
func (e *FollowError) Error() string {
	if e.Above {
		return fmt.Sprintf("the path climbs above the root at bytes %d-%d", e.Start, e.End)
	}
	return fmt.Sprintf("symbolic link at bytes %d-%d of the path, to %q", e.Start, e.End, e.Target)
}

// MaxLinks is the number of symbolic links one resolution follows before
// it is ELOOP (Linux's MAXSYMLINKS), and LinkMax the most names a file
// may have (EMLINK beyond; ext4's EXT4_LINK_MAX).
const (
	MaxLinks = 40
	LinkMax  = 65000
)

// Dirent is one entry returned by ReadDir.
type Dirent struct {
	Name string
	Ino  Ino
	Mode uint32 // S_IF* type bits only
}

// TimeOmit, passed to Chtimes as atime or mtime, leaves that time unchanged
// (utimensat's UTIME_OMIT; os.Chtimes passes it for a zero time.Time).
const TimeOmit int64 = math.MinInt64

// TimeNow, passed to Chtimes as atime or mtime, sets that time to the
// namespace's clock (UTIME_NOW): if no time is explicit, the owner, root
// or a caller with write permission may (the touch rule; else EACCES).
const TimeNow int64 = math.MinInt64 + 1

// Options configures Open.
type Options struct {
	// Dir holds the WAL segments and checkpoints; created (0700) if missing.
	Dir string
	// CheckpointEvery is the number of WAL records between checkpoints, or
	// a quarter of the inodes the last checkpoint held if that is more (a
	// snapshot of a large namespace costs in proportion to it); 0 means
	// 10000.
	CheckpointEvery int
	// SyncEveryOp flushes the WAL before each mutation returns; concurrent
	// mutations share one flush (group commit). When false, mutations are
	// durable after Sync or within SyncInterval, but still survive a
	// SIGKILL of the service: the record reaches the kernel before the
	// mutation is applied.
	SyncEveryOp bool
	// SyncInterval is the flush period when SyncEveryOp is false; 0 means
	// 5ms (ext4 commits its journal every 5 s by default; this is shorter).
	SyncInterval time.Duration
	// Logger receives recovery and checkpoint events; nil discards them.
	Logger hclog.Logger
	// Now is the clock for timestamps; nil means time.Now.
	Now func() time.Time
	// FailSync is a failpoint for tests of code that embeds the namespace:
	// if set, it is called with the path of every file or directory about
	// to be flushed, and a non-nil result is that flush's error. Like a
	// real failed fsync it is sticky: the namespace turns read-only
	// (Err). Production code leaves it nil.
	FailSync func(path string) error
	// ReadOnly opens the namespace without changing anything on disk, for
	// an offline check of a stopped service: recovery skips a torn WAL
	// tail instead of cutting it, starts no incarnation, frees nothing,
	// and every mutation fails (Err says why).
	ReadOnly bool
	// FS is the file system the namespace persists to; nil means the real
	// one (vfs.OS). Tests of code that embeds the namespace pass a
	// *vfs.Mem to cut the power at any moment (vfs.Mem.Crash). FailSync
	// applies only to the real one.
	FS vfs.FS
}

// IOError is a failure to read or write the persistent state. Namespace
// operations return it instead of a bare syscall.Errno, and it reports
// itself as EIO whatever its cause: errors.Is(err, syscall.EIO) holds and
// errors.As(err, &errno) sets errno to EIO (a cause such as ENOSPC is not
// what the client should see). After an IOError from a flush every later
// mutation and Sync fails: the failure is sticky.
type IOError struct {
	Op  string // what was being done
	Err error  // the cause
}

// Error describes the operation and its cause.
func (e *IOError) Error() string { return "ns: " + e.Op + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *IOError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, syscall.EIO) true.
func (e *IOError) Is(target error) bool { return target == syscall.EIO }

// As makes errors.As(err, &errno) give EIO for a *syscall.Errno target.
func (e *IOError) As(target any) bool {
	if p, ok := target.(*syscall.Errno); ok {
		*p = syscall.EIO
		return true
	}
	return false
}

// ErrClosed is the cause of the IOError returned after Close.
var ErrClosed = errors.New("namespace closed")
