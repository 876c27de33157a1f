package client_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// TestRecallWaitRaw drives OpRecallWait as a hostile client would, on a
// raw metadata ring: before OpHello it is ENOTCONN, without
// FeatureRecalls EOPNOTSUPP, with no room for a handle EINVAL, a second
// one while one is outstanding EBUSY; and the outstanding one (a lazy
// call, as the client makes it) does not hold the service's end of the
// session when the client closes.
func TestRecallWaitRaw(t *testing.T) {
	st := groupStack(t, "session")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func(features uint64) *ring.Client {
		t.Helper()
		m, err := ring.Dial(ctx, st.Config.Metadata.Socket, ring.ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if features != ^uint64(0) {
			hello := make([]byte, proto.HelloRespSize)
			copy(hello, (&proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: features}).Append(nil))
			if comp, err := rawDo(ctx, m, proto.OpHello, 0, hello, false); err != nil || comp.Result != proto.HelloRespSize {
				t.Fatalf("hello: %v %v", err, comp.Err())
			}
		}
		return m
	}
	errno := func(comp ring.Completion, err error) error {
		if err != nil {
			return err
		}
		return comp.Err()
	}
	m := dial(^uint64(0)) // no hello
	if err := errno(rawDo(ctx, m, proto.OpRecallWait, 0, make([]byte, 8), false)); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("before hello: %v, want ENOTCONN", err)
	}
	m.Close()
	m = dial(proto.FeatureLeases)
	if err := errno(rawDo(ctx, m, proto.OpRecallWait, 0, make([]byte, 8), false)); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("without FeatureRecalls: %v, want EOPNOTSUPP", err)
	}
	m.Close()
	m = dial(proto.FeatureLeases | proto.FeatureRecalls)
	if err := errno(rawDo(ctx, m, proto.OpRecallWait, 0, make([]byte, 4), false)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a 4-byte buffer: %v, want EINVAL", err)
	}
	// Two waits at once: one stays outstanding, the other is EBUSY. They
	// are lazy calls: a call that is not (a no-op of the ring) reaps the
	// completion queue for them.
	res := make(chan error, 2)
	for range 2 {
		go func() { res <- errno(rawDo(ctx, m, proto.OpRecallWait, 0, make([]byte, 64), true)) }()
	}
	var got error
	for got == nil {
		if _, err := m.Do(ctx, &ring.Call{Op: ring.OpNop}); err != nil {
			t.Fatal(err)
		}
		select {
		case got = <-res:
		case <-time.After(time.Millisecond):
		}
	}
	if !errors.Is(got, syscall.EBUSY) {
		t.Fatalf("two waits at once: %v, want EBUSY for one", got)
	}
	m.Close() // the session ends: the outstanding wait must not hold it
	if err := <-res; err == nil {
		t.Error("the outstanding wait completed without an error at the session's end")
	}
	for st.Metadata.Snapshot()["sessions"].(int64) > 0 {
		if ctx.Err() != nil {
			t.Fatal("the metadata session with a wait outstanding did not end")
		}
		time.Sleep(time.Millisecond)
	}
}

// rawDo sends one request naming handle h with buf as its payload and
// reply buffer (a lazy call if lazy), and copies the reply into buf.
func rawDo(ctx context.Context, c *ring.Client, op uint8, h uint64, buf []byte, lazy bool) (ring.Completion, error) {
	b, err := c.Alloc(ctx, max(len(buf), 1))
	if err != nil {
		return ring.Completion{}, err
	}
	defer b.Release()
	b.CopyFrom(buf)
	comp, err := c.Do(ctx, &ring.Call{Op: op, Handle: h, Buf: b, Lazy: lazy})
	if err == nil && comp.Result > 0 {
		b.CopyTo(buf[:min(int(comp.Result), len(buf))])
	}
	return comp, err
}

// TestUseAfterFSClose: a file still open when its FS closes fails its
// reads and writes with an error (the data path's look at the metadata
// ring for recall notices must not touch the unmapped ring).
func TestUseAfterFSClose(t *testing.T) {
	st := groupStack(t, "uid")
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile("f", []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := c.OpenFile("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	for range 4 { // mapped
		if _, err := f.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	time.Sleep(10 * time.Millisecond) // the notice goroutine's release of the ring
	if _, err := f.ReadAt(buf, 0); err == nil {
		t.Error("read after the FS closed: no error")
	}
	if _, err := f.WriteAt(buf, 0); err == nil {
		t.Error("write after the FS closed: no error")
	}
}
