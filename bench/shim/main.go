// Command shim measures unmodified programs on weir through the
// LD_PRELOAD shim (issue 11) side by side with the kernel's file system,
// on the same disk, in one run:
//
//   - fio, psync at queue depth 1: 4 KiB random read and write and
//     128 KiB sequential read and write, buffered and O_DIRECT, on a file
//     of -size MiB in a kernel directory and on weir (/weir through the
//     shim, the services as processes on the file backend with their data
//     directory beside the kernel's). Runs alternate kernel and weir,
//     -repeat times; each row reports the median run's IOPS, its p50 and
//     p99 completion latency, fio's CPU, and for weir the services' CPU
//     per operation.
//   - pgbench TPS (TPC-B-like, -pg-clients clients, -pg-seconds per run),
//     a server on each, alternating (skipped without PostgreSQL).
//   - what one call costs through the shim: a probe (calls.c) timed
//     without the shim and with it, on a kernel file and a weir file.
//
// Ratios are weir / kernel: above 1, weir is faster (IOPS, TPS).
//
// Usage:
//
//	go run ./bench/shim [-dir PARENT] [-size 256] [-runtime 10] [-repeat 3] [-pg-seconds 15] [-out bench/results] [-quick]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

var (
	dirFlag   = flag.String("dir", "", "parent directory of the run's files, on the disk measured (default: TMPDIR)")
	outDir    = flag.String("out", "bench/results", "where shim.json and shim.md go")
	sizeMiB   = flag.Int("size", 256, "fio's file size in MiB")
	runtimeS  = flag.Int("runtime", 10, "seconds per fio run")
	repeat    = flag.Int("repeat", 3, "runs per row and target, alternating kernel and weir")
	pgSeconds = flag.Int("pg-seconds", 15, "seconds per pgbench run (0: no pgbench)")
	pgScale   = flag.Int("pg-scale", 10, "pgbench -i scale")
	pgClients = flag.Int("pg-clients", 1, "pgbench clients")
	quick     = flag.Bool("quick", false, "small sizes and short runs (a smoke run, not a measurement)")
	weirExe   = flag.String("weir", "", "weir binary for the services (default: built from this module)")
)

// Result is the run, as shim.json keeps it.
type Result struct {
	When    string             `json:"when"`
	Host    benchutil.Host     `json:"host"`
	FS      string             `json:"fs"`
	Command string             `json:"command"`
	Fio     []FioRow           `json:"fio"`
	PG      []PGRow            `json:"pgbench,omitempty"`
	PGNote  string             `json:"pgbench_note,omitempty"`
	Calls   []CallRow          `json:"calls"`
	Mem     map[string]float64 `json:"services_rss_mib"`
}

func main() {
	flag.Parse()
	if *quick {
		*sizeMiB, *runtimeS, *repeat, *pgScale = 32, 2, 1, 1
		if *pgSeconds > 0 {
			*pgSeconds = 3
		}
	}
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	for _, p := range []string{"fio", "cc"} {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s is not installed (Debian: %s): the shim benchmark needs it", p, map[string]string{"fio": "fio", "cc": "gcc"}[p])
		}
	}
	parent := *dirFlag
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "bench-shim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // the postgres user reaches its directories
		return err
	}
	exe := *weirExe
	if exe == "" {
		if exe, err = benchutil.BuildWeir(dir); err != nil {
			return err
		}
	}
	so, probe, err := buildC(dir)
	if err != nil {
		return err
	}
	w, err := startWeir(exe, dir)
	if err != nil {
		return err
	}
	defer w.stop()
	env := w.env(so)

	res := Result{When: time.Now().UTC().Format(time.RFC3339), Command: "go run ./bench/shim " + strings.Join(os.Args[1:], " ")}
	res.Host, _ = benchutil.HostInfo()
	if fsd, err := benchutil.DescribeFS(dir); err == nil {
		res.FS = fsd.String()
	}
	kdir := filepath.Join(dir, "kernel")
	if err := os.Mkdir(kdir, 0o755); err != nil {
		return err
	}
	if res.Fio, err = runFio(w, env, kdir); err != nil {
		return err
	}
	if res.Calls, err = runCalls(probe, env, kdir); err != nil {
		return err
	}
	if *pgSeconds > 0 {
		res.PG, res.PGNote, err = runPG(w, env, dir, so)
		if err != nil {
			return err
		}
	}
	res.Mem = map[string]float64{}
	for name, pid := range w.Sup.PIDs() {
		if rss, _, err := benchutil.ProcMem(pid); err == nil {
			res.Mem[name] = float64(rss) / 1024
		}
	}
	return write(res)
}

// buildC compiles the shim and the call probe into dir.
func buildC(dir string) (so, probe string, err error) {
	_, here, _, _ := runtime.Caller(0)
	top := filepath.Dir(filepath.Dir(filepath.Dir(here)))
	lib := filepath.Join(top, "client", "c")
	so = filepath.Join(dir, "libweir-preload.so")
	probe = filepath.Join(dir, "calls")
	inc := []string{"-I", lib, "-I", filepath.Join(top, "proto", "include"), "-I", filepath.Join(top, "ring", "include")}
	for _, args := range [][]string{
		append(append([]string{"-std=gnu11", "-O2", "-fPIC", "-shared", "-pthread"}, inc...),
			filepath.Join(lib, "weir.c"), filepath.Join(lib, "preload.c"), "-o", so, "-ldl", "-Wl,-Bsymbolic-functions"),
		{"-std=gnu11", "-O2", filepath.Join(top, "bench", "shim", "probe", "calls.c"), "-o", probe},
	} {
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("cc %v: %v\n%s", args, err, out)
		}
	}
	return so, probe, nil
}

// median returns the run whose key is the median of runs.
func median[T any](runs []T, key func(T) float64) T {
	s := append([]T(nil), runs...)
	sort.Slice(s, func(i, j int) bool { return key(s[i]) < key(s[j]) })
	return s[len(s)/2]
}

func write(res Result) error {
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := benchutil.WriteFileAtomic(filepath.Join(*outDir, "shim.json"), append(b, '\n')); err != nil {
		return err
	}
	md := report(res)
	fmt.Print(md)
	return benchutil.WriteFileAtomic(filepath.Join(*outDir, "shim.md"), []byte(md))
}
