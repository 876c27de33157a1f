package faulty_test

import (
	"bytes"
	"errors"
	"sync"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/backendtest"
	"github.com/weir-storage/weir/services/io/backend/faulty"
	"github.com/weir-storage/weir/services/io/backend/file"
	"github.com/weir-storage/weir/services/io/backend/mem"
)

// TestConformance checks that the wrapper, with no faults injected, is a
// conforming backend itself.
func TestConformance(t *testing.T) {
	backendtest.Run(t, backendtest.Factory{
		New: func(t *testing.T) backend.Backend { return faulty.New(mem.New()) },
	})
}

// inners are the backends the fault tests wrap.
func inners(t *testing.T) map[string]func(t *testing.T) backend.Backend {
	return map[string]func(t *testing.T) backend.Backend{
		"mem": func(t *testing.T) backend.Backend { return mem.New() },
		"file": func(t *testing.T) backend.Backend {
			be, err := file.New(file.Options{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			return be
		},
	}
}

func setup(t *testing.T, newInner func(t *testing.T) backend.Backend, ids ...backend.BlobID) (*faulty.Faulty, []backend.Blob) {
	t.Helper()
	f := faulty.New(newInner(t))
	t.Cleanup(func() { f.Close() })
	var hs []backend.Blob
	for _, id := range ids {
		if err := f.Create(id); err != nil {
			t.Fatal(err)
		}
		h, err := f.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		hs = append(hs, h)
	}
	return f, hs
}

func read(t *testing.T, h backend.Blob) []byte {
	t.Helper()
	p := make([]byte, h.Size())
	if _, err := h.ReadAt(p, 0); err != nil {
		t.Fatalf("read back: %v", err)
	}
	return p
}

// TestWriteEIO fails the second write with EIO: the caller sees EIO and the
// wrapped backend never sees the write.
func TestWriteEIO(t *testing.T) {
	for name, newInner := range inners(t) {
		t.Run(name, func(t *testing.T) {
			f, hs := setup(t, newInner, 3)
			h := hs[0]
			f.Inject(faulty.FailNth(faulty.Write, 2, syscall.EIO))
			if _, err := h.WriteAt([]byte("one"), 0); err != nil {
				t.Fatalf("first write: %v", err)
			}
			n, err := h.WriteAt([]byte("two"), 3)
			if !errors.Is(err, syscall.EIO) || n != 0 {
				t.Fatalf("second write = %d, %v; want 0, EIO", n, err)
			}
			if _, err := h.WriteAt([]byte("three"), 3); err != nil {
				t.Fatalf("third write: %v", err)
			}
			if got := read(t, h); string(got) != "onethree" {
				t.Fatalf("blob holds %q, want %q", got, "onethree")
			}
		})
	}
}

// TestOnBlob fails reads of one blob and leaves the other alone, and shows
// the Op an injector sees.
func TestOnBlob(t *testing.T) {
	f, hs := setup(t, inners(t)["mem"], 7, 8)
	for _, h := range hs {
		if _, err := h.WriteAt([]byte("abc"), 0); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu  sync.Mutex
		ops []faulty.Op
	)
	record := func(op faulty.Op) error {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
		return nil
	}
	f.Inject(faulty.Any(record, faulty.OnBlob(7, faulty.Read, syscall.EIO)))
	p := make([]byte, 2)
	if _, err := hs[0].ReadAt(p, 1); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of blob 7: %v, want EIO", err)
	}
	if _, err := hs[1].ReadAt(p, 1); err != nil || string(p) != "bc" {
		t.Fatalf("read of blob 8: %q, %v", p, err)
	}
	want := []faulty.Op{{Kind: faulty.Read, Blob: 7, Off: 1, Len: 2}, {Kind: faulty.Read, Blob: 8, Off: 1, Len: 2}}
	if len(ops) != 2 || ops[0] != want[0] || ops[1] != want[1] {
		t.Fatalf("ops seen %v, want %v", ops, want)
	}

	f.Inject(faulty.OnBlob(9, faulty.Create, syscall.ENOSPC))
	if err := f.Create(9); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Create(9): %v, want ENOSPC", err)
	}
	f.Inject(nil)
	if _, err := f.Open(9); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("Open(9) after the failed create: %v, want ENOENT (the create never reached the backend)", err)
	}
	if err := f.Create(9); err != nil {
		t.Fatalf("Create(9) with no faults: %v", err)
	}
}

// TestDrop shows a lost write: reported done, never stored.
func TestDrop(t *testing.T) {
	f, hs := setup(t, inners(t)["mem"], 1)
	h := hs[0]
	if _, err := h.WriteAt([]byte("keep"), 0); err != nil {
		t.Fatal(err)
	}
	f.Inject(faulty.OnBlob(1, faulty.Write, faulty.Drop))
	if n, err := h.WriteAt([]byte("lost"), 0); n != 4 || err != nil {
		t.Fatalf("dropped write = %d, %v; want 4, nil", n, err)
	}
	f.Inject(faulty.OnBlob(1, faulty.Sync, faulty.Drop))
	if err := h.Sync(); err != nil {
		t.Fatalf("dropped sync: %v", err)
	}
	f.Inject(faulty.OnBlob(1, faulty.Read, faulty.Drop))
	if _, err := h.ReadAt(make([]byte, 1), 0); !errors.Is(err, faulty.Drop) {
		t.Fatalf("Drop on a read: %v, want it as an error", err)
	}
	f.Inject(nil)
	if got := read(t, h); !bytes.Equal(got, []byte("keep")) {
		t.Fatalf("blob holds %q after a dropped write, want %q", got, "keep")
	}
}

// TestFailNthSync fails the first blob sync and the first backend sync.
func TestFailNthSync(t *testing.T) {
	f, hs := setup(t, inners(t)["file"], 1)
	f.Inject(faulty.Any(
		faulty.FailNth(faulty.Sync, 1, syscall.EIO),
		faulty.FailNth(faulty.SyncMeta, 1, syscall.EIO),
	))
	if err := hs[0].Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("first blob Sync: %v, want EIO", err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("first backend Sync: %v, want EIO", err)
	}
	if err := hs[0].Sync(); err != nil {
		t.Fatalf("second blob Sync: %v (the injected failure never reached the file backend)", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("second backend Sync: %v", err)
	}
	if f.Name() != "faulty/file" || f.Inner().Name() != "file" {
		t.Fatalf("names %q, %q", f.Name(), f.Inner().Name())
	}
}
