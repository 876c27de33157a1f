package stack_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/metadata"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// TestReadOnlyNamespaceStillServesReads: when the metadata WAL fails
// before the IO service's resync (which records the allocation limit),
// the namespace is read-only and the service unhealthy, but io is
// resynchronised with the limit recorded before and files still read.
func TestReadOnlyNamespaceStillServesReads(t *testing.T) {
	c := stacktest.Config(t, "")
	log := hclog.NewNullLogger()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := stack.Start(c, log)
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile("f", []byte("readable"), 0o644); err != nil {
		t.Fatal(err)
	}
	fsys.Close()
	if err := st.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	var failing atomic.Bool
	st, err = stack.StartWith(c, log, stack.Hooks{
		Metadata: func(o *metadata.Options) {
			o.NS.FailSync = func(path string) error {
				if failing.Load() {
					return fmt.Errorf("injected failure of %s: %w", path, syscall.EIO)
				}
				return nil
			}
		},
		// Runs after the metadata service started, before io connects.
		IO: func(*iosvc.Options) { failing.Store(true) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	if err := st.Metadata.Health(); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("metadata health with a failed WAL: %v", err)
	}
	fsys, err = client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatalf("dial with a read-only namespace: %v", err)
	}
	defer fsys.Close()
	if b, err := fsys.ReadFile("f"); err != nil || string(b) != "readable" {
		t.Fatalf("read with a read-only namespace: %q %v", b, err)
	}
	if err := fsys.WriteFile("g", nil, 0o644); err == nil {
		t.Error("a create succeeded in a read-only namespace")
	}
}
