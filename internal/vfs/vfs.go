// Package vfs is the small file-system surface the metadata store writes
// through: the real one (OS) and an in-memory one (Mem) that remembers what
// has been made durable, so tests can cut the power at any point.
//
// Sync is the one fsync helper of the metadata store. Every flush of a file
// or a directory goes through it, so there is a single place that decides
// what a flush means on this platform.
package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// FS is what the metadata store needs from a file system. Names are full
// paths; every directory is flat (no recursion below the data directory).
type FS interface {
	// MkdirAll creates dir and its parents (mode 0700).
	MkdirAll(dir string) error
	// List returns the names (not paths) of the entries of dir, sorted.
	List(dir string) ([]string, error)
	// Create creates or truncates name for writing.
	Create(name string) (File, error)
	// OpenAppend opens an existing file; writes go to its end.
	OpenAppend(name string) (File, error)
	// ReadFile returns the whole content of name.
	ReadFile(name string) ([]byte, error)
	// Rename atomically replaces newname by oldname.
	Rename(oldname, newname string) error
	// Remove deletes a file.
	Remove(name string) error
	// SyncDir makes the entries of dir (creations, renames, removals) durable.
	SyncDir(dir string) error
	// Lock takes an exclusive lock on name (created if missing) until the
	// returned Closer is closed; it fails at once if someone holds it.
	Lock(name string) (io.Closer, error)
}

// File is an open file of an FS.
type File interface {
	io.Writer
	// Truncate cuts the file to size bytes.
	Truncate(size int64) error
	// Close closes the file without flushing it.
	Close() error
	// Name is the path the file was opened with.
	Name() string
	// sync flushes the file; call it through Sync.
	sync() error
}

// Allocator is a File whose room can be reserved before it is written
// (optional): Allocate reserves [off, off+n) without changing the size.
type Allocator interface {
	Allocate(off, n int64) error
}

// Sync makes the data written to f durable. It is the only place that
// flushes a file. A failure must be treated as permanent by the caller:
// after a failed fsync the kernel may have dropped the dirty pages, so a
// retry that succeeds proves nothing.
func Sync(f File) error {
	if err := f.sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	return nil
}

// OS is the real file system. The zero OS is ready to use.
type OS struct {
	// FailSync, if set, is called with the name of every file or
	// directory before it is flushed; a non-nil result is returned
	// instead of flushing. It is a failpoint for tests of code that embeds
	// the metadata store (ns.Options.FailSync).
	FailSync func(name string) error
}

var _ FS = OS{}

// MkdirAll implements FS.
func (OS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o700) }

