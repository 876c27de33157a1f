package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
)

// TestKeptLeaseReusedWithoutGrant: a read-only open, read and close of a
// file the session read before uses its kept lease: no grant (no NATS
// message to io). Another session's writes are what it reads.
func TestKeptLeaseReusedWithoutGrant(t *testing.T) {
	c, st := newFS(t)
	if err := c.WriteFile("f", []byte("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	md := &st.Metadata.Stats
	read := func(want string) {
		t.Helper()
		f, err := c.Open("f")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("read %q, want %q", got, want)
		}
	}
	read("first")
	grants, leaseOpens := md.Grants.Load(), md.LeaseOpens.Load()
	for range 5 {
		read("first")
	}
	if g := md.Grants.Load() - grants; g != 0 {
		t.Errorf("5 opens under a kept lease asked io for %d grants", g)
	}
	if n := md.LeaseOpens.Load() - leaseOpens; n != 5 {
		t.Errorf("5 opens under a kept lease: %d used it", n)
	}
	// Another session (a writer is granted per handle) changes the file:
	// the kept lease reads what it wrote.
	c2, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.WriteFile("f", []byte("second, longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	read("second, longer")
	if n := st.Metadata.Snapshot()["leases"].(int); n != 1 {
		t.Errorf("%d leases kept, want 1", n)
	}
	// A session that ends takes its leases with it.
	c.Close()
	waitUntil(t, "the ended session's lease revoked", func() bool { return st.Metadata.Snapshot()["leases"].(int) == 0 })
}

// rawSession is a metadata and an IO ring with the handshake done by
// hand, so that a test can name any handle on the IO ring, as a hostile
// client would.
type rawSession struct {
	meta, data *ring.Client
	features   uint64 // negotiated at hello
}

func dialRaw(t *testing.T, st *stack.Stack, features uint64) *rawSession {
	t.Helper()
	ctx := context.Background()
	meta, err := ring.Dial(ctx, st.Config.Metadata.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := ring.Dial(ctx, st.Config.IO.Socket, ring.ClientOptions{})
	if err != nil {
		meta.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { data.Close(); meta.Close() })
	buf := make([]byte, proto.HelloRespSize)
	copy(buf, (&proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: features}).Append(nil))
	if r := rawCall(t, meta, proto.OpHello, 0, buf); r.Result != proto.HelloRespSize {
		t.Fatalf("hello: %+v", r)
	}
	hr, err := proto.DecodeHelloResp(buf)
	if err != nil || hr.Features != features {
		t.Fatalf("hello: %+v %v (asked for features %#x)", hr, err, features)
	}
	if r := rawCall(t, data, proto.OpAttach, 0, (&proto.AttachReq{Version: proto.Version, Session: hr.Session, Token: hr.Token}).Append(nil)); r.Result < 0 {
		t.Fatalf("attach: %+v", r.Err())
	}
	return &rawSession{meta: meta, data: data, features: features}
}

// open opens name read-only and returns the open's answer.
func (s *rawSession) open(t *testing.T, name string) proto.OpenResp {
	t.Helper()
	req := (&proto.ModePathReq{Path: name}).Append(nil)
	buf := make([]byte, max(len(req), proto.OpenRespSize(s.features)))
	copy(buf, req)
	b, err := s.meta.Alloc(context.Background(), len(buf))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	b.CopyFrom(buf[:len(req)])
	comp, err := s.meta.Do(context.Background(), &ring.Call{Op: proto.OpOpen, Arg: uint32(os.O_RDONLY), Handle: proto.RootHandle, Buf: b})
	if err != nil || comp.Result < 0 {
		t.Fatalf("open %s: %v %v", name, err, comp.Err())
	}
	b.CopyTo(buf)
	r, err := proto.DecodeOpenResp(buf[:comp.Result], s.features)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// read reads 16 bytes at 0 naming handle on the IO ring.
func (s *rawSession) read(t *testing.T, handle uint64) ([]byte, error) {
	t.Helper()
	buf := make([]byte, 16)
	r := rawCall(t, s.data, proto.OpRead, handle, buf)
	if r.Result < 0 {
		return nil, r.Err()
	}
	return buf[:r.Result], nil
}

// TestKeptLeaseEnds: a kept lease lets its session read the file after
// the close, as an open read-only handle would, and no longer once the
// file's mode changed, once the file is deleted, or once the session
// keeps too many; the IO service refuses reads naming it (EBADF).
func TestKeptLeaseEnds(t *testing.T) {
	c, st := newFS(t)
	for _, n := range []string{"a", "b"} {
		if err := c.WriteFile(n, []byte("contents of "+n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := dialRaw(t, st, proto.FeatureLeases)
	lease := func(name string) uint64 {
		t.Helper()
		r := s.open(t, name)
		comp := bare(t, s.meta, proto.OpGrant, r.Handle)
		if comp.Result < 0 || comp.Aux != r.Handle {
			t.Fatalf("grant of %s: %+v (want aux %d, the handle)", name, comp, r.Handle)
		}
		if got, err := s.read(t, r.Handle); err != nil || string(got) != "contents of "+name {
			t.Fatalf("read of %s: %q %v", name, got, err)
		}
		if comp := bare(t, s.meta, proto.OpClose, r.Handle); comp.Result < 0 {
			t.Fatalf("close: %v", comp.Err())
		}
		// Reopened: the answer names the kept lease, granted.
		again := s.open(t, name)
		if !again.Granted || again.IOHandle() != r.Handle {
			t.Fatalf("reopen of %s: granted %v, data handle %d; want the kept lease %d", name, again.Granted, again.IOHandle(), r.Handle)
		}
		if comp := bare(t, s.meta, proto.OpClose, again.Handle); comp.Result < 0 {
			t.Fatalf("close: %v", comp.Err())
		}
		return r.Handle
	}
	la, lb := lease("a"), lease("b")
	if got, err := s.read(t, la); err != nil || string(got) != "contents of a" {
		t.Fatalf("read under the kept lease after close: %q %v", got, err)
	}
	ended := st.Metadata.Stats.LeasesEnded.Load()
	if err := c.Chmod("a", 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.read(t, la); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read under a kept lease of a file whose mode changed: %v, want EBADF", err)
	}
	if err := c.Remove("b"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b's blob deleted", func() bool { return len(st.Metadata.NS().PendingDeletes()) == 0 })
	if _, err := s.read(t, lb); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read under a kept lease of a deleted file: %v, want EBADF", err)
	}
	if n := st.Metadata.Stats.LeasesEnded.Load() - ended; n != 2 {
		t.Errorf("%d leases ended, want 2", n)
	}

	// A session keeps at most 256 idle leases: the least recently used
	// go first.
	const files = 300
	for i := range files {
		if err := c.WriteFile(fmt.Sprintf("n%d", i), []byte(fmt.Sprint("contents of n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	first := uint64(0)
	for i := range files {
		r := s.open(t, fmt.Sprintf("n%d", i))
		if comp := bare(t, s.meta, proto.OpGrant, r.Handle); comp.Result < 0 {
			t.Fatal(comp.Err())
		}
		if i == 0 {
			first = r.Handle
		}
		if comp := bare(t, s.meta, proto.OpClose, r.Handle); comp.Result < 0 {
			t.Fatal(comp.Err())
		}
	}
	if n := st.Metadata.Snapshot()["leases"].(int); n > 256 {
		t.Fatalf("%d leases kept by one session", n)
	}
	// Pushed out, and ended in the background (leaseEnder).
	waitUntil(t, "the least recently used lease ended", func() bool {
		_, err := s.read(t, first)
		return errors.Is(err, syscall.EBADF)
	})
}

// TestNoLeasesWithoutTheFeature: a session that did not negotiate
// FeatureLeases gets per-handle grants, revoked at close, as before.
func TestNoLeasesWithoutTheFeature(t *testing.T) {
	c, st := newFS(t)
	if err := c.WriteFile("f", []byte("contents of f"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := dialRaw(t, st, 0)
	req := (&proto.ModePathReq{Path: "f"}).Append(nil)
	buf := make([]byte, max(len(req), proto.OpenRespSize(0)))
	copy(buf, req)
	r := rawCall(t, s.meta, proto.OpOpen, proto.RootHandle, buf)
	if r.Result < 0 {
		t.Fatal(r.Err())
	}
	or, err := proto.DecodeOpenResp(buf[:r.Result], 0)
	if err != nil {
		t.Fatal(err)
	}
	if comp := bare(t, s.meta, proto.OpGrant, or.Handle); comp.Result < 0 {
		t.Fatal(comp.Err())
	}
	if got, err := s.read(t, or.Handle); err != nil || !bytes.Equal(got, []byte("contents of f")) {
		t.Fatalf("read: %q %v", got, err)
	}
	if comp := bare(t, s.meta, proto.OpClose, or.Handle); comp.Result < 0 {
		t.Fatal(comp.Err())
	}
	if _, err := s.read(t, or.Handle); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read after close without FeatureLeases: %v, want EBADF", err)
	}
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// bare is a call without a payload.
func bare(t *testing.T, c *ring.Client, op uint8, handle uint64) ring.Completion {
	t.Helper()
	r, err := c.Do(context.Background(), &ring.Call{Op: op, Handle: handle})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestKeptMappingReused: a file opened under its kept lease maps its
// cache region at its first read, and the mapping outlives the close: the
// next opens under the lease read from it without mapping again, and see
// what another session wrote meanwhile (the region stays coherent while
// the lease holds the file open at io). A lease that ended is not reused:
// the next open is granted anew.
func TestKeptMappingReused(t *testing.T) {
	c, st := newFS(t)
	if err := c.WriteFile("f", bytes.Repeat([]byte("a"), 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	maps := func() uint64 { return st.IO.Snapshot()["cache_maps"].(uint64) }
	readAll := func() string {
		t.Helper()
		f, err := c.Open("f")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := readAll(); got != string(bytes.Repeat([]byte("a"), 8192)) { // the lease
		t.Fatalf("first read: %d bytes", len(got))
	}
	m0, hits := maps(), c.CacheHits.Load()
	c2, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for i := range 4 {
		want := fmt.Sprintf("version %d", i)
		if err := c2.WriteFile("f", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := readAll(); got != want {
			t.Fatalf("read under the kept lease after another session's write: %q, want %q", got, want)
		}
	}
	// The first read of 8 KiB took more than mapAfterReads reads (ReadAll
	// grows its buffer): it mapped, and its close kept the mapping.
	if m := maps() - m0; m != 0 {
		t.Errorf("4 opens under the kept lease mapped the region %d times, want 0", m)
	}
	if c.CacheHits.Load() == hits {
		t.Error("no read under the kept lease was served from the mapping")
	}
	// The mode changes: the lease ends; the next open is granted anew
	// and reads the file right.
	if err := c2.Chmod("f", 0o640); err != nil {
		t.Fatal(err)
	}
	// Granted through io or by a capability (caps.go): either counts.
	granted := func() uint64 { return st.Metadata.Stats.Grants.Load() + st.Metadata.Snapshot()["caps_minted"].(uint64) }
	grants := granted()
	if got := readAll(); got != "version 3" {
		t.Fatalf("read after the lease ended: %q", got)
	}
	if g := granted() - grants; g != 1 {
		t.Errorf("the open after the lease ended was granted %d times, want 1", g)
	}
}

// TestKeptMappingsEndWithTheFS: the FS keeps the mapping of a file closed
// under its kept lease, and none once it is closed, also of a file closed
// after it (a deferred Close runs after the FS's).
func TestKeptMappingsEndWithTheFS(t *testing.T) {
	c, _ := newFS(t)
	if err := c.WriteFile("f", []byte("contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func() *client.File {
		t.Helper()
		f, err := c.OpenFile("f", os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	open().Close() // the lease
	f := open()    // under it: maps at its first read
	f.Close()
	if n := client.KeptMappings(c); n != 1 {
		t.Fatalf("%d mappings kept after a close under the lease, want 1", n)
	}
	late := open()
	c.Close()
	late.Close()
	if n := client.KeptMappings(c); n != 0 {
		t.Fatalf("%d mappings kept after the FS closed, want 0", n)
	}
}

// TestRemoveFilesUnderKeptLeases: files the session read (so it keeps a
// lease of each) and then removes are deleted at io: each delete ends
// the leases of its blob first, its own and those another end (the
// session's, an eviction) has under way.
func TestRemoveFilesUnderKeptLeases(t *testing.T) {
	c, st := newFS(t)
	const n = 300
	for i := range n {
		name := fmt.Sprint("r", i)
		if err := c.WriteFile(name, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReadFile(name); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for i := range n {
		if err := c.Remove(fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "every removed file's blob deleted", func() bool { return len(st.Metadata.NS().PendingDeletes()) == 0 })
	t.Logf("%d removes and their deletes took %v", n, time.Since(start))
	if f := st.Metadata.Stats.DeleteFailures.Load(); f != 0 {
		t.Errorf("%d delete attempts failed", f)
	}
}

// TestLateClosesArrive: read-only closes are not waited for. In a loop of
// opens they ride beside the next open; the last one, which no open
// follows, the closer sends: every handle ends at the service, and an
// unlinked file's blob goes once its last close arrives.
func TestLateClosesArrive(t *testing.T) {
	c, st := newFS(t)
	md := &st.Metadata.Stats
	for i := range 4 {
		if err := c.WriteFile(fmt.Sprintf("f%d", i), []byte("small"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := md.Handles.Load()
	for i := range 200 {
		f, err := c.Open(fmt.Sprintf("f%d", i%4))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(f); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.ClosesAside.Load(); n == 0 {
		t.Errorf("200 opens after closes: no close rode beside one")
	}
	waitUntil(t, "every handle closed at the metadata service", func() bool { return md.Handles.Load() == base })

	// Opens from several goroutines at once: one's close is refused a
	// ride when another's stands aside, and goes back to the queue,
	// from which the closer sends it all the same.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				f, err := c.Open(fmt.Sprintf("f%d", (g+i)%4))
				if err == nil {
					_, err = io.ReadAll(f)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitUntil(t, "every handle of the concurrent opens closed", func() bool { return md.Handles.Load() == base })

	// A close whose ride was refused after the closer had looked.
	f, err := c.Open("f1")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if !client.RefuseCloseRide(c) {
		t.Fatal("no close queued after a read-only close")
	}
	waitUntil(t, "a close given back sent", func() bool { return md.Handles.Load() == base })

	// The last close of an unlinked file, with no open after it.
	f, err = c.Open("f0")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("f0"); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(f); err != nil || string(got) != "small" {
		t.Fatalf("an open file after its unlink: %q, %v", got, err)
	}
	deletes := st.IO.Stats.Deletes.Load()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the unlinked file's blob deleted after its last close", func() bool { return st.IO.Stats.Deletes.Load() > deletes })
	waitUntil(t, "its handle closed", func() bool { return md.Handles.Load() == base })
}
