package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/ring"
)

// The weir rows: the services run as processes of the weir binary
// (stack.Supervisor, as `weir up` runs them) on the file backend, with
// their data directory on the file system measured; each writer is a
// client process (this program re-executed with -worker), on a file of
// its own, queue depth 1.

// Weir workloads, and the modes the services run in.
const (
	wlWeirAppend    = "weir: 4 KiB append + fsync"
	wlWeirOverwrite = "weir: 4 KiB random overwrite + fsync"
	wlWeirAppend64  = "weir: 64 KiB append + fsync"
	wlWeirCreate    = "weir: create + 4 KiB write + fsync (a new file)"
	wlWeirDirSync   = "weir: create + directory fsync"

	modeStaging      = "staging log (Split Journaling)"
	modeNoStaging    = "ablation: no staging (fsync syncs file, store and metadata WAL in the foreground)"
	modeNoBackground = "ablation: no background journaling (fsync waits for the journal service's checkpoint of its record)"
	modePollClient   = "staging log, clients busy-poll (ring.WaitBusyPoll: a CPU per writer, no wake-up)"
)

var (
	workerMD   = flag.String("worker-md", "", "internal: run as a client worker on this metadata socket")
	workerIO   = flag.String("worker-io", "", "internal: the worker's IO socket")
	workerFile = flag.String("worker-file", "", "internal: the worker's file")
	workerWL   = flag.String("worker-wl", "", "internal: the worker's workload")
	workerOps  = flag.Int("worker-ops", 0, "internal: the worker's op count")
	workerPoll = flag.Bool("worker-poll", false, "internal: the worker's rings busy-poll")
	weirExe    = flag.String("weir", "", "weir binary for the services (default: built from this module)")
)

// payload is a workload's bytes per op.
func payload(wl string) int {
	if wl == wlWeirAppend64 {
		return 64 << 10
	}
	return 4 << 10
}

// workerOut is what a worker prints: its ops' latencies (ns) and how its
// data ring's calls waited.
type workerOut struct {
	Lat   []int64          `json:"lat"`
	Waits client.WaitStats `json:"waits"`
}

// worker runs in a client process: it opens its file (an overwrite's is
// written in full and fsynced first), says "ready", waits for a line on
// stdin, runs its ops and prints their latencies (ns) as JSON.
func worker() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mode := ring.WaitAdaptive
	if *workerPoll {
		mode = ring.WaitBusyPoll
	}
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: *workerMD, IOSocket: *workerIO, Mode: mode})
	if err != nil {
		return err
	}
	defer fsys.Close()
	if *workerWL == wlWeirCreate || *workerWL == wlWeirDirSync {
		return createWorker(fsys)
	}
	f, err := fsys.OpenFile(*workerFile, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	const span = 8 << 20
	if *workerWL == wlWeirOverwrite {
		if _, err := f.Write(make([]byte, span)); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil { // the file's first fsync makes its name durable too: not timed
		return err
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	buf := make([]byte, payload(*workerWL))
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 3))
	lat := make([]int64, 0, *workerOps)
	for i := range *workerOps {
		for j := 0; j < len(buf); j += 8 {
			buf[j] = byte(i) // every op writes new bytes
		}
		t := time.Now()
		if *workerWL == wlWeirOverwrite {
			_, err = f.WriteAt(buf, int64(rng.IntN(span/4096))*4096)
		} else {
			_, err = f.Write(buf)
		}
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return err
		}
		lat = append(lat, int64(time.Since(t)))
	}
	return json.NewEncoder(os.Stdout).Encode(workerOut{Lat: lat, Waits: fsys.DataWaitStats()})
}

