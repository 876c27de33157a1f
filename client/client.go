// Package client is the Go client of weir. It looks like package os and
// io/fs: Dial returns an *FS with OpenFile, Mkdir, Rename, Stat, ReadDir and
// friends, and *File has Read, Write, ReadAt, WriteAt, Seek, Truncate, Sync,
// Stat, ReadDir and Close. Errors are *fs.PathError (or *os.LinkError for
// Rename) wrapping a syscall.Errno, so errors.Is(err, fs.ErrNotExist) works.
//
// Every request travels on shared-memory rings (package ring): namespace
// requests to the metadata service, reads and writes to the IO service. No
// socket is used after the two handshakes.
//
// Paths are relative to the root of the weir file system; a leading "/" means
// the same. FS.Open follows the io/fs contract instead (fs.ValidPath names).
package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// Options say where the services are and how to wait for them.
type Options struct {
	// MetadataSocket and IOSocket are the services' Unix sockets, as
	// `weir up` prints them. An empty one is found in the run directory:
	// $WEIR_RUN_DIR if set, else DefaultRunDir (where weir up puts the
	// sockets when it runs on the default data directory).
	MetadataSocket string
	IOSocket       string
	// Mode is how a caller waits for its completion; WaitAdaptive spins
	// briefly and then sleeps, WaitBusyPoll never sleeps.
	Mode ring.WaitMode
}

// FS is a connection to weir: one metadata session and one IO session. It is
// safe for concurrent use by many goroutines.
type FS struct {
	meta  *ring.Client
	data  *ring.Client
	umask uint32
	chunk int // largest payload of one read or write request
}

var (
	_ fs.FS         = (*FS)(nil)
	_ fs.StatFS     = (*FS)(nil)
	_ fs.ReadDirFS  = (*FS)(nil)
	_ fs.ReadFileFS = (*FS)(nil)
)

var bgctx = context.Background()

// Where the services' sockets are when Options leaves them empty: the same
// defaults as the services' own configuration (configs/weir.hcl: run_dir,
// metadata.socket, io.socket).
const (
	// DefaultRunDir is run_dir for the default data_dir, /var/lib/weir.
	DefaultRunDir = "/var/lib/weir/run"
	// RunDirEnv names the environment variable that overrides it.
	RunDirEnv          = "WEIR_RUN_DIR"
	MetadataSocketName = "metadata.sock"
	IOSocketName       = "io.sock"
)

// RunDir is the directory Dial looks in for sockets Options leaves empty:
// $WEIR_RUN_DIR, or DefaultRunDir when that is unset or empty.
func RunDir() string {
	if d := os.Getenv(RunDirEnv); d != "" {
		return d
	}
	return DefaultRunDir
}

// maxChunk bounds one read or write request; larger calls are split.
const maxChunk = 1 << 20

// Dial connects to the metadata and IO services.
func Dial(ctx context.Context, opts Options) (*FS, error) {
	if opts.MetadataSocket == "" {
		opts.MetadataSocket = filepath.Join(RunDir(), MetadataSocketName)
	}
	if opts.IOSocket == "" {
		opts.IOSocket = filepath.Join(RunDir(), IOSocketName)
	}
	meta, err := ring.Dial(ctx, opts.MetadataSocket, ring.ClientOptions{Mode: opts.Mode})
	if err != nil {
		return nil, fmt.Errorf("weir: connect to metadata service: %w", err)
	}
	f := &FS{meta: meta, umask: processUmask()}
	var out [8 + proto.TokenSize]byte
	if _, err := f.call(meta, proto.OpHello, 0, 0, 0, nil, out[:]); err != nil {
		meta.Close()
		return nil, fmt.Errorf("weir: hello: %w", err)
	}
	data, err := ring.Dial(ctx, opts.IOSocket, ring.ClientOptions{Mode: opts.Mode})
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("weir: connect to IO service: %w", err)
	}
	f.data = data
	f.chunk = min(maxChunk, data.MaxBuffer())
	if _, err := f.call(data, proto.OpAttach, 0, 0, 0, out[:], nil); err != nil {
		f.Close()
		return nil, fmt.Errorf("weir: attach IO session: %w", err)
	}
	return f, nil
}

