package stack_test

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// openRaw opens path with flag through the raw metadata session c and has
// the handle granted at the IO service.
func (e *hostileEnv) openRaw(t *testing.T, c *ring.Client, path string, flag int) uint64 {
	t.Helper()
	out := make([]byte, proto.OpenRespSize(proto.FeatureReopen))
	body := (&proto.ModePathReq{Mode: 0o644, Path: path}).Append(nil)
	comp := e.do(t, c, &ring.Call{Op: proto.OpOpen, Arg: uint32(flag), Handle: proto.RootHandle}, body, out)
	if comp.Result < 0 {
		t.Fatalf("open %s: %v", path, syscall.Errno(-comp.Result))
	}
	r, err := proto.DecodeOpenResp(out[:comp.Result], proto.FeatureReopen)
	if err != nil {
		t.Fatal(err)
	}
	if comp := e.do(t, c, &ring.Call{Op: proto.OpGrant, Handle: r.Handle}, nil, nil); comp.Result != 0 {
		t.Fatalf("grant %s: %d", path, comp.Result)
	}
	return r.Handle
}

// The cache opcodes from a client that bypasses the library: a region is
// passed read-only and only for a readable handle, readahead hints are
// checked and bounded, and a client that never reads its session socket
// gets EAGAIN rather than making io queue files for it without bound.
func TestHostileCacheRequests(t *testing.T) {
	e := startHostile(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rw := e.openRaw(t, e.meta, "dir/region", os.O_RDWR|os.O_CREATE)
	if comp := e.do(t, e.data, &ring.Call{Op: proto.OpWrite, Handle: rw}, []byte("some bytes"), nil); comp.Result != 10 {
		t.Fatalf("write: %+v", comp)
	}
	comp := e.do(t, e.data, &ring.Call{Op: proto.OpCacheMap, Handle: rw}, nil, nil)
	if comp.Result != 0 {
		t.Fatalf("cache map of a readable handle: %d", comp.Result)
	}
	f, err := e.data.ReceiveFile(ctx, comp.Aux)
	if err != nil {
		t.Fatalf("the region's memfd: %v", err)
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Fatalf("the region comes as flags %#x (%v), want a read-only description", fl, err)
	}
	f.Close()

	wo := e.openRaw(t, e.meta, "dir/region", os.O_WRONLY)
	for _, call := range []ring.Call{
		{Op: proto.OpCacheMap, Handle: wo},
		{Op: proto.OpReadahead, Handle: wo, Arg: 4096},
	} {
		if comp := e.do(t, e.data, &call, nil, nil); comp.Result != -int64(syscall.EBADF) {
			t.Fatalf("op %#x on a write-only handle: %d, want EBADF", call.Op, comp.Result)
		}
	}
	for _, tc := range []struct {
		call ring.Call
		want int64
	}{
		{ring.Call{Op: proto.OpReadahead, Handle: rw, Arg: 0}, -int64(syscall.EINVAL)},
		{ring.Call{Op: proto.OpReadahead, Handle: rw, Arg: 4096, Offset: 1 << 63}, -int64(syscall.EINVAL)},
		{ring.Call{Op: proto.OpReadahead, Handle: rw, Arg: ^uint32(0)}, 0},            // bounded to 8 MiB, inside the file
		{ring.Call{Op: proto.OpReadahead, Handle: rw, Arg: 4096, Offset: 1 << 40}, 0}, // past the end: nothing
	} {
		if comp := e.do(t, e.data, &tc.call, nil, nil); comp.Result != tc.want {
			t.Fatalf("readahead %+v: %d, want %d", tc.call, comp.Result, tc.want)
		}
	}

	// A second raw IO session for the same metadata session, made by hand
	// so that nothing reads its socket.
	conn, err := net.Dial("unix", e.st.Config.IO.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, err := ring.ClientHandshake(ctx, conn.(*net.UnixConn))
	if err != nil {
		t.Fatal(err)
	}
	deaf := ring.NewClient(r, ring.ClientOptions{})
	defer deaf.Close()
	e.attachAs(t, deaf)
	eagain := 0
	for i := range 1000 {
		comp := e.do(t, deaf, &ring.Call{Op: proto.OpCacheMap, Handle: rw}, nil, nil)
		if comp.Result == -int64(syscall.EAGAIN) {
			eagain++
			continue
		}
		if comp.Result != 0 {
			t.Fatalf("cache map %d: %d", i, comp.Result)
		}
	}
	t.Logf("a client that reads none of its socket: %d of 1000 maps answered EAGAIN", eagain)
	if eagain == 0 {
		t.Fatal("1000 regions queued to a client that reads none of them")
	}
	e.check(t)
}
