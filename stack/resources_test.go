package stack_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
)

// Resources: io's descriptors follow what is open, not every file ever
// touched, and a descriptor the kernel refuses fails one request, never the
// stack (services/io/descriptors.go).

// fdCount counts the open descriptors of process pid.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// writeConfig writes an HCL file with body for the services' --config.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "weir.hcl")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// makeFiles writes n files of size bytes under dir, one after another,
// each closed before the next, as tar does.
func makeFiles(t *testing.T, fsys *client.FS, dir string, n, size int) {
	t.Helper()
	if err := fsys.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), size)
	for i := range n {
		name := fmt.Sprintf("%s/f%05d", dir, i)
		if err := writeFile(fsys, name, body); err != nil {
			t.Fatalf("file %d of %d: %v", i, n, err)
		}
	}
}

func writeFile(fsys *client.FS, name string, body []byte) error {
	f, err := fsys.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// checkFiles reads back what makeFiles wrote.
func checkFiles(t *testing.T, fsys *client.FS, dir string, n, size int) {
	t.Helper()
	for i := range n {
		name := fmt.Sprintf("%s/f%05d", dir, i)
		got, err := readAll(fsys, name)
		if err != nil || len(got) != size || bytes.Count(got, []byte("x")) != size {
			t.Fatalf("%s: %d bytes, %v", name, len(got), err)
		}
	}
}

// healthy fails the test unless every service of the stack says it is.
func healthy(t *testing.T, cfg *config.Config, url string) {
	t.Helper()
	nc, err := stack.Connect(cfg, url, control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := control.Status(ctx, nc, cfg.NATS.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range st {
		if !x.Healthy {
			t.Errorf("%s unhealthy: %s", x.Name, x.Error)
		}
	}
}

// ioStats is io's counters that say where its descriptors are, for a
// failure's message.
func ioStats(t *testing.T, cfg *config.Config, url string) string {
	t.Helper()
	nc, err := stack.Connect(cfg, url, control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		return err.Error()
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := control.Status(ctx, nc, cfg.NATS.Namespace)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, x := range st {
		if x.Name != "weir-io" {
			continue
		}
		for _, k := range []string{"descriptors", "descriptor_spares", "cache_regions", "cache_idle_regions", "cache_dirty_pages",
			"resource_errors", "descriptors_relieved", "close_writeback_failures", "cache_maps", "sessions", "grants"} {
			fmt.Fprintf(&b, "%s=%v ", k, x.Stats[k])
		}
	}
	return b.String()
}

// TestIODescriptorsBounded writes and reads many more files than io's
// descriptor budget, one at a time: io's descriptors stay within the
// budget plus what is open, and every file reads back.
func TestIODescriptorsBounded(t *testing.T) {
	cfg := testConfig(t)
	const budget = 128
	conf := writeConfig(t, fmt.Sprintf("io {\n  descriptors = %d\n}\n", budget))
	_, _, iop, _ := startTrio(t, cfg, "--config", conf)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	base := fdCount(t, iop.cmd.Process.Pid)
	const n = 1200
	makeFiles(t, fsys, "tree", n, 5000)
	checkFiles(t, fsys, "tree", n, 5000)
	// What io holds beyond its start: the budget, and a few for this
	// client's session (its write log, say) and kept read leases; not
	// several per file touched (1,200 files made 6,000 before).
	got := fdCount(t, iop.cmd.Process.Pid)
	if limit := base + budget + 64; got > limit {
		t.Fatalf("io holds %d descriptors after %d files (%d at start, budget %d): want at most %d", got, n, base, budget, limit)
	}
	t.Logf("io descriptors: %d at start, %d after %d files written and read (budget %d)", base, got, n, budget)
}

// TestIOOutOfDescriptors runs io at its RLIMIT_NOFILE: files held open
// take every descriptor, so that creates and the accept of new sessions
// fail. A failed request gets EMFILE; io is no less healthy for it, its
// listener goes on, and once the files close everything works again and
// every file written reads back after a restart.
func TestIOOutOfDescriptors(t *testing.T) {
	cfg := testConfig(t)
	url, md, iop, jr := startTrio(t, cfg)
	pid := iop.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dial := func(ctx context.Context) (*client.FS, error) {
		return client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	}
	fsys, err := dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	makeFiles(t, fsys, "before", 200, 3000) // idle regions and blob files to give back
	lim := uint64(fdCount(t, pid) + 48)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: lim, Max: lim}, nil); err != nil {
		t.Skipf("cannot lower io's RLIMIT_NOFILE (prlimit: %v)", err)
	}
	// Hold files open, written, until io has no descriptor left for the
	// next one: each open written file takes its blob and its region.
	var open []*client.File
	var refused error
	for i := 0; i < 1000 && refused == nil; i++ {
		f, err := fsys.OpenFile(fmt.Sprintf("before/held%03d", i), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			refused = err
			break
		}
		open = append(open, f)
		if _, err := f.Write([]byte("held open")); err != nil {
			refused = err
		}
	}
	if refused == nil {
		t.Fatalf("1000 files held open at RLIMIT_NOFILE %d: no request was refused", lim)
	}
	if !errors.Is(refused, syscall.EMFILE) && !errors.Is(refused, syscall.ENFILE) {
		t.Fatalf("the request io had no descriptor for: %v, want EMFILE", refused)
	}
	t.Logf("%d files held open before io refused: %v", len(open), refused)
	// A new session cannot be accepted now; it is, once descriptors are
	// back.
	dialed := make(chan error, 1)
	go func() {
		c, err := dial(ctx)
		if err == nil {
			err = writeFile(c, "late", []byte("late"))
			c.Close()
		}
		dialed <- err
	}()
	time.Sleep(200 * time.Millisecond) // some accepts fail meanwhile
	for _, f := range open {
		if err := f.Close(); err != nil {
			t.Fatalf("close of a held file: %v", err)
		}
	}
	select {
	case err := <-dialed:
		if err != nil {
			t.Fatalf("a session opened while io had no descriptor: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("no session accepted a minute after io's descriptors came back: the listener stopped")
	}
	healthy(t, cfg, url)
	if err := fsys.Mkdir("after", 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if err := writeFile(fsys, fmt.Sprintf("after/f%05d", i), bytes.Repeat([]byte("x"), 3000)); err != nil {
			t.Fatalf("file %d of 300 after the episode: %v; io: %s", i, err, ioStats(t, cfg, url))
		}
	}
	f, err := fsys.OpenFile("after/f00000", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync after the episode: %v", err)
	}
	f.Close()
	healthy(t, cfg, url)
	fsys.Close()

	// A clean stop, and a start on the same data: everything is there.
	jr.stop()
	md.stop()
	iop.stop()
	if code := iop.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("io stopped with exit code %d", code)
	}
	startTrio(t, cfg)
	fsys, err = dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	checkFiles(t, fsys, "before", 200, 3000)
	checkFiles(t, fsys, "after", 300, 3000)
	if got, err := readAll(fsys, "late"); err != nil || string(got) != "late" {
		t.Fatalf("late: %q %v", got, err)
	}
}
