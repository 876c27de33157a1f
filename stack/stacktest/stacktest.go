// Package stacktest holds what tests that run weir's services share.
package stacktest

import (
	"os"
	"testing"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// Config is the local configuration (stack.LocalConfig) of a stack whose
// data lives in dataDir, or in a fresh temporary directory when dataDir is
// empty. The sockets go to a short directory of their own under the system
// temporary directory: a Unix socket path has at most 108 bytes, and
// t.TempDir can be longer. Both are removed when the test ends.
func Config(t testing.TB, dataDir string) *config.Config {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	run, err := os.MkdirTemp("", "weir-run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	c, err := stack.LocalConfig(dataDir, run)
	if err != nil {
		t.Fatal(err)
	}
	c.IO.StagingSize = 4 * config.MiB // made at every test stack's start: small
	return c
}
