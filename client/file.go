package client

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

var errEOF = io.EOF

// File is an open file or directory. Its methods are safe for concurrent
// use; Read, Write and Seek share one file position, as with *os.File.
type File struct {
	fs     *FS
	name   string
	handle uint64
	flags  int
	dir    bool
	closed atomic.Bool

	granted atomic.Bool // the IO service accepts the handle
	grantMu sync.Mutex  // serialises the OpGrant of the first data request

	mu       sync.Mutex // protects off, dirAfter, dirDone
	off      int64
	dirAfter string
	dirDone  bool
}

var (
	_ io.ReadWriteSeeker = (*File)(nil)
	_ io.ReaderAt        = (*File)(nil)
	_ io.WriterAt        = (*File)(nil)
	_ io.Closer          = (*File)(nil)
	_ fs.ReadDirFile     = (*File)(nil)
)

// Open opens a file for reading with the io/fs contract: name must satisfy
// fs.ValidPath. The result is a *File. Use OpenFile for os-style paths.
func (f *FS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, pathErr("open", name, fs.ErrInvalid)
	}
	file, err := f.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	return file, nil
}

// Create creates or truncates a file for reading and writing, mode 0666
// before umask.
func (f *FS) Create(name string) (*File, error) {
	return f.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// openFlags are the flags OpenFile understands; others are refused.
const openFlags = os.O_RDONLY | os.O_WRONLY | os.O_RDWR | os.O_CREATE | os.O_EXCL |
	os.O_TRUNC | os.O_APPEND | os.O_SYNC | syscall.O_DIRECTORY | syscall.O_CLOEXEC

// OpenFile opens name with flags (os.O_*) and, when creating, perm before
// umask.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (*File, error) {
	if err := checkPath(name); err != nil {
		return nil, pathErr("open", name, err)
	}
	if flag&^openFlags != 0 {
		return nil, pathErr("open", name, syscall.EINVAL)
	}
	var e proto.Enc
	e.U32(modeBits(perm) &^ f.umask)
	e.Str(name)
	var out [8 + proto.AttrSize + 2]byte
	if _, err := f.call(f.meta, proto.OpOpen, uint32(flag&^syscall.O_CLOEXEC), 0, 0, e.B, out[:]); err != nil {
		return nil, pathErr("open", name, err)
	}
	d := proto.NewDec(out[:])
	h := d.U64()
	a := d.Attr()
	d.U8() // created
	file := &File{fs: f, name: name, handle: h, flags: flag, dir: a.Mode&syscall.S_IFMT == syscall.S_IFDIR}
	file.granted.Store(d.U8() != 0)
	return file, nil
}

// Name returns the name the file was opened with.
func (fl *File) Name() string { return fl.name }

func (fl *File) err(op string, err error) error { return pathErr(op, fl.name, err) }

func (fl *File) check(op string) error {
	if fl == nil {
		return os.ErrInvalid
	}
	if fl.closed.Load() {
		return fl.err(op, os.ErrClosed)
	}
	return nil
}

func (fl *File) readable() bool  { return fl.flags&(os.O_WRONLY|os.O_RDWR) != os.O_WRONLY }
func (fl *File) writable() bool  { return fl.flags&(os.O_WRONLY|os.O_RDWR) != 0 }
func (fl *File) appending() bool { return fl.flags&os.O_APPEND != 0 }

// Close closes the file. A second Close returns an error, as with os.
func (fl *File) Close() error {
	if fl == nil {
		return os.ErrInvalid
	}
	if !fl.closed.CompareAndSwap(false, true) {
		return fl.err("close", os.ErrClosed)
	}
	if _, err := fl.fs.call(fl.fs.meta, proto.OpClose, 0, fl.handle, 0, nil, nil); err != nil {
		return fl.err("close", err)
	}
	return nil
}

