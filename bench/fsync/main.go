// Command fsync measures the durability path of issue 10 side by side on
// one disk, in one run: an append to the staging log (services/journal/
// staging: one self-contained record of a 4 KiB page, then one flush,
// concurrent appends sharing flushes) against the file system's own 4 KiB
// write + fdatasync, appending to a file and overwriting a written one.
// Each workload runs with 1, 4 and 8 writers (goroutines of this process,
// each on its own file for the file system rows) and reports p50/p99,
// ops/s and the disk's flush requests per op (/proc/diskstats).
//
// This is the mechanism only: weir's fsync does not write staging records
// yet (docs/journal-format.md), and the full benchmark (through
// the client, journaled ext4 and XFS on loop devices, client processes,
// ablations) is not built.
//
// Usage:
//
//	go run ./bench/fsync [-dir PARENT] [-ops 2000] [-writers 1,4,8] [-out bench/results]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/bench/internal/benchutil"
	"github.com/weir-storage/weir/services/journal/staging"
)

// Row is one workload with one writer count.
type Row struct {
	Workload      string  `json:"workload"`
	Writers       int     `json:"writers"`
	Ops           int     `json:"ops"`
	OpsPerSec     float64 `json:"ops_per_sec"`
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	FlushesPerOp  float64 `json:"flushes_per_op"`
	LogFlushPerOp float64 `json:"log_flushes_per_op,omitempty"` // staging: the log's own count
}

const (
	wlStaging   = "staging log append (4 KiB record) + flush"
	wlAppend    = "file system: 4 KiB append + fdatasync"
	wlOverwrite = "file system: 4 KiB overwrite + fdatasync"
)

func main() {
	dir := flag.String("dir", "", "parent directory of the files (default: the system temporary directory); it decides the disk measured")
	ops := flag.Int("ops", 2000, "ops per row (all writers together)")
	writersFlag := flag.String("writers", "1,4,8", "writer counts, comma-separated")
	out := flag.String("out", "bench/results", "directory for fsync.md and fsync.json")
	flag.Parse()
	var writers []int
	for _, s := range strings.Split(*writersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-writers: %q", s)
		}
		writers = append(writers, n)
	}
	parent, err := os.MkdirTemp(*dir, "weir-bench-fsync-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(parent)
	var rows []Row
	for _, w := range writers {
		for _, wl := range []string{wlStaging, wlAppend, wlOverwrite} {
			row, err := run(parent, wl, w, *ops)
			if err != nil {
				log.Fatalf("%s, %d writers: %v", wl, w, err)
			}
			log.Printf("%-45s %d writers: p50 %7.1f µs  p99 %7.1f µs  %6.0f ops/s  %.2f flushes/op", wl, w, row.P50us, row.P99us, row.OpsPerSec, row.FlushesPerOp)
			rows = append(rows, row)
		}
	}
	md, err := report(parent, *ops, rows)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(md)
	js, _ := json.MarshalIndent(rows, "", "  ")
	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}
	for name, b := range map[string][]byte{"fsync.md": []byte(md), "fsync.json": js} {
		if err := benchutil.WriteFileAtomic(filepath.Join(*out, name), b); err != nil {
			log.Fatal(err)
		}
	}
}

