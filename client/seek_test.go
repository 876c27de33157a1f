package client_test

import (
	"errors"
	"io"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/services/io/backend"
)

// TestSeekBoundedByLargestFile: a file's offsets stop at weir's largest
// file (proto.MaxFileSize, io's largest blob), as Linux's stop at a file
// system's s_maxbytes: a seek to it works, a seek past it is EINVAL from
// any whence and leaves the offset, a write ending at it works and one at
// it is EFBIG (conformance case rw/seek_past_largest_file_einval compares
// the same with the kernel).
func TestSeekBoundedByLargestFile(t *testing.T) {
	if proto.MaxFileSize != backend.MaxBlobSize {
		t.Fatalf("proto.MaxFileSize %d, but io stores blobs of up to %d bytes", proto.MaxFileSize, backend.MaxBlobSize)
	}
	c, _ := newFS(t) // the memory backend: its blobs reach MaxBlobSize
	f, err := c.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	max := proto.MaxFileSize
	if pos, err := f.Seek(max, io.SeekStart); err != nil || pos != max {
		t.Fatalf("seek to the largest offset: %d %v", pos, err)
	}
	for _, s := range []struct {
		off    int64
		whence int
	}{{max + 1, io.SeekStart}, {1 << 62, io.SeekStart}, {1, io.SeekCurrent}, {max - 9, io.SeekEnd}} {
		if _, err := f.Seek(s.off, s.whence); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("seek %d whence %d past the largest file: %v, want EINVAL", s.off, s.whence, err)
		}
	}
	if pos, err := f.Seek(0, io.SeekCurrent); err != nil || pos != max {
		t.Errorf("failed seeks moved the offset to %d (%v), want %d", pos, err, max)
	}
	if _, err := f.WriteAt([]byte("x"), max); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("write at the largest offset: %v, want EFBIG", err)
	}
	if n, err := f.WriteAt([]byte("x"), max-1); err != nil || n != 1 {
		t.Fatalf("write of the largest file's last byte: %d %v", n, err)
	}
	if pos, err := f.Seek(0, io.SeekEnd); err != nil || pos != max {
		t.Errorf("seek to the end of the largest file: %d %v", pos, err)
	}
	if err := f.Truncate(10); err != nil {
		t.Fatal(err)
	}
	// A directory's offset is a place in its listing, not bounded so.
	d, err := c.OpenFile(".", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Seek(1<<62, io.SeekStart); err != nil {
		t.Errorf("seek of a directory to 2^62: %v", err)
	}
}
