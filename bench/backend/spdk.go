//go:build spdk

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weir-storage/weir/internal/config"
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

// spdkPhases are the SPDK targets, in three phases on the same two bdevs
// of one SPDK environment (one per process): by default an aio bdev over a
// sparse file on the file system under test and a malloc bdev; with
// -spdk-config, the operator's device bdev and (if named) malloc bdev. The
// phases: the backend at its interface; the backend with cgo-callback
// completions (malloc only); weir on the backend. Each phase's backends
// delete their blob and unload their blobstore when the phase ends; the
// interface phases format their bdev (Format), and weir's IO service
// claims the empty blobstore the phase before left.
func spdkPhases(dir string, s settings) []func() []target {
	devName, weirDevName := devTargets(s)
	cfgPath, devBdev, mallocBdev := s.SPDKConfig, s.SPDKBdev, s.SPDKMallocBdev
	var cfg []byte
	var prep error
	if cfgPath == "" {
		disk := filepath.Join(dir, "aio.dat")
		bdevBytes := s.FileBytes + bdevSlack
		cfg = []byte(fmt.Sprintf(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_aio_create", "params": {"name": "Aio0", "filename": %q, "block_size": 4096}},
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": %d, "block_size": 4096}}
]}]}`, disk, bdevBytes/4096))
		cfgPath, devBdev, mallocBdev = filepath.Join(dir, "spdk.json"), "Aio0", "Malloc0"
		prep = errors.Join(sparseFile(disk, bdevBytes), os.WriteFile(cfgPath, cfg, 0o644))
	} else if cfg, prep = os.ReadFile(cfgPath); prep != nil {
		prep = fmt.Errorf("-spdk-config: %w", prep)
	}
	noMalloc := "n/a: -spdk-config without -spdk-malloc-bdev"
	opts := func(bdev string) spdk.Options {
		return spdk.Options{ConfigJSON: cfg, Bdev: bdev, NoHuge: !s.HugePages,
			MemMB: spdkMemMB(s.FileBytes, s.HugePages), Format: true, Workers: s.SPDKWorkers}
	}
	at := func(name string, o spdk.Options) target {
		t := target{name: name}
		if prep != nil {
			t.err = prep.Error()
			return t
		}
		if o.Bdev == "" {
			t.na = noMalloc
			return t
		}
		be, err := spdk.New(o)
		if err != nil {
			t.err = err.Error()
			return t
		}
		b, err := blobOf(be, s.FileBytes)
		if err != nil {
			be.Close()
			t.err = err.Error()
			return t
		}
		t.dev = b
		t.close = func() error { return errors.Join(b.Close(), be.Delete(1), be.Close()) }
		return t
	}
	weir := func(name, bdev string) target {
		if prep != nil {
			return target{name: name, err: prep.Error()}
		}
		if bdev == "" {
			return target{name: name, na: noMalloc}
		}
		return newWeir(dir, name, s.FileBytes, func(c *config.Config) {
			c.IO.Backend, c.IO.SPDKConfig, c.IO.SPDKBdev = "spdk", cfgPath, bdev
			c.IO.SPDKNoHuge, c.IO.SPDKMemMB = !s.HugePages, spdkMemMB(s.FileBytes, s.HugePages)
			c.IO.SPDKWorkers = s.SPDKWorkers
		})
	}
	return []func() []target{
		func() []target {
			return []target{at(devName, opts(devBdev)), at(targetSPDKMalloc, opts(mallocBdev))}
		},
		func() []target {
			o := opts(mallocBdev)
			o.CGOCallbacks = true
			return []target{at(targetSPDKMallocCGO, o)}
		},
		func() []target {
			return []target{weir(weirDevName, devBdev), weir(targetWeirSPDKMalloc, mallocBdev)}
		},
	}
}

// sparseFile creates path with size bytes (a hole), for an aio bdev.
func sparseFile(path string, size int64) error {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	return os.Truncate(path, size)
}
