package iosvc

import (
	"fmt"
	"math/bits"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/proto/cache"
	"github.com/weir-storage/weir/ring"
)

// Write windows (docs/cache-abi.md §7): a write that overwrites bytes of
// the file in pages the client has pinned is the client's own store into
// the cache, with no round trip. The client holds the data memfd
// read-write (OpMapWritable) and the session's write log (OpWriteLog), a
// memfd of proto.WriteLogSlots slots; OpWritePin pins one window of
// proto.WindowPages pages (filled, never evicted, as OpMapPin's) in a
// slot. After each store the client sets the page's bit in the slot. io
// drains the slots of a file (turns their bits into dirty pages, changed
// for the next fsync's record) before it makes the file durable or reads
// it past the cache: at the file's fsync, whoever asks for it, at every
// pass of the flusher, before an O_DIRECT read, at OpWriteUnpin and at the
// session's end. So a store the client made before any fsync of the file
// began is in that fsync (as the kernel's fsync writes every dirty page of
// the inode, whichever process dirtied it), and one made by a process that
// then died reaches the device with the next write-back.
//
// The log is the client's memory as much as io's: a bit of a slot with no
// window, or of a page past the file's end, is ignored, and a bit of a
// page of the window costs a write-back of a page the client may write
// anyway. Nothing else is read from it. The client keeps the file's mtime
// current itself (it takes a window's path only while the region's field
// group shows an mtime of the last millisecond, and writes through the
// ring otherwise, once a millisecond at most), so a drain does not change
// the mtime.

// window is a write window pinned in one of a session's slots.
type window struct {
	s    *session
	slot int
	r    *region
	ob   *openBlob
	p0   uint64

	mu   sync.Mutex // serialises drains; gone is protected by it
	gone bool       // unpinned: its slot may hold another window's bits
}

// writeLog is a session's write log: made at its first OpWriteLog.
type writeLog struct {
	mu    sync.Mutex // protects the fields below
	f     *os.File   // the memfd, io's description (the client's is made at each OpWriteLog)
	mem   []byte     // io's mapping of it
	slots [proto.WriteLogSlots]*window
}

// writeLogFile serves OpWriteLog: the session's log, made at the first
// call, passed on the session socket.
func (s *session) writeLogFile(q *ring.Request) (int64, uint64) {
	s.wlog.mu.Lock()
	defer s.wlog.mu.Unlock()
	if s.wlog.f == nil {
		if err := s.wlog.make(); err != nil {
			s.svc.log.Error("write log: a memfd could not be made", "error", err)
			return fail(syscall.ENOMEM)
		}
	}
	rw, err := withRelief(s.svc, func() (*os.File, error) { return describe(s.wlog.f, true) })
	if err != nil {
		return fail(s.svc.descriptorErrno(err))
	}
	defer rw.Close()
	tag := s.tags.Add(1)
	if e := s.sendFile(tag, rw); e != 0 {
		return fail(e)
	}
	return 0, tag
}

// make creates the log: a memfd of WriteLogSize bytes sealed against any
// change of its size, so that no client can make io's loads fault.
func (l *writeLog) make() error {
	f, err := newMemfd("weir-write-log", proto.WriteLogSize)
	if err != nil {
		return err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, proto.WriteLogSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return fmt.Errorf("map the write log: %w", err)
	}
	l.f, l.mem = f, mem
	return nil
}

// writePin serves OpWritePin: Handle (reads and writes, not a direct
// open's), Offset = the window's first byte (a multiple of WindowPages
// pages), Arg = a free slot of the log, which must exist.
func (s *session) writePin(q *ring.Request) (int64, uint64) {
	g, e := s.writableMappable(q)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	const wbytes = proto.WindowPages * cache.PageSize
	if q.Arg >= proto.WriteLogSlots || q.Offset%wbytes != 0 || q.Offset > cache.MaxCapacity-wbytes {
		return fail(syscall.EINVAL)
	}
	slot := int(q.Arg)
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	s.wlog.mu.Lock()
	if s.wlog.mem == nil {
		s.wlog.mu.Unlock()
		return fail(syscall.EINVAL) // no log yet: OpWriteLog first
	}
	if s.wlog.slots[slot] != nil {
		s.wlog.mu.Unlock()
		return fail(syscall.EBUSY)
	}
	s.wlog.mu.Unlock()
	p0 := q.Offset / cache.PageSize
	r, e := s.pinLocked(g, p0, proto.WindowPages, false, slot)
	if e != 0 {
		return fail(e)
	}
	w := &window{s: s, slot: slot, r: r, ob: g.blob, p0: p0}
	s.wlog.mu.Lock()
	swapSlot(s.wlog.mem, slot) // bits from before the pin are no store into it
	s.wlog.slots[slot] = w
	storeWord(s.wlog.mem, liveOff(slot), 1)
	s.wlog.mu.Unlock()
	r.addWindow(w)
	s.svc.Stats.WindowPins.Add(1)
	return 0, 0
}

