// Command trees measures whole source trees on weir through the
// LD_PRELOAD shim, side by side with the kernel's file systems, in one run:
//
//   - The tree is the Go distribution's own source ($(go env GOROOT)/src,
//     about 11,500 files; with -quick only src/net and src/crypto), as a
//     tar made once in -out. Each repetition untars it with tar, syncs,
//     then runs find, du, grep -r (warm, then cold: after weir
//     drop-caches and the kernel's drop_caches), ls -lR, cp -r to a
//     sibling, tar c and rm -rf, on three targets: weir (/weir through
//     the shim, the services as processes on the file backend), a kernel
//     directory on the file system holding weir's data directory, and a
//     journaled ext4 on a loop device (root and e2fsprogs only; without
//     them the run says what is missing and goes on). A row runs on every
//     target before the next row, in an order that rotates each
//     repetition; each target's row is the median of -repeat runs.
//   - Every repetition checks the extracted tree and its copy against the
//     tar, file by file (type, SHA-256), through the shim on weir, and the
//     outputs of find, grep, ls and tar c against the kernel's; a program
//     that fails or prints errors fails its row, with its first error
//     lines, and the run goes on.
//   - The Go client (package client) and package os on a directory of
//     -million files: create, stat each, readdir, unlink each, with p50
//     and p99 per op.
//   - The services' descriptors and memory after each weir row and at the
//     end: io's open descriptors, RSS and cache memory (weir status), the
//     metadata service's descriptors and RSS.
//
// Times are wall clock; CPU is the program's user + system time (wait4's
// rusage of the shell running it, its children included) and, for weir,
// the services' separately. Ratios are weir's time over the faster
// kernel target's: above 1, weir is slower.
//
// Usage:
//
//	go run ./bench/trees [-out bench/results/trees] [-repeat 3] [-quick] [-rows untar,find,...] [-targets weir,kernel,ext4] [-million 1000000] [-dir PARENT] [-shim bin/libweir-preload.so]
//
// The exit status is 1 when a row failed or a tree differed from the tar.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

var (
	outDir     = flag.String("out", "bench/results/trees", "where trees.md, trees.json and the source tar go")
	repeat     = flag.Int("repeat", 3, "runs of every row on every target, alternating targets")
	quick      = flag.Bool("quick", false, "a small tree (src/net and src/crypto) and 20,000 files in the client part: a smoke run")
	rowsFlag   = flag.String("rows", "", "comma-separated rows to run (default all): "+strings.Join(rowNames(), ",")+",files (untar, sync, check and rm always run)")
	targetFlag = flag.String("targets", "weir,kernel,ext4", "targets of the tree rows")
	million    = flag.Int("million", 1_000_000, "files in the client part's directory (default 20,000 with -quick)")
	grepFor    = flag.String("grep", "GODEBUG", "the fixed string grep -r looks for")
	dirFlag    = flag.String("dir", "", "parent of the run's directories: weir's data and the kernel target are on its file system (default TMPDIR)")
	shimFlag   = flag.String("shim", "", "the LD_PRELOAD shim (default bin/libweir-preload.so of this module; make libweir builds it)")
	weirExe    = flag.String("weir", "", "weir binary for the services (default: built from this module)")
	timeout    = flag.Duration("timeout", 15*time.Minute, "longest a program may run before its row fails")
)

// Result is the run, as trees.json keeps it.
type Result struct {
	When    string         `json:"when"`
	Command string         `json:"command"`
	Host    benchutil.Host `json:"host"`
	Tree    TreeInfo       `json:"tree"`
	Repeat  int            `json:"repeat"`
	Targets []TargetInfo   `json:"targets"`
	Grep    string         `json:"grep"`
	// Rows holds one entry per row and target: its runs and their median.
	Rows []Row `json:"rows"`
	// Notes are what the reader must know: targets skipped, caches not
	// dropped, services that died and were restarted.
	Notes []string `json:"notes,omitempty"`
	// Services: descriptors and memory of the services after the tree
	// rows and at the end of the run.
	Services []ServiceSample `json:"services"`
	Files    *FilesResult    `json:"files,omitempty"`
	Failures int             `json:"failures"`
}

