package benchutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// BuildWeir compiles cmd/weir into dir and returns the binary's path. It
// needs the go tool and a working directory inside the weir module.
func BuildWeir(dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no weir binary given (-weir) and no go tool to build one: %w", err)
	}
	exe := filepath.Join(dir, "weir")
	cmd := exec.Command(goTool, "build", "-o", exe, "github.com/weir-storage/weir/cmd/weir")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build cmd/weir: %v\n%s", err, out)
	}
	return exe, nil
}

// WeirStack is the services as `weir up` runs them (stack.Supervisor),
// processes of the weir binary on the file backend.
type WeirStack struct {
	Sup *stack.Supervisor
	Cfg *config.Config
	run string
}

// StartWeir starts the services of exe with their data in dataDir and a
// configuration file in dir (written by the benchmark name): the file
// backend, ioExtra inside the io block and extra after it, every other
// setting the default. The run directory (sockets) is a short path of its
// own, readable by other users (a benchmark may run programs as another
// uid).
func StartWeir(exe, dir, dataDir, name, ioExtra, extra string) (*WeirStack, error) {
	run, err := os.MkdirTemp("", "wb-") // socket paths must be short
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(run, 0o755); err != nil {
		os.RemoveAll(run)
		return nil, err
	}
	text := fmt.Sprintf("# written by %s; every other setting is the default\ndata_dir = %q\nrun_dir = %q\nio {\n  backend = \"file\"\n%s}\n%s",
		name, dataDir, run, ioExtra, extra)
	path := filepath.Join(dir, "weir.hcl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		os.RemoveAll(run)
		return nil, err
	}
	cfg, err := config.Load(path)
	if err != nil {
		os.RemoveAll(run)
		return nil, err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Warn, Output: os.Stderr})
	sup := &stack.Supervisor{Config: cfg, ConfigPath: path, Exe: exe, Log: log, Out: os.Stderr}
	if err := sup.Start(); err != nil {
		os.RemoveAll(run)
		return nil, fmt.Errorf("start weir: %w", err)
	}
	return &WeirStack{Sup: sup, Cfg: cfg, run: run}, nil
}

// Stop stops the services and removes the run directory.
func (w *WeirStack) Stop() {
	w.Sup.Stop()
	os.RemoveAll(w.run)
}
