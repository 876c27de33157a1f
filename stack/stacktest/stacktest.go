// Package stacktest holds what tests that run weir's services share.
package stacktest

import (
	"fmt"
	"os"
	"strings"
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

// PageRuns describes b[off:end] (zero-extended) as runs of equal bytes,
// "n×v,...": how the crash models report a page that fits no state.
func PageRuns(b []byte, off, end int) string {
	var out []string
	for i := off; i < end; {
		v := byte(0)
		if i < len(b) {
			v = b[i]
		}
		j := i
		for j < end && (j < len(b) && b[j] == v || j >= len(b) && v == 0) {
			j++
		}
		out = append(out, fmt.Sprintf("%d×%d", j-i, v))
		i = j
	}
	return strings.Join(out, ",")
}

// Padded says whether page bytes up to end may be states[i]'s with zeros
// past its end: only when a later state is longer (the file grew again
// after it: a hole, or a truncate up). A state cut short and then grown
// back by recovery to an older size is not one the file had.
func Padded(states [][]byte, i, end int) bool {
	if end <= len(states[i]) {
		return true
	}
	for _, s := range states[i+1:] {
		if len(s) > len(states[i]) {
			return true
		}
	}
	return false
}
