package stack_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/fsck"
	"github.com/weir-storage/weir/stack/stacktest"
)

// writeSecret runs a stack on c, writes "user A's secret data" to secret,
// and stops it.
func writeSecret(t *testing.T, c *config.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile("secret", []byte("user A's secret data"), 0o600); err != nil {
		t.Fatal(err)
	}
	fsys.Close()
	if err := st.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkSecret runs a stack on c and checks that secret reads back what
// writeSecret wrote.
func checkSecret(t *testing.T, c *config.Config, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	defer st.Shutdown(context.Background())
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if b, err := fsys.ReadFile("secret"); err != nil || string(b) != "user A's secret data" {
		t.Fatalf("%s: secret reads %q, %v", when, b, err)
	}
}

// TestStoreBelongsToOneNamespace (file backend): a store records the stack
// it belongs to, and the IO service refuses to serve it to another
// namespace's metadata service, with a message that says what to do,
// changing nothing in the store: a new namespace over a store that
// records another stack, and a new namespace over a store of blobs that
// records none (written before identities existed); a namespace with
// files over a store that records none (an upgrade) claims it.
func TestStoreBelongsToOneNamespace(t *testing.T) {
	c := stacktest.Config(t, "")
	writeSecret(t, c)
	meta := filepath.Join(c.DataDir, "meta")
	saved := filepath.Join(t.TempDir(), "meta-a")
	if err := os.Rename(meta, saved); err != nil { // a new namespace from here
		t.Fatal(err)
	}
	blobs := filepath.Join(c.DataDir, "blobs")
	refused := func(what, want string) {
		t.Helper()
		before := dataDigest(t, blobs)
		st, err := stack.Start(c, hclog.NewNullLogger())
		if err == nil {
			st.Shutdown(context.Background())
			t.Fatalf("%s: the stack started", what)
		}
		for _, w := range []string{"belongs to another stack", want, "weir format"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", what, err, w)
			}
		}
		if after := dataDigest(t, blobs); !maps.Equal(before, after) {
			t.Errorf("%s: the store changed", what)
		}
		if err := os.RemoveAll(meta); err != nil {
			t.Fatal(err)
		}
	}
	refused("a new namespace over another's store", "it records stack")
	if err := os.Remove(filepath.Join(blobs, "IDENTITY")); err != nil {
		t.Fatal(err)
	}
	refused("a new namespace over a store without identity", "holds 1 blobs")

	// The namespace the blobs are of: it claims the store and reads its file.
	if err := os.Rename(saved, meta); err != nil {
		t.Fatal(err)
	}
	checkSecret(t, c, "the store's own namespace")
	if b, err := os.ReadFile(filepath.Join(blobs, "IDENTITY")); err != nil || !strings.Contains(string(b), "weir-stack ") {
		t.Errorf("the store was not claimed: %q %v", b, err)
	}
}

