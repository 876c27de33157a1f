// Command fileops measures file operations through the weir client against
// the kernel's (package os, buffered and with O_DIRECT) side by side, in one
// run, on one file system (issue 3).
//
// The weir services run as processes of the weir binary (stack.Supervisor,
// as `weir up` runs them: embedded NATS in this process, the metadata and
// IO services as children) on the file backend. The weir data directory
// and the os targets' directories are siblings under one parent directory,
// so both sides use the same disk. Each target runs in its own driver
// process (this program re-executed), one goroutine, queue depth 1:
//
//   - 4 KiB random reads, writes (no fsync) and writes each followed by an
//     fsync, on a preallocated file (-rand-mib);
//   - create (O_CREATE|O_EXCL, then close), stat and unlink of -files files
//     in one directory (weir and os only);
//   - sequential 1 MiB writes (then one fsync, timed apart) and reads of a
//     -seq-mib file;
//   - the cache rows (issue 9): 4 KiB random and 1 MiB sequential reads of
//     a -rand-mib file, warm (just written) and cold (after dropping the
//     kernel's caches: root only), and two processes on one file, one
//     writing at random while the other reads;
//   - small files (weir and os only): open + read 4 KiB + close of one of
//     16 files in turn (warm) and of each of -cold-files files once (cold),
//     stat of a file another driver process holds open for writing, and
//     fstest.TestFS over a tree of 1,000 small files.
//
// The program prints Markdown tables and writes them to <out>/fileops.md,
// with a JSON copy (fileops.json) and latency CDF plots (fileops-*.png).
//
// Usage:
//
//	go run ./bench/fileops [-quick] [-out bench/results] [-dir PARENT]
//	    [-rand-mib 256] [-seq-mib 512] [-files 10000] [-window 3s] [-warmup 500ms]
//	    [-fsync-ops 2000] [-cold-files 2000] [-weir PATH] [-direct auto|on|off] [-wait adaptive|busy-poll]
//	    [-only random,metadata,sequential,cache,smallfiles]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// options are what the command line asks for.
type options struct {
	out     string
	dir     string // parent of the data directories; "" = os.TempDir()
	weirBin string // "" = build cmd/weir
	direct  string // weir io.direct
	wait    string // weir io.wait_mode and the client's wait mode
	keep    bool
	verbose bool
	only    []string // families to run; all when empty
	s       settings
}

// settings are the sizes and windows of the workloads.
type settings struct {
	Quick       bool          `json:"quick"`
	RandSize    int64         `json:"rand_file_bytes"`
	SeqSize     int64         `json:"seq_file_bytes"`
	Files       int           `json:"files"`
	Warmup      time.Duration `json:"warmup_ns"`
	Window      time.Duration `json:"window_ns"`
	FsyncOps    int           `json:"fsync_ops"`
	FsyncWindow time.Duration `json:"fsync_window_ns"` // cap on the write+fsync rows
	ColdFiles   int           `json:"cold_files"`      // files of the cold open + read + close row
	Only        []string      `json:"only,omitempty"`  // families run, when not all
}

const mib = 1 << 20

// Workload parameters.
const (
	randBlock = 4096
	seqBlock  = 1 << 20
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == driverRoleArg {
		os.Exit(driverMain(os.Args[2:]))
	}
	os.Exit(orchestratorMain())
}

