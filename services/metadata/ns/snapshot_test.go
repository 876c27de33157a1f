package ns

import (
	"errors"
	"syscall"
	"testing"
)

// TestSnapshotPermissions: a snapshot lists only the regular files its
// caller may open for reading by their name in the directory, and none
// of a directory the caller may not read and search, or reach.
func TestSnapshotPermissions(t *testing.T) {
	n, _ := newNS(t)
	mk := func(c Cred, path string, mode uint32) {
		t.Helper()
		if _, _, err := n.Open(c, path, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, mode); err != nil {
			t.Fatalf("create %s: %v", path, err)
		}
		if err := n.Chmod(c, path, mode); err != nil { // (past the umask-free create, to be sure)
			t.Fatalf("chmod %s: %v", path, err)
		}
	}
	_, err := n.Mkdir(root, "d", 0o755)
	must(t, err)
	mk(root, "d/public", 0o644)
	mk(root, "d/secret", 0o600)
	mk(root, "d/group", 0o640)
	err = n.Chown(root, "d/group", -1, 3000) // u1's supplementary group
	must(t, err)
	_, err = n.Mkdir(root, "d/sub", 0o755)
	must(t, err)
	names := func(c Cred, path string) ([]string, error) {
		ents, err := n.SnapshotAt(c, RootIno, path)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name)
		}
		return out, err
	}
	for _, tc := range []struct {
		who  string
		c    Cred
		want string
	}{
		{"root", root, "[group public secret]"},
		{"u1 (in the file's group)", u1, "[group public]"},
		{"u2", u2, "[public]"},
	} {
		got, err := names(tc.c, "d")
		if err != nil || fmtNames(got) != tc.want {
			t.Errorf("%s's snapshot of d: %v %v, want %s", tc.who, got, err, tc.want)
		}
	}
	// A directory others may search but not read: no snapshot (it would
	// list its names); one they may not search: none either.
	err = n.Chmod(root, "d", 0o711)
	must(t, err)
	if _, err := names(u2, "d"); !errors.Is(err, syscall.EACCES) {
		t.Errorf("snapshot of a 0711 directory by another user: %v, want EACCES", err)
	}
	err = n.Chmod(root, "d", 0o755)
	must(t, err)
	_, err = n.Mkdir(root, "d/sub/inner", 0o755)
	must(t, err)
	mk(root, "d/sub/inner/f", 0o644)
	err = n.Chmod(root, "d/sub", 0o700)
	must(t, err)
	if _, err := names(u2, "d/sub/inner"); !errors.Is(err, syscall.EACCES) {
		t.Errorf("snapshot under a directory the caller may not search: %v, want EACCES", err)
	}
	if got, err := names(root, "d/sub/inner"); err != nil || fmtNames(got) != "[f]" {
		t.Errorf("root's snapshot of d/sub/inner: %v %v", got, err)
	}
	if _, err := names(root, "d/public"); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("snapshot of a file: %v, want ENOTDIR", err)
	}
}

func fmtNames(s []string) string {
	out := "["
	for i, n := range s {
		if i > 0 {
			out += " "
		}
		out += n
	}
	return out + "]"
}