func main() {
	flag.Parse()
	if *quick && !flagSet("million") {
		*million = 20_000
	}
	res, err := run()
	if err != nil {
		log.Fatal(err)
	}
	if res.Failures > 0 {
		fmt.Fprintf(os.Stderr, "trees: %d %s failed (see %s)\n", res.Failures, benchutil.Plural(res.Failures, "row"), filepath.Join(*outDir, "trees.md"))
		os.Exit(1)
	}
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// picked says whether -rows asks for row name.
func picked(name string) bool {
	if *rowsFlag == "" {
		return true
	}
	return slices.Contains(strings.Split(*rowsFlag, ","), name)
}

func run() (*Result, error) {
	if *repeat < 1 {
		return nil, fmt.Errorf("-repeat %d: at least 1", *repeat)
	}
	for _, r := range strings.Split(*rowsFlag, ",") {
		if r != "" && r != "files" && !slices.Contains(rowNames(), r) {
			return nil, fmt.Errorf("-rows: unknown row %q (rows: %s,files)", r, strings.Join(rowNames(), ","))
		}
	}
	so, err := shimPath()
	if err != nil {
		return nil, err
	}
	parent := *dirFlag
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "bench-trees-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	res := &Result{When: time.Now().UTC().Format(time.RFC3339), Repeat: *repeat, Grep: *grepFor,
		Command: strings.TrimSpace("go run ./bench/trees " + strings.Join(os.Args[1:], " "))}
	res.Host, _ = benchutil.HostInfo()
	if timeTool == "" {
		res.Notes = append(res.Notes, "peak RSS not measured: GNU time is not installed (Debian package time)")
	}
	tree, err := makeTree(*outDir, *quick)
	if err != nil {
		return nil, err
	}
	res.Tree = tree.info
	exe := *weirExe
	if exe == "" {
		fmt.Fprintln(os.Stderr, "trees: building cmd/weir")
		if exe, err = benchutil.BuildWeir(dir); err != nil {
			return nil, err
		}
	}
	w, err := startWeir(exe, dir, so)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	targets, cleanup, notes, err := setUpTargets(dir, w, strings.Split(*targetFlag, ","))
	defer cleanup()
	if err != nil {
		return nil, err
	}
	res.Notes = append(res.Notes, notes...)
	for _, t := range targets {
		res.Targets = append(res.Targets, t.info)
	}
	r := &runner{w: w, tree: tree, targets: targets, res: res}
	if err := r.trees(); err != nil {
		return nil, err
	}
	res.Services = append(res.Services, w.sample("after the tree rows"))
	if picked("files") {
		if res.Files, err = runFiles(w, dir, *million); err != nil {
			return nil, err
		}
		res.Services = append(res.Services, w.sample("at the end of the run"))
	}
	res.Notes = append(res.Notes, w.restarts...)
	res.Failures = failures(res)
	return res, write(res)
}

// shimPath is -shim, or this module's bin/libweir-preload.so, which must
// be newer than the shim's sources.
func shimPath() (string, error) {
	if *shimFlag != "" {
		return filepath.Abs(*shimFlag)
	}
	_, here, _, _ := runtime.Caller(0)
	top := filepath.Dir(filepath.Dir(filepath.Dir(here)))
	so := filepath.Join(top, "bin", "libweir-preload.so")
	st, err := os.Stat(so)
	if err != nil {
		return "", fmt.Errorf("no shim: %v (build it with make libweir, or give -shim)", err)
	}
	for _, name := range []string{"weir.c", "weir.h", "preload.c"} {
		src := filepath.Join(top, "client", "c", name)
		if s, err := os.Stat(src); err == nil && s.ModTime().After(st.ModTime()) {
			return "", fmt.Errorf("%s is older than %s: run make libweir (or give -shim)", so, src)
		}
	}
	return so, nil
}

func write(res *Result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := benchutil.WriteFileAtomic(filepath.Join(*outDir, "trees.json"), append(b, '\n')); err != nil {
		return err
	}
	md := report(res)
	fmt.Print(md)
	return benchutil.WriteFileAtomic(filepath.Join(*outDir, "trees.md"), []byte(md))
}
