// Command fsync measures weir's fsync (issue 10) side by side with the
// file system's, on one disk, in one run:
//
//   - weir through the client: 4 KiB append + fsync, 4 KiB random
//     overwrite + fsync, 64 KiB append + fsync, by 1, 4 and 8 client
//     processes (each on a file of its own), against the services as
//     processes on the file backend, with the staging log (Split
//     Journaling) and, as the ablations, without it (staging_size 0: fsync
//     syncs the file, the store and the metadata WAL in the foreground)
//     and without background journaling (journal.foreground: fsync waits
//     for the journal service's checkpoint of its record);
//   - the file system's write + fdatasync, appending and overwriting, by
//     as many writers (goroutines, a file each);
//   - the staging log alone (its append + flush, no client, no service);
//   - the disk's ceiling for the writers' durable 4 KiB writes: each
//     writer overwrites its own region of one written, preallocated file
//     and runs its own fdatasync, all concurrently (no journal commit, no
//     group commit: what the file system lets overlap).
//
// It runs on the file system of -dir ("root") and, as root with the tools
// installed, on a journaled ext4 and an XFS it makes on loop devices over
// image files in -dir (the same disk): what a storage host would run. Each
// row reports p50/p99, ops/s, the device's flush requests per op
// (/proc/diskstats), write amplification (device bytes written per byte
// acknowledged, after the row settles: a checkpoint's or a journal's
// later writes count) and, for weir, the services' CPU per op and the
// journal service's share of it.
//
// Usage:
//
//	go run ./bench/fsync [-dir PARENT] [-ops 2000] [-writers 1,4,8] [-fs root,ext4,xfs] [-out bench/results]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/bench/internal/benchutil"
	"github.com/weir-storage/weir/internal/staging"
)

// Row is one workload with one writer count on one file system.
type Row struct {
	FS            string  `json:"fs"`
	NA            string  `json:"na,omitempty"`
	Workload      string  `json:"workload"`
	Writers       int     `json:"writers"`
	Ops           int     `json:"ops"`
	OpsPerSec     float64 `json:"ops_per_sec"`
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	FlushesPerOp  float64 `json:"flushes_per_op"`
	LogFlushPerOp float64 `json:"log_flushes_per_op,omitempty"` // staging: the log's own count
	// WriteAmplification is device bytes written per byte acknowledged,
	// counted until the row settled (a checkpoint's later writes count).
	WriteAmplification float64 `json:"write_amplification"`
	Mode               string  `json:"mode,omitempty"`                  // weir rows: staging or the ablation
	ServiceCPUusPerOp  float64 `json:"service_cpu_us_per_op,omitempty"` // weir rows: metadata + io + journal CPU
	JournalCPUusPerOp  float64 `json:"journal_cpu_us_per_op,omitempty"` // weir rows: the journal service's share
	MachineBusyPct     float64 `json:"machine_busy_pct"`                // every CPU's busy time (kernel's I/O threads included) over the ops' time, % of all CPUs
	// CaughtSpinningPct, weir rows: the fsyncs whose completion the
	// client's hybrid wait caught spinning after its timed sleep (no
	// wake-up of its thread), in % of the fsyncs that slept.
	CaughtSpinningPct float64 `json:"caught_spinning_pct,omitempty"`
}

// settle waits for what a row left in flight (a checkpoint, the file
// system's journal) and makes the kernel write everything back, so that
// the bytes a row caused are counted in it.
func settle() {
	time.Sleep(1500 * time.Millisecond)
	unix.Sync()
}

const (
	wlStaging   = "staging log append (4 KiB record) + flush"
	wlAppend    = "file system: 4 KiB append + fdatasync"
	wlOverwrite = "file system: 4 KiB overwrite + fdatasync"
	wlCeiling   = "disk ceiling: 4 KiB overwrite + fdatasync, one shared written file"
)

