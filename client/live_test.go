package client_test

import (
	"bytes"
	"os"
	"testing"
	"time"
)

// TestStatOfFileBeingWritten: while one session holds a file open for
// writing, another session's stat sees every write that returned (size
// and mtime) from io's live table, with no weir.io.live query; once the
// writer closed, stat answers from the namespace as before, with the
// size io reported at the revoke.
func TestStatOfFileBeingWritten(t *testing.T) {
	a, st := newFS(t)
	b := dialStack(t, st)
	stat := func(k string) uint64 { return st.Metadata.Snapshot()[k].(uint64) }
	w, err := a.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(bytes.Repeat([]byte{1}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	queries, table := stat("live_queries"), stat("live_from_table")
	var last time.Time
	for i := 1; i <= 5; i++ {
		if i > 1 {
			if _, err := w.WriteAt([]byte{byte(i)}, int64(4096*i-1)); err != nil {
				t.Fatal(err)
			}
		}
		fi, err := b.Stat("f")
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != int64(4096*i) {
			t.Fatalf("stat after write %d: size %d, want %d", i, fi.Size(), 4096*i)
		}
		if fi.ModTime().Before(last) {
			t.Fatalf("stat after write %d: mtime %v went back from %v", i, fi.ModTime(), last)
		}
		last = fi.ModTime()
	}
	if q, tb := stat("live_queries")-queries, stat("live_from_table")-table; q != 0 || tb != 5 {
		t.Errorf("5 stats of a file being written: %d NATS live queries, %d from the table; want 0, 5", q, tb)
	}
	if err := w.Truncate(10); err != nil {
		t.Fatal(err)
	}
	if fi, err := b.Stat("f"); err != nil || fi.Size() != 10 {
		t.Fatalf("stat after truncate: %v %v, want size 10", fi, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	table = stat("live_from_table")
	if fi, err := b.Stat("f"); err != nil || fi.Size() != 10 {
		t.Fatalf("stat after the writer closed: %v %v, want size 10", fi, err)
	}
	if stat("live_from_table") != table {
		t.Error("a stat of a file no one writes read the live table")
	}
}