// List implements FS.
func (OS) List(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// Create implements FS. Writes go to the file's end (O_APPEND), so that a
// Truncate back over a failed write makes the next write land there.
func (o OS) Create(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return osFile{f: f, failSync: o.FailSync}, nil
}

// OpenAppend implements FS.
func (o OS) OpenAppend(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	return osFile{f: f, failSync: o.FailSync}, nil
}

// ReadFile implements FS.
func (OS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

// Rename implements FS.
func (OS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Remove implements FS.
func (OS) Remove(name string) error { return os.Remove(name) }

// SyncDir implements FS.
func (o OS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return Sync(osFile{f: d, failSync: o.FailSync})
}

// Lock implements FS with flock(2), which conflicts between open file
// descriptions, so it also keeps two opens in one process apart.
func (OS) Lock(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w (is another metadata service using it?)", name, err)
	}
	return f, nil
}

type osFile struct {
	f        *os.File
	failSync func(name string) error // OS.FailSync
}

// Write implements File.
func (o osFile) Write(p []byte) (int, error) { return o.f.Write(p) }

// Truncate implements File.
func (o osFile) Truncate(size int64) error { return o.f.Truncate(size) }

// Allocate implements Allocator with fallocate(2), keeping the size; a
// file system without it is not an error (nothing is reserved).
func (o osFile) Allocate(off, n int64) error {
	for {
		err := unix.Fallocate(int(o.f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n)
		switch err {
		case unix.EINTR:
			continue
		case unix.EOPNOTSUPP:
			return nil
		}
		return err
	}
}

// Close implements File.
func (o osFile) Close() error { return o.f.Close() }

// Name implements File.
func (o osFile) Name() string { return o.f.Name() }

// sync implements File with fsync(2), unless the failpoint fails it.
func (o osFile) sync() error {
	if o.failSync != nil {
		if err := o.failSync(o.f.Name()); err != nil {
			return err
		}
	}
	return fsyncFD(int(o.f.Fd()))
}

// fsyncFD is fsync(2), retried on EINTR (which Linux does not return for
// fsync on local file systems, but FUSE and network file systems may).
func fsyncFD(fd int) error {
	for {
		err := unix.Fsync(fd)
		if err != unix.EINTR {
			return err
		}
	}
}

// Mem is an in-memory FS that models a crash: it keeps, for every file, the
// bytes written so far and the bytes made durable by the last Sync, and for
// every directory the entries made durable by the last SyncDir. Crash
// returns the image a power cut would leave; Snapshot returns the image a
// SIGKILL would leave (everything written survives). Safe for concurrent use.
type Mem struct {
	mu      sync.Mutex
	files   map[string]*memFile // current names; protected by mu
	durable map[string]*memFile // names as of their directory's last SyncDir; protected by mu
	locks   map[string]bool     // protected by mu
	// FailSync, if set, is called before every file or directory sync; a
	// non-nil result is returned instead of syncing. Set it before use or
	// under no concurrent use.
	FailSync func(name string) error
	// FailWrite, if set, is called before every write; a non-nil result
	// fails the write after writing the first half of p (a short write).
	FailWrite func(name string) error
}

var _ FS = (*Mem)(nil)

type memFile struct {
	data   []byte // contents as written; protected by Mem.mu
	synced []byte // contents as of the last Sync; protected by Mem.mu
}

// NewMem returns an empty Mem.
func NewMem() *Mem {
	return &Mem{files: map[string]*memFile{}, durable: map[string]*memFile{}, locks: map[string]bool{}}
}

// MkdirAll implements FS (directories are implicit in Mem).
func (m *Mem) MkdirAll(string) error { return nil }

// List implements FS.
func (m *Mem) List(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	for p := range m.files {
		if filepath.Dir(p) == filepath.Clean(dir) {
			names = append(names, filepath.Base(p))
		}
	}
	sort.Strings(names)
	return names, nil
}

// Create implements FS.
func (m *Mem) Create(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f, ok := m.files[name]; ok {
		f.data = nil
		return &memHandle{m: m, name: name, f: f}, nil
	}
	f := &memFile{}
	m.files[name] = f
	return &memHandle{m: m, name: name, f: f}, nil
}

// OpenAppend implements FS.
func (m *Mem) OpenAppend(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	}
	return &memHandle{m: m, name: name, f: f}, nil
}

// ReadFile implements FS.
func (m *Mem) ReadFile(name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	}
	return append([]byte(nil), f.data...), nil
}

// Rename implements FS.
func (m *Mem) Rename(oldname, newname string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.files[oldname]
	if !ok {
		return &fs.PathError{Op: "rename", Path: oldname, Err: syscall.ENOENT}
	}
	delete(m.files, oldname)
	m.files[newname] = f
	return nil
}

// Remove implements FS.
func (m *Mem) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: syscall.ENOENT}
	}
	delete(m.files, name)
	return nil
}

// SyncDir implements FS.
func (m *Mem) SyncDir(dir string) error {
	if m.FailSync != nil {
		if err := m.FailSync(dir); err != nil {
			return fmt.Errorf("fsync %s: %w", dir, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dir = filepath.Clean(dir)
	for p := range m.durable {
		if filepath.Dir(p) == dir {
			delete(m.durable, p)
		}
	}
	for p, f := range m.files {
		if filepath.Dir(p) == dir {
			m.durable[p] = f
		}
	}
	return nil
}

// Lock implements FS.
func (m *Mem) Lock(name string) (io.Closer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks[name] {
		return nil, fmt.Errorf("lock %s: %w", name, syscall.EWOULDBLOCK)
	}
	m.locks[name] = true
	return memLock{m, name}, nil
}

type memLock struct {
	m    *Mem
	name string
}

// Close releases the lock.
func (l memLock) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	delete(l.m.locks, l.name)
	return nil
}

type memHandle struct {
	m    *Mem
	name string
	f    *memFile
}

// Name implements File.
func (h *memHandle) Name() string { return h.name }

// Close implements File; Mem files hold no resources.
func (h *memHandle) Close() error { return nil }

// Write implements File: it appends to the file (Mem files are written
// only at their end), failing halfway when FailWrite says so.
func (h *memHandle) Write(p []byte) (int, error) {
	if h.m.FailWrite != nil {
		if err := h.m.FailWrite(h.name); err != nil {
			half := len(p) / 2
			h.m.mu.Lock()
			h.f.data = append(h.f.data, p[:half]...)
			h.m.mu.Unlock()
			return half, err
		}
	}
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	h.f.data = append(h.f.data, p...)
	return len(p), nil
}

// Truncate implements File; the synced bytes are untouched until Sync.
func (h *memHandle) Truncate(size int64) error {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if size < 0 {
		return syscall.EINVAL
	}
	if size <= int64(len(h.f.data)) {
		h.f.data = h.f.data[:size:size]
	} else {
		h.f.data = append(h.f.data, make([]byte, size-int64(len(h.f.data)))...)
	}
	return nil
}

// sync makes the current bytes the synced ones, unless FailSync fails it.
func (h *memHandle) sync() error {
	if h.m.FailSync != nil {
		if err := h.m.FailSync(h.name); err != nil {
			return err
		}
	}
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	h.f.synced = append([]byte(nil), h.f.data...)
	return nil
}

// Snapshot returns the image a SIGKILL of the writer would leave: every
// name and every byte written so far, durable or not.
func (m *Mem) Snapshot() *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := NewMem()
	for p, f := range m.files {
		nf := &memFile{data: append([]byte(nil), f.data...)}
		nf.synced = nf.data
		c.files[p] = nf
		c.durable[p] = nf
	}
	return c
}

// Crash returns the image a power cut would leave: only names made durable
// by SyncDir, each with its synced bytes. When the current bytes extend the
// synced ones (an append), a random prefix of the unsynced tail (from
// rnd(n), which returns a value in [0, n]) also survives, zero-filled when
// zero is true, as when the file size reached the disk but the data did not.
func (m *Mem) Crash(rnd func(n int) int, zero bool) *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := NewMem()
	for p, f := range m.durable {
		data := append([]byte(nil), f.synced...)
		if len(f.data) > len(f.synced) && string(f.data[:len(f.synced)]) == string(f.synced) {
			extra := f.data[len(f.synced):]
			k := rnd(len(extra))
			if zero {
				data = append(data, make([]byte, k)...)
			} else {
				data = append(data, extra[:k]...)
			}
		}
		nf := &memFile{data: data, synced: data}
		c.files[p] = nf
		c.durable[p] = nf
	}
	return c
}

