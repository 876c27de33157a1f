package ns

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/internal/vfs"
	"github.com/weir-storage/weir/internal/wal"
	"golang.org/x/sys/unix"
)

func stat(t *testing.T, n *NS, p string) Attr {
	t.Helper()
	a, err := n.Stat(root, p)
	must(t, err)
	return a
}

func create(t *testing.T, n *NS, c Cred, p string) Attr {
	t.Helper()
	a, created, err := n.Open(c, p, syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR, 0o644)
	must(t, err)
	if !created {
		t.Fatalf("%s: not created", p)
	}
	return a
}

func release(t *testing.T, n *NS, ino Ino) uint64 {
	t.Helper()
	b, err := n.Release(ino)
	must(t, err)
	return b
}

func TestNewFileAndDirectoryAttributes(t *testing.T) {
	n, clk := newNS(t)
	d, err := n.Mkdir(u1, "d", 0o755)
	if errno(t, err) != syscall.EACCES {
		t.Fatalf("mkdir in root-owned 0755 root as u1: %v", err)
	}
	must(t, n.Chmod(root, "/", 0o777))
	d, err = n.Mkdir(u1, "d", 0o750)
	must(t, err)
	now := clk.last()
	want := Attr{Ino: d.Ino, Mode: syscall.S_IFDIR | 0o750, UID: 1001, GID: 1001, Nlink: 2, Atime: now, Mtime: now, Ctime: now}
	if d != want {
		t.Errorf("mkdir attr %+v, want %+v", d, want)
	}
	r := stat(t, n, "/")
	if r.Nlink != 3 || r.Mtime != now || r.Ctime != now {
		t.Errorf("root after mkdir: %+v", r)
	}
	f := create(t, n, u1, "d/f")
	now = clk.last()
	want = Attr{Ino: f.Ino, Mode: syscall.S_IFREG | 0o644, UID: 1001, GID: 1001, Nlink: 1, Atime: now, Mtime: now, Ctime: now, Blob: uint64(f.Ino)}
	if f != want {
		t.Errorf("create attr %+v, want %+v", f, want)
	}
	if d := stat(t, n, "d"); d.Nlink != 2 || d.Mtime != now || d.Ctime != now {
		t.Errorf("dir after create: %+v", d)
	}
	if f.Ino <= d.Ino || d.Ino <= RootIno {
		t.Errorf("inode numbers not increasing: root, %d, %d", d.Ino, f.Ino)
	}
	release(t, n, f.Ino)
}