// Close ends both sessions. Files still open are closed by the services.
func (f *FS) Close() error {
	if f.data != nil {
		f.data.Close()
	}
	return f.meta.Close()
}

// processUmask reads this process's umask without changing it.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
					return uint32(m)
				}
			}
		}
	}
	return 0o022
}

// call runs one request. in is the request body; out receives the response
// body (the buffer is sized for the larger of the two). It returns the
// completion; a negative result becomes a syscall.Errno error.
func (f *FS) call(c *ring.Client, op uint8, arg uint32, handle, offset uint64, in, out []byte) (ring.Completion, error) {
	ctx := bgctx
	call := ring.Call{Op: op, Arg: arg, Handle: handle, Offset: offset}
	if n := max(len(in), len(out)); n > 0 {
		b, err := c.Alloc(ctx, n)
		if err != nil {
			return ring.Completion{}, transportErr(err)
		}
		defer b.Release()
		b.CopyFrom(in)
		call.Buf = b
		comp, err := c.Do(ctx, &call)
		if err != nil {
			return comp, transportErr(err)
		}
		if comp.Result < 0 {
			return comp, syscall.Errno(-comp.Result)
		}
		if out != nil {
			b.CopyTo(out[:min(len(out), int(comp.Result))])
		}
		return comp, nil
	}
	comp, err := c.Do(ctx, &call)
	if err != nil {
		return comp, transportErr(err)
	}
	if comp.Result < 0 {
		return comp, syscall.Errno(-comp.Result)
	}
	return comp, nil
}

// transportErr maps a ring failure to an errno: the service went away (EIO,
// as a dead NFS server gives) or the request cannot be carried.
func transportErr(err error) error {
	switch {
	case errors.Is(err, ring.ErrTooLarge):
		return fmt.Errorf("%w (%v)", syscall.E2BIG, err)
	case errors.Is(err, ring.ErrClosed):
		return fmt.Errorf("%w (%v)", syscall.EBADF, err)
	default:
		return fmt.Errorf("%w (%v)", syscall.EIO, err)
	}
}

func pathErr(op, path string, err error) error {
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// checkPath refuses what cannot travel: NUL bytes (EINVAL, as package os
// says before any system call) and paths longer than PATH_MAX.
func checkPath(name string) error {
	if strings.IndexByte(name, 0) >= 0 {
		return syscall.EINVAL
	}
	if len(name) > proto.MaxPath {
		return syscall.ENAMETOOLONG
	}
	return nil
}

func strBody(strs ...string) []byte {
	var e proto.Enc
	for _, s := range strs {
		e.Str(s)
	}
	return e.B
}

// modeBits turns an fs.FileMode's permission and special bits into the
// POSIX mode bits the services store.
func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		b |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		b |= syscall.S_ISVTX
	}
	return b
}

func (f *FS) statPath(op, name string) (*fileInfo, error) {
	if err := checkPath(name); err != nil {
		return nil, pathErr(op, name, err)
	}
	var out [proto.AttrSize]byte
	if _, err := f.call(f.meta, proto.OpStat, 0, 0, 0, strBody(name), out[:]); err != nil {
		return nil, pathErr(op, name, err)
	}
	a := proto.NewDec(out[:]).Attr()
	return newFileInfo(baseName(name), a), nil
}

// Stat returns a FileInfo describing the named file.
func (f *FS) Stat(name string) (fs.FileInfo, error) { return f.statPath("stat", name) }

// Lstat is Stat: weir has no symbolic links.
func (f *FS) Lstat(name string) (fs.FileInfo, error) { return f.statPath("lstat", name) }

