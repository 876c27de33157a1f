package stack_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// metaSession is a metadata ring that said hello with FeatureReopen.
type metaSession struct {
	c     *ring.Client
	hello proto.HelloResp
}

func dialMeta(t *testing.T, socket string) *metaSession {
	t.Helper()
	c, err := ring.Dial(context.Background(), socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	out := make([]byte, proto.HelloRespSize)
	req := proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: proto.FeatureReopen}
	if r := rawDo(t, c, proto.OpHello, 0, 0, req.Append(nil), out); r.Result != proto.HelloRespSize {
		t.Fatalf("hello: %+v", r)
	}
	h, err := proto.DecodeHelloResp(out)
	if err != nil || h.Features&proto.FeatureReopen == 0 {
		t.Fatalf("hello: %+v %v", h, err)
	}
	return &metaSession{c: c, hello: h}
}

// open opens name with flags (creating it 0644) and returns its response.
func (m *metaSession) open(t *testing.T, name string, flags int) proto.OpenResp {
	t.Helper()
	out := make([]byte, proto.OpenRespSize(proto.FeatureReopen))
	in := (&proto.ModePathReq{Mode: 0o644, Path: name}).Append(nil)
	c := rawCall(t, m.c, proto.OpOpen, uint32(flags|syscall.O_CREAT), 0, in, out)
	r, err := proto.DecodeOpenResp(out[:max(c.Result, 0)], proto.FeatureReopen)
	if err != nil {
		t.Fatalf("open %s: %+v %v", name, c, err)
	}
	return r
}

// reopen sends OpReopen with tk: the response, or the errno.
func (m *metaSession) reopen(t *testing.T, tk proto.Ticket) (proto.OpenResp, syscall.Errno) {
	t.Helper()
	out := make([]byte, proto.OpenRespSize(proto.FeatureReopen))
	c := rawCall(t, m.c, proto.OpReopen, 0, 0, tk[:], out)
	if c.Result < 0 {
		return proto.OpenResp{}, syscall.Errno(-c.Result)
	}
	r, err := proto.DecodeOpenResp(out[:c.Result], proto.FeatureReopen)
	if err != nil {
		t.Fatalf("reopen: %+v %v", c, err)
	}
	return r, 0
}

