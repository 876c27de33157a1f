package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// weirConfigText is the configuration file the services run with: the
// defaults, except for the directories, the debug log level (the file
// backend says at debug level whether it uses O_DIRECT) and the choices
// the command line offers.
func weirConfigText(dataDir, runDir, direct, wait string) string {
	return fmt.Sprintf(`# written by bench/fileops; every other setting is the default
data_dir  = %q
run_dir   = %q
log_level = "debug"

io {
  backend   = "file"
  direct    = %q
  wait_mode = %q
}
`, dataDir, runDir, direct, wait)
}

// weirStack is the weir services as child processes of the weir binary.
type weirStack struct {
	ownRun  bool // cfg.RunDir is a temporary directory outside the parent
	cfg     *config.Config
	cfgPath string
	cfgText string
	sup     *stack.Supervisor
	tap     *logTap
}

// startWeir writes the configuration into parent and starts embedded NATS
// (in this process) and the metadata and IO services (as processes).
func startWeir(exe, parent, direct, wait string, verbose io.Writer) (*weirStack, error) {
	dataDir := filepath.Join(parent, "weir")
	runDir := filepath.Join(parent, "run")
	ownRun := false
	// Unix socket paths must fit in 108 bytes.
	if len(filepath.Join(runDir, "metadata.sock")) > 100 {
		short, err := os.MkdirTemp("", "wb-")
		if err != nil {
			return nil, err
		}
		runDir, ownRun = short, true
	}
	text := weirConfigText(dataDir, runDir, direct, wait)
	path := filepath.Join(parent, "weir.hcl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return nil, err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, fmt.Errorf("weir configuration: %w", err)
	}
	tap := &logTap{verbose: verbose}
	log := hclog.New(&hclog.LoggerOptions{Name: "fileops", Level: hclog.Warn, Output: tap, Color: hclog.ColorOff})
	sup := &stack.Supervisor{Config: cfg, ConfigPath: path, Exe: exe, Log: log, Out: tap}
	w := &weirStack{ownRun: ownRun, cfg: cfg, cfgPath: path, cfgText: text, sup: sup, tap: tap}
	if err := sup.Start(); err != nil {
		w.stop()
		return nil, fmt.Errorf("start weir: %w\nservice log tail:\n%s", err, tap.tail())
	}
	return w, nil
}

// pids returns the service processes by name, in a fixed order.
func (w *weirStack) pids() (names []string, pids []int) {
	m := w.sup.PIDs()
	for _, n := range []string{"metadata", "io"} {
		if pid, ok := m[n]; ok {
			names, pids = append(names, n), append(pids, pid)
		}
	}
	return names, pids
}

func (w *weirStack) stop() {
	w.sup.Stop()
	if w.ownRun {
		_ = os.RemoveAll(w.cfg.RunDir)
	}
}

// logTap receives the services' log lines: it remembers the file
// backend's report of its I/O mode and the last lines (for errors), and
// copies everything to verbose when that is set.
type logTap struct {
	verbose io.Writer

	mu      sync.Mutex
	partial []byte
	last    []string
	mode    []string // the backend's lines about O_DIRECT
	direct  *bool
}

var (
	backendReady = regexp.MustCompile(`file backend ready.*direct=(true|false)`)
	directLine   = regexp.MustCompile(`O_DIRECT`)
	logStamp     = regexp.MustCompile(`^\S+\s+`) // hclog's timestamp
)

const tapLines = 40

func (t *logTap) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.verbose != nil {
		_, _ = t.verbose.Write(p)
	}
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		t.line(string(t.partial[:i]))
		t.partial = t.partial[i+1:]
	}
	return len(p), nil
}

func (t *logTap) line(s string) {
	if len(t.last) == tapLines {
		t.last = t.last[1:]
	}
	t.last = append(t.last, s)
	if m := backendReady.FindStringSubmatch(s); m != nil {
		d := m[1] == "true"
		t.direct = &d
		t.mode = append(t.mode, logStamp.ReplaceAllString(s, ""))
	} else if directLine.MatchString(s) {
		t.mode = append(t.mode, logStamp.ReplaceAllString(s, ""))
	}
}

func (t *logTap) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.last, "\n")
}

// ioMode returns whether the backend said it uses O_DIRECT (nil if it did
// not say) and its lines about it.
func (t *logTap) ioMode() (*bool, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.direct, append([]string(nil), t.mode...)
}
