package client_test

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
)

// TestWritableMapping: the IO service passes a file's data memfd
// read-write only to a handle that writes the file (OpMapWritable; a
// writable pin likewise), and a client's stores through it are what
// every read sees at once. The holder of that description changes nothing
// a write could not: it cannot shrink the memfd or seal it, its file
// status flags are its own (O_APPEND on it moves none of io's stores),
// and the region's meta memfd stays read-only to it.
func TestWritableMapping(t *testing.T) {
	fsys, st := newFS(t)
	f, _ := mappedFile(t, fsys, "rw", 64<<10)
	ro, err := fsys.OpenFile("rw", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	for _, c := range []struct {
		name string
		op   uint8
		arg  uint32
	}{{"OpMapWritable", proto.OpMapWritable, 0}, {"writable OpMapPin", proto.OpMapPin, 16 | proto.MapPinWritable}} {
		if res, _, err := client.IOCall(ro, c.op, c.arg, 0, false); err != nil || res != -int64(syscall.EBADF) {
			t.Fatalf("%s of a read-only handle: %d, %v, want EBADF", c.name, res, err)
		}
	}
	if res, _, err := client.IOCall(f, proto.OpMapSync, 16, 0, false); err != nil || res != -int64(syscall.EINVAL) {
		t.Fatalf("OpMapSync with no writable pin: %d, %v, want EINVAL", res, err)
	}
	if res, _, err := client.IOCall(f, proto.OpMapPin, 16|proto.MapPinWritable, 0, false); err != nil || res != 0 {
		t.Fatalf("writable OpMapPin: %d, %v", res, err)
	}
	_, rw, err := client.IOCall(f, proto.OpMapWritable, 0, 0, true)
	if err != nil || rw == nil {
		t.Fatalf("OpMapWritable: %v", err)
	}
	defer rw.Close()
	mem, err := unix.Mmap(int(rw.Fd()), 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("writable mmap of the data memfd: %v", err)
	}
	defer unix.Munmap(mem)
	copy(mem[4090:], "STORED")
	got := make([]byte, 6)
	if _, err := f.ReadAt(got, 4090); err != nil || string(got) != "STORED" {
		t.Fatalf("a read after a store through the mapping: %q, %v", got, err)
	}
	if _, err := ro.ReadAt(got, 4090); err != nil || string(got) != "STORED" {
		t.Fatalf("another handle's read after a store: %q, %v", got, err)
	}
	// Hostile uses of the description.
	if err := rw.Truncate(0); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("shrinking the data memfd: %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(rw.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("sealing the data memfd: %v, want EPERM", err)
	}
	fi, err := rw.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.Truncate(fi.Size() + 1<<20); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("growing the data memfd: %v, want EPERM", err)
	}
	// Stores far past the region's capacity take memory only until the
	// next scrub.
	var sb unix.Stat_t
	blocks := func() int64 {
		if err := unix.Fstat(int(rw.Fd()), &sb); err != nil {
			t.Fatal(err)
		}
		return sb.Blocks * 512
	}
	before := blocks()
	far, err := unix.Mmap(int(rw.Fd()), 1<<40, 8<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mapping the data memfd at 1 TiB: %v", err)
	}
	// (io's own scrub, once a second, may punch them between the stores
	// and the look: store again.)
	grown := before
	for try := 0; try < 5 && grown < before+8<<20; try++ {
		for i := 0; i < len(far); i += 4096 {
			far[i] = 1
		}
		grown = blocks()
	}
	unix.Munmap(far)
	if grown < before+8<<20 {
		t.Fatalf("stores past the capacity took %d bytes, want 8 MiB", grown-before)
	}
	st.IO.ScrubCache()
	if after := blocks(); after > before {
		t.Fatalf("after a scrub the data memfd holds %d bytes, %d before the stores past the capacity", after, before)
	}
	// A read-only pin beside the writable one of the same range: each
	// unpin takes back its own kind (the writable one's pages made dirty),
	// so a second read-only unpin finds none, and the writable pin is
	// still there for its unpin below.
	if res, _, err := client.IOCall(f, proto.OpMapPin, 16, 0, false); err != nil || res != 0 {
		t.Fatalf("read-only OpMapPin: %d, %v", res, err)
	}
	for i, want := range []int64{0, -int64(syscall.EINVAL)} {
		if res, _, err := client.IOCall(f, proto.OpMapUnpin, 16, 0, false); err != nil || res != want {
			t.Fatalf("read-only OpMapUnpin %d: %d, %v, want %d", i+1, res, err, want)
		}
	}
	if _, err := unix.FcntlInt(rw.Fd(), unix.F_SETFL, unix.O_APPEND); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("written"), 70<<10); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, 7)
	if _, err := ro.ReadAt(got, 70<<10); err != nil || string(got) != "written" {
		t.Fatalf("a write after O_APPEND on the client's description: %q, %v", got, err)
	}
	if res, _, err := client.IOCall(f, proto.OpMapSync, 16, 0, false); err != nil || res != 0 {
		t.Fatalf("OpMapSync: %d, %v", res, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if res, _, err := client.IOCall(f, proto.OpMapUnpin, 16|proto.MapPinWritable, 0, false); err != nil || res != 0 {
		t.Fatalf("OpMapUnpin of the writable pin: %d, %v", res, err)
	}
	all := make([]byte, 64<<10)
	if _, err := ro.ReadAt(all, 0); err != nil || !bytes.Equal(all[4090:4096], []byte("STORED")) {
		t.Fatalf("read back after unpin: %v", err)
	}
	// The region's meta memfd is still read-only to a writer.
	if mf := client.CacheFile(f); mf != nil {
		if _, err := unix.Mmap(int(mf.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, unix.EACCES) {
			t.Fatalf("writable mmap of the meta memfd by a writer: %v, want EACCES", err)
		}
	}
}

// TestStoresPastTheEndReadZeros: bytes a client stores through a
// writable mapping past the file's end (in its last page, or in a page
// wholly past it) are not the file's: an extension by truncate reads
// zeros there, and so does a write that caches such a page anew around
// its own bytes (Linux: SIGBUS past the last page, zeros at extension).
func TestStoresPastTheEndReadZeros(t *testing.T) {
	fsys, _ := newFS(t)
	f, err := fsys.Create("tail")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte("a"), 100), 0); err != nil {
		t.Fatal(err)
	}
	mem := writableMapping(t, f, 4)
	copy(mem[200:], "PAST-THE-END")
	copy(mem[4096+50:], "PAGE-ONE")
	copy(mem[3*4096:], "PAGE3!")
	if err := f.Truncate(8192); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8192)
	if n, err := f.ReadAt(got, 0); n != len(got) {
		t.Fatal(n, err)
	}
	if !bytes.Equal(got[:100], bytes.Repeat([]byte("a"), 100)) || !allZeros(got[100:]) {
		t.Fatalf("after the extension, bytes past the old end are not zeros: %q", bytes.Trim(got[100:], "\x00"))
	}
	if _, err := f.WriteAt([]byte("Z"), 3*4096+7); err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 4096)
	if n, err := f.ReadAt(page, 3*4096); n != 8 {
		t.Fatal(n, err)
	}
	if page[7] != 'Z' || !allZeros(page[:7]) {
		t.Fatalf("a write into a page past the end shows other bytes: %q", bytes.Trim(page, "\x00"))
	}
}

func allZeros(b []byte) bool { return len(bytes.Trim(b, "\x00")) == 0 }

// writableMapping pins the first pages pages of f writable and maps them
// from the data memfd read-write (as the shim's writable MAP_SHARED
// mapping does); the mapping goes with the test.
func writableMapping(t *testing.T, f *client.File, pages uint32) []byte {
	t.Helper()
	if res, _, err := client.IOCall(f, proto.OpMapPin, pages|proto.MapPinWritable, 0, false); err != nil || res != 0 {
		t.Fatalf("writable OpMapPin: %d, %v", res, err)
	}
	_, rw, err := client.IOCall(f, proto.OpMapWritable, 0, 0, true)
	if err != nil || rw == nil {
		t.Fatalf("OpMapWritable: %v", err)
	}
	defer rw.Close()
	mem, err := unix.Mmap(int(rw.Fd()), 0, int(pages)*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}
