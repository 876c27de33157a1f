package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/client"
)

// directStack starts a stack on the file backend with the page cache on
// (write-back: buffered writes stay dirty in it) and dials two sessions,
// as two processes would.
func directStack(t *testing.T) (*client.FS, *client.FS, func(string) any) {
	t.Helper()
	c := testConfig(t, t.TempDir(), "file")
	c.IO.CacheSize = 64 << 20
	st := startStack(t, c)
	t.Cleanup(func() { stopStack(t, st) })
	dial := func() *client.FS {
		fsys, err := st.Dial(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fsys.Close() })
		return fsys
	}
	return dial(), dial(), func(k string) any { return st.IO.Snapshot()[k] }
}

func mustOpen(t *testing.T, fsys *client.FS, name string, flag int) *client.File {
	t.Helper()
	f, err := fsys.OpenFile(name, flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readAll(t *testing.T, f *client.File, n int, off int64) []byte {
	t.Helper()
	b := make([]byte, n)
	got, err := f.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt %d@%d: %v", n, off, err)
	}
	return b[:got]
}

// An O_DIRECT handle bypasses the page cache coherently: its reads see
// buffered writes still dirty in the cache (another session's), and its
// writes are what buffered readers read next, from their mapping too.
func TestDirectIOIsCoherentWithTheCache(t *testing.T) {
	a, b, stat := directStack(t)
	buf := mustOpen(t, a, "f", os.O_RDWR|os.O_CREATE)
	model := bytes.Repeat([]byte("buffered"), 64<<10/8)
	if _, err := buf.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if d := stat("cache_dirty_pages").(int64); d == 0 {
		t.Fatal("the buffered write left no dirty page: the test would prove nothing")
	}
	dir := mustOpen(t, b, "f", os.O_RDWR|syscall.O_DIRECT)

	// A direct read sees the dirty pages.
	if got := readAll(t, dir, len(model), 0); !bytes.Equal(got, model) {
		t.Fatalf("direct read of dirty cached data: got %q..., want %q...", got[:16], model[:16])
	}
	if n := stat("cache_direct_flushes").(uint64); n == 0 {
		t.Error("the direct read wrote no dirty page home first (cache_direct_flushes 0)")
	}
	// The buffered handle reads from its mapping now (third read on).
	for range 3 {
		if got := readAll(t, buf, len(model), 0); !bytes.Equal(got, model) {
			t.Fatal("buffered read back")
		}
	}

	// A direct write: the cached copies take its bytes.
	blk := bytes.Repeat([]byte{'D'}, 4096)
	if _, err := dir.WriteAt(blk, 8192); err != nil {
		t.Fatal(err)
	}
	copy(model[8192:], blk)
	// A direct write of part of a cached page (512-aligned), dirty again
	// from a buffered write first: both survive.
	if _, err := buf.WriteAt([]byte("dirty again"), 4*4096+1000); err != nil {
		t.Fatal(err)
	}
	copy(model[4*4096+1000:], "dirty again")
	half := bytes.Repeat([]byte{'h'}, 512)
	if _, err := dir.WriteAt(half, 4*4096+2048); err != nil {
		t.Fatal(err)
	}
	copy(model[4*4096+2048:], half)
	// Past the end: the file grows, for buffered readers too.
	tail := bytes.Repeat([]byte{'T'}, 1024)
	if _, err := dir.WriteAt(tail, int64(len(model))); err != nil {
		t.Fatal(err)
	}
	model = append(model, tail...)
	for i := range 3 {
		if got := readAll(t, buf, len(model)+100, 0); !bytes.Equal(got, model) {
			t.Fatalf("buffered read %d after direct writes differs at %d", i, firstDiff(got, model))
		}
	}
	if st, err := buf.Stat(); err != nil || st.Size() != int64(len(model)) {
		t.Fatalf("stat after a direct write past the end: %v, %v; want size %d", st, err, len(model))
	}
	if got := readAll(t, dir, len(model)+512, 0); !bytes.Equal(got, model) {
		t.Fatalf("direct read back differs at %d", firstDiff(got, model))
	}
	// Through the device, after the cache is gone: the same bytes.
	if err := buf.Sync(); err != nil {
		t.Fatal(err)
	}
	fresh := mustOpen(t, b, "f", os.O_RDONLY)
	if got := readAll(t, fresh, len(model)+100, 0); !bytes.Equal(got, model) {
		t.Fatalf("fresh read differs at %d", firstDiff(got, model))
	}
}

// O_DIRECT transfers need a 512-byte aligned offset and length, as on
// Linux (the buffer need not be: the client copies it); a read that
// reaches the end of the file is short, whatever the alignment of the
// size.
func TestDirectIOAlignment(t *testing.T) {
	a, _, _ := directStack(t)
	dir := mustOpen(t, a, "f", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT)
	for _, c := range []struct {
		n   int
		off int64
	}{{100, 0}, {512, 100}, {4096, 4095}, {513, 512}} {
		if _, err := dir.WriteAt(make([]byte, c.n), c.off); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("direct WriteAt %d@%d: %v, want EINVAL", c.n, c.off, err)
		}
		if _, err := dir.ReadAt(make([]byte, c.n), c.off); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("direct ReadAt %d@%d: %v, want EINVAL", c.n, c.off, err)
		}
	}
	// An unaligned size, from a buffered handle.
	buf := mustOpen(t, a, "f", os.O_RDWR)
	want := bytes.Repeat([]byte("0123456789"), 1000) // 10000 bytes
	if _, err := buf.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4096)
	n, err := dir.ReadAt(b, 8192)
	if n != 10000-8192 || !errors.Is(err, io.EOF) || !bytes.Equal(b[:n], want[8192:]) {
		t.Fatalf("direct read of the last block: %d, %v; want %d bytes and EOF", n, err, 10000-8192)
	}
	if n, err := dir.ReadAt(b, 12288); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("direct read past the end: %d, %v", n, err)
	}
	// O_APPEND with O_DIRECT appends at the end, which must be aligned.
	app := mustOpen(t, a, "f", os.O_WRONLY|os.O_APPEND|syscall.O_DIRECT)
	if _, err := app.Write(make([]byte, 512)); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("direct append at an unaligned end (10000): %v, want EINVAL", err)
	}
	if err := buf.Truncate(10240); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Write(bytes.Repeat([]byte{'A'}, 512)); err != nil {
		t.Fatalf("direct append at an aligned end: %v", err)
	}
	if st, _ := buf.Stat(); st.Size() != 10752 {
		t.Fatalf("size after the append: %d, want 10752", st.Size())
	}
}

