//go:build spdk

package spdk

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
)

// TestBarriersUnderLoad keeps I/O in flight on three workers while another
// goroutine creates, grows, shrinks and deletes other blobs: every resize
// and delete is an spdk_for_each_channel barrier that needs all four SPDK
// threads polled. The test must finish (no barrier waits on a sleeping or
// blocked worker), and every 4 KiB unit must hold the last value written.
func TestBarriersUnderLoad(t *testing.T) {
	o := options(true)
	o.Workers = 3
	be, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	const (
		callers = 48 // beyond two workers' fill depth: all three work
		units   = 512
		rounds  = 40
	)
	if err := be.Create(1); err != nil {
		t.Fatal(err)
	}
	h, err := be.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Truncate(units * 4096); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	churn := make(chan error, 1)
	go func() { churn <- churnBlobs(be, stop) }()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Go(func() {
			buf := make([]byte, 4096)
			got := make([]byte, 4096)
			for r := range rounds {
				u := (c + r*callers) % units
				if u%callers != c { // each unit has one writer
					continue
				}
				binary.LittleEndian.PutUint64(buf, uint64(u<<16|r))
				if _, err := h.WriteAt(buf, int64(u)*4096); err != nil {
					errs <- err
					return
				}
				if _, err := h.ReadAt(got, int64(u)*4096); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, buf) {
					errs <- fmt.Errorf("unit %d round %d: read back %x, want %x", u, r, got[:8], buf[:8])
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	if err := <-churn; err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	used := 0
	for _, w := range be.workers {
		if w.load.Load() != 0 {
			t.Errorf("worker %d: %d requests still counted", w.idx, w.load.Load())
		}
		used++
	}
	t.Logf("%d workers, %d callers", used, callers)
}

// churnBlobs creates, grows, shrinks and deletes blobs until stop.
func churnBlobs(be *Backend, stop <-chan struct{}) error {
	for id := backend.BlobID(100); ; id++ {
		select {
		case <-stop:
			return nil
		default:
		}
		if err := be.Create(id); err != nil {
			return err
		}
		b, err := be.Open(id)
		if err != nil {
			return err
		}
		if _, err := b.WriteAt([]byte("x"), 3<<20); err != nil {
			return err
		}
		if err := b.Truncate(1 << 20); err != nil {
			return err
		}
		if err := b.Close(); err != nil {
			return err
		}
		if err := be.Delete(id); err != nil {
			return err
		}
	}
}
