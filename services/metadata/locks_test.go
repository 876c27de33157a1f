package metadata

import (
	"errors"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/proto"
)

// TestLockTable: the rules of fcntl(2) and flock(2) on one file: readers
// share, a writer excludes every other owner, an owner's new lock
// replaces its old one over the range (splitting it), unlock splits too,
// POSIX and OFD locks conflict while flock's are a space of their own,
// and a description's locks go with its last counted handle.
func TestLockTable(t *testing.T) {
	tb := newLockTable()
	a, b := lockOwner{posix: true, id: 1}, lockOwner{posix: true, id: 2}
	ofd := lockOwner{id: 77}
	rd := func(o lockOwner, s, e uint64) heldLock { return heldLock{owner: o, start: s, end: e} }
	wr := func(o lockOwner, s, e uint64) heldLock { return heldLock{owner: o, write: true, start: s, end: e} }
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	busy := func(err error, what string) {
		t.Helper()
		if !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("%s: %v, want EAGAIN", what, err)
		}
	}
	const ino = 5
	must(tb.set(ino, proto.LockPOSIX, rd(a, 0, 100), false), "a reads 0-100")
	must(tb.set(ino, proto.LockPOSIX, rd(b, 50, 150), false), "b reads 50-150 too")
	busy(tb.set(ino, proto.LockPOSIX, wr(b, 90, 95), false), "b writes where a reads")
	must(tb.set(ino, proto.LockPOSIX, wr(b, 100, 150), false), "b upgrades its own part a does not read")
	busy(tb.set(ino, proto.LockPOSIX, rd(a, 120, 130), false), "a reads where b writes")
	if l, in := tb.test(ino, proto.LockPOSIX, rd(a, 120, 121)); !in || l.owner != b || !l.write {
		t.Fatalf("test: %+v %v, want b's write lock", l, in)
	}
	// a unlocks its middle: 0-40 and 60-100 stay, b may write 40-60 (but
	// its own read lock there is replaced, not in the way).
	must(tb.set(ino, proto.LockPOSIX, rd(a, 40, 60), true), "a unlocks 40-60")
	must(tb.set(ino, proto.LockPOSIX, wr(b, 40, 60), false), "b writes 40-60")
	busy(tb.set(ino, proto.LockPOSIX, wr(b, 30, 41), false), "b writes into a's 0-40")
	busy(tb.set(ino, proto.LockPOSIX, wr(b, 59, 61), false), "b writes into a's 60-100")
	// OFD locks conflict with POSIX ones; flock's do not.
	busy(tb.set(ino, proto.LockOFD, wr(ofd, 0, proto.LockEOF), false), "an OFD write lock over POSIX locks")
	must(tb.set(ino, proto.LockFlock, wr(ofd, 0, proto.LockEOF), false), "flock beside POSIX locks")
	busy(tb.set(ino, proto.LockFlock, rd(a, 0, proto.LockEOF), false), "a second flock owner")
	// Dropping an owner (its session closed the file) frees its ranges.
	tb.dropOwner(ino, a)
	must(tb.set(ino, proto.LockPOSIX, wr(b, 0, 150), false), "b writes all after a closed")
	tb.dropOwner(ino, b)
	// The description's flock goes with its last counted handle.
	tb.count(77)
	tb.count(77)
	tb.uncount(77, ino)
	busy(tb.set(ino, proto.LockFlock, wr(a, 0, proto.LockEOF), false), "flock while one handle of its description is left")
	tb.uncount(77, ino)
	must(tb.set(ino, proto.LockFlock, wr(a, 0, proto.LockEOF), false), "flock after the description's last handle")
	tb.dropOwner(ino, a)
	// A flood of ranges ends in ENOLCK, and its unlock frees them all.
	var err error
	for i := uint64(0); err == nil; i++ {
		err = tb.set(ino, proto.LockPOSIX, rd(a, 2*i, 2*i+1), false)
	}
	if !errors.Is(err, syscall.ENOLCK) || tb.n.Load() != maxLocksPerFile {
		t.Fatalf("a flood of lock ranges: %v with %d held, want ENOLCK at %d", err, tb.n.Load(), maxLocksPerFile)
	}
	tb.dropOwner(ino, a)
	if n := tb.n.Load(); n != 0 || len(tb.files) != 0 || len(tb.origins) != 0 {
		t.Fatalf("after every owner went: %d locks, %d files, %d origins", n, len(tb.files), len(tb.origins))
	}
}

// TestLockReqDecode: OpLock's request is checked before it is used.
func TestLockReqDecode(t *testing.T) {
	good := proto.LockReq{Type: proto.LockWrite, Class: proto.LockOFD, Start: 1, End: 9}
	if r, err := proto.DecodeLockReq(good.Append(nil)); err != nil || r != good {
		t.Fatalf("round trip: %+v %v", r, err)
	}
	for _, bad := range []proto.LockReq{
		{Type: 3, End: 1}, {Class: 3, End: 1}, {Start: 5, End: 5}, {Get: true, Type: proto.LockUnlock, End: 1},
	} {
		if _, err := proto.DecodeLockReq(bad.Append(nil)); err == nil {
			t.Errorf("%+v decoded", bad)
		}
	}
	b := good.Append(nil)
	b[4] = 1
	if _, err := proto.DecodeLockReq(b); err == nil {
		t.Error("a request with padding set decoded")
	}
	if _, err := proto.DecodeLockReq(b[:10]); err == nil {
		t.Error("a short request decoded")
	}
}
