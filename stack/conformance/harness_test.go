package conformance

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestCasesTable(t *testing.T) {
	cases := Cases()
	if len(cases) < 90 {
		t.Errorf("%d cases, want at least 90", len(cases))
	}
	groups := map[string]int{}
	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.Name] {
			t.Errorf("duplicate case %q", c.Name)
		}
		seen[c.Name] = true
		group, _, ok := strings.Cut(c.Name, "/")
		if !ok || c.Run == nil {
			t.Errorf("case %q: want a group/ prefix and a Run", c.Name)
		}
		groups[group]++
		if (group == "perm") != (c.Needs == NeedNonRoot) {
			t.Errorf("case %q: perm/ cases and only they need a non-root identity", c.Name)
		}
		if c.Setup != nil && c.Needs != NeedNonRoot && c.Peer == nil {
			t.Errorf("case %q: Setup is for NeedNonRoot and two-process cases", c.Name)
		}
		if (group == "shared") != (c.Peer != nil) {
			t.Errorf("case %q: shared/ cases and only they have peer steps", c.Name)
		}
	}
	for _, d := range Differences {
		if !seen[d.Case] || d.Reason == "" {
			t.Errorf("Differences: %q is not a case or has no reason", d.Case)
		}
	}
	t.Logf("%d cases: %v", len(cases), groups)
}

func TestClamp(t *testing.T) {
	for _, c := range []struct {
		in, out, outRemove string
	}{
		{"", "", ""},
		{"a", "a", "a"},
		{"/", ".", "."},
		{"//a/b/", "a/b/", "a/b/"},
		{".", ".", "."},
		{"..", ".", ".."},
		{"../", "./", "../"},
		{"../..", "./.", "./.."},
		{"../x", "./x", "./x"},
		{"d/..", "d/..", "d/.."},
		{"d/../..", "d/../.", "d/../.."},
		{"d/../../x", "d/.././x", "d/.././x"},
		{"f/../../x", "f/.././x", "f/.././x"},
		{"a/b/../../../c/..", "a/b/../.././c/..", "a/b/../.././c/.."},
		{"a//..//..", "a//..//.", "a//..//.."},
		{"./..", "./.", "./.."},
		{"/..", ".", ".."},
	} {
		if got := clamp(c.in, false); got != c.out {
			t.Errorf("clamp(%q) = %q, want %q", c.in, got, c.out)
		}
		if got := clamp(c.in, true); got != c.outRemove {
			t.Errorf("clamp(%q, keep final ..) = %q, want %q", c.in, got, c.outRemove)
		}
	}
}

func TestErrName(t *testing.T) {
	for _, c := range []struct {
		err  error
		name string
		ok   bool
	}{
		{nil, "ok", true},
		{io.EOF, "EOF", true},
		{fs.ErrClosed, "ErrClosed", true},
		{&fs.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, "ENOENT", true},
		{&os.LinkError{Op: "rename", Old: "a", New: "b", Err: syscall.EXDEV}, "EXDEV", true},
		{os.NewSyscallError("fsync", syscall.EIO), "EIO", true},
		{fmt.Errorf("wrapped: %w", syscall.ENOTEMPTY), "ENOTEMPTY", true},
		{errors.New("boom"), "ERR boom", false},
	} {
		name, ok := errName(c.err)
		if name != c.name || ok != c.ok {
			t.Errorf("errName(%v) = %q, %v; want %q, %v", c.err, name, ok, c.name, c.ok)
		}
	}
}

func TestWithinReportsCallerNames(t *testing.T) {
	fsys := KernelTarget(t)
	if err := fsys.Mkdir("d", 0o755); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"..": "..", "/": "/", "d/": "d", "./d/..": ".."} {
		fi, err := fsys.Stat(name)
		if err != nil || fi.Name() != want {
			t.Errorf("Stat(%q) = %v, %v; want name %q", name, fi, err, want)
		}
	}
	f, err := fsys.OpenFile("d/../f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Name() != "d/../f" {
		t.Errorf("File.Name() = %q", f.Name())
	}
	if fi, err := f.Stat(); err != nil || fi.Name() != "f" {
		t.Errorf("File.Stat() = %v, %v", fi, err)
	}
	_, err = fsys.Stat("missing")
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Path != "missing" || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(missing) error %#v, want a PathError for the caller's name", err)
	}
}

// liar is a target with a bug: Mkdir of an existing name says ENOENT.
type liar struct{ FS }

func (l liar) Mkdir(name string, perm fs.FileMode) error {
	err := l.FS.Mkdir(name, perm)
	if errors.Is(err, syscall.EEXIST) {
		return &fs.PathError{Op: "mkdir", Path: name, Err: syscall.ENOENT}
	}
	return err
}

// TestDetectsDifferences checks that a wrong errno shows both as a
// difference from the kernel and as a failed expectation.
func TestDetectsDifferences(t *testing.T) {
	var c Case
	for _, cc := range Cases() {
		if cc.Name == "dir/mkdir_existing_eexist" {
			c = cc
		}
	}
	ref := runInProcess(KernelTarget(t), c)
	if len(ref.Fails) != 0 {
		t.Fatalf("kernel failed: %v", ref.Fails)
	}
	bad := runInProcess(liar{KernelTarget(t)}, c)
	d := compare(ref.Obs, bad.Obs)
	if !strings.Contains(d, `want mkdir "d" 0755: EEXIST`) || !strings.Contains(d, `got  mkdir "d" 0755: ENOENT`) {
		t.Errorf("compare missed the wrong errno:\n%s", d)
	}
	if len(bad.Fails) == 0 || !strings.Contains(bad.Fails[0], "expected EEXIST, got ENOENT") {
		t.Errorf("expectation did not fail: %v", bad.Fails)
	}
	if compare(ref.Obs, ref.Obs) != "" {
		t.Error("compare found differences between equal lists")
	}
}

// TestFatalEndsOnlyTheCase checks Must/Fatalf and the open-file accounting.
func TestFatalEndsOnlyTheCase(t *testing.T) {
	out := runInProcess(KernelTarget(t), Case{Name: "x/y", Run: func(t *Tester) {
		t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
		t.Must(t.Mkdir("missing/d", 0o755))
		t.Logf("not reached")
	}})
	if len(out.Fails) != 1 || !strings.Contains(out.Fails[0], "precondition failed: ENOENT") {
		t.Errorf("fails %v", out.Fails)
	}
	if last := out.Obs[len(out.Obs)-1]; last != `mkdir "missing/d" 0755: ENOENT` {
		t.Errorf("last observation %q", last)
	}
	out = runInProcess(KernelTarget(t), Case{Name: "x/z", Run: func(t *Tester) {
		t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
	}})
	if len(out.Fails) != 1 || out.Fails[0] != "case left 1 files open" {
		t.Errorf("fails %v", out.Fails)
	}
}
