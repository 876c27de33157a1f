//go:build spdk

package stack

import (
	"fmt"
	"os"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/spdk"
)

// spdkBackend opens the SPDK Blobstore backend (this binary was built with
// the spdk tag) in mode m.
func spdkBackend(c *config.Config, m spdkMode) (backend.Backend, error) {
	json, err := os.ReadFile(c.IO.SPDKConfig)
	if err != nil {
		return nil, fmt.Errorf("spdk backend: read io.spdk_config: %w", err)
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("spdk backend: %w", err)
	}
	return spdk.New(spdk.Options{ConfigJSON: json, Bdev: c.IO.SPDKBdev, LockFile: spdkLockFile(c),
		NoHuge: c.IO.SPDKNoHuge, MemMB: c.IO.SPDKMemMB, Workers: c.IO.SPDKWorkers, ClusterSize: uint64(c.IO.SPDKClusterSize),
		ReadOnly: m == spdkReadOnly, Format: m == spdkFormat})
}

// spdkCheckFree says whether the blobstore of c could be loaded now: no
// other process holds its data directory's lock or the file under its
// aio bdev.
func spdkCheckFree(c *config.Config) error {
	json, err := os.ReadFile(c.IO.SPDKConfig)
	if err != nil {
		return fmt.Errorf("read io.spdk_config: %w", err)
	}
	return spdk.CheckFree(spdk.Options{ConfigJSON: json, Bdev: c.IO.SPDKBdev, LockFile: spdkLockFile(c)})
}

// spdkBuilt says this binary has the SPDK backend.
const spdkBuilt = true

// HaltBackends stops SPDK for the rest of the process (spdk.Halt): call it
// after the IO service shut down, right before the process exits.
func HaltBackends() error { return spdk.Halt() }
