//go:build !spdk

package stack

import (
	"errors"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/services/io/backend"
)

// spdkBackend: this binary has no SPDK backend.
func spdkBackend(*config.Config, spdkMode) (backend.Backend, error) {
	return nil, errors.New(`io.backend = "spdk" needs a weir built with the spdk tag (make spdk)`)
}

// spdkCheckFree: this binary has no SPDK backend.
func spdkCheckFree(*config.Config) error {
	return errors.New(`io.backend = "spdk" needs a weir built with the spdk tag (make spdk)`)
}

// spdkBuilt says this binary has the SPDK backend.
const spdkBuilt = false

// HaltBackends does nothing: no backend of this binary needs stopping
// before the process exits.
func HaltBackends() error { return nil }