// TestReopenTickets: a reopen ticket stands in for a handle that a restart
// of the metadata service took away, and for nothing else. It is refused
// in the incarnation that issued it (the handle is still there), when it
// is altered in any byte, a second time while the session that reopened
// it lives, once the reclaim grace after the restart is over, and in any
// incarnation but the next; the reopened handle is of the new incarnation
// and the same inode. (Flags and permissions: ns.TestReopenHeld.)
func TestReopenTickets(t *testing.T) {
	cfg := testConfig(t)
	const grace = time.Second
	path := filepath.Join(t.TempDir(), "weir.hcl")
	if err := os.WriteFile(path, []byte("metadata {\n  reclaim_grace = \"1s\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	url, md, _ := startPair(t, cfg, "--config", path)
	m := dialMeta(t, cfg.Metadata.Socket)
	f := m.open(t, "f", syscall.O_RDONLY)
	g := m.open(t, "g", syscall.O_RDWR|syscall.O_APPEND)
	h := m.open(t, "h", syscall.O_RDWR)
	if _, e := m.reopen(t, f.Ticket); e != syscall.EPERM {
		t.Errorf("reopen in the incarnation that issued the ticket: %v, want EPERM", e)
	}
	for i := range proto.TicketSize {
		bad := g.Ticket
		bad[i] ^= 0x02 // e.g. O_RDONLY -> O_RDWR in the flags, uid 0 -> 2
		if _, e := m.reopen(t, bad); e != syscall.EPERM {
			t.Errorf("reopen with byte %d of the ticket altered: %v, want EPERM", i, e)
		}
	}

	md.kill(t)
	md2 := startService(t, buildWeir(t), "metadata", cfg, url, "--config", path)
	m2 := dialMeta(t, cfg.Metadata.Socket)
	start := time.Now()
	r, e := m2.reopen(t, g.Ticket)
	if e != 0 {
		t.Fatalf("reopen after the restart: %v", e)
	}
	if proto.IncarnationOf(r.Handle) <= proto.IncarnationOf(g.Handle) || r.Attr.Ino != g.Attr.Ino {
		t.Errorf("reopened handle %#x for inode %d; the original was %#x for %d", r.Handle, r.Attr.Ino, g.Handle, g.Attr.Ino)
	}
	if _, e := m2.reopen(t, g.Ticket); e != syscall.ESTALE {
		t.Errorf("second reopen with one ticket: %v, want ESTALE", e)
	}
	if _, e := m2.reopen(t, r.Ticket); e != syscall.EPERM {
		t.Errorf("reopen with the new ticket in its own incarnation: %v, want EPERM", e)
	}
	rf, e := m2.reopen(t, f.Ticket)
	if e != 0 || rf.Attr.Ino != f.Attr.Ino {
		t.Fatalf("reopen of f: %+v %v", rf, e)
	}
	// Once the session that reopened it ended (its answer may have been
	// lost with it), the ticket may be used once more.
	m2.c.Close()
	m3 := dialMeta(t, cfg.Metadata.Socket)
	for deadline := time.Now().Add(grace / 2); ; time.Sleep(5 * time.Millisecond) {
		_, e := m3.reopen(t, g.Ticket)
		if e == 0 {
			break
		}
		// The service learns of the session's end from its socket, soon.
		if e != syscall.ESTALE || time.Now().After(deadline) {
			t.Fatalf("reopen after the reopening session ended: %v", e)
		}
	}
	time.Sleep(time.Until(start.Add(grace + 200*time.Millisecond)))
	if _, e := m3.reopen(t, h.Ticket); e != syscall.ESTALE {
		t.Errorf("reopen after the reclaim grace: %v, want ESTALE", e)
	}

	// Another restart: tickets of the incarnation before the last are
	// refused, those of the last are taken.
	md2.kill(t)
	startService(t, buildWeir(t), "metadata", cfg, url, "--config", path)
	m4 := dialMeta(t, cfg.Metadata.Socket)
	if _, e := m4.reopen(t, h.Ticket); e != syscall.ESTALE {
		t.Errorf("reopen with a ticket of two incarnations ago: %v, want ESTALE", e)
	}
	if _, e := m4.reopen(t, rf.Ticket); e != 0 {
		t.Errorf("reopen with a ticket of the last incarnation: %v", e)
	}
}

// TestIdleClientKeepsFiles: a client that does nothing while the metadata
// service restarts still has its open files afterwards, a file it
// unlinked while open included, although tickets are only taken within
// the reclaim grace (1 s here) and its first call comes later: the client
// recovers when its session ends, not at its next call.
func TestIdleClientKeepsFiles(t *testing.T) {
	cfg := testConfig(t)
	path := filepath.Join(t.TempDir(), "weir.hcl")
	if err := os.WriteFile(path, []byte("metadata {\n  reclaim_grace = \"1s\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	url, md, _ := startPair(t, cfg, "--config", path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.Create("log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := fsys.Create("scratch")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, fl := range []*client.File{f, g} {
		if _, err := fl.Write([]byte("before;")); err != nil {
			t.Fatal(err)
		}
	}
	if err := fsys.Remove("scratch"); err != nil {
		t.Fatal(err)
	}
	md.kill(t)
	startService(t, buildWeir(t), "metadata", cfg, url, "--config", path)
	time.Sleep(1500 * time.Millisecond) // past the grace, without a call
	for _, fl := range []*client.File{f, g} {
		if _, err := fl.Write([]byte("after")); err != nil {
			t.Fatalf("%s: write after the restart: %v", fl.Name(), err)
		}
		b := make([]byte, 64)
		n, err := fl.ReadAt(b, 0)
		if string(b[:n]) != "before;after" {
			t.Errorf("%s reads %q (%v)", fl.Name(), b[:n], err)
		}
	}
	if fsys.Recoveries.Load() != 1 {
		t.Errorf("recoveries = %d, want 1", fsys.Recoveries.Load())
	}
}

// inherit sends OpInherit with tk: the response, or the errno.
func (m *metaSession) inherit(t *testing.T, tk proto.Ticket) (proto.OpenResp, syscall.Errno) {
	t.Helper()
	out := make([]byte, proto.OpenRespSize(proto.FeatureReopen))
	c := rawCall(t, m.c, proto.OpInherit, 0, 0, tk[:], out)
	if c.Result < 0 {
		return proto.OpenResp{}, syscall.Errno(-c.Result)
	}
	r, err := proto.DecodeOpenResp(out[:c.Result], proto.FeatureReopen)
	if err != nil {
		t.Fatalf("inherit: %+v %v", c, err)
	}
	return r, 0
}

// TestInheritTickets: another session of the same uid gets a handle of
// the same inode with the same flags from a ticket of this incarnation
// (the C shim's fork and exec), as often as it asks, after a rename and
// after an unlink while the file is open; not from a ticket altered in
// any byte (the uid and the flags among them), not after a restart, and
// not once an unlinked file is gone.
func TestInheritTickets(t *testing.T) {
	cfg := testConfig(t)
	url, md, _ := startPair(t, cfg)
	m := dialMeta(t, cfg.Metadata.Socket)
	f := m.open(t, "f", syscall.O_RDONLY)
	g := m.open(t, "g", syscall.O_WRONLY|syscall.O_APPEND)
	child := dialMeta(t, cfg.Metadata.Socket)
	var held []uint64
	for i := 0; i < 2; i++ {
		r, e := child.inherit(t, g.Ticket)
		if e != 0 {
			t.Fatalf("inherit %d: %v", i, e)
		}
		if r.Handle == g.Handle || r.Attr.Ino != g.Attr.Ino {
			t.Fatalf("inherited handle %#x of inode %d; the original %#x of %d", r.Handle, r.Attr.Ino, g.Handle, g.Attr.Ino)
		}
		if r.Ticket != g.Ticket && r.Ticket == ([proto.TicketSize]byte{}) {
			t.Fatalf("inherited handle has no ticket")
		}
		held = append(held, r.Handle)
	}
	for i := range proto.TicketSize {
		bad := f.Ticket
		bad[i] ^= 0x02
		if _, e := child.inherit(t, bad); e != syscall.EPERM {
			t.Errorf("inherit with byte %d of the ticket altered: %v, want EPERM", i, e)
		}
	}
	if rawCall(t, m.c, proto.OpRename, 0, 0, (&proto.RenameReq{Old: "f", New: "f2"}).Append(nil), nil).Result != 0 {
		t.Fatal("rename")
	}
	if r, e := child.inherit(t, f.Ticket); e != 0 || r.Attr.Ino != f.Attr.Ino {
		t.Errorf("inherit after a rename: %+v %v", r, e)
	}
	if rawCall(t, m.c, proto.OpUnlink, 0, 0, (&proto.PathReq{Path: "g"}).Append(nil), nil).Result != 0 {
		t.Fatal("unlink")
	}
	r, e := child.inherit(t, g.Ticket)
	if e != 0 || r.Attr.Ino != g.Attr.Ino || r.Attr.Nlink != 0 {
		t.Fatalf("inherit of an unlinked file still open: %+v %v", r, e)
	}
	// Once no handle holds it, the unlinked file is gone.
	rawDo(t, m.c, proto.OpClose, g.Handle, 0, nil, nil)
	for _, h := range append(held, r.Handle) {
		rawDo(t, child.c, proto.OpClose, h, 0, nil, nil)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, e := child.inherit(t, g.Ticket)
		if e == syscall.ESTALE {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inherit of an unlinked file no handle holds: %v, want ESTALE", e)
		}
	}
	md.kill(t)
	startService(t, buildWeir(t), "metadata", cfg, url)
	m2 := dialMeta(t, cfg.Metadata.Socket)
	if _, e := m2.inherit(t, f.Ticket); e != syscall.EPERM {
		t.Errorf("inherit with a ticket of the last incarnation: %v, want EPERM", e)
	}
}
