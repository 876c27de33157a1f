//go:build spdk

package spdk

import (
	"strings"
	"testing"
)

// TestHaltRefusesWhileOpen: Halt must not stop SPDK under an open backend
// (its Close would then wait forever for the metadata thread). The Halt
// that succeeds is TestMain's, after every test: it fails the run if it
// finds a backend left open.
func TestHaltRefusesWhileOpen(t *testing.T) {
	be, err := New(options(true))
	if err != nil {
		t.Fatal(err)
	}
	err = Halt()
	if err == nil || !strings.Contains(err.Error(), "still run") {
		t.Errorf("Halt with a backend open = %v, want a refusal", err)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
}
