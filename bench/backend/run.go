package main

import (
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// workload is one kind of row.
type workload struct {
	Name   string `json:"name"`
	Write  bool   `json:"write"`
	Random bool   `json:"random"`
	Block  int    `json:"block_bytes"`
	QD     int    `json:"qd"`
}

func workloads(qd int) []workload {
	return []workload{
		{"4 KiB random read, QD1", false, true, randBlock, 1},
		{"4 KiB random write, QD1", true, true, randBlock, 1},
		{fmt.Sprintf("4 KiB random read, QD%d", qd), false, true, randBlock, qd},
		{fmt.Sprintf("4 KiB random write, QD%d", qd), true, true, randBlock, qd},
		{"128 KiB sequential write, QD1", true, false, seqBlock, 1},
		{"128 KiB sequential read, QD1", false, false, seqBlock, 1},
	}
}

// Row is one (workload, target) measurement.
type Row struct {
	Workload  string  `json:"workload"`
	Target    string  `json:"target"`
	NA        string  `json:"na,omitempty"`
	Error     string  `json:"error,omitempty"`
	QD        int     `json:"qd"`
	Block     int     `json:"block_bytes"`
	Ops       uint64  `json:"ops"`
	WindowSec float64 `json:"window_sec"`
	OpsPerSec float64 `json:"ops_per_sec"`
	MBps      float64 `json:"mb_per_sec"` // 10^6 bytes/s
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	MeanUs    float64 `json:"mean_us"`
	MaxUs     float64 `json:"max_us"`
}

func run(cfg options, logger *log.Logger) (*Report, error) {
	parent := cfg.dir
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "wbb-")
	if err != nil {
		return nil, err
	}
	if !cfg.keep {
		defer os.RemoveAll(dir)
	}
	rep := &Report{Date: time.Now().UTC().Format(time.RFC3339), Settings: cfg.s, Dir: dir, SPDKBuilt: spdkBuilt}
	rep.Command = "backend"
	for _, a := range os.Args[1:] {
		rep.Command += " " + a
	}
	if rep.Host, err = benchutil.HostInfo(); err != nil {
		logger.Print(err)
	}
	if rep.Filesystem, err = benchutil.DescribeFS(dir); err != nil {
		logger.Print(err)
	}
	rep.MemTotal = memTotal()

	// Phases, each closing its targets before the next starts: the kernel
	// targets (raw, file, weir on file) first, then SPDK's. Once started,
	// SPDK's threads poll (spin) while they have work, which on a small
	// machine would slow kernel rows running beside them.
	logger.Printf("preparing %s MiB per target in %s", benchutil.MiB(cfg.s.FileBytes/1024), dir)
	wls := workloads(cfg.s.QD)
	rows := map[string]Row{}
	var all []target
	phase := func(targets []target) {
		all = append(all, targets...)
		for _, t := range targets {
			if t.err != "" {
				logger.Printf("%s: %s", t.name, t.err)
			}
		}
		for _, wl := range wls {
			for _, t := range targets {
				row := Row{Workload: wl.Name, Target: t.name, NA: t.na, Error: t.err, QD: wl.QD, Block: wl.Block}
				if t.dev != nil {
					// No row pays for an earlier row's writeback.
					if fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
						unix.Syncfs(fd)
						unix.Close(fd)
					}
					measure(t.dev, wl, cfg.s, &row)
					logger.Printf("%-32s %-18s %10.0f ops/s  p50 %8.2f µs  p99 %8.2f µs %s", wl.Name, t.name, row.OpsPerSec, row.P50us, row.P99us, row.Error)
				}
				rows[wl.Name+"\x00"+t.name] = row
			}
		}
		for _, t := range targets {
			if t.close != nil {
				if err := t.close(); err != nil {
					logger.Printf("close %s: %v", t.name, err)
				}
			}
		}
	}
	t0 := time.Now()
	kernel := []target{newRaw(dir, cfg.s.FileBytes), newFile(dir, cfg.s.FileBytes), newWeirFile(dir, cfg.s.FileBytes)}
	rep.PrepSec = time.Since(t0).Seconds()
	phase(kernel)
	for i, mk := range spdkPhases(dir, cfg.s) {
		t0 = time.Now()
		ts := mk()
		if i == 0 {
			rep.SPDKPrepSec = time.Since(t0).Seconds()
		}
		phase(ts)
	}
	for _, wl := range wls {
		for _, t := range all {
			rep.Rows = append(rep.Rows, rows[wl.Name+"\x00"+t.name])
		}
	}
	rep.derive(cfg.out)
	return rep, nil
}

// measure runs wl on d: wl.QD goroutines, each issuing one IO at a time,
// first for the warm-up, then for the window, timing every IO of the
// window.
func measure(d device, wl workload, s settings, row *Row) {
	blocks := s.FileBytes / int64(wl.Block)
	lats := make([][]int64, wl.QD)
	errs := make([]error, wl.QD)
	var ready, wg sync.WaitGroup
	ready.Add(wl.QD)
	startCh := make(chan struct{})
	var winStart, winEnd time.Time
	for g := range wl.QD {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := alignedBuf(wl.Block)
			defer unix.Munmap(buf)
			// The same offsets on every target.
			rng := rand.New(rand.NewPCG(uint64(len(wl.Name)), uint64(g)))
			var seq int64
			next := func() int64 {
				if wl.Random {
					return rng.Int64N(blocks) * int64(wl.Block)
				}
				off := (seq % blocks) * int64(wl.Block)
				seq++
				return off
			}
			lat := make([]int64, 0, 1<<16)
			ready.Done()
			<-startCh
			for {
				t := time.Now()
				if t.After(winEnd) {
					break
				}
				off := next()
				var err error
				if wl.Write {
					_, err = d.WriteAt(buf, off)
				} else {
					_, err = d.ReadAt(buf, off)
				}
				if err != nil {
					errs[g] = err
					break
				}
				if !t.Before(winStart) {
					lat = append(lat, time.Since(t).Nanoseconds())
				}
			}
			lats[g] = lat
		}()
	}
	ready.Wait()
	winStart = time.Now().Add(s.Warmup)
	winEnd = winStart.Add(s.Window)
	close(startCh)
	wg.Wait()
	elapsed := time.Since(winStart) // to the last IO's end
	if err := errorsJoin(errs); err != nil {
		row.Error = err.Error()
		return
	}
	var h benchutil.Histogram
	for _, l := range lats {
		for _, v := range l {
			h.Record(v)
		}
	}
	row.Ops, row.WindowSec = h.Count(), elapsed.Seconds()
	row.OpsPerSec = float64(row.Ops) / row.WindowSec
	row.MBps = row.OpsPerSec * float64(wl.Block) / 1e6
	row.P50us, row.P99us = h.QuantileUs(0.50), h.QuantileUs(0.99)
	row.MeanUs, row.MaxUs = h.Mean()/1e3, float64(h.Max())/1e3
}

func errorsJoin(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// memTotal is MemTotal from /proc/meminfo, in bytes (0 if unknown).
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kib int64
	for line := range strings.Lines(string(b)) {
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kib); err == nil {
			return kib * 1024
		}
	}
	return 0
}
