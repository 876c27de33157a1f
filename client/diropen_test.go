package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
)

const dirFeatures = proto.FeatureLeases | proto.FeatureCaps | proto.FeatureOpenCap | proto.FeatureDirOpen

// snapshot asks for dir's snapshot on raw session s (one page).
func (s *rawSession) snapshot(t *testing.T, dir string) ([]proto.SnapEntry, error) {
	t.Helper()
	buf := make([]byte, s.meta.MaxBuffer())
	copy(buf, (&proto.ReadDirReq{Path: dir}).Append(nil))
	comp, err := rawDo(context.Background(), s.meta, proto.OpDirLease, proto.RootHandle, buf, false)
	if err != nil {
		t.Fatal(err)
	}
	if comp.Result < 0 {
		return nil, comp.Err()
	}
	return proto.DecodeSnapEntries(buf[:comp.Result])
}

// claimDir presents an entry's capability on s's IO ring, releasing rel
// first, and returns the direct handle.
func (s *rawSession) claimDir(t *testing.T, cp []byte, rel uint64) (uint64, error) {
	t.Helper()
	b := make([]byte, proto.ClaimDirSize)
	copy(b, cp)
	binary.LittleEndian.PutUint64(b[proto.CapSize:], rel)
	comp := rawCall(t, s.data, proto.OpClaimDir, 0, b)
	if comp.Result < 0 {
		return 0, comp.Err()
	}
	return comp.Aux, nil
}

