package cache

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The cross-process test re-executes this test binary as the reader; its
// role comes from the environment.
const (
	envRole  = "WEIR_CACHE_TEST_ROLE"
	envPages = "WEIR_CACHE_TEST_PAGES"
	envFor   = "WEIR_CACHE_TEST_FOR"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "":
		flag.Parse()
		os.Exit(m.Run())
	case "reader":
		os.Exit(peerReader())
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", envRole, os.Getenv(envRole))
		os.Exit(2)
	}
}

// newRegion maps a new region of capacity bytes, read-write: its meta
// memfd and its data memfd.
func newRegion(t testing.TB, capacity uint64) (*Region, [2]*os.File) {
	t.Helper()
	ms, ds, err := Sizes(capacity)
	if err != nil {
		t.Fatal(err)
	}
	var files [2]*os.File
	var mems [2][]byte
	for i, size := range []uint64{ms, ds} {
		fd, err := unix.MemfdCreate("weir-cache-test", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "weir-cache-test")
		t.Cleanup(func() { f.Close() })
		if err := f.Truncate(int64(size)); err != nil {
			t.Fatal(err)
		}
		mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(mem) })
		files[i], mems[i] = f, mem
	}
	r, err := Format(mems[0], mems[1], 7, capacity)
	if err != nil {
		t.Fatal(err)
	}
	return r, files
}

func TestLayout(t *testing.T) {
	for _, c := range []struct{ got, want uint64 }{
		{stateOff(0), HeaderSize},
		{stateOff(1), HeaderSize + 4},
		{stateOff(ChunkPages), HeaderSize + PageSize},
		{stateOff(3*ChunkPages + 5), HeaderSize + 3*PageSize + 5*4},
		{pageOff(0), 0},
		{pageOff(ChunkPages - 1), (ChunkPages - 1) * PageSize},
		{pageOff(3*ChunkPages + 5), 3*ChunkBytes + 5*PageSize},
		{ChunkBytes, 4 << 20},
	} {
		if c.got != c.want {
			t.Errorf("offset %d, want %d", c.got, c.want)
		}
	}
	for _, c := range []struct{ capacity, meta, data uint64 }{{0, HeaderSize, 0}, {1, HeaderSize + PageSize, ChunkBytes},
		{ChunkBytes, HeaderSize + PageSize, ChunkBytes}, {ChunkBytes + 1, HeaderSize + 2*PageSize, 2 * ChunkBytes}} {
		if m, d, err := Sizes(c.capacity); err != nil || m != c.meta || d != c.data {
			t.Errorf("Sizes(%d) = %d, %d, %v, want %d, %d", c.capacity, m, d, err, c.meta, c.data)
		}
	}
	if _, _, err := Sizes(MaxCapacity + 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("Sizes past MaxCapacity: %v", err)
	}
	if headerFixedLen > HeaderSize || offFieldsSeq%64 != 0 {
		t.Error("the header's fields do not fit, or the field group is not on its own cache line")
	}
}

