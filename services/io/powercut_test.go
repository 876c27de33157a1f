package iosvc_test

import (
	"bytes"
	"testing"

	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/services/io/backend/powercut"
)

// TestFsyncSurvivesPowerCut: what an acknowledged fsync covers must be on
// the device after a power cut, including the blob's very existence when
// the file was created since the last time creates were made durable. A
// file written but never fsynced may be gone; nothing is asserted of it.
func TestFsyncSurvivesPowerCut(t *testing.T) {
	pc := powercut.New(mem.New())
	e := startIO(t, pc, nil)
	fsys := e.dial(t)
	defer fsys.Close()

	if got := pc.Cut(); len(got) != 0 {
		t.Fatalf("blobs durable before any write: %d", len(got))
	}
	want := map[string][]byte{}
	for i, name := range []string{"first", "second", "third"} {
		f, err := fsys.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte{byte('a' + i)}, 5000+i)
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		want[name] = data
		// Cut the power right after each acknowledged fsync: every file
		// fsynced so far must be there, whole.
		state := pc.Cut()
		if len(state) != len(want) {
			t.Fatalf("after fsync of %q: %d blobs survive a power cut, want %d", name, len(state), len(want))
		}
		for n, d := range want {
			found := false
			for _, got := range state {
				found = found || bytes.Equal(got, d)
			}
			if !found {
				t.Fatalf("after fsync of %q: the bytes of %q did not survive a power cut", name, n)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A second fsync with no create since costs no backend sync of creates:
	// checked through the counter of backend syncs.
	before := e.counter(t, "backend_syncs")
	f, err := fsys.OpenFile("first", 2, 0) // O_RDWR
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("A"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if after := e.counter(t, "backend_syncs"); after != before {
		t.Fatalf("an fsync with no create since the last one synced the backend (%d -> %d)", before, after)
	}
}
