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
