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
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 131072, "block_size": 4096}}
]}]}`

func options(format bool) Options {
	return Options{ConfigJSON: []byte(mallocConfig), Bdev: "Malloc0", NoHuge: true, MemMB: 1024, Format: format}
}

func TestBackendSuite(t *testing.T) {
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
