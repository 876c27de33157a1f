package stack_test

import (
	"context"
	"encoding/binary"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// TestStatFS: io answers the store's room (OpStatFS) to an attached
// session, the file backend's as its file system's, and refuses a ring
// that has not attached and a buffer too small.
func TestStatFS(t *testing.T) {
	cfg := testConfig(t)
	startPair(t, cfg)
	s := rawDial(t, cfg)
	out := make([]byte, proto.StatFSRespSize)
	c := rawDo(t, s.data, proto.OpStatFS, 0, 0, nil, out)
	if c.Result != proto.StatFSRespSize {
		t.Fatalf("statfs: %+v", c)
	}
	total, free, avail := binary.LittleEndian.Uint64(out), binary.LittleEndian.Uint64(out[8:]), binary.LittleEndian.Uint64(out[16:])
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.DataDir, &st); err != nil {
		t.Fatal(err)
	}
	if want := st.Blocks * uint64(st.Bsize); total != want || avail > free || free > total {
		t.Errorf("statfs: total %d free %d avail %d; the data directory's file system has %d", total, free, avail, want)
	}
	if c := rawDo(t, s.data, proto.OpStatFS, 0, 0, nil, make([]byte, 8)); c.Result != -int64(syscall.ERANGE) {
		t.Errorf("statfs into 8 bytes: %+v, want ERANGE", c)
	}
	bare, err := ring.Dial(context.Background(), cfg.IO.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if c := rawDo(t, bare, proto.OpStatFS, 0, 0, nil, out); c.Result != -int64(syscall.ENOTCONN) {
		t.Errorf("statfs before attach: %+v, want ENOTCONN", c)
	}
}

// TestSyncFSRequest: io serves OpSyncFS to an attached session (what it
// makes durable is TestPowerCut's) and refuses a handle or an offset
// (EINVAL) and a ring that has not attached (ENOTCONN).
func TestSyncFSRequest(t *testing.T) {
	cfg := testConfig(t)
	startPair(t, cfg)
	s := rawDial(t, cfg)
	if c := rawDo(t, s.data, proto.OpSyncFS, 0, 0, nil, nil); c.Result != 0 {
		t.Fatalf("syncfs: %+v", c)
	}
	if c := rawDo(t, s.data, proto.OpSyncFS, 7, 0, nil, nil); c.Result != -int64(syscall.EINVAL) {
		t.Errorf("syncfs with a handle: %+v, want EINVAL", c)
	}
	if c := rawDo(t, s.data, proto.OpSyncFS, 0, 4096, nil, nil); c.Result != -int64(syscall.EINVAL) {
		t.Errorf("syncfs with an offset: %+v, want EINVAL", c)
	}
	bare, err := ring.Dial(context.Background(), cfg.IO.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if c := rawDo(t, bare, proto.OpSyncFS, 0, 0, nil, nil); c.Result != -int64(syscall.ENOTCONN) {
		t.Errorf("syncfs before attach: %+v, want ENOTCONN", c)
	}
}
