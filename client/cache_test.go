package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto/cache"
)

// benchFile starts a stack on the mem backend for a benchmark and creates
// a file there; both go when the benchmark ends.
func benchFile(b *testing.B) (*client.FS, *client.File) {
	st := startStack(b, testConfig(b, b.TempDir(), "mem"))
	b.Cleanup(func() { stopStack(b, st) })
	fsys, err := st.Dial(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { fsys.Close() })
	f, err := fsys.Create("f")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return fsys, f
}

// BenchmarkCachedReadAt is a 4 KiB ReadAt of a resident page: the path a
// warm read takes, with no round trip.
func BenchmarkCachedReadAt(b *testing.B) {
	fsys, f := benchFile(b)
	data := bytes.Repeat([]byte{7}, 16<<20)
	if _, err := f.WriteAt(data, 0); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := range 4 {
		f.ReadAt(buf, int64(i)*4096)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	hits := fsys.CacheHits.Load()
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := f.ReadAt(buf, int64(rng.IntN(4096))*4096); err != nil {
			b.Fatal(err)
		}
	}
	if fsys.CacheHits.Load() == hits {
		b.Fatal("no read was served from the cache region")
	}
}

// BenchmarkCachedWriteAt is a 4 KiB WriteAt of a resident page, no fsync:
// the write stays in the IO service's cache (write-back).
func BenchmarkCachedWriteAt(b *testing.B) {
	_, f := benchFile(b)
	data := bytes.Repeat([]byte{7}, 16<<20)
	if _, err := f.WriteAt(data, 0); err != nil {
		b.Fatal(err)
	}
	buf := bytes.Repeat([]byte{9}, 4096)
	rng := rand.New(rand.NewPCG(1, 1))
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := f.WriteAt(buf, int64(rng.IntN(4096))*4096); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCachedReadAtHot reads one resident page again and again: the
// client's own cost of a read from the region, without DRAM misses.
func BenchmarkCachedReadAtHot(b *testing.B) {
	_, f := benchFile(b)
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 1<<20), 0); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	for range 4 {
		f.ReadAt(buf, 8192)
	}
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := f.ReadAt(buf, 8192); err != nil {
			b.Fatal(err)
		}
	}
}

// mappedFile creates name holding size bytes of pattern, reads it until
// the client maps its cache region, and returns the file and the region's
// memfd.
func mappedFile(t *testing.T, fsys *client.FS, name string, size int) (*client.File, *os.File) {
	t.Helper()
	f, err := fsys.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	want := bytes.Repeat([]byte("weir"), size/4)
	if _, err := f.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	for range 3 {
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read back: %v", err)
		}
	}
	mf := client.CacheFile(f)
	if mf == nil {
		t.Fatal("the file did not map its cache region after three reads")
	}
	if fsys.CacheHits.Load() == 0 {
		t.Fatal("no read was served from the region")
	}
	return f, mf
}

// A client holds its cache regions read-only: a store into the mapping
// faults (SIGSEGV in the offender), mprotect and a writable mmap of the
// memfd fail, and nothing changes; as another uid, the memfd cannot be
// reopened read-write through /proc either.
func TestHostileCannotWriteItsRegion(t *testing.T) {
	fsys, _ := newFS(t)
	f, mf := mappedFile(t, fsys, "ro", 64<<10)
	st, err := mf.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Mmap(int(mf.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, unix.EACCES) {
		t.Fatalf("writable mmap of the region: %v, want EACCES", err)
	}
	if _, err := unix.Mmap(int(client.CacheDataFile(f).Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, unix.EACCES) {
		t.Fatalf("writable mmap of the region's data: %v, want EACCES", err)
	}
	mem, err := unix.Mmap(int(mf.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE); !errors.Is(err, unix.EACCES) {
		t.Fatalf("mprotect(PROT_WRITE) of the region: %v, want EACCES", err)
	}
	// Scribble over the header, a state word and a data page.
	for _, off := range []int{0, 72, cache.HeaderSize, cache.HeaderSize + cache.PageSize} {
		if !storeFaults(mem, off) {
			t.Fatalf("a store at byte %d of a read-only region did not fault", off)
		}
	}
	got := make([]byte, 64<<10)
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte("weir"), 16<<10)) {
		t.Fatalf("the file changed: %v", err)
	}
	if os.Geteuid() != 0 {
		// The test's own uid is the IO service's, which may reopen its
		// memfds (mode 0600: io makes clients' descriptions so); another
		// uid may not, and only root can become one.
		t.Log("not root: the reopen by another uid (65534) is not tried")
		return
	}
	// As root the test could reopen anything (CAP_DAC_OVERRIDE, which can
	// write io's memory anyway): try as uid 65534, in a child given the fd.
	cmd := exec.Command(copyTestBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), envReopen+"=1")
	cmd.ExtraFiles = []*os.File{mf} // fd 3 in the child
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reopen refused") {
		t.Fatalf("uid 65534 reopening the region: %v: %s", err, out)
	}
}