// readAt reads into p at off, splitting into requests of at most one chunk.
func (fl *File) readAt(p []byte, off int64) (int, error) {
	if fl.dir {
		return 0, syscall.EISDIR
	}
	if !fl.readable() {
		return 0, syscall.EBADF
	}
	n := 0
	for n < len(p) {
		want := min(len(p)-n, fl.fs.chunk)
		m, err := fl.transfer(proto.OpRead, p[n:n+want], off+int64(n), 0)
		n += m
		if err != nil {
			return n, err
		}
		if m < want {
			return n, io.EOF
		}
	}
	return n, nil
}

// transfer moves one chunk through the arena: for a write p is copied in,
// for a read the answer is copied out to p. It returns the byte count and,
// for writes, the offset the service wrote at.
func (fl *File) transfer(op uint8, p []byte, off int64, arg uint32) (int, error) {
	c := fl.fs.data
	b, err := c.Alloc(bgctx, len(p))
	if err != nil {
		return 0, transportErr(err)
	}
	defer b.Release()
	if op == proto.OpWrite {
		b.CopyFrom(p)
	}
	n, _, err := fl.do(op, b, off, arg)
	if op == proto.OpRead && n > 0 {
		b.CopyTo(p[:n])
	}
	return n, err
}

// ensureGrant asks the metadata service, once, to grant this handle at the
// IO service: opening a file costs no round trip to the IO service until
// the file is read or written.
func (fl *File) ensureGrant() error {
	if fl.granted.Load() {
		return nil
	}
	fl.grantMu.Lock()
	defer fl.grantMu.Unlock()
	if fl.granted.Load() {
		return nil
	}
	if _, err := fl.fs.call(fl.fs.meta, proto.OpGrant, 0, fl.handle, 0, nil, nil); err != nil {
		return err
	}
	fl.granted.Store(true)
	return nil
}

// do submits one data request on an arena buffer.
func (fl *File) do(op uint8, b *ring.Buffer, off int64, arg uint32) (int, uint64, error) {
	if err := fl.ensureGrant(); err != nil {
		return 0, 0, err
	}
	comp, err := fl.fs.data.Do(bgctx, &ring.Call{Op: op, Arg: arg, Handle: fl.handle, Offset: uint64(off), Buf: b})
	if err != nil {
		return 0, 0, transportErr(err)
	}
	if comp.Result < 0 {
		return 0, 0, syscall.Errno(-comp.Result)
	}
	return int(comp.Result), comp.Aux, nil
}

// writeAt writes p at off (or at the end with O_APPEND) and returns the
// count and the offset after the last byte written.
func (fl *File) writeAt(p []byte, off int64, appendMode bool) (int, int64, error) {
	if fl.dir {
		return 0, off, syscall.EISDIR
	}
	if !fl.writable() {
		return 0, off, syscall.EBADF
	}
	n := 0
	var arg uint32
	if appendMode {
		arg = proto.WriteAppend
	}
	end := off
	for n < len(p) {
		chunk := p[n:min(len(p), n+fl.fs.chunk)]
		b, err := fl.fs.data.Alloc(bgctx, len(chunk))
		if err != nil {
			return n, end, transportErr(err)
		}
		b.CopyFrom(chunk)
		m, at, err := fl.do(proto.OpWrite, b, off+int64(n), arg)
		b.Release()
		n += m
		if appendMode {
			end = int64(at) + int64(m)
		} else {
			end = off + int64(n)
		}
		if err != nil {
			return n, end, err
		}
		if m < len(chunk) {
			return n, end, io.ErrShortWrite
		}
	}
	return n, end, nil
}

// Read reads up to len(p) bytes at the file position and advances it.
func (fl *File) Read(p []byte) (int, error) {
	if err := fl.check("read"); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	n, err := fl.readAt(p, fl.off)
	fl.off += int64(n)
	if errors.Is(err, io.EOF) {
		if n > 0 {
			return n, nil
		}
		return 0, io.EOF
	}
	if err != nil {
		return n, fl.err("read", err)
	}
	return n, nil
}