// Mkdir creates a directory with perm (before umask).
func (f *FS) Mkdir(name string, perm fs.FileMode) error {
	if err := checkPath(name); err != nil {
		return pathErr("mkdir", name, err)
	}
	var e proto.Enc
	e.U32(modeBits(perm) &^ f.umask)
	e.Str(name)
	var out [proto.AttrSize]byte
	if _, err := f.call(f.meta, proto.OpMkdir, 0, 0, 0, e.B, out[:]); err != nil {
		return pathErr("mkdir", name, err)
	}
	return nil
}

// MkdirAll creates a directory and every missing parent, like os.MkdirAll.
func (f *FS) MkdirAll(name string, perm fs.FileMode) error {
	if fi, err := f.Stat(name); err == nil {
		if fi.IsDir() {
			return nil
		}
		return pathErr("mkdir", name, syscall.ENOTDIR)
	}
	i := len(name)
	for i > 0 && name[i-1] == '/' {
		i--
	}
	j := i
	for j > 0 && name[j-1] != '/' {
		j--
	}
	if j > 1 {
		if err := f.MkdirAll(name[:j-1], perm); err != nil {
			return err
		}
	}
	err := f.Mkdir(name, perm)
	if err != nil {
		if fi, serr := f.Stat(name); serr == nil && fi.IsDir() {
			return nil
		}
		return err
	}
	return nil
}

// Remove removes a file or an empty directory, choosing the error as
// os.Remove does.
func (f *FS) Remove(name string) error {
	if err := checkPath(name); err != nil {
		return pathErr("remove", name, err)
	}
	_, e := f.call(f.meta, proto.OpUnlink, 0, 0, 0, strBody(name), nil)
	if e == nil {
		return nil
	}
	_, e1 := f.call(f.meta, proto.OpRmdir, 0, 0, 0, strBody(name), nil)
	if e1 == nil {
		return nil
	}
	// rmdir(file) is ENOTDIR; otherwise rmdir's error is the real one.
	if !errors.Is(e1, syscall.ENOTDIR) {
		e = e1
	}
	return pathErr("remove", name, e)
}

// RemoveAll removes name and everything it contains, like os.RemoveAll: a
// missing name is not an error.
func (f *FS) RemoveAll(name string) error {
	if name == "" {
		return nil
	}
	if err := checkPath(name); err != nil {
		return pathErr("RemoveAll", name, err)
	}
	if name == "." || strings.HasSuffix(name, "/.") {
		return pathErr("RemoveAll", name, syscall.EINVAL)
	}
	err := f.Remove(name)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	fi, serr := f.Stat(name)
	if serr != nil {
		if errors.Is(serr, fs.ErrNotExist) {
			return nil
		}
		return serr
	}
	if !fi.IsDir() {
		return err
	}
	ents, rerr := f.ReadDir(name)
	if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		return rerr
	}
	var first error
	for _, e := range ents {
		if err := f.RemoveAll(strings.TrimSuffix(name, "/") + "/" + e.Name()); err != nil && first == nil {
			first = err
		}
	}
	if err := f.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) && first == nil {
		first = err
	}
	return first
}

