package ring

import "testing"

// Run joins segments that are adjacent in the arena, in order, and only
// those.
func TestRequestRun(t *testing.T) {
	arena := make([]byte, 1<<16)
	q := &Request{arena: arena, Segs: []Segment{{0, 4096}, {4096, 4096}, {16384, 100}, {16484, 10}, {8192, 8}, {0, 8}}}
	want := []struct{ off, n, j int }{{0, 8192, 2}, {16384, 110, 4}, {8192, 8, 5}, {0, 8, 6}}
	i := 0
	for k, w := range want {
		b, j := q.Run(i)
		if &b[0] != &arena[w.off] || len(b) != w.n || cap(b) != w.n || j != w.j {
			t.Fatalf("run %d from segment %d: %d bytes (cap %d), next %d; want %d bytes at %d, next %d",
				k, i, len(b), cap(b), j, w.n, w.off, w.j)
		}
		i = j
	}
	if i != len(q.Segs) {
		t.Fatalf("runs end at segment %d of %d", i, len(q.Segs))
	}
}
