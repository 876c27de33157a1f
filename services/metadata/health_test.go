package metadata_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/services/metadata"
	"github.com/weir-storage/weir/services/metadata/ns"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// TestHealthAfterWALFailure: a failed WAL flush makes the namespace
// read-only, and the service says so in Health until it is restarted, and
// on its health endpoint, which it registers itself (an embedder gets it
// without stack or cmd/weir).
func TestHealthAfterWALFailure(t *testing.T) {
	c := stacktest.Config(t, "")
	log := hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn})
	creds, err := stack.Prepare(c, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := control.StartEmbedded(control.EmbeddedOptions{Listen: c.NATS.Listen, Users: creds.Users(c.NATS.Namespace), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := stack.ConnectWith(creds, c, srv.URL(), control.RoleMetadata, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	var failing atomic.Bool
	opts := stack.MetadataOptions(c, nc, log)
	opts.NS.FailSync = func(path string) error {
		if failing.Load() {
			return fmt.Errorf("injected failure of %s: %w", path, syscall.EIO)
		}
		return nil
	}
	s, err := metadata.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Health(); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Errorf("Health before Start = %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	shut := false
	t.Cleanup(func() {
		if !shut {
			_ = s.Shutdown(context.Background())
		}
	})
	if err := s.Health(); err != nil {
		t.Fatalf("Health of a fresh service = %v", err)
	}

	failing.Store(true)
	if _, err := s.NS().Mkdir(ns.Cred{}, "d", 0o755); err != nil {
		t.Fatal(err) // group commit: the record is written, the flush comes later
	}
	if err := s.NS().Sync(); err == nil {
		t.Fatal("Sync succeeded through a failing fsync")
	}
	failing.Store(false) // the device recovers: it must not matter
	err = s.Health()
	if err == nil || !strings.Contains(err.Error(), "read-only") || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("Health after a failed WAL flush = %v, want the sticky failure", err)
	}
	time.Sleep(2 * c.Metadata.SyncInterval) // a later flush attempt changes nothing
	if err := s.Health(); err == nil {
		t.Fatal("Health forgot the WAL failure")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := stack.ConnectWith(creds, c, srv.URL(), control.RoleCLI, log)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := control.Status(ctx, cli, c.NATS.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Name != metadata.ServiceName || st[0].Healthy || !strings.Contains(st[0].Error, "injected failure") {
		t.Fatalf("status = %+v, want one unhealthy %s with the WAL failure", st, metadata.ServiceName)
	}

	_ = s.Shutdown(ctx) // reports the WAL failure too
	shut = true
	if err := s.Health(); err == nil || !strings.Contains(err.Error(), "shut down") {
		t.Errorf("Health after Shutdown = %v", err)
	}
}
