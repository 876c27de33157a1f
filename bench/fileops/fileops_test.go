package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"github.com/weir-storage/weir/bench/internal/benchutil"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be its own driver process, as the program
// is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == driverRoleArg {
		os.Exit(driverMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestSmoke runs a tiny configuration end to end: the weir binary, the
// services, three drivers, every workload, the report, the JSON and the
// plots. It checks that everything ran and was recorded; it asserts no
// timings.
func TestSmoke(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on PATH: this test builds cmd/weir to run the services")
	}
	exe, err := benchutil.BuildWeir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		// The ping-pong row's second weir driver runs as another uid,
		// which must reach the sockets under dir.
		for _, d := range []string{dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := options{
		out: t.TempDir(), dir: dir, weirBin: exe, direct: "auto", wait: "adaptive",
		s: settings{RandSize: 2 * mib, SeqSize: 2 * mib, Files: 20, Warmup: 5 * time.Millisecond,
			Window: 20 * time.Millisecond, FsyncOps: 5, FsyncWindow: 5 * time.Second, ColdFiles: 20},
	}
	logger := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		logger = log.New(os.Stderr, "fileops: ", 0)
	}
	rep, err := run(context.Background(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}

	want := len(dataTargets)*(3+2+6) + len(nsTargets)*(3+5)
	if len(rep.Rows) != want {
		t.Errorf("%d rows, want %d", len(rep.Rows), want)
	}
	for _, row := range rep.Rows {
		name := row.Family + " " + row.Workload + " " + row.Target
		switch {
		case row.Error != "":
			t.Errorf("%s: %s", name, row.Error)
		case row.NA != "" && os.Geteuid() != 0 && (row.Workload == wlColdRand || row.Workload == wlColdSeq || row.Workload == wlPingPong):
			// dropping the kernel's caches, and a driver of another uid, need root
		case os.Geteuid() != 0 && row.Workload == wlPingPong && row.Target != targetWeir:
			// no ratio: weir's row is n/a
		case row.NA != "":
			if row.Target != targetOSDirect {
				t.Errorf("%s: n/a (%s); only os-direct may be", name, row.NA)
			}
		case row.Ops == 0 || row.P50us <= 0 || row.P50us > row.P99us || len(row.CDF) == 0:
			t.Errorf("%s: ops %d, p50 %v, p99 %v, %d CDF points", name, row.Ops, row.P50us, row.P99us, len(row.CDF))
		case row.Target != targetWeir && (row.WeirOpsRatio == nil || row.WeirP50Ratio == nil):
			t.Errorf("%s: no ratio against weir", name)
		}
	}
	if rep.Weir.Direct == nil {
		t.Errorf("the file backend's I/O mode was not found in its log: %q", rep.Weir.ModeLog)
	}
	if len(rep.RSS) != 6 {
		t.Errorf("%d peak RSS entries, want 6", len(rep.RSS))
	}
	for _, e := range rep.RSS {
		if e.Error != "" || e.PeakRSSKiB <= 0 {
			t.Errorf("peak RSS of %s: %d KiB, %s", e.Process, e.PeakRSSKiB, e.Error)
		}
	}
	if rep.Filesystem.StatType == "" {
		t.Error("no file system type")
	}
	if _, err := os.Stat(rep.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run directory %s left behind: %v", rep.Dir, err)
	}

	md := rep.markdown()
	if err := rep.write(cfg.out, md); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## 4 KiB random", "## Metadata", "## Sequential", "## Cache", "## Peak RSS", "| read | weir |", "| create | os |", "io service",
		"| warm 4 KiB random read | os |", "| two processes: 4 KiB random read, the other writing | weir |",
		"## Small files", "| open + read 4 KiB + close, cold | weir |", "| fstest.TestFS over 1,000 files | os |",
		"| " + wlPingPong + " | weir |",
		"## Limits measured in this run", "| memcpy of 4 KiB from a random page of a shared memfd mapping", "## Memory after each cache row"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
	if len(rep.Limits) != 3 || rep.Limits[0].NA != "" || rep.Limits[0].P50us <= 0 || rep.Limits[2].NA != "" || rep.Limits[2].P50us <= 0 {
		t.Errorf("limits: %+v, want the 4 KiB memfd copy and the pwrite measured", rep.Limits)
	}
	for _, row := range rep.Rows {
		if row.Family != famCache || row.NA != "" || row.Error != "" {
			continue
		}
		if row.Mem == nil || row.Mem.ClientRSSKiB <= 0 {
			t.Errorf("cache row %s/%s has no client memory", row.Workload, row.Target)
		} else if row.Target == targetWeir && (row.Mem.IORSSKiB <= 0 || row.Mem.CacheLimitPages <= 0 || row.Mem.CacheBytes <= 0 && row.Mem.CacheResidentPages > 0) {
			t.Errorf("weir cache row %s has no io or cache memory: %+v", row.Workload, *row.Mem)
		}
	}
	if len(rep.Plots) != len(families) {
		t.Errorf("plots %v, want one per family", rep.Plots)
	}
	for _, p := range rep.Plots {
		if !strings.Contains(md, "]("+p+")") {
			t.Errorf("markdown does not link %s", p)
		}
		if fi, err := os.Stat(filepath.Join(cfg.out, p)); err != nil || fi.Size() == 0 {
			t.Errorf("plot %s: %v", p, err)
		}
	}
	js, err := os.ReadFile(filepath.Join(cfg.out, "fileops.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatalf("fileops.json: %v", err)
	}
	if len(back.Rows) != len(rep.Rows) || back.Host.NProc <= 0 {
		t.Errorf("fileops.json: %d rows, host %+v", len(back.Rows), back.Host)
	}
}

func TestParseFlags(t *testing.T) {
	parse := func(args ...string) (options, error) {
		fs := flag.NewFlagSet("fileops", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return parseFlags(fs, args)
	}
	cfg, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.s.RandSize != 256*mib || cfg.s.SeqSize != 512*mib || cfg.s.Files != 10000 || cfg.s.ColdFiles != 2000 || cfg.s.Quick {
		t.Errorf("defaults: %+v", cfg.s)
	}
	cfg, err = parse("-quick", "-files", "300")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.s.RandSize != 64*mib || cfg.s.SeqSize != 64*mib || cfg.s.Files != 300 || cfg.s.ColdFiles != 500 || !cfg.s.Quick {
		t.Errorf("-quick -files 300: %+v", cfg.s)
	}
	cfg, err = parse("-only", "metadata, random,smallfiles")
	if err != nil || !slices.Equal(cfg.only, []string{famMeta, famRandom, famSmall}) {
		t.Errorf("-only: %v, %v", cfg.only, err)
	}
	for _, bad := range [][]string{{"-only", "nope"}, {"-files", "0"}, {"-cold-files", "0"}, {"-direct", "maybe"}, {"-wait", "sleep"}, {"-rand-mib", "-1"}, {"extra"}} {
		if _, err := parse(bad...); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestStamps(t *testing.T) {
	b := make([]byte, 3*stamp)
	fill(b, 8192, 1)
	if err := checkStamps(b, 8192); err != nil {
		t.Fatal(err)
	}
	if err := checkStamps(b, 4096); err == nil {
		t.Error("a block read from the wrong offset passed")
	}
}

func TestLogTap(t *testing.T) {
	tap := &logTap{}
	for _, chunk := range []string{"2026-01-01T00:00:00.000Z [INFO]  weir-io: serving\n2026-01-01T00:00:00.001Z [DEBUG] weir-io.back",
		"end: file backend ready: dir=/x/blobs direct=false\n"} {
		if _, err := tap.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	d, lines := tap.ioMode()
	if d == nil || *d || len(lines) != 1 || !strings.HasPrefix(lines[0], "[DEBUG] weir-io.backend: file backend ready") {
		t.Errorf("ioMode = %v, %q", d, lines)
	}
	if !strings.Contains(tap.tail(), "serving") {
		t.Errorf("tail = %q", tap.tail())
	}
}
