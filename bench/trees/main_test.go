package main

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckTree: a tree extracted from the tar matches it; a changed, a
// missing and an extra file are each named.
func TestCheckTree(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	dir := t.TempDir()
	tarPath := filepath.Join(dir, "t.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, e := range []struct{ name, body string }{{"src/", ""}, {"src/a/", ""}, {"src/a/x.go", "package a\n"}, {"src/b y", "space\n"}} {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	tr, err := readTar(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	if tr.info.Files != 2 || tr.info.Dirs != 2 || tr.info.Bytes != 16 {
		t.Fatalf("tree %+v", tr.info)
	}
	if out, err := exec.Command("tar", "-C", dir, "-xf", tarPath).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	check := func() []string {
		out, run := shell(nil, verifyScript(filepath.Join(dir, "src")))
		if run.Err != "" {
			t.Fatalf("verify script: %s %v", run.Err, run.FirstErrors)
		}
		return tr.diffTree(out)
	}
	if d := check(); d != nil {
		t.Fatalf("extracted tree differs: %v", d)
	}
	os.WriteFile(filepath.Join(dir, "src", "a", "x.go"), []byte("package b\n"), 0o644)
	os.Remove(filepath.Join(dir, "src", "b y"))
	os.WriteFile(filepath.Join(dir, "src", "new"), nil, 0o644)
	d := strings.Join(check(), "\n")
	for _, want := range []string{"1 missing: b y", "1 with other bytes: a/x.go", "1 not in the tar: new"} {
		if !strings.Contains(d, want) {
			t.Errorf("differences lack %q:\n%s", want, d)
		}
	}
}

// TestShellFails: a failing program and error output fail a run; its
// output and CPU time are kept.
func TestShellFails(t *testing.T) {
	out, run := shell(nil, "echo 42; true")
	if run.Err != "" || run.Output != "42" || string(out) != "42\n" {
		t.Fatalf("echo: %+v", run)
	}
	if _, run = shell(nil, "echo oops >&2; echo again >&2"); run.Err == "" || run.ErrLines != 2 || run.FirstErrors[0] != "oops" {
		t.Errorf("error output: %+v", run)
	}
	if _, run = shell(nil, "false | cat"); run.Err == "" || run.Exit != 1 {
		t.Errorf("a failing pipeline: %+v", run)
	}
}

// TestSummaryAndReport: the median of the runs that succeeded, the ratio
// over the faster kernel target, and failures named in the report.
func TestSummaryAndReport(t *testing.T) {
	def := rows[0]
	w := summarize(def, targetWeir, []Run{{WallS: 3}, {WallS: 1, Err: "exit status 2", FirstErrors: []string{"tar: x: Cannot open: Too many open files"}}, {WallS: 5}})
	if w.OK != 2 || w.MedianS != 5 {
		t.Fatalf("weir %+v", w)
	}
	res := &Result{Repeat: 3, Targets: []TargetInfo{{Name: targetWeir}, {Name: targetKernel}, {Name: targetExt4}},
		Rows: []Row{
			summarize(def, targetWeir, []Run{{WallS: 4}, {WallS: 6}, {WallS: 5}}),
			summarize(def, targetKernel, []Run{{WallS: 3}, {WallS: 2}, {WallS: 2.5}}),
			summarize(def, targetExt4, []Run{{WallS: 2}, {WallS: 2}, {WallS: 2}}),
			func() Row { r := w; r.Row, r.Title = "find", "find"; return r }(),
		}}
	res.Failures = failures(res)
	md := report(res)
	for _, want := range []string{"| untar (tar xf) | 5.00 | 2.50 | 2.00 | 2.50x (ext4) |", "5.00 (1 of 3 failed)", "Too many open files", "**1 row failed.**"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// TestPeakRSSIsTheScripts: a script's peak RSS is its own, not this
// process's (which wait4 would report after Go's vfork).
func TestPeakRSSIsTheScripts(t *testing.T) {
	if timeTool == "" {
		t.Skip("GNU time is not installed")
	}
	big := make([]byte, 256<<20)
	for i := range big {
		big[i] = 1
	}
	_, run := shell(nil, "true")
	if run.Err != "" || run.MaxRSSKiB <= 0 || run.MaxRSSKiB > 64<<10 {
		t.Errorf("peak RSS of true: %d KiB (%s), with this process at 256 MiB", run.MaxRSSKiB, run.Err)
	}
	big[len(big)-1] = 2
}
