package client_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
)

// BenchmarkCachedReadAt is a 4 KiB ReadAt of a resident page: the path a
// warm read takes, with no round trip.
func BenchmarkCachedReadAt(b *testing.B) {
	st := startStack(b, testConfig(b, b.TempDir(), "mem"))
	defer stopStack(b, st)
	fsys, err := st.Dial(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	data := bytes.Repeat([]byte{7}, 16<<20)
	if _, err := f.WriteAt(data, 0); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := range 4 {
		f.ReadAt(buf, int64(i)*4096)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	hits := fsys.CacheHits.Load()
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := f.ReadAt(buf, int64(rng.IntN(4096))*4096); err != nil {
			b.Fatal(err)
		}
	}
	if fsys.CacheHits.Load() == hits {
		b.Fatal("no read was served from the cache region")
	}
}

// BenchmarkCachedWriteAt is a 4 KiB WriteAt of a resident page, no fsync:
// the write stays in the IO service's cache (write-back).
func BenchmarkCachedWriteAt(b *testing.B) {
	st := startStack(b, testConfig(b, b.TempDir(), "mem"))
	defer stopStack(b, st)
	fsys, err := st.Dial(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	data := bytes.Repeat([]byte{7}, 16<<20)
	if _, err := f.WriteAt(data, 0); err != nil {
		b.Fatal(err)
	}
	buf := bytes.Repeat([]byte{9}, 4096)
	rng := rand.New(rand.NewPCG(1, 1))
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := f.WriteAt(buf, int64(rng.IntN(4096))*4096); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCachedReadAtHot reads one resident page again and again: the
// client's own cost of a read from the region, without DRAM misses.
func BenchmarkCachedReadAtHot(b *testing.B) {
	st := startStack(b, testConfig(b, b.TempDir(), "mem"))
	defer stopStack(b, st)
	fsys, err := st.Dial(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 1<<20), 0); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	for range 4 {
		f.ReadAt(buf, 8192)
	}
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := f.ReadAt(buf, 8192); err != nil {
			b.Fatal(err)
		}
	}
}
