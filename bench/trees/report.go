package main

import (
	"fmt"
	"strings"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// report is trees.md.
func report(res *Result) string {
	var b strings.Builder
	f := benchutil.Fnum
	mib := func(kib int64) string { return benchutil.MiB(kib) }
	fmt.Fprintf(&b, "# Source trees on weir through the shim, against the kernel\n\n")
	fmt.Fprintf(&b, "`%s`, %s. Host: %d CPUs, %s, %s.\n\n", res.Command, res.When, res.Host.NProc, res.Host.CPUModel, res.Host.Kernel)
	t := res.Tree
	fmt.Fprintf(&b, "Tree: %s, %s files, %s directories, %s MB, from `%s`. Each repetition runs a row on every target (the order rotating) before the next row; a cell is the median of the runs that succeeded (of %d). CPU: the programs' user + system time (wait4's rusage of the shell, its children included), + the weir services'. Peak RSS: the script's largest process (GNU time's %%M). Ratio: weir's time over the faster kernel target's (above 1: weir is slower).\n\n",
		t.From, benchutil.Fint(float64(t.Files)), benchutil.Fint(float64(t.Dirs)), f(float64(t.Bytes)/1e6), t.Tar, res.Repeat)
	for _, tg := range res.Targets {
		fmt.Fprintf(&b, "- %s: `%s`, %s\n", tg.Name, tg.Dir, tg.FS)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- Note: %s\n", n)
	}
	names := make([]string, len(res.Targets))
	for i, tg := range res.Targets {
		names[i] = tg.Name
	}
	slash := strings.Join(names, " / ")
	fmt.Fprintf(&b, "\n| row | %s s | weir ÷ faster kernel | CPU s %s | peak RSS MiB %s | io fds after (max) | status |\n|---|%s---|---|---|---|---|\n",
		strings.Join(names, " s | "), slash, slash, strings.Repeat("--:|", len(names)))
	byKey := map[string]Row{}
	var order []string
	for _, r := range res.Rows {
		if _, ok := byKey[r.Row]; !ok {
			order = append(order, r.Row)
		}
		byKey[r.Row+"/"+r.Target] = r
		byKey[r.Row] = r
	}
	var failed []Row
	for _, name := range order {
		title := byKey[name].Title
		var cells, cpu, rss []string
		status := "ok"
		var bad []string
		for _, tn := range names {
			r, ok := byKey[name+"/"+tn]
			if !ok {
				cells, cpu, rss = append(cells, "—"), append(cpu, "—"), append(rss, "—")
				continue
			}
			switch {
			case r.OK == 0:
				cells = append(cells, "**FAILED**")
			case r.OK < len(r.Runs):
				cells = append(cells, fmt.Sprintf("%s (%d of %d failed)", f(r.MedianS), len(r.Runs)-r.OK, len(r.Runs)))
			default:
				cells = append(cells, f(r.MedianS))
			}
			c := f(r.CPUS)
			if r.OK == 0 {
				c = "—"
			} else if tn == targetWeir {
				c += " + " + f(r.ServicesCPUS)
			}
			cpu, rss = append(cpu, c), append(rss, mib(r.PeakRSSKiB))
			if r.OK < len(r.Runs) {
				bad = append(bad, fmt.Sprintf("%s failed %d of %d", tn, len(r.Runs)-r.OK, len(r.Runs)))
				failed = append(failed, r)
			}
		}
		if len(bad) > 0 {
			status = "**" + strings.Join(bad, "; ") + "**"
		}
		fds := "—"
		if w, ok := byKey[name+"/"+targetWeir]; ok && w.MaxIOFDs > 0 {
			fds = benchutil.Fint(float64(w.MaxIOFDs))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", cell(title), strings.Join(cells, " | "), ratio(byKey, name),
			strings.Join(cpu, " / "), strings.Join(rss, " / "), fds, status)
	}
	var du []string
	for _, tn := range names {
		if r, ok := byKey["du/"+tn]; ok && r.OK > 0 {
			du = append(du, fmt.Sprintf("%s %s KiB", tn, r.Output))
		}
	}
	if len(du) > 0 {
		fmt.Fprintf(&b, "\n`du -s` of the tree: %s.\n", strings.Join(du, ", "))
	}
	if len(failed) > 0 {
		b.WriteString("\n## Failures\n\nThe first failed run of each row and target, with the first lines its programs wrote to standard error:\n\n")
		for _, r := range failed {
			fmt.Fprintf(&b, "- **%s on %s** (%d of %d runs failed, %d lines of errors in all):\n\n", r.Title, r.Target, len(r.Runs)-r.OK, len(r.Runs), r.ErrLines)
			b.WriteString("  ```\n")
			for _, l := range r.FirstError {
				fmt.Fprintf(&b, "  %s\n", truncate(l, 400))
			}
			b.WriteString("  ```\n")
		}
	}
	b.WriteString("\n## The services\n\nio's and the metadata service's open descriptors (/proc/PID/fd) and VmRSS; io's RssShmem (the memfd pages it has mapped) and what its cache's memfds hold (`cache_memory_bytes` of `weir status --json`).\n\n")
	samples(&b, res.Services)
	if fr := res.Files; fr != nil {
		fmt.Fprintf(&b, "\n## The Go client: one directory of %s files\n\npackage client against package os (in `%s`, the file system of weir's data), in this process: create (O_CREATE|O_EXCL, close), stat each in a shuffled order, readdir (%d entries a call: its latencies are per call, its ops the entries), unlink each in another order. CPU: this process's user + system time per op (+ the weir services').\n\n",
			benchutil.Fint(float64(fr.Files)), fr.Dir, readDirBatch)
		b.WriteString("| op | os p50 / p99 µs | weir p50 / p99 µs | os ops/s | weir ops/s | weir ÷ os time | CPU µs/op os / weir | errors os / weir |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
		ops := map[string]FilesOp{}
		for _, o := range fr.Ops {
			ops[o.Op+"/"+o.Target] = o
		}
		for _, op := range []string{"create", "stat", "readdir", "unlink"} {
			o, w := ops[op+"/os"], ops[op+"/weir"]
			r := "—"
			if w.OpsPS > 0 && o.OpsPS > 0 && w.Errors == 0 && o.Errors == 0 {
				r = f(o.OpsPS/w.OpsPS) + "x"
			}
			fmt.Fprintf(&b, "| %s | %s / %s | %s / %s | %s | %s | %s | %s / %s + %s | %d / %d |\n", op, f(o.P50us), f(o.P99us), f(w.P50us), f(w.P99us),
				benchutil.Fint(o.OpsPS), benchutil.Fint(w.OpsPS), r, f(o.CPUus), f(w.CPUus), f(w.SvcCPU), o.Errors, w.Errors)
		}
		for _, o := range fr.Ops {
			if o.Errors > 0 {
				fmt.Fprintf(&b, "\n%s on %s: %d errors, the first: %s\n", o.Op, o.Target, o.Errors, strings.Join(o.FirstErrors, "; "))
			}
		}
		b.WriteString("\nThe services after each weir phase:\n\n")
		samples(&b, fr.Services)
	}
	if res.Failures > 0 {
		fmt.Fprintf(&b, "\n**%d %s failed.**\n", res.Failures, benchutil.Plural(res.Failures, "row"))
	}
	return b.String()
}

// ratio is weir's median time over the faster kernel target's for a
// row, when every run of weir and of that target succeeded.
func ratio(byKey map[string]Row, row string) string {
	w, ok := byKey[row+"/"+targetWeir]
	if !ok || w.OK < len(w.Runs) || w.MedianS <= 0 {
		return "—"
	}
	best, from := 0.0, ""
	for _, n := range []string{targetKernel, targetExt4} {
		if k, ok := byKey[row+"/"+n]; ok && k.OK == len(k.Runs) && k.MedianS > 0 && (best == 0 || k.MedianS < best) {
			best, from = k.MedianS, n
		}
	}
	if best == 0 {
		return "—"
	}
	return fmt.Sprintf("%sx (%s)", benchutil.Fnum(w.MedianS/best), from)
}

func samples(b *strings.Builder, ss []ServiceSample) {
	b.WriteString("| when | io fds | io RSS MiB | io RssShmem MiB | io cache memfds MiB | metadata fds | metadata RSS MiB |\n|---|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range ss {
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %d | %s |\n", s.When, s.IOFDs, benchutil.MiB(s.IORSSKiB), benchutil.MiB(s.IOShmemKiB),
			benchutil.Fnum(float64(s.CacheMemoryBytes)/(1<<20)), s.MetaFDs, benchutil.MiB(s.MetaRSSKiB))
		if s.Err != "" {
			fmt.Fprintf(b, "| (%s: %s) | | | | | | |\n", s.When, s.Err)
		}
	}
}

// cell escapes the pipes of a table cell's text.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
