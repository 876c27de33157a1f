package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReport(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.md", "# A\n\n## table\n\n| x |\n")
	write("a.json", `{"date":"2026-01-01T00:00:00Z","command":"a -quick","host":{"nproc":2,"cpu_model":"cpu","kernel":"Linux","go_version":"go1.26"}}`)
	write("b.md", "# B\n\n![p](b-1.png)\n")
	write("b.json", `{"date":"2026-01-02T00:00:00Z","command":"b","plots":["b-1.png","b-gone.png"]}`)
	write("b-1.png", "png")

	if _, err := load(dir, []string{"a", "missing"}); err == nil || !strings.Contains(err.Error(), "make bench-missing") {
		t.Errorf("load with a missing benchmark: %v", err)
	}
	secs, err := load(dir, []string{"a", " b", ""})
	if err != nil {
		t.Fatal(err)
	}
	md := render(secs, dir, time.Unix(0, 0))
	for _, want := range []string{"# weir benchmark report", "2 CPUs (nproc), cpu", "  - a: `a -quick`, 2026-01-01",
		"[b-1.png](b-1.png)", "\n## A\n\n### table\n", "\n## B\n"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "b-gone.png") {
		t.Error("report links a plot that does not exist")
	}
}
