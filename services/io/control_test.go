package iosvc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/faulty"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// holdBackend holds, while armed, the next WriteAt or Sync of any blob,
// or Delete, until released.
type holdBackend struct {
	backend.Backend
	mu      sync.Mutex
	armed   map[string]bool // "write", "sync", "delete"; protected by mu
	entered chan string
	release chan struct{}
}

func newHoldBackend() *holdBackend {
	return &holdBackend{Backend: mem.New(), armed: map[string]bool{}, entered: make(chan string, 4), release: make(chan struct{})}
}

func (h *holdBackend) arm(op string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed[op] = true
}

func (h *holdBackend) hold(op string) {
	h.mu.Lock()
	armed := h.armed[op]
	h.armed[op] = false
	h.mu.Unlock()
	if armed {
		h.entered <- op
		<-h.release
	}
}

func (h *holdBackend) Delete(id backend.BlobID) error {
	h.hold("delete")
	return h.Backend.Delete(id)
}

func (h *holdBackend) Open(id backend.BlobID) (backend.Blob, error) {
	b, err := h.Backend.Open(id)
	if err != nil {
		return nil, err
	}
	return holdBlob{b, h}, nil
}

type holdBlob struct {
	backend.Blob
	h *holdBackend
}

func (b holdBlob) WriteAt(p []byte, off int64) (int, error) {
	b.h.hold("write")
	return b.Blob.WriteAt(p, off)
}

func (b holdBlob) Sync() error {
	b.h.hold("sync")
	return b.Blob.Sync()
}

// inoOf returns the inode number of a client's open file.
func inoOf(t *testing.T, f *client.File) ns.Ino {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return ns.Ino(fi.Sys().(*syscall.Stat_t).Ino)
}

