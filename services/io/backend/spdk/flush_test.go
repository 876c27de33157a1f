//go:build spdk

package spdk

import "testing"

// TestSyncFlushesDevice: a blob's Sync and the backend's Sync each flush
// the bdev when it supports flushes (malloc does, as a no-op; aio does, as
// an fsync of its file), so a write acknowledged by fsync is on stable
// storage, not in a device cache.
func TestSyncFlushesDevice(t *testing.T) {
	for _, bdev := range []string{"Malloc0", "Aio0"} {
		t.Run(bdev, func(t *testing.T) {
			o := options(true)
			o.Bdev = bdev
			be, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			if err := be.Create(1); err != nil {
				t.Fatal(err)
			}
			h, err := be.Open(1)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if _, err := h.WriteAt([]byte("durable"), 0); err != nil {
				t.Fatal(err)
			}
			before := be.Counters()["spdk_flushes"]
			if err := h.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := be.Sync(); err != nil {
				t.Fatal(err)
			}
			if got := be.Counters()["spdk_flushes"] - before; got != 2 {
				t.Fatalf("%d flushes for a blob Sync and a backend Sync, want 2", got)
			}
		})
	}
}
