package conformance

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	MainHook()
	os.Exit(m.Run())
}

// TestKernel runs the whole suite on the kernel alone, with every case's
// expectations. Comparing the kernel with itself would prove nothing.
func TestKernel(t *testing.T) {
	Run(t, map[string]func(*testing.T) FS{Reference: KernelTarget}, Cases())
}
