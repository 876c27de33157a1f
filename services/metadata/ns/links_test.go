package ns

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/internal/vfs"
)

// follows checks that err is a *FollowError for path[start:end] (of the
// second path if second) with target.
func follows(t *testing.T, what string, err error, start, end int, target string, second bool) {
	t.Helper()
	var fe *FollowError
	if !errors.As(err, &fe) {
		t.Fatalf("%s: %v, want a FollowError", what, err)
	}
	if fe.Start != start || fe.End != end || fe.Target != target || fe.Second != second {
		t.Fatalf("%s: %+v, want [%d:%d] -> %q second=%v", what, *fe, start, end, target, second)
	}
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if got := errno(t, err); got != want {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

func TestSymlinkSemantics(t *testing.T) {
	n, _ := newNS(t)
	fixture(t, n)
	a, err := n.SymlinkAt(u1, "../a/b", RootIno, "u1d/l")
	must(t, err)
	if a.Mode != syscall.S_IFLNK|0o777 || a.Size != 6 || a.UID != 1001 || a.Nlink != 1 || a.Blob != 0 {
		t.Fatalf("new link: %+v", a)
	}
	la, err := n.LstatAt(root, RootIno, "u1d/l")
	must(t, err)
	if la != a {
		t.Fatalf("lstat %+v, want %+v", la, a)
	}
	tgt, err := n.ReadlinkAt(u2, RootIno, "/u1d/l")
	must(t, err)
	if tgt != "../a/b" {
		t.Fatalf("readlink %q", tgt)
	}
	_, err = n.StatAt(root, RootIno, "u1d/l")
	follows(t, "stat of the link", err, 4, 5, "../a/b", false)
	_, err = n.StatAt(root, RootIno, "/u1d//l/c/")
	follows(t, "stat through the link", err, 6, 7, "../a/b", false)
	_, err = n.LstatAt(root, RootIno, "u1d/l/")
	follows(t, "lstat with a trailing slash follows", err, 4, 5, "../a/b", false)
	_, err = n.ReadDirAt(root, RootIno, "u1d/l")
	follows(t, "readdir", err, 4, 5, "../a/b", false)
	_, _, err = n.OpenAt(root, RootIno, "u1d/l", syscall.O_RDONLY, 0)
	follows(t, "open", err, 4, 5, "../a/b", false)
	_, _, err = n.OpenAt(root, RootIno, "u1d/l", syscall.O_RDONLY|syscall.O_NOFOLLOW, 0)
	wantErrno(t, "open O_NOFOLLOW", err, syscall.ELOOP)
	_, _, err = n.OpenAt(root, RootIno, "u1d/l", syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o644)
	wantErrno(t, "exclusive create over a link", err, syscall.EEXIST)
	_, _, err = n.OpenAt(root, RootIno, "u1d/l", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
	follows(t, "create through a link", err, 4, 5, "../a/b", false)
	wantErrno(t, "chmod follows", func() error { _, err := n.ChmodAt(root, RootIno, "u1d/l", 0o700); return asFollowErrno(err) }(), syscall.ELOOP)
	_, err = n.LchownAt(u1, RootIno, "u1d/l", -1, 3000)
	must(t, err)
	must(t, n.LchtimesAt(u1, RootIno, "u1d/l", 5, 6))
	if la, _ := n.LstatAt(root, RootIno, "u1d/l"); la.GID != 3000 || la.Atime != 5 || la.Mtime != 6 {
		t.Fatalf("lchown and lutimes: %+v", la)
	}
	_, err = n.ReadlinkAt(root, RootIno, "f")
	wantErrno(t, "readlink of a file", err, syscall.EINVAL)
	_, err = n.ReadlinkAt(root, RootIno, "d")
	wantErrno(t, "readlink of a directory", err, syscall.EINVAL)
	_, err = n.ReadlinkAt(u2, RootIno, "nox/nf")
	wantErrno(t, "readlink in an unsearchable directory", err, syscall.EACCES)
	wantErrno(t, "rmdir of a link", n.RmdirAt(root, RootIno, "u1d/l"), syscall.ENOTDIR)
	_, err = n.MkdirAt(root, RootIno, "u1d/l", 0o755)
	wantErrno(t, "mkdir over a link", err, syscall.EEXIST)

	// Creation errors, in filename_create's order.
	for _, c := range []struct {
		cred         Cred
		target, path string
		want         syscall.Errno
	}{
		{root, "", "nl", syscall.ENOENT},
		{root, "x\x00y", "nl", syscall.EINVAL},
		{root, strings.Repeat("x", 4096), "nl", syscall.ENAMETOOLONG},
		{root, "x", "u1d/l", syscall.EEXIST},
		{root, "x", "f", syscall.EEXIST},
		{root, "x", ".", syscall.EEXIST},
		{root, "x", "new/", syscall.ENOENT},
		{root, "x", "f/", syscall.EEXIST},
		{root, "x", "missing/nl", syscall.ENOENT},
		{root, "x", "f/nl", syscall.ENOTDIR},
		{u2, "x", "ro/nl", syscall.EACCES},
		{u2, "x", "nox/nl", syscall.EACCES},
	} {
		_, err := n.SymlinkAt(c.cred, c.target, RootIno, c.path)
		wantErrno(t, "symlink "+c.path, err, c.want)
	}
	// A dangling link is a name like any other.
	_, err = n.SymlinkAt(root, "nowhere", RootIno, "dangle")
	must(t, err)
	_, err = n.SymlinkAt(root, "x", RootIno, "dangle")
	wantErrno(t, "symlink over a dangling link", err, syscall.EEXIST)
	// In a setgid directory a link takes the directory's group.
	a, err = n.SymlinkAt(u1, "f", RootIno, "sg/l")
	must(t, err)
	if a.GID != 2000 {
		t.Fatalf("link in a setgid directory: gid %d", a.GID)
	}

	// unlink and rename move the link itself.
	_, err = n.RenameAt(root, RootIno, "dangle", RootIno, "d/dangle2")
	must(t, err)
	if tgt, _ := n.ReadlinkAt(root, RootIno, "d/dangle2"); tgt != "nowhere" {
		t.Fatalf("renamed link reads %q", tgt)
	}
	blob, err := n.UnlinkAt(root, RootIno, "d/dangle2")
	must(t, err)
	if blob != 0 {
		t.Fatalf("unlink of a link frees blob %d", blob)
	}
	_, err = n.RenameAt(root, RootIno, "x/../u1d/l/c", RootIno, "z")
	wantErrno(t, "rename from a missing directory", err, syscall.ENOENT)
	_, err = n.RenameAt(root, RootIno, "f", RootIno, "u1d/l/f")
	follows(t, "rename into a link", err, 4, 5, "../a/b", true)
}

// asFollowErrno turns a FollowError into ELOOP, for table checks.
func asFollowErrno(err error) error {
	var fe *FollowError
	if errors.As(err, &fe) {
		return syscall.ELOOP
	}
	return err
}

func TestProtectedSymlinks(t *testing.T) {
	n, _ := newNS(t)
	fixture(t, n)
	// pub is root's 1777 directory; s1 is u1's.
	_, err := n.SymlinkAt(u1, "u1f", RootIno, "pub/l1")
	must(t, err)
	_, err = n.StatAt(u1, RootIno, "pub/l1")
	follows(t, "the owner follows", err, 4, 6, "u1f", false)
	_, err = n.StatAt(u2, RootIno, "pub/l1")
	wantErrno(t, "another user", err, syscall.EACCES)
	_, err = n.StatAt(root, RootIno, "pub/l1/x")
	wantErrno(t, "root too", err, syscall.EACCES)
	_, err = n.LstatAt(u2, RootIno, "pub/l1")
	must(t, err) // not followed: no check
	_, err = n.SymlinkAt(u1, "other", RootIno, "s1/l")
	must(t, err)
	_, err = n.StatAt(u2, RootIno, "s1/l")
	follows(t, "the directory's owner owns the link", err, 3, 4, "other", false)
	_, err = n.SymlinkAt(root, "f", RootIno, "pubns/l")
	must(t, err)
	_, err = n.StatAt(u2, RootIno, "pubns/l")
	follows(t, "not sticky", err, 6, 7, "f", false)
}

func TestHardLinks(t *testing.T) {
	n, _ := newNS(t)
	fixture(t, n)
	a, err := n.LinkAt(root, RootIno, "f", RootIno, "d/f-again", false)
	must(t, err)
	if a.Nlink != 2 {
		t.Fatalf("nlink after link: %d", a.Nlink)
	}
	b, err := n.StatAt(root, RootIno, "d/f-again")
	must(t, err)
	if b.Ino != a.Ino || b.Nlink != 2 || b.Blob != a.Blob {
		t.Fatalf("the new name: %+v, want inode %d", b, a.Ino)
	}
	blob, err := n.UnlinkAt(root, RootIno, "f")
	must(t, err)
	if blob != 0 {
		t.Fatalf("unlink of one of two names frees blob %d", blob)
	}
	b, err = n.StatAt(root, RootIno, "d/f-again")
	must(t, err)
	if b.Nlink != 1 {
		t.Fatalf("nlink after unlink: %d", b.Nlink)
	}
	// Renaming a name onto another name of the same file does nothing.
	_, err = n.LinkAt(root, RootIno, "d/f-again", RootIno, "f", false)
	must(t, err)
	_, err = n.RenameAt(root, RootIno, "f", RootIno, "d/f-again")
	must(t, err)
	if _, err := n.StatAt(root, RootIno, "f"); err != nil {
		t.Fatalf("rename between names of one file removed the source: %v", err)
	}
	// Renaming over the last other name frees nothing while a name is left.
	_, err = n.LinkAt(root, RootIno, "f2", RootIno, "f2b", false)
	must(t, err)
	blob, err = n.RenameAt(root, RootIno, "f", RootIno, "f2b")
	must(t, err)
	if blob != 0 {
		t.Fatalf("rename over one of two names frees blob %d", blob)
	}
	blob, err = n.UnlinkAt(root, RootIno, "f2")
	must(t, err)
	if blob == 0 {
		t.Fatal("unlink of the last name freed nothing")
	}

	for _, c := range []struct {
		cred     Cred
		old, new string
		want     syscall.Errno
	}{
		{root, "d", "d2", syscall.EPERM},
		{root, "missing", "x", syscall.ENOENT},
		{root, "f2b", "d/f-again", syscall.EEXIST},
		{root, "f2b", "nf/", syscall.ENOENT},
		{root, "f2b", "f2b/", syscall.EEXIST},
		{root, "f2b", ".", syscall.EEXIST},
		{u2, "ro/rof", "wd/x", syscall.EPERM},    // protected_hardlinks: no write permission
		{u2, "u1d/suidw", "wd/x", syscall.EPERM}, // setuid
		{u2, "u1d/sgidw", "wd/x", syscall.EPERM}, // setgid-executable
		{u2, "ro/rof2", "wd/x", 0},               // rw for others: allowed
		{u2, "ro/rof2", "ro/x", syscall.EACCES},  // no write permission on the new directory
		{u1, "u1d/u1file", "wd/y", 0},            // the owner
	} {
		_, err := n.LinkAt(c.cred, RootIno, c.old, RootIno, c.new, false)
		wantErrno(t, "link "+c.old+" "+c.new, err, c.want)
	}

	// A link to a symbolic link: the link itself unless follow.
	_, err = n.SymlinkAt(root, "f2b", RootIno, "sl")
	must(t, err)
	a, err = n.LinkAt(root, RootIno, "sl", RootIno, "sl2", false)
	must(t, err)
	if !a.IsLink() || a.Nlink != 2 {
		t.Fatalf("hard link of a symbolic link: %+v", a)
	}
	_, err = n.LinkAt(root, RootIno, "sl", RootIno, "sl3", true)
	follows(t, "link with follow", err, 0, 2, "f2b", false)
	_, err = n.LinkAt(root, RootIno, "f2b", RootIno, "sl/x", false)
	follows(t, "link into a path through a link", err, 0, 2, "f2b", true)

	// An unlinked file that is still open takes no new name (replay
	// refuses a record that gives it one).
	o, _, err := n.OpenAt(root, RootIno, "tmpf", syscall.O_CREAT|syscall.O_RDWR, 0o644)
	must(t, err)
	_, err = n.UnlinkAt(root, RootIno, "tmpf")
	must(t, err)
	n.mu.Lock()
	err = n.st.applyLink(&linkRec{parent: RootIno, ino: o.Ino, name: "back"})
	n.mu.Unlock()
	if err == nil {
		t.Fatal("a link record gave a nameless inode a name")
	}
	_, err = n.Release(o.Ino)
	must(t, err)
}

// TestLinksSurviveRestart: links come back from the WAL after a crash and
// from a checkpoint after a clean close, with their targets.
func TestLinksSurviveRestart(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	o := testOpts(clk)
	o.SyncEveryOp = true
	n, err := open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	fixture(t, n)
	_, err = n.SymlinkAt(u1, "/somewhere/else", RootIno, "u1d/abs")
	must(t, err)
	_, err = n.SymlinkAt(root, "a/b/g", RootIno, "rel")
	must(t, err)
	_, err = n.LinkAt(root, RootIno, "a/b/g", RootIno, "d/g2", false)
	must(t, err)
	_, err = n.LinkAt(root, RootIno, "rel", RootIno, "rel2", false)
	must(t, err)
	before := dump(n)
	n.crash()
	n, err = open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	if after := dump(n); after != before {
		t.Fatalf("after a crash:\n%s", diff(before, after))
	}
	must(t, n.Close()) // a checkpoint
	n, err = open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	if after := dump(n); after != before {
		t.Fatalf("from the checkpoint:\n%s", diff(before, after))
	}
	if tgt, err := n.ReadlinkAt(root, RootIno, "u1d/abs"); err != nil || tgt != "/somewhere/else" {
		t.Fatalf("readlink after restart: %q, %v", tgt, err)
	}
	must(t, n.Check())
	must(t, n.Close())
}

func TestCheckFindsBadLinks(t *testing.T) {
	n, _ := newNS(t)
	_, err := n.SymlinkAt(root, "abc", RootIno, "l")
	must(t, err)
	n.mu.Lock()
	l := n.st.inodes[n.st.root().entries["l"]]
	l.attr.Size = 7
	n.mu.Unlock()
	if err := n.Check(); err == nil {
		t.Fatal("Check passed a link whose size is not its target's length")
	}
	n.mu.Lock()
	l.attr.Size = 3
	l.attr.Nlink = 2
	n.mu.Unlock()
	if err := n.Check(); err == nil {
		t.Fatal("Check passed a link with a wrong nlink")
	}
	n.mu.Lock()
	l.attr.Nlink = 1
	n.mu.Unlock()
}

// TestMountedRootDotDot: for a Mounted caller ".." of the root leads out
// of the namespace (a FollowError with Above), in the middle of a path
// and at its end; otherwise it is the root, as under chroot.
func TestMountedRootDotDot(t *testing.T) {
	n, _ := newNS(t)
	fixture(t, n)
	m := root
	m.Mounted = true
	_, err := n.StatAt(m, RootIno, "a/../../etc")
	var fe *FollowError
	if !errors.As(err, &fe) || !fe.Above || fe.Start != 5 || fe.End != 7 {
		t.Fatalf("a/../../etc: %v", err)
	}
	_, err = n.StatAt(m, RootIno, "a/b/../..")
	if err != nil {
		t.Fatalf("a/b/../.. stays inside: %v", err)
	}
	_, err = n.StatAt(m, RootIno, "..")
	if !errors.As(err, &fe) || !fe.Above || fe.Start != 0 || fe.End != 2 {
		t.Fatalf("..: %v", err)
	}
	if a, err := n.StatAt(root, RootIno, "a/../../f"); err != nil || a.Ino == 0 {
		t.Fatalf("not mounted, .. of the root is the root: %v", err)
	}
}