// ReadAt reads len(p) bytes at off; fewer only with an error (io.EOF at
// the end of the file).
func (fl *File) ReadAt(p []byte, off int64) (int, error) {
	if err := fl.check("read"); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fl.err("readat", errors.New("negative offset"))
	}
	n, err := fl.readAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, fl.err("read", err)
	}
	return n, err
}

// Write writes p at the file position (or the end, with O_APPEND).
func (fl *File) Write(p []byte) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	n, end, err := fl.writeAt(p, fl.off, fl.appending())
	fl.off = end
	if err != nil {
		return n, fl.err("write", err)
	}
	return n, nil
}

// WriteAt writes p at off. Like os, it refuses files opened with O_APPEND.
func (fl *File) WriteAt(p []byte, off int64) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	if fl.appending() {
		return 0, errors.New("weir: invalid use of WriteAt on file opened with O_APPEND")
	}
	if off < 0 {
		return 0, fl.err("writeat", errors.New("negative offset"))
	}
	n, _, err := fl.writeAt(p, off, false)
	if err != nil {
		return n, fl.err("write", err)
	}
	return n, nil
}

// vecLen is the total length of bufs; E2BIG if one request cannot carry it.
func (fl *File) vecLen(bufs [][]byte) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if total > fl.fs.chunk {
		return 0, syscall.E2BIG
	}
	return total, nil
}

// ReadV reads into several buffers with one request, at the file position,
// scattering straight from the shared arena (one copy per byte). Like
// readv(2) it returns fewer bytes at the end of the file, and io.EOF only
// when there are none.
func (fl *File) ReadV(bufs [][]byte) (int, error) {
	if err := fl.check("readv"); err != nil {
		return 0, err
	}
	total, err := fl.vecLen(bufs)
	if err != nil {
		return 0, fl.err("readv", err)
	}
	if total == 0 {
		return 0, nil
	}
	if fl.dir {
		return 0, fl.err("readv", syscall.EISDIR)
	}
	if !fl.readable() {
		return 0, fl.err("readv", syscall.EBADF)
	}
	b, err := fl.fs.data.Alloc(bgctx, total)
	if err != nil {
		return 0, fl.err("readv", transportErr(err))
	}
	defer b.Release()
	fl.mu.Lock()
	n, _, err := fl.do(proto.OpRead, b, fl.off, 0)
	fl.off += int64(n)
	fl.mu.Unlock()
	if err != nil {
		return 0, fl.err("readv", err)
	}
	if n == 0 {
		return 0, io.EOF
	}
	src, si, soff, left := b.Slices(), 0, 0, n
	for _, dst := range bufs {
		for d := 0; d < len(dst) && left > 0; {
			k := copy(dst[d:min(len(dst), d+left)], src[si][soff:])
			d, soff, left = d+k, soff+k, left-k
			if soff == len(src[si]) {
				si, soff = si+1, 0
			}
		}
	}
	return n, nil
}

// WriteV writes several buffers with one request, at the file position.
func (fl *File) WriteV(bufs [][]byte) (int, error) {
	if err := fl.check("writev"); err != nil {
		return 0, err
	}
	total, err := fl.vecLen(bufs)
	if err != nil {
		return 0, fl.err("writev", err)
	}
	if total == 0 {
		return 0, nil
	}
	b, err := fl.fs.data.Alloc(bgctx, total)
	if err != nil {
		return 0, fl.err("writev", transportErr(err))
	}
	defer b.Release()
	// Gather straight into the arena: one copy per byte.
	dst := b.Slices()
	di, doff := 0, 0
	for _, src := range bufs {
		for len(src) > 0 {
			k := copy(dst[di][doff:], src)
			src, doff = src[k:], doff+k
			if doff == len(dst[di]) {
				di, doff = di+1, 0
			}
		}
	}
	return fl.WriteBuffer(b)
}

// AllocBuffer reserves n bytes of this session's shared arena for the
// zero-copy calls: fill b.Slices() in place, then WriteBuffer or
// WriteBufferAt; or ReadBufferAt into it and read b.Slices(). Release it
// when done. n is at most MaxBuffer.
func (f *FS) AllocBuffer(n int) (*ring.Buffer, error) {
	b, err := f.data.Alloc(bgctx, n)
	if err != nil {
		return nil, transportErr(err)
	}
	return b, nil
}

