package stack_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

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
	out := make([]byte, proto.OpenRespSize(true))
	in := (&proto.ModePathReq{Mode: 0o644, Path: name}).Append(nil)
	c := rawCall(t, m.c, proto.OpOpen, uint32(flags|syscall.O_CREAT), 0, in, out)
	r, err := proto.DecodeOpenResp(out[:max(c.Result, 0)], true)
	if err != nil {
		t.Fatalf("open %s: %+v %v", name, c, err)
	}
	return r
}

// reopen sends OpReopen with tk: the response, or the errno.
func (m *metaSession) reopen(t *testing.T, tk proto.Ticket) (proto.OpenResp, syscall.Errno) {
	t.Helper()
	out := make([]byte, proto.OpenRespSize(true))
	c := rawCall(t, m.c, proto.OpReopen, 0, 0, tk[:], out)
	if c.Result < 0 {
		return proto.OpenResp{}, syscall.Errno(-c.Result)
	}
	r, err := proto.DecodeOpenResp(out[:c.Result], true)
	if err != nil {
		t.Fatalf("reopen: %+v %v", c, err)
	}
	return r, 0
}

// TestReopenTickets: a reopen ticket stands in for a handle that a restart
// of the metadata service took away, and for nothing else. It is refused
// in the incarnation that issued it (the handle is still there), when it
// is altered in any byte, a second time, and once the reclaim grace after
// the restart is over; the reopened handle is of the new incarnation and
// the same inode. (Flags and permissions: ns.TestReopenHeld.)
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
	startService(t, buildWeir(t), "metadata", cfg, url, "--config", path)
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
	if rf, e := m2.reopen(t, f.Ticket); e != 0 || rf.Attr.Ino != f.Attr.Ino {
		t.Errorf("reopen of f: %+v %v", rf, e)
	}
	time.Sleep(time.Until(start.Add(grace + 200*time.Millisecond)))
	if _, e := m2.reopen(t, h.Ticket); e != syscall.ESTALE {
		t.Errorf("reopen after the reclaim grace: %v, want ESTALE", e)
	}
}