func orchestratorMain() int {
	logger := log.New(os.Stderr, "fileops: ", 0)
	cfg, err := parseFlags(flag.CommandLine, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		logger.Print(err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg, logger)
	if err != nil {
		logger.Print(err)
		return 1
	}
	md := rep.markdown()
	fmt.Print(md)
	if err := rep.write(cfg.out, md); err != nil {
		logger.Print(err)
		return 1
	}
	logger.Printf("wrote %s, %s and %d plots", filepath.Join(cfg.out, "fileops.md"), filepath.Join(cfg.out, "fileops.json"), len(rep.Plots))
	return 0
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var cfg options
	fs.StringVar(&cfg.out, "out", "bench/results", "directory for fileops.md, fileops.json and the plots")
	fs.StringVar(&cfg.dir, "dir", "", "parent directory of the weir data directory and the os directories (default: the system temporary directory); it decides the file system measured")
	fs.StringVar(&cfg.weirBin, "weir", "", "weir binary (default: go build ./cmd/weir into the run directory)")
	fs.StringVar(&cfg.direct, "direct", "auto", "weir io.direct: auto, on or off")
	fs.StringVar(&cfg.wait, "wait", "adaptive", "weir wait mode (services and client): adaptive or busy-poll")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the run directory (data, configuration) instead of removing it")
	fs.BoolVar(&cfg.verbose, "v", false, "copy the services' log to stderr")
	only := fs.String("only", "", "comma-separated families to run: "+familyNames+" (default: all)")
	quick := fs.Bool("quick", false, "small sizes and short windows (64 MiB files, 2,000 files, 500 ms windows, 200 fsyncs, 500 cold files) unless given explicitly")
	randMiB := fs.Int("rand-mib", 256, "size of the random-I/O file per target, MiB")
	seqMiB := fs.Int("seq-mib", 512, "size of the sequential file per target, MiB")
	fs.IntVar(&cfg.s.Files, "files", 10000, "files created, stat'ed and unlinked in one directory")
	fs.DurationVar(&cfg.s.Window, "window", 3*time.Second, "measured window of each random read and write row")
	fs.DurationVar(&cfg.s.Warmup, "warmup", 500*time.Millisecond, "warm-up before each random row's window")
	fs.IntVar(&cfg.s.FsyncOps, "fsync-ops", 2000, "ops of each 4 KiB write + fsync row")
	fs.DurationVar(&cfg.s.FsyncWindow, "fsync-window", 20*time.Second, "time cap of each write + fsync row")
	fs.IntVar(&cfg.s.ColdFiles, "cold-files", 2000, "4 KiB files of the cold open + read + close row, each opened once (or until the window ends)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.s.Quick = *quick
	if *quick {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		set := func(name string, apply func()) {
			if !given[name] {
				apply()
			}
		}
		set("rand-mib", func() { *randMiB = 64 })
		set("seq-mib", func() { *seqMiB = 64 })
		set("files", func() { cfg.s.Files = 2000 })
		set("window", func() { cfg.s.Window = 500 * time.Millisecond })
		set("warmup", func() { cfg.s.Warmup = 100 * time.Millisecond })
		set("fsync-ops", func() { cfg.s.FsyncOps = 200 })
		set("fsync-window", func() { cfg.s.FsyncWindow = 5 * time.Second })
		set("cold-files", func() { cfg.s.ColdFiles = 500 })
	}
	cfg.s.RandSize, cfg.s.SeqSize = int64(*randMiB)*mib, int64(*seqMiB)*mib
	if *only != "" {
		for _, f := range strings.Split(*only, ",") {
			f = strings.TrimSpace(f)
			if _, ok := familyFlag[f]; !ok {
				return cfg, fmt.Errorf("-only: unknown family %q (have %s)", f, familyNames)
			}
			cfg.only = append(cfg.only, familyFlag[f])
		}
		cfg.s.Only = cfg.only
	}
	switch {
	case *randMiB <= 0 || *seqMiB <= 0:
		return cfg, errors.New("-rand-mib and -seq-mib must be positive")
	case cfg.s.Files <= 0:
		return cfg, errors.New("-files must be positive")
	case cfg.s.ColdFiles <= 0:
		return cfg, errors.New("-cold-files must be positive")
	case cfg.s.Window <= 0 || cfg.s.Warmup < 0 || cfg.s.FsyncWindow <= 0:
		return cfg, errors.New("-window and -fsync-window must be positive and -warmup not negative")
	case cfg.s.FsyncOps <= 0:
		return cfg, errors.New("-fsync-ops must be positive")
	case !slices.Contains([]string{"auto", "on", "off"}, cfg.direct):
		return cfg, fmt.Errorf("-direct %q: want auto, on or off", cfg.direct)
	case !slices.Contains([]string{"adaptive", "busy-poll"}, cfg.wait):
		return cfg, fmt.Errorf("-wait %q: want adaptive or busy-poll", cfg.wait)
	}
	return cfg, nil
}
