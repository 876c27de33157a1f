package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
	"github.com/weir-storage/weir/client"
)

// The client part: one directory of n empty files, through the Go client
// (package client) and through package os in a directory on the file
// system of weir's data, in this process. Phases: create each file
// (O_CREATE|O_EXCL|O_WRONLY, then close), stat each in a shuffled order,
// read the directory 1,024 entries a call, remove each in another
// shuffled order. Each phase runs on both targets before the next, the
// first target alternating.

// FilesResult is the client part.
type FilesResult struct {
	Files int       `json:"files"`
	Dir   string    `json:"os_dir"`
	Ops   []FilesOp `json:"ops"`
	// Services: the services' descriptors and memory after each weir phase.
	Services []ServiceSample `json:"services"`
}

// FilesOp is one phase on one target.
type FilesOp struct {
	Op     string `json:"op"`
	Target string `json:"target"`
	Ops    int    `json:"ops"` // for readdir, entries
	// P50us and P99us are per operation; for readdir, per call of
	// readDirBatch entries.
	WallS  float64 `json:"wall_s"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	OpsPS  float64 `json:"ops_per_s"`
	CPUus  float64 `json:"cpu_us_per_op"` // this process's user + system time per op
	SvcCPU float64 `json:"services_cpu_us_per_op,omitempty"`
	// Errors counts failed operations; a phase gives up after
	// maxFileErrors of them.
	Errors      int      `json:"errors"`
	FirstErrors []string `json:"first_errors,omitempty"`
}

const maxFileErrors = 1000

// readDirBatch is the entries asked for in each readdir call.
const readDirBatch = 1024

// nsTarget is what the phases need of a target.
type nsTarget interface {
	create(name string) error
	stat(name string) error
	remove(name string) error
	// list reads directory name, calling each after every call with the
	// number of entries it returned; it stops when each says false.
	list(name string, each func(n int) bool) error
	mkdir(name string) error
}

type osNS struct{ root string }

func (o osNS) create(name string) error {
	f, err := os.OpenFile(filepath.Join(o.root, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}
func (o osNS) stat(name string) error   { _, err := os.Stat(filepath.Join(o.root, name)); return err }
func (o osNS) remove(name string) error { return os.Remove(filepath.Join(o.root, name)) }
func (o osNS) mkdir(name string) error  { return os.Mkdir(filepath.Join(o.root, name), 0o755) }
func (o osNS) list(name string, each func(int) bool) error {
	f, err := os.Open(filepath.Join(o.root, name))
	if err != nil {
		return err
	}
	defer f.Close()
	return readAll(f, each)
}

type weirNS struct{ fs *client.FS }

func (w weirNS) create(name string) error {
	f, err := w.fs.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}
func (w weirNS) stat(name string) error   { _, err := w.fs.Stat(name); return err }
func (w weirNS) remove(name string) error { return w.fs.Remove(name) }
func (w weirNS) mkdir(name string) error  { return w.fs.Mkdir(name, 0o755) }
func (w weirNS) list(name string, each func(int) bool) error {
	f, err := w.fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return readAll(f, each)
}

// readAll reads a directory readDirBatch entries a call until io.EOF, or
// until each says to stop.
func readAll(d interface {
	ReadDir(int) ([]fs.DirEntry, error)
}, each func(int) bool) error {
	for {
		ents, err := d.ReadDir(readDirBatch)
		if !each(len(ents)) {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// runFiles runs the client part with n files.
func runFiles(w *weirStack, dir string, n int) (*FilesResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A negative RecoverTimeout: a service that dies fails the calls at
	// once instead of each waiting for it (the run reports the errors).
	c, err := client.Dial(ctx, client.Options{MetadataSocket: w.Cfg.Metadata.Socket, IOSocket: w.Cfg.IO.Socket, RecoverTimeout: -1})
	if err != nil {
		return nil, fmt.Errorf("dial weir: %w", err)
	}
	defer c.Close()
	res := &FilesResult{Files: n, Dir: filepath.Join(dir, "files")}
	targets := []struct {
		name string
		ns   nsTarget
	}{{"os", osNS{root: dir}}, {"weir", weirNS{fs: c}}}
	for _, t := range targets {
		if err := t.ns.mkdir("files"); err != nil {
			return nil, fmt.Errorf("%s: mkdir files: %w", t.name, err)
		}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("files/f%07d", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for p, phase := range []string{"create", "stat", "readdir", "unlink"} {
		if phase == "stat" || phase == "unlink" {
			rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		}
		for i := range targets {
			t := targets[(i+p)%2]
			cpu0, svc0 := selfCPU(), w.cpu()
			op := FilesOp{Op: phase, Target: t.name}
			var h benchutil.Histogram
			ops := 0 // readdir's are entries, its latencies per call
			start := time.Now()
			fail := func(err error) {
				op.Errors++
				if len(op.FirstErrors) < 5 {
					op.FirstErrors = append(op.FirstErrors, err.Error())
				}
			}
			if phase == "readdir" {
				seen := 0
				last := time.Now()
				err := t.ns.list("files", func(k int) bool {
					now := time.Now()
					h.Record(int64(now.Sub(last)))
					last, seen = now, seen+k
					return now.Sub(start) < *timeout
				})
				ops = seen
				switch {
				case err != nil:
					fail(err)
				case seen != n && time.Since(start) >= *timeout:
					fail(fmt.Errorf("gave up after %v (-timeout), %d of %d entries read", *timeout, seen, n))
				case seen != n:
					fail(fmt.Errorf("readdir gave %d entries, not %d", seen, n))
				}
			} else {
				do := map[string]func(string) error{"create": t.ns.create, "stat": t.ns.stat, "unlink": t.ns.remove}[phase]
				for _, name := range names {
					t0 := time.Now()
					err := do(name)
					h.Record(int64(time.Since(t0)))
					if err != nil {
						if fail(err); op.Errors == maxFileErrors {
							op.FirstErrors = append(op.FirstErrors, fmt.Sprintf("gave up after %d errors", maxFileErrors))
							break
						}
					}
					if time.Since(start) > *timeout {
						fail(fmt.Errorf("gave up after %v (-timeout), %d of %d done", *timeout, h.Count(), n))
						break
					}
				}
				ops = int(h.Count())
			}
			wall := time.Since(start)
			op.Ops, op.WallS = ops, wall.Seconds()
			op.P50us, op.P99us = h.QuantileUs(0.5), h.QuantileUs(0.99)
			if op.Ops > 0 {
				op.OpsPS = float64(op.Ops) / wall.Seconds()
				op.CPUus = float64(selfCPU()-cpu0) / 1e3 / float64(op.Ops)
				if t.name == "weir" {
					op.SvcCPU = float64(w.cpu()-svc0) / 1e3 / float64(op.Ops)
				}
			}
			res.Ops = append(res.Ops, op)
			fmt.Fprintf(os.Stderr, "trees: files %-7s %-4s %8d ops %9.0f ops/s  p50 %7.1f µs  p99 %8.1f µs  %d errors\n",
				phase, t.name, op.Ops, op.OpsPS, op.P50us, op.P99us, op.Errors)
			if t.name == "weir" {
				res.Services = append(res.Services, w.sample("after "+phase))
			}
		}
	}
	return res, nil
}

// selfCPU is this process's user + system time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
