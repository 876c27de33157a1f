package livetab

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// The slots' words are accessed with atomics on the shared mapping: the
// other process reads them concurrently. Offsets are in bounds (slot <
// slots, checked at Create and Open) and naturally aligned (the mapping
// is page-aligned, the header and slots multiples of 8).

func (t *Table) u32(off uintptr) *uint32 {
	return (*uint32)(unsafe.Pointer(unsafe.SliceData(t.mem[off : off+4])))
}

func (t *Table) u64(off uintptr) *uint64 {
	return (*uint64)(unsafe.Pointer(unsafe.SliceData(t.mem[off : off+8])))
}

func slotOff(slot uint32) uintptr { return HeaderSize + uintptr(slot)*SlotSize }

// write publishes one slot under its seqlock: it makes seq odd (waiting
// for another writer of the slot to finish), stores the fields, and makes
// seq even again. fields is called with the slot held, so that of two
// writers the later stores what it reads last (values read before the
// seqlock could go back over a newer writer's).
func (t *Table) write(slot uint32, blob uint64, fields func() (size, mtime int64, flags uint32)) {
	o := slotOff(slot)
	seq := t.u32(o)
	var s uint32
	for i := 0; ; i++ {
		s = atomic.LoadUint32(seq)
		if s&1 == 0 && atomic.CompareAndSwapUint32(seq, s, s+1) {
			break
		}
		if i&15 == 15 {
			runtime.Gosched()
		}
	}
	size, mtime, flags := fields()
	atomic.StoreUint32(t.u32(o+4), flags)
	atomic.StoreUint64(t.u64(o+8), blob)
	atomic.StoreUint64(t.u64(o+16), uint64(size))
	atomic.StoreUint64(t.u64(o+24), uint64(mtime))
	atomic.StoreUint32(seq, s+2)
}

// read loads one slot: seq before, the fields, seq after.
func (t *Table) read(slot uint32) (s1 uint32, blob uint64, flags uint32, size, mtime int64, s2 uint32) {
	o := slotOff(slot)
	seq := t.u32(o)
	s1 = atomic.LoadUint32(seq)
	flags = atomic.LoadUint32(t.u32(o + 4))
	blob = atomic.LoadUint64(t.u64(o + 8))
	size = int64(atomic.LoadUint64(t.u64(o + 16)))
	mtime = int64(atomic.LoadUint64(t.u64(o + 24)))
	s2 = atomic.LoadUint32(seq)
	return
}
