package main

import (
	"fmt"
	"io"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/file"
)

// Target names, in the order of the tables.
const (
	targetRaw            = "raw"
	targetFile           = "file"
	targetWeirFile       = "weir-file"
	targetSPDKAio        = "spdk-aio"
	targetSPDKMalloc     = "spdk-malloc"
	targetSPDKMallocCGO  = "spdk-malloc-cgocb"
	targetWeirSPDKAio    = "weir-spdk-aio"
	targetWeirSPDKMalloc = "weir-spdk-malloc"
	targetSPDKDev        = "spdk-dev" // the -spdk-config bdev, in place of spdk-aio
	targetWeirSPDKDev    = "weir-spdk-dev"
)

// devTargets are the names of the SPDK device rows of s: on the built-in
// aio bdev, or on the bdev of -spdk-config.
func devTargets(s settings) (spdkDev, weirDev string) {
	if s.SPDKConfig != "" {
		return targetSPDKDev, targetWeirSPDKDev
	}
	return targetSPDKAio, targetWeirSPDKAio
}

// device is what a row drives: backend.Blob has these two methods.
type device interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
}

// target is one column of the comparison. dev is nil when the target is
// not available (na says why) or failed to start (err).
type target struct {
	name  string
	dev   device
	na    string
	err   string
	close func() error
}

// rawFile is pread/pwrite on an O_DIRECT file descriptor: the floor.
type rawFile struct{ fd int }

func (r rawFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := unix.Pread(r.fd, p, off)
	if err == nil && n < len(p) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (r rawFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := unix.Pwrite(r.fd, p, off)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

// alignedBuf returns n bytes of page-aligned memory (anonymous mmap), as
// O_DIRECT needs.
func alignedBuf(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		panic(fmt.Sprintf("mmap %d bytes: %v", n, err))
	}
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// fill writes size bytes from offset 0 in 1 MiB writes: every target's data
// is really written before any row, so reads hit allocated blocks.
func fill(d device, size int64) error {
	buf := alignedBuf(mib)
	defer unix.Munmap(buf)
	for off := int64(0); off < size; off += mib {
		n := min(int64(mib), size-off)
		if _, err := d.WriteAt(buf[:n], off); err != nil {
			return fmt.Errorf("fill at %d: %w", off, err)
		}
	}
	return nil
}

// newRaw creates dir/raw.dat, fills it and fsyncs it.
func newRaw(dir string, size int64) target {
	t := target{name: targetRaw}
	path := filepath.Join(dir, "raw.dat")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.err = fmt.Sprintf("open %s with O_DIRECT: %v", path, err)
		return t
	}
	r := rawFile{fd}
	if err := fill(r, size); err == nil {
		err = unix.Fsync(fd)
	} else {
		unix.Close(fd)
		t.err = err.Error()
		return t
	}
	t.dev, t.close = r, func() error { return unix.Close(fd) }
	return t
}

// newFile opens the file backend in dir/file with O_DIRECT required, and
// one filled blob.
func newFile(dir string, size int64) target {
	t := target{name: targetFile}
	be, err := file.New(file.Options{Dir: filepath.Join(dir, "file"), Direct: file.DirectOn})
	if err != nil {
		t.err = err.Error()
		return t
	}
	b, err := blobOf(be, size)
	if err != nil {
		be.Close()
		t.err = err.Error()
		return t
	}
	t.dev = b
	t.close = func() error { b.Close(); return be.Close() }
	return t
}

// blobOf creates blob 1 on be, fills it with size bytes and syncs it.
func blobOf(be backend.Backend, size int64) (backend.Blob, error) {
	if err := be.Create(1); err != nil {
		return nil, err
	}
	b, err := be.Open(1)
	if err != nil {
		return nil, err
	}
	if err := fill(b, size); err != nil {
		b.Close()
		return nil, err
	}
	if err := b.Sync(); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}
