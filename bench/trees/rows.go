package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// rowDef is one row of the tree part: a shell script run with bash -o
// pipefail in the repetition's directory {D}, where the tree is {D}/src
// and its copy {D}/copy; {T} is the tar and {G} the string grep looks for.
type rowDef struct {
	name, title, script string
	// check is what the output must be: "" anything, checkFiles the
	// tree's number of files, checkKernel the kernel target's output in
	// the same repetition, checkTree verifyScript's match with the tar.
	check string
	// always: the row runs whatever -rows says (it makes or removes the
	// tree).
	always bool
	// cold: both sides' caches are dropped before each target's run.
	cold bool
	// syncAfter: an untimed sync of the target follows each run, so that
	// no later row or target pays for its writeback.
	syncAfter bool
}

const (
	checkFiles  = "files"
	checkKernel = "kernel"
	checkTree   = "tree"
)

var rows = []rowDef{
	{name: "untar", title: "untar (tar xf)", script: "tar -C {D} -xf {T}", always: true},
	{name: "sync", title: "sync after the untar (sync -f)", script: "sync -f {D}", always: true},
	{name: "find", title: "find . -type f | wc -l", script: "cd {D}/src && find . -type f | wc -l", check: checkFiles},
	{name: "du", title: "du -s", script: "cd {D}/src && du -s . | cut -f1"},
	{name: "grep-warm", title: "grep -r, warm", script: "cd {D}/src && grep -r -F -e {G} . | wc -l", check: checkKernel},
	{name: "grep-cold", title: "grep -r, cold", script: "cd {D}/src && grep -r -F -e {G} . | wc -l", check: checkKernel, cold: true},
	{name: "ls", title: "ls -lR | wc -l", script: "cd {D}/src && ls -lR . | wc -l", check: checkKernel},
	{name: "cp", title: "cp -r to a sibling", script: "cd {D} && cp -r src copy", syncAfter: true},
	{name: "tar", title: "tar c | wc -c", script: "cd {D} && tar -cf - src | wc -c", check: checkKernel},
	{name: "check", title: "check: tree and copy = the tar (sha256sum of each file)", check: checkTree, always: true},
	{name: "rm", title: "rm -rf tree and copy", script: "cd {D} && rm -rf src copy", always: true, syncAfter: true},
}

func rowNames() []string {
	var n []string
	for _, r := range rows {
		n = append(n, r.name)
	}
	return n
}

// Run is one run of a row on a target.
type Run struct {
	Rep       int     `json:"rep"`
	WallS     float64 `json:"wall_s"`
	UserS     float64 `json:"user_s"`
	SysS      float64 `json:"sys_s"`
	MaxRSSKiB int64   `json:"peak_rss_kib"` // the largest process of the script (GNU time's %M; 0 without it)
	Exit      int     `json:"exit"`
	// ErrLines counts the lines the programs wrote to standard error;
	// FirstErrors are the first of them.
	ErrLines    int      `json:"stderr_lines"`
	FirstErrors []string `json:"first_errors,omitempty"`
	Output      string   `json:"output,omitempty"`
	// Err says why the run failed ("" when it did not): a non-zero exit,
	// error output, an output that is not what it must be, a tree
	// that differs from the tar, a service that died.
	Err string `json:"error,omitempty"`
	// For weir: the services' CPU over the run, and io's descriptors and
	// RSS after it.
	ServicesCPUS float64 `json:"services_cpu_s,omitempty"`
	IOFDs        int     `json:"io_fds,omitempty"`
	IORSSKiB     int64   `json:"io_rss_kib,omitempty"`
}

