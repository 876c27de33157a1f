package conformance

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// KernelFactory is the name the kernel target is registered under.
const KernelFactory = "kernel"

// KernelTarget returns the reference target: the kernel, through package os,
// on a fresh empty directory (mode 0755, owned by the caller) that is removed
// when t ends. Names resolve under that directory as described at Within.
func KernelTarget(t *testing.T) FS {
	t.Helper()
	root, err := os.MkdirTemp("", "weir-conformance-*")
	if err != nil {
		t.Fatalf("conformance: kernel root: %v", err)
	}
	t.Cleanup(func() {
		if err := removeTree(root); err != nil {
			t.Errorf("conformance: removing %s: %v", root, err)
		}
	})
	// MkdirTemp makes the root 0700; a child running as another uid must
	// be able to search it, and a fresh root is 0755 on every target.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatalf("conformance: kernel root: %v", err)
	}
	s := Within(osFS{}, root)
	s.Factory, s.Arg = KernelFactory, root
	return s
}

// removeTree removes dir even if a case left directories without write or
// search permission (which stop a non-root RemoveAll).
func removeTree(dir string) error {
	// WalkDir visits a directory before reading it, so the chmod comes first.
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// osFS is the kernel through package os, on real paths.
//
// Rename is rename(2) itself, not os.Rename: os.Rename refuses any existing
// directory as target with EEXIST before asking the kernel, so it would hide
// the kernel's answers (a directory onto an empty directory succeeds, onto a
// non-empty one gives ENOTEMPTY, a file onto a directory EISDIR).
type osFS struct{}

var (
	_ FS        = osFS{}
	_ Restarter = osFS{}
)

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err // not a typed nil *os.File in a File
	}
	return f, nil
}

func (osFS) Mkdir(name string, perm fs.FileMode) error    { return os.Mkdir(name, perm) }
func (osFS) MkdirAll(name string, perm fs.FileMode) error { return os.MkdirAll(name, perm) }
func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) RemoveAll(name string) error                  { return os.RemoveAll(name) }
func (osFS) Stat(name string) (fs.FileInfo, error)        { return os.Stat(name) }
func (osFS) Chmod(name string, mode fs.FileMode) error    { return os.Chmod(name, mode) }
func (osFS) Chown(name string, uid, gid int) error        { return os.Chown(name, uid, gid) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error)   { return os.ReadDir(name) }
func (osFS) Truncate(name string, size int64) error       { return os.Truncate(name, size) }

func (osFS) Chtimes(name string, atime, mtime time.Time) error {
	return os.Chtimes(name, atime, mtime)
}

func (osFS) Touch(name string) error {
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, name, nil, 0); err != nil {
		return &fs.PathError{Op: "touch", Path: name, Err: err}
	}
	return nil
}

func (osFS) Rename(oldname, newname string) error {
	var err error
	for {
		if err = syscall.Rename(oldname, newname); err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	return nil
}

// Restart does nothing: the kernel keeps its state.
func (osFS) Restart() error { return nil }

// factories holds the registered ways to reach a root from a child process.
var factories = struct {
	sync.Mutex
	m map[string]func(arg string) (FS, error) // protected by Mutex
}{m: map[string]func(string) (FS, error){
	KernelFactory: func(root string) (FS, error) {
		fi, err := os.Stat(root)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("conformance: kernel root %s is not a directory", root)
		}
		return Within(osFS{}, root), nil
	},
}}

// RegisterFactory makes open reachable under name for the child processes of
// NeedNonRoot cases (see Reopener). Call it from TestMain before MainHook: the
// child is a fresh copy of the test binary and runs only TestMain.
func RegisterFactory(name string, open func(arg string) (FS, error)) {
	factories.Lock()
	defer factories.Unlock()
	if _, dup := factories.m[name]; dup {
		panic("conformance: factory " + name + " registered twice")
	}
	factories.m[name] = open
}

func lookupFactory(name string) (func(string) (FS, error), bool) {
	factories.Lock()
	defer factories.Unlock()
	f, ok := factories.m[name]
	return f, ok
}