// WriteFile replaces the content of name (durably); for tests that damage
// files on purpose.
func (m *Mem) WriteFile(name string, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	nf := &memFile{data: append([]byte(nil), data...)}
	nf.synced = nf.data
	m.files[name] = nf
	m.durable[name] = nf
}

// ErrInjected is a convenient error for FailSync and FailWrite.
var ErrInjected = errors.New("injected failure")

// Gated wraps an FS so that every call, including calls on its files,
// holds Gate for reading. Holding Gate for writing freezes the file system
// between two calls, which lets a test copy a live directory consistently,
// as a SIGKILL would leave it at that instant.
type Gated struct {
	FS   FS
	Gate *sync.RWMutex
}

var _ FS = Gated{}

// enter holds the gate for reading and returns its release.
func (g Gated) enter() func() { g.Gate.RLock(); return g.Gate.RUnlock }

// MkdirAll implements FS.
func (g Gated) MkdirAll(dir string) error { defer g.enter()(); return g.FS.MkdirAll(dir) }

// List implements FS.
func (g Gated) List(dir string) ([]string, error) { defer g.enter()(); return g.FS.List(dir) }

// Create implements FS.
func (g Gated) Create(name string) (File, error) {
	defer g.enter()()
	f, err := g.FS.Create(name)
	if err != nil {
		return nil, err
	}
	return gatedFile{f, g}, nil
}

// OpenAppend implements FS.
func (g Gated) OpenAppend(name string) (File, error) {
	defer g.enter()()
	f, err := g.FS.OpenAppend(name)
	if err != nil {
		return nil, err
	}
	return gatedFile{f, g}, nil
}

// ReadFile implements FS.
func (g Gated) ReadFile(name string) ([]byte, error) { defer g.enter()(); return g.FS.ReadFile(name) }

// Rename implements FS.
func (g Gated) Rename(o, n string) error { defer g.enter()(); return g.FS.Rename(o, n) }

// Remove implements FS.
func (g Gated) Remove(name string) error { defer g.enter()(); return g.FS.Remove(name) }

// SyncDir implements FS.
func (g Gated) SyncDir(dir string) error { defer g.enter()(); return g.FS.SyncDir(dir) }

// Lock implements FS.
func (g Gated) Lock(name string) (io.Closer, error) { defer g.enter()(); return g.FS.Lock(name) }

type gatedFile struct {
	f File
	g Gated
}

// Write implements File under the gate.
func (f gatedFile) Write(p []byte) (int, error) { defer f.g.enter()(); return f.f.Write(p) }

// Truncate implements File under the gate.
func (f gatedFile) Truncate(n int64) error { defer f.g.enter()(); return f.f.Truncate(n) }

// Close implements File under the gate.
func (f gatedFile) Close() error { defer f.g.enter()(); return f.f.Close() }

// Name implements File.
func (f gatedFile) Name() string { return f.f.Name() }

// sync implements File under the gate.
func (f gatedFile) sync() error { defer f.g.enter()(); return f.f.sync() }
