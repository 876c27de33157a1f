package wal

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/vfs"
)

// segment builds a segment starting at first with n records.
func segment(first uint64, n int) ([]byte, []int) {
	b := segmentHeader(first)
	var offs []int
	for i := 0; i < n; i++ {
		offs = append(offs, len(b))
		b = AppendRecord(b, first+uint64(i), uint8(i%5+1), bytes.Repeat([]byte{byte(i)}, 10+i))
	}
	return b, offs
}

func TestScanSegment(t *testing.T) {
	data, offs := segment(7, 5)
	end := len(data)
	check := func(name string, d []byte, wantRecs int, wantTorn, wantCorrupt bool) {
		t.Helper()
		s, err := scanSegment("seg", d, 7)
		var ce *CorruptError
		if wantCorrupt {
			if !errors.As(err, &ce) || ce.File != "seg" {
				t.Errorf("%s: want a CorruptError, got %v", name, err)
			}
			return
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if len(s.recs) != wantRecs || (s.torn != "" || s.badHeader != "") != wantTorn {
			t.Errorf("%s: %d records, torn %q %q; want %d records, torn %v", name, len(s.recs), s.torn, s.badHeader, wantRecs, wantTorn)
		}
		for i, r := range s.recs {
			if r.LSN != 7+uint64(i) || len(r.Payload) != 10+i {
				t.Errorf("%s: record %d is %+v", name, i, r)
			}
		}
	}
	check("intact", data, 5, false, false)
	for cut := 0; cut < end; cut++ {
		want := 0
		for want < len(offs) && (want+1 == len(offs) && cut >= end || want+1 < len(offs) && offs[want+1] <= cut) {
			want++
		}
		check(fmt.Sprintf("cut at %d", cut), data[:cut], want, cut != end && cut != SegmentHeaderSize && !isOffset(offs, cut), false)
	}
	check("zero tail", append(append([]byte(nil), data...), make([]byte, 5000)...), 5, true, false)
	for i := offs[2]; i < offs[3]; i++ {
		bad := append([]byte(nil), data...)
		bad[i] ^= 0x80
		check(fmt.Sprintf("flip %d", i), bad, 0, false, true)
	}
	last := append([]byte(nil), data...)
	last[offs[4]+12] ^= 1
	check("flip in the last record", last, 4, true, false)
	gap := segmentHeader(7)
	gap = AppendRecord(gap, 7, 1, nil)
	gap = AppendRecord(gap, 9, 1, nil)
	check("LSN gap", gap, 0, false, true)
	hdr := append([]byte(nil), data...)
	hdr[3] ^= 1
	check("bad header before records", hdr, 0, false, true)
	check("bad header alone", hdr[:SegmentHeaderSize], 0, true, false)
	check("short header", data[:10], 0, true, false)
	check("empty", nil, 0, true, false)
	other, _ := segment(8, 1)
	check("header for another LSN", other, 0, false, true)
}

func isOffset(offs []int, o int) bool {
	for _, x := range offs {
		if x == o {
			return true
		}
	}
	return false
}

func TestWriterRecoverRotate(t *testing.T) {
	m := vfs.NewMem()
	o := Options{FS: m, Dir: "/w", Logger: hclog.NewNullLogger(), SegmentSize: 120}
	w, err := Create(o, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 20; i++ {
		lsn, err := w.Append(uint8(i), []byte(fmt.Sprint(i)))
		if err != nil || lsn != uint64(i) {
			t.Fatalf("append %d: lsn %d, %v", i, lsn, err)
		}
	}
	if err := w.SyncAll(); err != nil {
		t.Fatal(err)
	}
	segs := w.Segments()
	if len(segs) < 3 {
		t.Fatalf("segments %v: size rotation did not happen", segs)
	}
	if err := w.RemoveObsolete(segs[2] - 1); err != nil {
		t.Fatal(err)
	}
	if got := w.Segments(); got[0] != segs[2] {
		t.Fatalf("after RemoveObsolete(%d): %v", segs[2]-1, got)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	var got []uint64
	w, err = Recover(o, 15, func(r Record) error {
		if string(r.Payload) != fmt.Sprint(r.LSN) || r.Type != uint8(r.LSN) {
			return fmt.Errorf("record %+v", r)
		}
		got = append(got, r.LSN)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[16 17 18 19 20]" {
		t.Fatalf("replayed %v", got)
	}
	if lsn, err := w.Append(1, nil); err != nil || lsn != 21 {
		t.Fatalf("append after recovery: %d %v", lsn, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Recover(o, 1, func(Record) error { return nil }); err == nil {
		t.Fatal("recovery from before the oldest segment succeeded")
	}
	if _, err := Recover(o, 30, func(Record) error { return nil }); err == nil {
		t.Fatal("recovery past the end of the log succeeded")
	}
}

func TestRecoverRemovesTornHeader(t *testing.T) {
	m := vfs.NewMem()
	o := Options{FS: m, Dir: "/w", Logger: hclog.NewNullLogger()}
	w, _ := Create(o, 1)
	w.Append(1, []byte("a"))
	w.Rotate()
	w.Abandon()
	p := filepath.Join("/w", SegmentName(2))
	m.WriteFile(p, []byte("weir")) // the new segment's header never made it
	n := 0
	w, err := Recover(o, 0, func(Record) error { n++; return nil })
	if err != nil || n != 1 {
		t.Fatalf("recover: %d records, %v", n, err)
	}
	if lsn, err := w.Append(1, nil); err != nil || lsn != 2 {
		t.Fatalf("append: %d %v", lsn, err)
	}
	w.Close()
	if data, _ := m.ReadFile(p); len(data) <= SegmentHeaderSize {
		t.Fatalf("segment 2 not recreated: %q", data)
	}
}

func FuzzScanSegment(f *testing.F) {
	data, _ := segment(1, 4)
	f.Add(data)
	f.Add(data[:len(data)-3])
	f.Add(append(data, make([]byte, 40)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := scanSegment("f", b, 1)
		if err != nil {
			return
		}
		if s.end > int64(len(b)) {
			t.Fatalf("end %d beyond %d", s.end, len(b))
		}
		for i, r := range s.recs {
			if r.LSN != 1+uint64(i) {
				t.Fatalf("record %d has LSN %d", i, r.LSN)
			}
		}
	})
}