func TestWord(t *testing.T) {
	w := MakeWord(KindResident, true, 3, 0xbeef)
	if w.Kind() != KindResident || !w.Dirty() || w.Pins() != 3 || w.Seq() != 0xbeef || w.Valid() != nil {
		t.Fatalf("MakeWord round trip: %#x", uint32(w))
	}
	if n := MakeWord(KindBusy, false, 0, 0xffff).next(KindResident, false); n.Seq() != 0 || n.Kind() != KindResident {
		t.Errorf("the sequence does not wrap: %#x", uint32(n))
	}
	for _, bad := range []Word{3, 1 << 3, 1 << 7, MakeWord(KindAbsent, true, 0, 1), MakeWord(KindAbsent, false, 1, 1)} {
		if err := bad.Valid(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Valid(%#x) = %v, want EINVAL", uint32(bad), err)
		}
	}
}

func TestAttach(t *testing.T) {
	r, _ := newRegion(t, 3*ChunkBytes)
	a, err := Attach(r.meta, r.data)
	if err != nil {
		t.Fatal(err)
	}
	if a.Pages() != 3*ChunkPages || a.Ino() != 7 || a.Capacity() != 3*ChunkBytes {
		t.Fatalf("attached: %d pages, ino %d, capacity %d", a.Pages(), a.Ino(), a.Capacity())
	}
	// A mapping shorter than the capacity (the region grew since): only
	// what is mapped is read.
	for _, m := range [][2][]byte{{r.meta[:HeaderSize+PageSize+100], r.data}, {r.meta, r.data[:ChunkBytes+100]}} {
		short, err := Attach(m[0], m[1])
		if err != nil || short.Pages() != ChunkPages {
			t.Fatalf("short mapping: %v, %d pages", err, short.Pages())
		}
		if _, err := short.State(ChunkPages); err == nil {
			t.Error("a page past the mapping was read")
		}
		if _, err := short.Data(ChunkPages, 1); err == nil {
			t.Error("a page past the data mapping was returned")
		}
	}
	for name, corrupt := range map[string]func(){
		"magic":       func() { r.store32(offMagic, 1) },
		"version":     func() { r.store32(offVersion, 1|PageShift<<16) },
		"page shift":  func() { r.store32(offVersion, Version|13<<16) },
		"chunk pages": func() { r.store32(offChunkPages, 7) },
		"reserved":    func() { r.store32(offReserved, 1) },
		"capacity":    func() { r.store64(offCapacity, 12345) },
		"huge":        func() { r.store64(offCapacity, MaxCapacity+ChunkBytes) },
	} {
		saved := append([]byte(nil), r.meta[:HeaderSize]...)
		corrupt()
		if _, err := Attach(r.meta, r.data); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s corrupted: Attach = %v, want EINVAL", name, err)
		}
		copy(r.meta, saved)
	}
	if _, err := Attach(make([]byte, 100), r.data); !errors.Is(err, ErrInvalid) {
		t.Errorf("a mapping without a header: %v", err)
	}
}

