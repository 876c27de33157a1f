//go:build spdk

package stack_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// TestSPDKKillAndRestart: the IO service on SPDK Blobstore over an aio bdev
// (a file) is killed with SIGKILL mid-workload; after a restart the
// blobstore loads (dirty-shutdown recovery) and every file synced before
// the kill reads back exactly.
func TestSPDKKillAndRestart(t *testing.T) {
	exe := spdkWeir(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 512<<20); err != nil {
		t.Fatal(err)
	}
	spdkJSON := filepath.Join(dir, "spdk.json")
	if err := os.WriteFile(spdkJSON, []byte(fmt.Sprintf(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_aio_create", "params": {"name": "Aio0", "filename": %q, "block_size": 4096}}
]}]}`, disk)), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	cfgPath := filepath.Join(dir, "weir.hcl")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`data_dir = %q
io {
  backend      = "spdk"
  spdk_config  = %q
  spdk_bdev    = "Aio0"
  spdk_no_huge = true
  spdk_mem_mb  = 1024
}
`, data, spdkJSON)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	up := func() *stack.Supervisor {
		s := &stack.Supervisor{Config: cfg, ConfigPath: cfgPath, Exe: exe, Log: hclog.NewNullLogger(), Out: testOut{t}}
		if err := s.Start(); err != nil {
			s.Stop()
			t.Fatal(err)
		}
		return s
	}
	dial := func() *client.FS {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	s := up()
	c := dial()
	synced := map[string][]byte{}
	for i := range 20 {
		name := fmt.Sprintf("f%02d", i)
		content := bytes.Repeat([]byte{byte(i + 1)}, 1000+i*7919)
		f, err := c.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(content); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // synced, then more writes that are not
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			synced[name] = content
			if _, err := f.Write([]byte("unsynced tail")); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			synced[name] = append(content, "unsynced tail"...)
		}
		// Files stay open: the kill comes with handles in flight.
	}
	if err := syscall.Kill(s.PIDs()["io"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(); err == nil || !strings.Contains(err.Error(), "service io") {
		t.Fatalf("Wait after killing io: %v", err)
	}
	c.Close()
	s.Stop()

	// weir check (the fsck) reads the recovered blobstore and compares
	// it with the namespace: after the kill and a dirty load, consistent.
	// The files never fsynced may have no blob: their writes waited in
	// io's cache (write-back) and died with it, as a crash loses unsynced
	// writes on Linux.
	check := exec.Command(exe, "check", "--config", cfgPath)
	out, err := check.Output()
	if err != nil || !strings.Contains(string(out), "20 files in the namespace") || !strings.Contains(string(out), "consistent") {
		t.Fatalf("weir check after the kill: %v\n%s", err, out)
	}
	t.Logf("weir check after the kill: %s", out)

	s = up()
	defer s.Stop()
	c = dial()
	defer c.Close()
	for name, want := range synced {
		got, err := c.ReadFile(name)
		if err != nil {
			t.Fatalf("%s after kill and restart: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s after kill and restart: %d bytes, want %d (content differs: %v)", name, len(got), len(want), len(got) == len(want))
		}
	}
}
