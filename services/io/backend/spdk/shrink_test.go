//go:build spdk

package spdk

import (
	"bytes"
	"testing"
)

// TestShrinkThenGrowReadsZeros: SPDK releases the clusters of a shrink only
// when the blob's metadata is persisted, and a grow before that maps the old
// clusters back. Truncate must therefore persist after a shrink, or old bytes
// reappear past the new end.
func TestShrinkThenGrowReadsZeros(t *testing.T) {
	be, err := New(options(true))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if err := be.Create(7); err != nil {
		t.Fatal(err)
	}
	h, err := be.Open(7)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.WriteAt(bytes.Repeat([]byte{0xee}, 3<<20), 0); err != nil {
		t.Fatal(err)
	}
	if err := h.Truncate(100); err != nil {
		t.Fatal(err)
	}
	if err := h.Truncate(3 << 20); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3<<20)
	if _, err := h.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(got[100:], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Fatalf("byte %d is %#x after shrink and grow, want 0", 100+i, got[100+i])
	}
	// Every payload byte went through the bounce buffer, and says so.
	if b := be.Counters()["spdk_bounce_bytes"]; b < 6<<20 {
		t.Fatalf("spdk_bounce_bytes %d after 3 MiB written and 3 MiB read", b)
	}
}
