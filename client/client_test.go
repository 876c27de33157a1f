package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// testConfig is a configuration for an in-process stack under dir.
func testConfig(t testing.TB, dir, backend string) *config.Config {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir can be long.
	c := stacktest.Config(t, dir)
	c.IO.Backend = backend
	c.Ring.ArenaSize = 4 << 20
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

func startStack(t testing.TB, c *config.Config) *stack.Stack {
	t.Helper()
	log := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Warn, Output: testWriter{t}})
	st, err := stack.Start(c, log)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func stopStack(t testing.TB, st *stack.Stack) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// newFS starts a stack on the mem backend and dials it.
func newFS(t *testing.T) (*client.FS, *stack.Stack) {
	t.Helper()
	st := startStack(t, testConfig(t, t.TempDir(), "mem"))
	c, err := st.Dial(context.Background())
	if err != nil {
		stopStack(t, st)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		stopStack(t, st)
	})
	return c, st
}

func TestCreateWriteReadStat(t *testing.T) {
	c, _ := newFS(t)
	if err := c.Mkdir("d", 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := c.Create("d/f")
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("weir!"), 3000)
	if n, err := f.Write(data); err != nil || n != len(data) {
		t.Fatalf("write: %d %v", n, err)
	}
	if fi, err := c.Stat("d/f"); err != nil || fi.Size() != int64(len(data)) {
		t.Fatalf("stat while open for write: %v %v", fi, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := c.Stat("d/f")
	if err != nil || fi.Size() != int64(len(data)) || fi.Mode().Perm() != 0o666&^umask() {
		t.Fatalf("stat after close: %v %v", fi, err)
	}
	if _, err := c.Stat("d/missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
	var pe *fs.PathError
	if _, err := c.Stat("d/f/x"); !errors.As(err, &pe) || !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("through a file: %v", err)
	}
}

func umask() fs.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return fs.FileMode(m)
}

func TestSparseAndBeyond4GiB(t *testing.T) {
	c, _ := newFS(t)
	f, err := c.Create("sparse")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := int64(5<<30 + 3)
	if _, err := f.WriteAt([]byte("tail"), off); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil || fi.Size() != off+4 {
		t.Fatalf("size %v %v", fi, err)
	}
	hole := make([]byte, 8192)
	for i := range hole {
		hole[i] = 0xff
	}
	if n, err := f.ReadAt(hole, 4<<30); err != nil || n != len(hole) {
		t.Fatalf("hole read: %d %v", n, err)
	}
	if !bytes.Equal(hole, make([]byte, 8192)) {
		t.Fatal("hole is not zeros")
	}
	buf := make([]byte, 10)
	n, err := f.ReadAt(buf, off)
	if n != 4 || !errors.Is(err, io.EOF) || string(buf[:4]) != "tail" {
		t.Fatalf("read at the end: %d %v %q", n, err, buf[:n])
	}
}

func TestConcurrentDisjointWriters(t *testing.T) {
	c, _ := newFS(t)
	f, err := c.Create("shared")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const writers, stripe, rounds = 8, 1000, 20
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bytes.Repeat([]byte{byte('a' + w)}, stripe)
			for r := range rounds {
				if _, err := f.WriteAt(b, int64((r*writers+w)*stripe)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got := make([]byte, writers*stripe*rounds)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if want := byte('a' + (i/stripe)%writers); b != want {
			t.Fatalf("byte %d is %q, want %q", i, b, want)
		}
	}
}

func TestUnlinkOpenFileKeepsData(t *testing.T) {
	c, st := newFS(t)
	if err := c.WriteFile("f", []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := c.OpenFile("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("f"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat("f"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after unlink: %v", err)
	}
	buf := make([]byte, 10)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "still here" {
		t.Fatalf("read after unlink: %q %v", buf, err)
	}
	if _, err := f.WriteAt([]byte("X"), 0); err != nil {
		t.Fatalf("write after unlink: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Metadata.NS().Check(); err != nil {
		t.Fatal(err)
	}
}

func TestRenameReplacesAtomically(t *testing.T) {
	c, _ := newFS(t)
	if err := c.MkdirAll("a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile("a/one", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile("a/b/two", []byte("22"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename("a/one", "a/b/two"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile("a/b/two"); err != nil || string(got) != "1" {
		t.Fatalf("after rename: %q %v", got, err)
	}
	err := c.Rename("a", "a/b/inside")
	var le *os.LinkError
	if !errors.As(err, &le) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("rename into own subtree: %v", err)
	}
	if err := c.Remove("a"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("remove non-empty: %v", err)
	}
	if err := c.RemoveAll("a"); err != nil {
		t.Fatal(err)
	}
}

func TestFSInterfaces(t *testing.T) {
	c, _ := newFS(t)
	for _, p := range []string{"top/x.txt", "top/sub/y.txt", "z.txt"} {
		if err := c.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile(p, []byte("content of "+p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := fstest.TestFS(c, "top/x.txt", "top/sub/y.txt", "z.txt"); err != nil {
		t.Fatal(err)
	}
}

func TestZeroCopyAndVectored(t *testing.T) {
	c, _ := newFS(t)
	f, err := c.Create("zc")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := c.AllocBuffer(10000)
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for _, s := range b.Slices() {
		for j := range s {
			s[j] = byte(i % 251)
			i++
		}
	}
	if n, err := f.WriteBufferAt(b, 100); err != nil || n != 10000 {
		t.Fatalf("zero-copy write: %d %v", n, err)
	}
	b.Release()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if n, err := f.WriteV([][]byte{[]byte("ab"), []byte("cd"), []byte("e")}); err != nil || n != 5 {
		t.Fatalf("writev: %d %v", n, err)
	}
	p1, p2 := make([]byte, 3), make([]byte, 2)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if n, err := f.ReadV([][]byte{p1, p2}); err != nil || n != 5 || string(p1)+string(p2) != "abcde" {
		t.Fatalf("readv: %d %v %q %q", n, err, p1, p2)
	}
	// ReadV across arena blocks into odd-sized buffers, up to the end of
	// the file (10100 bytes): a short read, then io.EOF.
	if _, err := f.Seek(100, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	v1, v2, v3 := make([]byte, 4999), make([]byte, 3), make([]byte, 7000)
	if n, err := f.ReadV([][]byte{v1, v2, v3}); err != nil || n != 10000 {
		t.Fatalf("readv across blocks: %d %v", n, err)
	}
	for i, v := range append(append(slices.Clone(v1), v2...), v3[:10000-4999-3]...) {
		if v != byte(i%251) {
			t.Fatalf("readv byte %d is %d, want %d", i, v, byte(i%251))
		}
	}
	if n, err := f.ReadV([][]byte{v1}); n != 0 || err != io.EOF {
		t.Fatalf("readv at the end: %d %v", n, err)
	}
	rb, err := c.AllocBuffer(10000)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Release()
	if n, err := f.ReadBufferAt(rb, 100); err != nil || n != 10000 {
		t.Fatalf("zero-copy read: %d %v", n, err)
	}
	got := make([]byte, 10000)
	rb.CopyTo(got)
	for i, v := range got {
		if v != byte(i%251) {
			t.Fatalf("byte %d", i)
		}
	}
}

// TestHandlesAreGrantedPerSession: the IO service refuses a handle that the
// metadata service did not grant to this session, and an attach with a
// wrong token.
func TestHandlesAreGrantedPerSession(t *testing.T) {
	c, st := newFS(t)
	f, err := c.Create("secret")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("mine")); err != nil {
		t.Fatal(err)
	}
	// A second, raw session: hello to the metadata service, attach to IO.
	ctx := context.Background()
	meta, err := ring.Dial(ctx, st.Config.Metadata.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	data, err := ring.Dial(ctx, st.Config.IO.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	buf := make([]byte, proto.HelloRespSize)
	copy(buf, (&proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion}).Append(nil))
	hello := rawCall(t, meta, proto.OpHello, 0, buf)
	if hello.Result != proto.HelloRespSize {
		t.Fatalf("hello: %+v", hello)
	}
	hr, err := proto.DecodeHelloResp(buf)
	if err != nil {
		t.Fatal(err)
	}
	// Reading before attaching, or with handles 1..100, must all fail.
	for h := uint64(1); h <= 100; h++ {
		if r := rawCall(t, data, proto.OpRead, h, make([]byte, 16)); r.Result >= 0 {
			t.Fatalf("read on handle %d without attach: %+v", h, r)
		}
	}
	forged := (&proto.AttachReq{Version: proto.Version, Session: hr.Session}).Append(nil) // zero token
	if r := rawCall(t, data, proto.OpAttach, 0, forged); !errors.Is(r.Err(), syscall.EPERM) {
		t.Fatalf("attach with a forged token: %+v", r)
	}
	// A session of no incarnation of this metadata service is stale.
	if r := rawCall(t, data, proto.OpAttach, 0, (&proto.AttachReq{Version: proto.Version, Session: 7}).Append(nil)); !errors.Is(r.Err(), syscall.ESTALE) {
		t.Fatalf("attach with a session of another incarnation: %+v", r)
	}
	// A version this service does not speak is refused, with its range.
	r := rawCall(t, data, proto.OpAttach, 0, (&proto.AttachReq{Version: proto.MaxVersion + 1, Session: hr.Session, Token: hr.Token}).Append(nil))
	if lo, hi := proto.SplitVersionRange(r.Aux); !errors.Is(r.Err(), syscall.EPROTONOSUPPORT) || lo != proto.MinVersion || hi != proto.MaxVersion {
		t.Fatalf("attach with an unknown version: %+v", r)
	}
}

func rawCall(t *testing.T, c *ring.Client, op uint8, handle uint64, body []byte) ring.Completion {
	t.Helper()
	b, err := c.Alloc(context.Background(), len(body))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	b.CopyFrom(body)
	r, err := c.Do(context.Background(), &ring.Call{Op: op, Handle: handle, Buf: b})
	if err != nil {
		t.Fatal(err)
	}
	if r.Result > 0 {
		b.CopyTo(body)
	}
	return r
}

// TestRestartKeepsData: a clean stop and start of every service on the
// same data directory (file backend) keeps names, contents, sizes, modes
// and the effect of unlinks.
func TestRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir, "file")
	st := startStack(t, cfg)
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	if err := c.MkdirAll("x/y", 0o750); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"x/a", "x/y/b", "c"} {
		data := bytes.Repeat([]byte{byte('0' + i)}, 5000*(i+1)+i)
		if err := c.WriteFile(name, data, 0o640); err != nil {
			t.Fatal(err)
		}
		files[name] = data
	}
	if err := c.WriteFile("gone", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	// A file still open (and written) at shutdown.
	open, err := c.Create("open-at-stop")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open.Write([]byte("written, never closed")); err != nil {
		t.Fatal(err)
	}
	files["open-at-stop"] = []byte("written, never closed")
	c.Close()
	stopStack(t, st)

	st = startStack(t, cfg)
	defer stopStack(t, st)
	c, err = st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, want := range files {
		got, err := c.ReadFile(name)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after restart: %d bytes, %v", name, len(got), err)
		}
	}
	if fi, err := c.Stat("x/y"); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750&^umask() {
		t.Fatalf("dir after restart: %v %v", fi, err)
	}
	if _, err := c.Stat("gone"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("unlinked file after restart: %v", err)
	}
	if err := st.Metadata.NS().Check(); err != nil {
		t.Fatal(err)
	}
	// The IO service's stats carry the backend's counters.
	if _, ok := st.IO.Snapshot()["file_edge_writes"]; !ok {
		t.Errorf("io stats lack the file backend's counters: %v", st.IO.Snapshot())
	}
}

// TestDefaultSocketsMatchConfig: Dial's defaults for empty socket paths are
// where the services put their sockets on the default configuration.
func TestDefaultSocketsMatchConfig(t *testing.T) {
	c := config.Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.RunDir != client.DefaultRunDir {
		t.Errorf("config run_dir %q, client.DefaultRunDir %q", c.RunDir, client.DefaultRunDir)
	}
	if want := filepath.Join(c.RunDir, client.MetadataSocketName); c.Metadata.Socket != want {
		t.Errorf("config metadata.socket %q, client default %q", c.Metadata.Socket, want)
	}
	if want := filepath.Join(c.RunDir, client.IOSocketName); c.IO.Socket != want {
		t.Errorf("config io.socket %q, client default %q", c.IO.Socket, want)
	}
	t.Setenv(client.RunDirEnv, "/elsewhere/run")
	if got := client.RunDir(); got != "/elsewhere/run" {
		t.Errorf("RunDir with %s set: %q", client.RunDirEnv, got)
	}
	t.Setenv(client.RunDirEnv, "")
	if got := client.RunDir(); got != client.DefaultRunDir {
		t.Errorf("RunDir with %s empty: %q", client.RunDirEnv, got)
	}
}

// TestHelloRefusesUnknownVersion: the metadata service refuses a client
// that speaks none of its versions, and says which it speaks.
func TestHelloRefusesUnknownVersion(t *testing.T) {
	_, st := newFS(t)
	meta, err := ring.Dial(context.Background(), st.Config.Metadata.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	buf := make([]byte, proto.HelloRespSize)
	copy(buf, (&proto.HelloReq{MinVersion: proto.MaxVersion + 1, MaxVersion: proto.MaxVersion + 5}).Append(nil))
	r := rawCall(t, meta, proto.OpHello, 0, buf)
	if lo, hi := proto.SplitVersionRange(r.Aux); !errors.Is(r.Err(), syscall.EPROTONOSUPPORT) || lo != proto.MinVersion || hi != proto.MaxVersion {
		t.Fatalf("hello with versions %d-%d: %+v", proto.MaxVersion+1, proto.MaxVersion+5, r)
	}
	// Nothing but a hello is served before one succeeds.
	if r := rawCall(t, meta, proto.OpStat, 0, (&proto.PathReq{Path: "/"}).Append(make([]byte, 0, proto.AttrSize))); !errors.Is(r.Err(), syscall.ENOTCONN) {
		t.Fatalf("stat before hello: %+v", r)
	}
}

// TestDirectoryHandles: a directory *File resolves paths from itself, as
// the *at() calls do: relative names from the directory (even after it is
// renamed), absolute ones from the root, ".." out of it; and a *File
// changes its own attributes by handle.
func TestDirectoryHandles(t *testing.T) {
	c, _ := newFS(t)
	if err := c.MkdirAll("a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := c.OpenFile("a/b", os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f, err := d.OpenAt("f", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("at")); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename("a/b", "a/moved"); err != nil { // the handle follows the directory
		t.Fatal(err)
	}
	if fi, err := d.StatAt("f"); err != nil || fi.Size() != 2 {
		t.Fatalf("StatAt(f) after the directory moved: %v %v", fi, err)
	}
	if err := d.MkdirAt("sub", 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := d.StatAt("../moved/sub"); err != nil || !fi.IsDir() {
		t.Fatalf("StatAt(../moved/sub): %v %v", fi, err)
	}
	if fi, err := d.StatAt("/a"); err != nil || !fi.IsDir() || fi.Name() != "a" {
		t.Fatalf("StatAt(/a): %v %v", fi, err)
	}
	if err := d.RenameAt("f", nil, "top"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile("top"); err != nil || string(got) != "at" {
		t.Fatalf("after RenameAt to the root: %q %v", got, err)
	}
	ents, err := d.ReadDirAt(".")
	if err != nil || len(ents) != 1 || ents[0].Name() != "sub" {
		t.Fatalf("ReadDirAt(.): %v %v", ents, err)
	}
	if err := d.ChmodAt("sub", 0o750); err != nil {
		t.Fatal(err)
	}
	if fi, _ := c.Stat("a/moved/sub"); fi == nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("after ChmodAt: %v", fi)
	}
	if err := d.RemoveAt("sub"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.OpenAt("x", os.O_RDONLY, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenAt of a missing name: %v", err)
	}
	if _, err := f.StatAt("x"); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("StatAt from a file: %v, want ENOTDIR", err)
	}
	// By handle: fchmod, fchown, futimens, on a file renamed away.
	if err := f.Chmod(0o640); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := f.Chown(1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	mt := time.Unix(1_600_000_000, 0)
	if err := f.Chtimes(time.Time{}, mt); err != nil {
		t.Fatal(err)
	}
	fi, err := c.Stat("top")
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mt) || (os.Geteuid() == 0 && (st.Uid != 1234 || st.Gid != 5678)) {
		t.Fatalf("after Chmod/Chown/Chtimes by handle: mode %v mtime %v uid %d gid %d", fi.Mode(), fi.ModTime(), st.Uid, st.Gid)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(0o600); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Chmod after Close: %v", err)
	}
}
