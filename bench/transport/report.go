package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// The goal issue 2 sets for the ring with busy polling.
const (
	goalP50Us        = 2.0
	goalLowerThanUDS = 10.0
)

// Host describes the machine the run was on.
type Host = benchutil.Host

// Settings are the measurement parameters of the run.
type Settings struct {
	WarmupMs       float64 `json:"warmup_ms"`
	WindowMs       float64 `json:"window_ms"`
	Quick          bool    `json:"quick"`
	MaxSamples     int     `json:"max_samples_per_goroutine"`
	EchoPayload    int     `json:"echo_payload_bytes"`
	CPUTickMs      float64 `json:"cpu_tick_ms"`
	ServerPerTrans bool    `json:"one_server_process_per_transport"`
}

// Goal is the run checked against issue 2's goal. The headline row is the
// no-op with the fewest client goroutines: a bare round trip. The ratio
// columns and Met use the uds transport; MetVsBlocking the uds-blocking one.
type Goal struct {
	P50LimitUs      float64 `json:"p50_limit_us"`
	MinLowerThanUDS float64 `json:"min_lower_than_uds"`
	Headline        string  `json:"headline"`
	Met             *bool   `json:"met"` // against uds; nil when the headline rows are missing
	MetVsBlocking   *bool   `json:"met_vs_uds_blocking,omitempty"`
	BusyPollRows    int     `json:"busypoll_rows_compared"`
	BusyPollRowsMet int     `json:"busypoll_rows_met"`
	Note            string  `json:"note"`
}

type report struct {
	Date     string   `json:"date"`
	Command  string   `json:"command"`
	Args     []string `json:"args"`
	Host     Host     `json:"host"`
	Settings Settings `json:"settings"`
	Rows     []Row    `json:"rows"`
	Goal     Goal     `json:"goal"`
	Warnings []string `json:"warnings,omitempty"`
}

func newReport(cfg config) (*report, error) {
	h, err := benchutil.HostInfo()
	if err != nil {
		return nil, err
	}
	return &report{
		Date:    time.Now().Format(time.RFC3339),
		Command: strings.Join(append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...), " "),
		Args:    os.Args[1:],
		Host:    h,
		Settings: Settings{
			WarmupMs:       ms(cfg.s.warmup),
			WindowMs:       ms(cfg.s.window),
			Quick:          cfg.quick,
			MaxSamples:     cfg.s.maxSamples,
			EchoPayload:    echoPayload,
			CPUTickMs:      1000.0 / benchutil.ClockTicks,
			ServerPerTrans: true,
		},
	}, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func transportRank(t string) int { return slices.Index(allTransports, t) }