// fillPage makes page p hold version v: every 8-byte word p<<32 | v.
func fillPage(t testing.TB, r *Region, p uint64, v uint32) {
	var page [PageSize]byte
	for i := 0; i < PageSize; i += 8 {
		binary.LittleEndian.PutUint64(page[i:], p<<32|uint64(v))
	}
	b, err := r.Begin(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.WritePage(p, 0, page[:]); err != nil {
		t.Fatal(err)
	}
	if err := r.Publish(p, b, false); err != nil {
		t.Fatal(err)
	}
}

// uniform reports whether page holds one version of page p, and which.
func uniform(p uint64, page []byte) (uint32, bool) {
	first := binary.LittleEndian.Uint64(page)
	for i := 0; i < len(page); i += 8 {
		if binary.LittleEndian.Uint64(page[i:]) != first {
			return 0, false
		}
	}
	return uint32(first), first>>32 == p
}

func TestReadPage(t *testing.T) {
	r, _ := newRegion(t, ChunkBytes*2)
	buf := make([]byte, PageSize)
	if r.ReadPage(5, 0, buf) {
		t.Fatal("an absent page read as resident")
	}
	fillPage(t, r, 5, 1)
	if !r.ReadPage(5, 0, buf) {
		t.Fatal("a resident page did not read")
	}
	if v, ok := uniform(5, buf); !ok || v != 1 {
		t.Fatalf("page 5 reads version %d (%v)", v, ok)
	}
	// Unaligned pieces, across pages.
	fillPage(t, r, 6, 2)
	part := make([]byte, 20)
	if n := r.ReadAt(part, 5*PageSize+PageSize-7); n != 20 {
		t.Fatalf("ReadAt across pages 5 and 6: %d bytes", n)
	}
	if got := binary.LittleEndian.Uint64(part[7:]); got != 6<<32|2 {
		t.Errorf("bytes of page 6: %#x", got)
	}
	if n := r.ReadAt(make([]byte, 3*PageSize), 5*PageSize); n != 2*PageSize {
		t.Errorf("ReadAt of pages 5, 6 and an absent 7: %d bytes, want %d", n, 2*PageSize)
	}
	b, err := r.Begin(5)
	if err != nil {
		t.Fatal(err)
	}
	if r.ReadPage(5, 0, buf) {
		t.Error("a busy page read as resident")
	}
	if _, err := r.Begin(5); err == nil {
		t.Error("a busy page began another transition")
	}
	if err := r.Drop(5, b); err != nil {
		t.Fatal(err)
	}
	if w, _ := r.State(5); w.Kind() != KindAbsent || w.Valid() != nil {
		t.Errorf("after Drop: %#x", uint32(w))
	}
	if err := r.Publish(5, b, false); err == nil {
		t.Error("a stale busy word ended a transition")
	}
	for _, bad := range []func() bool{
		func() bool { return r.ReadPage(r.Pages(), 0, buf) },
		func() bool { return r.ReadPage(6, 1, buf) },
		func() bool { return r.ReadPage(6, -1, buf[:1]) },
	} {
		if bad() {
			t.Error("a read outside the page or the mapping succeeded")
		}
	}
}

// TestReadersNeverSeeTornPages: while the service updates and evicts pages
// as fast as it can, readers' successful ReadPage copies hold exactly one
// version of the page they asked for, never a mix or the zeros of an
// eviction.
func TestReadersNeverSeeTornPages(t *testing.T) {
	const pages = 8
	r, _ := newRegion(t, ChunkBytes)
	for p := range uint64(pages) {
		fillPage(t, r, p, 1)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var hits, misses atomic.Int64
	var torn atomic.Value
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			buf := make([]byte, PageSize)
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := rng.Uint64N(pages)
				if !r.ReadPage(p, 0, buf) {
					misses.Add(1)
					continue
				}
				hits.Add(1)
				if _, ok := uniform(p, buf); !ok {
					torn.Store(fmt.Sprintf("page %d read torn or foreign: first word %#x", p, binary.LittleEndian.Uint64(buf)))
				}
			}
		}()
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	zeros := make([]byte, PageSize)
	for v := uint32(2); time.Now().Before(deadline); v++ {
		p := uint64(v) % pages
		if v%5 == 0 { // evict: busy, zero, absent; then fill again
			b, err := r.Begin(p)
			if err != nil {
				t.Fatal(err)
			}
			r.WritePage(p, 0, zeros)
			if err := r.Drop(p, b); err != nil {
				t.Fatal(err)
			}
		}
		fillPage(t, r, p, v)
	}
	close(stop)
	wg.Wait()
	if msg := torn.Load(); msg != nil {
		t.Fatal(msg)
	}
	if hits.Load() == 0 {
		t.Fatalf("no read hit (%d misses)", misses.Load())
	}
	t.Logf("%d hits, %d misses", hits.Load(), misses.Load())
}

func TestFields(t *testing.T) {
	r, _ := newRegion(t, ChunkBytes)
	if f, ok := r.Fields(); !ok || f != (Fields{}) {
		t.Fatalf("fields of a new region: %+v %v", f, ok)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value
	var seen atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			f, ok := r.Fields()
			if !ok {
				continue
			}
			seen.Add(1)
			if uint64(f.Mtime) != f.Size || uint64(f.Ctime) != f.Size || f.DataVersion != f.Size {
				bad.Store(fmt.Sprintf("a torn field group: %+v", f))
			}
		}
	}()
	for i := uint64(1); i < 200000; i++ {
		r.SetFields(Fields{Size: i, Mtime: int64(i), Ctime: int64(i), DataVersion: i})
	}
	close(stop)
	wg.Wait()
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	if seen.Load() == 0 {
		t.Fatal("no stable read of the field group")
	}
	// A writer that died (or lies) with the sequence odd: readers give up
	// instead of spinning.
	r.store64(offFieldsSeq, 7)
	if _, ok := r.Fields(); ok {
		t.Fatal("an odd sequence read as stable")
	}
	if err := (Fields{Size: MaxCapacity + 1}).Check(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Check of a size past MaxCapacity: %v", err)
	}
}