// release ends direct open h on s's IO ring.
func (s *rawSession) release(t *testing.T, h uint64) error {
	t.Helper()
	comp, err := rawDo(context.Background(), s.data, proto.OpRelease, h, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return comp.Err()
}

// capOf is the capability of name's entry in a snapshot.
func capOf(t *testing.T, ents []proto.SnapEntry, name string) []byte {
	t.Helper()
	e := entry(t, ents, name)
	return e.Cap[:]
}

// entry finds name in a snapshot.
func entry(t *testing.T, ents []proto.SnapEntry, name string) proto.SnapEntry {
	t.Helper()
	for _, e := range ents {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("%s is not in the snapshot %v", name, ents)
	return proto.SnapEntry{}
}

func writeFiles(t *testing.T, c *client.FS, dir string, n int) {
	t.Helper()
	if err := c.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := c.WriteFile(fmt.Sprintf("%s/f%d", dir, i), []byte(fmt.Sprintf("contents of f%d", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// waitSnapshot opens dir's files f0 and f1 (cold: the session never
// opened them), then waits until the client holds the directory's
// snapshot.
func waitSnapshot(t *testing.T, c *client.FS, dir string) {
	t.Helper()
	before := c.Snapshots.Load()
	for _, n := range []string{"f0", "f1"} {
		if _, err := c.ReadFile(dir + "/" + n); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); c.Snapshots.Load() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no directory snapshot 10 s after two cold opens")
		}
	}
}

func openRead(t *testing.T, c *client.FS, name string) string {
	t.Helper()
	f, err := c.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return string(b)
}

// TestDirectOpens: after two cold opens in a directory a session holds
// its snapshot, and opens the other files there at io alone (no metadata
// open); a second open of a file goes through metadata (its kept lease),
// and a Stat makes a direct file an ordinary one.
func TestDirectOpens(t *testing.T) {
	c, st := newFS(t)
	writeFiles(t, c, "d", 13)
	c2, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitSnapshot(t, c2, "d")
	opens := st.Metadata.Stats.Opens.Load()
	direct := c2.DirectOpens.Load()
	for i := 2; i < 12; i++ {
		if got, want := openRead(t, c2, fmt.Sprintf("d/f%d", i)), fmt.Sprintf("contents of f%d", i); got != want {
			t.Fatalf("read %q, want %q", got, want)
		}
	}
	if d := c2.DirectOpens.Load() - direct; d != 10 {
		t.Errorf("%d direct opens of 10 files never opened before; want 10 (refused: %d)", d, c2.DirectRefused.Load())
	}
	if d := st.Metadata.Stats.Opens.Load() - opens; d != 0 {
		t.Errorf("the direct opens made %d metadata opens; want 0", d)
	}
	// A second open goes through metadata.
	opens = st.Metadata.Stats.Opens.Load()
	if got := openRead(t, c2, "d/f5"); got != "contents of f5" {
		t.Fatalf("second read %q", got)
	}
	if d := st.Metadata.Stats.Opens.Load() - opens; d != 1 {
		t.Errorf("a second open made %d metadata opens; want 1", d)
	}
	// Stat: the name's attributes; a call that needs a metadata handle
	// (Chmod) opens it through metadata first.
	f, err := c2.OpenFile("d/f12", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	promoted := c2.DirectPromoted.Load()
	fi, err := f.Stat()
	if err != nil || fi.Size() != int64(len("contents of f12")) || fi.Mode() != 0o644 {
		t.Fatalf("stat of a direct open: %v %v", fi, err)
	}
	if c2.DirectPromoted.Load() != promoted {
		t.Errorf("Stat promoted the direct open; the name's stat serves it")
	}
	if err := f.Chmod(0o644); err != nil {
		t.Fatalf("chmod of a direct open: %v", err)
	}
	if c2.DirectPromoted.Load() != promoted+1 {
		t.Errorf("Chmod did not promote the direct open")
	}
	if b, err := io.ReadAll(f); err != nil || string(b) != "contents of f12" {
		t.Fatalf("read after promotion: %q %v", b, err)
	}
	// A direct file whose name went elsewhere: Stat answers from io (weir
	// has no metadata handle of it; TestDirectOpenNameGone), its reads go
	// on.
	writeFiles(t, c, "r", 3)
	waitSnapshot(t, c2, "r")
	direct = c2.DirectOpens.Load()
	g, err := c2.OpenFile("r/f2", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if c2.DirectOpens.Load() != direct+1 {
		t.Fatal("r/f2 was not opened directly")
	}
	if err := c.Rename("r/f2", "r/moved"); err != nil {
		t.Fatal(err)
	}
	if fi, err := g.Stat(); err != nil || fi.Size() != int64(len("contents of f2")) {
		t.Errorf("Stat of a direct file whose name was renamed away: %v %v, want its size", fi, err)
	}
	buf := make([]byte, 32)
	if n, err := g.ReadAt(buf, 0); string(buf[:n]) != "contents of f2" || (err != nil && err != io.EOF) {
		t.Errorf("read of a direct file after its rename and a failed Stat: %q %v", buf[:n], err)
	}
	// A name the snapshot lacks is opened through metadata, not ENOENT.
	if err := c.WriteFile("d/new", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := openRead(t, c2, "d/new"); got != "new" {
		t.Fatalf("a file created after the snapshot read %q", got)
	}
	if _, err := c2.Open("d/none"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open of a missing name: %v", err)
	}
}

// TestDirectOpenAfterChange: once a name is removed or renamed, or a
// file's mode changes, a snapshot taken before opens nothing: io refuses
// its capabilities (the directory generation moved before the change was
// made), and the client's open goes through metadata, which answers as
// the namespace is now.
func TestDirectOpenAfterChange(t *testing.T) {
	c, st := newFS(t)
	writeFiles(t, c, "d", 4)
	s := dialRaw(t, st, dirFeatures)
	ents, err := s.snapshot(t, "d")
	if err != nil || len(ents) != 4 {
		t.Fatalf("snapshot: %v %v", ents, err)
	}
	h, err := s.claimDir(t, capOf(t, ents, "f1"), 0)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if got, err := s.read(t, h); err != nil || string(got) != "contents of f1" {
		t.Fatalf("read of a direct open: %q %v", got, err)
	}
	bumps := st.Metadata.Snapshot()["dir_gen_bumps"].(uint64)
	if err := c.Remove("d/f0"); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("d/f3"); err != nil { // no snapshot since: no bump
		t.Fatal(err)
	}
	if d := st.Metadata.Snapshot()["dir_gen_bumps"].(uint64) - bumps; d != 1 {
		t.Errorf("two removes after one snapshot moved the generation %d times; want 1", d)
	}
	if _, err := s.claimDir(t, capOf(t, ents, "f2"), 0); !errors.Is(err, syscall.EKEYREJECTED) {
		t.Fatalf("claim of a snapshot older than a remove: %v, want EKEYREJECTED", err)
	}
	// The direct open made before the change still reads (an open file
	// keeps its access), and the removed file's blob outlives its name.
	if got, err := s.read(t, h); err != nil || string(got) != "contents of f1" {
		t.Fatalf("read of a direct open after the change: %q %v", got, err)
	}

	// The client: a remove, a rename and a chmod made by another session
	// after its snapshot.
	c2, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	writeFiles(t, c, "e", 8)
	waitSnapshot(t, c2, "e")
	if err := c.Remove("e/f4"); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Open("e/f4"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open of a name removed after the snapshot: %v, want ENOENT", err)
	}
	if c2.DirectRefused.Load() == 0 {
		t.Errorf("no direct open was refused")
	}
	if err := c.Rename("e/f5", "e/g5"); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Open("e/f5"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open of a name renamed after the snapshot: %v, want ENOENT", err)
	}
	if got := openRead(t, c2, "e/g5"); got != "contents of f5" {
		t.Fatalf("the new name reads %q", got)
	}
}

// TestDirectOpenRefusals: what io refuses in OpClaimDir and OpRelease.
func TestDirectOpenRefusals(t *testing.T) {
	c, st := newFS(t)
	writeFiles(t, c, "d", 2)
	s := dialRaw(t, st, dirFeatures)
	other := dialRaw(t, st, dirFeatures)
	ents, err := s.snapshot(t, "d")
	if err != nil || len(ents) != 2 {
		t.Fatalf("snapshot: %v %v", ents, err)
	}
	cp := entry(t, ents, "f0").Cap
	bad := cp
	bad[3] ^= 0x10
	if _, err := s.claimDir(t, bad[:], 0); !errors.Is(err, syscall.EKEYREJECTED) {
		t.Errorf("forged capability: %v, want EKEYREJECTED", err)
	}
	if _, err := other.claimDir(t, cp[:], 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("another session's capability: %v, want EPERM", err)
	}
	if err := rawCall(t, s.data, proto.OpClaimDir, 0, cp[:]).Err(); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a claim without its release word: %v, want EINVAL", err)
	}
	// A direct-open capability is no read capability, and the other way.
	r := s.open(t, "d/f1")
	if err := s.claim(t, r.DataHandle, cp[:]); !errors.Is(err, syscall.EKEYREJECTED) {
		t.Errorf("a direct-open capability in OpClaim: %v, want EKEYREJECTED", err)
	}
	if r.HasCap {
		if _, err := s.claimDir(t, r.Cap[:], 0); !errors.Is(err, syscall.EKEYREJECTED) {
			t.Errorf("a read capability in OpClaimDir: %v, want EKEYREJECTED", err)
		}
	}
	h, err := s.claimDir(t, cp[:], 0)
	if err != nil || h&proto.DirOpenBit == 0 {
		t.Fatalf("claim: %#x %v", h, err)
	}
	// No mapping of the file's cache region by it (a writer's grant
	// ends a direct open, and could not take a mapping back).
	if err := rawCall(t, s.data, proto.OpCacheMap, h, make([]byte, 8)).Err(); !errors.Is(err, syscall.EBADF) {
		t.Errorf("OpCacheMap of a direct handle: %v, want EBADF", err)
	}
	// The other session cannot read by it, nor release it.
	if _, err := other.read(t, h); !errors.Is(err, syscall.EBADF) {
		t.Errorf("another session's read by a direct handle: %v, want EBADF", err)
	}
	if err := other.release(t, h); err != nil {
		t.Errorf("another session's release of a handle it does not hold: %v, want no error", err)
	}
	if got, err := s.read(t, h); err != nil || string(got) != "contents of f0" {
		t.Fatalf("read: %q %v", got, err)
	}
	if err := s.release(t, r.Handle); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("release of a handle metadata made: %v, want EINVAL", err)
	}
	// Released in the next claim: its reads are EBADF.
	h2, err := s.claimDir(t, cp[:], h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.read(t, h); !errors.Is(err, syscall.EBADF) {
		t.Errorf("read by a released handle: %v, want EBADF", err)
	}
	if err := s.release(t, h2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.read(t, h2); !errors.Is(err, syscall.EBADF) {
		t.Errorf("read by a released handle: %v, want EBADF", err)
	}
	// A session without the feature gets no snapshot; one that asks for
	// it without the capabilities its end relies on is not given it.
	plain := dialRaw(t, st, capFeatures)
	if _, err := plain.snapshot(t, "d"); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("snapshot without FeatureDirOpen: %v, want EOPNOTSUPP", err)
	}
	meta, err := ring.Dial(context.Background(), st.Config.Metadata.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	hello := make([]byte, proto.HelloRespSize)
	copy(hello, (&proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: proto.FeatureLeases | proto.FeatureDirOpen}).Append(nil))
	if r := rawCall(t, meta, proto.OpHello, 0, hello); r.Result != proto.HelloRespSize {
		t.Fatalf("hello: %+v", r)
	}
	if hr, err := proto.DecodeHelloResp(hello); err != nil || hr.Features != proto.FeatureLeases {
		t.Errorf("hello asking for direct opens without capabilities answered features %#x, %v; want %#x", hr.Features, err, proto.FeatureLeases)
	}
}

// TestDirectOpenAndWriter: a file a writer holds takes no direct open,
// and a write grant ends the direct opens of other sessions: the reader's
// client opens the file through metadata and reads what was written.
func TestDirectOpenAndWriter(t *testing.T) {
	st := groupStack(t, "process") // every session its own trust group
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	writeFiles(t, c, "d", 6)
	c2, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitSnapshot(t, c2, "d")
	f, err := c2.OpenFile("d/f3", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if c2.DirectOpens.Load() == 0 {
		t.Fatal("d/f3 was not opened directly")
	}
	buf := make([]byte, 64)
	if n, err := f.ReadAt(buf, 0); string(buf[:n]) != "contents of f3" || (err != nil && err != io.EOF) {
		t.Fatalf("direct read: %q %v", buf[:n], err)
	}
	w, err := c.OpenFile("d/f3", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("CONTENTS"), 0); err != nil {
		t.Fatal(err)
	}
	// While the writer holds it: no direct open of it.
	s := dialRaw(t, st, dirFeatures)
	ents, err := s.snapshot(t, "d")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.claimDir(t, capOf(t, ents, "f3"), 0); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("direct open of a file a writer holds: %v, want EBUSY", err)
	}
	promoted := c2.DirectPromoted.Load()
	if n, err := f.ReadAt(buf, 0); string(buf[:n]) != "CONTENTS of f3" || (err != nil && err != io.EOF) {
		t.Fatalf("read after another group's write: %q %v", buf[:n], err)
	}
	if c2.DirectPromoted.Load() != promoted+1 {
		t.Errorf("the writer's grant did not end the direct open (promotions %d -> %d)", promoted, c2.DirectPromoted.Load())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDirectOpenOutlivesUnlink: a file opened directly reads whole after
// its last name is removed, and its blob goes once it is closed.
func TestDirectOpenOutlivesUnlink(t *testing.T) {
	c, st := newFS(t)
	writeFiles(t, c, "d", 4)
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := c.WriteFile("d/big", big, 0o644); err != nil {
		t.Fatal(err)
	}
	c2, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitSnapshot(t, c2, "d")
	f, err := c2.Open("d/big")
	if err != nil {
		t.Fatal(err)
	}
	if c2.DirectOpens.Load() == 0 {
		t.Fatal("d/big was not opened directly")
	}
	if err := c.Remove("d/big"); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	if err != nil || len(got) != len(big) || string(got) != string(big) {
		t.Fatalf("read of a removed file: %d bytes, %v", len(got), err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	waitDeletes(t, st)
}

// waitDeletes waits until metadata owes io no blob delete.
func waitDeletes(t *testing.T, st *stack.Stack) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n := st.Metadata.Snapshot()["deletes_pending"]; fmt.Sprint(n) == "0" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("blob deletes still pending 20 s after the last close: %v", st.Metadata.Snapshot()["deletes_pending"])
		}
	}
}

// TestDirectOpenNameGone: a file opened directly (at io alone, with no
// metadata handle) keeps answering fstat and fsync once its name is
// removed, renamed or replaced, as a Linux descriptor does whatever
// happens to its name: Stat gives the size, the inode and the mode (and
// the owner and times a stat by the name told it before, else the
// overflow ids), Sync of the read-only descriptor succeeds, and the reads
// and a seek from the end go on.
func TestDirectOpenNameGone(t *testing.T) {
	for _, how := range []string{"unlink", "rename", "replace"} {
		for _, statFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/statFirst=%v", how, statFirst), func(t *testing.T) {
				directNameGone(t, how, statFirst)
			})
		}
	}
}

func directNameGone(t *testing.T, how string, statFirst bool) {
	c, st := newFS(t)
	writeFiles(t, c, "d", 4)
	c2, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitSnapshot(t, c2, "d")
	want, err := c.Stat("d/f2")
	if err != nil {
		t.Fatal(err)
	}
	direct := c2.DirectOpens.Load()
	f, err := c2.Open("d/f2")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if c2.DirectOpens.Load() != direct+1 {
		t.Fatal("d/f2 was not opened directly")
	}
	g := f.(*client.File)
	if statFirst {
		if _, err := g.Stat(); err != nil {
			t.Fatalf("fstat of a direct file: %v", err)
		}
	}
	switch how {
	case "unlink":
		err = c.Remove("d/f2")
	case "rename":
		err = c.Rename("d/f2", "d/moved")
	case "replace":
		err = c.Rename("d/f3", "d/f2")
	}
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := g.Stat(); err != nil {
		t.Errorf("fstat of a direct file after %s of its name: %v", how, err)
	} else {
		got, exp := fi.Sys().(*syscall.Stat_t), *want.Sys().(*syscall.Stat_t)
		if !statFirst {
			exp.Uid, exp.Gid, exp.Mtim = 65534, 65534, syscall.Timespec{}
		}
		if fi.Size() != want.Size() || fi.Mode() != want.Mode() || got.Ino != exp.Ino || got.Uid != exp.Uid || got.Gid != exp.Gid || got.Mtim != exp.Mtim {
			t.Errorf("fstat after %s: size %d mode %v ino %d uid %d gid %d mtime %v, want %d %v %d %d %d %v",
				how, fi.Size(), fi.Mode(), got.Ino, got.Uid, got.Gid, got.Mtim, want.Size(), want.Mode(), exp.Ino, exp.Uid, exp.Gid, exp.Mtim)
		}
	}
	if err := g.Sync(); err != nil {
		t.Errorf("fsync of a read-only direct file after %s of its name: %v", how, err)
	}
	if err := g.Datasync(); err != nil {
		t.Errorf("fdatasync of a read-only direct file after %s of its name: %v", how, err)
	}
	if b, err := io.ReadAll(g); err != nil || string(b) != "contents of f2" {
		t.Errorf("read after %s: %q %v", how, b, err)
	}
	if off, err := g.Seek(-4, io.SeekEnd); err != nil || off != want.Size()-4 {
		t.Errorf("seek to 4 before the end after %s: %d %v, want %d", how, off, err, want.Size()-4)
	}
}