// createWorker makes a new file per op in a directory of its own: written
// and fsynced (its name made durable by that fsync), or left empty and
// made durable by an fsync of the directory.
func createWorker(fsys *client.FS) error {
	dir := *workerFile + ".d"
	if err := fsys.Mkdir(dir, 0o755); err != nil {
		return err
	}
	d, err := fsys.OpenFile(dir, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return err
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	lat := make([]int64, 0, *workerOps)
	for i := range *workerOps {
		t := time.Now()
		f, err := fsys.OpenFile(fmt.Sprintf("%s/%d", dir, i), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if *workerWL == wlWeirCreate {
			if _, err = f.Write(buf); err == nil {
				err = f.Sync()
			}
		} else {
			err = d.Sync()
		}
		f.Close()
		if err != nil {
			return err
		}
		lat = append(lat, int64(time.Since(t)))
	}
	return json.NewEncoder(os.Stdout).Encode(workerOut{Lat: lat, Waits: fsys.DataWaitStats()})
}

// weirStack is the services on a data directory under dir.
type weirStack struct{ *benchutil.WeirStack }

func startWeir(exe, dir, mode string) (*weirStack, error) {
	staging, journal := "", ""
	switch mode {
	case modeNoStaging:
		staging = "  staging_size = 0\n"
	case modeNoBackground:
		journal = "journal {\n  foreground = true\n}\n"
	}
	w, err := benchutil.StartWeir(exe, dir, filepath.Join(dir, "weir"), "bench/fsync", staging, journal)
	if err != nil {
		return nil, err
	}
	return &weirStack{w}, nil
}

func (w *weirStack) stop() { w.Stop() }

// servicesCPU is the CPU time the service processes have used, and the
// journal service's share of it.
func (w *weirStack) servicesCPU() (sum, journal time.Duration, err error) {
	for name, pid := range w.Sup.PIDs() {
		c, err := benchutil.ProcCPU(pid)
		if err != nil {
			return 0, 0, err
		}
		sum += c
		if name == "journal" {
			journal = c
		}
	}
	return sum, journal, nil
}

// runWeir measures ops of workload wl by w client processes against a
// stack in mode on the file system of dir.
func runWeir(exe, dir, mode, wl string, w, ops int) (Row, error) {
	rowDir, err := os.MkdirTemp(dir, "weir-row-")
	if err != nil {
		return Row{}, err
	}
	defer os.RemoveAll(rowDir)
	st, err := startWeir(exe, rowDir, mode)
	if err != nil {
		return Row{}, err
	}
	defer st.stop()
	self, err := os.Executable()
	if err != nil {
		return Row{}, err
	}
	type proc struct {
		cmd   *exec.Cmd
		in    *os.File
		out   *bufio.Reader
		lines chan string
	}
	procs := make([]*proc, w)
	for i := range procs {
		cmd := exec.Command(self, "-worker-md", st.Cfg.Metadata.Socket, "-worker-io", st.Cfg.IO.Socket,
			"-worker-file", fmt.Sprintf("w%d", i), "-worker-wl", wl, "-worker-ops", fmt.Sprint(ops/w),
			fmt.Sprintf("-worker-poll=%v", mode == modePollClient))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return Row{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return Row{}, err
		}
		if err := cmd.Start(); err != nil {
			return Row{}, err
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		p := &proc{cmd: cmd, out: bufio.NewReaderSize(stdout, 1<<20)}
		if line, err := p.out.ReadString('\n'); err != nil || line != "ready\n" {
			return Row{}, fmt.Errorf("worker %d: %q, %v", i, line, err)
		}
		p.in = stdin.(*os.File)
		procs[i] = p
	}
	// Nothing of the set-up left in flight: the services' checkpoint of
	// the set-up's records and the kernel's write-back.
	time.Sleep(500 * time.Millisecond)
	exec.Command("sync").Run()
	before, _, err := benchutil.Disk(rowDir)
	if err != nil {
		return Row{}, err
	}
	cpu0, jcpu0, err := st.servicesCPU()
	if err != nil {
		return Row{}, err
	}
	mcpu0, _ := benchutil.ReadMachineCPU()
	start := time.Now()
	for _, p := range procs {
		if _, err := p.in.WriteString("go\n"); err != nil {
			return Row{}, err
		}
	}
	var all benchutil.Histogram
	var waits client.WaitStats
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, w)
	for i, p := range procs {
		wg.Go(func() {
			var out workerOut
			if err := json.NewDecoder(p.out).Decode(&out); err != nil {
				errs <- fmt.Errorf("worker %d: %w", i, err)
				return
			}
			mu.Lock()
			for _, v := range out.Lat {
				all.Record(v)
			}
			waits.LongParked += out.Waits.LongParked
			waits.LongSpun += out.Waits.LongSpun
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	mcpu1, _ := benchutil.ReadMachineCPU()
	close(errs)
	for err := range errs {
		return Row{}, err
	}
	cpu1, jcpu1, err := st.servicesCPU()
	if err != nil {
		return Row{}, err
	}
	after, _, err := benchutil.Disk(rowDir)
	if err != nil {
		return Row{}, err
	}
	n := int(all.Count())
	return Row{Workload: wl, Mode: mode, Writers: w, Ops: n, OpsPerSec: float64(n) / elapsed.Seconds(),
		P50us: all.QuantileUs(0.5), P99us: all.QuantileUs(0.99),
		FlushesPerOp:       float64(after.Flushes-before.Flushes) / float64(n),
		WriteAmplification: float64(after.BytesWritten-before.BytesWritten) / float64(n*payload(wl)),
		ServiceCPUusPerOp:  float64((cpu1 - cpu0).Microseconds()) / float64(n),
		JournalCPUusPerOp:  float64((jcpu1 - jcpu0).Microseconds()) / float64(n),
		MachineBusyPct:     machineBusy(mcpu0, mcpu1, elapsed),
		CaughtSpinningPct:  100 * float64(waits.LongSpun) / float64(max(waits.LongParked, 1)),
	}, nil
}
