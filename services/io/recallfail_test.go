package iosvc_test

import (
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/services/io/backend/faulty"
	"github.com/weir-storage/weir/services/io/backend/mem"
)

// TestRecallThatTimesOut: a recall whose revoke io answers only after
// metadata's request timeout (the holder's write is stuck in the device,
// and io's revoke waits for it) fails the recaller's grant, and io then
// revokes the grant all the same. The holder must not be stranded: its
// next write meets io's EBADF, and its OpGrant must grant it anew, not
// say it is still granted (review finding: the record was unmarked, so
// every OpGrant answered "granted" and the write ended in EIO after
// maxRegrants). The recaller's next try then takes the file.
func TestRecallThatTimesOut(t *testing.T) {
	be := faulty.New(mem.New())
	e := startIOWith(t, be, nil, func(c *config.Config) {
		c.IO.CacheSize = 0 // writes reach the backend, where one can stall
		c.Metadata.TrustGroups = "session"
		c.NATS.RequestTimeout = 300 * time.Millisecond
	})
	a, b := e.dial(t), e.dial(t)
	defer a.Close()
	defer b.Close()
	fa, err := a.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	if _, err := fa.WriteAt([]byte("a"), 0); err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	var stalled atomic.Bool
	hit := make(chan struct{})
	be.Inject(func(op faulty.Op) error {
		if op.Kind == faulty.Write && op.Off == 0 && op.Len == 1 && stalled.CompareAndSwap(false, true) {
			close(hit)
			<-release
		}
		return nil
	})
	stuck := make(chan error, 1)
	go func() {
		_, err := fa.WriteAt([]byte("A"), 0)
		stuck <- err
	}()
	<-hit

	fb, err := b.OpenFile("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if _, err := fb.WriteAt([]byte("b"), 1); err == nil {
		t.Fatal("the recaller's write succeeded while io could not revoke the holder's grant")
	}
	close(release) // io finishes the write, then revokes the grant late
	if err := <-stuck; err != nil {
		t.Fatalf("the stalled write: %v", err)
	}
	be.Inject(nil)

	if _, err := fa.WriteAt([]byte("x"), 2); err != nil {
		t.Fatalf("the holder's write after the late revoke: %v", err)
	}
	if _, err := fb.WriteAt([]byte("b"), 1); err != nil {
		t.Fatalf("the recaller's second try: %v", err)
	}
	got := make([]byte, 3)
	if _, err := fa.ReadAt(got, 0); err != nil || string(got) != "Abx" {
		t.Fatalf("the holder reads %q, %v; want \"Abx\"", got, err)
	}
}
