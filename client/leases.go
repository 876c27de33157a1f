package client

import (
	"cmp"
	"container/list"
	"encoding/binary"
	"sync"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// Kept leases, the client's side (proto.FeatureLeases). The metadata
// service keeps the read grant of a read-only open after its close, as
// the session's lease of the file, and names it in the answer to the next
// read-only open of the file (OpenResp.DataHandle, granted): that open
// needs no grant. Two things make such an open + read + close cost little
// more than the open's round trip:
//
//   - The file's cache mapping outlives the close, kept by data handle
//     (keptCaches): the next File opened under the same lease reads from
//     it at once, without asking the IO service for the region again. A
//     lease that ended is never named again (a new grant has a new id), so
//     a kept mapping is only ever adopted under the lease it was made in.
//   - The close of a read-only handle is not waited for: it revokes
//     nothing when the handle used or became the lease, and a read
//     grant's revoke otherwise has nothing to report: it cannot fail in a
//     way the caller could act on, as close(2) of a read-only descriptor.
//     It rides with the session's next open (lateCloses, submitted beside
//     the OpOpen with ring.Client.StartAside, so the service takes both in
//     order, most often in one wake-up), or the closer sends it
//     closeLinger later.

// maxKeptCaches bounds the mappings kept (metadata keeps at most as many
// idle leases per session).
const maxKeptCaches = 256

// keptCaches are mappings of files closed under a kept lease, by data
// handle, least recently kept first.
type keptCaches struct {
	mu     sync.Mutex
	by     map[uint64]*list.Element // protected by mu
	lru    list.List                // of *keptCache; protected by mu
	closed bool                     // the FS is closed: keep nothing; protected by mu
}

type keptCache struct {
	handle uint64
	fc     *fileCache
}

// take returns the mapping kept for data handle in session generation
// gen, which the caller now owns; nil if there is none.
func (k *keptCaches) take(handle, gen uint64) *fileCache {
	k.mu.Lock()
	e := k.by[handle]
	if e == nil {
		k.mu.Unlock()
		return nil
	}
	delete(k.by, handle)
	k.lru.Remove(e)
	k.mu.Unlock()
	fc := e.Value.(*keptCache).fc
	if fc.gen != gen {
		fc.unmap() // of sessions a recovery replaced
		return nil
	}
	return fc
}

// put keeps fc, the mapping of a file closed under the lease named
// handle, unmapping the least recently kept past maxKeptCaches (or one
// kept for handle already).
func (k *keptCaches) put(handle uint64, fc *fileCache) {
	var drop []*fileCache
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		fc.unmap() // a file closed after its FS
		return
	}
	if k.by == nil {
		k.by = map[uint64]*list.Element{}
	}
	if e := k.by[handle]; e != nil {
		drop = append(drop, e.Value.(*keptCache).fc)
		k.lru.Remove(e)
	}
	k.by[handle] = k.lru.PushBack(&keptCache{handle: handle, fc: fc})
	for k.lru.Len() > maxKeptCaches {
		e := k.lru.Front()
		kc := e.Value.(*keptCache)
		k.lru.Remove(e)
		delete(k.by, kc.handle)
		drop = append(drop, kc.fc)
	}
	k.mu.Unlock()
	for _, fc := range drop {
		fc.unmap()
	}
}

// drop unmaps every kept mapping and keeps none from then on (FS.Close).
func (k *keptCaches) drop() { k.clear(true) }

// clear unmaps every kept mapping; closing: keep none from then on.
func (k *keptCaches) clear(closing bool) {
	k.mu.Lock()
	k.closed = k.closed || closing
	var drop []*fileCache
	for e := k.lru.Front(); e != nil; e = e.Next() {
		drop = append(drop, e.Value.(*keptCache).fc)
	}
	k.lru.Init()
	k.by = nil
	k.mu.Unlock()
	for _, fc := range drop {
		fc.unmap()
	}
}

