package ctest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/config"
)

// TestShimMmapRefused: a MAP_SHARED mmap that io refuses (past the
// session's pins: a quarter of the 16 MiB cache) in a process that has
// not called munmap yet fails with ENOMEM; the shim's error path used to
// call the kernel's munmap through a pointer not yet resolved and crash
// the program (SIGSEGV). A smaller mapping after it works.
func TestShimMmapRefused(t *testing.T) {
	bin := buildC(t, "test_mmap_refused.c", false)
	s := &shimmed{t: t, st: startStackWith(t, func(c *config.Config) { c.IO.CacheSize = 16 << 20 }), so: buildShim(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := s.cmd(ctx, bin, "/weir/refused", strconv.Itoa(8<<20)).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	if want := "refused: Cannot allocate memory\nsmall: w\n"; string(out) != want {
		t.Fatalf("an mmap io refuses:\n%s\nwant:\n%s", out, want)
	}
}
