package main

import (
	"fmt"
	"strings"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// report is shim.md.
func report(res Result) string {
	var b strings.Builder
	f := benchutil.Fnum
	fmt.Fprintf(&b, "# Unmodified programs on weir: the LD_PRELOAD shim against the kernel\n\n")
	fmt.Fprintf(&b, "`%s`, %s. Host: %d CPUs, %s, %s. Disk: %s.\n\n", res.Command, res.When, res.Host.NProc, res.Host.CPUModel, res.Host.Kernel, res.FS)
	fmt.Fprintf(&b, "## fio, psync, queue depth 1\n\nMedian run of %d per target, alternating; ratio = weir / kernel IOPS (above 1: weir is faster). ZVFS reports 1.18x (4 KiB random read) and 1.32x (4 KiB random write).\n\n", *repeat)
	b.WriteString("| workload | mode | kernel IOPS | weir IOPS | ratio | kernel p50 / p99 µs | weir p50 / p99 µs | fio CPU usr+sys % kernel / weir | weir services CPU µs/op |\n|---|---|---|---|---|---|---|---|---|\n")
	for i := 0; i+1 < len(res.Fio); i += 2 {
		k, w := res.Fio[i], res.Fio[i+1]
		mode := "buffered"
		if k.Direct {
			mode = "O_DIRECT"
		}
		ratio := 0.0
		if k.IOPS > 0 {
			ratio = w.IOPS / k.IOPS
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %sx | %s / %s | %s / %s | %s / %s | %s |\n", k.Workload, mode, benchutil.Fint(k.IOPS), benchutil.Fint(w.IOPS), f(ratio),
			f(k.P50us), f(k.P99us), f(w.P50us), f(w.P99us), f(k.UsrPct+k.SysPct), f(w.UsrPct+w.SysPct), f(w.ServiceCPUusPerOp))
	}
	b.WriteString("\n## pgbench\n\n")
	if len(res.PG) == 2 {
		k, w := res.PG[0], res.PG[1]
		fmt.Fprintf(&b, "%s. ZVFS reports 38.2 TPS against the kernel's 39.1 (0.98x). WAL syncs and their mean time are the server's own count (pg_stat_wal, track_wal_io_timing on) in the median run.\n\n| target | TPS (median) | runs | latency avg ms | WAL syncs per transaction | WAL sync avg µs | WAL write avg µs |\n|---|---|---|---|---|---|---|\n", res.PGNote)
		for _, r := range res.PG {
			fmt.Fprintf(&b, "| %s | %s | %v | %s | %s | %s | %s |\n", r.Target, f(r.TPS), r.Runs, f(r.LatMs), f(r.SyncsPerTxn), f(r.SyncUs), f(r.WriteUs))
		}
		if k.TPS > 0 {
			fmt.Fprintf(&b, "\nRatio weir / kernel: **%sx**.\n", f(w.TPS/k.TPS))
		}
	} else {
		fmt.Fprintf(&b, "%s\n", res.PGNote)
	}
	b.WriteString("\n## One call through the shim\n\nBest of three runs of bench/shim/probe/calls.c; \"overhead\" is what loading the shim adds to a call it passes to the kernel.\n\n| call | without the shim ns | with the shim ns | overhead ns |\n|---|---|---|---|\n")
	for _, c := range res.Calls {
		bare, over := "", ""
		if c.BareNs > 0 {
			bare, over = f(c.BareNs), f(c.Overhead)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Call, bare, f(c.ShimNs), over)
	}
	b.WriteString("\nServices' RSS at the end (MiB):")
	for _, n := range []string{"metadata", "io", "journal", "verifier", "nats"} {
		if v, ok := res.Mem[n]; ok {
			fmt.Fprintf(&b, " %s %s;", n, f(v))
		}
	}
	b.WriteString("\n")
	return b.String()
}