// TestNewFileNeverAdoptsABlob: a blob that exists under the number of a
// file created since the metadata service started (another namespace's,
// or put there by a bug) is not served as the new file's contents: the
// grant is refused, counted, and the blob's bytes stay unreadable
// through weir.
func TestNewFileNeverAdoptsABlob(t *testing.T) {
	c := stacktest.Config(t, "")
	be := mem.New()
	st, err := stack.StartWith(c, hclog.NewNullLogger(), stack.Hooks{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	// The next file's number gets a blob behind weir's back.
	id := backend.BlobID(st.Metadata.NS().NextIno())
	if err := be.Create(id); err != nil {
		t.Fatal(err)
	}
	b, err := be.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt([]byte("user A's secret data"), 0); err != nil {
		t.Fatal(err)
	}
	b.Close()
	f, err := fsys.OpenFile("new", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64)
	if n, err := f.ReadAt(buf, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a new file read %q (%v) from a blob that was there before it, want EIO", buf[:n], err)
	}
	if fi, err := fsys.Stat("new"); err != nil || fi.Size() != 0 {
		t.Errorf("the new file: %v %v, want size 0", fi, err)
	}
	if n := st.IO.Snapshot()["adoptions_refused"]; n != uint64(1) {
		t.Errorf("adoptions_refused = %v, want 1", n)
	}
}

// TestFormatErasesTheStack (file backend): weir format refuses a running
// stack, and on a stopped one erases the namespace and the store; the next
// start makes a new namespace, which claims the empty store. weir check
// reports a new namespace over an old store (wrong-store) before it.
func TestFormatErasesTheStack(t *testing.T) {
	c := stacktest.Config(t, "")
	writeSecret(t, c)
	meta := filepath.Join(c.DataDir, "meta")
	if err := os.Rename(meta, filepath.Join(t.TempDir(), "meta-a")); err != nil {
		t.Fatal(err)
	}
	if st, err := stack.Start(c, hclog.NewNullLogger()); err == nil { // makes the new namespace
		st.Shutdown(context.Background())
		t.Fatal("a new namespace over another's store started")
	}
	be, err := stack.BackendReadOnly(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	r, err := fsck.Check(c, be, fsck.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.OK() || !slices.ContainsFunc(r.Problems, func(p fsck.Problem) bool { return p.Kind == "wrong-store" }) {
		t.Fatalf("weir check of a new namespace over another's store: %+v, want a wrong-store problem", r.Problems)
	}
	// --repair would take every blob of the other namespace for an orphan.
	before, beforeNS := dataDigest(t, filepath.Join(c.DataDir, "blobs")), dataDigest(t, meta)
	if be, err = stack.Backend(c, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	if _, err := fsck.Check(c, be, fsck.Options{Repair: true}); err == nil || !strings.Contains(err.Error(), "--repair refused") {
		t.Fatalf("weir check --repair over another namespace's store: %v, want a refusal", err)
	}
	if after := dataDigest(t, filepath.Join(c.DataDir, "blobs")); !maps.Equal(before, after) {
		t.Fatal("weir check --repair changed another namespace's store")
	}
	if after := dataDigest(t, meta); !maps.Equal(beforeNS, after) {
		t.Fatal("the refused weir check --repair changed the namespace")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	os.RemoveAll(meta)
	// A running stack (over an empty namespace and no store) is not erased.
	c2 := stacktest.Config(t, "")
	st, err := stack.Start(c2, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := stack.Format(c2, hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "stop weir first") {
		t.Errorf("format of a running stack: %v, want a refusal", err)
	}
	st.Shutdown(ctx)

	if err := stack.Format(c, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(c.DataDir, "blobs")); len(ents) != 1 || ents[0].Name() != "LOCK" {
		t.Fatalf("the store after format holds %v", ents)
	}
	st, err = stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("start after format: %v", err)
	}
	defer st.Shutdown(context.Background())
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if _, err := fsys.ReadFile("secret"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("secret after format: %v, want ENOENT", err)
	}
	if err := fsys.WriteFile("after", []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(c.DataDir, "blobs", "IDENTITY")); err != nil || !strings.Contains(string(b), "weir-stack ") {
		t.Errorf("the new namespace did not claim the store: %q %v", b, err)
	}
}

// TestFileStoreFailedOpenChangesNothing (file backend): a store whose
// FORMAT label is lost or unreadable, or whose IDENTITY label is
// unreadable or damaged, is not served and not rewritten: the services do
// not start, the error names the cause, and weir check's read-only open
// changes nothing either; with the label back, the file is there.
func TestFileStoreFailedOpenChangesNothing(t *testing.T) {
	c := stacktest.Config(t, "")
	writeSecret(t, c)
	blobs := filepath.Join(c.DataDir, "blobs")
	label := func(name string) string { return filepath.Join(blobs, name) }
	read := func(name string) []byte {
		b, err := os.ReadFile(label(name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	format, identity := read("FORMAT"), read("IDENTITY")
	asDir := func(name string) func() {
		return func() {
			if err := os.Remove(label(name)); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(label(name), 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}
	restore := func(name string, b []byte) func() {
		return func() {
			if err := os.RemoveAll(label(name)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(label(name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, k := range []struct {
		name        string
		break_, fix func()
		want        string
	}{
		{"FORMAT lost", func() { os.Remove(label("FORMAT")) }, restore("FORMAT", format), "has no FORMAT file"},
		{"FORMAT unreadable", asDir("FORMAT"), restore("FORMAT", format), "is a directory"},
		{"IDENTITY unreadable", asDir("IDENTITY"), restore("IDENTITY", identity), "is a directory"},
		{"IDENTITY damaged", restore("IDENTITY", []byte("weir-stack nonsense\n")), restore("IDENTITY", identity), "not \"weir-stack <uuid>\""},
	} {
		k.break_()
		before := dataDigest(t, blobs)
		st, err := stack.Start(c, hclog.NewNullLogger())
		if err == nil {
			st.Shutdown(context.Background())
			t.Fatalf("%s: the stack started", k.name)
		}
		if !strings.Contains(err.Error(), k.want) {
			t.Errorf("%s: error %q does not say %q", k.name, err, k.want)
		}
		if be, err := stack.BackendReadOnly(c, hclog.NewNullLogger()); err == nil {
			if r, err := fsck.Check(c, be, fsck.Options{}); err == nil && r.OK() {
				t.Errorf("%s: weir check finds the store consistent", k.name)
			}
		}
		if after := dataDigest(t, blobs); !maps.Equal(before, after) {
			t.Errorf("%s: the store changed", k.name)
		}
		k.fix()
	}
	checkSecret(t, c, "with the labels back")
}