func TestTimestamps(t *testing.T) {
	n, clk := newNS(t)
	fixture(t, n)
	before := stat(t, n, "f")
	// Reads change nothing, atime included (noatime).
	_, err := n.ReadDir(root, "/")
	must(t, err)
	a, _, err := n.Open(root, "f", syscall.O_RDONLY, 0)
	must(t, err)
	release(t, n, a.Ino)
	if got := stat(t, n, "f"); got != before {
		t.Fatalf("read-only access changed %+v to %+v", before, got)
	}
	// chmod and chown: ctime only.
	must(t, n.Chmod(root, "f", 0o600))
	got := stat(t, n, "f")
	if got.Ctime != clk.last() || got.Mtime != before.Mtime || got.Atime != before.Atime {
		t.Errorf("chmod times %+v", got)
	}
	must(t, n.Chown(u1, "ro/rof", -1, -1))
	if got := stat(t, n, "ro/rof"); got.Ctime != clk.last() {
		t.Errorf("no-op chown did not set ctime: %+v", got)
	}
	// utimes: explicit atime and mtime, ctime now; omit leaves one alone.
	must(t, n.Chtimes(root, "f", 11, 22))
	got = stat(t, n, "f")
	if got.Atime != 11 || got.Mtime != 22 || got.Ctime != clk.last() {
		t.Errorf("chtimes %+v", got)
	}
	must(t, n.Chtimes(root, "f", TimeOmit, 33))
	if got = stat(t, n, "f"); got.Atime != 11 || got.Mtime != 33 {
		t.Errorf("chtimes with omit %+v", got)
	}
	// truncate to the same size: nothing; to another size: mtime and ctime.
	prev := stat(t, n, "f")
	_, err = n.Truncate(root, "f", 0)
	must(t, err)
	if got = stat(t, n, "f"); got != prev {
		t.Errorf("same-size truncate changed %+v to %+v", prev, got)
	}
	_, err = n.Truncate(root, "f", 100)
	must(t, err)
	if got = stat(t, n, "f"); got.Size != 100 || got.Mtime != clk.last() || got.Ctime != clk.last() {
		t.Errorf("truncate %+v", got)
	}
	// O_TRUNC always sets mtime and ctime.
	a, _, err = n.Open(root, "f", syscall.O_WRONLY|syscall.O_TRUNC, 0)
	must(t, err)
	release(t, n, a.Ino)
	if got = stat(t, n, "f"); got.Size != 0 || got.Mtime != clk.last() || got.Ctime != clk.last() || a != got {
		t.Errorf("O_TRUNC %+v (open returned %+v)", got, a)
	}
	a, _, err = n.Open(root, "f", syscall.O_WRONLY|syscall.O_TRUNC, 0)
	must(t, err)
	release(t, n, a.Ino)
	if a.Mtime != clk.last() {
		t.Errorf("O_TRUNC of an empty file left mtime %d", a.Mtime)
	}
	// rename across directories: both parents' mtime/ctime, the file's ctime.
	src, dst, fb := stat(t, n, "a/b"), stat(t, n, "d"), stat(t, n, "a/b/g")
	_, err = n.Rename(root, "a/b/g", "d/g")
	must(t, err)
	now := clk.last()
	if s := stat(t, n, "a/b"); s.Mtime != now || s.Ctime != now || s.Mtime == src.Mtime {
		t.Errorf("old parent %+v", s)
	}
	if s := stat(t, n, "d"); s.Mtime != now || s.Ctime != now || s.Mtime == dst.Mtime {
		t.Errorf("new parent %+v", s)
	}
	if s := stat(t, n, "d/g"); s.Ctime != now || s.Mtime != fb.Mtime {
		t.Errorf("renamed file %+v", s)
	}
	// unlink and rmdir: the parent's mtime/ctime.
	_, err = n.Unlink(root, "d/g")
	must(t, err)
	if s := stat(t, n, "d"); s.Mtime != clk.last() {
		t.Errorf("unlink parent %+v", s)
	}
	must(t, n.Rmdir(root, "e/x"))
	if s := stat(t, n, "e"); s.Mtime != clk.last() || s.Nlink != 2 {
		t.Errorf("rmdir parent %+v", s)
	}
	// SetLive: size, mtime, and ctime if mtime is later.
	h := create(t, n, root, "live")
	must(t, n.SetLive(h.Ino, 4096, h.Ctime+5))
	got, err = n.GetAttr(h.Ino)
	must(t, err)
	if got.Size != 4096 || got.Mtime != h.Ctime+5 || got.Ctime != h.Ctime+5 {
		t.Errorf("SetLive %+v", got)
	}
	must(t, n.SetLive(h.Ino, 1, h.Ctime-5))
	if got, _ = n.GetAttr(h.Ino); got.Ctime != h.Ctime+5 || got.Mtime != h.Ctime-5 {
		t.Errorf("SetLive with an older mtime moved ctime back: %+v", got)
	}
	release(t, n, h.Ino)
}

func TestLinkCounts(t *testing.T) {
	n, _ := newNS(t)
	for _, p := range []string{"a", "a/b", "a/c", "d"} {
		_, err := n.Mkdir(root, p, 0o755)
		must(t, err)
	}
	check := func(p string, want uint32) {
		t.Helper()
		if got := stat(t, n, p).Nlink; got != want {
			t.Errorf("%s: nlink %d, want %d", p, got, want)
		}
	}
	check("/", 4)
	check("a", 4)
	_, err := n.Rename(root, "a/b", "d/b")
	must(t, err)
	check("a", 3)
	check("d", 3)
	_, err = n.Rename(root, "a/c", "d/b") // replaces the empty d/b
	must(t, err)
	check("a", 2)
	check("d", 3)
	must(t, n.Check())
}

func TestReadDir(t *testing.T) {
	n, _ := newNS(t)
	for _, p := range []string{"z", "a", "m"} {
		release(t, n, create(t, n, root, "/"+p).Ino)
	}
	_, err := n.Mkdir(root, "dir", 0o755)
	must(t, err)
	ents, err := n.ReadDir(root, "/")
	must(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
		a := stat(t, n, e.Name)
		if a.Ino != e.Ino || a.Mode&syscall.S_IFMT != e.Mode {
			t.Errorf("%s: dirent %+v, attr %+v", e.Name, e, a)
		}
	}
	if want := []string{"a", "dir", "m", "z"}; !equalStrings(names, want) {
		t.Errorf("ReadDir names %q, want %q", names, want)
	}
	if ents, err := n.ReadDir(root, "dir/"); err != nil || len(ents) != 0 {
		t.Errorf("empty dir: %v %v", ents, err)
	}
}

