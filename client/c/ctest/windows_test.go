package ctest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"testing"
	"time"
)

// TestShimWriteWindows: overwrites through the shim that land in a warm
// write window are stores into io's cache with no round trip (the io
// service's window_pages counts the pages its drains made dirty), and
// still as the kernel's page cache: another process reads them at once;
// another process's fsync of the file stages them (as the kernel's fsync
// writes every dirty page of the inode); the stores of a writer killed
// with SIGKILL reach the device (its session's end drains its log); after
// a restart every store is there.
func TestShimWriteWindows(t *testing.T) {
	need(t, "python3", "python3")
	s, restart := restartable(t)
	stat := func(name string) uint64 {
		v, _ := s.st.IO.Snapshot()[name].(uint64)
		return v
	}
	const pages = 512 // one window
	s.sh("python3", fmt.Sprintf(`
import os
fd = os.open('/weir/ww', os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(fd, b'.' * (%d * 4096 + 1000), 0)
os.fsync(fd)
`, pages))
	// What an fsync makes durable is staged (a record in the staging log)
	// or written home (a file with more changed pages than a record
	// takes: write-back, then a home sync).
	durable := func() uint64 { return stat("staging_pages") + stat("cache_writeback_pages") }
	staged0, drained0 := durable(), stat("window_pages")

	// The writer: rounds 0-7 over every page of the window, then round 8
	// when told, then it waits to be killed.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := s.cmd(ctx, "python3", "-c", fmt.Sprintf(`
import os, sys
fd = os.open('/weir/ww', os.O_RDWR)
def round(r):
    for p in range(%d):
        os.pwrite(fd, b'r%%d p%%03d' %% (r, p), p * 4096 + 7)
for r in range(8):
    round(r)
print('stored', flush=True)
sys.stdin.readline()
round(8)
print('again', flush=True)
sys.stdin.readline()
`, pages))
	in, err := w.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Process.Kill()
	lines := bufio.NewReader(outp)
	expect := func(want string) {
		t.Helper()
		if l, err := lines.ReadString('\n'); err != nil || l != want+"\n" {
			t.Fatalf("the writer said %q, %v; want %q", l, err, want)
		}
	}
	expect("stored")

	check := fmt.Sprintf(`
import os
fd = os.open('/weir/ww', os.O_RDONLY)
bad = [p for p in range(%d) if os.pread(fd, 7, p * 4096 + 7) != b'r%%d p%%03d' %% (R, p)]
print('bad', bad[:5], len(bad))
`, pages)
	// Another process reads the stores at once, and its fsync stages
	// them.
	out := s.sh("python3", "R = 7\n"+check+"os.fsync(fd)\nprint('fsynced')\n")
	if out != "bad [] 0\nfsynced\n" {
		t.Fatalf("another process's reads of the writer's stores:\n%s", out)
	}
	staged, drained := durable()-staged0, stat("window_pages")-drained0
	t.Logf("fsync of another process: %d pages staged or written home, %d drained from write windows", staged, drained)
	if drained < pages/2 {
		t.Fatalf("%d pages drained from write windows, want most of the %d written: the writes did not take the windows' path", drained, pages)
	}
	if staged < pages {
		t.Fatalf("another process's fsync staged or wrote home %d pages, want the %d the writer stored into", staged, pages)
	}

	// Round 8, then SIGKILL: the session's end makes the stores dirty.
	if _, err := io.WriteString(in, "\n"); err != nil {
		t.Fatal(err)
	}
	expect("again")
	if err := w.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	w.Wait()
	restart()
	if out := s.sh("python3", "R = 8\n"+check); out != "bad [] 0\n" {
		t.Fatalf("after the writer's SIGKILL and a restart:\n%s", out)
	}
}

// TestShimWriteWindowsThreads: write windows under threads and fork
// (test_windows.c): four threads store round after round into their own
// pages through one descriptor while another fdatasyncs and another
// reads, a thread writes through a descriptor it closes and opens again
// (its windows released beside the others' stores), and a forked child
// writes through its own session; every page holds its writer's last
// round, before and after a restart of the services.
func TestShimWriteWindowsThreads(t *testing.T) {
	bin := buildC(t, "test_windows.c", false)
	s, restart := restartable(t)
	run := func(mode string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := s.cmd(ctx, bin, mode, "/weir/tw").CombinedOutput()
		if err != nil || string(out) != "ok\n" {
			t.Fatalf("test_windows %s: %v\n%s", mode, err, out)
		}
	}
	drained := func() uint64 { v, _ := s.st.IO.Snapshot()["window_pages"].(uint64); return v }
	run("write")
	if drained() == 0 {
		t.Fatal("no page was drained from a write window: the stores did not take the windows' path")
	}
	t.Logf("%d pages drained from write windows", drained())
	restart()
	run("verify")
}
