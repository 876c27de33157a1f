package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// rowGrace is how long a configuration may overrun its warm-up and window
// before its round trips are failed (a hung server, a lost answer).
const rowGrace = 10 * time.Second

// settings are what every configuration is measured with.
type settings struct {
	warmup     time.Duration
	window     time.Duration
	maxSamples int // latencies recorded per goroutine; later ops only count
}

// Row is the result of one (transport, payload, threads) configuration, or
// of a transport's idle session. Latencies are round trips as one client
// goroutine sees them.
type Row struct {
	Transport    string  `json:"transport"`
	Workload     string  `json:"workload"`
	PayloadBytes int     `json:"payload_bytes"`
	Threads      int     `json:"threads"`
	Idle         bool    `json:"idle,omitempty"` // a session open without requests: CPU only
	Ops          uint64  `json:"ops"`
	WindowSec    float64 `json:"window_sec"`
	OpsPerSec    float64 `json:"ops_per_sec"`
	Samples      int     `json:"latency_samples"` // < Ops if a goroutine hit maxSamples
	P50us        float64 `json:"p50_us"`
	P99us        float64 `json:"p99_us"`
	P999us       float64 `json:"p999_us"`

	ClientCPUCores   float64 `json:"client_cpu_cores"`
	ServerCPUCores   float64 `json:"server_cpu_cores"`
	ClientCPUusPerOp float64 `json:"client_cpu_us_per_op"`
	ServerCPUusPerOp float64 `json:"server_cpu_us_per_op"`
	// Machine-wide busy CPU not used by client or server (other processes,
	// interrupts; tick-sampled, so about ±0.05), and time stolen by the
	// hypervisor. Either one large means the row was disturbed.
	OtherCPUCores    float64 `json:"other_cpu_cores"`
	StealCores       float64 `json:"steal_cores"`
	ClientPeakRSSKiB int64   `json:"client_peak_rss_kib"`
	ServerPeakRSSKiB int64   `json:"server_peak_rss_kib"`

	// Against the uds row of the same payload and threads; ring rows only.
	P50LowerThanUDS *float64 `json:"p50_lower_than_uds,omitempty"` // uds p50 / this p50
	OpsVsUDS        *float64 `json:"ops_vs_uds,omitempty"`         // this ops/s / uds ops/s

	Error string `json:"error,omitempty"`
}

func workloadName(payload int) string {
	if payload == 0 {
		return "no-op"
	}
	if payload%1024 == 0 {
		return fmt.Sprintf("echo %d KiB", payload/1024)
	}
	return fmt.Sprintf("echo %d B", payload)
}

// Phases of a configuration, as the client goroutines see them.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// worker is one client goroutine's state; the recorder keeps it across
// configurations so the latency buffers are allocated once.
type worker struct {
	lat     []int64 // round-trip nanoseconds, capacity settings.maxSamples
	ops     uint64  // round trips started in the measured window
	in, out []byte  // echo payload and the private buffer it comes back to
}

// run does round trips on l until phase says stop. The first one (in the
// warm-up) checks that an echo comes back intact.
func (w *worker) run(ctx context.Context, l link, phase *atomic.Int32) error {
	clear(w.out)
	if err := l.roundTrip(ctx, w.in, w.out); err != nil {
		return err
	}
	if !bytes.Equal(w.in, w.out) {
		return errors.New("echo answer differs from the request")
	}
	for {
		p := phase.Load()
		if p == phaseStop {
			return nil
		}
		start := time.Now()
		if err := l.roundTrip(ctx, w.in, w.out); err != nil {
			return err
		}
		d := time.Since(start)
		if p == phaseMeasure {
			w.ops++
			if len(w.lat) < cap(w.lat) {
				w.lat = append(w.lat, int64(d))
			}
		}
	}
}

// recorder owns the client goroutines' buffers.
type recorder struct {
	s       settings
	workers []*worker
	merged  []int64
}

// reset returns n workers ready for a configuration with payload bytes.
func (r *recorder) reset(n, payload int) []*worker {
	for len(r.workers) < n {
		r.workers = append(r.workers, &worker{lat: make([]int64, 0, r.s.maxSamples)})
	}
	ws := r.workers[:n]
	for i, w := range ws {
		w.lat = w.lat[:0]
		w.ops = 0
		w.in = slices.Grow(w.in[:0], payload)[:payload]
		w.out = slices.Grow(w.out[:0], payload)[:payload]
		for j := range w.in {
			w.in[j] = byte(i*67 + j*31 + 1) // differs per goroutine: crossed answers show
		}
	}
	return ws
}

// cpuTimes are the CPU time of this process, of the server child and of
// the whole machine.
type cpuTimes struct {
	client, server time.Duration
	machine        benchutil.MachineCPU
}

func readCPU(serverPid int) (t cpuTimes, err error) {
	if t.client, err = benchutil.ProcCPU(os.Getpid()); err != nil {
		return t, fmt.Errorf("client: %w", err)
	}
	if t.server, err = benchutil.ProcCPU(serverPid); err != nil {
		return t, fmt.Errorf("server: %w", err)
	}
	if t.machine, err = benchutil.ReadMachineCPU(); err != nil {
		return t, err
	}
	return t, nil
}

// measureRow measures one configuration against c's server. Failures are
// reported in the row, not returned: the other configurations still run.
func measureRow(ctx context.Context, c *child, rec *recorder, payload, threads int) Row {
	row := Row{Transport: c.transport, Workload: workloadName(payload), PayloadBytes: payload, Threads: threads}
	if err := measureInto(ctx, c, rec, &row); err != nil {
		row.Error = err.Error()
	}
	return row
}

