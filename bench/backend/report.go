package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// The ring layer's no-op round trip, when <out>/transport.json is missing:
// the transport reference run in docs/benchmarks.md (2026-11-30T08:37Z,
// ring-busypoll, one thread).
const (
	refRingP50us  = 0.76
	refRingSource = "docs/benchmarks.md transport reference run 2026-11-30T08:37Z"
)

// Report is one run.
type Report struct {
	Date        string               `json:"date"`
	Command     string               `json:"command"`
	Host        benchutil.Host       `json:"host"`
	MemTotal    int64                `json:"mem_total"`
	Filesystem  benchutil.Filesystem `json:"filesystem"`
	Dir         string               `json:"dir"`
	Settings    settings             `json:"settings"`
	SPDKBuilt   bool                 `json:"spdk_built"`
	PrepSec     float64              `json:"prepare_sec"`
	SPDKPrepSec float64              `json:"spdk_prepare_sec"`
	Rows        []Row                `json:"rows"`
	Overhead    []Overhead           `json:"software_overhead"`
	Layers      []Layer              `json:"layers"`
}

// Overhead is the software cost per IO of one QD1 workload, in µs of p50,
// each a difference of two rows of this run.
type Overhead struct {
	Workload      string   `json:"workload"`
	RawP50us      *float64 `json:"raw_p50_us"`
	FileMinusRaw  *float64 `json:"file_minus_raw_us"`
	WeirFileMinus *float64 `json:"weir_file_minus_file_us"`
	AioMinusRaw   *float64 `json:"spdk_aio_minus_raw_us"`
	WeirAioMinus  *float64 `json:"weir_spdk_aio_minus_spdk_aio_us"`
	MallocP50us   *float64 `json:"spdk_malloc_p50_us"`
	WeirMallocMin *float64 `json:"weir_spdk_malloc_minus_spdk_malloc_us"`
	CGOMinusQueue *float64 `json:"spdk_cgocb_minus_spdk_malloc_us"`
}

// Layer is one layer's cost per IO.
type Layer struct {
	Layer string  `json:"layer"`
	P50us float64 `json:"p50_us"`
	How   string  `json:"how"`
}

func (r *Report) row(wl, target string) *Row {
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.Workload == wl && x.Target == target && x.NA == "" && x.Error == "" && x.Ops > 0 {
			return x
		}
	}
	return nil
}

func ptr(v float64) *float64 { return &v }

// derive fills the overhead and layer tables.
func (r *Report) derive(out string) {
	dev, weirDev := devTargets(r.Settings)
	diff := func(wl, a, b string) *float64 {
		x, y := r.row(wl, a), r.row(wl, b)
		if x == nil || y == nil {
			return nil
		}
		return ptr(x.P50us - y.P50us)
	}
	p50 := func(wl, t string) *float64 {
		if x := r.row(wl, t); x != nil {
			return ptr(x.P50us)
		}
		return nil
	}
	for _, wl := range workloads(r.Settings.QD) {
		if wl.QD != 1 {
			continue
		}
		r.Overhead = append(r.Overhead, Overhead{
			Workload:      wl.Name,
			RawP50us:      p50(wl.Name, targetRaw),
			FileMinusRaw:  diff(wl.Name, targetFile, targetRaw),
			WeirFileMinus: diff(wl.Name, targetWeirFile, targetFile),
			AioMinusRaw:   diff(wl.Name, dev, targetRaw),
			WeirAioMinus:  diff(wl.Name, weirDev, dev),
			MallocP50us:   p50(wl.Name, targetSPDKMalloc),
			WeirMallocMin: diff(wl.Name, targetWeirSPDKMalloc, targetSPDKMalloc),
			CGOMinusQueue: diff(wl.Name, targetSPDKMallocCGO, targetSPDKMalloc),
		})
	}
	ring, src := ringP50(out)
	r.Layers = append(r.Layers, Layer{Layer: "ring round trip (no-op, busy-poll)", P50us: ring, How: "bench/transport, " + src})
	for _, op := range []string{"read", "write"} {
		wl := "4 KiB random " + op + ", QD1"
		if d := diff(wl, targetWeirSPDKMalloc, targetSPDKMalloc); d != nil {
			r.Layers = append(r.Layers, Layer{Layer: "client + ring + IO service, 4 KiB " + op + " (SPDK malloc)", P50us: *d,
				How: "weir-spdk-malloc − spdk-malloc, this run"})
		}
		if d := diff(wl, targetWeirFile, targetFile); d != nil {
			r.Layers = append(r.Layers, Layer{Layer: "client + ring + IO service, 4 KiB " + op + " (file backend)", P50us: *d,
				How: "weir-file − file, this run (device noise included)"})
		}
		if m := p50(wl, targetSPDKMalloc); m != nil {
			r.Layers = append(r.Layers, Layer{Layer: "SPDK backend, 4 KiB " + op + " (no device)", P50us: *m,
				How: "spdk-malloc: caller → worker hand-off, blobstore, bdev, memcpy of the malloc bdev, completion"})
		}
	}
}

