package stack_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/stack"
)

// buildWeir builds the weir command for tests that run real service
// processes.
func buildWeir(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH: cannot build the weir binary for the process tests")
	}
	exe := filepath.Join(t.TempDir(), "weir")
	cmd := exec.Command(gobin, "build", "-o", exe, "github.com/weir-storage/weir/cmd/weir")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return exe
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

// TestSupervisor runs the services as processes the way `weir up` does:
// both become ready, serve a client, report on NATS; when one is killed,
// Wait reports which one, and Stop stops the rest.
func TestSupervisor(t *testing.T) {
	exe := buildWeir(t)
	cfg := testConfig(t)
	s := &stack.Supervisor{Config: cfg, Exe: exe, Log: hclog.NewNullLogger(), Out: testOut{t}}
	if err := s.Start(); err != nil {
		s.Stop()
		t.Fatal(err)
	}
	defer s.Stop()
	pids := s.PIDs()
	if pids["metadata"] == 0 || pids["io"] == 0 {
		t.Fatalf("pids %v", pids)
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
	c.Close()

	nc, err := control.Connect(s.URL(), "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	st, err := control.Status(ctx, nc)
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
	if strings.Join(names, ",") != "weir-io,weir-metadata" {
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
	s.Stop()
	if err := syscall.Kill(pids["metadata"], 0); err == nil {
		t.Fatal("metadata still running after Stop")
	}
}

type testOut struct{ t *testing.T }

func (w testOut) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
