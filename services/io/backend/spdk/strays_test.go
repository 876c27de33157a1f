//go:build spdk

package spdk

import (
	"slices"
	"strings"
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
)

// TestStrays: blobs that are not weir blobs (no weir.id) or that claim a
// blob id another blob claims are not served, and Strays names them for
// weir check.
func TestStrays(t *testing.T) {
	be, err := New(options(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := be.Create(5); err != nil {
		t.Fatal(err)
	}
	if err := be.createRaw(0); err != nil {
		t.Fatal(err)
	}
	if err := be.createRaw(5); err != nil {
		t.Fatal(err)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	be, err = New(options(false))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	ids, err := be.List()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []backend.BlobID{5}) {
		t.Fatalf("List = %v, want [5]", ids)
	}
	strays := be.Strays()
	if len(strays) != 2 {
		t.Fatalf("Strays = %q, want two", strays)
	}
	all := strings.Join(strays, "\n")
	for _, want := range []string{"no valid weir.id", "both claim weir blob 5"} {
		if !strings.Contains(all, want) {
			t.Errorf("Strays = %q, want one saying %q", strays, want)
		}
	}
}
