package conformance

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// sharedCases check what one process sees of another's changes to a file
// they both have open (Case.Peer: a second process), as processes share
// the kernel's page cache: a WriteAt that returned in one is what a ReadAt
// in the other reads, sizes included, whatever either has cached.
func sharedCases() []Case {
	return []Case{
		sharedWriteRead(),
		sharedTruncate(),
		sharedAppenders(),
		sharedDisjointWriters(),
	}
}

// readThrice reads the whole of f (size bytes) three times, so that a
// client that maps a file's cache at its third read reads from there too.
func readThrice(t *Tester, f *TFile, size int) {
	for range 3 {
		_, _ = f.ReadAt(size+10, 0)
	}
}

func sharedWriteRead() Case {
	var pf *TFile // the peer's handle, across its steps
	return Case{
		Name: "shared/writes are read by another process at once",
		Run: func(t *Tester) {
			f := t.MustOpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
			defer f.Close()
			_, _ = f.WriteAt(pattern(1, 3*4096+100), 0)
			t.Peer("open and read")
			// Partial pages, inside the size and past it.
			_, _ = f.WriteAt(pattern(2, 5000), 4096+7)
			t.Peer("read")
			_, _ = f.WriteAt(pattern(3, 300), 5*4096-10)
			t.Peer("read")
			// Sparse: far past the end, the gap reads zeros.
			_, _ = f.WriteAt(pattern(4, 10), 64*4096+3)
			t.Peer("read")
			t.Peer("stat")
		},
		Peer: map[string]func(*Tester){
			"open and read": func(t *Tester) {
				pf = t.MustOpenFile("f", os.O_RDONLY, 0)
				readThrice(t, pf, 3*4096+100)
			},
			"read": func(t *Tester) { readThrice(t, pf, 64*4096+13) },
			"stat": func(t *Tester) {
				_, _ = t.Stat("f")
				_, _ = pf.Stat()
			},
		},
	}
}

func sharedTruncate() Case {
	var pf *TFile
	return Case{
		Name: "shared/truncate while another process reads",
		Run: func(t *Tester) {
			f := t.MustOpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
			defer f.Close()
			_, _ = f.WriteAt(pattern(5, 6*4096), 0)
			t.Peer("open and read")
			_ = f.Truncate(2*4096 + 5)
			t.Peer("read")
			// Grown again: what was cut reads zeros, in the other process
			// too, however much of it that process had cached.
			_ = f.Truncate(6 * 4096)
			t.Peer("read")
			_ = t.Truncate("f", 100)
			t.Peer("read")
		},
		Peer: map[string]func(*Tester){
			"open and read": func(t *Tester) {
				pf = t.MustOpenFile("f", os.O_RDONLY, 0)
				readThrice(t, pf, 6*4096)
			},
			"read": func(t *Tester) {
				readThrice(t, pf, 6*4096)
				_, _ = pf.Stat()
			},
		},
	}
}

// record is one appended record: "<who> <n>" padded to recordLen bytes
// with the writer's letter, and a newline.
const recordLen = 100

func record(who byte, n int) []byte {
	b := bytes.Repeat([]byte{who}, recordLen)
	copy(b, fmt.Sprintf("%c %04d ", who, n))
	b[recordLen-1] = '\n'
	return b
}

const appendRecords = 300

func appendAll(t *Tester, who byte) {
	f, err := t.FS().OpenFile("log", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Errorf("open log: %v", err)
		return
	}
	defer f.Close()
	for n := range appendRecords {
		if _, err := f.Write(record(who, n)); err != nil {
			t.Errorf("append %c %d: %v", who, n, err)
			return
		}
	}
}

func sharedAppenders() Case {
	return Case{
		Name: "shared/appenders in two processes lose and overlap nothing",
		Setup: func(t *Tester) {
			t.WriteFile("log", nil, 0o644)
		},
		Run: func(t *Tester) {
			t.PeerStart("append")
			appendAll(t, 'a')
			t.PeerWait()
			// Read without recording: how the two processes' records
			// interleave is theirs.
			b, err := readAll(t.FS(), "log")
			if err != nil {
				t.Errorf("read log: %v", err)
				return
			}
			t.Check(len(b) == 2*appendRecords*recordLen, "log holds %d bytes, want %d", len(b), 2*appendRecords*recordLen)
			next := map[byte]int{'a': 0, 'b': 0}
			for off := 0; off+recordLen <= len(b); off += recordLen {
				who := b[off]
				if want := record(who, next[who]); !bytes.Equal(b[off:off+recordLen], want) {
					t.Errorf("record at %d is %q, want %q (torn, lost or out of order)", off, b[off:off+recordLen], want)
					return
				}
				next[who]++
			}
			t.Logf("records: a %d, b %d", next['a'], next['b'])
		},
		Peer: map[string]func(*Tester){"append": func(t *Tester) { appendAll(t, 'b') }},
	}
}

// Stripes of 1000 bytes (not page aligned: neighbours share pages), even
// ones written here, odd ones by the peer, at the same time.
const (
	stripeLen = 1000
	stripes   = 200
)

func writeStripes(t *Tester, odd int) {
	f, err := t.FS().OpenFile("s", os.O_RDWR, 0)
	if err != nil {
		t.Errorf("open s: %v", err)
		return
	}
	defer f.Close()
	for round := range 3 {
		for i := odd; i < stripes; i += 2 {
			if _, err := f.WriteAt(pattern(uint64(1000*round+i), stripeLen), int64(i*stripeLen)); err != nil {
				t.Errorf("stripe %d: %v", i, err)
				return
			}
		}
	}
}

func sharedDisjointWriters() Case {
	return Case{
		Name: "shared/writers of disjoint ranges in two processes",
		Setup: func(t *Tester) {
			t.WriteFile("s", make([]byte, stripes*stripeLen), 0o644)
		},
		Run: func(t *Tester) {
			t.PeerStart("write odd stripes")
			writeStripes(t, 0)
			t.PeerWait()
			want := make([]byte, 0, stripes*stripeLen)
			for i := range stripes {
				want = append(want, pattern(uint64(2000+i), stripeLen)...)
			}
			b, err := t.ReadFile("s")
			if err == nil {
				t.ExpectData(b, want)
			}
			t.Peer("check")
		},
		Peer: map[string]func(*Tester){
			"write odd stripes": func(t *Tester) { writeStripes(t, 1) },
			"check":             func(t *Tester) { _, _ = t.ReadFile("s") },
		},
	}
}

// readAll reads name whole through fsys, recording nothing.
func readAll(fsys FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