// copyTestBinary copies the test binary where another uid can run it (go
// test builds it in a private directory).
func copyTestBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "weir-client-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	path := dir + "/client.test"
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// envReopen makes the test binary try to reopen fd 3 read-write (as
// TestHostileCannotWriteItsRegion's child).
const envReopen = "WEIR_CLIENT_TEST_REOPEN"

func reopenChild() int {
	rw, err := os.OpenFile("/proc/self/fd/3", os.O_RDWR, 0)
	if err == nil {
		rw.Close()
		fmt.Println("reopened read-write")
		return 1
	}
	fmt.Println("reopen refused:", err)
	return 0
}

// storeFaults stores into mem[off] and reports whether the store faulted.
func storeFaults(mem []byte, off int) (faulted bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() { faulted = recover() != nil }()
	mem[off] = 0xff
	return false
}

// A client that reads its mapping where nothing is cached makes the
// kernel allocate those pages (a read fault on a hole of a memfd
// allocates, charged to the faulting process's memory cgroup); the IO
// service's scrub frees them, so that they do not outlive the offender.
func TestHostileFaultsAreScrubbed(t *testing.T) {
	fsys, st := newFS(t)
	ff, _ := mappedFile(t, fsys, "faults", 64<<10)
	mf := client.CacheDataFile(ff) // the file's pages
	mem, err := unix.Mmap(int(mf.Fd()), 0, client.CacheDataMapped(ff), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	blocks := func() int64 {
		var s unix.Stat_t
		if err := unix.Fstat(int(mf.Fd()), &s); err != nil {
			t.Fatal(err)
		}
		return s.Blocks * 512
	}
	before := blocks()
	var sum byte
	for i := 0; i < len(mem); i += 4096 {
		sum += mem[i]
	}
	grown := blocks()
	if grown < before+32<<20 {
		t.Fatalf("reading the mapping allocated %d bytes, expected most of %d (%d)", grown-before, len(mem), sum)
	}
	freed := st.IO.ScrubCache()
	after := blocks()
	t.Logf("region memory: %d bytes, %d after faulting every page, %d after scrub (freed %d)", before, grown, after, freed)
	if after > before+1<<20 {
		t.Fatalf("after scrub the region holds %d bytes, %d before the faults", after, before)
	}
	f, err := fsys.Open("faults")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, 64<<10)
	if _, err := f.(*client.File).ReadAt(got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte("weir"), 16<<10)) {
		t.Fatalf("the file reads otherwise after the scrub: %v", err)
	}
}

// BenchmarkWarmOpenReadClose is fileops' warm small-file row in one
// process: open + read 4 KiB + close of one of 16 files opened before,
// under the session's kept leases.
func BenchmarkWarmOpenReadClose(b *testing.B) { benchOpenReadClose(b, 16) }

// BenchmarkColdOpenReadClose is fileops' cold small-file row in one
// process: open + read 4 KiB + close of a file not opened since it was
// written (each of 4,096 files in turn; past them, the loop starts over
// on files whose kept leases the session's limit has mostly ended).
func BenchmarkColdOpenReadClose(b *testing.B) { benchOpenReadClose(b, 4096) }

// benchOpenReadClose makes n files of 4 KiB, then opens, reads and
// closes them in turn.
func benchOpenReadClose(b *testing.B, n int) {
	fsys, f := benchFile(b)
	f.Close()
	data := bytes.Repeat([]byte{7}, 4096)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("small-%d", i)
		if err := fsys.WriteFile(names[i], data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	buf := make([]byte, 4096)
	i := 0
	for b.Loop() {
		g, err := fsys.OpenFile(names[i%len(names)], os.O_RDONLY, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := g.ReadAt(buf, 0); err != nil {
			b.Fatal(err)
		}
		g.Close()
		i++
	}
}