func measureInto(ctx context.Context, c *child, rec *recorder, row *Row) (err error) {
	if err := c.alive(); err != nil {
		return err
	}
	s := rec.s
	ctx, cancel := context.WithTimeout(ctx, s.warmup+s.window+rowGrace)
	defer cancel()
	links, closeLinks, err := openLinks(ctx, c, row.Threads, row.PayloadBytes)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		if cerr := closeLinks(); cerr != nil && err == nil {
			err = fmt.Errorf("disconnect: %w", cerr)
		}
	}()

	ws := rec.reset(row.Threads, row.PayloadBytes)
	var (
		phase    atomic.Int32
		wg       sync.WaitGroup
		failed   = make(chan struct{})
		failOnce sync.Once
		errs     = make([]error, len(ws))
	)
	for i, w := range ws {
		wg.Go(func() {
			if err := w.run(ctx, links[i], &phase); err != nil {
				errs[i] = fmt.Errorf("client goroutine %d: %w", i, err)
				failOnce.Do(func() { close(failed) })
			}
		})
	}
	stop := func() error {
		phase.Store(phaseStop)
		wg.Wait()
		return errors.Join(errs...)
	}

	if err := pause(ctx, s.warmup, failed); err != nil {
		return errors.Join(stop(), fmt.Errorf("warm-up: %w", err))
	}
	cpu0, err := readCPU(c.Pid())
	if err != nil {
		return errors.Join(stop(), err)
	}
	start := time.Now()
	phase.Store(phaseMeasure)
	perr := pause(ctx, s.window, failed)
	if perr != nil {
		perr = fmt.Errorf("measured window: %w", perr)
	}
	phase.Store(phaseStop)
	window := time.Since(start)
	cpu1, cerr := readCPU(c.Pid())
	if err := errors.Join(stop(), perr, cerr); err != nil {
		return err
	}

	rec.summarize(ws, window, row)
	row.setCPU(cpu0, cpu1, window)
	return row.setRSS(c.Pid())
}

// measureIdleRow measures what an open session that carries no requests
// costs in CPU: one link, one round trip to start it, a warm-up in which
// adaptive spinning runs out, then the window.
func measureIdleRow(ctx context.Context, c *child, s settings) Row {
	row := Row{Transport: c.transport, Workload: "idle session", Threads: 1, Idle: true}
	if err := measureIdle(ctx, c, s, &row); err != nil {
		row.Error = err.Error()
	}
	return row
}

func measureIdle(ctx context.Context, c *child, s settings, row *Row) (err error) {
	if err := c.alive(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.warmup+s.window+rowGrace)
	defer cancel()
	links, closeLinks, err := openLinks(ctx, c, 1, 0)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		if cerr := closeLinks(); cerr != nil && err == nil {
			err = fmt.Errorf("disconnect: %w", cerr)
		}
	}()
	if err := links[0].roundTrip(ctx, nil, nil); err != nil {
		return fmt.Errorf("first round trip: %w", err)
	}
	if err := pause(ctx, s.warmup, nil); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	cpu0, err := readCPU(c.Pid())
	if err != nil {
		return err
	}
	start := time.Now()
	if err := pause(ctx, s.window, nil); err != nil {
		return err
	}
	window := time.Since(start)
	cpu1, err := readCPU(c.Pid())
	if err != nil {
		return err
	}
	row.WindowSec = window.Seconds()
	row.setCPU(cpu0, cpu1, window)
	return row.setRSS(c.Pid())
}

// setCPU fills the CPU columns from readings before and after the window.
func (row *Row) setCPU(before, after cpuTimes, window time.Duration) {
	client, server := after.client-before.client, after.server-before.server
	cores := func(d time.Duration) float64 { return d.Seconds() / window.Seconds() }
	row.ClientCPUCores, row.ServerCPUCores = cores(client), cores(server)
	row.OtherCPUCores = cores(after.machine.Busy - before.machine.Busy - client - server)
	row.StealCores = cores(after.machine.Steal - before.machine.Steal)
	if row.Ops > 0 {
		row.ClientCPUusPerOp = float64(client.Microseconds()) / float64(row.Ops)
		row.ServerCPUusPerOp = float64(server.Microseconds()) / float64(row.Ops)
	}
}

// setRSS fills the peak RSS columns.
func (row *Row) setRSS(serverPid int) (err error) {
	if row.ClientPeakRSSKiB, err = benchutil.ProcPeakRSS(os.Getpid()); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if row.ServerPeakRSSKiB, err = benchutil.ProcPeakRSS(serverPid); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

// pause waits for d, unless ctx ends or failed (which may be nil) is closed
// first.
func pause(ctx context.Context, d time.Duration, failed <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-failed:
		return errors.New("a client goroutine failed")
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// summarize fills the row's throughput and latency percentiles.
func (r *recorder) summarize(ws []*worker, window time.Duration, row *Row) {
	r.merged = r.merged[:0]
	for _, w := range ws {
		row.Ops += w.ops
		r.merged = append(r.merged, w.lat...)
	}
	slices.Sort(r.merged)
	row.WindowSec = window.Seconds()
	row.OpsPerSec = float64(row.Ops) / window.Seconds()
	row.Samples = len(r.merged)
	row.P50us = benchutil.PercentileUs(r.merged, 0.50)
	row.P99us = benchutil.PercentileUs(r.merged, 0.99)
	row.P999us = benchutil.PercentileUs(r.merged, 0.999)
}
