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
