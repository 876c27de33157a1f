package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// ringP50us is the ring layer's round trip quoted from docs/benchmarks.md
// (transport section, reference run 2026-11-30: ring-busypoll no-op, one
// thread, p50 1.03 µs; the echo rows reach about 2 µs).
const (
	ringP50us     = 1.03
	ringP50Source = "docs/benchmarks.md, transport section (reference run 2026-11-30): ring-busypoll no-op p50 1.03 µs, ~1–2 µs across rows"
)

// Reference weir 4 KiB random QD1 p50s from docs/benchmarks.md (fileops
// section, reference run 2026-11-30), used when <out>/fileops.json is
// missing.
var (
	refWeirP50     = map[bool]float64{false: 65.4, true: 43.1}
	refOSDirectP50 = map[bool]float64{false: 47.7, true: 45.4}
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

// Overhead is the software cost per IO of one QD1 workload, in µs of p50.
type Overhead struct {
	Workload     string   `json:"workload"`
	RawP50us     *float64 `json:"raw_p50_us"`
	FileMinusRaw *float64 `json:"file_minus_raw_us"`
	AioMinusRaw  *float64 `json:"spdk_aio_minus_raw_us"`
	MallocP50us  *float64 `json:"spdk_malloc_p50_us"`
}

// Layer is one layer's cost per IO, measured elsewhere or derived.
type Layer struct {
	Layer  string  `json:"layer"`
	P50us  float64 `json:"p50_us"`
	How    string  `json:"how"`
	Derive bool    `json:"derived"`
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
	for _, wl := range workloads(r.Settings.QD) {
		if wl.QD != 1 {
			continue
		}
		o := Overhead{Workload: wl.Name}
		raw := r.row(wl.Name, targetRaw)
		if raw != nil {
			o.RawP50us = ptr(raw.P50us)
			if f := r.row(wl.Name, targetFile); f != nil {
				o.FileMinusRaw = ptr(f.P50us - raw.P50us)
			}
			if a := r.row(wl.Name, targetSPDKAio); a != nil {
				o.AioMinusRaw = ptr(a.P50us - raw.P50us)
			}
		}
		if m := r.row(wl.Name, targetSPDKMalloc); m != nil {
			o.MallocP50us = ptr(m.P50us)
		}
		r.Overhead = append(r.Overhead, o)
	}
	r.Layers = append(r.Layers, Layer{Layer: "ring round trip", P50us: ringP50us, How: "quoted from " + ringP50Source})
	weir, osd, src := weirP50s(out)
	for _, w := range []struct {
		write bool
		wl    string
	}{{false, "4 KiB random read, QD1"}, {true, "4 KiB random write, QD1"}} {
		f := r.row(w.wl, targetFile)
		if f == nil {
			continue
		}
		op := "read"
		if w.write {
			op = "write"
		}
		r.Layers = append(r.Layers, Layer{
			Layer:  "IO service + client + ring, 4 KiB " + op,
			P50us:  weir[w.write] - f.P50us,
			How:    fmt.Sprintf("weir 4 KiB random %s p50 %s µs (%s) − file backend p50 %s µs (this run)", op, benchutil.Fnum(weir[w.write]), src, benchutil.Fnum(f.P50us)),
			Derive: true,
		})
		if raw := r.row(w.wl, targetRaw); raw != nil {
			// Same-run difference: fileops' weir vs its os-direct, minus
			// what the file backend adds over raw here. Robust to the
			// device's speed changing between runs.
			r.Layers = append(r.Layers, Layer{
				Layer: "IO service + client + ring, 4 KiB " + op + ", same-run",
				P50us: weir[w.write] - osd[w.write] - (f.P50us - raw.P50us),
				How: fmt.Sprintf("(weir %s − os-direct %s µs, both from %s) − (file − raw here, %s µs)",
					benchutil.Fnum(weir[w.write]), benchutil.Fnum(osd[w.write]), src, benchutil.Fnum(f.P50us-raw.P50us)),
				Derive: true,
			})
		}
	}
}

// weirP50s returns weir's 4 KiB random QD1 read and write p50 from
// <out>/fileops.json, or the reference run's when that file is missing.
func weirP50s(out string) (weir, osDirect map[bool]float64, src string) {
	b, err := os.ReadFile(filepath.Join(out, "fileops.json"))
	if err == nil {
		var f struct {
			Date string `json:"date"`
			Rows []struct {
				Family, Workload, Target string
				P50                      float64 `json:"p50_us"`
			} `json:"rows"`
		}
		if json.Unmarshal(b, &f) == nil {
			m := map[string]map[bool]float64{"weir": {}, "os-direct": {}}
			for _, x := range f.Rows {
				if m[x.Target] != nil && strings.HasPrefix(x.Family, "4 KiB random") {
					switch x.Workload {
					case "read":
						m[x.Target][false] = x.P50
					case "write (no fsync)":
						m[x.Target][true] = x.P50
					}
				}
			}
			if len(m["weir"]) == 2 && len(m["os-direct"]) == 2 {
				return m["weir"], m["os-direct"], filepath.Join(out, "fileops.json") + " of " + f.Date
			}
		}
	}
	return refWeirP50, refOSDirectP50, "docs/benchmarks.md fileops reference run 2026-11-30"
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
	p("# Backends at the interface: raw O_DIRECT vs file vs SPDK (issue 4)\n\n")
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
	p("- Targets: raw = `pread`/`pwrite` on an O_DIRECT file (the floor); file = `backend/file` (O_DIRECT); spdk-aio = `backend/spdk` on an `aio` bdev over a sparse file on the same file system (block_size 4096); spdk-malloc = `backend/spdk` on a `malloc` bdev (no device). SPDK: one environment for both bdevs, %s, one SPDK thread serving every request one at a time through a 1 MiB bounce buffer.\n", huge)
	p("- Data: %s MiB per target, written in full with 1 MiB writes (and synced) before the rows (raw and file %s s; SPDK start, blobstore format and fill %s s). Buffers are page aligned. Nothing is fsynced during the rows; the file system is synced (syncfs) before each row.\n", benchutil.Fnum(float64(r.Settings.FileBytes)/mib), benchutil.Fnum(r.PrepSec), benchutil.Fnum(r.SPDKPrepSec))
	p("- Order: every raw and file row runs first, then SPDK starts and the spdk rows run: SPDK's thread polls a core while it has work (and for 500 µs after), which would slow kernel rows running next to it on a small machine; that polling core is part of every spdk row (on a 2-CPU machine it leaves one CPU for the callers and the kernel).\n")
	p("- Rows: random offsets are 4 KiB aligned and uniform, the same sequence on every target; QD%d is %d goroutines on one handle, each with one IO outstanding; sequential rows walk the file from offset 0 (wrapping). %s warm-up, then a %s window per row. Latency: wall time of each IO, log-linear histogram (0.8 %% buckets). MB/s is 10^6 bytes/s.\n\n",
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
	p("\n### Software overhead per IO (µs, p50)\n\n")
	p("| Workload | raw p50 | file − raw | spdk-aio − raw | spdk-malloc p50 (pure software path) |\n|---|--:|--:|--:|--:|\n")
	for _, o := range r.Overhead {
		p("| %s | %s | %s | %s | %s |\n", o.Workload, us(o.RawP50us), us(o.FileMinusRaw), us(o.AioMinusRaw), us(o.MallocP50us))
	}
	p("\n### Other layers (not measured by this program)\n\n| Layer | p50 µs | How |\n|---|--:|---|\n")
	for _, l := range r.Layers {
		name := l.Layer
		if l.Derive {
			name += " (derived)"
		}
		p("| %s | %s | %s |\n", name, benchutil.Fnum(l.P50us), l.How)
	}
	p("\nDerived rows subtract numbers from different runs and processes (the weir row also crosses the client, the ring and the IO service's worker): a rough split, not a measurement. The device's latency moves between runs on small VMs, so the same-run rows (weir against os-direct of one fileops run) are the better estimate.\n")
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
