package stack_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
)

// smallFS mounts a tmpfs of size bytes for the test (root only) and
// returns a configuration whose data directory is on it.
func smallFS(t *testing.T, size int64) *config.Config {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a small file system needs root (mount -t tmpfs): not root")
	}
	dir := t.TempDir()
	mnt := filepath.Join(dir, "fs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("cannot mount a %d-byte tmpfs: %v", size, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	c, err := stack.LocalConfig(filepath.Join(mnt, "data"), filepath.Join(dir, "run"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ioHealth returns io's health error text ("" when healthy).
func ioHealth(t *testing.T, cfg *config.Config, url string) string {
	t.Helper()
	nc, err := stack.Connect(cfg, url, control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := control.Status(ctx, nc, cfg.NATS.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range st {
		if x.Name == "weir-io" && !x.Healthy {
			return x.Error
		}
	}
	return ""
}

// TestFullDisk fills a 48 MiB file system through weir: the write that
// does not fit fails with ENOSPC (an fsync never waits for ever), io says
// the store is full, every fsynced file survives a stop and a start on
// the full file system, and once files are removed the stack writes
// again. The default 64 MiB staging log is made smaller to fit.
func TestFullDisk(t *testing.T) {
	cfg := smallFS(t, 48<<20)
	url, md, iop, jr := startTrio(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dial := func() *client.FS {
		fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
		if err != nil {
			t.Fatal(err)
		}
		return fsys
	}
	fsys := dial()
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	synced := 0
	var full error
	for i := 0; i < 80 && full == nil; i++ {
		f, err := fsys.OpenFile(fmt.Sprintf("f%02d", i), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			full = err
			break
		}
		done := make(chan error, 1)
		go func() {
			_, err := f.Write(body)
			if err == nil {
				err = f.Sync()
			}
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			t.Fatalf("file %d: write + fsync did not return within a minute on a full store", i)
		}
		f.Close()
		if err != nil {
			full = err
			break
		}
		synced++
	}
	if !errors.Is(full, syscall.ENOSPC) {
		t.Fatalf("after %d files of 1 MiB on 48 MiB: %v, want ENOSPC", synced, full)
	}
	if h := ioHealth(t, cfg, url); !strings.Contains(h, "full") {
		t.Errorf("io's health on a full store: %q, want it to say the store is full", h)
	}
	// Metadata on a full store: a create that needs the WAL either works
	// (its reserved room) or says ENOSPC, never EIO.
	for i := range 2000 {
		f, err := fsys.Create(fmt.Sprintf("empty%04d", i))
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("create %d on a full store: %v, want ENOSPC", i, err)
			}
			break
		}
		f.Close()
	}
	fsys.Close()

	// A clean stop and a start on the full file system.
	jr.stop()
	md.stop()
	iop.stop()
	url, _, _, _ = startTrio(t, cfg)
	fsys = dial()
	defer fsys.Close()
	for i := range synced {
		got, err := fsys.ReadFile(fmt.Sprintf("f%02d", i))
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("f%02d after the restart: %d bytes, %v", i, len(got), err)
		}
	}
	// Room again: remove files, write one more.
	for i := range min(synced, 8) {
		if err := fsys.Remove(fmt.Sprintf("f%02d", i)); err != nil {
			t.Fatalf("remove on a full store: %v", err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := writeFile(fsys, "again", body)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ENOSPC) || time.Now().After(deadline) {
			t.Fatalf("write after 8 MiB were freed: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the deletes run in the background
	}
	if h := ioHealth(t, cfg, url); h != "" {
		t.Errorf("io's health once room was freed: %q", h)
	}
}

// TestFullDiskMetadata fills the file system outside weir: creates fail
// with ENOSPC, not EIO, and work again once room is freed, without a
// restart.
func TestFullDiskMetadata(t *testing.T) {
	cfg := smallFS(t, 48<<20)
	startTrio(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	filler := filepath.Join(filepath.Dir(cfg.DataDir), "filler")
	fillUp(t, filler)
	var refused error
	for i := range 50000 {
		if err := fsys.Mkdir(fmt.Sprintf("d%05d", i), 0o755); err != nil {
			refused = err
			break
		}
	}
	if !errors.Is(refused, syscall.ENOSPC) {
		t.Fatalf("mkdir on a full file system: %v, want ENOSPC", refused)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Mkdir("after", 0o755); err != nil {
		t.Fatalf("mkdir once room was freed: %v", err)
	}
	d, err := fsys.OpenFile(".", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatalf("directory fsync once room was freed: %v", err)
	}
	d.Close()
}

// fillUp writes path until its file system is full.
func fillUp(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}