// keptCaps are the read capabilities open answered (FeatureOpenCap) of
// files closed before their first read, by data handle: the handle's
// grant became the session's kept lease, which io has not heard of until
// the capability is claimed. The next open under that lease takes it, and
// its first read claims it, instead of meeting io's EBADF and granting
// the lease through io.
type keptCaps struct {
	mu sync.Mutex
	by map[uint64]keptCap // protected by mu
}

type keptCap struct {
	gen uint64
	cap *[proto.CapSize]byte
}

// put keeps the capability c of data handle handle, minted in session
// generation gen; past maxKeptCaches one kept before goes.
func (k *keptCaps) put(handle, gen uint64, c *[proto.CapSize]byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.by == nil {
		k.by = map[uint64]keptCap{}
	}
	if _, ok := k.by[handle]; !ok && len(k.by) >= maxKeptCaches {
		for h := range k.by {
			delete(k.by, h) // any one: a capability lost costs a grant through io
			break
		}
	}
	k.by[handle] = keptCap{gen: gen, cap: c}
}

// take returns and forgets the capability kept for data handle handle in
// session generation gen; nil if there is none.
func (k *keptCaps) take(handle, gen uint64) *[proto.CapSize]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	kc, ok := k.by[handle]
	if !ok {
		return nil
	}
	delete(k.by, handle)
	if kc.gen != gen {
		return nil
	}
	return kc.cap
}

// forget drops the capability kept for data handle handle, if any: its
// grant was recalled, which spent it.
func (k *keptCaps) forget(handle uint64) {
	k.mu.Lock()
	delete(k.by, handle)
	k.mu.Unlock()
}

// clear drops every kept capability.
func (k *keptCaps) clear() {
	k.mu.Lock()
	k.by = nil
	k.mu.Unlock()
}

// closeReq is a read-only handle's close, not sent yet.
type closeReq struct {
	meta   *ring.Client // the ring it goes on
	handle uint64
	op     uint8 // 0: OpClose; OpRelease: a direct open's (direct.go), on its IO ring
}

// closerQueue bounds the closes waiting; a close that finds the queue
// full is sent at once by its caller.
const closerQueue = 256

// closeLinger is how long a queued close waits for an open to ride with
// before the closer sends it. A program that opens and closes in a loop
// sends its closes beside its opens; one that stops keeps its last
// handle open at the service this long (an unlinked file's blob goes at
// that close).
const closeLinger = time.Millisecond

// lateCloses are the closes of read-only handles not sent yet, oldest
// first.
type lateCloses struct {
	mu   sync.Mutex
	q    []closeReq    // protected by mu
	bell chan struct{} // one token: the queue went from empty to not, or a close came back
}

// put queues r; false if the queue is full (send it now).
func (l *lateCloses) put(r closeReq) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.q) >= closerQueue {
		return false
	}
	l.q = append(l.q, r)
	if len(l.q) == 1 {
		l.ring()
	}
	return true
}

// ring tells the closer the queue has closes (the token stays until it
// looks: a ring while it waits out closeLinger makes it look again).
func (l *lateCloses) ring() {
	select {
	case l.bell <- struct{}{}:
	default:
	}
}

// take removes and returns the oldest close on ring meta.
func (l *lateCloses) take(meta *ring.Client) (closeReq, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range l.q {
		if r.meta == meta {
			l.q = append(l.q[:i], l.q[i+1:]...)
			return r, true
		}
	}
	return closeReq{}, false
}

// giveBack puts r back at the head of the queue (its ride was refused),
// and rings: the closer may have found the queue empty since r was taken
// and gone back to waiting, and later puts ring only on an empty queue.
func (l *lateCloses) giveBack(r closeReq) {
	l.mu.Lock()
	l.q = append([]closeReq{r}, l.q...)
	l.ring()
	l.mu.Unlock()
}

// drain removes and returns every close queued.
func (l *lateCloses) drain() []closeReq {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.q
	l.q = nil
	return q
}

