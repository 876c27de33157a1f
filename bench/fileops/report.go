package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// p999MinOps is the op count from which a row reports p99.9.
const p999MinOps = 10000

// minCPUWindow is the shortest window whose CPU times are reported: CPU
// time is counted in 10 ms ticks, so a shorter window could be off by more
// than a few per cent.
const minCPUWindow = 500 * time.Millisecond

// disturbedLoad is the other load (cores) above which a row is called
// disturbed.
const disturbedLoad = 0.25

// Row is one (workload, target) measurement.
type Row struct {
	Family   string `json:"family"`
	Workload string `json:"workload"`
	Target   string `json:"target"`
	NA       string `json:"na,omitempty"`
	Error    string `json:"error,omitempty"`

	BlockBytes int      `json:"block_bytes,omitempty"`
	Ops        uint64   `json:"ops"`
	WindowSec  float64  `json:"window_sec"`
	OpsPerSec  float64  `json:"ops_per_sec"`
	MBps       float64  `json:"mb_per_sec,omitempty"` // 10^6 bytes/s; data workloads only
	P50us      float64  `json:"p50_us"`
	P99us      float64  `json:"p99_us"`
	P999us     *float64 `json:"p999_us,omitempty"` // with at least p999MinOps ops
	MeanUs     float64  `json:"mean_us"`
	MaxUs      float64  `json:"max_us"`

	// Sequential write only: the one fsync after the last write, and the
	// throughput counting it.
	FinalSyncMs  *float64 `json:"final_sync_ms,omitempty"`
	MBpsInclSync *float64 `json:"mb_per_sec_incl_sync,omitempty"`

	// CPU columns, only for windows of at least minCPUWindow (the clock
	// ticks in 10 ms steps).
	ClientCPUusPerOp  *float64 `json:"client_cpu_us_per_op,omitempty"`
	ServiceCPUusPerOp *float64 `json:"service_cpu_us_per_op,omitempty"` // weir: metadata, io and NATS (the benchmark process)
	OtherCores        *float64 `json:"other_load_cores,omitempty"`
	ClientPeakRSSKiB  int64    `json:"client_peak_rss_kib"`
	Mem               *RowMem  `json:"memory,omitempty"` // cache rows

	// On os and os-direct rows, against the weir row of the same workload:
	// weir ops/s ÷ this ops/s (below 1: weir does less) and weir p50 ÷
	// this p50 (above 1: weir is slower).
	WeirOpsRatio *float64 `json:"weir_ops_ratio,omitempty"`
	WeirP50Ratio *float64 `json:"weir_p50_ratio,omitempty"`

	CDF []benchutil.CDFPoint `json:"cdf,omitempty"`
}

func newRow(family, wl, t string, q request, res result) Row {
	row := Row{Family: family, Workload: wl, Target: t, NA: res.NA, Error: res.Error, BlockBytes: q.Block,
		ClientPeakRSSKiB: res.PeakRSSKiB}
	if row.NA != "" || row.Error != "" {
		return row
	}
	sec := res.Elapsed.Seconds()
	row.Ops, row.WindowSec = res.Ops, sec
	if sec > 0 {
		row.OpsPerSec = float64(res.Ops) / sec
		if res.Bytes > 0 {
			row.MBps = float64(res.Bytes) / sec / 1e6
		}
	}
	row.P50us, row.P99us, row.MeanUs, row.MaxUs = res.P50us, res.P99us, res.MeanUs, res.MaxUs
	if res.Ops >= p999MinOps {
		v := res.P999us
		row.P999us = &v
	}
	if q.Op == opSeqWrite {
		ms := float64(res.FinalSync) / float64(time.Millisecond)
		incl := float64(res.Bytes) / (res.Elapsed + res.FinalSync).Seconds() / 1e6
		row.FinalSyncMs, row.MBpsInclSync = &ms, &incl
	}
	if res.Ops > 0 && res.Elapsed >= minCPUWindow {
		c := float64(res.ClientCPU.Microseconds()) / float64(res.Ops)
		sv := float64(res.ServiceCPU.Microseconds()) / float64(res.Ops)
		o := max(res.OtherCPU.Seconds()/sec, 0)
		row.ClientCPUusPerOp, row.OtherCores = &c, &o
		if t == targetWeir {
			row.ServiceCPUusPerOp = &sv
		}
	}
	row.CDF = res.CDF
	return row
}

