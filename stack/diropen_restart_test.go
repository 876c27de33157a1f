package stack_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
)

// TestDirectOpensAfterMetadataRestart: a metadata service that starts
// again counts its directory generation from its own start; io takes it
// at the resync, so snapshots of the new incarnation open files directly
// (before the fix io kept the larger generation of the old one and
// refused every snapshot until it restarted too).
func TestDirectOpensAfterMetadataRestart(t *testing.T) {
	exe := buildWeir(t)
	cfg := testConfig(t)
	url, md, _ := startPair(t, cfg)
	ctx := context.Background()
	dial := func() *client.FS {
		t.Helper()
		c, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	w := dial()
	for _, d := range []string{"a", "b"} {
		if err := w.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			if err := w.WriteFile(fmt.Sprintf("%s/f%d", d, i), []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// opensDirectly takes dir's snapshot in c and opens f2 from it.
	opensDirectly := func(c *client.FS, dir string) bool {
		t.Helper()
		before := c.Snapshots.Load()
		for _, n := range []string{"f0", "f1"} {
			if _, err := c.ReadFile(dir + "/" + n); err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(10 * time.Second); c.Snapshots.Load() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no snapshot of %s", dir)
			}
		}
		direct := c.DirectOpens.Load()
		if b, err := c.ReadFile(dir + "/f2"); err != nil || string(b) != "data" {
			t.Fatalf("read %s/f2: %q %v", dir, b, err)
		}
		return c.DirectOpens.Load() == direct+1
	}
	c := dial()
	if !opensDirectly(c, "a") {
		t.Fatal("no direct open before the restart")
	}
	if err := w.Remove("a/f5"); err != nil { // moves the generation on
		t.Fatal(err)
	}
	md.stop()
	startService(t, exe, "metadata", cfg, url)
	// A snapshot lists only files whose size io reported to this
	// incarnation (a first grant through io does): read them once.
	w2 := dial()
	for i := range 6 {
		if _, err := w2.ReadFile(fmt.Sprintf("b/f%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	c2 := dial()
	if !opensDirectly(c2, "b") {
		t.Fatal("no direct open after the metadata service restarted")
	}
}
