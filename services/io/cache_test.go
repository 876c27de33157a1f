package iosvc_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/faulty"
	"github.com/weir-storage/weir/services/io/backend/mem"
)

// cachedIO runs the services on the file backend with the page cache on.
func cachedIO(t testing.TB, edit func(*config.Config)) *ioEnv {
	t.Helper()
	return startIOWith(t, nil, nil, func(c *config.Config) {
		c.IO.CacheSize = 64 << 20
		c.IO.Direct = "on"
		if edit != nil {
			edit(c)
		}
	})
}

func TestCacheReadsWhatWasWritten(t *testing.T) {
	e := cachedIO(t, nil)
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]byte, 3<<20+1234)
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	if _, err := f.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		got := make([]byte, len(want))
		if _, err := f.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: read differs from what was written", round)
		}
	}
	t.Logf("stats %v", e.io.Snapshot())
}

// A file that grows past its region's first capacity (64 MiB) gets the
// region grown: the pages past it are cached and read back.
func TestCacheRegionGrows(t *testing.T) {
	e := cachedIO(t, func(c *config.Config) { c.IO.CacheSize = 256 << 20 })
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 1<<20)
	const n = 150
	for i := range n {
		for j := range block {
			block[j] = byte(i + j/4096)
		}
		if _, err := f.WriteAt(block, int64(i)<<20); err != nil {
			t.Fatalf("write of MiB %d: %v", i, err)
		}
	}
	got := make([]byte, 1<<20)
	for _, i := range []int{0, 63, 64, 65, 127, 128, 149} {
		for range 3 {
			if _, err := f.ReadAt(got, int64(i)<<20); err != nil {
				t.Fatalf("read of MiB %d: %v", i, err)
			}
			for j := range block {
				block[j] = byte(i + j/4096)
			}
			if !bytes.Equal(got, block) {
				t.Fatalf("MiB %d reads other bytes", i)
			}
		}
	}
	st := e.io.Snapshot()
	if st["cache_resident_pages"].(int64) < n*256 {
		t.Errorf("resident pages %v after writing %d MiB: writes are not cached", st["cache_resident_pages"], n)
	}
	t.Logf("cache: %v resident pages, %v hits, %v misses", st["cache_resident_pages"], st["cache_hits"], st["cache_misses"])
}

// benchSize is the size of the benchmarks' file.
const benchSize = 64 << 20

