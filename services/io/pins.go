package iosvc

import (
	"slices"
	"sync"
	"syscall"

	"github.com/weir-storage/weir/services/io/backend"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/proto/cache"
	"github.com/weir-storage/weir/ring"
)

// Pins: a client that maps a file's cache region pages into its own
// address space (the C shim's MAP_SHARED mmap of a weir file) needs them
// resident for as long as they are mapped, or its loads would read the
// zeros of an evicted page. OpMapPin fills a range of pages and pins it:
// the cache evicts no pinned page, a write into a pinned page that is
// absent (past the size the mapping saw, or an O_DIRECT write) stores its
// bytes into the region too, so the mapping sees every write; OpMapUnpin
// and the session's end take the pins back. A truncate still drops pinned
// pages past the new size: they read as zeros, where Linux raises SIGBUS.
//
// Pinned pages count against the cache's size like any other; one session
// may pin at most a quarter of it, one uid's sessions together their
// share of half (limits.pins_share, limits.go), and all sessions half, so
// that pins never starve the cache nor one user another (ENOMEM beyond).
//
// A writable pin (proto.MapPinWritable, a handle that may write) is the
// range of a writable MAP_SHARED mapping of the data memfd
// (OpMapWritable): the client stores into io's cache pages, which io does
// not see happen. OpMapSync makes the range's pages dirty (and the file
// changed, for the next fsync's record and mtime), and so do the writable
// pin's OpMapUnpin and the session's end: every store reaches the device
// by the next write-back or fsync after the client synced, unmapped or
// went (msync(MS_ASYNC) and a process that dies, as with the kernel's page
// cache), and a store the client made before an fsync is in that fsync
// (the shim syncs a file's writable mappings first).

// pinRec is one pinned range of a session.
//
// A pin belongs to the grant it was made through (g) while that grant
// lasts: when the grant ends (its close, a recall by another trust group,
// a resync), endGrantPins ends the grant's write windows (drained, the
// client told through the log's live word), makes a writable pin's pages
// dirty a last time and demotes it (it keeps the blob open with a
// reference of its own until its end, or until an OpMapSync of a new
// grant that writes promotes it again), and keeps read pins (the mapping
// stays resident). So ob is open whenever a drain or a writable or
// demoted pin uses it.
type pinRec struct {
	r       *region
	ob      *openBlob // g's blob while g lasts; a demoted pin's own reference after; nil for a read pin after
	g       *grant    // the grant it was made through; nil once that ended
	id      backend.BlobID
	p0, p1  uint64
	write   bool // a writable mapping's: its pages are made dirty at its end
	demoted bool // a writable mapping's whose grant ended (write is false)
	slot    int  // a write window's (windows.go): its slot; -1 for a mapping's
}

// sessionPins are a session's pinned ranges.
type sessionPins struct {
	mu    sync.Mutex
	list  []pinRec
	pages int64
}

// maxPinPages bounds one OpMapPin (4 GiB of a file), and maxPinPastEnd
// how far past the file's end a pin may reach. Write windows count in a
// session's quarter of the cache like any pin, and all sessions' windows
// together have at most a quarter (ENOMEM past it: the client unpins the
// window it stored into least recently and tries again), so that busy
// writers never take the room MAP_SHARED mappings need (the other quarter
// of the pins' half at least), and the dirt their drains make stays within
// the dirty limit (a quarter). (A thirty-second per session, an eighth in
// all, cut fio's 4 KiB random writes over a 256 MiB file from 1.73x the
// kernel's to 0.24x: 16 windows for 128 hot ones, each miss a ring write.)
const (
	maxPinPages   = 1 << 20
	maxPinPastEnd = 1 << 30
)

// pinRange adds a pin to every page of [p0, p1); bmu is taken.
func (r *region) pinRange(p0, p1 uint64) {
	r.bmu.Lock()
	if r.pins == nil {
		r.pins = map[uint64]uint32{}
	}
	for p := p0; p < p1; p++ {
		r.pins[p]++
	}
	r.bmu.Unlock()
}

// unpinRange takes one pin off every page of [p0, p1).
func (r *region) unpinRange(p0, p1 uint64) {
	r.bmu.Lock()
	for p := p0; p < p1; p++ {
		if n := r.pins[p]; n > 1 {
			r.pins[p] = n - 1
		} else {
			delete(r.pins, p)
		}
	}
	r.bmu.Unlock()
}

// hasPins reports whether any page of r is pinned.
func (r *region) hasPins() bool {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	return len(r.pins) > 0
}