// Rename renames (moves) oldname to newname atomically, replacing newname.
func (f *FS) Rename(oldname, newname string) error {
	err := checkPath(oldname)
	if err == nil {
		err = checkPath(newname)
	}
	if err == nil {
		_, err = f.call(f.meta, proto.OpRename, 0, 0, 0, strBody(oldname, newname), nil)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	return nil
}

// Chmod changes the mode bits of the named file.
func (f *FS) Chmod(name string, mode fs.FileMode) error {
	if err := checkPath(name); err != nil {
		return pathErr("chmod", name, err)
	}
	var e proto.Enc
	e.U32(modeBits(mode))
	e.Str(name)
	if _, err := f.call(f.meta, proto.OpChmod, 0, 0, 0, e.B, nil); err != nil {
		return pathErr("chmod", name, err)
	}
	return nil
}

// Chown changes the owner and group; -1 leaves one unchanged.
func (f *FS) Chown(name string, uid, gid int) error {
	if err := checkPath(name); err != nil {
		return pathErr("chown", name, err)
	}
	var e proto.Enc
	e.I64(int64(uid))
	e.I64(int64(gid))
	e.Str(name)
	if _, err := f.call(f.meta, proto.OpChown, 0, 0, 0, e.B, nil); err != nil {
		return pathErr("chown", name, err)
	}
	return nil
}

// Lchown is Chown: weir has no symbolic links.
func (f *FS) Lchown(name string, uid, gid int) error { return f.Chown(name, uid, gid) }

// Chtimes sets the access and modification times. A zero time.Time leaves
// that time unchanged, as in os.Chtimes.
func (f *FS) Chtimes(name string, atime, mtime time.Time) error {
	if err := checkPath(name); err != nil {
		return pathErr("chtimes", name, err)
	}
	var e proto.Enc
	e.I64(timeArg(atime))
	e.I64(timeArg(mtime))
	e.Str(name)
	if _, err := f.call(f.meta, proto.OpChtimes, 0, 0, 0, e.B, nil); err != nil {
		return pathErr("chtimes", name, err)
	}
	return nil
}

func timeArg(t time.Time) int64 {
	if t.IsZero() {
		return proto.TimeOmit
	}
	return t.UnixNano()
}

// Truncate changes the size of the named file.
func (f *FS) Truncate(name string, size int64) error {
	if size < 0 {
		return pathErr("truncate", name, syscall.EINVAL)
	}
	file, err := f.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			pe.Op = "truncate"
		}
		return err
	}
	err = file.Truncate(size)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			pe.Op = "truncate"
		}
	}
	return err
}

// ReadDir reads the named directory, sorted by name.
func (f *FS) ReadDir(name string) ([]fs.DirEntry, error) {
	return f.readDir("open", name, "", -1)
}

// readDir reads up to n entries (n < 0: all) after the name after.
func (f *FS) readDir(op, name, after string, n int) ([]fs.DirEntry, error) {
	if err := checkPath(name); err != nil {
		return nil, pathErr(op, name, err)
	}
	var ents []fs.DirEntry
	out := make([]byte, 16<<10)
	for n < 0 || len(ents) < n {
		comp, err := f.call(f.meta, proto.OpReadDir, 0, 0, 0, strBody(name, after), out)
		if err != nil {
			return ents, pathErr(op, name, err)
		}
		d := proto.NewDec(out[:comp.Result])
		cnt := d.U32()
		for i := uint32(0); i < cnt; i++ {
			ino, mode, nm := d.U64(), d.U32(), d.Str()
			if d.Err() != nil {
				return ents, pathErr(op, name, syscall.EIO)
			}
			ents = append(ents, &dirEntry{fs: f, dir: name, name: nm, ino: ino, mode: mode})
			after = nm
			if n >= 0 && len(ents) == n {
				return ents, nil
			}
		}
		if comp.Aux == 0 {
			break
		}
	}
	return ents, nil
}

// ReadFile reads a whole file. It satisfies fs.ReadFileFS, so name must
// satisfy fs.ValidPath (use OpenFile for os-style paths).
func (f *FS) ReadFile(name string) ([]byte, error) {
	if !fs.ValidPath(name) {
		return nil, pathErr("open", name, fs.ErrInvalid)
	}
	file, err := f.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, fi.Size())
	n, err := file.ReadAt(buf, 0)
	if err != nil && n < len(buf) && !errors.Is(err, errEOF) {
		return buf[:n], err
	}
	return buf[:n], nil
}

// WriteFile writes data to a file, creating it with perm or truncating it.
func (f *FS) WriteFile(name string, data []byte, perm fs.FileMode) error {
	file, err := f.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = file.Write(data)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	return err
}
