//go:build spdk

package spdk

import (
	"errors"
	"strings"
	"testing"

	"github.com/weir-storage/weir/internal/spdkconf"
)

// A config that attaches an NVMe controller and turns its flushes off is
// refused before SPDK sees it: fsync would not reach the drive.
func TestNVMeFlushOffRefused(t *testing.T) {
	o := options(true)
	o.ConfigJSON = []byte(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_nvme_set_options", "params": {"enable_flush": false}},
  {"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:99:00.0"}}]}]}`)
	o.Bdev = "Nvme0n1"
	be, err := New(o)
	if err == nil {
		be.Close()
		t.Fatal("a config with enable_flush false was loaded")
	}
	if !errors.Is(err, spdkconf.ErrFlushOff) || !strings.Contains(err.Error(), "enable_flush") {
		t.Fatalf("refusal %v does not say why", err)
	}
}

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
