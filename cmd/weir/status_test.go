package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// TestStatusExitCode: weir status exits 0 while both services answer
// healthy, and 1 with an entry for the missing service once one is gone
// (or when it looks in another stack's namespace), table and JSON alike.
func TestStatusExitCode(t *testing.T) {
	c := stacktest.Config(t, "")
	c.IO.Backend = "mem"
	st, err := stack.Start(c, hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	url := st.NATS.URL()

	status := func(args ...string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := runStatus(&stdout, &stderr, append([]string{"--nats-url", url, "--data", c.DataDir}, args...))
		return code, stdout.String(), stderr.String()
	}
	decode := func(out string) map[string]control.ServiceStatus {
		t.Helper()
		var list []control.ServiceStatus
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
		m := map[string]control.ServiceStatus{}
		for _, s := range list {
			m[s.Name] = s
		}
		return m
	}

	code, out, errOut := status("--json")
	if code != 0 {
		t.Fatalf("status of a healthy stack exited %d: %s%s", code, out, errOut)
	}
	if m := decode(out); len(m) != 3 || !m["weir-metadata"].Healthy || !m["weir-io"].Healthy || !m["weir-journal"].Healthy {
		t.Fatalf("status --json = %s", out)
	}

	// Another namespace: none of this stack's services is its own.
	cfg := filepath.Join(t.TempDir(), "other.hcl")
	if err := os.WriteFile(cfg, []byte("nats {\n  namespace = \"other\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = status("--json", "--config", cfg)
	if m := decode(out); code != 1 || len(m) != 3 || m["weir-metadata"].Healthy || m["weir-io"].Healthy || m["weir-journal"].Healthy {
		t.Errorf("status in another namespace exited %d: %s%s", code, out, errOut)
	}

	ctx, cancel := context.WithTimeout(context.Background(), stack.ShutdownTimeout)
	defer cancel()
	if err := st.IO.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = status("--json")
	m := decode(out)
	if code != 1 || !m["weir-metadata"].Healthy || m["weir-io"].Healthy || m["weir-io"].Error != "no reply within 2s" {
		t.Errorf("status with io gone exited %d: %s", code, out)
	}
	if !strings.Contains(errOut, "weir-io: no reply within 2s") {
		t.Errorf("status with io gone said on stderr: %q", errOut)
	}
	code, out, _ = status()
	if code != 1 || !strings.Contains(out, "weir-io") || !strings.Contains(out, "error: no reply within 2s") {
		t.Errorf("status table with io gone (exit %d):\n%s", code, out)
	}
}