// Row is a row on one target: its runs, and the median of those that
// succeeded.
type Row struct {
	Row    string `json:"row"`
	Title  string `json:"title"`
	Target string `json:"target"`
	Runs   []Run  `json:"runs"`
	OK     int    `json:"ok_runs"`
	// Of the median successful run:
	MedianS      float64 `json:"median_s"`
	CPUS         float64 `json:"cpu_s"`
	ServicesCPUS float64 `json:"services_cpu_s,omitempty"`
	Output       string  `json:"output,omitempty"`
	// Over every run:
	PeakRSSKiB int64    `json:"peak_rss_kib"`
	MaxIOFDs   int      `json:"max_io_fds,omitempty"`
	ErrLines   int      `json:"stderr_lines"`
	FirstError []string `json:"first_error,omitempty"` // the first failed run's reason and first error lines
}

// runner runs the tree part.
type runner struct {
	w       *weirStack
	tree    *tree
	targets []*target
	res     *Result
}

// trees runs every picked row on every target, -repeat times, rotating
// the order of the targets each repetition, and adds the rows to res.
func (r *runner) trees() error {
	runs := map[string]map[string][]Run{}
	coldNoted := false
	for rep := range *repeat {
		order := append(append([]*target(nil), r.targets[rep%len(r.targets):]...), r.targets[:rep%len(r.targets)]...)
		broken := map[string]string{} // target -> why its tree is not whole in this repetition
		for _, t := range order {
			if out, run := r.shell(t, "mkdir -p {D}", rep); run.Err != "" {
				return fmt.Errorf("%s: mkdir %s: %s %s %s", t.info.Name, r.repDir(t, rep), run.Err, run.FirstErrors, out)
			}
		}
		for _, row := range rows {
			if !row.always && !picked(row.name) {
				continue
			}
			got := map[string]*Run{}
			for _, t := range order {
				if row.cold && os.Geteuid() != 0 && !coldNoted {
					r.res.Notes = append(r.res.Notes, "grep -r, cold: the kernel's caches were not dropped (writing /proc/sys/vm/drop_caches needs root): the kernel targets' runs and weir's blob files were warm")
					coldNoted = true
				}
				run := r.runRow(row, t, rep)
				if why := broken[t.info.Name]; why != "" && run.Err == "" && row.name != "rm" {
					run.Err = why
				}
				if row.name == "untar" && run.Err != "" {
					broken[t.info.Name] = "on an incomplete tree: this repetition's untar failed"
				}
				got[t.info.Name] = &run
				fmt.Fprintf(os.Stderr, "trees: rep %d %-10s %-7s %8.3f s  cpu %6.2f s  %s\n", rep+1, row.name, t.info.Name, run.WallS, run.UserS+run.SysS, status(run))
			}
			r.checkOutputs(row, got)
			if runs[row.name] == nil {
				runs[row.name] = map[string][]Run{}
			}
			for name, run := range got {
				runs[row.name][name] = append(runs[row.name][name], *run)
			}
		}
		for _, t := range order {
			r.shell(t, "rmdir {D}", rep) // (where a failed rm left the tree, it stays until the run's end)
		}
	}
	for _, row := range rows {
		for _, t := range r.targets {
			if rs := runs[row.name][t.info.Name]; len(rs) > 0 {
				r.res.Rows = append(r.res.Rows, summarize(row, t.info.Name, rs))
			}
		}
	}
	return nil
}

func status(run Run) string {
	if run.Err != "" {
		return "FAILED: " + strings.ReplaceAll(run.Err, "\n", "; ")
	}
	return "ok " + run.Output
}

func (r *runner) repDir(t *target, rep int) string {
	return path.Join(t.root, fmt.Sprintf("rep%d", rep+1))
}

// script fills in a row's script for target t.
func (r *runner) script(s string, t *target, rep int) string {
	return strings.NewReplacer("{D}", quote(r.repDir(t, rep)), "{T}", quote(r.tree.info.Tar), "{G}", quote(*grepFor)).Replace(s)
}

// shell runs script on t (through the shim on weir), untimed.
func (r *runner) shell(t *target, script string, rep int) ([]byte, Run) {
	var env []string
	if t.shim {
		env = r.w.env()
	}
	return shell(env, r.script(script, t, rep))
}

