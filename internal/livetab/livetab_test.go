package livetab

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

func TestTakePublishRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "io.live")
	w, err := Create(path, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := Open(path, w.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, _, _, ok := r.Read(3); ok {
		t.Fatal("a blob with no slot was read")
	}
	slot, ok := w.Take(3, 10, 100, false)
	if !ok {
		t.Fatal("slot of blob 3 not taken")
	}
	if size, mtime, wrote, ok := r.Read(3); !ok || size != 10 || mtime != 100 || wrote {
		t.Fatalf("read %d %d %v %v; want 10 100 false true", size, mtime, wrote, ok)
	}
	w.Publish(slot, 3, 4096, 200, true)
	if size, mtime, wrote, ok := r.Read(3); !ok || size != 4096 || mtime != 200 || !wrote {
		t.Fatalf("read %d %d %v %v after a publish", size, mtime, wrote, ok)
	}
	// Blob 11 maps to blob 3's slot: it gets none, and a read of it is
	// not answered with blob 3's values.
	if _, ok := w.Take(11, 1, 1, false); ok {
		t.Fatal("blob 11 took blob 3's slot")
	}
	if _, _, _, ok := r.Read(11); ok {
		t.Fatal("blob 11 read from blob 3's slot")
	}
	w.Release(slot, 11) // not its holder: nothing
	if _, _, _, ok := r.Read(3); !ok {
		t.Fatal("a release by another blob freed blob 3's slot")
	}
	w.Release(slot, 3)
	if _, _, _, ok := r.Read(3); ok {
		t.Fatal("a released slot still answers")
	}
	if _, ok := w.Take(11, 1, 1, false); !ok {
		t.Fatal("blob 11 could not take the freed slot")
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "io.live")
	w, err := Create(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := Open(path, w.ID()+2); !errors.Is(err, ErrOtherTable) {
		t.Fatalf("open with another id: %v, want ErrOtherTable", err)
	}
	// A new io replaces the file; the old mapping stays valid.
	w2, err := Create(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if _, err := Open(path, w.ID()); !errors.Is(err, ErrOtherTable) {
		t.Fatalf("open of a replaced table: %v, want ErrOtherTable", err)
	}
	for name, b := range map[string][]byte{
		"short":      make([]byte, 10),
		"zeros":      make([]byte, HeaderSize+SlotSize),
		"many slots": func() []byte { b, _ := os.ReadFile(path); b[12] = 0xff; return b }(),
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(p, w2.ID()); err == nil {
			t.Errorf("opened a %s file", name)
		}
	}
}

// TestNoTornReads: a reader racing writers of one slot sees only values
// one writer published whole (size and mtime equal, as written here).
func TestNoTornReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "io.live")
	w, err := Create(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := Open(path, w.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	slot, _ := w.Take(5, 0, 0, false)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(g); ; i += 2 {
				select {
				case <-stop:
					return
				default:
				}
				w.Publish(slot, 5, i<<20|i, i<<20|i, true)
			}
		}()
	}
	reads := 0
	for range 200000 {
		size, mtime, _, ok := r.Read(5)
		if ok {
			reads++
			if size != mtime {
				close(stop)
				wg.Wait()
				t.Fatalf("torn read: size %#x, mtime %#x", size, mtime)
			}
		}
	}
	close(stop)
	wg.Wait()
	if reads == 0 {
		t.Fatal("no read succeeded")
	}
}

// TestPublishFromKeepsTheNewest: writers that each grow a size and then
// publish it leave the largest in the slot, whatever order they take the
// slot's lock in (PublishFrom reads the size under it).
func TestPublishFromKeepsTheNewest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "io.live")
	w, err := Create(path, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	slot, ok := w.Take(5, 0, 0, false)
	if !ok {
		t.Fatal("slot not taken")
	}
	var size atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20000 {
				size.Add(1)
				w.PublishFrom(slot, 5, func() (int64, int64, bool) { return size.Load(), 1, true })
			}
		}()
	}
	wg.Wait()
	if got, _, _, ok := w.Read(5); !ok || got != size.Load() {
		t.Fatalf("slot holds size %d (%v), want the last one, %d", got, ok, size.Load())
	}
}