// finish orders the rows for reading side by side, computes the ratios
// against UDS and checks the goal.
func (r *report) finish() {
	slices.SortStableFunc(r.Rows, func(a, b Row) int {
		return cmp.Or(cmpBool(a.Idle, b.Idle), cmp.Compare(a.PayloadBytes, b.PayloadBytes), cmp.Compare(a.Threads, b.Threads),
			cmp.Compare(transportRank(a.Transport), transportRank(b.Transport)))
	})
	for i := range r.Rows {
		row := &r.Rows[i]
		if !isRing(row.Transport) || row.Idle || row.Error != "" {
			continue
		}
		uds := r.find(transportUDS, row.PayloadBytes, row.Threads)
		if uds == nil || uds.Error != "" || row.P50us <= 0 || uds.OpsPerSec <= 0 {
			continue
		}
		lower := uds.P50us / row.P50us
		ops := row.OpsPerSec / uds.OpsPerSec
		row.P50LowerThanUDS, row.OpsVsUDS = &lower, &ops
	}
	r.checkGoal()
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// find returns the measured (not idle) row of a configuration, or nil.
func (r *report) find(transport string, payload, threads int) *Row {
	for i := range r.Rows {
		if row := &r.Rows[i]; !row.Idle && row.Transport == transport && row.PayloadBytes == payload && row.Threads == threads {
			return row
		}
	}
	return nil
}

// meetsGoal reports whether a ring row meets both bounds.
func meetsGoal(row *Row) bool {
	return row.Error == "" && row.P50LowerThanUDS != nil &&
		row.P50us <= goalP50Us && *row.P50LowerThanUDS >= goalLowerThanUDS
}

func (r *report) headlineThreads() int {
	n := 0
	for _, row := range r.Rows {
		if !row.Idle && (n == 0 || row.Threads < n) {
			n = row.Threads
		}
	}
	return n
}

func (r *report) checkGoal() {
	g := &r.Goal
	g.P50LimitUs, g.MinLowerThanUDS = goalP50Us, goalLowerThanUDS
	thr := r.headlineThreads()
	g.Headline = fmt.Sprintf("%s, %d %s", workloadName(0), thr, benchutil.Plural(thr, "thread"))

	var b strings.Builder
	fmt.Fprintf(&b, "**Goal (issue 2):** with busy polling, ring p50 round trip ≤ %s µs and ≥ %s× lower than the Unix socket measured side by side.\n\n",
		benchutil.Fnum(goalP50Us), benchutil.Fnum(goalLowerThanUDS))

	bp, uds := r.find(transportRingBusyPoll, 0, thr), r.find(transportUDS, 0, thr)
	switch {
	case bp == nil || uds == nil:
		b.WriteString("**This run:** not judged: the run has no ring-busypoll or no uds no-op row.\n\n")
	case bp.Error != "" || uds.Error != "" || bp.P50LowerThanUDS == nil:
		b.WriteString("**This run:** not judged: the headline ring-busypoll or uds row failed.\n\n")
	default:
		met := meetsGoal(bp)
		g.Met = &met
		fmt.Fprintf(&b, "**This run (%s): goal %s against uds** (Go netpoller): ring-busypoll p50 %s µs, uds %s µs, %s× lower.\n\n",
			g.Headline, verdict(met), benchutil.Fnum(bp.P50us), benchutil.Fnum(uds.P50us), benchutil.Fnum(*bp.P50LowerThanUDS))
	}
	ub := r.find(transportUDSBlocking, 0, thr)
	if bp != nil && bp.Error == "" && bp.P50us > 0 && ub != nil && ub.Error == "" {
		lower := ub.P50us / bp.P50us
		met := bp.P50us <= goalP50Us && lower >= goalLowerThanUDS
		g.MetVsBlocking = &met
		fmt.Fprintf(&b, "**Goal %s against uds-blocking** (the same socket protocol with blocking system calls, as C code would do): "+
			"uds-blocking %s µs, %s× lower.\n\n", verdict(met), benchutil.Fnum(ub.P50us), benchutil.Fnum(lower))
	}

	var misses []string
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Transport != transportRingBusyPoll || row.Idle {
			continue
		}
		g.BusyPollRows++
		if meetsGoal(row) {
			g.BusyPollRowsMet++
			continue
		}
		misses = append(misses, r.missReason(row))
	}
	if g.BusyPollRows > 0 {
		fmt.Fprintf(&b, "Across every ring-busypoll row, %d of %d meet both bounds against uds.", g.BusyPollRowsMet, g.BusyPollRows)
		if len(misses) > 0 {
			fmt.Fprintf(&b, " Misses: %s.", strings.Join(misses, "; "))
		}
		b.WriteString("\n\n")
	}
	if line := r.disturbed(); line != "" {
		b.WriteString(line + "\n\n")
	}
	if line := r.oversubscription(); line != "" {
		b.WriteString(line + "\n\n")
	}
	if line := r.spinCost(thr); line != "" {
		b.WriteString(line + "\n\n")
	}
	if line := r.idleCost(); line != "" {
		b.WriteString(line + "\n\n")
	}
	g.Note = strings.TrimSpace(b.String())
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

func (r *report) missReason(row *Row) string {
	name := fmt.Sprintf("%s ×%d", row.Workload, row.Threads)
	if row.Error != "" {
		return name + " failed"
	}
	var why []string
	if row.P50us > goalP50Us {
		why = append(why, fmt.Sprintf("p50 %s µs", benchutil.Fnum(row.P50us)))
	}
	switch {
	case row.P50LowerThanUDS == nil:
		why = append(why, "no UDS row to compare")
	case *row.P50LowerThanUDS < goalLowerThanUDS:
		why = append(why, fmt.Sprintf("only %s× lower than UDS", benchutil.Fnum(*row.P50LowerThanUDS)))
	}
	return name + " (" + strings.Join(why, ", ") + ")"
}

// disturbed names the rows measured while other work took CPU.
func (r *report) disturbed() string {
	var rows []string
	for i := range r.Rows {
		row := &r.Rows[i]
		if !row.Idle && row.Error == "" && otherLoad(row) >= disturbedLoad {
			rows = append(rows, fmt.Sprintf("%s %s ×%d (%s cores)", row.Transport, row.Workload, row.Threads, benchutil.Fnum(otherLoad(row))))
		}
	}
	if len(rows) == 0 {
		return ""
	}
	return fmt.Sprintf("Disturbed rows (other processes or the hypervisor took ≥ %s cores during the window; rerun before trusting them): %s.",
		benchutil.Fnum(disturbedLoad), strings.Join(rows, "; "))
}

// oversubscription explains busy-poll rows in which the spinning client
// goroutines and the server's poller outnumber the CPUs.
func (r *report) oversubscription() string {
	var over []string
	for _, n := range r.threadCounts(transportRingBusyPoll) {
		spinners := min(n, r.Host.GOMAXPROCS) + 1
		if spinners > r.Host.NProc {
			over = append(over, strconv.Itoa(n))
		}
	}
	if len(over) == 0 {
		return ""
	}
	return fmt.Sprintf("With busy polling every client goroutine spins while it waits (on up to GOMAXPROCS=%d threads) and the server's session poller spins too: at %s client %s that is more spinners than the %d CPUs, so those rows measure the OS time-slicing spinners as much as the ring.",
		r.Host.GOMAXPROCS, strings.Join(over, ", "), benchutil.Plural(len(over), "thread"), r.Host.NProc)
}

func (r *report) threadCounts(transport string) []int {
	var ns []int
	for _, row := range r.Rows {
		if row.Transport == transport && !row.Idle && !slices.Contains(ns, row.Threads) {
			ns = append(ns, row.Threads)
		}
	}
	return ns
}

// spinCost states what each transport's waiting costs in CPU for the
// headline configuration, which issue 2 asks to record for adaptive mode.
func (r *report) spinCost(thr int) string {
	var parts []string
	for _, t := range allTransports {
		row := r.find(t, 0, thr)
		if row == nil || row.Error != "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s + %s cores (%s µs/op, p50 %s µs)", t,
			benchutil.Fnum(row.ClientCPUCores), benchutil.Fnum(row.ServerCPUCores),
			benchutil.Fnum(row.ClientCPUusPerOp+row.ServerCPUusPerOp), benchutil.Fnum(row.P50us)))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("**CPU cost of waiting** (%s %d %s, client + server): %s.",
		workloadName(0), thr, benchutil.Plural(thr, "thread"), strings.Join(parts, "; "))
}

