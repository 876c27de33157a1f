package conformance

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Tester runs one case on one target. Every call made through it is recorded
// as one normalized observation line, for instance
//
//	open "a" O_RDWR|O_CREATE 0644: ok
//	read "a" 5: 5 "hello" ok
//	rename "a" "b": EINVAL
//
// Errors are recorded as errno names (ENOENT), io.EOF as EOF, fs.ErrClosed
// as ErrClosed. Any other error is recorded as "ERR <text>" and fails the
// case: targets must answer with errnos. The observation lists of the
// targets are compared line by line, so a case must record the same lines
// in the same order on every run: goroutines use FS and File directly and
// the case records a summary afterwards.
//
// Expectations (ExpectErr, Check, ...) record failures; they hold on every
// target, the kernel included, so a case that does not test what it claims
// fails before any other target exists.
type Tester struct {
	fs FS // immutable

	mu     sync.Mutex
	obs    []string        // protected by mu
	fails  []string        // protected by mu
	open   map[*TFile]bool // protected by mu: files opened and not closed
	prefix string          // protected by mu: "setup: " while Setup runs
	peer   *peerConn       // the peer process of a two-process case; used by the case's goroutine
}

func newTester(fsys FS) *Tester {
	return &Tester{fs: fsys, open: make(map[*TFile]bool)}
}

// FS returns the target, for use without recording (from goroutines).
func (t *Tester) FS() FS { return t.fs }

// Logf records an observation line. It must not depend on timing or on
// values that legitimately differ between targets.
func (t *Tester) Logf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.obs = append(t.obs, t.prefix+fmt.Sprintf(format, args...))
}

// Errorf records a failure of the case.
func (t *Tester) Errorf(format string, args ...any) { t.fail(2, fmt.Sprintf(format, args...)) }

// Fatalf records a failure and ends the case.
func (t *Tester) Fatalf(format string, args ...any) {
	t.fail(2, fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// fail records msg with the file:line of the caller skip frames up.
func (t *Tester) fail(skip int, msg string) {
	where := "?"
	if _, file, line, ok := runtime.Caller(skip); ok {
		where = fmt.Sprintf("%s:%d", filepath.Base(file), line)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fails = append(t.fails, fmt.Sprintf("%s%s: %s", t.prefix, where, msg))
}

// ExpectErr fails the case unless err normalizes to the same name as want:
// an errno such as syscall.EEXIST, io.EOF, fs.ErrClosed, or nil for success.
func (t *Tester) ExpectErr(err, want error) {
	got, _ := errName(err)
	w, _ := errName(want)
	if got != w {
		t.fail(2, fmt.Sprintf("expected %s, got %s", w, got))
	}
}

// ExpectOK fails the case if err is not nil.
func (t *Tester) ExpectOK(err error) {
	if err != nil {
		got, _ := errName(err)
		t.fail(2, "expected ok, got "+got)
	}
}

// Must ends the case if err is not nil: the step was a precondition.
func (t *Tester) Must(err error) {
	if err != nil {
		got, _ := errName(err)
		t.fail(2, "precondition failed: "+got)
		runtime.Goexit()
	}
}

// Check fails the case if cond is false.
func (t *Tester) Check(cond bool, format string, args ...any) {
	if !cond {
		t.fail(2, fmt.Sprintf(format, args...))
	}
}

// ExpectData fails the case unless got equals want, naming the first
// differing offset.
func (t *Tester) ExpectData(got, want []byte) {
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.fail(2, fmt.Sprintf("data differs at offset %d: got %d bytes, want %d", i, len(got), len(want)))
}

// record adds "line: result" for err and fails on a non-errno error.
func (t *Tester) record(line string, err error) {
	name, ok := errName(err)
	if !ok {
		t.fail(3, "error is not an errno: "+name)
	}
	t.Logf("%s: %s", line, name)
}

// errName normalizes err: "ok", "EOF", "ErrClosed", an errno name, or
// "ERR <text>" with ok false.
func errName(err error) (name string, ok bool) {
	switch {
	case err == nil:
		return "ok", true
	case errors.Is(err, io.EOF):
		return "EOF", true
	case errors.Is(err, fs.ErrClosed):
		return "ErrClosed", true
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return n, true
		}
		return fmt.Sprintf("errno(%d)", int(errno)), true
	}
	return "ERR " + err.Error(), false
}

// q quotes a name for an observation, shortening long ones.
func q(name string) string {
	if len(name) <= 64 {
		return strconv.Quote(name)
	}
	return fmt.Sprintf("%s…(%d bytes)", strconv.Quote(name[:16]), len(name))
}

// data describes file contents for an observation.
func data(b []byte) string {
	if len(b) <= 40 {
		return strconv.Quote(string(b))
	}
	if !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
		return fmt.Sprintf("<%d zero bytes>", len(b))
	}
	sum := sha256.Sum256(b)
	return fmt.Sprintf("<%d bytes sha256:%x>", len(b), sum[:8])
}

// flags formats open flags.
func flags(flag int) string {
	var parts []string
	switch flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR) {
	case os.O_RDONLY:
		parts = append(parts, "O_RDONLY")
	case os.O_WRONLY:
		parts = append(parts, "O_WRONLY")
	case os.O_RDWR:
		parts = append(parts, "O_RDWR")
	default:
		parts = append(parts, "O_ACCMODE")
	}
	rest := flag &^ (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
	for _, f := range []struct {
		bit  int
		name string
	}{
		{os.O_APPEND, "O_APPEND"}, {os.O_CREATE, "O_CREATE"}, {os.O_EXCL, "O_EXCL"},
		{os.O_SYNC, "O_SYNC"}, {os.O_TRUNC, "O_TRUNC"},
	} {
		if rest&f.bit != 0 {
			parts = append(parts, f.name)
			rest &^= f.bit
		}
	}
	if rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", rest))
	}
	return strings.Join(parts, "|")
}

