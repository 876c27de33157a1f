package vfs

import (
	"errors"
	"path/filepath"
	"testing"
)

func TestMemCrashKeepsOnlyDurableState(t *testing.T) {
	m := NewMem()
	f, _ := m.Create("/d/a")
	f.Write([]byte("synced"))
	if err := Sync(f); err != nil {
		t.Fatal(err)
	}
	m.SyncDir("/d")
	f.Write([]byte("+more"))
	g, _ := m.Create("/d/b") // never made durable in the directory
	g.Write([]byte("b"))
	Sync(g)
	all := func(n int) int { return n }
	none := func(int) int { return 0 }

	c := m.Crash(none, false)
	if data, err := c.ReadFile("/d/a"); err != nil || string(data) != "synced" {
		t.Fatalf("a after crash: %q %v", data, err)
	}
	if _, err := c.ReadFile("/d/b"); err == nil {
		t.Fatal("b survived without a directory sync")
	}
	if data, _ := m.Crash(all, false).ReadFile("/d/a"); string(data) != "synced+more" {
		t.Fatalf("full unsynced tail: %q", data)
	}
	if data, _ := m.Crash(all, true).ReadFile("/d/a"); string(data) != "synced\x00\x00\x00\x00\x00" {
		t.Fatalf("zeroed unsynced tail: %q", data)
	}
	m.Rename("/d/a", "/d/c")
	if _, err := m.Crash(none, false).ReadFile("/d/a"); err != nil {
		t.Fatal("an unsynced rename was durable")
	}
	m.SyncDir("/d")
	c = m.Crash(none, false)
	if _, err := c.ReadFile("/d/a"); err == nil {
		t.Fatal("a synced rename left the old name")
	}
	if names, _ := m.Snapshot().List("/d"); len(names) != 2 {
		t.Fatalf("snapshot names %v", names)
	}
}

func TestMemFaults(t *testing.T) {
	m := NewMem()
	m.FailSync = func(string) error { return ErrInjected }
	f, _ := m.Create("/x")
	if err := Sync(f); !errors.Is(err, ErrInjected) {
		t.Fatalf("sync: %v", err)
	}
	m.FailWrite = func(string) error { return ErrInjected }
	if n, err := f.Write([]byte("abcd")); n != 2 || err == nil {
		t.Fatalf("short write: %d %v", n, err)
	}
	if _, err := m.Lock("/l"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lock("/l"); err == nil {
		t.Fatal("second lock succeeded")
	}
}

func TestOSSyncAndLock(t *testing.T) {
	dir := t.TempDir()
	var fs FS = OS{}
	f, err := fs.Create(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("x"))
	if err := Sync(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := fs.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	l, err := fs.Lock(filepath.Join(dir, "LOCK"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Lock(filepath.Join(dir, "LOCK")); err == nil {
		t.Fatal("flock did not exclude a second holder")
	}
	l.Close()
}
