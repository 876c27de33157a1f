package stack_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
)

// natsServer runs the nats-server binary (Debian package nats-server) with
// the configuration text conf on a free loopback port and returns its URL.
func natsServer(t *testing.T, conf string) string {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Skip("nats-server is not installed (Debian package nats-server): cannot test weir on an external NATS server")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	path := filepath.Join(t.TempDir(), "nats.conf")
	body := fmt.Sprintf("listen: 127.0.0.1:%d\n%s", port, conf)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path)
	cmd.Stdout, cmd.Stderr = testOut{t}, testOut{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(20 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server -c %s does not listen on %s\n%s", path, addr, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "nats://" + addr
}

// TestExternalNATSServer: the production layout on a real nats-server,
// configured with what `weir nats-config` prints (the README's recipe).
// The stack runs and serves clients; status works with the CLI's
// credentials; the server refuses a connection without credentials, and
// refuses the io role a grant, with its own permission checks. A server
// without that authorization is refused by weir up.
func TestExternalNATSServer(t *testing.T) {
	exe := buildWeir(t)
	cfg := testConfig(t)
	out, err := exec.Command(exe, "nats-config", "--data", cfg.DataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("weir nats-config: %v\n%s", err, out)
	}
	url := natsServer(t, string(out))
	cfg.NATS.URL = url
	s := startSupervisor(t, cfg, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if err := fsys.WriteFile("f", []byte("through an external server"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := fsys.ReadFile("f"); err != nil || string(got) != "through an external server" {
		t.Fatalf("read back %q, %v", got, err)
	}
	status, err := exec.Command(exe, "status", "--data", cfg.DataDir, "--nats-url", url).CombinedOutput()
	if err != nil || !strings.Contains(string(status), "weir-metadata") || !strings.Contains(string(status), "weir-io") {
		t.Fatalf("weir status: %v\n%s", err, status)
	}

	if nc, err := nats.Connect(url, nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("the external server admitted a connection without credentials")
	}
	creds, err := control.LoadCreds(cfg.NATS.CredsDir, control.RoleIO)
	if err != nil {
		t.Fatal(err)
	}
	opts, _ := creds.Options(cfg.NATS.Namespace, control.RoleIO)
	violations := make(chan error, 4)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish(control.SubjectsIn(cfg.NATS.Namespace).Grant, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case v := <-violations:
		if !errors.Is(v, nats.ErrPermissionViolation) {
			t.Errorf("io publishing a grant: %v, want a permissions violation", v)
		}
	case <-time.After(10 * time.Second):
		t.Error("the external server let the io role publish a grant")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}

	// The same server without the authorization block is refused.
	open := natsServer(t, "")
	cfg2 := testConfig(t)
	cfg2.NATS.URL = open
	sup := &stack.Supervisor{Config: cfg2, Exe: exe, Log: hclog.NewNullLogger()}
	if err := sup.Start(); err == nil || !strings.Contains(err.Error(), "admits connections without credentials") {
		t.Errorf("weir up on a nats-server without authorization: %v", err)
	}
	sup.Stop()

}