// writeUnpin serves OpWriteUnpin: Arg = a slot in use (EINVAL: not). Its
// window is drained and unpinned, and the slot free.
func (s *session) writeUnpin(q *ring.Request) (int64, uint64) {
	if q.Arg >= proto.WriteLogSlots {
		return fail(syscall.EINVAL)
	}
	slot := int(q.Arg)
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	for i, pr := range s.pins.list {
		if pr.slot == slot {
			s.pins.list = append(s.pins.list[:i], s.pins.list[i+1:]...)
			s.releasePinLocked(pr) // endWindow
			return 0, 0
		}
	}
	return fail(syscall.EINVAL)
}

// endWindow drains the window in slot and frees the slot; the caller
// takes back its pin. s.pins.mu is held.
//
// The live word goes to 0 before the last drain's swap, both sequentially
// consistent, as the client's OR of a page's bit comes before its load of
// the live word: a client that still sees it 1 set its bit before the
// swap, which takes it; one that sees 0 writes again through the ring.
// The window leaves the region's list only once drained and gone, so an
// fsync of the file that races the end either drains it or waits on w.mu
// for this drain: its pages are dirty before that fsync takes them.
func (s *session) endWindow(slot int) {
	s.wlog.mu.Lock()
	w := s.wlog.slots[slot]
	s.wlog.mu.Unlock()
	if w == nil {
		return
	}
	w.mu.Lock()
	storeWord(s.wlog.mem, liveOff(slot), 0)
	s.svc.drainLocked(w)
	w.gone = true
	w.mu.Unlock()
	w.r.removeWindow(w)
	s.wlog.mu.Lock()
	s.wlog.slots[slot] = nil
	s.wlog.mu.Unlock()
}

// liveOff is the offset of slot's live word in the write log.
func liveOff(slot int) int { return proto.WriteLogLiveOff + slot*8 }

// endWriteLog unmaps the session's log at its end, after endPins ended
// every window.
func (s *session) endWriteLog() {
	s.wlog.mu.Lock()
	defer s.wlog.mu.Unlock()
	if s.wlog.mem != nil {
		if err := unix.Munmap(s.wlog.mem); err != nil {
			s.svc.log.Error("write log: unmap", "error", err)
		}
		s.wlog.mem = nil
	}
	if s.wlog.f != nil {
		s.wlog.f.Close()
	}
	s.wlog.f = nil
}

// drain turns the bits of w's slot into dirty pages, unless w is gone.
func (svc *Service) drain(w *window) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.gone {
		svc.drainLocked(w)
	}
}

// drainLocked is drain with w.mu held and w not gone.
func (svc *Service) drainLocked(w *window) {
	var bm [proto.WindowPages / 64]uint64
	if !swapSlotInto(w.s.wlog.mem, w.slot, &bm) {
		return
	}
	for k := 0; k < proto.WindowPages; {
		word := bm[k/64] >> (k % 64)
		if word == 0 {
			k = (k/64 + 1) * 64
			continue
		}
		k += bits.TrailingZeros64(word)
		run := bits.TrailingZeros64(^(bm[k/64] >> (k % 64)))
		if run > 64-k%64 {
			run = 64 - k%64
		}
		if err := svc.mapDirty(w.ob, w.r, w.p0+uint64(k), w.p0+uint64(k+run), false); err != nil {
			svc.log.Error("write window: stored pages could not be made dirty; they may be lost",
				"blob", w.ob.id, "page", w.p0+uint64(k), "error", err)
		}
		svc.Stats.WindowPages.Add(uint64(run))
		k += run
	}
}

// addWindow and removeWindow keep the region's windows, which drains of
// the file find there.
func (r *region) addWindow(w *window) {
	r.wmu.Lock()
	if r.wins == nil {
		r.wins = map[*window]struct{}{}
	}
	r.wins[w] = struct{}{}
	r.nwins.Store(int64(len(r.wins)))
	r.wmu.Unlock()
}

func (r *region) removeWindow(w *window) {
	r.wmu.Lock()
	delete(r.wins, w)
	r.nwins.Store(int64(len(r.wins)))
	r.wmu.Unlock()
}

// drainRegion drains every window of r: every store a client made into
// the file's windows before it is called is a dirty page after.
func (svc *Service) drainRegion(r *region) {
	if r == nil || r.nwins.Load() == 0 {
		return
	}
	r.wmu.Lock()
	ws := make([]*window, 0, len(r.wins))
	for w := range r.wins {
		ws = append(ws, w)
	}
	r.wmu.Unlock()
	for _, w := range ws {
		svc.drain(w)
	}
}

// drainAll drains the windows of every open blob (the flusher's pass).
func (svc *Service) drainAll() {
	svc.mu.Lock()
	var rs []*region
	for _, ob := range svc.blobs {
		if r := ob.cached.Load(); r != nil && r.nwins.Load() > 0 {
			rs = append(rs, r)
		}
	}
	svc.mu.Unlock()
	for _, r := range rs {
		svc.drainRegion(r)
	}
}

// swapSlotInto moves slot's words into bm, leaving zeros; false if all
// were zero.
func swapSlotInto(mem []byte, slot int, bm *[proto.WindowPages / 64]uint64) bool {
	any := false
	for i := range bm {
		bm[i] = swapWord(mem, slot*proto.WriteSlotBytes+i*8)
		any = any || bm[i] != 0
	}
	return any
}

// swapSlot clears slot.
func swapSlot(mem []byte, slot int) {
	var bm [proto.WindowPages / 64]uint64
	swapSlotInto(mem, slot, &bm)
}