// runRow runs row once on t.
func (r *runner) runRow(row rowDef, t *target, rep int) Run {
	var pre []string
	if row.cold {
		syscall.Sync()
		if err := r.w.dropCaches(); err != nil {
			pre = append(pre, err.Error())
		}
		if os.Geteuid() == 0 {
			if err := dropKernelCaches(); err != nil {
				pre = append(pre, "drop the kernel's caches: "+err.Error())
			}
		}
	}
	script := row.script
	if row.check == checkTree {
		script = verifyScript("{D}/src")
		if picked("cp") {
			script += " && printf '\\0#\\0' && " + verifyScript("{D}/copy")
		}
	}
	cpu0 := r.w.cpu()
	out, run := r.shell(t, script, rep)
	run.Rep = rep + 1
	if t.shim {
		run.ServicesCPUS = (r.w.cpu() - cpu0).Seconds()
	}
	if row.check == checkTree {
		run.Output = ""
		src, cp, _ := bytes.Cut(out, []byte("\x00#\x00"))
		var diffs []string
		for _, d := range r.tree.diffTree(src) {
			diffs = append(diffs, "tree: "+d)
		}
		if picked("cp") {
			for _, d := range r.tree.diffTree(cp) {
				diffs = append(diffs, "copy: "+d)
			}
		}
		if len(diffs) > 0 {
			run.Err = join(run.Err, "DIFFERS FROM THE TAR: "+strings.Join(diffs, "; "))
			fmt.Fprintf(os.Stderr, "trees: %s, repetition %d: the tree DIFFERS from the tar:\n  %s\n", t.info.Name, rep+1, strings.Join(diffs, "\n  "))
		} else {
			run.Output = fmt.Sprintf("%d files, %d directories: identical", r.tree.info.Files, r.tree.info.Dirs)
		}
	}
	if len(pre) > 0 {
		run.Err = join(strings.Join(pre, "; "), run.Err)
	}
	if row.syncAfter {
		if _, s := r.shell(t, "sync -f {D}", rep); s.Err != "" {
			run.Err = join(run.Err, "the sync after it: "+s.Err)
		}
	}
	if t.shim {
		if r.w.ensure(fmt.Sprintf("%s, repetition %d", row.name, rep+1)) {
			run.Err = join(run.Err, "a service died (the stack was started again)")
		}
		pid := r.w.Sup.PIDs()["io"]
		run.IOFDs, _ = countFDs(pid)
		run.IORSSKiB, _, _ = benchutil.ProcMem(pid)
	}
	return run
}

// checkOutputs fails the runs of row whose output is not what it must
// be: the tree's file count, or the kernel target's output (ext4's when
// the kernel target did not run or failed).
func (r *runner) checkOutputs(row rowDef, got map[string]*Run) {
	var want, from string
	switch row.check {
	case checkFiles:
		want, from = fmt.Sprint(r.tree.info.Files), "the tar's file count"
	case checkKernel:
		for _, n := range []string{targetKernel, targetExt4} {
			if k := got[n]; k != nil && k.Err == "" {
				want, from = k.Output, "the "+n+" target's"
				break
			}
		}
	}
	if from == "" {
		return
	}
	for name, run := range got {
		if run.Err == "" && run.Output != want {
			run.Err = fmt.Sprintf("output %q, not %s %q", run.Output, from, want)
			fmt.Fprintf(os.Stderr, "trees: %s %s: %s\n", row.name, name, run.Err)
		}
	}
}

func join(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "; " + b
}

// timeTool is GNU time, which measures a script's peak RSS. wait4's
// ru_maxrss of a process this one starts is no use: Go starts it with
// vfork, and exec records the high-water mark of the memory it leaves,
// this process's; GNU time forks the shell the ordinary way.
var timeTool, _ = exec.LookPath("time")

