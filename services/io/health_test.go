package iosvc_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/services/io/backend/faulty"
	"github.com/weir-storage/weir/services/io/backend/mem"
)

// TestHealthAfterSyncFailure: one failed blob sync makes the service
// unhealthy for good; it keeps serving reads and writes meanwhile.
func TestHealthAfterSyncFailure(t *testing.T) {
	be := faulty.New(mem.New())
	e := startIO(t, be, nil)
	if err := e.io.Health(); err != nil {
		t.Fatalf("Health of a fresh service = %v", err)
	}
	fsys := e.dial(t)
	defer fsys.Close()
	writeRead(t, fsys, "fine")
	if err := e.io.Health(); err != nil {
		t.Fatalf("Health after a good fsync = %v", err)
	}

	f, err := fsys.Create("doomed")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("not durable")); err != nil {
		t.Fatal(err)
	}
	be.Inject(faulty.FailNth(faulty.Sync, 1, syscall.EIO))
	if err := f.Sync(); err == nil {
		t.Fatal("fsync succeeded through a failing backend")
	}
	be.Inject(nil) // the device recovers: it must not matter
	err = e.io.Health()
	if err == nil || !strings.Contains(err.Error(), "storage failed") || !strings.Contains(err.Error(), "sync blob") {
		t.Fatalf("Health after a failed sync = %v, want the sticky failure", err)
	}
	writeRead(t, fsys, "still-served")
	if err := e.io.Health(); err == nil {
		t.Fatal("Health forgot the sync failure")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fsys.Close()
	if err := e.io.Shutdown(ctx); err != nil {
		t.Logf("shutdown: %v", err)
	}
	if err := e.io.Health(); err == nil || !strings.Contains(err.Error(), "shut down") {
		t.Errorf("Health after Shutdown = %v", err)
	}
}