// RowMem is the memory after a cache row: the driver's resident set and
// the shared memory in it, and for weir the IO service's and its cache's
// (the memfds' allocated bytes, whoever faulted them; resident pages
// against the cache's limit, io.cache_size).
type RowMem struct {
	ClientRSSKiB       int64 `json:"client_rss_kib"`
	ClientShmemKiB     int64 `json:"client_shmem_kib"`
	IORSSKiB           int64 `json:"io_rss_kib,omitempty"`
	IOShmemKiB         int64 `json:"io_shmem_kib,omitempty"`
	CacheBytes         int64 `json:"cache_memory_bytes,omitempty"`
	CacheResidentPages int64 `json:"cache_resident_pages,omitempty"`
	CacheLimitPages    int64 `json:"cache_limit_pages,omitempty"`
}

// RSS is one process's peak resident set.
type RSS struct {
	Process    string `json:"process"`
	Pid        int    `json:"pid"`
	PeakRSSKiB int64  `json:"peak_rss_kib"`
	Error      string `json:"error,omitempty"`
}

// WeirSetup is how the weir side ran.
type WeirSetup struct {
	Backend string `json:"backend"`
	// Direct is whether the file backend said it uses O_DIRECT (nil: it
	// said nothing the benchmark recognised); ModeLog is what it said.
	Direct         *bool    `json:"o_direct"`
	ModeLog        []string `json:"mode_log"`
	DirectConfig   string   `json:"io_direct"`
	WaitMode       string   `json:"wait_mode"`
	SyncEveryOp    bool     `json:"metadata_sync_every_op"`
	SyncInterval   string   `json:"metadata_sync_interval"`
	CheckpointEvry int      `json:"metadata_checkpoint_every"`
	SQEntries      int      `json:"ring_sq_entries"`
	ArenaSize      string   `json:"ring_arena_size"`
	BlockSize      string   `json:"ring_block_size"`
	ConfigFile     string   `json:"config_file"`
}