// syncedFile creates a file of benchSize bytes (fsynced) for a benchmark.
func syncedFile(b *testing.B, e *ioEnv) (*client.FS, *client.File) {
	fsys := e.dial(b)
	b.Cleanup(func() { fsys.Close() })
	f, err := fsys.Create("f")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	block := bytes.Repeat([]byte{5}, 1<<20)
	for off := int64(0); off < benchSize; off += 1 << 20 {
		if _, err := f.WriteAt(block, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	return fsys, f
}

// BenchmarkCacheColdSequential reads a 64 MiB file in 1 MiB reads after
// its pages were dropped from the cache (the file backend, O_DIRECT): the
// fills and readahead of a cold sequential read.
func BenchmarkCacheColdSequential(b *testing.B) {
	e := cachedIO(b, nil)
	fsys, f := syncedFile(b, e)
	block := make([]byte, 1<<20)
	b.SetBytes(benchSize)
	for b.Loop() {
		b.StopTimer()
		e.io.DropCache()
		b.StartTimer()
		for off := int64(0); off < benchSize; off += 1 << 20 {
			if _, err := f.ReadAt(block, off); err != nil {
				b.Fatal(err)
			}
		}
	}
	st := e.io.Snapshot()
	b.Logf("fill time %v ns, fills %v of %v pages (%v readahead), misses %v, hits %v, bypassed %v, client misses %d hits %d", st["cache_fill_ns"], st["cache_fills"],
		st["cache_filled_pages"], st["cache_readahead_pages"], st["cache_misses"], st["cache_hits"], st["cache_bypassed_pages"], fsys.CacheMisses.Load(), fsys.CacheHits.Load())
}

// BenchmarkCacheColdRandom is 4 KiB reads at random offsets of a 64 MiB
// file whose pages were dropped from the cache (one in sixteen read before
// the next drop): the miss path.
func BenchmarkCacheColdRandom(b *testing.B) {
	for _, c := range []struct {
		name  string
		cache config.Size
	}{{"cache", 64 << 20}, {"nocache", 0}} {
		b.Run(c.name, func(b *testing.B) { coldRandom(b, c.cache) })
	}
}

func coldRandom(b *testing.B, cacheSize config.Size) {
	e := cachedIO(b, func(c *config.Config) { c.IO.CacheSize = cacheSize })
	fsys, f := syncedFile(b, e)
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 4096)
	i := 0
	for b.Loop() {
		if i%(benchSize/4096/16) == 0 {
			b.StopTimer()
			e.io.DropCache()
			b.StartTimer()
		}
		i++
		if _, err := f.ReadAt(buf, int64(rng.IntN(benchSize/4096))*4096); err != nil {
			b.Fatal(err)
		}
	}
	st := e.io.Snapshot()
	b.Logf("fills %v, %v ns in device reads; misses %v, hits %v; client misses %d (%s)", st["cache_fills"], st["cache_fill_ns"],
		st["cache_misses"], st["cache_hits"], fsys.CacheMisses.Load(), b.Name())
}

// The cache stays within io.cache_size however a file is read: fills,
// readahead and write-allocation evict past it; the memfds hold no more
// than the resident pages (plus the scrub's slack).
func TestCacheStaysWithinItsSize(t *testing.T) {
	const limit = 1 << 20
	e := cachedIO(t, func(c *config.Config) { c.IO.CacheSize = limit })
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 8 << 20
	want := make([]byte, size)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	if _, err := f.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	// A readahead the client hinted may still be filling when ReadAt
	// returns, and pages in a fill cannot be evicted: the cache is back
	// within its size once the fill in flight ends (its own eviction
	// pass), so check waits a little for that.
	check := func(when string) {
		t.Helper()
		var st map[string]any
		var res, mem int64
		for try := 0; ; try++ {
			st = e.io.Snapshot()
			res, mem = st["cache_resident_pages"].(int64), st["cache_memory_bytes"].(int64)
			if res*4096 <= limit && mem <= limit+1<<20 {
				break
			}
			if try == 100 {
				t.Fatalf("%s: %d resident pages (%d bytes), regions hold %d bytes; limit %d", when, res, res*4096, mem, limit)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s: %d resident pages, regions hold %d bytes, %v evictions, %v written back", when, res, mem, st["cache_evictions"], st["cache_writeback_pages"])
	}
	check("after writing 8 MiB")
	got := make([]byte, size)
	for round := range 3 {
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("round %d: %v, or other bytes", round, err)
		}
		for range 200 {
			off := int64(rng.IntN(size - 10000))
			n := 1 + rng.IntN(10000)
			if _, err := f.ReadAt(got[:n], off); err != nil || !bytes.Equal(got[:n], want[off:off+int64(n)]) {
				t.Fatalf("read of %d at %d: %v, or other bytes", n, off, err)
			}
		}
		check(fmt.Sprintf("after read round %d", round))
	}
}

// Readers that race evictions, fills and writes of the same pages (a cache
// of 64 pages under a file of 1024) never read a page torn, zeroed or older
// than the last write that returned before the read began.
func TestCacheReadersRaceEvictionsAndWrites(t *testing.T) {
	e := cachedIO(t, func(c *config.Config) { c.IO.CacheSize = 64 * 4096 })
	const pages = 1024
	page := func(p, v uint64) []byte {
		b := make([]byte, 4096)
		r := rand.New(rand.NewPCG(p, v))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		binary.LittleEndian.PutUint64(b, v)
		binary.LittleEndian.PutUint64(b[8:], p)
		return b
	}
	w := e.dial(t)
	defer w.Close()
	wf, err := w.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer wf.Close()
	for p := range uint64(pages) {
		if _, err := wf.WriteAt(page(p, 0), int64(p)*4096); err != nil {
			t.Fatal(err)
		}
	}
	var done [pages]atomic.Uint64 // the version of each page's last write that returned
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(7, 8))
		for v := uint64(1); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			p := uint64(rng.IntN(pages))
			if _, err := wf.WriteAt(page(p, v), int64(p)*4096); err != nil {
				errs <- err
				return
			}
			done[p].Store(v)
		}
	})
	for r := range 2 {
		fsys := e.dial(t)
		defer fsys.Close()
		f, err := fsys.Open("f")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		rf := f.(interface {
			ReadAt([]byte, int64) (int, error)
		})
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(9, uint64(r)))
			got := make([]byte, 4096)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := uint64(rng.IntN(pages))
				floor := done[p].Load()
				if _, err := rf.ReadAt(got, int64(p)*4096); err != nil {
					errs <- err
					return
				}
				v := binary.LittleEndian.Uint64(got)
				if binary.LittleEndian.Uint64(got[8:]) != p || v < floor || !bytes.Equal(got, page(p, v)) {
					first, zeros := -1, 0
					want := page(p, v)
					for j := range got {
						if got[j] != want[j] {
							if first < 0 {
								first = j
							}
							if got[j] == 0 {
								zeros++
							}
						}
					}
					errs <- fmt.Errorf("reader %d, read %d: page %d reads version %d (torn, zeroed or stale: %d had returned); first difference at byte %d, %d differing bytes are zero", r, i, p, v, floor, first, zeros)
					return
				}
			}
		})
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := e.io.Snapshot()
	t.Logf("%v evictions, %v fills, %v io hits; %v pages written back", st["cache_evictions"], st["cache_fills"], st["cache_hits"], st["cache_writeback_pages"])
	if st["cache_evictions"].(uint64) == 0 {
		t.Fatal("no eviction: the test raced nothing")
	}
}

