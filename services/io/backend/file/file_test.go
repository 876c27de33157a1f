package file_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	hclog "github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/backendtest"
	"github.com/weir-storage/weir/services/io/backend/file"
)

// fsInfo describes the file system of dir, found without the backend's help.
type fsInfo struct {
	name   string
	tmpfs  bool
	direct bool // the kernel accepts an aligned O_DIRECT write here
}

func probeFS(t *testing.T, dir string) fsInfo {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", dir, err)
	}
	info := fsInfo{name: "other", tmpfs: st.Type == unix.TMPFS_MAGIC}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		info.name = "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		info.name = "ext2/3/4"
	case unix.XFS_SUPER_MAGIC:
		info.name = "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		info.name = "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		info.name = "overlayfs"
	}
	path := filepath.Join(dir, "probe")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err == nil {
		buf, _ := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		_, werr := unix.Pwrite(fd, buf, 0)
		info.direct = werr == nil
		unix.Munmap(buf)
		unix.Close(fd)
	}
	os.Remove(path)
	return info
}

// shmDir returns a fresh directory on /dev/shm, or skips.
func shmDir(t *testing.T) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil {
		t.Skipf("/dev/shm is missing (%v): the tmpfs fallback to buffered I/O is not exercised", err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		t.Skipf("/dev/shm is not tmpfs (f_type %#x): the tmpfs fallback to buffered I/O is not exercised", st.Type)
	}
	dir, err := os.MkdirTemp("/dev/shm", "weir-backend-test-")
	if err != nil {
		t.Skipf("cannot make a directory on /dev/shm (%v): the tmpfs fallback is not exercised", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// factory makes file backends in fresh directories from mkdir, with the
// given direct mode, and checks each lands in wantMode.
func factory(mkdir func(t *testing.T) string, mode, wantMode file.DirectMode) backendtest.Factory {
	var mu sync.Mutex
	dirs := map[backend.Backend]string{}
	open := func(t *testing.T, dir string) backend.Backend {
		be, err := file.New(file.Options{Dir: dir, Direct: mode, Logger: hclog.NewNullLogger()})
		if err != nil {
			t.Fatalf("file.New(%s): %v", dir, err)
		}
		if got := be.(*file.Backend).Mode(); got != wantMode {
			t.Fatalf("file.New(%s, direct %s): mode %s, want %s", dir, mode, got, wantMode)
		}
		mu.Lock()
		dirs[be] = dir
		mu.Unlock()
		return be
	}
	return backendtest.Factory{
		New: func(t *testing.T) backend.Backend { return open(t, mkdir(t)) },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			mu.Lock()
			dir := dirs[old]
			mu.Unlock()
			if err := old.Close(); err != nil {
				t.Fatalf("Close before reopen: %v", err)
			}
			return open(t, dir)
		},
	}
}

// TestConformance runs the backend suite on the test's temporary directory
// (a disk file system: O_DIRECT expected where the kernel accepts it) and
// on tmpfs (where DirectAuto must fall back to buffered I/O).
func TestConformance(t *testing.T) {
	t.Run("tempdir", func(t *testing.T) {
		info := probeFS(t, t.TempDir())
		want := file.DirectOff
		if info.direct && !info.tmpfs {
			want = file.DirectOn
		}
		t.Logf("temp dir is %s; O_DIRECT accepted: %v; expecting mode %s", info.name, info.direct, want)
		backendtest.Run(t, factory(func(t *testing.T) string { return t.TempDir() }, file.DirectAuto, want))
	})
	t.Run("tmpfs", func(t *testing.T) {
		shmDir(t)
		backendtest.Run(t, factory(shmDir, file.DirectAuto, file.DirectOff))
	})
	// Linux 6.6 and later accept O_DIRECT on tmpfs: there DirectOn runs
	// the aligned bounce-buffer path even when the temp dir cannot.
	t.Run("tmpfs-direct", func(t *testing.T) {
		if info := probeFS(t, shmDir(t)); !info.direct {
			t.Skip("tmpfs refuses O_DIRECT on this kernel (before Linux 6.6): DirectOn cannot run there")
		}
		backendtest.Run(t, factory(shmDir, file.DirectOn, file.DirectOn))
	})
}

// directBackend returns a backend using O_DIRECT in a temp dir, else on
// tmpfs, else skips.
func directBackend(t *testing.T) (backend.Backend, string) {
	t.Helper()
	for _, dir := range []string{t.TempDir(), ""} {
		if dir == "" {
			dir = shmDir(t)
		}
		be, err := file.New(file.Options{Dir: dir, Direct: file.DirectOn})
		if errors.Is(err, syscall.EINVAL) {
			t.Logf("%s refuses O_DIRECT: %v", dir, err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		return be, dir
	}
	t.Skip("neither the temp dir nor /dev/shm accepts O_DIRECT: the edge read-modify-write path cannot be observed")
	return nil, ""
}

// createOpen creates blob id and opens it for the rest of the test.
func createOpen(t *testing.T, be backend.Backend, id backend.BlobID) backend.Blob {
	t.Helper()
	if err := be.Create(id); err != nil {
		t.Fatal(err)
	}
	h, err := be.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestEdgeOnlyRMW checks that an O_DIRECT write reads only its partial
// edge blocks, and only those holding data.
func TestEdgeOnlyRMW(t *testing.T) {
	be, _ := directBackend(t)
	fb := be.(*file.Backend)
	h := createOpen(t, be, 1)
	var model []byte
	step := func(what string, off int64, n int, wantReads, wantWrites uint64) {
		t.Helper()
		p := bytes.Repeat([]byte{byte(len(model)%251 + 1)}, n)
		before := fb.Stats()
		if _, err := h.WriteAt(p, off); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		after := fb.Stats()
		if r, w := after.EdgeReads-before.EdgeReads, after.EdgeWrites-before.EdgeWrites; r != wantReads || w != wantWrites {
			t.Errorf("%s: %d edge reads, %d edge writes; want %d, %d", what, r, w, wantReads, wantWrites)
		}
		if end := int(off) + n; end > len(model) {
			model = append(model, make([]byte, end-len(model))...)
		}
		copy(model[off:], p)
	}
	step("aligned 8 KiB at 4096", 4096, 8192, 0, 0)
	step("10 bytes at 4090 (blocks 0 and 1, both below the size)", 4090, 10, 2, 2)
	step("10 bytes at 20000 (block 4, past the size)", 20000, 10, 0, 1)
	step("3 blocks at 100 (edges 0 and 3; blocks 1 and 2 whole)", 100, 3*4096, 2, 2)
	step("10000 bytes at 20000 (head below the size, tail past it)", 20000, 10000, 1, 2)
	step("aligned 1 MiB at 1 MiB past the end", 1<<20, 1<<20, 0, 0)
	step("1 byte inside block 5", 5*4096+7, 1, 1, 1)

	got := make([]byte, len(model))
	if n, err := h.ReadAt(got, 0); n != len(model) || err != nil || !bytes.Equal(got, model) {
		t.Fatalf("read back: %d, %v, equal %v", n, err, bytes.Equal(got, model))
	}
	if !fb.Stats().Direct {
		t.Fatal("Stats().Direct is false with DirectOn")
	}
}

// TestNeverLongerOnDisk: with O_DIRECT, no write makes the blob's file
// longer than the blob, not even between its device writes: a crash
// there would leave zeros past the end, and the next open takes the
// file's size for the blob's (TestCrash found one: a SIGKILL of io
// between the whole last block's write and the cut back).
func TestNeverLongerOnDisk(t *testing.T) {
	be, _ := directBackend(t)
	h := createOpen(t, be, 1)
	var limit, worst atomic.Int64
	file.SetAfterWriteHook(func(onDisk int64) {
		if onDisk > limit.Load() && onDisk > worst.Load() {
			worst.Store(onDisk)
		}
	})
	defer file.SetAfterWriteHook(nil)
	size := int64(0)
	for _, w := range []struct{ off, n int64 }{
		{0, 100}, {100, 5000}, {23137, 432}, {23000, 9000}, {40000, 4096}, {8192, 4096}, {65536, 1},
	} {
		end := max(size, w.off+w.n)
		limit.Store(end)
		if _, err := h.WriteAt(bytes.Repeat([]byte{7}, int(w.n)), w.off); err != nil {
			t.Fatal(err)
		}
		if got := worst.Load(); got != 0 {
			t.Fatalf("write of %d bytes at %d: the file was %d bytes on disk during it, the blob %d", w.n, w.off, got, end)
		}
		if h.Size() != end {
			t.Fatalf("blob size %d, want %d", h.Size(), end)
		}
		size = end
	}
	got := make([]byte, size)
	if n, err := h.ReadAt(got, 0); int64(n) != size || (err != nil && err != io.EOF) {
		t.Fatalf("read back %d, %v", n, err)
	}
}

// TestFallback simulates a file system that refuses O_DIRECT.
func TestFallback(t *testing.T) {
	dir := t.TempDir()
	be, err := file.New(file.RefuseDirect(file.Options{Dir: dir}))
	if err != nil {
		t.Fatalf("DirectAuto with O_DIRECT refused: %v", err)
	}
	if m := be.(*file.Backend).Mode(); m != file.DirectOff {
		t.Fatalf("mode %s after a refused probe, want off", m)
	}
	if err := be.Create(1); err != nil {
		t.Fatal(err)
	}
	h, err := be.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.WriteAt([]byte("x"), 4095); err != nil {
		t.Fatal(err)
	}
	h.Close()
	be.Close()

	_, err = file.New(file.RefuseDirect(file.Options{Dir: dir, Direct: file.DirectOn}))
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("DirectOn with O_DIRECT refused: %v, want EINVAL", err)
	}
	if be, err := file.New(file.Options{Dir: dir, Direct: file.DirectOff}); err != nil {
		t.Fatalf("DirectOff: %v", err)
	} else {
		be.Close()
	}
}

// TestStickySync fails one blob sync through the test hook and checks that
// the failure stays.
func TestStickySync(t *testing.T) {
	be, err := file.New(file.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	for _, id := range []backend.BlobID{1, 2} {
		if err := be.Create(id); err != nil {
			t.Fatal(err)
		}
	}
	h1, _ := be.Open(1)
	h2, _ := be.Open(2)
	if _, err := h1.WriteAt([]byte("data"), 0); err != nil {
		t.Fatal(err)
	}
	file.SetSyncHook(be, func(id backend.BlobID) error {
		if id == 1 {
			return syscall.EIO
		}
		return nil
	})
	if err := h1.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Sync with the hook failing: %v, want EIO", err)
	}
	file.SetSyncHook(be, nil) // the device "recovers"
	if err := h1.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("second Sync: %v, want the sticky EIO", err)
	}
	other, _ := be.Open(1)
	if err := other.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Sync through another handle: %v, want the sticky EIO", err)
	}
	if err := h2.Sync(); err != nil {
		t.Fatalf("Sync of another blob: %v", err)
	}
	h1.Close()
	other.Close()
	again, err := be.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Sync after closing and reopening the blob: %v, want the sticky EIO", err)
	}
	again.Close()
	if n := be.(*file.Backend).Stats().SyncErrors; n != 1 {
		t.Fatalf("SyncErrors = %d, want 1", n)
	}
	// Delete forgets: a new blob with the id syncs.
	if err := be.Delete(1); err != nil {
		t.Fatal(err)
	}
	if err := be.Create(1); err != nil {
		t.Fatal(err)
	}
	fresh, _ := be.Open(1)
	if err := fresh.Sync(); err != nil {
		t.Fatalf("Sync of a re-created blob: %v", err)
	}
	fresh.Close()
	h2.Close()
}

// TestLayout checks the on-disk names the package comment documents.
func TestLayout(t *testing.T) {
	dir := t.TempDir()
	be, err := file.New(file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if err := be.Create(0x1ff); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs", "ff", "00000000000001ff")); err != nil {
		t.Fatalf("blob 0x1ff: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "blobs", "FORMAT")); err != nil || string(got) != "weir-blobs 1\n" {
		t.Fatalf("FORMAT = %q, %v", got, err)
	}
	// Strays are not blobs.
	for _, p := range []string{"ff/junk", "ff/0000000000000100", "ff/00000000000001FF", "zz/0000000000000001", "stray"} {
		path := filepath.Join(dir, "blobs", p)
		os.MkdirAll(filepath.Dir(path), 0o700)
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := be.List()
	if err != nil || len(ids) != 1 || ids[0] != 0x1ff {
		t.Fatalf("List() = %v, %v; want [511]", ids, err)
	}
}

// TestSparseOnDisk checks that a hole in a blob is a hole in its file.
func TestSparseOnDisk(t *testing.T) {
	dir := t.TempDir()
	be, err := file.New(file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if err := be.Create(5); err != nil {
		t.Fatal(err)
	}
	h, _ := be.Open(5)
	defer h.Close()
	if _, err := h.WriteAt([]byte("0123456789"), 5<<30); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "blobs", "05", "0000000000000005"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 5<<30+10 || st.Blocks*512 > 1<<20 {
		t.Fatalf("file size %d, %d bytes allocated; want %d, at most 1 MiB", st.Size, st.Blocks*512, int64(5<<30+10))
	}
}

// TestDirectoryLock checks that two backends never share a directory.
func TestDirectoryLock(t *testing.T) {
	dir := t.TempDir()
	be, err := file.New(file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := file.New(file.Options{Dir: dir}); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("second New on one directory: %v, want EBUSY", err)
	}
	be.Close()
	be, err = file.New(file.Options{Dir: dir})
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	be.Close()
}

// TestFormatVersion checks that New refuses a layout it does not know.
func TestFormatVersion(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "blobs"), 0o700)
	if err := os.WriteFile(filepath.Join(dir, "blobs", "FORMAT"), []byte("weir-blobs 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := file.New(file.Options{Dir: dir}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("New on format 2: %v, want EINVAL", err)
	}
	if _, err := file.New(file.Options{}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("New without a directory: %v, want EINVAL", err)
	}
}

// TestZeroCopyAligned: with O_DIRECT, a block-aligned range in block-aligned
// memory (as ring arena blocks are) skips the bounce buffer both ways;
// unaligned memory still goes through it.
func TestZeroCopyAligned(t *testing.T) {
	be, _ := directBackend(t)
	fb := be.(*file.Backend)
	h := createOpen(t, be, 1)
	mem, err := unix.Mmap(-1, 0, 3*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	src := mem[:2*4096]
	for i := range src {
		src[i] = byte(i % 253)
	}
	before := fb.Stats()
	if _, err := h.WriteAt(src, 4096); err != nil {
		t.Fatal(err)
	}
	dst := mem[2*4096 : 3*4096]
	if _, err := h.ReadAt(dst, 8192); err != nil {
		t.Fatal(err)
	}
	after := fb.Stats()
	if w, r := after.DirectWrites-before.DirectWrites, after.DirectReads-before.DirectReads; w != 1 || r != 1 {
		t.Fatalf("aligned memory: %d direct writes, %d direct reads; want 1, 1", w, r)
	}
	if !bytes.Equal(dst, src[4096:]) {
		t.Fatal("zero-copy read returned other bytes than were written")
	}
	// The same range from memory one byte off alignment: bounced, and
	// still correct.
	unaligned := make([]byte, 4096+1)[1:]
	before = fb.Stats()
	if _, err := h.ReadAt(unaligned, 8192); err != nil {
		t.Fatal(err)
	}
	if after := fb.Stats(); after.DirectReads != before.DirectReads || !bytes.Equal(unaligned, src[4096:]) {
		t.Fatalf("unaligned read: direct reads %d -> %d, equal %v", before.DirectReads, after.DirectReads, bytes.Equal(unaligned, src[4096:]))
	}
}

// TestFailedWriteLeavesSize: ext4 with 4 KiB blocks stops files at 16 TiB;
// a write there fails with EFBIG and must leave the blob as it was, size
// included, in both I/O modes (before, the direct mode's cut-back after a
// partial block grew the file to the write's offset).
func TestFailedWriteLeavesSize(t *testing.T) {
	for _, mode := range []file.DirectMode{file.DirectAuto, file.DirectOff} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			be, err := file.New(file.Options{Dir: dir, Direct: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			if err := be.Create(1); err != nil {
				t.Fatal(err)
			}
			b, err := be.Open(1)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if _, err := b.WriteAt([]byte("hello"), 0); err != nil {
				t.Fatal(err)
			}
			_, err = b.WriteAt([]byte("xy"), 1<<44)
			if err == nil {
				t.Skipf("the file system of %s (%s) takes a write at 16 TiB: it has no such limit to fail at", dir, probeFS(t, dir).name)
			}
			if !errors.Is(err, syscall.EFBIG) {
				t.Fatalf("write at 16 TiB: %v, want EFBIG", err)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(dir, "blobs", "01", "0000000000000001"), &st); err != nil {
				t.Fatal(err)
			}
			if b.Size() != 5 || st.Size != 5 {
				t.Fatalf("after the failed write: Size %d, the file %d bytes; want 5", b.Size(), st.Size)
			}
		})
	}
}

// The staging log's blob is written through the page cache even when the
// backend uses O_DIRECT (blobFile.direct says why); every other blob
// keeps O_DIRECT. Its bytes read back as written, unaligned ones too,
// across a reopen of the backend.
func TestStagingBlobIsBuffered(t *testing.T) {
	dir := t.TempDir()
	be, err := file.New(file.Options{Dir: dir, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if be.(*file.Backend).Mode() != file.DirectOn {
		be.Close()
		t.Skipf("the file system of %s refuses O_DIRECT: nothing to tell the staging log's blob from", dir)
	}
	for _, id := range []backend.BlobID{backend.StagingBlob, 1} {
		if err := be.Create(id); err != nil {
			t.Fatal(err)
		}
	}
	data := bytes.Repeat([]byte("staging record "), 1000)
	for _, id := range []backend.BlobID{backend.StagingBlob, 1} {
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		flags, err := file.OpenFlags(b)
		if err != nil {
			t.Fatal(err)
		}
		if direct := flags&unix.O_DIRECT != 0; direct != (id != backend.StagingBlob) {
			t.Fatalf("blob %d: O_DIRECT %v, want %v", id, direct, id != backend.StagingBlob)
		}
		if _, err := b.WriteAt(data, 777); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	if err := be.Sync(); err != nil {
		t.Fatal(err)
	}
	be.Close()
	be, err = file.New(file.Options{Dir: dir, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	for _, id := range []backend.BlobID{backend.StagingBlob, 1} {
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 777+len(data))
		if _, err := b.ReadAt(got, 0); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		b.Close()
		if !bytes.Equal(got[777:], data) || !bytes.Equal(got[:777], make([]byte, 777)) {
			t.Fatalf("blob %d does not read back as written", id)
		}
	}
}

// TestWriteAtDurable: a durable write (O_DIRECT with RWF_DSYNC) of the
// staging log's buffered blob and of an O_DIRECT blob reads back through
// the blob's own descriptor at once (the page cache's copy is
// invalidated), from an unaligned buffer too; ranges it cannot take
// (unaligned, past the size) are errors.ErrUnsupported, and change
// nothing.
func TestWriteAtDurable(t *testing.T) {
	dir := t.TempDir()
	be, err := file.New(file.Options{Dir: dir, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if be.(*file.Backend).Mode() != file.DirectOn {
		t.Skipf("the file system of %s refuses O_DIRECT: no durable write", dir)
	}
	for _, id := range []backend.BlobID{backend.StagingBlob, 1} {
		if err := be.Create(id); err != nil {
			t.Fatal(err)
		}
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Truncate(64 << 10); err != nil {
			t.Fatal(err)
		}
		// Cached first, so that a stale page-cache copy would show.
		if _, err := b.WriteAt(bytes.Repeat([]byte{'o'}, 16<<10), 0); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 8192)
		if _, err := b.ReadAt(got, 4096); err != nil {
			t.Fatal(err)
		}
		dw := b.(backend.DurableWriter)
		rec := append([]byte{0}, bytes.Repeat([]byte{'d'}, 8192)...)[1:] // unaligned
		if n, err := dw.WriteAtDurable(rec, 4096); err != nil || n != 8192 {
			t.Fatalf("blob %d: WriteAtDurable: %d, %v", id, n, err)
		}
		if _, err := b.ReadAt(got, 4096); err != nil || !bytes.Equal(got, rec) {
			t.Fatalf("blob %d: read after the durable write: %q..., %v", id, got[:8], err)
		}
		for _, c := range []struct {
			n   int
			off int64
		}{{100, 0}, {4096, 100}, {4096, 64 << 10}, {8192, 60 << 10}} {
			if _, err := dw.WriteAtDurable(make([]byte, c.n), c.off); !errors.Is(err, errors.ErrUnsupported) {
				t.Fatalf("blob %d: WriteAtDurable of %d bytes at %d: %v, want ErrUnsupported", id, c.n, c.off, err)
			}
		}
		if b.Size() != 64<<10 {
			t.Fatalf("blob %d: size %d after refused durable writes", id, b.Size())
		}
		b.Close()
	}
}

// TestSyncAll: the file backend is a backend.SyncAller (the first syncfs
// of an IO service syncs its whole store with it); a closed backend says
// EBADF.
func TestSyncAll(t *testing.T) {
	be, err := file.New(file.Options{Dir: t.TempDir(), Direct: file.DirectOff})
	if err != nil {
		t.Fatal(err)
	}
	sa, ok := be.(backend.SyncAller)
	if !ok {
		t.Fatal("the file backend is not a backend.SyncAller")
	}
	if err := be.Create(7); err != nil {
		t.Fatal(err)
	}
	if err := sa.SyncAll(); err != nil {
		t.Fatalf("sync all: %v", err)
	}
	be.Close()
	if err := sa.SyncAll(); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("sync all of a closed backend: %v, want EBADF", err)
	}
}
