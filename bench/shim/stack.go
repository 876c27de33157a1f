package main

import (
	"path/filepath"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// weirStack is the services, as `weir up` runs them, on the file backend
// with the data directory under the run's directory.
type weirStack struct{ *benchutil.WeirStack }

func startWeir(exe, dir string) (*weirStack, error) {
	w, err := benchutil.StartWeir(exe, dir, filepath.Join(dir, "weir-data"), "bench/shim", "", "")
	if err != nil {
		return nil, err
	}
	return &weirStack{w}, nil
}

func (w *weirStack) stop() { w.Stop() }

// env is what a program needs to run on weir through the shim so.
func (w *weirStack) env(so string) []string {
	return []string{"LD_PRELOAD=" + so, "WEIR_MOUNT=/weir",
		"WEIR_META_SOCK=" + w.Cfg.Metadata.Socket, "WEIR_IO_SOCK=" + w.Cfg.IO.Socket}
}

// cpu is the CPU time the service processes have used.
func (w *weirStack) cpu() time.Duration {
	var sum time.Duration
	for _, pid := range w.Sup.PIDs() {
		if c, err := benchutil.ProcCPU(pid); err == nil {
			sum += c
		}
	}
	return sum
}