// zeroPinnedGap makes the pinned pages of [p0, p1) that are absent
// resident zero pages: an extension (a truncate, a write past the end)
// brought them inside the file, and a client mapping them may store into
// them now (Linux: legal once the file covers them), stores that must
// become dirty at its msync. The whole page is written (zeros over what
// a store past the end left). The caller holds trunc, and no page.
func (r *region) zeroPinnedGap(p0, p1 uint64) {
	r.bmu.Lock()
	var pinned []uint64
	for p := range r.pins {
		if p >= p0 && p < p1 {
			pinned = append(pinned, p)
		}
	}
	r.bmu.Unlock()
	if len(pinned) == 0 {
		return
	}
	slices.Sort(pinned)
	cr := r.cur.Load()
	for _, p := range pinned {
		if p >= cr.Pages() {
			break
		}
		w, k, err := lockPage(cr, p)
		if err != nil {
			continue
		}
		if k != cache.KindAbsent {
			_ = cr.Publish(p, w, w.Dirty())
			continue
		}
		if err := pwriteFull(int(r.dfd.Fd()), zeroPage[:], int64(cache.PageOffset(p))); err != nil {
			_ = r.punch(p, 1)
			_ = cr.Drop(p, w)
			continue
		}
		_ = cr.Publish(p, w, false)
		r.markResident(p, 1)
	}
}

// pageCeil is the first page at or past byte size.
func pageCeil(size int64) uint64 { return (uint64(max(size, 0)) + cache.PageSize - 1) / cache.PageSize }

// pinnedLocked reports whether page p is pinned; bmu is held.
func (r *region) pinnedLocked(p uint64) bool { return r.pins[p] != 0 }

// pinned reports whether page p is pinned.
func (r *region) pinned(p uint64) bool {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	return r.pinnedLocked(p)
}

// mapPin serves OpMapPin: Handle (readable), Offset (page aligned), Arg =
// pages, with proto.MapPinWritable for a writable mapping's (the handle
// must write: EBADF). It grows the region to cover them, fills those
// inside the file, and pins them all; 0 once they are resident.
func (s *session) mapPin(q *ring.Request) (int64, uint64) {
	g, e := s.mappable(q)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	write := q.Arg&proto.MapPinWritable != 0
	if write && !g.write {
		s.svc.Stats.Denied.Add(1)
		return fail(syscall.EBADF)
	}
	n := uint64(q.Arg &^ proto.MapPinWritable)
	if q.Offset%cache.PageSize != 0 || n == 0 || n > maxPinPages || q.Offset > cache.MaxCapacity ||
		n*cache.PageSize > cache.MaxCapacity-q.Offset {
		return fail(syscall.EINVAL)
	}
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	if _, e := s.pinLocked(g, q.Offset/cache.PageSize, n, write, -1); e != 0 {
		return fail(e)
	}
	return 0, 0
}

// pinLocked pins pages [p0, p0+n) of g's file for the session (a
// writable mapping's if write, write window slot's if slot >= 0): it
// grows the region to cover them, fills those inside the file and
// records the pin; s.pins.mu is held.
func (s *session) pinLocked(g *grant, p0, n uint64, write bool, slot int) (*region, syscall.Errno) {
	r := s.svc.regionOf(g.blob)
	if r == nil {
		return nil, syscall.EOPNOTSUPP
	}
	// A region grows to cover what is pinned, and io maps all of it: a
	// reader may not make it grow far past the file's end (the file's
	// writers can, as their writes do).
	if end := (p0 + n) * cache.PageSize; end > uint64(max(g.blob.logical(), 0))+maxPinPastEnd {
		return nil, syscall.ENOMEM
	}
	pc := s.svc.pc
	win := slot >= 0
	if s.pins.pages+int64(n) > pc.limit/4 {
		return nil, syscall.ENOMEM
	}
	// The uid's share of what all sessions may pin (limits.go), so that
	// one user's sessions together cannot take every pin.
	if e := s.svc.uids.pin(s.cred.Uid, int64(n), pc.limit/2, pc.limit/4, win); e != 0 {
		return nil, e
	}
	if pc.pinned.Add(int64(n)) > pc.limit/2 {
		pc.pinned.Add(-int64(n))
		s.svc.uids.unpin(s.cred.Uid, int64(n), win)
		return nil, syscall.ENOMEM
	}
	if win && pc.winPinned.Add(int64(n)) > pc.limit/4 {
		pc.winPinned.Add(-int64(n))
		pc.pinned.Add(-int64(n))
		s.svc.uids.unpin(s.cred.Uid, int64(n), win)
		return nil, syscall.ENOMEM
	}
	p1 := p0 + n
	uncount := func() {
		pc.pinned.Add(-int64(n))
		if win {
			pc.winPinned.Add(-int64(n))
		}
		s.svc.uids.unpin(s.cred.Uid, int64(n), win)
	}
	unpin := func() {
		r.unpinRange(p0, p1)
		uncount()
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		uncount()
		return nil, syscall.EBADF
	}
	if _, err := r.covering(p1 - 1); err != nil {
		uncount()
		return nil, errno(err)
	}
	// Pinned first, so that no page is evicted between its fill and the
	// check below; the truncate lock shared, as every fill takes it.
	r.pinRange(p0, p1)
	r.trunc.RLock()
	size := g.blob.logical()
	pe := min(p1, uint64(max(size, 0)+cache.PageSize-1)/cache.PageSize)
	if pe > p0 {
		if _, err := r.fill(g.blob.b, p0, pe, g.blob.logical, nil, nil); err != nil {
			r.trunc.RUnlock()
			unpin()
			return nil, errno(err)
		}
		// Busy pages (a write in flight) are resident once it ends; a page
		// the memfd could not take is not.
		for p := p0; p < pe; p++ {
			if !r.isResident(p) {
				r.trunc.RUnlock()
				unpin()
				return nil, syscall.ENOMEM
			}
		}
	}
	r.trunc.RUnlock()
	s.pins.list = append(s.pins.list, pinRec{r: r, ob: g.blob, g: g, id: g.blob.id, p0: p0, p1: p1, write: write, slot: slot})
	s.pins.pages += int64(n)
	s.svc.pinnedThrough(g, s)
	return r, 0
}

