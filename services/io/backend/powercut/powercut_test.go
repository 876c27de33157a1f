package powercut_test

import (
	"bytes"
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/backendtest"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/services/io/backend/powercut"
)

// The wrapper is a backend like any other.
func TestConformance(t *testing.T) {
	backendtest.Run(t, backendtest.Factory{
		New: func(t *testing.T) backend.Backend { return powercut.New(mem.New()) },
	})
}

// TestModel: a cut keeps exactly what the backend contract makes durable.
func TestModel(t *testing.T) {
	pc := powercut.New(mem.New())
	write := func(id backend.BlobID, data string, sync bool) {
		t.Helper()
		h, err := pc.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if _, err := h.WriteAt([]byte(data), 0); err != nil {
			t.Fatal(err)
		}
		if sync {
			if err := h.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(what string, want map[backend.BlobID]string) {
		t.Helper()
		got := pc.Cut()
		if len(got) != len(want) {
			t.Fatalf("%s: %d blobs survive, want %d (%v)", what, len(got), len(want), got)
		}
		for id, w := range want {
			if d, ok := got[id]; !ok || !bytes.Equal(d, []byte(w)) {
				t.Fatalf("%s: blob %d = %q (%v), want %q", what, id, d, ok, w)
			}
		}
	}
	for _, id := range []backend.BlobID{1, 2} {
		if err := pc.Create(id); err != nil {
			t.Fatal(err)
		}
	}
	write(1, "one", true)
	check("blob synced, create not", nil)
	if err := pc.Sync(); err != nil {
		t.Fatal(err)
	}
	check("creates synced", map[backend.BlobID]string{1: "one", 2: ""})
	write(1, "ONE more", false)
	write(2, "two", true)
	check("unsynced overwrite", map[backend.BlobID]string{1: "one", 2: "two"})
	if err := pc.Delete(2); err != nil {
		t.Fatal(err)
	}
	check("delete not synced", map[backend.BlobID]string{1: "one", 2: "two"})
	if err := pc.Sync(); err != nil {
		t.Fatal(err)
	}
	check("delete synced", map[backend.BlobID]string{1: "one"})

	restored := mem.New()
	if err := powercut.Restore(restored, pc.Cut()); err != nil {
		t.Fatal(err)
	}
	h, err := restored.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	buf := make([]byte, 16)
	n, _ := h.ReadAt(buf, 0)
	if string(buf[:n]) != "one" {
		t.Fatalf("restored blob 1 = %q", buf[:n])
	}
}

// slowSync holds its first Sync until release is closed: two syncs of the
// backend then return out of order.
type slowSync struct {
	backend.Backend
	held    chan struct{} // closed once the first Sync waits
	release chan struct{}
	first   bool
}

func (s *slowSync) Sync() error {
	if !s.first {
		s.first = true
		close(s.held)
		<-s.release
	}
	return s.Backend.Sync()
}

// TestSyncsReturnOutOfOrder: a sync that began before a delete and
// returns after a later sync made the delete durable does not bring the
// blob back.
func TestSyncsReturnOutOfOrder(t *testing.T) {
	inner := &slowSync{Backend: mem.New(), held: make(chan struct{}), release: make(chan struct{})}
	pc := powercut.New(inner)
	if err := pc.Create(7); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- pc.Sync() }() // covers the create; returns last
	<-inner.held
	if err := pc.Delete(7); err != nil {
		t.Fatal(err)
	}
	if err := pc.Sync(); err != nil { // covers the delete; returns first
		t.Fatal(err)
	}
	close(inner.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := pc.Cut(); len(got) != 0 {
		t.Fatalf("a cut keeps %v: the delete was made durable by a sync that returned", got)
	}
}
