package conformance

import (
	"fmt"
	"os"
	"testing"

	"github.com/weir-storage/weir/stack"
)

func TestMain(m *testing.M) {
	MainHook()
	code := m.Run()
	if err := stack.HaltBackends(); err != nil { // SPDK, before C exit handlers run
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// TestKernel runs the whole suite on the kernel alone, with every case's
// expectations. Comparing the kernel with itself would prove nothing.
func TestKernel(t *testing.T) {
	Run(t, map[string]func(*testing.T) FS{Reference: KernelTarget}, Cases())
}
