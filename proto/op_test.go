package proto

import (
	"testing"

	"github.com/weir-storage/weir/ring"
)

// TestOpcodesPinned holds every opcode to its number: the numbers are the
// ABI that C clients compile in, so a change here is a protocol change
// (bump Version) and must be deliberate.
func TestOpcodesPinned(t *testing.T) {
	pinned := []struct {
		name string
		got  uint8
		want uint8
	}{
		{"OpHello", OpHello, 0x10}, {"OpStat", OpStat, 0x11}, {"OpOpen", OpOpen, 0x12},
		{"OpClose", OpClose, 0x13}, {"OpMkdir", OpMkdir, 0x14}, {"OpRmdir", OpRmdir, 0x15},
		{"OpUnlink", OpUnlink, 0x16}, {"OpRename", OpRename, 0x17}, {"OpChmod", OpChmod, 0x18},
		{"OpChown", OpChown, 0x19}, {"OpChtimes", OpChtimes, 0x1a}, {"OpReadDir", OpReadDir, 0x1b},
		{"OpFStat", OpFStat, 0x1c}, {"OpSyncMeta", OpSyncMeta, 0x1d}, {"OpGrant", OpGrant, 0x1e},
		{"OpFChmod", OpFChmod, 0x1f}, {"OpFChown", OpFChown, 0x20}, {"OpFChtimes", OpFChtimes, 0x21},
		{"OpReopen", OpReopen, 0x22},
		{"OpRecallWait", OpRecallWait, 0x23}, {"OpDirLease", OpDirLease, 0x24},
		{"OpInherit", OpInherit, 0x25}, {"OpLock", OpLock, 0x26},
		{"OpReadlink", OpReadlink, 0x27}, {"OpSymlink", OpSymlink, 0x28}, {"OpLink", OpLink, 0x29},
		{"OpCut", OpCut, 0x2a},
		{"OpAttach", OpAttach, 0x40}, {"OpRead", OpRead, 0x41}, {"OpWrite", OpWrite, 0x42},
		{"OpTruncate", OpTruncate, 0x43}, {"OpSync", OpSync, 0x44}, {"OpGetAttr", OpGetAttr, 0x45},
		{"OpCacheMap", OpCacheMap, 0x46}, {"OpReadahead", OpReadahead, 0x47}, {"OpClaim", OpClaim, 0x48},
		{"OpClaimDir", OpClaimDir, 0x49}, {"OpRelease", OpRelease, 0x4a},
		{"OpStatFS", OpStatFS, 0x4b}, {"OpMapPin", OpMapPin, 0x4c}, {"OpMapUnpin", OpMapUnpin, 0x4d},
		{"OpMapSync", OpMapSync, 0x4e}, {"OpMapWritable", OpMapWritable, 0x4f},
		{"OpWriteLog", OpWriteLog, 0x50}, {"OpWritePin", OpWritePin, 0x51}, {"OpWriteUnpin", OpWriteUnpin, 0x52},
		{"OpSyncFS", OpSyncFS, 0x53},
	}
	seen := map[uint8]string{}
	for _, p := range pinned {
		if p.got != p.want {
			t.Errorf("%s = %#x, pinned at %#x", p.name, p.got, p.want)
		}
		if other, dup := seen[p.got]; dup {
			t.Errorf("%s and %s share opcode %#x", p.name, other, p.got)
		}
		seen[p.got] = p.name
		meta := p.got >= FirstMetadataOp && p.got <= LastMetadataOp
		io := p.got >= FirstIOOp && p.got <= LastIOOp
		if meta == io {
			t.Errorf("%s = %#x is in neither service's range, or in both", p.name, p.got)
		}
	}
	if len(pinned) != len(cOpcodes()) {
		t.Errorf("%d opcodes pinned, %d in the C header list", len(pinned), len(cOpcodes()))
	}
	if FirstMetadataOp < ring.OpFirstService {
		t.Errorf("service opcodes start at %#x, below the ring's first service opcode %#x", FirstMetadataOp, ring.OpFirstService)
	}
	if Version != MaxVersion || MinVersion > MaxVersion {
		t.Errorf("versions: min %d, max %d, current %d", MinVersion, MaxVersion, Version)
	}
}

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct {
		lo, hi, want uint32
		ok           bool
	}{
		{1, 1, 1, true}, {1, 9, MaxVersion, true}, {0, 1, 1, true},
		{MaxVersion + 1, MaxVersion + 5, 0, false}, {0, 0, 0, false}, {5, 2, 0, false},
	} {
		v, ok := Negotiate(tc.lo, tc.hi)
		if v != tc.want || ok != tc.ok {
			t.Errorf("Negotiate(%d, %d) = %d, %v; want %d, %v", tc.lo, tc.hi, v, ok, tc.want, tc.ok)
		}
	}
	if lo, hi := SplitVersionRange(VersionRange(3, 7)); lo != 3 || hi != 7 {
		t.Errorf("version range round trip: %d, %d", lo, hi)
	}
}

func TestIDs(t *testing.T) {
	id := MakeID(MaxIncarnation, 1<<CounterBits-1)
	if IncarnationOf(id) != MaxIncarnation || id&(1<<CounterBits-1) != 1<<CounterBits-1 {
		t.Errorf("MakeID at the limits = %#x", id)
	}
	if a, b := MakeID(1, 5), MakeID(2, 5); a == b || IncarnationOf(a) != 1 || IncarnationOf(b) != 2 {
		t.Errorf("ids of two incarnations: %#x, %#x", a, b)
	}
}
