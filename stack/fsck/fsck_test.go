package fsck_test

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/fsck"
	"github.com/weir-storage/weir/stack/stacktest"
)

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	c := stacktest.Config(t, "")
	return c
}

func check(t *testing.T, c *config.Config) *fsck.Report {
	t.Helper()
	log := hclog.NewNullLogger()
	be, err := stack.BackendReadOnly(c, log)
	if err != nil {
		t.Fatal(err)
	}
	r, err := fsck.Check(c, be, fsck.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCheck: a cleanly stopped weir is consistent; a stray blob and a lost
// blob are each reported.
func TestCheck(t *testing.T) {
	c := testConfig(t)
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	fs, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "empty"} {
		data := []byte(strings.Repeat(name, 1000))
		if name == "empty" {
			data = nil
		}
		if err := fs.WriteFile(name, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A removed file's blob is deleted in the background; a clean stop
	// finishes that, so no orphan blob may remain.
	if err := fs.WriteFile("gone", []byte("data that had a blob"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	fi, err := fs.Stat("b")
	if err != nil {
		t.Fatal(err)
	}
	fs.Close()
	if err := st.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := check(t, c); !r.OK() || r.Files != 3 {
		t.Fatalf("clean data: %+v", r)
	}

	be, err := stack.Backend(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := be.Create(backend.BlobID(1 << 40)); err != nil { // a blob no file names
		t.Fatal(err)
	}
	lost := backend.BlobID(fi.Sys().(*syscall.Stat_t).Ino) // a file's blob is its inode number
	if err := be.Delete(lost); err != nil {
		t.Fatal(err)
	}
	be.Close()
	r := check(t, c)
	kinds := map[string]uint64{}
	for _, p := range r.Problems {
		kinds[p.Kind] = p.Blob
	}
	if len(r.Problems) != 2 || kinds["orphan-blob"] != 1<<40 || kinds["missing-blob"] != uint64(lost) {
		t.Fatalf("problems: %+v", r.Problems)
	}
}

// auditing is a backend whose storage holds objects that are not blobs.
type auditing struct {
	backend.Backend
	strays []string
}

func (a auditing) Strays() []string { return a.strays }

// TestCheckReportsStrays: what a backend's Auditor finds is reported, one
// problem each.
func TestCheckReportsStrays(t *testing.T) {
	c := testConfig(t)
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	be, err := stack.Backend(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	r, err := fsck.Check(c, auditing{be, []string{"object x is not a blob", "y and z claim blob 5"}}, fsck.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Problems) != 2 || r.Problems[0].Kind != "stray-object" || r.Problems[1].Detail != "y and z claim blob 5" {
		t.Fatalf("problems: %+v", r.Problems)
	}
}

// TestRepair: --repair deletes orphan blobs and the blobs awaiting
// deletion and records each file's blob size; a check afterwards is clean.
// Without --repair the same directory is reported, and left as it was.
func TestRepair(t *testing.T) {
	c := testConfig(t)
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	fs, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile("short", []byte("recorded"), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := fs.Stat("short")
	if err != nil {
		t.Fatal(err)
	}
	fs.Close()
	if err := st.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Damage as a crash leaves it: an orphan blob, and a blob longer than
	// the size the namespace records (writes whose size never reached it).
	be, err := stack.Backend(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := be.Create(backend.BlobID(1 << 40)); err != nil {
		t.Fatal(err)
	}
	b, err := be.Open(backend.BlobID(fi.Sys().(*syscall.Stat_t).Ino))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt([]byte(" and more"), 8); err != nil {
		t.Fatal(err)
	}
	b.Close()
	be.Close()
	r := check(t, c)
	kinds := map[string]Problem{}
	for _, p := range r.Problems {
		kinds[p.Kind] = p
	}
	if r.OK() || kinds["orphan-blob"].Blob != 1<<40 || !strings.Contains(kinds["size-mismatch"].Detail, "9 bytes written after the size last reached the namespace") {
		t.Fatalf("before the repair: %+v", r.Problems)
	}
	if r2 := check(t, c); len(r2.Problems) != len(r.Problems) {
		t.Fatalf("a second check found %+v: the first one changed something", r2.Problems)
	}
	be, err = stack.Backend(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := fsck.Check(c, be, fsck.Options{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || len(rep.Repaired) != 2 {
		t.Fatalf("repair: %+v", rep)
	}
	if r := check(t, c); !r.OK() || len(r.Problems) != 0 || r.Blobs != 1 {
		t.Fatalf("after the repair: %+v", r)
	}
}

type Problem = fsck.Problem