func TestGrow(t *testing.T) {
	r, _ := newRegion(t, 2*ChunkBytes)
	if err := r.Grow(ChunkBytes); err != nil || r.Capacity() != 2*ChunkBytes {
		t.Fatalf("Grow to less: %v, capacity %d", err, r.Capacity())
	}
	if err := r.Grow(3 * ChunkBytes); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Grow past the mapping: %v", err)
	}
	r2, _ := newRegion(t, 4*ChunkBytes)
	r2.store64(offCapacity, ChunkBytes)
	if err := r2.Grow(3*ChunkBytes + 1); err != nil || r2.Capacity() != 4*ChunkBytes {
		t.Fatalf("Grow: %v, capacity %d", err, r2.Capacity())
	}
	g := r2.Generation()
	r2.NewGeneration()
	if r2.Generation() != g+1 {
		t.Error("NewGeneration did not bump the generation")
	}
}

// FuzzAttach: any bytes in a header and its first chunk's state words are
// refused or attached without a panic, and nothing read from them indexes
// past the mapping.
func FuzzAttach(f *testing.F) {
	ms, ds, _ := Sizes(ChunkBytes)
	good := make([]byte, ms)
	data := make([]byte, ds)
	if _, err := Format(good, data, 1, ChunkBytes); err != nil {
		f.Fatal(err)
	}
	f.Add(good[:HeaderSize+PageSize])
	f.Add(make([]byte, HeaderSize))
	mem := make([]byte, ms)
	f.Fuzz(func(t *testing.T, b []byte) {
		// The header and the first state page take the input; the data
		// pages are never written.
		clear(mem[:HeaderSize+PageSize])
		copy(mem[:HeaderSize+PageSize], b)
		r, err := Attach(mem, data)
		if err != nil {
			return
		}
		buf := make([]byte, 64)
		for p := range min(r.Pages(), 64) {
			w, _ := r.State(p)
			_ = w.Valid()
			r.ReadPage(p, 0, buf)
		}
		r.ReadAt(buf, r.Pages()*PageSize-10)
		r.Fields()
	})
}

// TestCrossProcess: a reader in another process maps the region read-only
// (as a client whose handle is read-only does) while this process updates
// and evicts pages; every page it reads whole is one version of that page.
// A store into its mapping faults.
func TestCrossProcess(t *testing.T) {
	const pages = 16
	r, f := newRegion(t, ChunkBytes)
	for p := range uint64(pages) {
		fillPage(t, r, p, 1)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=reader", envPages+"="+strconv.Itoa(pages), envFor+"=400ms")
	cmd.ExtraFiles = f[:] // fds 3 (meta) and 4 (data)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		zeros := make([]byte, PageSize)
		for v := uint32(2); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			p := uint64(v) % pages
			if v%3 == 0 {
				if b, err := r.Begin(p); err == nil {
					r.WritePage(p, 0, zeros)
					r.Drop(p, b)
				}
			}
			fillPage(t, r, p, v)
		}
	}()
	result, _ := io.ReadAll(out)
	err = cmd.Wait()
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("reader: %v: %s", err, result)
	}
	t.Logf("reader: %s", result)
}

