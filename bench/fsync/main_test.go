package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// Every workload runs and counts: a short run of each with two writers.
func TestRows(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := benchutil.DiskFlushes(dir); err != nil {
		t.Skipf("the benchmark counts disk flushes, and %s has no counter: %v", dir, err)
	}
	var rows []Row
	for _, wl := range []string{wlStaging, wlAppend, wlOverwrite, wlCeiling} {
		row, err := run(dir, wl, 2, 40)
		row.FS = "root"
		if err != nil {
			t.Fatalf("%s: %v", wl, err)
		}
		if row.Ops != 40 || row.P50us <= 0 || row.OpsPerSec <= 0 || row.FlushesPerOp <= 0 {
			t.Fatalf("%s: %+v", wl, row)
		}
		if wl == wlStaging && (row.LogFlushPerOp <= 0 || row.LogFlushPerOp > 1) {
			t.Fatalf("staging: %v log flushes per append", row.LogFlushPerOp)
		}
		rows = append(rows, row)
	}
	md, err := report(dir, 40, rows, []string{"root: test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| root | " + wlStaging + " |  | 2 |", "device flushes / op"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

// TestMain runs the test binary as a client worker when the weir rows
// re-execute it (-worker-md).
func TestMain(m *testing.M) {
	flag.Parse()
	if *workerMD != "" {
		if err := worker(); err != nil {
			os.Stderr.WriteString("worker: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The weir rows run: a stack in each mode, two client processes, and the
// staging mode flushes the device about once per fsync, never the three
// of the foreground path.
func TestWeirRows(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := benchutil.DiskFlushes(dir); err != nil {
		t.Skipf("the benchmark counts disk flushes, and %s has no counter: %v", dir, err)
	}
	exe, err := benchutil.BuildWeir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{modeStaging, modeNoStaging, modeNoBackground} {
		row, err := runWeir(exe, dir, mode, wlWeirAppend, 2, 60)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		t.Logf("%s: %+v", mode, row)
		// CPU is counted in 10 ms ticks: 60 fsyncs may take less than
		// one of the services' (0 then), never a negative amount.
		if row.Ops != 60 || row.P50us <= 0 || row.OpsPerSec <= 0 || row.FlushesPerOp <= 0 || row.ServiceCPUusPerOp < 0 {
			t.Fatalf("%s: %+v", mode, row)
		}
	}
}
