package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
)

// directStack starts a stack on the file backend with the page cache on
// (write-back: buffered writes stay dirty in it) and dials two sessions,
// as two processes would.
func directStack(t *testing.T) (*client.FS, *client.FS, func(string) any) {
	a, b, stat, _ := directStackDrop(t)
	return a, b, stat
}

// directStackDrop is directStack, and a function that empties io's cache.
func directStackDrop(t *testing.T) (*client.FS, *client.FS, func(string) any, func()) {
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
	return dial(), dial(), func(k string) any { return st.IO.Snapshot()[k] }, func() { st.IO.DropCache() }
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
	a, b, stat, drop := directStackDrop(t)
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
	drop()
	if n := stat("cache_resident_pages"); n != int64(0) {
		t.Fatalf("%v pages resident after the drop", n)
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
// sessions, each worker owning half the pages and writing each of them
// with rising versions (a page holds one version, all through), through a
// buffered or a direct handle at random. Every read, either way, returns
// a whole page of one version; of the worker's own page the last it
// wrote; of the other's pages never an older version than it read before.
// At the end every page holds its last version, read either way.
func TestDirectAndBufferedRace(t *testing.T) {
	a, b, _, drop := directStackDrop(t)
	const pages = 64
	setup := mustOpen(t, a, "f", os.O_RDWR|os.O_CREATE)
	if _, err := setup.WriteAt(make([]byte, pages*4096), 0); err != nil {
		t.Fatal(err)
	}
	page := func(v uint32) []byte {
		b := make([]byte, 4096)
		for i := 0; i < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], v)
		}
		return b
	}
	var last [pages]atomic.Uint32 // the version each page was last given (0: zeros)
	worker := func(fsys *client.FS, owner int, seed uint64) error {
		var fs [2]*client.File
		for i, flag := range []int{0, syscall.O_DIRECT} {
			f, err := fsys.OpenFile("f", os.O_RDWR|flag, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			fs[i] = f
		}
		rng := rand.New(rand.NewPCG(seed, 1))
		var seen [pages]uint32
		got := make([]byte, 4096)
		read := func(p int) (uint32, error) {
			f := fs[rng.IntN(2)]
			if _, err := f.ReadAt(got, int64(p)*4096); err != nil {
				return 0, err
			}
			v := binary.LittleEndian.Uint32(got)
			if !bytes.Equal(got, page(v)) {
				return 0, fmt.Errorf("page %d read torn or mixed (direct %v)", p, f == fs[1])
			}
			if v < seen[p] {
				return 0, fmt.Errorf("page %d read version %d after %d (direct %v)", p, v, seen[p], f == fs[1])
			}
			seen[p] = v
			return v, nil
		}
		for i := range 400 {
			p := 2*rng.IntN(pages/2) + owner
			switch i % 4 {
			case 0, 2:
				v := last[p].Load() + 1
				if _, err := fs[rng.IntN(2)].WriteAt(page(v), int64(p)*4096); err != nil {
					return err
				}
				last[p].Store(v)
			case 1:
				if v, err := read(p); err != nil {
					return err
				} else if v != last[p].Load() {
					return fmt.Errorf("own page %d read version %d, last written %d", p, v, last[p].Load())
				}
			case 3:
				if _, err := read(2*rng.IntN(pages/2) + 1 - owner); err != nil {
					return err
				}
				if i%64 == 3 {
					drop() // misses: fills racing the writes
				}
			}
		}
		return nil
	}
	errs := make(chan error, 2)
	go func() { errs <- worker(a, 0, 1) }()
	go func() { errs <- worker(b, 1, 2) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, flag := range []int{0, syscall.O_DIRECT} {
		f := mustOpen(t, b, "f", os.O_RDONLY|flag)
		got := readAll(t, f, pages*4096, 0)
		for p := range pages {
			if !bytes.Equal(got[p*4096:(p+1)*4096], page(last[p].Load())) {
				t.Fatalf("flag %#x: page %d holds %d, want %d", flag, p, binary.LittleEndian.Uint32(got[p*4096:]), last[p].Load())
			}
		}
	}
}

// Reads whose fills leave the store into the memfd for after the answer
// race closes of the handle (with dirty pages: the last reference writes
// them home), truncates and cache drops from another session. Nothing may
// deadlock: the deferred store holds the region until it ran, and the
// read's grant is released only after it.
func TestCacheDeferredStoresRaceCloseAndTruncate(t *testing.T) {
	a, b, _, drop := directStackDrop(t)
	const size = 4 << 20
	setup := mustOpen(t, a, "f", os.O_RDWR|os.O_CREATE)
	if _, err := setup.WriteAt(bytes.Repeat([]byte{1}, size), 0); err != nil {
		t.Fatal(err)
	}
	if err := setup.Sync(); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var cycles atomic.Int64
	wg.Add(3)
	go func() { // open, dirty a page, read at random from two goroutines, close under them
		defer wg.Done()
		rng := rand.New(rand.NewPCG(7, 7))
		for !stopped(stop) {
			f, err := a.OpenFile("f", os.O_RDWR, 0)
			if err != nil {
				continue
			}
			_, _ = f.WriteAt([]byte("dirty"), int64(rng.IntN(size)))
			var rd sync.WaitGroup
			for g := range 2 {
				rd.Add(1)
				go func() {
					defer rd.Done()
					buf := make([]byte, 4096)
					r := rand.New(rand.NewPCG(uint64(g), 1))
					for range 40 {
						if _, err := f.ReadAt(buf, int64(r.IntN(size/4096))*4096); err != nil {
							return // closed under it
						}
					}
				}()
			}
			_ = f.Close()
			rd.Wait()
			cycles.Add(1)
		}
	}()
	go func() { // truncates, to the same size, and O_TRUNC-free reopens
		defer wg.Done()
		for !stopped(stop) {
			if f, err := b.OpenFile("f", os.O_RDWR, 0); err == nil {
				_ = f.Truncate(size)
				_ = f.Close()
			}
		}
	}()
	go func() {
		defer wg.Done()
		for !stopped(stop) {
			drop()
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		buf := make([]byte, 4<<20)
		t.Fatalf("stuck 2 minutes after the stop (deadlock?):\n%s", buf[:runtime.Stack(buf, true)])
	}
	if cycles.Load() == 0 {
		t.Fatal("no open-read-close cycle completed")
	}
	t.Logf("%d open-read-close cycles", cycles.Load())
}

func stopped(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
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
