//go:build spdk

package main

import (
	"os"

	"fmt"
	"path/filepath"

	"github.com/weir-storage/weir/services/io/backend/spdk"
)

// spdkBuilt says the spdk rows can run.
const spdkBuilt = true

// bdevSlack is the room, beyond the blob's data, that each bdev gets for
// the blobstore's metadata.
const bdevSlack = 64 * mib

// spdkMemMB is DPDK's memory under --no-huge: the malloc bdev lives in
// it, plus room for DPDK, the bdev layer and the bounce buffers. A malloc
// bdev of half the memory fails (ENOMEM) on SPDK v26.05, so twice the bdev
// plus 512 MiB. With huge pages, 0: DPDK takes pages as it needs them.
func spdkMemMB(size int64, huge bool) int {
	if huge {
		return 0
	}
	return int(2*(size+bdevSlack)/mib) + 512
}

// newSPDK starts SPDK once, with both bdevs in its JSON configuration (one
// SPDK environment per process), and makes one backend per bdev, each with
// one filled blob.
func newSPDK(dir string, s settings) []target {
	aio := target{name: targetSPDKAio}
	mal := target{name: targetSPDKMalloc}
	disk := filepath.Join(dir, "aio.dat")
	bdevBytes := s.FileBytes + bdevSlack
	if err := sparseFile(disk, bdevBytes); err != nil {
		aio.err, mal.err = err.Error(), err.Error()
		return []target{aio, mal}
	}
	cfg := fmt.Sprintf(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_aio_create", "params": {"name": "Aio0", "filename": %q, "block_size": 4096}},
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": %d, "block_size": 4096}}
]}]}`, disk, bdevBytes/4096)
	start := func(t *target, bdev string) {
		be, err := spdk.New(spdk.Options{ConfigJSON: []byte(cfg), Bdev: bdev, NoHuge: !s.HugePages,
			MemMB: spdkMemMB(s.FileBytes, s.HugePages), Format: true})
		if err != nil {
			t.err = err.Error()
			return
		}
		b, err := blobOf(be, s.FileBytes)
		if err != nil {
			be.Close()
			t.err = err.Error()
			return
		}
		t.dev = b
		t.close = func() error { b.Close(); return be.Close() }
	}
	start(&aio, "Aio0")
	start(&mal, "Malloc0")
	return []target{aio, mal}
}

// sparseFile creates path with size bytes (a hole), for an aio bdev.
func sparseFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
