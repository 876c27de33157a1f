package stack_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/proto"
)

// rawDirDial is rawDial with the features direct opens need.
func rawDirDial(t *testing.T, cfg *config.Config) *rawSession {
	t.Helper()
	return rawDialFeatures(t, cfg, proto.FeatureLeases|proto.FeatureCaps|proto.FeatureOpenCap|proto.FeatureDirOpen)
}

// snapshotCap returns the capability of dir/name in dir's snapshot.
func (s *rawSession) snapshotCap(t *testing.T, dir, name string) []byte {
	t.Helper()
	out := make([]byte, 32<<10)
	c := rawDo(t, s.meta, proto.OpDirLease, proto.RootHandle, 0, (&proto.ReadDirReq{Path: dir}).Append(nil), out)
	if c.Result < 0 {
		t.Fatalf("snapshot of %s: %v", dir, syscall.Errno(-c.Result))
	}
	ents, err := proto.DecodeSnapEntries(out[:c.Result])
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name == name {
			return e.Cap[:]
		}
	}
	t.Fatalf("%s not in the snapshot of %s", name, dir)
	return nil
}

// claimDir presents cp on s's IO ring and releases the direct open it
// gets; it returns the result (negative: an errno).
func (s *rawSession) claimDir(t *testing.T, cp []byte) int64 {
	t.Helper()
	in := make([]byte, proto.ClaimDirSize)
	copy(in, cp)
	c := rawDo(t, s.data, proto.OpClaimDir, 0, 0, in, nil)
	if c.Result < 0 {
		return c.Result
	}
	rawDo(t, s.data, proto.OpRelease, c.Aux, 0, nil, nil)
	return 0
}

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
	// A raw session's snapshot, taken before metadata dies: once io
	// lost its metadata session, it honours no direct open until a
	// resync (the next incarnation may answer changes before it knows
	// of the snapshots out).
	raw := rawDirDial(t, cfg)
	cp := raw.snapshotCap(t, "a", "f3")
	if h := raw.claimDir(t, cp); h < 0 {
		t.Fatalf("claim before the stop: %v", syscall.Errno(-h))
	}
	md.kill(t) // (a clean stop revokes its sessions' grants first)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		h := raw.claimDir(t, cp)
		if h == -int64(syscall.EKEYREJECTED) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("io still answers %d to a direct open 10 s after the metadata service stopped", h)
		}
	}
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
