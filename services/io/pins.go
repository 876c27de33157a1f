package iosvc

import (
	"sync"
	"syscall"

	"github.com/weir-storage/weir/services/io/backend"

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
// may pin at most a quarter of it and all sessions half, so that pins
// never starve the cache (ENOMEM beyond).

// pinRec is one pinned range of a session.
type pinRec struct {
	r      *region
	id     backend.BlobID
	p0, p1 uint64
}

// sessionPins are a session's pinned ranges.
type sessionPins struct {
	mu    sync.Mutex
	list  []pinRec
	pages int64
}

// maxPinPages bounds one OpMapPin (4 GiB of a file), and maxPinPastEnd
// how far past the file's end a pin may reach.
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

// pinnedLocked reports whether page p is pinned; bmu is held.
func (r *region) pinnedLocked(p uint64) bool { return r.pins[p] != 0 }

// pinned reports whether page p is pinned.
func (r *region) pinned(p uint64) bool {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	return r.pinnedLocked(p)
}

// mapPin serves OpMapPin: Handle (readable), Offset (page aligned), Arg =
// pages. It grows the region to cover them, fills those inside the file,
// and pins them all; 0 once they are resident.
func (s *session) mapPin(q *ring.Request) (int64, uint64) {
	g, e := s.mappable(q)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	n := uint64(q.Arg)
	if q.Offset%cache.PageSize != 0 || n == 0 || n > maxPinPages || q.Offset > cache.MaxCapacity ||
		n*cache.PageSize > cache.MaxCapacity-q.Offset {
		return fail(syscall.EINVAL)
	}
	r := s.svc.regionOf(g.blob)
	if r == nil {
		return fail(syscall.EOPNOTSUPP)
	}
	// A region grows to cover what is pinned, and io maps all of it: a
	// reader may not make it grow far past the file's end (the file's
	// writers can, as their writes do).
	if end := q.Offset + n*cache.PageSize; end > uint64(max(g.blob.logical(), 0))+maxPinPastEnd {
		return fail(syscall.ENOMEM)
	}
	pc := s.svc.pc
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	if s.pins.pages+int64(n) > pc.limit/4 || pc.pinned.Add(int64(n)) > pc.limit/2 {
		if s.pins.pages+int64(n) <= pc.limit/4 {
			pc.pinned.Add(-int64(n))
		}
		return fail(syscall.ENOMEM)
	}
	p0 := q.Offset / cache.PageSize
	p1 := p0 + n
	unpin := func() {
		r.unpinRange(p0, p1)
		pc.pinned.Add(-int64(n))
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		pc.pinned.Add(-int64(n))
		return fail(syscall.EBADF)
	}
	if _, err := r.covering(p1 - 1); err != nil {
		pc.pinned.Add(-int64(n))
		return fail(errno(err))
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
			return fail(errno(err))
		}
		// Busy pages (a write in flight) are resident once it ends; a page
		// the memfd could not take is not.
		for p := p0; p < pe; p++ {
			if !r.isResident(p) {
				r.trunc.RUnlock()
				unpin()
				return fail(syscall.ENOMEM)
			}
		}
	}
	r.trunc.RUnlock()
	s.pins.list = append(s.pins.list, pinRec{r, g.blob.id, p0, p1})
	s.pins.pages += int64(n)
	return 0, 0
}

// isResident reports whether page p is resident (io's own record).
func (r *region) isResident(p uint64) bool {
	r.bmu.Lock()
	res := bitGet(r.res, p)
	r.bmu.Unlock()
	return res
}

// mapUnpin serves OpMapUnpin: the range of an earlier OpMapPin of the
// same file (EINVAL: none).
func (s *session) mapUnpin(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accAny)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	p0 := q.Offset / cache.PageSize
	p1 := p0 + uint64(q.Arg)
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	for i, pr := range s.pins.list {
		if pr.id == g.blob.id && pr.p0 == p0 && pr.p1 == p1 && q.Offset%cache.PageSize == 0 {
			s.pins.list = append(s.pins.list[:i], s.pins.list[i+1:]...)
			s.releasePinLocked(pr)
			return 0, 0
		}
	}
	return fail(syscall.EINVAL)
}

// releasePinLocked takes back one pinned range; s.pins.mu is held.
func (s *session) releasePinLocked(pr pinRec) {
	pr.r.unpinRange(pr.p0, pr.p1)
	n := int64(pr.p1 - pr.p0)
	s.pins.pages -= n
	s.svc.pc.pinned.Add(-n)
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
