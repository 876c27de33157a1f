//go:build spdk

package spdk

import (
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/backendtest"
)

// A malloc bdev: memory only, so it lasts as long as this test process,
// which is enough for Reopen (unload, load) within the process.
const mallocConfig = `{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 65536, "block_size": 4096}}
]}]}`

// hugeNeed is the huge-page memory the tests run SPDK in: the 256 MiB
// malloc bdev and SPDK's pools.
const hugeNeed = 768 << 20

// onHugePages: SPDK runs on huge pages where the host has them free (as in
// production: DMA-able memory), otherwise with DPDK's --no-huge.
var onHugePages = HugePagesFree() >= hugeNeed

func options(format bool) Options {
	if onHugePages {
		return Options{ConfigJSON: []byte(mallocConfig), Bdev: "Malloc0", Format: format}
	}
	return Options{ConfigJSON: []byte(mallocConfig), Bdev: "Malloc0", NoHuge: true, MemMB: 1024, Format: format}
}

func TestBackendSuite(t *testing.T) {
	if onHugePages {
		t.Logf("SPDK runs on huge pages (%d MiB free)", HugePagesFree()>>20)
	} else {
		t.Logf("SPDK runs with --no-huge: fewer than %d MiB of free huge pages (reserve them: sysctl -w vm.nr_hugepages=512)", hugeNeed>>20)
	}
	backendtest.Run(t, backendtest.Factory{
		New: func(t *testing.T) backend.Backend {
			be, err := New(options(true))
			if err != nil {
				t.Fatal(err)
			}
			return be
		},
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
			be, err := New(options(false))
			if err != nil {
				t.Fatal(err)
			}
			return be
		},
	})
}
