package client_test

import (
	"errors"
	"io/fs"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/client"
)

// TestLinks: the Go client makes and follows symbolic and hard links as
// package os does on Linux: relative targets, absolute ones under the
// mount, chains, loops (ELOOP), links to directories (listing, opening,
// creating through them), lstat and lchown, hard links' shared inode,
// and a link out of weir (EXDEV: this client reaches only weir).
func TestLinks(t *testing.T) {
	c, _ := newFS(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.MkdirAll("lk/sub", 0o755))
	must(c.WriteFile("lk/sub/f", []byte("data"), 0o644))
	must(c.Symlink("sub/f", "lk/rel"))
	must(c.Symlink("/weir/lk/sub", "lk/abs"))
	must(c.Symlink("rel", "lk/chain"))
	must(c.Symlink("../lk/abs/f", "lk/up"))
	must(c.Symlink("nowhere", "lk/dangling"))
	for _, p := range []string{"lk/rel", "lk/abs/f", "lk/chain", "lk/up"} {
		if b, err := c.ReadFile(p); err != nil || string(b) != "data" {
			t.Errorf("read %s: %q %v", p, b, err)
		}
	}
	if t1, err := c.Readlink("lk/chain"); err != nil || t1 != "rel" {
		t.Errorf("readlink: %q %v", t1, err)
	}
	if _, err := c.Readlink("lk/sub/f"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("readlink of a file: %v", err)
	}
	fi, err := c.Lstat("lk/chain")
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 || fi.Size() != 3 {
		t.Errorf("lstat of a link: %v %v", fi, err)
	}
	if fi, err := c.Stat("lk/chain"); err != nil || !fi.Mode().IsRegular() || fi.Size() != 4 {
		t.Errorf("stat through two links: %v %v", fi, err)
	}
	if _, err := c.Stat("lk/dangling"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat of a dangling link: %v", err)
	}
	ents, err := c.ReadDir("lk/abs")
	if err != nil || len(ents) != 1 || ents[0].Name() != "f" {
		t.Errorf("readdir through a link: %v %v", ents, err)
	}
	lents, err := c.ReadDir("lk")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range lents {
		if e.Name() == "rel" && e.Type() != fs.ModeSymlink {
			t.Errorf("readdir type of a link: %v", e.Type())
		}
	}
	// Creating through a dangling link creates its target.
	must(c.WriteFile("lk/dangling", []byte("new"), 0o644))
	if b, err := c.ReadFile("lk/nowhere"); err != nil || string(b) != "new" {
		t.Errorf("create through a dangling link: %q %v", b, err)
	}
	must(c.Mkdir("lk/abs/made", 0o755)) // a path through a link
	if fi, err := c.Stat("lk/sub/made"); err != nil || !fi.IsDir() {
		t.Errorf("mkdir through a link: %v %v", fi, err)
	}
	must(c.Symlink("loop2", "lk/loop1"))
	must(c.Symlink("loop1", "lk/loop2"))
	if _, err := c.Stat("lk/loop1"); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("stat of a loop: %v", err)
	}
	must(c.Symlink("/etc", "lk/out"))
	if _, err := c.Stat("lk/out/passwd"); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("stat of a link out of weir: %v", err)
	}
	must(c.Symlink("/weir/../etc", "lk/out2"))
	if _, err := c.Stat("lk/out2/passwd"); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("stat of a link out of weir through the mount's ..: %v", err)
	}
	must(c.Symlink("/weir/lk/sub/../sub/f", "lk/abs2"))
	if b, err := c.ReadFile("lk/abs2"); err != nil || string(b) != "data" {
		t.Errorf("an absolute link with .. inside weir: %q %v", b, err)
	}
	if err := c.Symlink("x", "lk/rel"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("symlink over a name: %v", err)
	}
	must(c.Lchown("lk/rel", -1, -1))
	// Rename and remove move the link, not its target.
	must(c.Rename("lk/rel", "lk/rel2"))
	must(c.Remove("lk/rel2"))
	if _, err := c.Stat("lk/sub/f"); err != nil {
		t.Errorf("the target after its link's removal: %v", err)
	}
	// Hard links share the inode.
	must(c.Link("lk/sub/f", "lk/hard"))
	a, _ := c.Stat("lk/sub/f")
	b, _ := c.Stat("lk/hard")
	sa, sb := a.Sys().(*syscall.Stat_t), b.Sys().(*syscall.Stat_t)
	if sa.Ino != sb.Ino || sa.Nlink != 2 || sb.Nlink != 2 {
		t.Errorf("hard link: inodes %d and %d, nlink %d and %d", sa.Ino, sb.Ino, sa.Nlink, sb.Nlink)
	}
	must(c.Remove("lk/sub/f"))
	if b, err := c.ReadFile("lk/hard"); err != nil || string(b) != "data" {
		t.Errorf("the other name after an unlink: %q %v", b, err)
	}
	if err := c.Link("lk/sub", "lk/dirlink"); !errors.Is(err, syscall.EPERM) {
		t.Errorf("hard link of a directory: %v", err)
	}
	must(c.RemoveAll("lk"))
}

// TestLinksMountSlash: with Mount "/" every absolute target is weir's.
func TestLinksMountSlash(t *testing.T) {
	_, st := newFS(t)
	c, err := client.Dial(t.Context(), client.Options{MetadataSocket: st.Config.Metadata.Socket,
		IOSocket: st.Config.IO.Socket, Mount: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteFile("target", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Symlink("/target", "l"); err != nil {
		t.Fatal(err)
	}
	if b, err := c.ReadFile("l"); err != nil || string(b) != "x" {
		t.Fatalf("an absolute link under Mount /: %q %v", b, err)
	}
}