// Buffered and direct writers and readers of one file at once, in two
// sessions, each writer owning its own pages: every read, either way,
// returns what the page's owner last wrote (each page holds one value
// throughout), and at the end every page holds its owner's last value.
func TestDirectAndBufferedRace(t *testing.T) {
	a, b, _ := directStack(t)
	const pages = 64
	setup := mustOpen(t, a, "f", os.O_RDWR|os.O_CREATE)
	if _, err := setup.WriteAt(make([]byte, pages*4096), 0); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	last := make([]byte, pages) // the value each page was last given (0: zeros)
	page := func(v byte) []byte { return bytes.Repeat([]byte{v}, 4096) }
	worker := func(fsys *client.FS, flag int, owner int, seed uint64, errs chan<- error) {
		f, err := fsys.OpenFile("f", os.O_RDWR|flag, 0)
		if err != nil {
			errs <- err
			return
		}
		defer f.Close()
		rng := rand.New(rand.NewPCG(seed, 1))
		got := make([]byte, 4096)
		for i := range 300 {
			p := 2*rng.IntN(pages/2) + owner
			if i%2 == 0 {
				v := byte(rng.IntN(250) + 1)
				mu.Lock()
				last[p] = v
				mu.Unlock()
				if _, err := f.WriteAt(page(v), int64(p)*4096); err != nil {
					errs <- err
					return
				}
				continue
			}
			// Read a page of the other writer: it must hold one value,
			// all through.
			q := 2*rng.IntN(pages/2) + 1 - owner
			if _, err := f.ReadAt(got, int64(q)*4096); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, page(got[0])) {
				errs <- errors.New("a page read torn or mixed")
				return
			}
			// Its own page: the last value it wrote.
			mu.Lock()
			want := last[p]
			mu.Unlock()
			if _, err := f.ReadAt(got, int64(p)*4096); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, page(want)) {
				errs <- errors.New("a read missed the reader's own last write")
				return
			}
		}
		errs <- nil
	}
	errs := make(chan error, 2)
	go worker(a, 0, 0, 1, errs)
	go worker(b, syscall.O_DIRECT, 1, 2, errs)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, flag := range []int{0, syscall.O_DIRECT} {
		f := mustOpen(t, b, "f", os.O_RDONLY|flag)
		got := readAll(t, f, pages*4096, 0)
		for p := range pages {
			if !bytes.Equal(got[p*4096:(p+1)*4096], page(last[p])) {
				t.Fatalf("flag %#x: page %d holds %d, want %d", flag, p, got[p*4096], last[p])
			}
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