// shell runs script with bash -o pipefail in a process group of its
// own, with env added to this process's environment, and times it (under
// GNU time, when installed, for the peak RSS). A run fails on a non-zero
// exit, any error output, or -timeout.
func shell(env []string, script string) ([]byte, Run) {
	args := []string{"bash", "-o", "pipefail", "-c", script}
	var rssFile string
	if timeTool != "" {
		f, err := os.CreateTemp("", "trees-rss-")
		if err != nil {
			return nil, Run{Err: err.Error(), Exit: -1}
		}
		rssFile = f.Name()
		f.Close()
		defer os.Remove(rssFile)
		args = append([]string{timeTool, "-f", "%M", "-o", rssFile}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(append(os.Environ(), "LC_ALL=C"), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, Run{Err: err.Error(), Exit: -1}
	}
	var timedOut atomic.Bool
	timer := time.AfterFunc(*timeout, func() {
		timedOut.Store(true)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})
	err := cmd.Wait()
	run := Run{WallS: time.Since(start).Seconds()}
	timer.Stop()
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		run.UserS = time.Duration(ru.Utime.Nano()).Seconds()
		run.SysS = time.Duration(ru.Stime.Nano()).Seconds()
	}
	if rssFile != "" {
		// (the last line: a killed shell's "Command terminated by signal" comes first)
		b, _ := os.ReadFile(rssFile)
		ls := strings.Fields(string(b))
		if len(ls) > 0 {
			run.MaxRSSKiB, _ = strconv.ParseInt(ls[len(ls)-1], 10, 64)
		}
	}
	run.Exit = cmd.ProcessState.ExitCode()
	if len(stdout.Bytes()) < 200 {
		run.Output = strings.TrimSpace(stdout.String())
	}
	lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
	if stderr.Len() > 0 {
		run.ErrLines = len(lines)
		run.FirstErrors = lines[:min(len(lines), 5)]
	}
	switch {
	case timedOut.Load():
		run.Err = fmt.Sprintf("killed after %v (-timeout)", *timeout)
	case err != nil:
		run.Err = err.Error()
	}
	if run.ErrLines > 0 {
		run.Err = join(run.Err, fmt.Sprintf("%d %s of errors", run.ErrLines, benchutil.Plural(run.ErrLines, "line")))
	}
	return stdout.Bytes(), run
}

// summarize is a row on one target: the median of its successful runs by
// wall time.
func summarize(def rowDef, target string, runs []Run) Row {
	row := Row{Row: def.name, Title: def.title, Target: target, Runs: runs}
	var ok []Run
	for _, run := range runs {
		row.PeakRSSKiB = max(row.PeakRSSKiB, run.MaxRSSKiB)
		row.MaxIOFDs = max(row.MaxIOFDs, run.IOFDs)
		row.ErrLines += run.ErrLines
		if run.Err == "" {
			ok = append(ok, run)
		} else if row.FirstError == nil {
			row.FirstError = append([]string{fmt.Sprintf("repetition %d: %s", run.Rep, run.Err)}, run.FirstErrors...)
		}
	}
	row.OK = len(ok)
	if len(ok) > 0 {
		sort.Slice(ok, func(i, j int) bool { return ok[i].WallS < ok[j].WallS })
		m := ok[len(ok)/2]
		row.MedianS, row.CPUS, row.ServicesCPUS, row.Output = m.WallS, m.UserS+m.SysS, m.ServicesCPUS, m.Output
	}
	return row
}

// failures counts the rows (per target) with a failed run, and the
// client part's failed operations.
func failures(res *Result) int {
	n := 0
	for _, r := range res.Rows {
		if r.OK < len(r.Runs) {
			n++
		}
	}
	if res.Files != nil {
		for _, r := range res.Files.Ops {
			if r.Errors > 0 {
				n++
			}
		}
	}
	return n
}
