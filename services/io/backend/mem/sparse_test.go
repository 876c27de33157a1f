package mem

import "testing"

// TestSparse checks that data far out costs only the pages it touches.
func TestSparse(t *testing.T) {
	be := New().(*Backend)
	defer be.Close()
	if err := be.Create(1); err != nil {
		t.Fatal(err)
	}
	h, err := be.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	b := h.(*handle).b
	pages := func() int {
		b.mu.RLock()
		defer b.mu.RUnlock()
		return len(b.pages)
	}
	if _, err := h.WriteAt(make([]byte, 10), 6<<30); err != nil {
		t.Fatal(err)
	}
	if n := pages(); n != 1 {
		t.Fatalf("10 bytes at 6 GiB use %d pages, want 1", n)
	}
	if _, err := h.WriteAt(make([]byte, 10), 4090); err != nil { // crosses a page line
		t.Fatal(err)
	}
	if n := pages(); n != 3 {
		t.Fatalf("after 10 bytes at 4090: %d pages, want 3", n)
	}
	if err := h.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	if n := pages(); n != 1 {
		t.Fatalf("after Truncate(4096): %d pages, want 1", n)
	}
}