func whence(w int) string {
	switch w {
	case io.SeekStart:
		return "SEEK_SET"
	case io.SeekCurrent:
		return "SEEK_CUR"
	case io.SeekEnd:
		return "SEEK_END"
	}
	return strconv.Itoa(w)
}

// info describes a FileInfo: name, type and permission bits, and the size
// of regular files (directory sizes are file-system specific).
func info(fi fs.FileInfo) string {
	s := fmt.Sprintf("name=%s mode=%v", q(fi.Name()), fi.Mode())
	if fi.Mode().IsRegular() {
		s += fmt.Sprintf(" size=%d", fi.Size())
	}
	return s
}

// checkInfo fails the case if fi contradicts itself.
func (t *Tester) checkInfo(fi fs.FileInfo) {
	if fi.IsDir() != fi.Mode().IsDir() {
		t.fail(3, fmt.Sprintf("IsDir %v but mode %v", fi.IsDir(), fi.Mode()))
	}
}

func entries(des []fs.DirEntry) string {
	var parts []string
	for _, de := range des {
		typ := "file"
		switch {
		case de.IsDir():
			typ = "dir"
		case !de.Type().IsRegular():
			typ = de.Type().String()
		}
		parts = append(parts, q(de.Name())+":"+typ)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// OpenFile opens name and records the outcome. f is nil on error.
func (t *Tester) OpenFile(name string, flag int, perm fs.FileMode) (*TFile, error) {
	raw, err := t.fs.OpenFile(name, flag, perm)
	t.record(fmt.Sprintf("open %s %s %#o", q(name), flags(flag), uint32(perm)), err)
	if err != nil {
		return nil, err
	}
	f := &TFile{t: t, f: raw, name: name}
	t.mu.Lock()
	t.open[f] = true
	t.mu.Unlock()
	return f, nil
}

// Open opens name read-only.
func (t *Tester) Open(name string) (*TFile, error) { return t.OpenFile(name, os.O_RDONLY, 0) }

// Create creates or truncates name for reading and writing, mode 0666
// before the umask.
func (t *Tester) Create(name string) (*TFile, error) {
	return t.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// MustOpenFile is OpenFile as a precondition.
func (t *Tester) MustOpenFile(name string, flag int, perm fs.FileMode) *TFile {
	f, err := t.OpenFile(name, flag, perm)
	if err != nil {
		t.fail(2, "precondition failed: open "+q(name))
		runtime.Goexit()
	}
	return f
}

// WriteFile creates or truncates name with perm and writes content; every
// step must succeed.
func (t *Tester) WriteFile(name string, content []byte, perm fs.FileMode) {
	f := t.MustOpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	n, err := f.Write(content)
	if err != nil || n != len(content) {
		t.fail(2, fmt.Sprintf("precondition failed: write %s: %d, %v", q(name), n, err))
		runtime.Goexit()
	}
	if err := f.Close(); err != nil {
		t.fail(2, "precondition failed: close "+q(name))
		runtime.Goexit()
	}
}

// ReadFile opens name, reads it to the end and records one line with the
// whole content.
func (t *Tester) ReadFile(name string) ([]byte, error) {
	f, err := t.fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		t.record("readfile "+q(name), err)
		return nil, err
	}
	b, err := io.ReadAll(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.record("readfile "+q(name), err)
		return b, err
	}
	t.Logf("readfile %s: %s", q(name), data(b))
	return b, nil
}

// Mkdir records Mkdir.
func (t *Tester) Mkdir(name string, perm fs.FileMode) error {
	err := t.fs.Mkdir(name, perm)
	t.record(fmt.Sprintf("mkdir %s %#o", q(name), uint32(perm)), err)
	return err
}

// MkdirAll records MkdirAll.
func (t *Tester) MkdirAll(name string, perm fs.FileMode) error {
	err := t.fs.MkdirAll(name, perm)
	t.record(fmt.Sprintf("mkdirall %s %#o", q(name), uint32(perm)), err)
	return err
}

// Remove records Remove.
func (t *Tester) Remove(name string) error {
	err := t.fs.Remove(name)
	t.record("remove "+q(name), err)
	return err
}

// RemoveAll records RemoveAll.
func (t *Tester) RemoveAll(name string) error {
	err := t.fs.RemoveAll(name)
	t.record("removeall "+q(name), err)
	return err
}

// Rename records Rename.
func (t *Tester) Rename(oldname, newname string) error {
	err := t.fs.Rename(oldname, newname)
	t.record(fmt.Sprintf("rename %s %s", q(oldname), q(newname)), err)
	return err
}

// Chmod records Chmod.
func (t *Tester) Chmod(name string, mode fs.FileMode) error {
	err := t.fs.Chmod(name, mode)
	t.record(fmt.Sprintf("chmod %s %v", q(name), mode), err)
	return err
}

// Chown records Chown.
func (t *Tester) Chown(name string, uid, gid int) error {
	err := t.fs.Chown(name, uid, gid)
	t.record(fmt.Sprintf("chown %s %d %d", q(name), uid, gid), err)
	return err
}

// Chtimes records Chtimes. The times are fixed by the case, so they are
// recorded as Unix nanoseconds (0 for the zero Time, which means "leave").
func (t *Tester) Chtimes(name string, atime, mtime time.Time) error {
	err := t.fs.Chtimes(name, atime, mtime)
	t.record(fmt.Sprintf("chtimes %s %d %d", q(name), nanos(atime), nanos(mtime)), err)
	return err
}

// Touch records Touch (both times now: the times themselves differ
// between targets, the errors do not).
func (t *Tester) Touch(name string) error {
	err := t.fs.Touch(name)
	t.record(fmt.Sprintf("touch %s", q(name)), err)
	return err
}

func nanos(tm time.Time) int64 {
	if tm.IsZero() {
		return 0
	}
	return tm.UnixNano()
}

// Truncate records Truncate by name.
func (t *Tester) Truncate(name string, size int64) error {
	err := t.fs.Truncate(name, size)
	t.record(fmt.Sprintf("truncate %s %d", q(name), size), err)
	return err
}

// Stat records Stat: name, mode and (for regular files) size.
func (t *Tester) Stat(name string) (fs.FileInfo, error) {
	fi, err := t.fs.Stat(name)
	if err != nil {
		t.record("stat "+q(name), err)
		return nil, err
	}
	t.checkInfo(fi)
	t.Logf("stat %s: %s", q(name), info(fi))
	return fi, nil
}

// ReadDir records ReadDir: the names in order, each with its type.
func (t *Tester) ReadDir(name string) ([]fs.DirEntry, error) {
	des, err := t.fs.ReadDir(name)
	if err != nil {
		t.record("readdir "+q(name), err)
		return des, err
	}
	t.Logf("readdir %s: %s", q(name), entries(des))
	return des, nil
}

// statT returns the *syscall.Stat_t of name, which both the kernel and the
// weir client return from FileInfo.Sys.
func (t *Tester) statT(name string) (*syscall.Stat_t, error) {
	fi, err := t.fs.Stat(name)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("FileInfo.Sys() is %T, not *syscall.Stat_t", fi.Sys())
	}
	return st, nil
}

// Owner records the uid and gid of name and returns them.
func (t *Tester) Owner(name string) (uid, gid int) {
	st, err := t.statT(name)
	if err != nil {
		t.record("owner "+q(name), err)
		return -1, -1
	}
	t.Logf("owner %s: uid=%d gid=%d", q(name), st.Uid, st.Gid)
	return int(st.Uid), int(st.Gid)
}

// Times records the exact atime and mtime of name. Use it only right after
// Chtimes: the kernel updates atime on reads (relatime), weir never does.
func (t *Tester) Times(name string) (atime, mtime time.Time) {
	st, err := t.statT(name)
	if err != nil {
		t.record("times "+q(name), err)
		return
	}
	atime = time.Unix(st.Atim.Unix())
	mtime = time.Unix(st.Mtim.Unix())
	t.Logf("times %s: atime=%d mtime=%d", q(name), atime.UnixNano(), mtime.UnixNano())
	return atime, mtime
}

// MtimeAfter records whether the mtime of name is later than ref. Set ref
// with Chtimes to a time in the past first: "changed since the last call"
// would depend on the clock's granularity.
func (t *Tester) MtimeAfter(name string, ref time.Time) bool {
	fi, err := t.fs.Stat(name)
	if err != nil {
		t.record("mtime "+q(name), err)
		return false
	}
	after := fi.ModTime().After(ref)
	t.Logf("mtime %s after %s: %v", q(name), ref.UTC().Format(time.RFC3339Nano), after)
	return after
}

// Restart restarts the target's storage (see Restarter). No file may be open.
func (t *Tester) Restart() {
	t.mu.Lock()
	n := len(t.open)
	t.mu.Unlock()
	if n != 0 {
		t.fail(2, fmt.Sprintf("restart with %d files open", n))
		runtime.Goexit()
	}
	r, ok := t.fs.(Restarter)
	if !ok {
		t.fail(2, fmt.Sprintf("target %T cannot restart", t.fs))
		t.Logf("restart: unsupported")
		return
	}
	t.record("restart", r.Restart())
}

// TFile is an open file whose calls the Tester records.
type TFile struct {
	t    *Tester // immutable
	f    File    // immutable
	name string  // immutable: the name it was opened with
}

// Raw returns the file, for use without recording (from goroutines).
func (f *TFile) Raw() File { return f.f }

// Name records File.Name, which must be the name given to OpenFile.
func (f *TFile) Name() string {
	n := f.f.Name()
	f.t.Logf("name %s: %s", q(f.name), q(n))
	return n
}

// Read reads up to n bytes and records how many and what.
func (f *TFile) Read(n int) ([]byte, error) {
	b := make([]byte, n)
	got, err := f.f.Read(b)
	f.t.record(fmt.Sprintf("read %s %d: %d %s", q(f.name), n, got, data(b[:got])), err)
	return b[:got], err
}

// ReadAt reads up to n bytes at off and records how many and what.
func (f *TFile) ReadAt(n int, off int64) ([]byte, error) {
	b := make([]byte, n)
	got, err := f.f.ReadAt(b, off)
	f.t.record(fmt.Sprintf("readat %s %d@%d: %d %s", q(f.name), n, off, got, data(b[:got])), err)
	return b[:got], err
}

// Write writes p and records the count.
func (f *TFile) Write(p []byte) (int, error) {
	n, err := f.f.Write(p)
	f.t.record(fmt.Sprintf("write %s %s: %d", q(f.name), data(p), n), err)
	return n, err
}

// WriteAt writes p at off and records the count.
func (f *TFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.f.WriteAt(p, off)
	f.t.record(fmt.Sprintf("writeat %s %s@%d: %d", q(f.name), data(p), off, n), err)
	return n, err
}

// Seek records Seek and the resulting offset.
func (f *TFile) Seek(off int64, w int) (int64, error) {
	pos, err := f.f.Seek(off, w)
	f.t.record(fmt.Sprintf("seek %s %d %s: %d", q(f.name), off, whence(w), pos), err)
	return pos, err
}

// Truncate records File.Truncate.
func (f *TFile) Truncate(size int64) error {
	err := f.f.Truncate(size)
	f.t.record(fmt.Sprintf("ftruncate %s %d", q(f.name), size), err)
	return err
}

// Sync records File.Sync.
func (f *TFile) Sync() error {
	err := f.f.Sync()
	f.t.record("fsync "+q(f.name), err)
	return err
}

// Stat records File.Stat.
func (f *TFile) Stat() (fs.FileInfo, error) {
	fi, err := f.f.Stat()
	if err != nil {
		f.t.record("fstat "+q(f.name), err)
		return nil, err
	}
	f.t.checkInfo(fi)
	f.t.Logf("fstat %s: %s", q(f.name), info(fi))
	return fi, nil
}

// ReadDir records File.ReadDir(n): the number of entries only, since their
// order is the directory's own. The case records the names it collects.
func (f *TFile) ReadDir(n int) ([]fs.DirEntry, error) {
	des, err := f.f.ReadDir(n)
	f.t.record(fmt.Sprintf("freaddir %s %d: %d entries", q(f.name), n, len(des)), err)
	return des, err
}

// Close records Close.
func (f *TFile) Close() error {
	err := f.f.Close()
	f.t.mu.Lock()
	delete(f.t.open, f)
	f.t.mu.Unlock()
	f.t.record("close "+q(f.name), err)
	return err
}