// MaxBuffer is the largest buffer one zero-copy call can carry.
func (f *FS) MaxBuffer() int { return f.chunk }

// WriteBuffer writes an arena buffer at the file position (zero copy).
func (fl *File) WriteBuffer(b *ring.Buffer) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	if !fl.writable() || fl.dir {
		return 0, fl.err("write", syscall.EBADF)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var arg uint32
	if fl.appending() {
		arg = proto.WriteAppend
	}
	n, at, err := fl.do(proto.OpWrite, b, fl.off, arg)
	if err != nil {
		return 0, fl.err("write", err)
	}
	if fl.appending() {
		fl.off = int64(at) + int64(n)
	} else {
		fl.off += int64(n)
	}
	return n, nil
}

// WriteBufferAt writes an arena buffer at off (zero copy).
func (fl *File) WriteBufferAt(b *ring.Buffer, off int64) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	if !fl.writable() || fl.dir || fl.appending() || off < 0 {
		return 0, fl.err("write", syscall.EINVAL)
	}
	n, _, err := fl.do(proto.OpWrite, b, off, 0)
	if err != nil {
		return 0, fl.err("write", err)
	}
	return n, nil
}

// ReadBufferAt reads into an arena buffer at off (zero copy). Like ReadAt
// it returns io.EOF with a short count at the end of the file.
func (fl *File) ReadBufferAt(b *ring.Buffer, off int64) (int, error) {
	if err := fl.check("read"); err != nil {
		return 0, err
	}
	if !fl.readable() || fl.dir || off < 0 {
		return 0, fl.err("read", syscall.EBADF)
	}
	n, _, err := fl.do(proto.OpRead, b, off, 0)
	if err != nil {
		return 0, fl.err("read", err)
	}
	if n < b.Len() {
		return n, io.EOF
	}
	return n, nil
}

// Seek sets the file position, as os.File.Seek.
func (fl *File) Seek(offset int64, whence int) (int64, error) {
	if err := fl.check("seek"); err != nil {
		return 0, err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var base int64
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		base = fl.off
	case io.SeekEnd:
		fi, err := fl.Stat()
		if err != nil {
			return 0, err
		}
		base = fi.Size()
	default:
		return 0, fl.err("seek", syscall.EINVAL)
	}
	pos := base + offset
	if pos < 0 || (offset > 0 && pos < base) {
		return 0, fl.err("seek", syscall.EINVAL)
	}
	fl.off = pos
	if fl.dir && pos == 0 {
		fl.dirAfter, fl.dirDone = "", false
	}
	return pos, nil
}

// Truncate changes the file's size.
func (fl *File) Truncate(size int64) error {
	if err := fl.check("truncate"); err != nil {
		return err
	}
	if fl.dir || !fl.writable() || size < 0 {
		return fl.err("truncate", syscall.EINVAL)
	}
	if err := fl.ensureGrant(); err != nil {
		return fl.err("truncate", err)
	}
	if _, err := fl.fs.call(fl.fs.data, proto.OpTruncate, 0, fl.handle, uint64(size), nil, nil); err != nil {
		return fl.err("truncate", err)
	}
	return nil
}

// Sync makes the file's data and attributes durable.
func (fl *File) Sync() error {
	if err := fl.check("sync"); err != nil {
		return err
	}
	op, c := proto.OpSync, fl.fs.data
	if fl.dir {
		op, c = proto.OpSyncMeta, fl.fs.meta
	} else if err := fl.ensureGrant(); err != nil {
		return fl.err("sync", err)
	}
	if _, err := fl.fs.call(c, op, 0, fl.handle, 0, nil, nil); err != nil {
		return fl.err("sync", err)
	}
	return nil
}