// peerReader maps fds 3 and 4 read-only and reads random pages for envFor,
// checking each whole-page read; it then tries to store into its mapping,
// which must fault. It prints its counts and exits 0, or 1 on a torn read.
func peerReader() int {
	pages, _ := strconv.ParseUint(os.Getenv(envPages), 10, 64)
	d, _ := time.ParseDuration(os.Getenv(envFor))
	ms, ds, _ := Sizes(ChunkBytes)
	meta, err := unix.Mmap(3, 0, int(ms), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mmap:", err)
		return 1
	}
	mem, err := unix.Mmap(4, 0, int(ds), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mmap:", err)
		return 1
	}
	r, err := Attach(meta, mem)
	if err != nil {
		fmt.Fprintln(os.Stderr, "attach:", err)
		return 1
	}
	rng := rand.New(rand.NewPCG(9, 9))
	buf := make([]byte, PageSize)
	var hits, misses int
	for end := time.Now().Add(d); time.Now().Before(end); {
		p := rng.Uint64N(pages)
		if !r.ReadPage(p, 0, buf) {
			misses++
			continue
		}
		hits++
		if _, ok := uniform(p, buf); !ok {
			fmt.Fprintf(os.Stderr, "page %d read torn or foreign: %#x\n", p, binary.LittleEndian.Uint64(buf))
			return 1
		}
	}
	if hits == 0 {
		fmt.Fprintf(os.Stderr, "no hit in %d reads\n", misses)
		return 1
	}
	// A read-only mapping refuses stores: the write faults (SIGSEGV), which
	// Go turns into a panic this process recovers from.
	faulted := func() (f bool) {
		defer func() { f = recover() != nil }()
		debug.SetPanicOnFault(true)
		mem[pageOff(0)] = 1
		return false
	}()
	if !faulted {
		fmt.Fprintln(os.Stderr, "a store into the read-only mapping did not fault")
		return 1
	}
	fmt.Printf("%d hits, %d misses, the store faulted\n", hits, misses)
	return 0
}

// BenchmarkReadPage is the copy a warm 4 KiB read of a cached page costs a
// client: two state-word loads around a 4 KiB copy out of the mapping.
func BenchmarkReadPage(b *testing.B) {
	r, _ := newRegion(b, ChunkBytes)
	fillPage(b, r, 3, 1)
	buf := make([]byte, PageSize)
	b.SetBytes(PageSize)
	for b.Loop() {
		if !r.ReadPage(3, 0, buf) {
			b.Fatal("miss")
		}
	}
}

// BenchmarkCopy is copy() of 4 KiB, for scale.
func BenchmarkCopy(b *testing.B) {
	src, dst := make([]byte, PageSize), make([]byte, PageSize)
	b.SetBytes(PageSize)
	for b.Loop() {
		copy(dst, src)
	}
}

// TestCopyInKeepsNeighbourStores: io's atomic copy into part of a word
// (the edges of a write, on weakly ordered hosts and under the race
// detector) must not take back a store a client makes into the word's
// other bytes at the same time, through a writable mapping or a write
// window. The client here counts in byte 7 with compare-and-swap while
// io writes bytes 1 to 3 over and over: a lost count is a lost store.
func TestCopyInKeepsNeighbourStores(t *testing.T) {
	r, _ := newRegion(t, 64*PageSize)
	off := PageOffset(3)
	const counts = 200000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		src := []byte{1, 2, 3}
		for {
			select {
			case <-stop:
				return
			default:
			}
			r.copyInAtomic(off+1, src)
		}
	}()
	w := r.dataWord(off)
	for range counts {
		for {
			o := atomic.LoadUint64(w)
			n := o&^(0xff<<56) | ((o>>56+1)&0xff)<<56
			if atomic.CompareAndSwapUint64(w, o, n) {
				break
			}
		}
	}
	close(stop)
	wg.Wait()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], atomic.LoadUint64(w))
	if b[7] != byte(counts%256) || b[1] != 1 || b[2] != 2 || b[3] != 3 {
		t.Fatalf("word after the race: % x; want byte 7 = %#x (no count lost) and bytes 1-3 = 01 02 03", b, byte(counts%256))
	}
}

// TestRetire: a retired region's field group never reads as stable, so a
// client that still maps it asks the service.
func TestRetire(t *testing.T) {
	r, _ := newRegion(t, 4*ChunkBytes)
	r.SetFields(Fields{Size: 10, Mtime: 1, Ctime: 1, DataVersion: 1})
	if _, ok := r.Fields(); !ok {
		t.Fatal("fields unstable before Retire")
	}
	r.Retire()
	if f, ok := r.Fields(); ok {
		t.Fatalf("a retired region's fields read as stable: %+v", f)
	}
}
