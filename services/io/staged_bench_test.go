package iosvc_test

import (
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/config"
)

// BenchmarkStagedAppendFsync is a 4 KiB append + fsync through the client,
// services in this process on the file backend (TMPDIR decides the disk):
// for profiles of the fsync path (bench/fsync measures it properly).
func BenchmarkStagedAppendFsync(b *testing.B) {
	e := startIOWith(b, nil, nil, func(c *config.Config) {
		c.IO.Backend = "file"
		c.IO.Direct = "off"
		c.IO.CacheSize = 64 << 20
	})
	fsys := e.dial(b)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	b.ResetTimer()
	var tw, ts time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		tw += t1.Sub(t0)
		ts += time.Since(t1)
	}
	b.Logf("client: write %v/op, fsync %v/op", tw/time.Duration(b.N), ts/time.Duration(b.N))
}
