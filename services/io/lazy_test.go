package iosvc

import (
	"errors"
	"io"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/mem"
)

func TestLazyBlob(t *testing.T) {
	be := mem.New()
	defer be.Close()
	l := &lazyBlob{be: be, id: 7}
	if n, err := l.ReadAt(make([]byte, 4), 0); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read of a lazy blob: %d %v", n, err)
	}
	if err := l.Truncate(0); err != nil || l.Size() != 0 || l.Sync() != nil {
		t.Fatalf("truncate to 0: %v", err)
	}
	if ids, _ := be.List(); len(ids) != 0 {
		t.Fatalf("blob created before any write: %v", ids)
	}
	if err := l.Truncate(-1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("negative truncate: %v", err)
	}
	if _, err := l.WriteAt([]byte("data"), 10); err != nil {
		t.Fatal(err)
	}
	if ids, _ := be.List(); len(ids) != 1 || ids[0] != backend.BlobID(7) || l.Size() != 14 {
		t.Fatalf("after write: blobs %v size %d", ids, l.Size())
	}
	buf := make([]byte, 4)
	if _, err := l.ReadAt(buf, 10); err != nil || string(buf) != "data" {
		t.Fatalf("read back %q %v", buf, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Growing truncate materializes too.
	l2 := &lazyBlob{be: be, id: 8}
	if err := l2.Truncate(100); err != nil || l2.Size() != 100 {
		t.Fatalf("growing truncate: %v size %d", err, l2.Size())
	}
	l2.Close()
}

// TestLazyBlobNeverAdopts: a blob that appears under the id of a lazy blob
// before its first write (another process on the store, or a bug) is not
// taken for the file's data: the write fails with EIO, is reported, and
// the blob's bytes are untouched.
func TestLazyBlobNeverAdopts(t *testing.T) {
	be := mem.New()
	defer be.Close()
	var reported []backend.BlobID
	l := &lazyBlob{be: be, id: 9, adopted: func(id backend.BlobID, err error) { reported = append(reported, id) }}
	if err := be.Create(9); err != nil {
		t.Fatal(err)
	}
	b, _ := be.Open(9)
	b.WriteAt([]byte("someone else's"), 0)
	b.Close()
	if _, err := l.WriteAt([]byte("mine"), 0); !errors.Is(err, errAdoption) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("first write over an existing blob: %v, want EIO (errAdoption)", err)
	}
	if len(reported) != 1 || reported[0] != 9 {
		t.Fatalf("reported %v, want [9]", reported)
	}
	b, _ = be.Open(9)
	got := make([]byte, 14)
	b.ReadAt(got, 0)
	b.Close()
	if string(got) != "someone else's" {
		t.Fatalf("the existing blob now holds %q", got)
	}
}