// pinnedThrough records that s pinned a range through g, for g's end.
func (svc *Service) pinnedThrough(g *grant, s *session) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if !slices.Contains(g.pinners, s) {
		g.pinners = append(g.pinners, s)
	}
}

// grantGone ends what the sessions pin through g and drops g's reference
// on its blob: g was revoked and its last request is done.
func (svc *Service) grantGone(g *grant) {
	svc.endPinsOf(g)
	svc.releaseBlob(g.blob)
}

// endPinsOf ends what the sessions pin through g (endGrantPins): the last
// drains and dirtying happen here, so a revoke's answer reads the blob's
// attributes after it.
func (svc *Service) endPinsOf(g *grant) {
	svc.mu.Lock()
	ss := g.pinners
	g.pinners = nil
	svc.mu.Unlock()
	for _, s := range ss {
		s.endGrantPins(g)
	}
}

// endGrantPins ends the pins s made through g, which ended (pinRec).
func (s *session) endGrantPins(g *grant) {
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	kept := s.pins.list[:0]
	for _, pr := range s.pins.list {
		if pr.g != g {
			kept = append(kept, pr)
			continue
		}
		if pr.slot >= 0 {
			s.releasePinLocked(pr)
			s.svc.Stats.WindowsEnded.Add(1)
			continue
		}
		if pr.write {
			if err := s.svc.mapDirty(pr.ob, pr.r, pr.p0, pr.p1, true); err != nil {
				s.svc.log.Error("writable mapping's grant ended: its pages could not be made dirty; stores through it may be lost",
					"blob", pr.id, "error", err)
			}
			// Demoted, it keeps the blob open with a reference of its own
			// (as a Linux mapping keeps its inode): the stores the client
			// goes on making (it cannot know) are made dirty at the pin's
			// end, into this blob's region, which stays.
			s.svc.mu.Lock()
			pr.ob.refs++
			s.svc.mu.Unlock()
			pr.write, pr.demoted = false, true
			s.svc.Stats.MapsDemoted.Add(1)
			pr.g = nil
			kept = append(kept, pr)
			continue
		}
		pr.g, pr.ob = nil, nil
		kept = append(kept, pr)
	}
	clear(s.pins.list[len(kept):])
	s.pins.list = kept
}

// isResident reports whether page p is resident (io's own record).
func (r *region) isResident(p uint64) bool {
	r.bmu.Lock()
	res := bitGet(r.res, p)
	r.bmu.Unlock()
	return res
}

// mapUnpin serves OpMapUnpin: the range of an earlier OpMapPin of the
// same file, writable (proto.MapPinWritable in Arg) or not as that pin
// was (EINVAL: none). A writable pin's pages are made dirty first, and so
// are a demoted one's (its grant ended: pinRec).
func (s *session) mapUnpin(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accAny)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	p0 := q.Offset / cache.PageSize
	p1 := p0 + uint64(q.Arg&^proto.MapPinWritable)
	writable := q.Arg&proto.MapPinWritable != 0
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	for i, pr := range s.pins.list {
		if pr.slot < 0 && pr.id == g.blob.id && pr.p0 == p0 && pr.p1 == p1 && q.Offset%cache.PageSize == 0 &&
			writable == (pr.write || pr.demoted) {
			s.pins.list = append(s.pins.list[:i], s.pins.list[i+1:]...)
			s.releasePinLocked(pr) // a demoted one's pages are made dirty too
			return 0, 0
		}
	}
	return fail(syscall.EINVAL)
}

