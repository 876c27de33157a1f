package main

import (
	"strings"
	"testing"
)

// TestMedianAndReport: rows are the median run, ratios are weir over
// kernel, and the call table reads the probe's lines.
func TestMedianAndReport(t *testing.T) {
	runs := []FioRow{{IOPS: 30}, {IOPS: 10}, {IOPS: 20}}
	if m := median(runs, func(r FioRow) float64 { return r.IOPS }); m.IOPS != 20 {
		t.Fatalf("median of 30, 10, 20: %v", m.IOPS)
	}
	res := Result{
		Fio: []FioRow{
			{Workload: "4 KiB random read", Target: "kernel", IOPS: 1000},
			{Workload: "4 KiB random read", Target: "weir", IOPS: 1500},
		},
		PG:    []PGRow{{Target: "kernel", TPS: 100}, {Target: "weir", TPS: 90}},
		Calls: []CallRow{{Call: "kernel fstat", BareNs: 200, ShimNs: 230, Overhead: 30}},
	}
	md := report(res)
	for _, want := range []string{"| 4 KiB random read | buffered | 1,000 | 1,500 | 1.50x |", "**0.90x**", "| kernel fstat | 200 | 230 | 30.0 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	lines := splitLines("a b 1.5\n\nc 2\n")
	if len(lines) != 2 || lines[0] != "a b 1.5" || lastSpace(lines[0]) != 3 {
		t.Errorf("probe lines: %q", lines)
	}
}