func main() {
	dir := flag.String("dir", "", "parent directory of the files (default: the system temporary directory); it decides the disk measured")
	ops := flag.Int("ops", 2000, "ops per row (all writers together)")
	writersFlag := flag.String("writers", "1,4,8", "writer counts, comma-separated")
	fsFlag := flag.String("fs", "root,ext4,xfs", "file systems: root (that of -dir), ext4 and xfs (made on loop devices; root only)")
	out := flag.String("out", "bench/results", "directory for fsync.md and fsync.json")
	only := flag.String("only", "", `run only the rows whose "workload / mode" contains one of these |-separated texts (default: every row)`)
	flag.Parse()
	if *workerMD != "" {
		if err := worker(); err != nil {
			log.Fatalf("worker: %v", err)
		}
		return
	}
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
	exe := *weirExe
	if exe == "" {
		if exe, err = benchutil.BuildWeir(parent); err != nil {
			log.Fatal(err)
		}
	}
	var rows []Row
	var fsNotes []string
	for _, fs := range strings.Split(*fsFlag, ",") {
		fs = strings.TrimSpace(fs)
		dir, describe, cleanup, err := mountFS(parent, fs)
		if err != nil {
			log.Printf("%s: n/a: %v", fs, err)
			rows = append(rows, Row{FS: fs, NA: err.Error()})
			continue
		}
		fsNotes = append(fsNotes, fmt.Sprintf("%s: %s", fs, describe))
		for _, w := range writers {
			for _, wl := range []string{wlWeirAppend, wlAppend, wlWeirOverwrite, wlOverwrite, wlWeirAppend64, wlStaging, wlCeiling} {
				modes := []string{""}
				if strings.HasPrefix(wl, "weir") {
					modes = []string{modeStaging, modeNoStaging, modeNoBackground}
					if w == 1 && wl == wlWeirAppend {
						modes = append(modes, modePollClient)
					}
				}
				for _, mode := range modes {
					if !picked(*only, wl+" / "+mode) {
						continue
					}
					var row Row
					var err error
					if mode != "" {
						row, err = runWeir(exe, dir, mode, wl, w, *ops)
					} else {
						row, err = run(dir, wl, w, *ops)
					}
					if err != nil {
						cleanup()
						log.Fatalf("%s: %s %s, %d writers: %v", fs, wl, mode, w, err)
					}
					row.FS = fs
					log.Printf("%-5s %-40s %-14.14s %d writers: p50 %7.1f µs  p99 %7.1f µs  %6.0f ops/s  %.2f flushes/op  WA %.2f",
						fs, wl, mode, w, row.P50us, row.P99us, row.OpsPerSec, row.FlushesPerOp, row.WriteAmplification)
					rows = append(rows, row)
				}
			}
		}
		// What a new name costs: one writer, the staging mode.
		for _, wl := range []string{wlWeirCreate, wlWeirDirSync} {
			if !picked(*only, wl) {
				continue
			}
			row, err := runWeir(exe, dir, modeStaging, wl, 1, min(*ops, 500))
			if err != nil {
				cleanup()
				log.Fatalf("%s: %s: %v", fs, wl, err)
			}
			row.FS = fs
			log.Printf("%-5s %-40s %d writer: p50 %7.1f µs  %.2f flushes/op", fs, wl, 1, row.P50us, row.FlushesPerOp)
			rows = append(rows, row)
		}
		cleanup()
	}
	md, err := report(parent, *ops, rows, fsNotes)
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
	case wlCeiling:
		f, err := os.OpenFile(filepath.Join(dir, "shared"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return Row{}, err
		}
		closers = append(closers, func() { f.Close() })
		const region = 2 << 20 // 512 pages a writer
		if _, err := f.Write(make([]byte, w*region)); err != nil {
			return Row{}, err
		}
		if err := f.Sync(); err != nil {
			return Row{}, err
		}
		op = func(writer int, rng *rand.Rand) error {
			_, err := f.WriteAt(page, int64(writer)*region+int64(rng.IntN(region/4096))*4096)
			if err == nil {
				err = unix.Fdatasync(int(f.Fd()))
			}
			return err
		}
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
	before0, _, err := benchutil.Disk(dir)
	if err != nil {
		return Row{}, err
	}
	before := before0.Flushes
	var logBefore uint64
	if logFlushes != nil {
		logBefore = logFlushes()
	}
	hists := make([]benchutil.Histogram, w)
	errs := make(chan error, w)
	cpu0, _ := benchutil.ReadMachineCPU()
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
	cpu1, _ := benchutil.ReadMachineCPU()
	close(errs)
	for err := range errs {
		return Row{}, err
	}
	after, _, err := benchutil.DiskFlushes(dir)
	if err != nil {
		return Row{}, err
	}
	settle()
	written, _, err := benchutil.Disk(dir)
	if err != nil {
		return Row{}, err
	}
	var all benchutil.Histogram
	for i := range hists {
		all.Merge(&hists[i])
	}
	n := int(all.Count())
	row := Row{Workload: wl, Writers: w, Ops: n, OpsPerSec: float64(n) / elapsed.Seconds(),
		P50us: all.QuantileUs(0.5), P99us: all.QuantileUs(0.99), FlushesPerOp: float64(after-before) / float64(n),
		WriteAmplification: float64(written.BytesWritten-before0.BytesWritten) / float64(n*4096),
		MachineBusyPct:     machineBusy(cpu0, cpu1, elapsed)}
	if logFlushes != nil {
		row.LogFlushPerOp = float64(logFlushes()-logBefore) / float64(n)
	}
	return row, nil
}

// machineBusy is the machines' CPUs' busy share between two samples, in
// percent of all CPUs over elapsed.
func machineBusy(a, b benchutil.MachineCPU, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return 100 * float64(b.Busy-a.Busy) / (float64(elapsed) * float64(runtime.NumCPU()))
}

// fileDevice is a staging log on a file: flushes are fdatasync (the ring
// is preallocated with written blocks, so no flush commits file metadata).
type fileDevice struct{ *os.File }

func (d fileDevice) Sync() error { return unix.Fdatasync(int(d.Fd())) }

func report(parent string, ops int, rows []Row, fsNotes []string) (string, error) {
	var b strings.Builder
	host, _ := benchutil.HostInfo()
	fmt.Fprintf(&b, "# fsync: weir (staging log, and its ablations) against the file system's fdatasync\n\n")
	fmt.Fprintf(&b, "- Date: %s\n- Machine: %d CPUs, %s; %s\n- Directory: %s\n",
		time.Now().UTC().Format(time.RFC3339), host.NProc, host.CPUModel, host.Kernel, parent)
	for _, n := range fsNotes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString("- Flushes: the flush requests the file system's block device completed (/proc/diskstats) during the ops; other activity on that device counts too. Write amplification: bytes the device wrote per byte acknowledged, counted until 1.5 s after the row and a sync (a checkpoint's or a journal's later writes count).\n")
	fmt.Fprintf(&b, "- %d ops per row, shared by the writers. weir: client processes, a file each, services as processes on the file backend with their data directory on the file system of the row; CPU is the metadata, IO and journal processes' per op, the journal's share apart. File system: goroutines, a file each. Overwrites at random 4 KiB offsets of an 8 MiB written file. Staging log alone: a 32 MiB log of a file, trimmed whole when full.\n", ops)
	b.WriteString("- Ablations: **no staging** (io.staging_size 0), fsync as before Split Journaling: the file's blob, the store, then the metadata WAL through a NATS round trip; **no background journaling** (journal.foreground), fsync stages its record, then waits until the journal service has checkpointed it (home sync, metadata WAL commit, trim).\n\n")
	b.WriteString("- Polling client (one row per file system): the staging mode with the writer's rings in busy-poll mode (`client.Options.Mode = ring.WaitBusyPoll`): it spins through the fsync instead of sleeping, which saves the wake-up of its thread and costs a CPU while it waits.\n")
	b.WriteString("- Caught spinning: weir's default client waits for an fsync hybrid (ring.Call.Long): asleep for most of the median time fsyncs take, then spinning; the share of the fsyncs whose completion it caught spinning, without a wake-up of its thread (a polling client spins throughout: —). With many fsyncs in flight io tells its clients not to spin (ring.HintNoSpin, docs/ring-abi.md): 0 there.\n")
	b.WriteString("- Machine CPU: every CPU's busy time (user, system, irq: clients, services, the kernel's I/O threads) over the row's ops, in % of all CPUs: near 100 the row is CPU-bound.\n\n")
	b.WriteString("| File system | Workload | mode | writers | ops | ops/s | p50 µs | p99 µs | device flushes / op | write ampl. | services CPU µs / op | journal CPU µs / op | machine CPU % | caught spinning % |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		if r.NA != "" {
			fmt.Fprintf(&b, "| %s | n/a: %s | | | | | | | | | | | | |\n", r.FS, r.NA)
			continue
		}
		mode, cpu, jcpu, caught := "", "—", "—", "—"
		if r.Mode != "" && r.Mode != modePollClient {
			caught = fmt.Sprintf("%.0f", r.CaughtSpinningPct)
		}
		if r.Mode != "" {
			mode = map[string]string{modeStaging: "staging", modeNoStaging: "no staging", modeNoBackground: "no background journaling", modePollClient: "staging, polling client"}[r.Mode]
			cpu = benchutil.Fnum(r.ServiceCPUusPerOp)
			if r.Mode != modeNoStaging {
				jcpu = benchutil.Fnum(r.JournalCPUusPerOp)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %s |\n", r.FS, r.Workload, mode, r.Writers, benchutil.Fint(float64(r.Ops)),
			benchutil.Fint(r.OpsPerSec), benchutil.Fnum(r.P50us), benchutil.Fnum(r.P99us), benchutil.Fnum(r.FlushesPerOp), benchutil.Fnum(r.WriteAmplification), cpu, jcpu, r.MachineBusyPct, caught)
	}
	b.WriteString("\n## weir with the staging log against the file system, same file system, same writers\n\n")
	b.WriteString("The last two columns bound the append goal from above on this disk: the staging log alone (no client, no service) and the disk ceiling row (each writer's own overwrite + fdatasync of one written file, all overlapping), each over the file system's append ops/s with as many writers.\n\n")
	b.WriteString("| File system | writers | append p50: fs / weir | append ops/s: weir / fs | overwrite p50: fs / weir | overwrite ops/s: weir / fs | staging log alone ops/s / fs append | disk ceiling ops/s / fs append |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	find := func(fs, wl, mode string, w int) *Row {
		for i := range rows {
			if r := &rows[i]; r.FS == fs && r.Workload == wl && r.Mode == mode && r.Writers == w && r.NA == "" {
				return r
			}
		}
		return nil
	}
	for _, r := range rows {
		if r.Workload != wlWeirAppend || r.Mode != modeStaging {
			continue
		}
		fa, fo, wo := find(r.FS, wlAppend, "", r.Writers), find(r.FS, wlOverwrite, "", r.Writers), find(r.FS, wlWeirOverwrite, modeStaging, r.Writers)
		if fa == nil || fo == nil || wo == nil {
			continue
		}
		bound := func(wl string) string {
			if x := find(r.FS, wl, "", r.Writers); x != nil {
				return benchutil.Fnum(x.OpsPerSec/fa.OpsPerSec) + "×"
			}
			return "—"
		}
		fmt.Fprintf(&b, "| %s | %d | %s× | %s× | %s× | %s× | %s | %s |\n", r.FS, r.Writers, benchutil.Fnum(fa.P50us/r.P50us), benchutil.Fnum(r.OpsPerSec/fa.OpsPerSec),
			benchutil.Fnum(fo.P50us/wo.P50us), benchutil.Fnum(wo.OpsPerSec/fo.OpsPerSec), bound(wlStaging), bound(wlCeiling))
	}
	b.WriteString("\n")
	return b.String(), nil
}

// mountFS returns a directory on file system fs for the rows, a line that
// describes it, and what undoes its set-up. root is parent's own; ext4
// (journaled, data=ordered) and xfs are made on a loop device over a
// 2 GiB image file in parent, which needs root, mkfs.ext4 or mkfs.xfs
// (xfsprogs) and losetup.
func mountFS(parent, fs string) (string, string, func(), error) {
	nothing := func() {}
	if fs == "root" {
		d, err := benchutil.DescribeFS(parent)
		if err != nil {
			return "", "", nothing, err
		}
		_, dev, err := benchutil.DiskFlushes(parent)
		if err != nil {
			return "", "", nothing, err
		}
		return parent, fmt.Sprintf("%s; device %s", d, dev), nothing, nil
	}
	mkfs := map[string][]string{"ext4": {"mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"}, "xfs": {"mkfs.xfs", "-q", "-f"}}[fs]
	if mkfs == nil {
		return "", "", nothing, fmt.Errorf("unknown file system %q (root, ext4, xfs)", fs)
	}
	if os.Geteuid() != 0 {
		return "", "", nothing, fmt.Errorf("making a %s on a loop device needs root", fs)
	}
	for _, tool := range []string{mkfs[0], "losetup", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", "", nothing, fmt.Errorf("%s not found (Debian: %s)", tool, map[string]string{"mkfs.xfs": "xfsprogs", "mkfs.ext4": "e2fsprogs"}[tool])
		}
	}
	img := filepath.Join(parent, fs+".img")
	mnt := filepath.Join(parent, fs+".mnt")
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	fail := func(err error) (string, string, func(), error) {
		cleanup()
		return "", "", nothing, err
	}
	f, err := os.Create(img)
	if err != nil {
		return fail(err)
	}
	err = f.Truncate(2 << 30)
	f.Close()
	undo = append(undo, func() { os.Remove(img) })
	if err != nil {
		return fail(err)
	}
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], img)...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("%s: %v: %s", mkfs[0], err, out))
	}
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).Output()
	if err != nil {
		return fail(fmt.Errorf("losetup: %w", err))
	}
	loop := strings.TrimSpace(string(out))
	undo = append(undo, func() { _ = exec.Command("losetup", "-d", loop).Run() })
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return fail(err)
	}
	undo = append(undo, func() { os.Remove(mnt) })
	if out, err := exec.Command("mount", loop, mnt).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mount %s: %v: %s", loop, err, out))
	}
	undo = append(undo, func() { _ = exec.Command("umount", mnt).Run() })
	d, err := benchutil.DescribeFS(mnt)
	if err != nil {
		return fail(err)
	}
	return mnt, fmt.Sprintf("%s, made by `%s` on %s (direct I/O) over a 2 GiB image file in the directory", d, strings.Join(mkfs, " "), loop), cleanup, nil
}

// picked says whether row is one -only asks for: it contains one of the
// |-separated texts of only, or only is empty.
func picked(only, row string) bool {
	if only == "" {
		return true
	}
	for _, t := range strings.Split(only, "|") {
		if strings.Contains(row, t) {
			return true
		}
	}
	return false
}
