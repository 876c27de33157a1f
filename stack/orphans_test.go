package stack_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/file"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// TestOrphanBlobsReclaimedAtStart: blobs that no file owns, as a crash
// can leave (a create whose record was lost; a delete lost some other
// way), are found by the scan at start, counted in orphans_found, and
// deleted; files are untouched, a new file gets neither's number (nor its
// data), and `weir check` is clean after.
func TestOrphanBlobsReclaimedAtStart(t *testing.T) {
	c := stacktest.Config(t, "")
	log := hclog.NewNullLogger()
	st, err := stack.Start(c, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile("keep", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	fsys.Close()
	next := st.Metadata.NS().NextIno()
	if err := st.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	be, err := file.New(file.Options{Dir: c.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	// One that the last life could have created (a lost create), one far
	// past anything it was allowed to (the allocation limit).
	strays := []backend.BlobID{backend.BlobID(next), backend.BlobID(next + 100000)}
	for _, id := range strays {
		if err := be.Create(id); err != nil {
			t.Fatal(err)
		}
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.WriteAt([]byte("someone's lost data"), 0); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	if err := be.Sync(); err != nil {
		t.Fatal(err)
	}
	be.Close()

	st, err = stack.Start(c, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s (metadata stats %v)", what, st.Metadata.Snapshot())
			}
		}
	}
	waitFor("two orphans found", func() bool { return toUint(st.Metadata.Snapshot()["orphans_found"]) == 2 })
	waitFor("the orphans deleted", func() bool { return len(st.Metadata.NS().PendingDeletes()) == 0 })
	fsys, err = client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if b, err := fsys.ReadFile("keep"); err != nil || string(b) != "kept" {
		t.Fatalf("keep reads %q, %v", b, err)
	}
	// A new file never gets a stray's number, so never its data.
	f, err := fsys.Create("new")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil || fi.Size() != 0 {
		t.Fatalf("a new file: %v %v", fi, err)
	}
	for _, id := range strays {
		if ino := fi.Sys().(*syscall.Stat_t).Ino; ino == uint64(id) {
			t.Errorf("the new file has inode %d, a stray blob's number", ino)
		}
	}
	f.Close()
	fsys.Close()
	if err := st.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if code, r, errOut := weirCheck(t, c); code != 0 || len(r.Problems) != 0 {
		t.Fatalf("weir check: exit %d %+v %s", code, r, errOut)
	}
}