// idleCost states what an open session without requests costs.
func (r *report) idleCost() string {
	var parts []string
	for _, row := range r.Rows {
		if row.Idle && row.Error == "" {
			parts = append(parts, fmt.Sprintf("%s %s + %s", row.Transport, benchutil.Fnum(row.ClientCPUCores), benchutil.Fnum(row.ServerCPUCores)))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("**CPU cost of an idle session** (one session open, no requests, client + server cores): %s.", strings.Join(parts, "; "))
}

// otherLoad is CPU the benchmark could not have: other processes' and
// stolen time. Tick sampling can make it slightly negative; that is 0.
func otherLoad(row *Row) float64 { return max(row.OtherCPUCores+row.StealCores, 0) }

// disturbedLoad is the other load above which a row is called disturbed.
const disturbedLoad = 0.25

func (r *report) markdown() string {
	var b strings.Builder
	h := r.Host
	fmt.Fprintf(&b, "# Transport benchmark: ring vs Unix socket vs pipe\n\n")
	fmt.Fprintf(&b, "- Date: %s\n", r.Date)
	fmt.Fprintf(&b, "- Machine: %d CPUs (nproc), %s; %s\n", h.NProc, h.CPUModel, h.Kernel)
	fmt.Fprintf(&b, "- Go: %s, GOMAXPROCS %d (client and server processes)\n", h.GoVersion, h.GOMAXPROCS)
	fmt.Fprintf(&b, "- Command: `%s`\n", r.Command)
	fmt.Fprintf(&b, "- Per configuration: %s ms warm-up, %s ms measured window; one server child process per transport.\n",
		benchutil.Fnum(r.Settings.WarmupMs), benchutil.Fnum(r.Settings.WindowMs))
	fmt.Fprintf(&b, "- Workloads: no-op; echo of %d bytes (client copies in, server copies into its memory and back, client copies out).\n", r.Settings.EchoPayload)
	b.WriteString("- Latency: one client goroutine's round trip. CPU: utime+stime from /proc/<pid>/stat over the window " +
		"(10 ms ticks), as cores busy and µs per op. RSS: VmHWM at the end of the configuration (the client's is for the whole run so far).\n")
	b.WriteString("- Other load: machine-wide busy and stolen CPU (/proc/stat) not used by client or server during the window; " +
		"well above 0 means other work disturbed the row.\n")
	b.WriteString("- ring-*: all client goroutines share one session. uds, uds-blocking, pipe: one connection (pipe pair) per goroutine " +
		"and one server goroutine per connection; uds waits in Go's netpoller, uds-blocking in blocking read/write system calls " +
		"(a thread asleep in the kernel, as a C client and server would).\n\n")

	b.WriteString("| Workload | Threads | Transport | ops/s | p50 µs | p99 µs | p99.9 µs | Client CPU (cores) | Server CPU (cores) | Other load (cores) | CPU µs/op (client + server) | Peak RSS MiB (client / server) | p50 × lower than UDS | ops/s vs UDS |\n")
	b.WriteString("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	var errs []string
	for _, row := range r.Rows {
		if row.Error != "" {
			errs = append(errs, fmt.Sprintf("%s, %s, %d %s: %s", row.Transport, row.Workload, row.Threads,
				benchutil.Plural(row.Threads, "thread"), strings.ReplaceAll(row.Error, "\n", "; ")))
			fmt.Fprintf(&b, "| %s | %d | %s | error [%d] | | | | | | | | | | |\n", row.Workload, row.Threads, row.Transport, len(errs))
			continue
		}
		if row.Idle {
			fmt.Fprintf(&b, "| %s | %d | %s | — | — | — | — | %s | %s | %s | — | %s / %s | — | — |\n",
				row.Workload, row.Threads, row.Transport,
				benchutil.Fnum(row.ClientCPUCores), benchutil.Fnum(row.ServerCPUCores), benchutil.Fnum(otherLoad(&row)),
				benchutil.MiB(row.ClientPeakRSSKiB), benchutil.MiB(row.ServerPeakRSSKiB))
			continue
		}
		lower, ops := "—", "—"
		if row.P50LowerThanUDS != nil {
			lower = benchutil.Fnum(*row.P50LowerThanUDS) + "×"
			ops = benchutil.Fnum(*row.OpsVsUDS) + "×"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s + %s | %s / %s | %s | %s |\n",
			row.Workload, row.Threads, row.Transport, benchutil.Fint(row.OpsPerSec),
			benchutil.Fnum(row.P50us), benchutil.Fnum(row.P99us), benchutil.Fnum(row.P999us),
			benchutil.Fnum(row.ClientCPUCores), benchutil.Fnum(row.ServerCPUCores), benchutil.Fnum(otherLoad(&row)),
			benchutil.Fnum(row.ClientCPUusPerOp), benchutil.Fnum(row.ServerCPUusPerOp),
			benchutil.MiB(row.ClientPeakRSSKiB), benchutil.MiB(row.ServerPeakRSSKiB), lower, ops)
	}
	b.WriteString("\n")
	for i, e := range errs {
		fmt.Fprintf(&b, "[%d] %s\n\n", i+1, e)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "Warning: %s\n\n", w)
	}
	for _, row := range r.Rows {
		if row.Error == "" && uint64(row.Samples) < row.Ops {
			fmt.Fprintf(&b, "Note: %s, %s, %d %s timed the first %d of %d round trips (-max-samples per goroutine); the percentiles are from those.\n\n",
				row.Transport, row.Workload, row.Threads, benchutil.Plural(row.Threads, "thread"), row.Samples, row.Ops)
		}
	}
	b.WriteString(r.Goal.Note + "\n")
	return b.String()
}

// write puts transport.md and transport.json in dir, each by rename so a
// reader never sees half a file.
func (r *report) write(dir, md string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := benchutil.WriteFileAtomic(filepath.Join(dir, "transport.json"), append(js, '\n')); err != nil {
		return err
	}
	return benchutil.WriteFileAtomic(filepath.Join(dir, "transport.md"), []byte(md))
}