// closeAside submits the oldest close queued for ring meta beside the
// call the caller makes next, which must then Wait for it (after its own
// call: the service answers it first). nil: none is queued, or none could
// stand aside (the closer sends it).
func (f *FS) closeAside(meta *ring.Client) *ring.Pending {
	r, ok := f.late.take(meta)
	if !ok {
		return nil
	}
	p, ok, err := meta.StartAside(bgctx, proto.OpClose, 0, r.handle, 0, nil)
	if err != nil {
		return nil // the session is gone, and the handle with it
	}
	if !ok {
		f.late.giveBack(r)
		return nil
	}
	f.ClosesAside.Add(1)
	return p
}

// closer sends the closes no open took, closeLinger after the first of
// them was queued, until the FS is closed. A failure is of a session
// that is gone (the handle went with it) or of a service that refuses a
// handle it no longer has: nothing to do either way.
func (f *FS) closer() {
	t := time.NewTimer(closeLinger)
	t.Stop()
	for {
		select {
		case <-f.life.Done():
			return
		case <-f.late.bell:
		}
		t.Reset(closeLinger)
		select {
		case <-f.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
		for _, r := range f.late.drain() {
			_, _ = call(bgctx, r.meta, cmp.Or(r.op, proto.OpClose), 0, r.handle, 0, nil, nil)
		}
	}
}

// recallNotices keeps one OpRecallWait outstanding on the metadata
// session meta (proto.FeatureRecalls) for as long as it lives: each
// completion names data handles whose grants another trust group's grant
// recalled. The files granted under them ask for their grant again before
// their next request (not after io's EBADF), and the cache mappings kept
// under them are dropped. Best effort: the notice is seen at the client's
// next look (a call, or Poll on the data path) and acted on by this
// goroutine soon after, so a request or a mapped read may still go out
// under the old grant meanwhile (io's EBADF then does the same), and a
// mapping an open adopts or a close keeps while the notice is handled
// may survive it. What a mapping serves after a recall is what io's cache
// holds (the region is coherent); io cannot refuse those loads.
func (f *FS) recallNotices(meta *ring.Client) {
	buf := make([]byte, 8*proto.RecallBatch)
	for !f.closed.Load() {
		comp, err := call(bgctx, meta, proto.OpRecallWait, 0, 0, 0, nil, buf)
		if err != nil {
			return // the session ended (ECANCELED), or the ring did
		}
		if comp.Result < 0 || comp.Result > int64(len(buf)) || comp.Result%8 != 0 {
			return // a service that answers nonsense tells no more
		}
		ids := make(map[uint64]bool, comp.Result/8)
		for i := int64(0); i < comp.Result; i += 8 {
			ids[binary.LittleEndian.Uint64(buf[i:])] = true
		}
		f.recalled(meta, ids, comp.Aux&proto.RecallAll != 0)
	}
}

// recalled acts on a recall notice of the metadata session meta: the
// grants of data handles ids (every grant, if all) were recalled.
func (f *FS) recalled(meta *ring.Client, ids map[uint64]bool, all bool) {
	f.RecallNotices.Add(uint64(len(ids)))
	for id := range ids {
		if fc := f.kept.takeAny(id); fc != nil {
			fc.unmap()
		}
		f.caps.forget(id)
	}
	if all {
		f.kept.clear(false)
		f.caps.clear()
	}
	files := f.openFiles()
	for _, fl := range files {
		fl.hmu.Lock()
		named := fl.meta == meta && (all || ids[fl.dataHandle])
		hit := named && fl.granted
		if hit {
			fl.granted, fl.noticed = false, true // the next request asks for the grant first
		}
		if named && fl.openCap != nil {
			fl.openCap = nil // spent: the next request asks for the grant (anew)
		}
		fl.hmu.Unlock()
		if !hit {
			continue
		}
		fl.cmu.Lock()
		if fc := fl.fcache; fc != nil {
			fl.fcFast.Store(nil)
			fl.fcache = nil
			fc.unmap()
		}
		fl.cmu.Unlock()
	}
}

// takeAny removes and returns the mapping kept for data handle, of any
// session generation; nil if none.
func (k *keptCaches) takeAny(handle uint64) *fileCache {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.by[handle]
	if e == nil {
		return nil
	}
	delete(k.by, handle)
	k.lru.Remove(e)
	return e.Value.(*keptCache).fc
}
