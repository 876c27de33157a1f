package iosvc_test

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/services/io/backend/powercut"
)

// afterKill is what a restart finds after a SIGKILL of io now: every
// blob as it is (the kernel keeps what io wrote, synced or not), with the
// staging log's live records replayed into them.
func afterKill(t *testing.T, be backend.Backend) map[backend.BlobID][]byte {
	t.Helper()
	return recovered(t, blobsOf(t, be, false))
}

// blobsOf reads every blob of be (the staging log's too, unless files).
func blobsOf(t *testing.T, be backend.Backend, files bool) map[backend.BlobID][]byte {
	t.Helper()
	ids, err := be.List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[backend.BlobID][]byte{}
	for _, id := range ids {
		if files && id == backend.StagingBlob {
			continue
		}
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		d := make([]byte, b.Size())
		if _, err := b.ReadAt(d, 0); err != nil && len(d) > 0 {
			t.Fatal(err)
		}
		b.Close()
		out[id] = d
	}
	return out
}

// recovered writes state into a new store, replays its staging log and
// returns the files' blobs.
func recovered(t *testing.T, state map[backend.BlobID][]byte) map[backend.BlobID][]byte {
	t.Helper()
	img := mem.New()
	if err := powercut.Restore(img, state); err != nil {
		t.Fatal(err)
	}
	if _, err := iosvc.Replay(img, nil); err != nil {
		t.Fatalf("replay: %v", err)
	}
	return blobsOf(t, img, true)
}

// afterCut is what a restart finds after a power cut now: the durable
// image of pc, with the staging log's live records replayed into the
// blobs as io's start does, the log itself left out.
func afterCut(t *testing.T, pc *powercut.Backend) map[backend.BlobID][]byte {
	t.Helper()
	return recovered(t, pc.Cut())
}

// TestFsyncSurvivesPowerCut: what an acknowledged fsync covers must be on
// the device after a power cut and the replay of the staging log at the
// next start, including the blob's very existence when the file was
// created since the last time creates were made durable. A file written
// but never fsynced may be gone; nothing is asserted of it.
func TestFsyncSurvivesPowerCut(t *testing.T) {
	pc := powercut.New(mem.New())
	e := startIO(t, pc, nil)
	fsys := e.dial(t)
	defer fsys.Close()

	if got := afterCut(t, pc); len(got) != 0 {
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
		state := afterCut(t, pc)
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

// TestSyncFlagsMakeEveryWriteDurable: a file opened with O_SYNC or O_DSYNC
// has each write made durable before the write returns, as if each were
// followed by fsync: a power cut right after the write keeps it, with no
// fsync at all; the size reaches the metadata service durably too. Without
// the flag, an unsynced write is not (the model keeps only synced bytes).
func TestSyncFlagsMakeEveryWriteDurable(t *testing.T) {
	pc := powercut.New(mem.New())
	e := startIO(t, pc, nil)
	fsys := e.dial(t)
	defer fsys.Close()
	for _, tc := range []struct {
		name string
		flag int
		kept bool
	}{
		{"plain", 0, false},
		{"o_sync", os.O_SYNC, true},
		{"o_dsync", syscall.O_DSYNC, true},
	} {
		f, err := fsys.OpenFile(tc.name, os.O_RDWR|os.O_CREATE|tc.flag, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte(tc.name), 1000)
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, got := range afterCut(t, pc) {
			found = found || bytes.Equal(got, data)
		}
		if found != tc.kept {
			t.Errorf("%s: the write survives a power cut: %v, want %v", tc.name, found, tc.kept)
		}
		if tc.kept {
			ino := inoOf(t, f)
			if a, err := e.st.Metadata.NS().GetAttr(ino); err != nil || a.Size != int64(len(data)) {
				t.Errorf("%s: the namespace records %d bytes (%v), want %d", tc.name, a.Size, err, len(data))
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSyncFSCoversClosedFiles: a syncfs (client.FS.SyncFS, proto.OpSyncFS)
// makes durable the files written and closed without an fsync, and one
// still open: a power cut right after it keeps every byte; past
// maxUnsynced closed changed files, io syncs them in the background so
// that its list of them stays bounded.
func TestSyncFSCoversClosedFiles(t *testing.T) {
	pc := powercut.New(mem.New())
	e := startIO(t, pc, nil)
	fsys := e.dial(t)
	defer fsys.Close()
	var want [][]byte
	write := func(name string, i int, keep bool) *client.File {
		f, err := fsys.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte{byte('a' + i%26)}, 3000+i)
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		want = append(want, data)
		if keep {
			return f
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	for i := range 3 {
		write(fmt.Sprintf("closed%d", i), i, false)
	}
	open := write("open", 3, true)
	defer open.Close()
	if err := fsys.SyncFS(); err != nil {
		t.Fatal(err)
	}
	state := afterCut(t, pc)
	for i, d := range want {
		found := false
		for _, got := range state {
			found = found || bytes.Equal(got, d)
		}
		if !found {
			t.Fatalf("file %d of %d: its bytes did not survive a power cut after syncfs", i, len(want))
		}
	}
	if n := iosvc.Unsynced(e.io); n != 0 {
		t.Fatalf("%d closed files still wait for a syncfs after one", n)
	}

	// A file written, closed and removed leaves nothing for a syncfs,
	// which succeeds (it had failed every syncfs after it with EIO).
	write("gone", 30, false)
	want = want[:len(want)-1]
	if err := fsys.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.SyncFS(); err != nil {
		t.Fatalf("syncfs after a removed file: %v", err)
	}
	if err := fsys.SyncFS(); err != nil {
		t.Fatalf("second syncfs after a removed file: %v", err)
	}
	if n := iosvc.Unsynced(e.io); n != 0 {
		t.Fatalf("%d closed files still wait for a syncfs after one", n)
	}

	iosvc.SetMaxUnsynced(t, 4)
	for i := range 20 {
		write(fmt.Sprintf("many%d", i), 4+i, false)
	}
	deadline := time.Now().Add(30 * time.Second)
	for iosvc.Unsynced(e.io) > 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d closed files wait for a syncfs, past the bound of 4, after 30 s", iosvc.Unsynced(e.io))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
