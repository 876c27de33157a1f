//go:build spdk

package spdk

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/backendtest"
)

// testConfig is this test process's SPDK configuration (one environment
// per process): Malloc0, a malloc bdev (memory only, so it lasts as long as
// the process, enough for Reopen within it), and Aio0, an aio bdev over a
// sparse file that TestMain makes.
var testConfig string

// aioDisk is the file under Aio0.
var aioDisk string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "weir-spdk-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	disk := filepath.Join(dir, "aio.dat")
	aioDisk = disk
	if err := sparseFile(disk, 64<<20); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testConfig = fmt.Sprintf(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 65536, "block_size": 4096}},
  {"method": "bdev_aio_create", "params": {"name": "Aio0", "filename": %q, "block_size": 4096}}
]}]}`, disk)
	code := m.Run()
	os.RemoveAll(dir)
	if err := Halt(); err != nil { // before C exit handlers tear SPDK down
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// sparseFile creates path with size bytes (a hole), for an aio bdev.
func sparseFile(path string, size int64) error {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	return os.Truncate(path, size)
}

// hugeNeed is the huge-page memory the tests run SPDK in: the 256 MiB
// malloc bdev and SPDK's pools.
const hugeNeed = 768 << 20

// onHugePages: SPDK runs on huge pages where the host has them free (as in
// production: DMA-able memory), otherwise with DPDK's --no-huge.
var onHugePages = HugePagesFree() >= hugeNeed

func options(format bool) Options {
	if onHugePages {
		return Options{ConfigJSON: []byte(testConfig), Bdev: "Malloc0", Format: format}
	}
	return Options{ConfigJSON: []byte(testConfig), Bdev: "Malloc0", NoHuge: true, MemMB: 1024, Format: format}
}

func logMemory(t *testing.T) {
	if onHugePages {
		t.Logf("SPDK runs on huge pages (%d MiB free)", HugePagesFree()>>20)
	} else {
		t.Logf("SPDK runs with --no-huge: fewer than %d MiB of free huge pages DPDK can use (reserve them: sysctl -w vm.nr_hugepages=512, with a hugetlbfs mounted: mount -t hugetlbfs nodev /dev/hugepages)", hugeNeed>>20)
	}
}

// suiteFactory runs the backend suite on backends made with opts(format),
// each wrapped by wrap.
func suiteFactory(opts func(format bool) Options, wrap func(t *testing.T, be *Backend) backend.Backend) backendtest.Factory {
	open := func(t *testing.T, format bool) backend.Backend {
		be, err := New(opts(format))
		if err != nil {
			t.Fatal(err)
		}
		return wrap(t, be)
	}
	return backendtest.Factory{
		New: func(t *testing.T) backend.Backend { return open(t, true) },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
			return open(t, false)
		},
	}
}

func plain(t *testing.T, be *Backend) backend.Backend { return be }

// TestBackendSuite runs the shared backend suite in each configuration
// that changes the data path: one worker; three workers (every resize and
// delete is a barrier across four SPDK threads); completions through cgo
// callbacks; and every payload in registered huge-page memory, so that
// aligned units go to the device with no copy.
func TestBackendSuite(t *testing.T) {
	logMemory(t)
	with := func(f func(*Options)) func(bool) Options {
		return func(format bool) Options { o := options(format); f(&o); return o }
	}
	t.Run("OneWorker", func(t *testing.T) {
		backendtest.Run(t, suiteFactory(options, plain))
	})
	t.Run("ThreeWorkers", func(t *testing.T) {
		backendtest.Run(t, suiteFactory(with(func(o *Options) { o.Workers = 3 }), plain))
	})
	t.Run("CGOCallbacks", func(t *testing.T) {
		backendtest.Run(t, suiteFactory(with(func(o *Options) { o.CGOCallbacks = true; o.Workers = 2 }), plain))
	})
	t.Run("RegisteredMemory", func(t *testing.T) {
		if !onHugePages {
			t.Skipf("needs %d MiB of free huge pages to register memory with SPDK (reserve them: sysctl -w vm.nr_hugepages=512, with a hugetlbfs mounted: mount -t hugetlbfs nodev /dev/hugepages)", hugeNeed>>20)
		}
		backendtest.Run(t, suiteFactory(with(func(o *Options) { o.Workers = 2 }), viaRegistered))
	})
}

// stagingSlot is the size of one slot of registered memory a call of the
// registered-memory wrapper copies its payload through.
const (
	stagingSlot  = 4 << 20
	stagingSlots = 8
)

// registered wraps a Backend so that every ReadAt and WriteAt up to
// stagingSlot bytes moves its payload through registered huge-page memory,
// at the caller's buffer's offset within a page (so unaligned callers stay
// unaligned): the suite then drives the no-copy path.
type registered struct {
	*Backend
	mem    []byte
	slots  chan int
	closed atomic.Bool // mem is unmapped: calls pass their own memory
}

func viaRegistered(t *testing.T, be *Backend) backend.Backend {
	mem, err := unix.Mmap(-1, 0, stagingSlot*stagingSlots, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE)
	if err != nil {
		be.Close()
		t.Fatalf("map %d MiB of huge pages: %v", stagingSlot*stagingSlots>>20, err)
	}
	if err := be.RegisterMem(mem); err != nil {
		be.Close()
		unix.Munmap(mem)
		t.Fatal(err)
	}
	r := &registered{Backend: be, mem: mem, slots: make(chan int, stagingSlots)}
	for i := range stagingSlots {
		r.slots <- i
	}
	return r
}

func (r *registered) Open(id backend.BlobID) (backend.Blob, error) {
	b, err := r.Backend.Open(id)
	if err != nil {
		return nil, err
	}
	return &registeredBlob{Blob: b, r: r}, nil
}

func (r *registered) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return r.Backend.Close()
	}
	if err := r.Backend.UnregisterMem(r.mem); err != nil {
		return err
	}
	err := r.Backend.Close()
	unix.Munmap(r.mem)
	return err
}

type registeredBlob struct {
	backend.Blob
	r *registered
}

func (b *registeredBlob) stage(p []byte) ([]byte, func()) {
	skew := int(bufAddr(p) % 4096)
	if len(p)+skew > stagingSlot || b.r.closed.Load() {
		return p, func() {}
	}
	i := <-b.r.slots
	s := b.r.mem[i*stagingSlot+skew : i*stagingSlot+skew+len(p)]
	return s, func() { b.r.slots <- i }
}

func (b *registeredBlob) ReadAt(p []byte, off int64) (int, error) {
	s, done := b.stage(p)
	defer done()
	n, err := b.Blob.ReadAt(s, off)
	copy(p, s[:n])
	return n, err
}

func (b *registeredBlob) WriteAt(p []byte, off int64) (int, error) {
	s, done := b.stage(p)
	defer done()
	copy(s, p)
	return b.Blob.WriteAt(s, off)
}

// TestRegisteredMemoryIsDirect: aligned units of registered memory reach the
// device with no copy, unaligned edges and unregistered memory bounce, and
// the bytes are right either way.
func TestRegisteredMemoryIsDirect(t *testing.T) {
	if !onHugePages {
		t.Skipf("needs %d MiB of free huge pages to register memory with SPDK (reserve them: sysctl -w vm.nr_hugepages=512, with a hugetlbfs mounted: mount -t hugetlbfs nodev /dev/hugepages)", hugeNeed>>20)
	}
	be, err := New(options(true))
	if err != nil {
		t.Fatal(err)
	}
	r := viaRegistered(t, be).(*registered)
	defer r.Close()
	if err := r.Create(1); err != nil {
		t.Fatal(err)
	}
	h, err := be.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	buf := r.mem[:64<<10]
	for i := range buf {
		buf[i] = byte(i*13 + 5)
	}
	counters := func() (direct, bounce uint64) {
		c := be.Counters()
		return c["spdk_direct_bytes"], c["spdk_bounce_bytes"]
	}
	// Aligned: no copy at all.
	if _, err := h.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	got := r.mem[1<<20 : 1<<20+len(buf)]
	if _, err := h.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if d, b := counters(); d != 2*uint64(len(buf)) || b != 0 {
		t.Fatalf("aligned: direct %d bounce %d bytes, want %d and 0", d, b, 2*len(buf))
	}
	for i := range got {
		if got[i] != buf[i] {
			t.Fatalf("aligned: byte %d is %#x, want %#x", i, got[i], buf[i])
		}
	}
	// Unaligned start and end: only the two edge units bounce.
	if _, err := h.WriteAt(buf[100:8192+100], 100); err != nil {
		t.Fatal(err)
	}
	d0, b0 := counters()
	if _, err := h.WriteAt(r.mem[2<<20+100:2<<20+100+3*4096], 100); err != nil {
		t.Fatal(err)
	}
	if d, b := counters(); d-d0 != 2*4096 || b-b0 != 4096 {
		t.Fatalf("unaligned: direct %d bounce %d bytes, want 8192 and 4096", d-d0, b-b0)
	}
	// Unregistered memory bounces.
	d0, b0 = counters()
	plainBuf := make([]byte, 8192)
	if _, err := h.ReadAt(plainBuf, 0); err != nil {
		t.Fatal(err)
	}
	if d, b := counters(); d != d0 || b-b0 != 8192 {
		t.Fatalf("unregistered: direct %d bounce %d bytes, want 0 and 8192", d-d0, b-b0)
	}
	// Registering memory that is not made of whole 2 MiB pages fails
	// clearly and is counted.
	if err := be.RegisterMem(r.mem[4096 : 4096+hugePage]); err == nil {
		t.Fatal("registering a misaligned range succeeded")
	}
	if c := be.Counters(); c["spdk_register_failures"] != 1 || c["spdk_registered_regions"] != 1 {
		t.Fatalf("counters %v, want one failure and one region", c)
	}
}