// run measures ops of workload wl by w writers in files under parent.
func run(parent, wl string, w, ops int) (Row, error) {
	dir, err := os.MkdirTemp(parent, "row-")
	if err != nil {
		return Row{}, err
	}
	defer os.RemoveAll(dir)
	var op func(writer int, rng *rand.Rand) error
	var logFlushes func() uint64
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	page := make([]byte, 4096)
	switch wl {
	case wlStaging:
		f, err := os.OpenFile(filepath.Join(dir, "staging"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return Row{}, err
		}
		closers = append(closers, func() { f.Close() })
		dev := fileDevice{f}
		if err := staging.Format(dev, 8192); err != nil { // 32 MiB
			return Row{}, err
		}
		l, _, err := staging.Open(dev)
		if err != nil {
			return Row{}, err
		}
		var mu sync.Mutex
		op = func(writer int, rng *rand.Rand) error {
			r := staging.Record{Blob: uint64(writer + 1), Ino: uint64(writer + 1), Size: 1 << 20,
				Extents: []staging.Extent{{First: rng.Uint64N(256), Pages: 1}}, Data: page}
			_, err := l.Append(&r)
			if err == staging.ErrFull {
				mu.Lock()
				err = l.Trim(l.Stats().DurableLSN) // the journal would have committed them
				mu.Unlock()
				if err == nil {
					_, err = l.Append(&r)
				}
			}
			return err
		}
		logFlushes = func() uint64 { return l.Flushes.Load() }
	case wlAppend, wlOverwrite:
		files := make([]*os.File, w)
		for i := range files {
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				return Row{}, err
			}
			closers = append(closers, func() { f.Close() })
			if wl == wlOverwrite {
				if _, err := f.Write(make([]byte, 8<<20)); err != nil {
					return Row{}, err
				}
				if err := f.Sync(); err != nil {
					return Row{}, err
				}
			}
			files[i] = f
		}
		op = func(writer int, rng *rand.Rand) error {
			f := files[writer]
			var err error
			if wl == wlAppend {
				_, err = f.Write(page)
			} else {
				_, err = f.WriteAt(page, int64(rng.IntN(2048))*4096)
			}
			if err == nil {
				err = unix.Fdatasync(int(f.Fd()))
			}
			return err
		}
	}
	unix.Sync() // nothing of the set-up left to write back in the window
	before, _, err := benchutil.DiskFlushes(dir)
	if err != nil {
		return Row{}, err
	}
	var logBefore uint64
	if logFlushes != nil {
		logBefore = logFlushes()
	}
	hists := make([]benchutil.Histogram, w)
	errs := make(chan error, w)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for range ops / w {
				t := time.Now()
				if err := op(i, rng); err != nil {
					errs <- err
					return
				}
				hists[i].Record(int64(time.Since(t)))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		return Row{}, err
	}
	after, _, err := benchutil.DiskFlushes(dir)
	if err != nil {
		return Row{}, err
	}
	var all benchutil.Histogram
	for i := range hists {
		all.Merge(&hists[i])
	}
	n := int(all.Count())
	row := Row{Workload: wl, Writers: w, Ops: n, OpsPerSec: float64(n) / elapsed.Seconds(),
		P50us: all.QuantileUs(0.5), P99us: all.QuantileUs(0.99), FlushesPerOp: float64(after-before) / float64(n)}
	if logFlushes != nil {
		row.LogFlushPerOp = float64(logFlushes()-logBefore) / float64(n)
	}
	return row, nil
}

// fileDevice is a staging log on a file: flushes are fdatasync (the ring
// is preallocated with written blocks, so no flush commits file metadata).
type fileDevice struct{ *os.File }

func (d fileDevice) Sync() error { return unix.Fdatasync(int(d.Fd())) }

func report(parent string, ops int, rows []Row) (string, error) {
	var b strings.Builder
	host, _ := benchutil.HostInfo()
	fsd, err := benchutil.DescribeFS(parent)
	if err != nil {
		return "", err
	}
	_, disk, _ := benchutil.DiskFlushes(parent)
	fmt.Fprintf(&b, "# fsync path: the staging log against the file system's fdatasync\n\n")
	fmt.Fprintf(&b, "- Date: %s\n- Machine: %d CPUs, %s; %s\n- File system: %s; disk %s (flushes from /proc/diskstats, the whole disk: other activity counts too)\n",
		time.Now().UTC().Format(time.RFC3339), host.NProc, host.CPUModel, host.Kernel, fsd, disk)
	fmt.Fprintf(&b, "- %d ops per row, shared by the writers (goroutines of one process); 4 KiB each. Staging: a 32 MiB log, trimmed whole when full. File system: one file per writer; overwrites at random 4 KiB offsets of an 8 MiB written file.\n", ops)
	b.WriteString("- The mechanism only: weir's fsync does not write staging records yet.\n\n")
	b.WriteString("| Workload | writers | ops | ops/s | p50 µs | p99 µs | disk flushes / op | log flushes / op |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		lf := "—"
		if r.Workload == wlStaging {
			lf = benchutil.Fnum(r.LogFlushPerOp)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", r.Workload, r.Writers, benchutil.Fint(float64(r.Ops)),
			benchutil.Fint(r.OpsPerSec), benchutil.Fnum(r.P50us), benchutil.Fnum(r.P99us), benchutil.Fnum(r.FlushesPerOp), lf)
	}
	b.WriteString("\n")
	return b.String(), nil
}