// TestReadDirAfter pages through a directory two entries at a time while
// it changes between pages: every page is in order and starts after its
// cursor, a name made after the cursor is listed, one removed is not.
func TestReadDirAfter(t *testing.T) {
	n, _ := newNS(t)
	for _, p := range []string{"e", "a", "c", "g", "i"} {
		release(t, n, create(t, n, root, "/"+p).Ino)
	}
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		ents, more, err := n.ReadDirAfter(root, RootIno, "/", cursor, 2)
		must(t, err)
		for _, e := range ents {
			if e.Name <= cursor {
				t.Fatalf("page %d: %q is not after the cursor %q", page, e.Name, cursor)
			}
			got = append(got, e.Name)
			cursor = e.Name
		}
		switch page {
		case 0: // after a, c: a name after the cursor, one before, one removed
			release(t, n, create(t, n, root, "/d").Ino)
			release(t, n, create(t, n, root, "/b").Ino)
			_, err := n.Unlink(root, "g")
			must(t, err)
		}
		if !more {
			break
		}
	}
	if want := []string{"a", "c", "d", "e", "i"}; !equalStrings(got, want) {
		t.Errorf("pages listed %q, want %q", got, want)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestUnlinkWhileOpen(t *testing.T) {
	n, _ := newNS(t)
	a := create(t, n, root, "f")
	a2, created, err := n.Open(root, "f", syscall.O_RDONLY, 0) // a second open
	must(t, err)
	if created || a2.Ino != a.Ino {
		t.Fatalf("second open: %+v created=%v", a2, created)
	}
	blob, err := n.Unlink(root, "f")
	must(t, err)
	if blob != 0 {
		t.Fatalf("unlink of an open file returned blob %d", blob)
	}
	must(t, n.Check())
	if _, err := n.Stat(root, "f"); errno(t, err) != syscall.ENOENT {
		t.Fatalf("stat after unlink: %v", err)
	}
	got, err := n.GetAttr(a.Ino)
	must(t, err)
	if got.Nlink != 0 || got.Blob != uint64(a.Ino) {
		t.Fatalf("unlinked open inode: %+v", got)
	}
	must(t, n.SetLive(a.Ino, 10, got.Mtime+1)) // still writable
	if b := release(t, n, a.Ino); b != 0 {
		t.Fatalf("first release freed blob %d", b)
	}
	if b := release(t, n, a.Ino); b != uint64(a.Ino) {
		t.Fatalf("last release returned blob %d, want %d", b, a.Ino)
	}
	if _, err := n.GetAttr(a.Ino); errno(t, err) != syscall.ENOENT {
		t.Fatalf("GetAttr after the last release: %v", err)
	}
	if _, err := n.Release(a.Ino); errno(t, err) != syscall.ENOENT {
		t.Fatalf("release of a freed inode: %v", err)
	}
	if err := n.SetLive(a.Ino, 1, 1); errno(t, err) != syscall.ENOENT {
		t.Fatalf("SetLive of a freed inode: %v", err)
	}
	// Not open: the blob comes back at once.
	b := create(t, n, root, "g")
	if _, err := n.Release(b.Ino); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Release(b.Ino); errno(t, err) != syscall.EBADF {
		t.Fatalf("release of a closed inode: %v", err)
	}
	if blob, err := n.Unlink(root, "g"); err != nil || blob != uint64(b.Ino) {
		t.Fatalf("unlink of a closed file: blob %d, %v", blob, err)
	}
	must(t, n.Check())
}

func TestRenameOverFileFreesBlob(t *testing.T) {
	n, _ := newNS(t)
	src := create(t, n, root, "src")
	release(t, n, src.Ino)
	dst := create(t, n, root, "dst")
	release(t, n, dst.Ino)
	blob, err := n.Rename(root, "src", "dst")
	must(t, err)
	if blob != uint64(dst.Ino) {
		t.Fatalf("rename over a closed file returned blob %d, want %d", blob, dst.Ino)
	}
	// Over an open file: the blob comes with the last Release.
	other := create(t, n, root, "other")
	release(t, n, other.Ino)
	held, _, err := n.Open(root, "dst", syscall.O_RDONLY, 0)
	must(t, err)
	if blob, err := n.Rename(root, "other", "dst"); err != nil || blob != 0 {
		t.Fatalf("rename over an open file: blob %d, %v", blob, err)
	}
	must(t, n.Check())
	if b := release(t, n, held.Ino); b != uint64(src.Ino) {
		t.Fatalf("release of the replaced file returned %d, want %d", b, src.Ino)
	}
	if a := stat(t, n, "dst"); a.Ino != other.Ino {
		t.Fatalf("dst is %d, want %d", a.Ino, other.Ino)
	}
}

func TestFiles(t *testing.T) {
	n, _ := newNS(t)
	_, err := n.Mkdir(root, "d", 0o755)
	must(t, err)
	a := create(t, n, root, "d/a")
	b := create(t, n, root, "b")
	_, err = n.Unlink(root, "d/a") // still open: its blob is in use
	must(t, err)
	files := n.Files()
	if len(files) != 2 || files[0].Ino != a.Ino || files[1].Ino != b.Ino || files[0].Blob != uint64(a.Ino) {
		t.Fatalf("Files() = %+v", files)
	}
	release(t, n, a.Ino)
	release(t, n, b.Ino)
	if files := n.Files(); len(files) != 1 || files[0].Ino != b.Ino {
		t.Fatalf("Files() after release = %+v", files)
	}
}

func TestRmdirWhileOpen(t *testing.T) {
	n, _ := newNS(t)
	d, err := n.Mkdir(root, "d", 0o755)
	must(t, err)
	h, _, err := n.Open(root, "d", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	must(t, err)
	must(t, n.Rmdir(root, "d"))
	must(t, n.Check())
	if a, err := n.GetAttr(d.Ino); err != nil || a.Nlink != 0 {
		t.Fatalf("removed open dir: %+v %v", a, err)
	}
	if b := release(t, n, h.Ino); b != 0 {
		t.Fatalf("directory release returned blob %d", b)
	}
	if _, err := n.GetAttr(d.Ino); errno(t, err) != syscall.ENOENT {
		t.Fatalf("dir after release: %v", err)
	}
}

func TestSetLiveErrors(t *testing.T) {
	n, _ := newNS(t)
	if err := n.SetLive(RootIno, 1, 1); errno(t, err) != syscall.EISDIR {
		t.Errorf("SetLive on a directory: %v", err)
	}
	if err := n.SetLive(99, 1, 1); errno(t, err) != syscall.ENOENT {
		t.Errorf("SetLive on a missing inode: %v", err)
	}
	a := create(t, n, root, "f")
	if err := n.SetLive(a.Ino, -1, 1); errno(t, err) != syscall.EINVAL {
		t.Errorf("SetLive with a negative size: %v", err)
	}
	release(t, n, a.Ino)
}

func TestOrphansAfterRestart(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	n := openMem(t, m, testOpts(clk))
	a := create(t, n, root, "f")
	b := create(t, n, root, "g")
	_, err := n.Unlink(root, "f")
	must(t, err)
	_, err = n.Unlink(root, "g")
	must(t, err)
	release(t, n, b.Ino) // freed now, not an orphan
	if got := n.PendingDeletes(); !slices.Equal(got, []uint64{uint64(b.Ino)}) {
		t.Fatalf("PendingDeletes() = %v, want [%d]", got, b.Ino)
	}
	must(t, n.Close()) // a stays open: its handle dies with the service
	n2 := openMem(t, m, testOpts(clk))
	if got := n2.Orphans(); len(got) != 1 || got[0] != uint64(a.Ino) {
		t.Fatalf("Orphans() = %v, want [%d]", got, a.Ino)
	}
	// Held for a reopen until ReleaseHeld.
	if got := n2.Held(); !slices.Equal(got, []Ino{a.Ino}) {
		t.Fatalf("Held() = %v, want [%d]", got, a.Ino)
	}
	must(t, n2.Check())
	blobs, err := n2.ReleaseHeld()
	must(t, err)
	if !slices.Equal(blobs, []uint64{uint64(a.Ino)}) {
		t.Fatalf("ReleaseHeld() = %v, want [%d]", blobs, a.Ino)
	}
	if _, err := n2.GetAttr(a.Ino); errno(t, err) != syscall.ENOENT {
		t.Fatalf("orphan still present: %v", err)
	}
	if got := n2.PendingDeletes(); !slices.Equal(got, []uint64{uint64(a.Ino), uint64(b.Ino)}) {
		t.Fatalf("PendingDeletes() = %v, want both blobs", got)
	}
	must(t, n2.BlobGone(uint64(b.Ino)))
	if err := n2.BlobGone(uint64(b.Ino)); errno(t, err) != syscall.ENOENT {
		t.Fatalf("BlobGone twice: %v", err)
	}
	must(t, n2.Close())
	n3 := openMem(t, m, testOpts(clk))
	if got := n3.Orphans(); len(got) != 0 {
		t.Fatalf("orphans reported twice: %v", got)
	}
	// The pending delete survived the restart; the gone one did not come back.
	if got := n3.PendingDeletes(); !slices.Equal(got, []uint64{uint64(a.Ino)}) {
		t.Fatalf("PendingDeletes() after restart = %v, want [%d]", got, a.Ino)
	}
	c := create(t, n3, root, "h")
	if c.Ino <= b.Ino {
		t.Fatalf("inode number %d reused (last was %d)", c.Ino, b.Ino)
	}
	release(t, n3, c.Ino)
}

// TestReopenHeld: a file unlinked while open survives a restart for its
// holder, who reopens it by number; it goes when that open is released.
func TestReopenHeld(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	n := openMem(t, m, testOpts(clk))
	a := create(t, n, root, "f")
	_, err := n.Unlink(root, "f")
	must(t, err)
	must(t, n.Close())
	n2 := openMem(t, m, testOpts(clk))
	// Unlinked while open: no longer anyone's to open by path, so its
	// mode is not checked (another uid, a mode of 0).
	err = n2.FChmod(root, a.Ino, 0)
	must(t, err)
	got, err := n2.Reopen(Cred{UID: 4242, GID: 4242}, a.Ino, syscall.O_RDWR)
	must(t, err)
	if got.Ino != a.Ino || got.Nlink != 0 {
		t.Fatalf("Reopen = %+v", got)
	}
	if blobs, err := n2.ReleaseHeld(); err != nil || len(blobs) != 0 {
		t.Fatalf("ReleaseHeld freed a reopened file: %v, %v", blobs, err)
	}
	must(t, n2.Check())
	if blob := release(t, n2, a.Ino); blob != uint64(a.Ino) {
		t.Fatalf("last release of the reopened orphan returned blob %d", blob)
	}
	if _, err := n2.Reopen(root, a.Ino, syscall.O_RDONLY); errno(t, err) != syscall.ENOENT {
		t.Fatalf("Reopen of a freed inode: %v", err)
	}
	// A file with a name must still allow the access to anyone but its owner.
	u, other := Cred{UID: 1000, GID: 1000}, Cred{UID: 1001, GID: 1001}
	b := create(t, n2, root, "g")
	must(t, n2.FChown(root, b.Ino, int(u.UID), int(u.GID)))
	release(t, n2, b.Ino)
	for _, c := range []struct {
		mode  uint32
		flags int
		want  error
	}{
		{0o666, syscall.O_RDWR, nil},
		{0o644, syscall.O_RDWR, syscall.EACCES},
		{0o644, syscall.O_RDONLY, nil},
		{0o622, syscall.O_RDONLY, syscall.EACCES},
		{0o622, syscall.O_WRONLY, nil},
		{0o000, syscall.O_RDONLY, syscall.EACCES},
	} {
		err = n2.FChmod(u, b.Ino, c.mode)
		must(t, err)
		// Its owner keeps every access (it could chmod the file back).
		if _, err := n2.Reopen(u, b.Ino, syscall.O_RDWR); err != nil {
			t.Errorf("owner's Reopen(mode %o) = %v", c.mode, err)
		} else {
			release(t, n2, b.Ino)
		}
		_, err := n2.Reopen(other, b.Ino, c.flags)
		if c.want == nil {
			must(t, err)
			release(t, n2, b.Ino)
		} else if errno(t, err) != c.want {
			t.Errorf("Reopen(mode %o, flags %#x) = %v, want %v", c.mode, c.flags, err, c.want)
		}
	}
	must(t, n2.Close())
}

// TestIncarnations: every open starts a newer incarnation; the stack id and
// ticket key are chosen once, and a read-only open starts none.
func TestIncarnations(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	n := openMem(t, m, testOpts(clk))
	if n.Incarnation() != 1 || n.StackID() == ([16]byte{}) || n.TicketKey() == ([32]byte{}) {
		t.Fatalf("first open: incarnation %d, stack %x, key zero %v", n.Incarnation(), n.StackID(), n.TicketKey() == [32]byte{})
	}
	id, key := n.StackID(), n.TicketKey()
	must(t, n.Close())
	for want := uint32(2); want <= 4; want++ {
		n = openMem(t, m, testOpts(clk))
		if n.Incarnation() != want || n.StackID() != id || n.TicketKey() != key {
			t.Fatalf("open %d: incarnation %d, same id %v, same key %v", want, n.Incarnation(), n.StackID() == id, n.TicketKey() == key)
		}
		if want == 3 {
			n.crash() // a crash does not lose the incarnation: it was synced at open
			continue
		}
		must(t, n.Close())
	}
	o := testOpts(clk)
	o.ReadOnly = true
	ro, err := open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	if ro.Incarnation() != 4 {
		t.Errorf("read-only open: incarnation %d, want the last one, 4", ro.Incarnation())
	}
	must(t, ro.Close())
	n = openMem(t, m, testOpts(clk))
	if n.Incarnation() != 5 {
		t.Errorf("after a read-only open: incarnation %d, want 5", n.Incarnation())
	}
	must(t, n.Close())
}

// TestReadOnlyChangesNothing: an offline check's open leaves every file
// byte for byte as it was, torn tail and unnamed inodes included, and
// refuses mutations.
func TestReadOnlyChangesNothing(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	n := openMem(t, m, testOpts(clk))
	create(t, n, root, "keep")
	a := create(t, n, root, "open")
	_, err := n.Unlink(root, "open")
	must(t, err)
	_ = a
	n.crash()
	img := m.Snapshot()
	o := testOpts(clk)
	o.ReadOnly = true
	ro, err := open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	if _, err := ro.Stat(root, "keep"); err != nil {
		t.Fatalf("read-only stat: %v", err)
	}
	if _, err := ro.Mkdir(root, "d", 0o755); !errors.Is(err, syscall.EIO) || !errors.Is(err, wal.ErrReadOnly) {
		t.Fatalf("read-only mkdir: %v, want EIO (read-only)", err)
	}
	if _, err := ro.ReleaseHeld(); err == nil {
		t.Fatal("read-only ReleaseHeld succeeded")
	}
	must(t, ro.Check())
	must(t, ro.Close())
	names, _ := m.List(o.Dir)
	before, _ := img.List(o.Dir)
	if !slices.Equal(names, before) {
		t.Fatalf("files changed: %v, was %v", names, before)
	}
	for _, name := range names {
		x, _ := m.ReadFile(o.Dir + "/" + name)
		y, _ := img.ReadFile(o.Dir + "/" + name)
		if string(x) != string(y) {
			t.Errorf("%s changed", name)
		}
	}
}

// TestAtOperations: path operations relative to a directory, as the
// *at() system calls, and attribute changes by inode.
func TestAtOperations(t *testing.T) {
	n, _ := newNS(t)
	d, err := n.Mkdir(root, "d", 0o755)
	must(t, err)
	_, err = n.MkdirAt(root, d.Ino, "sub", 0o700)
	must(t, err)
	f, _, err := n.OpenAt(root, d.Ino, "sub/f", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
	must(t, err)
	if got := stat(t, n, "/d/sub/f"); got.Ino != f.Ino {
		t.Fatalf("OpenAt created %d, /d/sub/f is %d", f.Ino, got.Ino)
	}
	// Relative paths start at the directory, absolute ones at the root,
	// and ".." climbs out of it.
	if a, err := n.StatAt(root, d.Ino, "/d"); err != nil || a.Ino != d.Ino {
		t.Fatalf("StatAt(/d) = %+v, %v", a, err)
	}
	if a, err := n.StatAt(root, d.Ino, "../d/sub/f"); err != nil || a.Ino != f.Ino {
		t.Fatalf("StatAt(../d/sub/f) = %+v, %v", a, err)
	}
	if _, err := n.StatAt(root, f.Ino, "x"); errno(t, err) != syscall.ENOTDIR {
		t.Fatalf("StatAt from a file: %v, want ENOTDIR", err)
	}
	if _, err := n.StatAt(root, 999, "x"); errno(t, err) != syscall.EBADF {
		t.Fatalf("StatAt from a missing inode: %v, want EBADF", err)
	}
	_, err = n.RenameAt(root, d.Ino, "sub/f", RootIno, "g")
	must(t, err)
	ents, err := n.ReadDirAt(root, d.Ino, "sub")
	must(t, err)
	if len(ents) != 0 {
		t.Fatalf("sub still holds %v", ents)
	}
	if _, err := n.ChmodAt(root, RootIno, "g", 0o600); err != nil {
		t.Fatal(err)
	}
	must(t, n.FChmod(root, f.Ino, 0o640))
	must(t, n.FChown(root, f.Ino, -1, 77))
	must(t, n.FChtimes(root, f.Ino, 5, TimeOmit))
	a := stat(t, n, "g")
	if a.Mode&0o7777 != 0o640 || a.GID != 77 || a.Atime != 5 {
		t.Fatalf("after FChmod/FChown/FChtimes: %+v", a)
	}
	if err := n.FChmod(u1, f.Ino, 0o777); errno(t, err) != syscall.EPERM {
		t.Fatalf("FChmod by a non-owner: %v, want EPERM", err)
	}
	if err := n.FChmod(root, 12345, 0o777); errno(t, err) != syscall.EBADF {
		t.Fatalf("FChmod of a missing inode: %v, want EBADF", err)
	}
	// A removed directory that is still open: lookups find nothing,
	// creating in it is ENOENT, "." is still itself.
	sub := stat(t, n, "d/sub")
	_, _, err = n.Open(root, "d/sub", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	must(t, err)
	must(t, n.Rmdir(root, "d/sub"))
	if _, _, err := n.OpenAt(root, sub.Ino, "new", syscall.O_CREAT|syscall.O_WRONLY, 0o644); errno(t, err) != syscall.ENOENT {
		t.Fatalf("create in a removed directory: %v, want ENOENT", err)
	}
	if _, err := n.MkdirAt(root, sub.Ino, "new", 0o755); errno(t, err) != syscall.ENOENT {
		t.Fatalf("mkdir in a removed directory: %v, want ENOENT", err)
	}
	if _, err := n.RenameAt(root, RootIno, "g", sub.Ino, "g"); errno(t, err) != syscall.ENOENT {
		t.Fatalf("rename into a removed directory: %v, want ENOENT", err)
	}
	if a, err := n.StatAt(root, sub.Ino, "."); err != nil || a.Ino != sub.Ino || a.Nlink != 0 {
		t.Fatalf("stat . of a removed directory: %+v, %v", a, err)
	}
	release(t, n, sub.Ino)
	release(t, n, f.Ino)
	must(t, n.Check())
}

func TestClosed(t *testing.T) {
	n, _ := newNS(t)
	must(t, n.Close())
	must(t, n.Close())
	_, err := n.Stat(root, "/")
	var ioe *IOError
	if !errors.As(err, &ioe) || !errors.Is(err, ErrClosed) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Stat after Close: %v", err)
	}
	if _, err := n.Mkdir(root, "x", 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Mkdir after Close: %v", err)
	}
	if err := n.Sync(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sync after Close: %v", err)
	}
}

func TestDirectoryLocked(t *testing.T) {
	dir := t.TempDir()
	n, err := Open(Options{Dir: dir})
	must(t, err)
	if _, err := Open(Options{Dir: dir}); err == nil {
		t.Fatal("a second Open of the same directory succeeded")
	}
	must(t, n.Close())
	n, err = Open(Options{Dir: dir})
	must(t, err)
	must(t, n.Close())
}

// TestInodeNumbersEnd: a stray blob past the last inode number is refused
// (it would wrap the allocation counter: found by FuzzDecodeRecord); one
// at the last number moves the counter past it, after which creates are
// ENOSPC rather than a reused or wrapped number, also after a restart.
func TestInodeNumbersEnd(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	n := openMem(t, m, testOpts(clk))
	for _, b := range []uint64{0, uint64(MaxIno) + 1, ^uint64(0)} {
		if err := n.MarkDead(b); errno(t, err) != syscall.EINVAL {
			t.Fatalf("MarkDead(%d) = %v, want EINVAL", b, err)
		}
	}
	must(t, n.MarkDead(uint64(MaxIno)))
	must(t, n.Check())
	for round := range 2 {
		if _, _, err := n.Open(root, "f", syscall.O_CREAT|syscall.O_RDWR, 0o644); errno(t, err) != syscall.ENOSPC {
			t.Fatalf("round %d: create past the last inode number: %v, want ENOSPC", round, err)
		}
		if _, err := n.Mkdir(root, "d", 0o755); errno(t, err) != syscall.ENOSPC {
			t.Fatalf("round %d: mkdir past the last inode number: %v, want ENOSPC", round, err)
		}
		must(t, n.Close())
		n = openMem(t, m, testOpts(clk))
		must(t, n.Check())
	}
	must(t, n.Close())
}

// TestRemovedDirectoryHandle: a directory handle whose directory was
// removed is still a valid start. Its ".." is the directory it was
// removed from, as on Linux; once that one is removed and freed too, ".."
// is ENOENT (Linux still finds the removed parent, which the child pins:
// docs/posix-differences.md). Lookups, renames and creates from it fail
// cleanly (this used to dereference the freed parent). The kernel is asked
// the same.
func TestRemovedDirectoryHandle(t *testing.T) {
	n, _ := newNS(t)
	a, err := n.Mkdir(root, "a", 0o755)
	must(t, err)
	_, err = n.Mkdir(root, "a/b", 0o755)
	must(t, err)
	x := create(t, n, root, "a/x")
	release(t, n, x.Ino)
	b, _, err := n.Open(root, "a/b", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	must(t, err)
	must(t, n.Rmdir(root, "a/b"))
	if got, err := n.StatAt(root, b.Ino, ".."); err != nil || got.Ino != a.Ino {
		t.Errorf("StatAt(removed, ..) with its parent alive = %+v, %v; want the parent", got, err)
	}
	if got, err := n.StatAt(root, b.Ino, "../x"); err != nil || got.Ino != x.Ino {
		t.Errorf("StatAt(removed, ../x) with its parent alive = %+v, %v; want a/x", got, err)
	}
	_, err = n.Unlink(root, "a/x")
	must(t, err)
	must(t, n.Rmdir(root, "a"))
	f := create(t, n, root, "f")
	release(t, n, f.Ino)
	for _, p := range []string{"..", "../x", "./..", "x"} {
		if _, err := n.StatAt(root, b.Ino, p); errno(t, err) != syscall.ENOENT {
			t.Errorf("StatAt(removed, %q) with its parent freed = %v, want ENOENT", p, err)
		}
	}
	if _, err := n.RenameAt(root, RootIno, "f", b.Ino, "g"); errno(t, err) != syscall.ENOENT {
		t.Errorf("rename into the removed directory: %v, want ENOENT", err)
	}
	if _, err := n.RenameAt(root, b.Ino, "../y", RootIno, "g"); errno(t, err) != syscall.ENOENT {
		t.Errorf("rename from .. of the removed directory: %v, want ENOENT", err)
	}
	if _, err := n.RenameAt(root, b.Ino, "..", RootIno, "g"); errno(t, err) != syscall.EBUSY {
		t.Errorf("rename of .. of the removed directory: %v, want EBUSY", err)
	}
	if _, err := n.MkdirAt(root, b.Ino, "../c", 0o755); errno(t, err) != syscall.ENOENT {
		t.Errorf("mkdir via .. of the removed directory: %v, want ENOENT", err)
	}
	release(t, n, b.Ino)
	must(t, n.Check())

	// The kernel, for the record.
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "a/b"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "a/x"), nil, 0o644))
	fd, err := unix.Open(filepath.Join(dir, "a/b"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(fd)
	must(t, os.Remove(filepath.Join(dir, "a/b")))
	var st, ast unix.Stat_t
	must(t, unix.Stat(filepath.Join(dir, "a"), &ast))
	if err := unix.Fstatat(fd, "..", &st, 0); err != nil || st.Ino != ast.Ino {
		t.Errorf("kernel: fstatat(removed, ..) = %v, ino %d; want a (%d)", err, st.Ino, ast.Ino)
	}
	if err := unix.Fstatat(fd, "../x", &st, 0); err != nil {
		t.Errorf("kernel: fstatat(removed, ../x) = %v; want a/x", err)
	}
	must(t, os.Remove(filepath.Join(dir, "a/x")))
	must(t, os.Remove(filepath.Join(dir, "a")))
	for _, p := range []string{"../x", "x"} {
		if err := unix.Fstatat(fd, p, &st, 0); err != unix.ENOENT {
			t.Errorf("kernel: fstatat(removed, %q) = %v, want ENOENT", p, err)
		}
	}
	if err := unix.Mkdirat(fd, "../c", 0o755); err != unix.ENOENT {
		t.Errorf("kernel: mkdirat(removed, ../c) = %v, want ENOENT", err)
	}
	if err := unix.Fstatat(fd, "..", &st, 0); err != nil {
		t.Errorf("kernel: fstatat(removed, ..) with its parent removed = %v; the difference documented is that Linux finds it", err)
	}
}