// mapSync serves OpMapSync: Handle (one that writes: EBADF), Offset,
// Arg = pages, inside writable pins of the session's (EINVAL: not). The
// range's resident pages inside the file become dirty, as if written with
// the bytes they hold: what the client stored through its mapping is
// written home by the next write-back or fsync. The client calls it at
// msync and before an fsync of the file.
func (s *session) mapSync(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accWrite)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	n := uint64(q.Arg)
	if q.Offset%cache.PageSize != 0 || n == 0 || n > maxPinPages || q.Offset > cache.MaxCapacity ||
		n*cache.PageSize > cache.MaxCapacity-q.Offset {
		return fail(syscall.EINVAL)
	}
	p0 := q.Offset / cache.PageSize
	p1 := p0 + n
	s.pins.mu.Lock()
	var r *region
	var held *openBlob
	promoted := false
	for i := range s.pins.list {
		pr := &s.pins.list[i]
		if (pr.write || pr.demoted) && pr.slot < 0 && pr.id == g.blob.id && pr.p0 <= p0 && p1 <= pr.p1 {
			if pr.demoted {
				// Its grant ended (a recall, a resync): this grant of the
				// file's takes the mapping's stores from now on, and the
				// pin's own reference on the blob goes (the blob it held
				// open is this grant's: one open blob per file).
				if pr.ob != g.blob || pr.r != g.blob.cached.Load() {
					s.pins.mu.Unlock()
					return fail(syscall.EIO)
				}
				held = pr.ob
				pr.write, pr.demoted, pr.g = true, false, g
				promoted = true
			}
			r = pr.r
			break
		}
	}
	s.pins.mu.Unlock()
	if r == nil {
		return fail(syscall.EINVAL)
	}
	if promoted {
		s.svc.pinnedThrough(g, s)
		s.svc.releaseBlob(held)
	}
	if err := s.svc.mapDirty(g.blob, r, p0, p1, true); err != nil {
		return fail(errno(err))
	}
	return 0, 0
}

// mapDirty makes the resident pages of [p0, p1) inside the file dirty,
// changed for the next fsync's record, and the file modified (its mtime
// now if touch: a write window's stores took their mtime from the write
// that made it fresh, windows.go): a writable mapping's or a write
// window's client may have stored into them.
func (svc *Service) mapDirty(ob *openBlob, r *region, p0, p1 uint64, touch bool) error {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return nil
	}
	r.trunc.RLock()
	defer r.trunc.RUnlock()
	pe := min(p1, uint64(max(ob.logical(), 0)+cache.PageSize-1)/cache.PageSize)
	if pe <= p0 {
		return nil
	}
	if ob.sf != nil {
		ob.sf.markChanged(p0, pe)
	}
	lr, err := r.lock(p0, pe)
	if err != nil {
		return err
	}
	for i, w := range lr.busy {
		p := lr.p0 + uint64(i)
		if lr.was[i] == cache.KindResident {
			r.markDirty(p)
			_ = lr.cr.Publish(p, w, true)
		} else {
			_ = lr.cr.Drop(p, w)
		}
	}
	lr.busy = nil
	if touch {
		svc.touch(ob)
	} else {
		svc.changed(ob)
	}
	return nil
}

// releasePinLocked takes back one pinned range, a writable one's pages
// made dirty first; s.pins.mu is held.
func (s *session) releasePinLocked(pr pinRec) {
	if pr.slot >= 0 {
		s.endWindow(pr.slot)
	}
	if pr.write || pr.demoted {
		if err := s.svc.mapDirty(pr.ob, pr.r, pr.p0, pr.p1, true); err != nil {
			s.svc.log.Error("writable mapping's end: its pages could not be made dirty; stores through it may be lost",
				"blob", pr.id, "error", err)
		}
	}
	if pr.demoted {
		defer s.svc.releaseBlob(pr.ob) // (after the unpin below)
	}
	pr.r.unpinRange(pr.p0, pr.p1)
	n := int64(pr.p1 - pr.p0)
	s.pins.pages -= n
	s.svc.pc.pinned.Add(-n)
	if pr.slot >= 0 {
		s.svc.pc.winPinned.Add(-n)
	}
	s.svc.uids.unpin(s.cred.Uid, n, pr.slot >= 0)
}

// endPins takes back every pin of the session (its end).
func (s *session) endPins() {
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	for _, pr := range s.pins.list {
		s.releasePinLocked(pr)
	}
	s.pins.list = nil
}
