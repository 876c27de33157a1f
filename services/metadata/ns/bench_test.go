package ns

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
)

// benchNS opens a namespace on a temporary directory of the real disk.
func benchNS(b *testing.B, syncEveryOp bool) *NS {
	n, err := Open(Options{Dir: b.TempDir(), SyncEveryOp: syncEveryOp})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	return n
}

// BenchmarkCreateRelease measures Open(O_CREAT|O_EXCL) + Release of new
// files, 10,000 per directory.
func BenchmarkCreateRelease(b *testing.B) {
	for _, syncOp := range []bool{false, true} {
		b.Run(fmt.Sprintf("SyncEveryOp=%v", syncOp), func(b *testing.B) {
			n := benchNS(b, syncOp)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%10000 == 0 {
					if _, err := n.Mkdir(root, fmt.Sprintf("d%d", i/10000), 0o755); err != nil {
						b.Fatal(err)
					}
				}
				a, _, err := n.Open(root, fmt.Sprintf("d%d/f%d", i/10000, i), syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := n.Release(a.Ino); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCreateReleaseParallel shows group commit: concurrent creators
// share flushes.
func BenchmarkCreateReleaseParallel(b *testing.B) {
	n := benchNS(b, true)
	var next atomic.Int64
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a, _, err := n.Open(root, fmt.Sprintf("f%d", next.Add(1)), syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := n.Release(a.Ino); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStat measures Stat of random files among 10,000 in a directory
// two levels down.
func BenchmarkStat(b *testing.B) {
	n := benchNS(b, false)
	for _, p := range []string{"a", "a/b"} {
		if _, err := n.Mkdir(root, p, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	paths := make([]string, 10000)
	for i := range paths {
		paths[i] = fmt.Sprintf("/a/b/file-%05d", i)
		a, _, err := n.Open(root, paths[i], syscall.O_CREAT|syscall.O_WRONLY, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		n.Release(a.Ino)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.Stat(u1, paths[rng.IntN(len(paths))]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpoint measures encoding and writing a checkpoint of
// 10,000 files.
func BenchmarkCheckpoint(b *testing.B) {
	n := benchNS(b, false)
	for i := 0; i < 10000; i++ {
		a, _, err := n.Open(root, fmt.Sprintf("f%d", i), syscall.O_CREAT|syscall.O_WRONLY, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		n.Release(a.Ino)
	}
	for b.Loop() {
		n.Chmod(root, "f0", 0o600) // something new to checkpoint
		if err := n.checkpoint(); err != nil {
			b.Fatal(err)
		}
	}
}
