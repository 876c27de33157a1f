package conformance_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/conformance"
)

// Environment that tells a child process (permission cases run as uid
// 65534) where the services are.
const (
	envMetaSock = "WEIR_CONFORMANCE_METADATA_SOCKET"
	envIOSock   = "WEIR_CONFORMANCE_IO_SOCKET"
)

// weirTarget is one weir stack shared by every case; Restart stops and
// starts it on the same data directory and re-dials.
type weirTarget struct {
	mu  sync.Mutex // protects c and st
	c   *client.FS
	st  *stack.Stack
	cfg *config.Config
	log hclog.Logger
}

func (w *weirTarget) fs() *client.FS {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c
}

func (w *weirTarget) Restart() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.st.Shutdown(ctx); err != nil {
		return err
	}
	st, err := stack.Start(w.cfg, w.log)
	if err != nil {
		return err
	}
	c, err := st.Dial(ctx)
	if err != nil {
		st.Shutdown(ctx)
		return err
	}
	w.st, w.c = st, c
	return nil
}

// weirFS adapts the client to conformance.FS (OpenFile returns an
// interface there) and forwards Restart to the target.
type weirFS struct {
	get     func() *client.FS
	restart func() error
}

func (w weirFS) OpenFile(name string, flag int, perm fs.FileMode) (conformance.File, error) {
	f, err := w.get().OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}
func (w weirFS) Mkdir(n string, p fs.FileMode) error     { return w.get().Mkdir(n, p) }
func (w weirFS) MkdirAll(n string, p fs.FileMode) error  { return w.get().MkdirAll(n, p) }
func (w weirFS) Remove(n string) error                   { return w.get().Remove(n) }
func (w weirFS) RemoveAll(n string) error                { return w.get().RemoveAll(n) }
func (w weirFS) Rename(a, b string) error                { return w.get().Rename(a, b) }
func (w weirFS) Stat(n string) (fs.FileInfo, error)      { return w.get().Stat(n) }
func (w weirFS) Chmod(n string, m fs.FileMode) error     { return w.get().Chmod(n, m) }
func (w weirFS) Chown(n string, u, g int) error          { return w.get().Chown(n, u, g) }
func (w weirFS) Chtimes(n string, a, m time.Time) error  { return w.get().Chtimes(n, a, m) }
func (w weirFS) Touch(n string) error                    { return w.get().Touch(n) }
func (w weirFS) ReadDir(n string) ([]fs.DirEntry, error) { return w.get().ReadDir(n) }
func (w weirFS) Truncate(n string, size int64) error     { return w.get().Truncate(n, size) }
func (w weirFS) Restart() error {
	if w.restart == nil {
		return nil
	}
	return w.restart()
}

// init registers the weir factory before the package's TestMain calls
// MainHook, which runs a permission case when this is a child process.
func init() {
	conformance.RegisterFactory("weir", func(dir string) (conformance.FS, error) {
		// In a child this dials as uid 65534: the services see its credentials.
		c, err := client.Dial(context.Background(), client.Options{
			MetadataSocket: os.Getenv(envMetaSock),
			IOSocket:       os.Getenv(envIOSock),
		})
		if err != nil {
			return nil, err
		}
		return conformance.Within(weirFS{get: func() *client.FS { return c }}, dir), nil
	})
}

// TestConformanceWeir runs every case against the kernel and against weir
// (file backend, services in this process) and compares them.
func TestConformanceWeir(t *testing.T) { runWeirConformance(t, nil) }

// TestConformanceWeirNoStaging runs the suite with io.staging_size = 0:
// every truncate's size is then recorded at metadata before io cuts
// (proto.FeatureRecordCuts).
func TestConformanceWeirNoStaging(t *testing.T) {
	runWeirConformance(t, func(c *config.Config) { c.IO.StagingSize = 0 })
}

// runWeirConformance runs the suite against weir with the default
// configuration, changed by adjust (nil: unchanged).
func runWeirConformance(t *testing.T, adjust func(*config.Config)) {
	data := t.TempDir()
	run, err := os.MkdirTemp("", "weir-conf-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(run)
	// Children run as uid 65534 and must reach the sockets.
	if err := os.Chmod(run, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := stack.LocalConfig(data, run)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ring.ArenaSize = 4 << 20
	if adjust != nil {
		adjust(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envMetaSock, cfg.Metadata.Socket)
	t.Setenv(envIOSock, cfg.IO.Socket)
	log := hclog.New(&hclog.LoggerOptions{Name: "weir", Level: hclog.Error, Output: os.Stderr})
	st, err := stack.Start(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	w := &weirTarget{c: c, st: st, cfg: cfg, log: log}
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.c.Close()
		w.st.Shutdown(context.Background())
	}()
	var n atomic.Int64
	conformance.Run(t, map[string]func(*testing.T) conformance.FS{
		conformance.Reference: conformance.KernelTarget,
		"weir": func(t *testing.T) conformance.FS {
			dir := fmt.Sprintf("/conformance/%d", n.Add(1))
			c := w.fs()
			if err := c.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := c.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			s := conformance.Within(weirFS{get: w.fs, restart: w.Restart}, dir)
			s.Factory, s.Arg = "weir", dir
			return s
		},
	}, conformance.Cases())
}
