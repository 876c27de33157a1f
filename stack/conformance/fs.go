package conformance

import (
	"io"
	"io/fs"
	"time"
)

// FS is the file-system surface the suite exercises. The weir client and the
// kernel target both satisfy it; it mirrors the functions of package os.
//
// Names are relative to the target's root. A leading "/" names the root
// itself, so "/x" and "x" are the same file, and ".." at the root stays at the
// root, as in a chroot: no name reaches outside the root.
type FS interface {
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Mkdir(name string, perm fs.FileMode) error
	MkdirAll(name string, perm fs.FileMode) error
	Remove(name string) error
	RemoveAll(name string) error
	Rename(oldname, newname string) error
	Stat(name string) (fs.FileInfo, error)
	Chmod(name string, mode fs.FileMode) error
	Chown(name string, uid, gid int) error
	Chtimes(name string, atime, mtime time.Time) error
	// Touch sets both times to now, as utimensat(name, NULL): the owner,
	// root or a caller that may write the file may.
	Touch(name string) error
	ReadDir(name string) ([]fs.DirEntry, error)
	Truncate(name string, size int64) error
}

// File is an open file of an FS; it mirrors *os.File.
type File interface {
	io.Reader
	io.Writer
	io.ReaderAt
	io.WriterAt
	io.Seeker
	io.Closer
	Truncate(size int64) error
	Sync() error
	Stat() (fs.FileInfo, error)
	ReadDir(n int) ([]fs.DirEntry, error)
	Name() string
}

// Reopener is implemented by an FS whose root another process can reach.
// NeedNonRoot cases run in a child process under another uid; the child calls
// the factory registered under the returned name (RegisterFactory) with arg
// and must get the same root, seen with the child's credentials.
type Reopener interface {
	Reopen() (factory, arg string)
}

// Restarter is implemented by an FS whose storage can be stopped and started
// again. Restart is called with no file of the FS open; afterwards the FS must
// work as before and show the same contents. The kernel target's Restart does
// nothing; the weir target stops every service and starts it again on the same
// data directory.
type Restarter interface {
	Restart() error
}

// Requirement says what identity a case needs.
type Requirement uint8

const (
	// NeedNothing cases give the same results as root and as any other user.
	NeedNothing Requirement = iota
	// NeedNonRoot cases check permissions: they run in a child process as
	// uid 65534, gid 65534 (plus Case.Groups) after Case.Setup prepared the
	// root as root. They are skipped when the test does not run as root.
	// The child finds the case by name in Cases().
	NeedNonRoot
	// NeedRoot cases check root's override of permissions and ownership
	// changes; they are skipped when the test does not run as root.
	NeedRoot
)

// Case is one entry of the suite's table.
type Case struct {
	// Name is "group/what", unique in the table.
	Name string
	// Needs is the identity the case runs under.
	Needs Requirement
	// Groups are the supplementary groups of the child of a NeedNonRoot case.
	Groups []uint32
	// Setup, if set (NeedNonRoot and two-process cases), runs first,
	// always as the test's own identity (root when NeedNonRoot cases run),
	// on the same root. Its observations are prefixed "setup: ".
	Setup func(t *Tester)
	// Run is the case proper.
	Run func(t *Tester)
	// Peer, if set, are steps a second process runs on the same root when
	// Run asks for them (Tester.Peer, PeerStart): cases of what one
	// process sees of another's changes (peer.go).
	Peer map[string]func(t *Tester)
}
