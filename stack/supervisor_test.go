package stack_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
)

var weirBuild struct {
	once sync.Once
	dir  string
	exe  string
	err  error
}

// buildWeir builds the weir command, once per test binary, for tests that
// run real service processes.
func buildWeir(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH: cannot build the weir binary for the process tests")
	}
	weirBuild.once.Do(func() {
		if weirBuild.dir, weirBuild.err = os.MkdirTemp("", "weir-build-"); weirBuild.err != nil {
			return
		}
		weirBuild.exe = filepath.Join(weirBuild.dir, "weir")
		cmd := exec.Command(gobin, "build", "-o", weirBuild.exe, "github.com/weir-storage/weir/cmd/weir")
		if out, err := cmd.CombinedOutput(); err != nil {
			weirBuild.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if weirBuild.err != nil {
		t.Fatal(weirBuild.err)
	}
	return weirBuild.exe
}

func TestMain(m *testing.M) {
	if url := os.Getenv(attackerEnv); url != "" {
		os.Exit(runAttacker(url))
	}
	if socket := os.Getenv(peerAttackerEnv); socket != "" {
		os.Exit(runPeerAttacker(socket))
	}
	if spec := os.Getenv(crashWorkerEnv); spec != "" {
		os.Exit(runCrashWorker(spec))
	}
	code := m.Run()
	if weirBuild.dir != "" {
		os.RemoveAll(weirBuild.dir)
	}
	if err := stack.HaltBackends(); err != nil { // SPDK, before C exit handlers run
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	// The services rebuild their configuration from the file and flags,
	// so the paths stay the ones derived from --data.
	c, err := stack.LocalConfig(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startSupervisor runs the services of cfg as processes, as weir up does
// (configPath, if not empty, is passed to them with --config), and stops
// them when the test ends.
func startSupervisor(t *testing.T, cfg *config.Config, configPath string) *stack.Supervisor {
	t.Helper()
	s := &stack.Supervisor{Config: cfg, ConfigPath: configPath, Exe: buildWeir(t), Log: hclog.NewNullLogger(), Out: testOut{t}}
	if err := s.Start(); err != nil {
		s.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

// TestSupervisor runs the services as processes the way `weir up` does:
// both become ready, serve a client, report on NATS; when one is killed,
// Wait reports which one, and Stop stops the rest.
//
// With an hour-long request timeout, open files and a delete pending when
// io dies, Stop still returns: metadata notices the dead io at once and
// does not wait for answers that cannot come.
func TestSupervisor(t *testing.T) {
	cfg := testConfig(t)
	path := filepath.Join(t.TempDir(), "weir.hcl")
	if err := os.WriteFile(path, []byte("nats {\n  request_timeout = \"1h\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.NATS.RequestTimeout = time.Hour
	s := startSupervisor(t, cfg, path)
	pids := s.PIDs()
	if pids["metadata"] == 0 || pids["io"] == 0 {
		t.Fatalf("pids %v", pids)
	}
	for name, pid := range pids {
		// Its own group: a terminal's Ctrl-C must not reach it directly.
		if pg, err := syscall.Getpgid(pid); err != nil || pg != pid {
			t.Errorf("%s (pid %d) is in process group %d (%v), want its own", name, pid, pg, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile("hello", []byte("from another process"), 0o644); err != nil {
		t.Fatal(err)
	}
	var open []*client.File
	for i := range 4 {
		f, err := c.Create(fmt.Sprintf("open%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("granted")); err != nil {
			t.Fatal(err)
		}
		open = append(open, f)
	}

	nc, err := stack.Connect(cfg, s.URL(), control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	st, err := control.Status(ctx, nc, cfg.NATS.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range st {
		if !x.Healthy {
			t.Errorf("%s unhealthy: %s", x.Name, x.Error)
		}
		names = append(names, x.Name)
	}
	if strings.Join(names, ",") != "weir-io,weir-journal,weir-metadata" {
		t.Fatalf("status found %v", names)
	}

	if err := syscall.Kill(pids["io"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "service io") {
			t.Fatalf("Wait after killing io: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not report the dead service")
	}
	// Metadata is still up: a remove is acknowledged with its blob
	// delete pending, which metadata tries once more as it stops.
	if err := c.Remove("hello"); err != nil {
		t.Fatalf("remove with io dead: %v", err)
	}
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("Stop waited for answers from the dead io (request timeout 1h)")
	}
	for _, f := range open {
		f.Close()
	}
	c.Close()
	if err := syscall.Kill(pids["metadata"], 0); err == nil {
		t.Fatal("metadata still running after Stop")
	}
}

// TestStatusSeesStoppedService: with the io process stopped (SIGSTOP, a
// hung service), status still lists io, as not answering, and metadata as
// healthy; once io continues, both are healthy again.
func TestStatusSeesStoppedService(t *testing.T) {
	cfg := testConfig(t)
	s := startSupervisor(t, cfg, "")
	nc, err := stack.Connect(cfg, s.URL(), control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	status := func() map[string]control.ServiceStatus {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := control.Status(ctx, nc, cfg.NATS.Namespace, stack.ServiceNames(nil)...)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]control.ServiceStatus{}
		for _, x := range st {
			m[x.Name] = x
		}
		return m
	}

	ioPID := s.PIDs()["io"]
	if err := syscall.Kill(ioPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(ioPID, syscall.SIGCONT) // or Stop waits for it in vain
		}
	}()
	st := status()
	if x := st["weir-io"]; len(st) != 3 || x.Healthy || !strings.Contains(x.Error, "no reply within") {
		t.Errorf("status with io stopped: io is %+v", x)
	}
	if x := st["weir-metadata"]; !x.Healthy {
		t.Errorf("status with io stopped: metadata is %+v", x)
	}

	if err := syscall.Kill(ioPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	for name, x := range status() {
		if !x.Healthy {
			t.Errorf("after SIGCONT: %s is %+v", name, x)
		}
	}
}

type testOut struct{ t *testing.T }

func (w testOut) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestUpCtrlC runs `weir up` the way a terminal does, in a process group of
// its own, and sends SIGINT to that whole group while a client holds a file
// open for writing. weir up must stop the services in order (metadata
// revokes the grant while io still answers), log no error, exit 0, and the
// data must be there after the next start.
func TestUpCtrlC(t *testing.T) {
	exe := buildWeir(t)
	data := filepath.Join(t.TempDir(), "data") // weir up creates it, 0700
	up := func() (*exec.Cmd, *bytes.Buffer, *config.Config) {
		var logs bytes.Buffer
		cmd := exec.Command(exe, "up", "--data", data)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		sc := bufio.NewScanner(stdout)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "weir is up") {
		}
		go io.Copy(io.Discard, stdout)
		cfg, err := stack.LocalConfig(data, "")
		if err != nil {
			t.Fatal(err)
		}
		return cmd, &logs, cfg
	}
	cmd, logs, cfg := up()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	// Many open files: metadata has that many grants to revoke at stop,
	// which takes long enough to see io stopping under it.
	const open = 32
	for i := range open {
		f, err := c.Create(fmt.Sprintf("open-at-ctrl-c-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("written before Ctrl-C")); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("weir up after Ctrl-C: %v\n%s", err, logs)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("weir up did not stop after Ctrl-C\n%s", logs)
	}
	for _, bad := range []string{"[ERROR]", "[WARN]", "revoke failed"} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("weir up's log after Ctrl-C has %q:\n%s", bad, logs)
		}
	}
	c.Close()

	_, logs, _ = up()
	c, err = client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	defer c.Close()
	for i := range open {
		got, err := c.ReadFile(fmt.Sprintf("open-at-ctrl-c-%d", i))
		if err != nil || string(got) != "written before Ctrl-C" {
			t.Fatalf("file %d after restart: %q %v", i, got, err)
		}
	}
}

// TestSupervisorsOnExternalNATS: the production layout. Two stacks, each
// started the way `weir up --config FILE` starts one (real service
// processes), use one NATS server that neither started (nats.url), each in
// its own namespace. Both serve clients, each status sees its own services
// only, and stopping a stack leaves the server and the other stack up.
func TestSupervisorsOnExternalNATS(t *testing.T) {
	// The server admits both stacks' users (weir nats-config prints them
	// for a real external server; TestExternalNATSServer runs one).
	cfgs := map[string]*config.Config{}
	var users []control.User
	for _, ns := range []string{"alpha", "beta.two"} {
		cfg := testConfig(t)
		cfg.NATS.Namespace = ns
		u, err := stack.Users(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfgs[ns], users = cfg, append(users, u...)
	}
	ext, err := control.StartEmbedded(control.EmbeddedOptions{Listen: "127.0.0.1:-1", Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ext.Shutdown) // after the supervisors' cleanups: they stop first
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// alpha names its server and namespace in a config file, as with
	// `weir up --config`; beta.two has them only in the supervisor's
	// configuration, as with `weir up --nats-url --nats-namespace`.
	sups := map[string]*stack.Supervisor{}
	status := map[string]*nats.Conn{}
	for ns, cfg := range cfgs {
		cfg.NATS.URL = ext.URL()
		path := ""
		if ns == "alpha" {
			path = filepath.Join(t.TempDir(), "weir.hcl")
			body := fmt.Sprintf("nats {\n  url = %q\n  namespace = %q\n}\n", ext.URL(), ns)
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		s := startSupervisor(t, cfg, path)
		if s.URL() != ext.URL() {
			t.Fatalf("stack %s uses NATS %s, want the external %s", ns, s.URL(), ext.URL())
		}
		sups[ns] = s
		nc, err := stack.Connect(cfg, ext.URL(), control.RoleCLI, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		status[ns] = nc
	}
	for ns, s := range sups {
		c, err := client.Dial(ctx, client.Options{MetadataSocket: s.Config.Metadata.Socket, IOSocket: s.Config.IO.Socket})
		if err != nil {
			t.Fatalf("stack %s: %v", ns, err)
		}
		if err := c.WriteFile("f", []byte(ns), 0o644); err != nil {
			t.Fatalf("stack %s: %v", ns, err)
		}
		if got, err := c.ReadFile("f"); err != nil || string(got) != ns {
			t.Fatalf("stack %s: read %q %v", ns, got, err)
		}
		c.Close()
		st, err := control.Status(ctx, status[ns], ns, stack.ServiceNames(nil)...)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 3 || !st[0].Healthy || !st[1].Healthy || !st[2].Healthy {
			t.Fatalf("status of stack %s: %+v", ns, st)
		}
	}
	if err := sups["alpha"].Stop(); err != nil {
		t.Fatalf("stop alpha: %v", err)
	}
	st, err := control.Status(ctx, status["beta.two"], "beta.two", stack.ServiceNames(nil)...)
	if err != nil || len(st) != 3 || !st[0].Healthy || !st[1].Healthy || !st[2].Healthy {
		t.Fatalf("beta.two after alpha stopped: %+v %v", st, err)
	}
	if !status["beta.two"].IsConnected() {
		t.Fatal("stopping a stack stopped the external NATS server")
	}
}
