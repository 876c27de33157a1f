// Command backend measures the IO service's storage backends at the
// backend interface (backend.Blob ReadAt/WriteAt), side by side in one run,
// on one file system (issue 4). No services and no rings: this isolates the
// backend layer.
//
// Targets, each on its own preallocated file (or bdev) of -file-mib:
//
//   - raw: pread/pwrite with O_DIRECT on a file, page-aligned buffers: the
//     floor;
//   - file: the file backend (backend/file, O_DIRECT) on the same file
//     system;
//   - spdk-aio: the SPDK backend on an aio bdev over a file on the same file
//     system (block_size 4096);
//   - spdk-malloc: the SPDK backend on a malloc bdev (memory, no device: the
//     software path only).
//
// With -spdk-config FILE (an SPDK JSON config, e.g. one attaching an NVMe
// controller) and -spdk-bdev NAME, the device rows run on that bdev
// instead, named spdk-dev and weir-spdk-dev; the malloc rows run on
// -spdk-malloc-bdev if the config has one, and are n/a otherwise. The
// benchmark formats the bdev (everything on it is lost), so it also needs
// -spdk-erase. One process runs one SPDK configuration.
//
// The spdk rows need the spdk build tag (`make bench-backend` adds it when
// `make spdk-check` passes); without it they read "n/a". SPDK runs with
// DPDK's --no-huge unless -hugepages is given (an NVMe bdev needs it).
//
// Workloads: 4 KiB random read and write at queue depth 1 (one goroutine)
// and at queue depth -qd (that many goroutines on one Blob), and 128 KiB
// sequential read and write at queue depth 1. No fsync anywhere.
//
// The program prints Markdown tables and writes them to <out>/backend.md,
// with a JSON copy (backend.json).
//
// Usage:
//
//	go run [-tags spdk] ./bench/backend [-quick] [-out bench/results] [-dir PARENT]
//	    [-file-mib 256] [-window 3s] [-warmup 300ms] [-qd 32] [-hugepages]
//	    [-spdk-config FILE -spdk-bdev NAME [-spdk-malloc-bdev NAME] -spdk-erase]
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"
)

const mib = 1 << 20

// Block sizes of the workloads.
const (
	randBlock = 4096
	seqBlock  = 128 << 10
)

// settings are the sizes and windows of a run.
type settings struct {
	Quick     bool          `json:"quick"`
	FileBytes int64         `json:"file_bytes"`
	Window    time.Duration `json:"window_ns"`
	Warmup    time.Duration `json:"warmup_ns"`
	QD        int           `json:"qd"`
	HugePages bool          `json:"hugepages"`
	// SPDKWorkers is the SPDK backend's I/O worker count.
	SPDKWorkers int `json:"spdk_workers"`
	// SPDKConfig is the operator's SPDK JSON config ("": the built-in
	// aio and malloc bdevs); SPDKBdev the device bdev in it and
	// SPDKMallocBdev its malloc bdev ("": none).
	SPDKConfig     string `json:"spdk_config,omitempty"`
	SPDKBdev       string `json:"spdk_bdev,omitempty"`
	SPDKMallocBdev string `json:"spdk_malloc_bdev,omitempty"`
}

type options struct {
	out  string
	dir  string
	keep bool
	s    settings
}

func main() {
	logger := log.New(os.Stderr, "backend: ", 0)
	cfg, err := parseFlags(flag.CommandLine, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		logger.Print(err)
		os.Exit(2)
	}
	rep, err := run(cfg, logger)
	if err != nil {
		logger.Print(err)
		os.Exit(1)
	}
	md := rep.markdown()
	fmt.Print(md)
	if err := rep.write(cfg.out, md); err != nil {
		logger.Print(err)
		os.Exit(1)
	}
	logger.Printf("wrote %s and %s", filepath.Join(cfg.out, "backend.md"), filepath.Join(cfg.out, "backend.json"))
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var cfg options
	fs.StringVar(&cfg.out, "out", "bench/results", "directory for backend.md and backend.json")
	fs.StringVar(&cfg.dir, "dir", "", "parent directory of the run directory (default: the system temporary directory); it decides the file system measured")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the run directory")
	quick := fs.Bool("quick", false, "small sizes and short windows (64 MiB files, 400 ms windows) unless given explicitly")
	fileMiB := fs.Int("file-mib", 256, "size of each target's file (and bdev data), MiB")
	fs.DurationVar(&cfg.s.Window, "window", 3*time.Second, "measured window of each row")
	fs.DurationVar(&cfg.s.Warmup, "warmup", 300*time.Millisecond, "warm-up before each row's window")
	fs.IntVar(&cfg.s.QD, "qd", 32, "goroutines (queue depth) of the high-queue-depth rows")
	fs.BoolVar(&cfg.s.HugePages, "hugepages", false, "run SPDK on huge pages (default: DPDK --no-huge)")
	fs.IntVar(&cfg.s.SPDKWorkers, "spdk-workers", 1, "I/O workers of the SPDK backend")
	fs.StringVar(&cfg.s.SPDKConfig, "spdk-config", "", "SPDK JSON config to run the spdk rows on (default: a built-in aio bdev over a file and a malloc bdev)")
	fs.StringVar(&cfg.s.SPDKBdev, "spdk-bdev", "", "with -spdk-config: the bdev of the device rows (spdk-dev, weir-spdk-dev), e.g. Nvme0n1")
	fs.StringVar(&cfg.s.SPDKMallocBdev, "spdk-malloc-bdev", "", "with -spdk-config: a malloc bdev in it for the no-device rows (default: those rows are n/a)")
	erase := fs.Bool("spdk-erase", false, "with -spdk-config: allow the benchmark to format -spdk-bdev and -spdk-malloc-bdev (everything on them is lost)")
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
		if !given["file-mib"] {
			*fileMiB = 64
		}
		if !given["window"] {
			cfg.s.Window = 400 * time.Millisecond
		}
		if !given["warmup"] {
			cfg.s.Warmup = 100 * time.Millisecond
		}
	}
	switch {
	case *fileMiB < 1:
		return cfg, errors.New("-file-mib must be at least 1")
	case cfg.s.Window <= 0 || cfg.s.Warmup < 0:
		return cfg, errors.New("-window must be positive and -warmup not negative")
	case cfg.s.QD < 1:
		return cfg, errors.New("-qd must be at least 1")
	case cfg.s.SPDKWorkers < 1:
		return cfg, errors.New("-spdk-workers must be at least 1")
	case cfg.s.SPDKConfig == "" && (cfg.s.SPDKBdev != "" || cfg.s.SPDKMallocBdev != "" || *erase):
		return cfg, errors.New("-spdk-bdev, -spdk-malloc-bdev and -spdk-erase go with -spdk-config")
	case cfg.s.SPDKConfig != "" && cfg.s.SPDKBdev == "":
		return cfg, errors.New("-spdk-config needs -spdk-bdev: the bdev of the device rows")
	case cfg.s.SPDKConfig != "" && !*erase:
		return cfg, fmt.Errorf("the benchmark formats bdev %q of %s: everything on it is lost; pass -spdk-erase to run it", cfg.s.SPDKBdev, cfg.s.SPDKConfig)
	}
	cfg.s.FileBytes = int64(*fileMiB) * mib
	return cfg, nil
}