// Stat returns the file's attributes, including writes not yet closed.
func (fl *File) Stat() (fs.FileInfo, error) {
	if err := fl.check("stat"); err != nil {
		return nil, err
	}
	var out [proto.AttrSize]byte
	if _, err := fl.fs.call(fl.fs.meta, proto.OpFStat, 0, fl.handle, 0, nil, out[:]); err != nil {
		return nil, fl.err("stat", err)
	}
	return newFileInfo(baseName(fl.name), proto.NewDec(out[:]).Attr()), nil
}

// ReadDir reads the directory's entries in name order, n at a time (n <= 0:
// all remaining), like os.File.ReadDir.
func (fl *File) ReadDir(n int) ([]fs.DirEntry, error) {
	if err := fl.check("readdirent"); err != nil {
		return nil, err
	}
	if !fl.dir {
		return nil, fl.err("readdirent", syscall.ENOTDIR)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.dirDone {
		if n > 0 {
			return nil, io.EOF
		}
		return []fs.DirEntry{}, nil
	}
	limit := n
	if n <= 0 {
		limit = -1
	}
	ents, err := fl.fs.readDir("readdirent", fl.name, fl.dirAfter, limit)
	if len(ents) > 0 {
		fl.dirAfter = ents[len(ents)-1].Name()
	}
	if err != nil {
		return ents, err
	}
	if n <= 0 || len(ents) < n {
		fl.dirDone = true
	}
	if n > 0 && len(ents) == 0 {
		return nil, io.EOF
	}
	if ents == nil {
		ents = []fs.DirEntry{}
	}
	return ents, nil
}

// fileInfo is an fs.FileInfo from wire attributes.
type fileInfo struct {
	name string
	a    proto.Attr
}

func newFileInfo(name string, a proto.Attr) *fileInfo { return &fileInfo{name: name, a: a} }

func (i *fileInfo) Name() string       { return i.name }
func (i *fileInfo) Size() int64        { return i.a.Size }
func (i *fileInfo) Mode() fs.FileMode  { return fileMode(i.a.Mode) }
func (i *fileInfo) ModTime() time.Time { return time.Unix(0, i.a.Mtime) }
func (i *fileInfo) IsDir() bool        { return i.a.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// Sys returns a *syscall.Stat_t, as package os does on Linux.
func (i *fileInfo) Sys() any {
	return &syscall.Stat_t{
		Ino: i.a.Ino, Nlink: uint64(i.a.Nlink), Mode: i.a.Mode, Uid: i.a.UID, Gid: i.a.GID,
		Size: i.a.Size, Blksize: 4096, Blocks: (i.a.Size + 511) / 512,
		Atim: syscall.NsecToTimespec(i.a.Atime), Mtim: syscall.NsecToTimespec(i.a.Mtime),
		Ctim: syscall.NsecToTimespec(i.a.Ctime),
	}
}

// fileMode converts POSIX mode bits to an fs.FileMode, as package os does.
func fileMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		fm |= fs.ModeDir
	case syscall.S_IFREG:
	default:
		fm |= fs.ModeIrregular
	}
	if m&syscall.S_ISUID != 0 {
		fm |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		fm |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// baseName is the last element of a path, as os.Stat names its FileInfo.
func baseName(name string) string {
	name = strings.TrimRight(name, "/")
	if name == "" {
		return "/"
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		return name[i+1:]
	}
	return name
}

// dirEntry is one ReadDir result; Info stats it on demand, like os.
type dirEntry struct {
	fs   *FS
	dir  string
	name string
	ino  uint64
	mode uint32
}

func (d *dirEntry) Name() string      { return d.name }
func (d *dirEntry) IsDir() bool       { return d.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (d *dirEntry) Type() fs.FileMode { return fileMode(d.mode & syscall.S_IFMT).Type() }
func (d *dirEntry) Info() (fs.FileInfo, error) {
	return d.fs.Stat(strings.TrimSuffix(d.dir, "/") + "/" + d.name)
}
func (d *dirEntry) String() string { return fs.FormatDirEntry(d) }
