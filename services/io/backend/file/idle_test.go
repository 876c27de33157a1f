package file_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/file"
)

// TestIdleFiles: a blob whose last handle closed stays open (so that an
// Open of it again costs no system call), at most maxIdleFiles of them;
// an idle one reads what was written, is deleted at once (no EBUSY), and
// a blob with a handle still is not.
func TestIdleFiles(t *testing.T) {
	file.SetMaxIdleFiles(t, 3)
	dir := t.TempDir()
	be, err := file.New(file.Options{Dir: dir, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && filepath.HasPrefix(l, dir) {
				n++
			}
		}
		return n
	}
	base := fds()
	for id := backend.BlobID(1); id <= 5; id++ {
		if err := be.Create(id); err != nil {
			t.Fatal(err)
		}
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.WriteAt([]byte(fmt.Sprintf("blob %d", id)), 0); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := file.Idle(be); n != 3 {
		t.Fatalf("%d blobs kept idle, want 3 (the bound)", n)
	}
	if n := fds() - base; n < 3 || n > 6 {
		t.Fatalf("%d descriptors open for 3 idle blobs, want 3 to 6 (each may hold a second one for unaligned edges)", n)
	}
	// An idle one and one closed for good both read what was written.
	for _, id := range []backend.BlobID{5, 1} {
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 6)
		if n, err := b.ReadAt(buf, 0); n != 6 || string(buf) != fmt.Sprintf("blob %d", id) {
			t.Fatalf("blob %d read %q, %v", id, buf[:n], err)
		}
		if id == 5 {
			if err := be.Delete(5); !errors.Is(err, syscall.EBUSY) {
				t.Fatalf("delete of a blob with a handle: %v, want EBUSY", err)
			}
		}
		b.Close()
	}
	if err := be.Delete(5); err != nil {
		t.Fatalf("delete of an idle blob: %v", err)
	}
	if _, err := be.Open(5); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("open of a deleted idle blob: %v, want ENOENT", err)
	}
	if n := file.Idle(be); n != 2 {
		t.Fatalf("%d idle after the delete, want 2", n)
	}
}
