package ns

import (
	"bytes"
	"testing"
)

// FuzzDecodeCheckpoint: any bytes decode to an error or to a state that
// passes the structural check and re-encodes to the same bytes.
func FuzzDecodeCheckpoint(f *testing.F) {
	n, _ := newNS(f)
	fixture(f, n)
	n.mu.RLock()
	good := encodeCheckpoint(n.st, 42)
	n.mu.RUnlock()
	f.Add(good)
	f.Add(good[:ckptHeaderSize])
	f.Add(encodeCheckpoint(newState(1), 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, lsn, err := decodeCheckpoint(b)
		if err != nil {
			return
		}
		if err := s.check(false); err != nil {
			t.Fatalf("decoded state fails the check: %v", err)
		}
		again := encodeCheckpoint(s, lsn)
		if le.Uint32(b[8:]) == ckptVersion && !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs")
		}
		// A version 1 checkpoint is re-encoded as the current version,
		// which must read back to the same thing.
		if s2, lsn2, err := decodeCheckpoint(again); err != nil || lsn2 != lsn || !bytes.Equal(encodeCheckpoint(s2, lsn2), again) {
			t.Fatalf("re-encoded checkpoint does not read back: %v", err)
		}
	})
}

// FuzzDecodeRecord: any payload decodes to an error or to a record that
// re-encodes to the same bytes; applying it to a state never panics.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range []record{
		&createRec{parent: 1, ino: 2, mode: file | 0o644, time: 5, name: "a"},
		&removeRec{parent: 1, ino: 2, time: 6, flags: flagFree, name: "a"},
		&renameRec{oldParent: 1, newParent: 1, ino: 2, replaced: 3, time: 7, oldName: "a", newName: "b"},
		&setAttrRec{ino: 2, mask: setAll, mode: file | 0o600, size: 9},
		&freeRec{ino: 2},
		&bootRec{incarnation: 3, stackID: [16]byte{1}, key: [32]byte{2}},
		&deadRec{blob: 9},
		&goneRec{blob: 9},
		&allocRec{limit: 4098},
	} {
		f.Add(r.typ(), r.encode(nil))
	}
	f.Fuzz(func(t *testing.T, typ uint8, p []byte) {
		r, err := decodeRecord(typ, p)
		if err != nil {
			return
		}
		if again := r.encode(nil); !bytes.Equal(again, p) || r.typ() != typ {
			t.Fatalf("re-encoding differs")
		}
		s := newState(1)
		s.applyCreate(&createRec{parent: RootIno, ino: 2, mode: file | 0o644, name: "a"})
		s.applyCreate(&createRec{parent: RootIno, ino: 3, mode: dir | 0o755, name: "d"})
		if s.apply(r) == nil {
			if err := s.check(false); err != nil {
				t.Fatalf("record %#v applied but broke the state: %v", r, err)
			}
		}
	})
}