// prepNote is the preparation of one target's random file (not a row).
type prepNote struct {
	Target  string  `json:"target"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	NA      string  `json:"na,omitempty"`
	Error   string  `json:"error,omitempty"`
}

type report struct {
	Date       string               `json:"date"`
	Command    string               `json:"command"`
	Args       []string             `json:"args"`
	Host       benchutil.Host       `json:"host"`
	MemTotal   string               `json:"mem_total"`
	Dir        string               `json:"dir"`
	Filesystem benchutil.Filesystem `json:"filesystem"`
	Settings   settings             `json:"settings"`
	Weir       WeirSetup            `json:"weir"`
	Prep       []prepNote           `json:"prepare"`
	Rows       []Row                `json:"rows"`
	RSS        []RSS                `json:"peak_rss"`
	Plots      []string             `json:"plots"`
	Limits     []Limit              `json:"limits,omitempty"`
	Warnings   []string             `json:"warnings,omitempty"`
}

func newReport(cfg options) (*report, error) {
	h, err := benchutil.HostInfo()
	if err != nil {
		return nil, err
	}
	return &report{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Command:  strings.Join(append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...), " "),
		Args:     os.Args[1:],
		Host:     h,
		MemTotal: memTotal(),
		Settings: cfg.s,
	}, nil
}

// memTotal is MemTotal from /proc/meminfo, e.g. "23.5 GiB", or "".
func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err == nil {
				return benchutil.Fnum(float64(kib)/(1<<20)) + " GiB"
			}
		}
	}
	return ""
}

func (r *report) addRSS(name string, pid int) {
	e := RSS{Process: name, Pid: pid}
	kib, err := benchutil.ProcPeakRSS(pid)
	if err != nil {
		e.Error = err.Error()
	}
	e.PeakRSSKiB = kib
	r.RSS = append(r.RSS, e)
}

func (r *report) setWeir(cfg options, w *weirStack) {
	c := w.cfg
	direct, lines := w.tap.ioMode()
	r.Weir = WeirSetup{
		Backend: c.IO.Backend, Direct: direct, ModeLog: lines, DirectConfig: c.IO.Direct,
		WaitMode: c.IO.WaitMode, SyncEveryOp: c.Metadata.SyncEveryOp,
		SyncInterval: c.Metadata.SyncInterval.String(), CheckpointEvry: c.Metadata.CheckpointEvery,
		SQEntries: c.Ring.SQEntries, ArenaSize: c.Ring.ArenaSize.String(), BlockSize: c.Ring.BlockSize.String(),
		ConfigFile: w.cfgText,
	}
}

// find returns the row of a workload and target, or nil.
func (r *report) find(family, wl, target string) *Row {
	for i := range r.Rows {
		if row := &r.Rows[i]; row.Family == family && row.Workload == wl && row.Target == target {
			return row
		}
	}
	return nil
}

func measured(row *Row) bool { return row != nil && row.Error == "" && row.NA == "" && row.Ops > 0 }

// finish computes the weir ratios on the os rows.
func (r *report) finish() {
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Target == targetWeir || !measured(row) {
			continue
		}
		w := r.find(row.Family, row.Workload, targetWeir)
		if !measured(w) || row.OpsPerSec <= 0 || row.P50us <= 0 {
			continue
		}
		ops, p50 := w.OpsPerSec/row.OpsPerSec, w.P50us/row.P50us
		row.WeirOpsRatio, row.WeirP50Ratio = &ops, &p50
	}
}

// column is one column of a family's table.
type column struct {
	head  string
	align string // "--:" or "---"
	cell  func(*Row) string
}

func opt(v *float64, f func(float64) string) string {
	if v == nil {
		return "—"
	}
	return f(*v)
}

func ratio(v float64) string { return benchutil.Fnum(v) + "×" }

func (r *report) columns(family string) []column {
	fnum, fint := benchutil.Fnum, benchutil.Fint
	cols := []column{
		{"Workload", "---", func(w *Row) string { return w.Workload }},
		{"Target", "---", func(w *Row) string { return w.Target }},
		{"ops", "--:", func(w *Row) string { return fint(float64(w.Ops)) }},
		{"ops/s", "--:", func(w *Row) string { return fint(w.OpsPerSec) }},
	}
	if family != famMeta && family != famSmall {
		cols = append(cols, column{"MB/s", "--:", func(w *Row) string { return fnum(w.MBps) }})
	}
	cols = append(cols,
		column{"p50 µs", "--:", func(w *Row) string { return fnum(w.P50us) }},
		column{"p99 µs", "--:", func(w *Row) string { return fnum(w.P99us) }},
		column{"p99.9 µs", "--:", func(w *Row) string { return opt(w.P999us, fnum) }},
	)
	if family == famSeq {
		cols = append(cols,
			column{"final fsync ms", "--:", func(w *Row) string { return opt(w.FinalSyncMs, fnum) }},
			column{"MB/s incl. fsync", "--:", func(w *Row) string { return opt(w.MBpsInclSync, fnum) }},
		)
	}
	cols = append(cols,
		column{"CPU µs/op client + services", "--:", func(w *Row) string {
			if w.ClientCPUusPerOp == nil || w.ServiceCPUusPerOp == nil {
				return opt(w.ClientCPUusPerOp, fnum)
			}
			return fnum(*w.ClientCPUusPerOp) + " + " + fnum(*w.ServiceCPUusPerOp)
		}},
		column{"other CPU (cores)", "--:", func(w *Row) string { return opt(w.OtherCores, fnum) }},
		column{"weir ÷ this: ops/s", "--:", func(w *Row) string { return opt(w.WeirOpsRatio, ratio) }},
		column{"weir ÷ this: p50", "--:", func(w *Row) string { return opt(w.WeirP50Ratio, ratio) }},
	)
	return cols
}

// table writes one family's rows.
func (r *report) table(b *strings.Builder, family string, notes *[]string) {
	cols := r.columns(family)
	for _, c := range cols {
		b.WriteString("| " + c.head + " ")
	}
	b.WriteString("|\n")
	for _, c := range cols {
		b.WriteString("|" + c.align)
	}
	b.WriteString("|\n")
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Family != family {
			continue
		}
		if row.Error != "" || row.NA != "" {
			text := "n/a: " + row.NA
			if row.Error != "" {
				*notes = append(*notes, fmt.Sprintf("%s %s, %s: %s", family, row.Workload, row.Target, strings.ReplaceAll(row.Error, "\n", "; ")))
				text = fmt.Sprintf("error [%d]", len(*notes))
			}
			fmt.Fprintf(b, "| %s | %s | %s |%s\n", row.Workload, row.Target, text, strings.Repeat(" |", len(cols)-3))
			continue
		}
		for _, c := range cols {
			b.WriteString("| " + c.cell(row) + " ")
		}
		b.WriteString("|\n")
	}
	b.WriteString("\n")
}

func (r *report) markdown() string {
	var b strings.Builder
	h, s, w := r.Host, r.Settings, r.Weir
	fnum, fint := benchutil.Fnum, benchutil.Fint
	b.WriteString("# File operations: weir client vs the kernel (os)\n\n")
	fmt.Fprintf(&b, "- Date: %s\n", r.Date)
	fmt.Fprintf(&b, "- Machine: %d CPUs (nproc), %s; %s; %s RAM\n", h.NProc, h.CPUModel, h.Kernel, r.MemTotal)
	fmt.Fprintf(&b, "- File system: %s. The weir data directory (`weir/`) and the os directories (`os/`, `os-direct/`) are siblings under %s.\n",
		r.Filesystem, r.Dir)
	fmt.Fprintf(&b, "- Go: %s, GOMAXPROCS %d\n", h.GoVersion, h.GOMAXPROCS)
	if len(s.Only) > 0 {
		fmt.Fprintf(&b, "- Families run (-only): %s\n", strings.Join(s.Only, "; "))
	}
	fmt.Fprintf(&b, "- Command: `%s`\n", r.Command)
	mode := "not reported by the backend log"
	if w.Direct != nil && *w.Direct {
		mode = "**O_DIRECT**"
	} else if w.Direct != nil {
		mode = "**buffered** (no O_DIRECT)"
	}
	fmt.Fprintf(&b, "- weir data path: %s backend, %s", w.Backend, mode)
	if len(w.ModeLog) > 0 {
		fmt.Fprintf(&b, " (backend log: `%s`)", strings.Join(w.ModeLog, "`; `"))
	}
	b.WriteString(".\n")
	fmt.Fprintf(&b, "- weir configuration: io.direct = %s, io.wait_mode = %s (client too), metadata.sync_every_op = %v "+
		"(group commit every %s), metadata.checkpoint_every = %d, ring: %d SQ entries, %s arena, %s blocks. "+
		"Metadata and IO services are processes of the weir binary; embedded NATS runs in the benchmark process.\n",
		w.DirectConfig, w.WaitMode, w.SyncEveryOp, w.SyncInterval, w.CheckpointEvry, w.SQEntries, w.ArenaSize, w.BlockSize)
	b.WriteString("- Clients: one driver process per target, one goroutine, queue depth 1. weir: `client.File` ReadAt/WriteAt/Sync " +
		"(the copying API); os: `os.File` ReadAt/WriteAt/Sync (fsync), buffered; os-direct: the same with O_DIRECT and page-aligned buffers " +
		"(data files only). Targets run one after another per workload, weir first; before each row the file system is synced (syncfs) " +
		"so that no row pays for an earlier row's writeback.\n")
	fmt.Fprintf(&b, "- Random: a %d MiB file per target, written in full and fsynced first; uniformly random 4 KiB-aligned offsets, "+
		"the same sequence on every target; %s ms warm-up, then a %s ms window. Write + fsync: %s ops or %s s, whichever ends first.\n",
		s.RandSize/mib, fnum(ms(s.Warmup)), fnum(ms(s.Window)), fint(float64(s.FsyncOps)), fnum(s.FsyncWindow.Seconds()))
	fmt.Fprintf(&b, "- Metadata: %s files in one directory: create (open O_CREATE|O_EXCL|O_WRONLY, close) in name order, then stat, "+
		"then unlink, each in its own shuffled order; every op timed, no warm-up.\n", fint(float64(s.Files)))
	fmt.Fprintf(&b, "- Sequential: a new %d MiB file per target, 1 MiB writes from offset 0, then one fsync (timed apart), then 1 MiB reads of it. "+
		"First, untimed, a scratch file of the same size is written through the page cache and removed, so that the os row's page cache "+
		"reuses memory the VM has touched before (on the reference VM, growing the page cache into never-touched memory was about 10× slower "+
		"than reusing memory, most likely the hypervisor backing guest memory on first touch).\n",
		s.SeqSize/mib)
	fmt.Fprintf(&b, "- Cache (the rows of issue 9's page cache): a %d MiB file per target, written in full (1 MiB writes, fsync). Warm: read right after, so in the kernel's page cache for os. "+
		"Cold: after `echo 3 > /proc/sys/vm/drop_caches` (root only; the rows are n/a otherwise) before each target, and only a sixteenth of the file's blocks read at random, so that the row does not warm the cache much. "+
		"weir's cold rows also empty its page cache first (`weir drop-caches`). Two processes: a second driver process of the target opens the file; one writes 4 KiB blocks at random while the other reads, for the same window; "+
		"their service CPU is the services' for both processes' ops.\n", s.RandSize/mib)
	fmt.Fprintf(&b, "- Small files (weir and os only; every file written and closed first, nothing synced): open (O_RDONLY) + 4 KiB read + close of one of %d 4 KiB files in turn, "+
		"warm-up and window as the random rows (warm); the same over %s files, each opened once in a shuffled order, until all were or the window ends (cold: not opened since written; "+
		"the kernel's caches are not dropped, so for os the inodes and data are cached). Stat: a second driver process of the target opens the file O_RDWR, writes 4 KiB and holds it open "+
		"while the measured one stats it (and checks the size is 4 KiB). fstest.TestFS: %s files of 1 byte to 4 KiB, %d to a directory, made first; one op is one whole TestFS run "+
		"(os: `os.DirFS`; weir: `fs.Sub` of the client's `FS`), as many as fit in the window, at most %d, and an error it reports fails the row. "+
		"Ping-pong: the driver and a second driver process hold one 4 KiB file open O_RDWR and take turns writing 4 KiB at offset 0, up to %s turns or the window; a turn is one write, timed in its driver. "+
		"For weir the second driver runs as uid %d (root only; n/a otherwise), another trust group under the default trust_groups = \"uid\", so each turn recalls the other's exclusive lease: "+
		"the row is the recall's cost to the writer. For os the second driver is of the same uid (the kernel has no trust groups).\n",
		warmFiles, fint(float64(s.ColdFiles)), fint(treeFiles), treeDirFiles, fstestRuns, fint(pingTurns), otherUID)
	b.WriteString("- Durability: no row's writes are followed by fsync except the write + fsync rows and the final fsync column. " +
		"os buffered writes end in the page cache, and its buffered reads of files it has just written come from the page cache.\n")
	fmt.Fprintf(&b, "- Latency: wall time of each op in a log-linear histogram (buckets 0.8 %% wide); p99.9 only for rows with ≥ %s ops. "+
		"MB/s is 10^6 bytes/s. CPU: utime+stime from /proc/<pid>/stat over the window (10 ms ticks, so only for windows of at least %s ms) "+
		"of the driver (client) and, for weir, of the services: the metadata and io processes and the benchmark process, which runs embedded NATS. Other CPU: machine-wide busy and stolen CPU outside those "+
		"processes; it includes kernel threads working for the row (journal commits, writeback, I/O completion), so on rows that write it "+
		"is part of the cost, and on read and stat rows well above 0 means other work disturbed the row. "+
		"weir ÷ this: ops/s below 1× means weir does fewer ops per second; p50 above 1× means weir is slower.\n\n",
		fint(p999MinOps), fnum(ms(minCPUWindow)))

	var notes []string
	for _, fam := range families {
		fmt.Fprintf(&b, "## %s\n\n", strings.ToUpper(fam[:1])+fam[1:])
		r.table(&b, fam, &notes)
		if plot := plotName(fam); plot != "" && r.hasData(fam) {
			fmt.Fprintf(&b, "![latency CDF, %s](%s)\n\n", fam, plot)
		}
	}
	for i, n := range notes {
		fmt.Fprintf(&b, "[%d] %s\n\n", i+1, n)
	}
	r.memoryTable(&b)
	r.limits(&b)

	if len(r.Prep) > 0 {
		var parts []string
		for _, p := range r.Prep {
			switch {
			case p.Error != "":
				parts = append(parts, p.Target+" failed: "+p.Error)
			case p.NA != "":
				parts = append(parts, p.Target+" n/a")
			case p.Seconds > 0:
				parts = append(parts, fmt.Sprintf("%s %s MB/s", p.Target, fnum(float64(p.Bytes)/p.Seconds/1e6)))
			}
		}
		fmt.Fprintf(&b, "Preparation of the random file (1 MiB writes + one fsync, not a row): %s.\n\n", strings.Join(parts, ", "))
	}

	b.WriteString("## Peak RSS (VmHWM)\n\n| Process | pid | Peak RSS MiB |\n|---|--:|--:|\n")
	for _, e := range r.RSS {
		v := benchutil.MiB(e.PeakRSSKiB)
		if e.Error != "" {
			v = "error: " + e.Error
		}
		fmt.Fprintf(&b, "| %s | %d | %s |\n", e.Process, e.Pid, v)
	}
	b.WriteString("\n")

	if line := r.disturbed(); line != "" {
		b.WriteString(line + "\n\n")
	}
	for _, warn := range r.Warnings {
		fmt.Fprintf(&b, "Warning: %s\n\n", warn)
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// disturbed names the rows measured while other work took CPU.
func (r *report) disturbed() string {
	var rows []string
	for i := range r.Rows {
		row := &r.Rows[i]
		if measured(row) && !writes(row) && row.OtherCores != nil && *row.OtherCores >= disturbedLoad {
			rows = append(rows, fmt.Sprintf("%s %s %s (%s cores)", row.Family, row.Workload, row.Target, benchutil.Fnum(*row.OtherCores)))
		}
	}
	if len(rows) == 0 {
		return ""
	}
	return fmt.Sprintf("Disturbed rows (on a row that writes nothing, other processes or the hypervisor took ≥ %s cores during the window; rerun before trusting them): %s.",
		benchutil.Fnum(disturbedLoad), strings.Join(rows, "; "))
}

// writes reports whether a row's workload changes the file system: its
// "other CPU" includes the kernel threads that do the work (journal
// commits, writeback, block I/O completion).
func writes(row *Row) bool {
	return !readOnly[row.Workload]
}

// write puts fileops.md, fileops.json and the plots in dir.
func (r *report) write(dir, md string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	plots, err := r.plot(dir)
	if err != nil {
		return err
	}
	r.Plots = plots
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := benchutil.WriteFileAtomic(filepath.Join(dir, "fileops.json"), append(js, '\n')); err != nil {
		return err
	}
	return benchutil.WriteFileAtomic(filepath.Join(dir, "fileops.md"), []byte(md))
}

// limits writes the floors measured in this run (limits.go), each against
// the warm 4 KiB random read of weir and of the kernel.
func (r *report) limits(b *strings.Builder) {
	if len(r.Limits) == 0 {
		return
	}
	weir, kern := r.find(famCache, wlWarmRand, targetWeir), r.find(famCache, wlWarmRand, targetOS)
	b.WriteString("## Limits measured in this run\n\n")
	b.WriteString("Each timed as the rows time their ops, in the benchmark process, on memory of the random file's size.\n\n")
	b.WriteString("| What | ops | p50 µs | p99 µs | weir warm 4 KiB read p50 ÷ this | os warm 4 KiB read p50 ÷ this |\n|---|--:|--:|--:|--:|--:|\n")
	ratio := func(row *Row, l Limit) string {
		if !l.WarmRead || row == nil || row.P50us == 0 || l.P50us == 0 || row.NA != "" || row.Error != "" {
			return "—"
		}
		return benchutil.Fnum(row.P50us/l.P50us) + "×"
	}
	for _, l := range r.Limits {
		if l.NA != "" {
			fmt.Fprintf(b, "| %s | n/a: %s | | | | |\n", l.What, l.NA)
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s |\n", l.What, benchutil.Fint(float64(l.Ops)), benchutil.Fnum(l.P50us), benchutil.Fnum(l.P99us), ratio(weir, l), ratio(kern, l))
	}
	if kern != nil && kern.P50us > 0 {
		fmt.Fprintf(b, "\nA third of the kernel's warm 4 KiB read p50 (issue 9's goal for weir's) is %s µs.", benchutil.Fnum(kern.P50us/3))
	}
	wc, dc := r.find(famCache, wlColdRand, targetWeir), r.find(famCache, wlColdRand, targetOSDirect)
	if wc != nil && dc != nil && wc.P50us > 0 && dc.P50us > 0 {
		fmt.Fprintf(b, " The cold 4 KiB read: weir's p50 is %s µs above O_DIRECT's (1.1× of O_DIRECT, issue 9's goal, leaves %s µs).",
			benchutil.Fnum(wc.P50us-dc.P50us), benchutil.Fnum(dc.P50us/10))
	}
	b.WriteString("\n")
	b.WriteString("\n")
}

// memoryTable writes the memory after each cache row (RowMem).
func (r *report) memoryTable(b *strings.Builder) {
	var rows []Row
	for _, row := range r.Rows {
		if row.Mem != nil {
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("## Memory after each cache row\n\n")
	b.WriteString("Client: the driver process's VmRSS, of which RssShmem (for weir: the cache region pages it mapped). io: the IO service's VmRSS, of which RssShmem. Cache: the memfds' allocated bytes (`cache_memory_bytes`), and resident pages against the limit (`io.cache_size`); the os targets' cache is the kernel's.\n\n")
	b.WriteString("| Workload | Target | client RSS MiB | of which shared MiB | io RSS MiB | of which shared MiB | cache memory MiB | resident pages / limit |\n|---|---|--:|--:|--:|--:|--:|--:|\n")
	mib := func(kib int64) string { return benchutil.MiB(kib) }
	for _, row := range rows {
		m := row.Mem
		io, ioSh, cache, res := "—", "—", "—", "—"
		if row.Target == targetWeir && m.IORSSKiB > 0 {
			io, ioSh = mib(m.IORSSKiB), mib(m.IOShmemKiB)
		}
		if row.Target == targetWeir && m.CacheLimitPages > 0 {
			cache = benchutil.Fnum(float64(m.CacheBytes) / (1 << 20))
			res = fmt.Sprintf("%s / %s", benchutil.Fint(float64(m.CacheResidentPages)), benchutil.Fint(float64(m.CacheLimitPages)))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", row.Workload, row.Target, mib(m.ClientRSSKiB), mib(m.ClientShmemKiB), io, ioSh, cache, res)
	}
	b.WriteString("\n")
}
