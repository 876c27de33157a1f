package journalproto

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestBatchRoundTrip(t *testing.T) {
	b := &Batch{ID: 7, Trim: 10, Upto: 14, Files: []BatchFile{{Blob: 3, Ino: 3}, {Blob: 9, Ino: 12, Closed: true}}}
	buf := make([]byte, b.Size()+100) // a buffer larger than the batch, as io gets
	b.Encode(buf)
	got, err := DecodeBatch(buf, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, b) {
		t.Fatalf("decoded %+v, want %+v", got, b)
	}
	bad := map[string]func([]byte){
		"count":          func(p []byte) { p[24] = 3 },
		"version":        func(p []byte) { p[28] = 2 },
		"id 0":           func(p []byte) { clear(p[0:8]) },
		"upto < trim":    func(p []byte) { p[16] = 9 },
		"flags":          func(p []byte) { p[BatchHeader+16] = 2 },
		"blob 0":         func(p []byte) { clear(p[BatchHeader : BatchHeader+8]) },
		"duplicate blob": func(p []byte) { copy(p[BatchHeader+File:], p[BatchHeader:BatchHeader+8]) },
	}
	for name, f := range bad {
		p := bytes.Clone(buf)
		f(p)
		if _, err := DecodeBatch(p, 2); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := DecodeBatch(buf[:BatchHeader+File], 2); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated: %v", err)
	}
}

func TestReportAndInodes(t *testing.T) {
	var buf [ReportSize]byte
	r := Report{Size: 5, Mtime: 6, DV: 7}
	r.Encode(buf[:])
	if got, err := DecodeReport(buf[:]); err != nil || got != r {
		t.Fatalf("report %+v %v", got, err)
	}
	Report{Size: -1, DV: 1}.Encode(buf[:])
	if _, err := DecodeReport(buf[:]); !errors.Is(err, ErrMalformed) {
		t.Errorf("negative size: %v", err)
	}
	inos := []uint64{1, 1 << 60}
	if got, err := DecodeInodes(EncodeInodes(inos)); err != nil || !reflect.DeepEqual(got, inos) {
		t.Fatalf("inodes %v %v", got, err)
	}
	if _, err := DecodeInodes([]byte{1}); !errors.Is(err, ErrMalformed) {
		t.Errorf("ragged list: %v", err)
	}
}

// FuzzDecodeBatch: any bytes decode to a valid batch or ErrMalformed,
// never a panic, and what decodes encodes back to the same bytes.
func FuzzDecodeBatch(f *testing.F) {
	b := &Batch{ID: 1, Trim: 2, Upto: 3, Files: []BatchFile{{Blob: 4, Ino: 5, Closed: true}}}
	buf := make([]byte, b.Size())
	b.Encode(buf)
	f.Add(buf, 1)
	f.Add(buf[:BatchHeader], 0)
	f.Fuzz(func(t *testing.T, p []byte, files int) {
		got, err := DecodeBatch(p, files)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if len(got.Files) != files || got.ID == 0 || got.Upto < got.Trim {
			t.Fatalf("decoded an invalid batch %+v", got)
		}
		out := make([]byte, got.Size())
		got.Encode(out)
		if !bytes.Equal(out, p[:got.Size()]) {
			t.Fatalf("re-encoded %x, read %x", out, p[:got.Size()])
		}
	})
}

// FuzzDecodeReport: any bytes decode to a valid report or ErrMalformed.
func FuzzDecodeReport(f *testing.F) {
	var buf [ReportSize]byte
	Report{Size: 1, Mtime: 2, DV: 3}.Encode(buf[:])
	f.Add(buf[:])
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := DecodeReport(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if r.Size < 0 || r.Mtime < 0 || r.DV == 0 {
			t.Fatalf("decoded an invalid report %+v", r)
		}
	})
}