// ringP50 is the ring-busypoll no-op one-thread p50 from <out>/transport.json,
// or the reference run's.
func ringP50(out string) (float64, string) {
	b, err := os.ReadFile(filepath.Join(out, "transport.json"))
	if err == nil {
		var f struct {
			Date string `json:"date"`
			Rows []struct {
				Transport string  `json:"transport"`
				Workload  string  `json:"workload"`
				Threads   int     `json:"threads"`
				P50       float64 `json:"p50_us"`
			} `json:"rows"`
		}
		if json.Unmarshal(b, &f) == nil {
			for _, x := range f.Rows {
				if x.Transport == "ring-busypoll" && x.Workload == "no-op" && x.Threads == 1 && x.P50 > 0 {
					return x.P50, filepath.Join(out, "transport.json") + " of " + f.Date
				}
			}
		}
	}
	return refRingP50us, refRingSource
}

func us(v *float64) string {
	if v == nil {
		return "—"
	}
	return benchutil.Fnum(*v)
}

func (r *Report) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Backends at the interface and through weir: raw O_DIRECT vs file vs SPDK (issue 4)\n\n")
	p("- Date: %s\n", r.Date)
	p("- Machine: %d CPUs (nproc), %s; %s; %s GiB RAM\n", r.Host.NProc, r.Host.CPUModel, r.Host.Kernel, benchutil.Fnum(float64(r.MemTotal)/(1<<30)))
	p("- File system: %s. Every target's file is under %s.\n", r.Filesystem, r.Dir)
	p("- Go: %s, GOMAXPROCS %d\n", r.Host.GoVersion, r.Host.GOMAXPROCS)
	p("- Command: `%s`", r.Command)
	if r.SPDKBuilt {
		p(" (built with `-tags spdk`)\n")
	} else {
		p(" (built without the spdk tag)\n")
	}
	huge := "DPDK --no-huge (ordinary memory)"
	if r.Settings.HugePages {
		huge = "huge pages"
	}
	dev, weirDev := devTargets(r.Settings)
	devWhat := "spdk-aio = `backend/spdk` on an `aio` bdev over a sparse file on the same file system (block_size 4096); spdk-malloc = `backend/spdk` on a `malloc` bdev (no device)"
	if r.Settings.SPDKConfig != "" {
		devWhat = fmt.Sprintf("spdk-dev = `backend/spdk` on bdev `%s` of the SPDK config %s (formatted by the run); spdk-malloc = `backend/spdk` on ", r.Settings.SPDKBdev, r.Settings.SPDKConfig)
		if r.Settings.SPDKMallocBdev != "" {
			devWhat += fmt.Sprintf("its malloc bdev `%s` (no device)", r.Settings.SPDKMallocBdev)
		} else {
			devWhat += "a malloc bdev (n/a: -spdk-malloc-bdev not given)"
		}
	}
	p("- Targets: raw = `pread`/`pwrite` on an O_DIRECT file (the floor); file = `backend/file` (O_DIRECT); %s;", devWhat)
	p(" spdk-malloc-cgocb = the same with each completion delivered by a cgo callback instead of the worker's C completion queue; weir-* = the whole data path, in this process: Go client → ring → IO service (adaptive poller) → that backend, on one file of the same size (embedded NATS and the metadata service run too). SPDK: one environment (%s), %d I/O worker(s); backends are used at the interface with Go-heap buffers (every byte bounced), weir's rings are huge-page regions registered with SPDK where huge pages are on (aligned payloads go straight from the arena).\n", huge, r.Settings.SPDKWorkers)
	p("- Data: %s MiB per target, written in full with 1 MiB writes (and synced) before the rows (kernel targets %s s; SPDK start, blobstore format and fill %s s). Buffers are page aligned. Nothing is fsynced during the rows; the file system is synced (syncfs) before each row.\n", benchutil.Fnum(float64(r.Settings.FileBytes)/mib), benchutil.Fnum(r.PrepSec), benchutil.Fnum(r.SPDKPrepSec))
	p("- Order: phases, each closing its targets before the next: raw, file, weir-file; %s, spdk-malloc; spdk-malloc-cgocb; %s, weir-spdk-malloc (SPDK's pollers spin while they have work, and would slow kernel rows beside them on a small machine; the polling cores are part of every spdk row).\n", dev, weirDev)
	p("- Rows: random offsets are 4 KiB aligned and uniform, the same sequence on every target; QD%d is %d goroutines on one handle (weir: one client session), each with one IO outstanding; sequential rows walk the file from offset 0 (wrapping). %s warm-up, then a %s window per row. Latency: wall time of each IO, log-linear histogram (0.8 %% buckets). MB/s is 10^6 bytes/s.\n\n",
		r.Settings.QD, r.Settings.QD, r.Settings.Warmup, r.Settings.Window)

	p("| Workload | Target | ops | ops/s | MB/s | p50 µs | p99 µs | mean µs | max µs |\n|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, x := range r.Rows {
		switch {
		case x.NA != "":
			p("| %s | %s | %s | | | | | | |\n", x.Workload, x.Target, x.NA)
		case x.Error != "":
			p("| %s | %s | error: %s | | | | | | |\n", x.Workload, x.Target, strings.ReplaceAll(x.Error, "|", "/"))
		default:
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", x.Workload, x.Target, benchutil.Fint(float64(x.Ops)),
				benchutil.Fint(x.OpsPerSec), benchutil.Fnum(x.MBps), benchutil.Fnum(x.P50us), benchutil.Fnum(x.P99us),
				benchutil.Fnum(x.MeanUs), benchutil.Fnum(x.MaxUs))
		}
	}
	p("\n### Software overhead per IO (µs of p50, QD1, differences of rows of this run)\n\n")
	p("| Workload | raw p50 | file − raw | weir-file − file | %s − raw | %s − %s | spdk-malloc p50 | weir-spdk-malloc − spdk-malloc | cgo callback − C queue |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|\n", dev, weirDev, dev)
	for _, o := range r.Overhead {
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", o.Workload, us(o.RawP50us), us(o.FileMinusRaw), us(o.WeirFileMinus),
			us(o.AioMinusRaw), us(o.WeirAioMinus), us(o.MallocP50us), us(o.WeirMallocMin), us(o.CGOMinusQueue))
	}
	p("\n### Per layer (µs of p50 per 4 KiB IO)\n\n| Layer | p50 µs | How |\n|---|--:|---|\n")
	for _, l := range r.Layers {
		p("| %s | %s | %s |\n", l.Layer, benchutil.Fnum(l.P50us), l.How)
	}
	p("\nThe malloc rows are the clean split: no device, so weir-spdk-malloc − spdk-malloc is what the client, the ring and the IO service add to an SPDK I/O, and spdk-malloc is SPDK's software path with weir's worker hand-off. Differences against file and aio rows carry the device's noise.\n")
	return b.String()
}

func (r *Report) write(out, md string) error {
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := benchutil.WriteFileAtomic(filepath.Join(out, "backend.md"), []byte(md)); err != nil {
		return err
	}
	return benchutil.WriteFileAtomic(filepath.Join(out, "backend.json"), append(js, '\n'))
}