// O_SYNC writes (each followed by a flush of the file's dirty pages) and
// truncates of the same file, from two sessions at once, all complete: a
// write-back flush under a write's region locks would wait behind the
// truncate that waits for the write.
func TestCacheSyncWritesRaceTruncates(t *testing.T) {
	e := cachedIO(t, nil)
	w := e.dial(t)
	defer w.Close()
	f, err := w.OpenFile("f", os.O_RDWR|os.O_CREATE|os.O_SYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := e.dial(t)
	defer tr.Close()
	g, err := tr.OpenFile("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	done := make(chan error, 2)
	stop := time.Now().Add(300 * time.Millisecond)
	go func() {
		b := bytes.Repeat([]byte{1}, 6000)
		for i := 0; time.Now().Before(stop); i++ {
			if _, err := f.WriteAt(b, int64(i%7)*3000); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	go func() {
		for i := 0; time.Now().Before(stop); i++ {
			if err := g.Truncate(int64(i%5) * 5000); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("O_SYNC writes and truncates of one file hung")
		}
	}
}

// TestWriteBackHoldsPagesOnlyForTheCopy: while the checkpoint writes a
// file's dirty pages home, a writer to one of them waits only for the
// copy the write-back makes, not for its device write (Oxbow's shadow
// copy); a page changed during the write (over the copy's bytes, or past
// its end, inside its last page) stays dirty, and the next write-back
// takes its new bytes home.
func TestWriteBackHoldsPagesOnlyForTheCopy(t *testing.T) {
	fb := faulty.New(mem.New())
	e := startIOWith(t, fb, nil, func(c *config.Config) { c.IO.CacheSize = 16 << 20 })
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	// Two pages, the second partial: the write-back's copy ends at the
	// size, inside it.
	a, b, c := bytes.Repeat([]byte{'a'}, 8092), bytes.Repeat([]byte{'b'}, 4096), bytes.Repeat([]byte{'c'}, 50)
	if _, err := f.WriteAt(a, 0); err != nil {
		t.Fatal(err)
	}
	blob := backend.BlobID(inoOf(t, f))
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fb.Inject(func(op faulty.Op) error {
		if op.Kind == faulty.Write && op.Blob == blob {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return nil
	})
	if err := f.Sync(); err != nil { // staged; the checkpointer then writes the pages home
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no write-back of the file's pages within 30s")
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := f.WriteAt(b, 0) // over the copy's bytes
		if err == nil {
			_, err = f.WriteAt(c, 8092) // past the copy's end, in its last page
		}
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("a write to a page being written back waited for the device write")
	}
	close(release)
	if err := f.Close(); err != nil { // the last close writes the dirty pages home
		t.Fatal(err)
	}
	want := append(append(bytes.Clone(b), a[4096:]...), c...)
	waitFor(t, "the page's new bytes at home", func() bool {
		h, err := fb.Inner().Open(blob)
		if err != nil {
			return false
		}
		defer h.Close()
		got := make([]byte, len(want))
		n, _ := h.ReadAt(got, 0)
		return n == len(want) && bytes.Equal(got, want)
	})
}
