package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/bench/internal/benchutil"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// weirStack is the services, as `weir up` runs them, on the file backend
// with the data directory under the run's directory.
type weirStack struct {
	sup *stack.Supervisor
	cfg *config.Config
	run string
}

func startWeir(exe, dir string) (*weirStack, error) {
	run, err := os.MkdirTemp("", "wbs-") // socket paths must be short
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(run, 0o755); err != nil { // (the postgres user's sessions)
		return nil, err
	}
	text := fmt.Sprintf("# written by bench/shim; every other setting is the default\ndata_dir = %q\nrun_dir = %q\nio {\n  backend = \"file\"\n}\n",
		filepath.Join(dir, "weir-data"), run)
	path := filepath.Join(dir, "weir.hcl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return nil, err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "bench-shim", Level: hclog.Warn, Output: os.Stderr})
	sup := &stack.Supervisor{Config: cfg, ConfigPath: path, Exe: exe, Log: log, Out: os.Stderr}
	if err := sup.Start(); err != nil {
		os.RemoveAll(run)
		return nil, fmt.Errorf("start weir: %w", err)
	}
	return &weirStack{sup: sup, cfg: cfg, run: run}, nil
}

func (w *weirStack) stop() {
	w.sup.Stop()
	os.RemoveAll(w.run)
}

// env is what a program needs to run on weir through the shim so.
func (w *weirStack) env(so string) []string {
	return []string{"LD_PRELOAD=" + so, "WEIR_MOUNT=/weir",
		"WEIR_META_SOCK=" + w.cfg.Metadata.Socket, "WEIR_IO_SOCK=" + w.cfg.IO.Socket}
}

// cpu is the CPU time the service processes have used.
func (w *weirStack) cpu() time.Duration {
	var sum time.Duration
	for _, pid := range w.sup.PIDs() {
		if c, err := benchutil.ProcCPU(pid); err == nil {
			sum += c
		}
	}
	return sum
}
