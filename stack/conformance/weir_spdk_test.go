//go:build spdk

package conformance_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// TestConformanceWeirSPDK runs the suite against weir on the SPDK backend:
// a malloc bdev, SPDK on ordinary memory (no huge pages needed). Restart
// cases unload and load the blobstore on the same bdev. The bdev lives as
// long as the process: a second run (-count=3) is a new namespace over the
// previous run's store, which the IO service refuses (wrong_store) unless
// the operator erases it, so each run starts with weir format.
func TestConformanceWeirSPDK(t *testing.T) {
	dir := t.TempDir()
	spdkConfig := filepath.Join(dir, "spdk.json")
	err := os.WriteFile(spdkConfig, []byte(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 131072, "block_size": 4096}}
]}]}`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	runWeirConformance(t, func(c *config.Config) {
		c.IO.Backend = "spdk"
		c.IO.SPDKConfig = spdkConfig
		c.IO.SPDKBdev = "Malloc0"
		c.IO.SPDKNoHuge = true
		c.IO.SPDKMemMB = 1024
		if err := stack.Format(c, hclog.NewNullLogger()); err != nil {
			t.Fatal(err)
		}
	})
}