// TestRevokeIsABarrier: closing a file revokes its grant, and the IO
// service answers the revocation only after the requests in flight on the
// handle are done, with the size they left, which the metadata service
// records exactly. No request on the handle is served after the revocation
// began.
func TestRevokeIsABarrier(t *testing.T) {
	be := newHoldBackend()
	e := startIO(t, be, nil)
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil {
		t.Fatal(err)
	}
	ino := inoOf(t, f)
	be.arm("write")
	wrote := make(chan error, 1)
	go func() {
		_, err := f.WriteAt(bytes.Repeat([]byte{7}, 16384), 8192)
		wrote <- err
	}()
	<-be.entered // the write is at the backend, its grant active
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	// The revocation is in: new requests on the handle are refused (the
	// waiting count says so), and the close waits for the write.
	waitFor(t, "the revocation to wait", func() bool { return e.io.Snapshot()["revokes_waiting"] == int64(1) })
	select {
	case err := <-closed:
		t.Fatalf("close returned (%v) while a write on the handle was at the backend", err)
	default:
	}
	close(be.release)
	if err := <-wrote; err != nil {
		t.Fatalf("the write in flight: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	// Right after the close: the size the write left, recorded (no write
	// grant is open, so nothing overlays it).
	if a, err := e.st.Metadata.NS().GetAttr(ino); err != nil || a.Size != 8192+16384 {
		t.Fatalf("after the close the namespace records %d bytes (%v), want %d", a.Size, err, 8192+16384)
	}
}

// TestFsyncReportsTheSizeItSynced: an fsync records the size the file had
// when the sync began, not one that a write racing it made larger (that
// write's bytes may not be durable).
func TestFsyncReportsTheSizeItSynced(t *testing.T) {
	be := newHoldBackend()
	e := startIO(t, be, nil)
	one, two := e.dial(t), e.dial(t)
	defer one.Close()
	defer two.Close()
	f, err := one.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	g, err := two.OpenFile("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.WriteAt([]byte{1}, 0); err != nil { // granted now, in its own session
		t.Fatal(err)
	}
	ino := inoOf(t, f)
	be.arm("sync")
	synced := make(chan error, 1)
	go func() { synced <- f.Sync() }()
	<-be.entered // the sync took the size (4096) and is at the backend
	if _, err := g.WriteAt(make([]byte, 4096), 4096); err != nil {
		t.Fatal(err) // another session makes the file 8192 bytes meanwhile
	}
	close(be.release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if a, err := e.st.Metadata.NS().GetAttr(ino); err != nil || a.Size != 4096 {
		t.Fatalf("after the fsync the namespace records %d bytes (%v), want the 4096 it synced", a.Size, err)
	}
}

// TestDeleteRetries: a blob delete that fails is retried with backoff, and
// does not hold up the deletes of other blobs; the deletes pending are in
// stats and in the namespace's persisted set (that one is retried after a
// restart is stack.TestDeleteSurvivesCrash).
func TestDeleteRetries(t *testing.T) {
	fb := faulty.New(mem.New())
	e := startIO(t, fb, nil)
	fsys := e.dial(t)
	defer fsys.Close()
	var inos []ns.Ino
	for _, name := range []string{"a", "b", "c"} {
		f, err := fsys.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte(name)); err != nil {
			t.Fatal(err)
		}
		inos = append(inos, inoOf(t, f))
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	stuck := backend.BlobID(inos[0])
	var failing sync.Mutex
	fail := true
	fb.Inject(func(op faulty.Op) error {
		failing.Lock()
		defer failing.Unlock()
		if fail && op.Kind == faulty.Delete && op.Blob == stuck {
			return syscall.EIO
		}
		return nil
	})
	for _, name := range []string{"a", "b", "c"} {
		if err := fsys.Remove(name); err != nil {
			t.Fatal(err)
		}
	}
	md := e.st.Metadata
	// b and c go at once, a stays pending and keeps being retried.
	waitFor(t, "b and c deleted", func() bool {
		ids, _ := fb.List()
		ids = slices.DeleteFunc(ids, func(id backend.BlobID) bool { return id == backend.StagingBlob })
		return len(ids) == 1 && ids[0] == stuck
	})
	waitFor(t, "a retried", func() bool { return md.Stats.DeleteFailures.Load() >= 2 })
	if n := md.Snapshot()["deletes_pending"]; n != 1 {
		t.Errorf("deletes_pending = %v, want 1", n)
	}
	if got := md.NS().PendingDeletes(); len(got) != 1 || got[0] != uint64(stuck) {
		t.Errorf("the namespace holds %v as awaiting deletion, want [%d]", got, stuck)
	}
	failing.Lock()
	fail = false
	failing.Unlock()
	waitFor(t, "a deleted once the backend lets it", func() bool {
		ids, _ := fb.List()
		ids = slices.DeleteFunc(ids, func(id backend.BlobID) bool { return id == backend.StagingBlob })
		return len(ids) == 0 && len(md.NS().PendingDeletes()) == 0
	})
}

// TestFailedWriteChangesNothing: a write the backend refuses (EFBIG far
// past the end) leaves the file as it was, size included, as on Linux; a
// read past the largest size reads nothing.
func TestFailedWriteChangesNothing(t *testing.T) {
	e := startIO(t, mem.New(), nil)
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("xy"), backend.MaxBlobSize); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write past the largest size: %v, want EFBIG", err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != 5 {
		t.Fatalf("after the failed write: size %v (%v), want 5", fi.Size(), err)
	}
	got := make([]byte, 8)
	if n, err := f.ReadAt(got, 5); n != 0 || err != io.EOF {
		t.Fatalf("read at the end: %d, %v", n, err)
	}
	if n, err := f.ReadAt(got, backend.MaxBlobSize+4096); n != 0 || err != io.EOF {
		t.Fatalf("read past the largest size: %d, %v; want 0 bytes and EOF, as Linux reads", n, err)
	}
}

// waitFor polls cond; the deadline only bounds a hung test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSlowDeleteHoldsUpNothing: io runs a blob delete off its ordered
// control subscription, so a delete the backend takes long over (a large
// file) does not hold up the grants and revocations behind it; the blob
// cannot be opened while it is being deleted.
func TestSlowDeleteHoldsUpNothing(t *testing.T) {
	be := newHoldBackend()
	e := startIO(t, be, nil)
	fsys := e.dial(t)
	defer fsys.Close()
	if err := fsys.WriteFile("big", []byte("imagine many GiB"), 0o644); err != nil {
		t.Fatal(err)
	}
	be.arm("delete")
	if err := fsys.Remove("big"); err != nil {
		t.Fatal(err)
	}
	<-be.entered // the delete is at the backend
	// Grants and revocations go on meanwhile.
	for i := range 3 {
		name := fmt.Sprintf("f%d", i)
		if err := fsys.WriteFile(name, []byte(name), 0o644); err != nil {
			t.Fatalf("write %s during the delete: %v", name, err)
		}
		if b, err := fsys.ReadFile(name); err != nil || string(b) != name {
			t.Fatalf("read %s during the delete: %q %v", name, b, err)
		}
	}
	if n := e.st.Metadata.Snapshot()["deletes_pending"]; n != 1 {
		t.Errorf("deletes_pending = %v during the delete, want 1", n)
	}
	close(be.release)
	waitFor(t, "the delete done", func() bool { return len(e.st.Metadata.NS().PendingDeletes()) == 0 })
	if n := e.io.Snapshot()["deletes"]; n != uint64(1) {
		t.Errorf("io deletes = %v, want 1", n)
	}
}

// rawCall runs one request on c with a buffer holding in (and room for
// out), copying the response into out.
func rawCall(t *testing.T, c *ring.Client, op uint8, arg uint32, handle, off uint64, in, out []byte) ring.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := ring.Call{Op: op, Arg: arg, Handle: handle, Offset: off}
	if n := max(len(in), len(out)); n > 0 {
		b, err := c.Alloc(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		b.CopyFrom(in)
		call.Buf = b
		comp, err := c.Do(ctx, &call)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil && comp.Result > 0 {
			b.CopyTo(out[:min(len(out), int(comp.Result))])
		}
		return comp
	}
	comp, err := c.Do(ctx, &call)
	if err != nil {
		t.Fatal(err)
	}
	return comp
}

// TestRevokeRefusesNewRequests: from the moment a revocation reaches io,
// a new request on the handle is refused (EBADF) at once, while a request
// already in flight on it finishes; the revocation is answered after it.
func TestRevokeRefusesNewRequests(t *testing.T) {
	be := newHoldBackend()
	e := startIO(t, be, nil)
	iosvc.SetHandOffAlways(e.io, true) // the held write must not hold up the session's other requests
	ctx := context.Background()
	meta, err := ring.Dial(ctx, e.cfg.Metadata.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	hout := make([]byte, proto.HelloRespSize)
	hreq := proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion}
	if c := rawCall(t, meta, proto.OpHello, 0, 0, 0, hreq.Append(nil), hout); c.Result != proto.HelloRespSize {
		t.Fatalf("hello: %+v", c)
	}
	hello, err := proto.DecodeHelloResp(hout)
	if err != nil {
		t.Fatal(err)
	}
	data, err := ring.Dial(ctx, e.cfg.IO.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	att := proto.AttachReq{Version: hello.Version, Session: hello.Session, Token: hello.Token}
	if c := rawCall(t, data, proto.OpAttach, 0, 0, 0, att.Append(nil), nil); c.Result != 0 {
		t.Fatalf("attach: %+v", c)
	}
	oout := make([]byte, proto.OpenRespSize(0))
	oin := (&proto.ModePathReq{Mode: 0o644, Path: "f"}).Append(nil)
	c := rawCall(t, meta, proto.OpOpen, syscall.O_RDWR|syscall.O_CREAT, 0, 0, oin, oout)
	open, err := proto.DecodeOpenResp(oout[:max(c.Result, 0)], 0)
	if err != nil {
		t.Fatalf("open: %+v %v", c, err)
	}
	h := open.Handle
	if c := rawCall(t, meta, proto.OpGrant, 0, h, 0, nil, nil); c.Result != 0 {
		t.Fatalf("grant: %+v", c)
	}
	be.arm("write")
	wrote := make(chan ring.Completion, 1)
	go func() { wrote <- rawCall(t, data, proto.OpWrite, 0, h, 0, []byte("in flight"), nil) }()
	<-be.entered
	closed := make(chan ring.Completion, 1)
	go func() { closed <- rawCall(t, meta, proto.OpClose, 0, h, 0, nil, nil) }()
	waitFor(t, "the revocation to wait", func() bool { return e.io.Snapshot()["revokes_waiting"] == int64(1) })
	for _, op := range []uint8{proto.OpRead, proto.OpWrite, proto.OpSync, proto.OpGetAttr} {
		var in, out []byte
		switch op {
		case proto.OpRead:
			out = make([]byte, 16)
		case proto.OpWrite:
			in = []byte("after the revoke")
		case proto.OpGetAttr:
			out = make([]byte, proto.GetAttrRespSize)
		}
		if c := rawCall(t, data, op, 0, h, 0, in, out); c.Result != -int64(syscall.EBADF) {
			t.Errorf("op %#x on the handle while its revocation waits: %+v, want EBADF", op, c)
		}
	}
	select {
	case c := <-closed:
		t.Fatalf("close answered (%+v) while a write on the handle was at the backend", c)
	default:
	}
	close(be.release)
	if c := <-wrote; c.Result != int64(len("in flight")) {
		t.Fatalf("the write in flight: %+v", c)
	}
	if c := <-closed; c.Result != 0 {
		t.Fatalf("close: %+v", c)
	}
}

// blockingDeletes holds every Delete until release is closed.
type blockingDeletes struct {
	backend.Backend
	running atomic.Int32
	release chan struct{}
}

func (b *blockingDeletes) Delete(id backend.BlobID) error {
	b.running.Add(1)
	<-b.release
	return b.Backend.Delete(id)
}

// TestDeletesAreBounded: io runs at most 8 blob deletes at once; more are
// refused as busy at once (metadata's deleter sends them again later), so
// slow deletes cannot pile up goroutines behind a timed-out deleter.
func TestDeletesAreBounded(t *testing.T) {
	be := &blockingDeletes{Backend: mem.New(), release: make(chan struct{})}
	e := startIO(t, be, nil)
	nc, err := e.st.Connect(control.RoleMetadata, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sj := control.SubjectsIn(e.cfg.NATS.Namespace)
	const n = 12
	answers := make(chan control.Ack, n)
	for i := range n {
		go func() {
			var ack control.Ack
			if err := control.Request(nc, sj.Delete, control.Delete{Blob: uint64(1<<20 + i)}, &ack, 30*time.Second); err != nil {
				ack.Error = err.Error()
			}
			answers <- ack
		}()
	}
	busy := 0
	for range n - 8 {
		a := <-answers
		if a.Errno != int(syscall.EBUSY) {
			t.Fatalf("an answer before any delete finished: %+v, want EBUSY", a)
		}
		busy++
	}
	waitFor(t, "8 deletes at the backend", func() bool { return be.running.Load() == 8 })
	close(be.release)
	for range 8 {
		if a := <-answers; a.Error != "" {
			t.Errorf("a delete that ran: %+v", a)
		}
	}
	if busy != n-8 || be.running.Load() != 8 {
		t.Errorf("%d refused, %d ran; want %d and 8", busy, be.running.Load(), n-8)
	}
}
