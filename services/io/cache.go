package iosvc

import (
	"bytes"
	"cmp"
	"container/list"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/proto/cache"
	"github.com/weir-storage/weir/services/io/backend"
)

// The page cache in shared memory (docs/cache-abi.md). Each open blob that
// is read gets a region: a memfd holding a header (the live size, mtime
// and data version) and the file's pages at their offsets, sparse. io
// fills pages on a miss, with readahead; serves reads from resident pages;
// keeps them coherent with every write, which goes to the device first
// (write-through: nothing is lost that a write returned); and evicts clean
// pages past Options.CacheSize. Clients map the region read-only
// (OpCacheMap) and read resident pages without a round trip.
//
// Who changes what: only io changes state words, the field group and page
// bytes (clients map read-only). A page's state word doubles as its lock:
// Begin makes it busy, Publish or Drop ends the transition. Fills and
// evictions never wait for a busy page (they skip it); writes and
// truncates wait, taking pages in ascending order, so no wait cycle can
// form. io keeps its own copy of which pages are resident (res), so that
// it never trusts the mapping for its accounting.

// pageCache counts every region's resident pages against the limit and
// evicts in CLOCK order: pages queue in the order they were filled; a page
// io served a read from since it was queued (ref) gets a second pass.
// Reads that clients serve themselves from the mapping are not seen, so a
// page only clients read ages as in FIFO order.
type pageCache struct {
	limit     int64 // pages; 0: the cache is off
	readahead int   // pages: the largest readahead window

	resident atomic.Int64   // pages resident in all regions
	bg       sync.WaitGroup // asynchronous readaheads in flight
	// dirty counts the pages that wait to be written home; a write that
	// would take it past dirtyLimit goes to the device at once
	// (write-through: the writer pays the device, as the kernel throttles
	// a writer past dirty_ratio), and past half of it the flusher is kicked.
	dirty      atomic.Int64
	dirtyLimit int64
	kick       chan struct{} // wakes the flusher

	mu    sync.Mutex // protects queue, head; taken after region.bmu never
	queue []pageRef
	head  int

	Fills, FilledPages, ReadaheadPages atomic.Uint64
	Hits, Misses, Evictions, Bypassed  atomic.Uint64
	Regions                            atomic.Int64
	Maps                               atomic.Uint64 // regions passed to clients
	WriteAllocated, WriteUpdated       atomic.Uint64 // pages a write stored into the cache
	FillNanos                          atomic.Uint64 // time in the device reads of fills
	WritebackPages, WritebackErrors    atomic.Uint64
	WriteThroughs                      atomic.Uint64 // writes sent to the device at once (dirty limit, uncachable)
	PageFailures                       atomic.Uint64 // new pages the memfd could not take (no memory)
	pinned                             atomic.Int64  // pages pinned by clients' mappings and write windows (pins.go)
	winPinned                          atomic.Int64  // of pinned, those of write windows
	Scrubbed                           atomic.Uint64 // bytes scrub freed (pages clients faulted in)
	DirectWrites                       atomic.Uint64 // O_DIRECT writes to a cached file
	DirectFlushes                      atomic.Uint64 // O_DIRECT reads that wrote dirty pages home first
}

type pageRef struct {
	r *region
	p uint64
}

func newPageCache(limitBytes, readaheadBytes int64) *pageCache {
	limit := limitBytes / cache.PageSize
	return &pageCache{limit: limit, readahead: int(readaheadBytes / cache.PageSize),
		dirtyLimit: max(limit/4, 1), kick: make(chan struct{}, 1)}
}

// admitDirty reports whether n more dirty pages fit under the dirty limit,
// and kicks the flusher past half of it.
func (pc *pageCache) admitDirty(n int64) bool {
	d := pc.dirty.Load()
	if d+n > pc.dirtyLimit/2 {
		select {
		case pc.kick <- struct{}{}:
		default:
		}
	}
	return d+n <= pc.dirtyLimit
}

func (pc *pageCache) enabled() bool { return pc != nil && pc.limit > 0 }

// added queues pages [p0, p0+n) of r, which were just made resident, and
// evicts past the limit.
func (pc *pageCache) added(r *region, p0 uint64, n int) {
	pc.mu.Lock()
	for i := range n {
		pc.queue = append(pc.queue, pageRef{r, p0 + uint64(i)})
	}
	if int64(len(pc.queue)-pc.head) > 2*pc.limit+4096 {
		pc.compactLocked()
	}
	pc.mu.Unlock()
	pc.resident.Add(int64(n))
	pc.reclaim()
}

// compactLocked drops the queue's entries of pages no longer resident
// (truncated, dropped, evicted and filled again, of closed regions): the
// queue never outgrows twice the resident pages by much. pc.mu is held.
func (pc *pageCache) compactLocked() {
	kept := pc.queue[:0]
	seen := make(map[pageRef]bool)
	for _, ref := range pc.queue[pc.head:] {
		if ref.r.dead.Load() || seen[ref] {
			continue
		}
		ref.r.bmu.Lock()
		res := bitGet(ref.r.res, ref.p)
		ref.r.bmu.Unlock()
		if res {
			seen[ref] = true
			kept = append(kept, ref)
		}
	}
	clear(pc.queue[len(kept):])
	pc.queue, pc.head = kept, 0
}

// evictBatch is how many queued pages reclaim takes at a time: the pages
// of one region that lie together go out in one punch (fallocate on a
// memfd costs about 7 µs a call however small, 0.4 µs a page in a large
// one).
const evictBatch = 64

// reclaim evicts pages until the resident count is within the limit, or
// no page can be evicted (all busy: they are io's transitions in flight,
// each about to end).
func (pc *pageCache) reclaim() {
	for tries := 0; pc.resident.Load() > pc.limit; tries++ {
		pc.mu.Lock()
		if pc.head >= len(pc.queue) || tries > 2*len(pc.queue)/evictBatch+2 {
			pc.mu.Unlock()
			return
		}
		want := int(min(int64(evictBatch), pc.resident.Load()-pc.limit+evictBatch/2))
		batch := make([]pageRef, 0, want)
		for pc.head < len(pc.queue) && len(batch) < want {
			batch = append(batch, pc.queue[pc.head])
			pc.queue[pc.head] = pageRef{}
			pc.head++
		}
		if pc.head > 1024 && pc.head > len(pc.queue)/2 {
			pc.queue = append(pc.queue[:0], pc.queue[pc.head:]...)
			pc.head = 0
		}
		pc.mu.Unlock()
		var again []pageRef
		for i := 0; i < len(batch); {
			j := i + 1
			for j < len(batch) && batch[j].r == batch[i].r {
				j++
			}
			pages := make([]uint64, 0, j-i)
			for _, ref := range batch[i:j] {
				pages = append(pages, ref.p)
			}
			done, requeue := batch[i].r.evict(pages)
			pc.Evictions.Add(uint64(done))
			for _, p := range requeue {
				again = append(again, pageRef{batch[i].r, p})
			}
			i = j
		}
		if len(again) > 0 {
			pc.mu.Lock()
			pc.queue = append(pc.queue, again...)
			pc.mu.Unlock()
		}
	}
}

// region is one open blob's cache region.
type region struct {
	// idleAt is its element in Service.idle while its blob is closed;
	// protected by Service.mu.
	idleAt *list.Element
	pc     *pageCache
	id     backend.BlobID
	ino    uint64
	// io's read-write descriptions of the meta memfd (header, state
	// words) and the data memfd (the file's pages): the region's only
	// descriptors. Clients get descriptions of their own, made when they
	// are sent (describe) and closed here once in flight.
	fd  *os.File
	dfd *os.File

	// life: page work takes it shared; close takes it exclusive, so the
	// mappings stay mapped while anything uses them.
	life   sync.RWMutex
	closed bool        // protected by life
	dead   atomic.Bool // closed, for the eviction queue's compaction

	// trunc: fills and writes take it shared, truncate exclusive, so that
	// no fill publishes bytes from before a truncate.
	trunc sync.RWMutex

	growMu sync.Mutex
	cur    atomic.Pointer[cache.Region]
	maps   [][]byte // every mapping made (meta and data); protected by growMu

	fieldsMu sync.Mutex // serialises SetFields (one writer at a time)

	bmu    sync.Mutex // protects res, ref, dirty, nres, ndirty, pins
	res    []uint64   // bit per page: resident (io's own record)
	ref    []uint64   // bit per page: io served a read from it since it was queued
	dirty  []uint64   // bit per page: resident bytes the device has not (write-back)
	nres   int64
	ndirty int64
	pins   map[uint64]uint32 // page -> pins of clients' mappings (pins.go): never evicted

	wmu   sync.Mutex           // protects wins
	wins  map[*window]struct{} // clients' write windows of the file (windows.go)
	nwins atomic.Int64         // len(wins)

	wbMu sync.Mutex // one write-back of the region at a time

	// flight is the byte range of the write-back's device write in
	// progress (writeRun), whose pages are no longer busy: a direct or
	// write-through write of the region waits for it before its own
	// device write to an overlapping range, so that the two never
	// overlap at the device (a page torn between them).
	flightMu   sync.Mutex
	flightCond *sync.Cond // on flightMu; made with the region
	flightOn   bool
	flightLo   int64
	flightHi   int64

	raBusy atomic.Int32 // asynchronous readaheads running (at most maxReadaheads)
}

// maxReadaheads bounds the asynchronous readaheads of one region at once:
// some read the device while others store into the memfd, and the virtual
// disk of the reference VM gives more to several reads at once. The cold
// 1 MiB sequential row of bench/fileops (2-CPU reference VM): 296-330 MB/s
// with one, 353-375 with two, 421-462 with four.
const maxReadaheads = 4

// readaheadAsync fills pages [p0, p1) on a goroutine of its own, unless
// maxReadaheads run for the region already: the reader that asked goes on,
// and finds them resident (or busy, and waits for them) when it gets there.
func (r *region) readaheadAsync(b backend.Blob, p0, p1 uint64, sizeOf func() int64) {
	if p1 <= p0 {
		return
	}
	if r.raBusy.Add(1) > maxReadaheads {
		r.raBusy.Add(-1)
		return
	}
	r.pc.bg.Add(1)
	go func() {
		defer r.pc.bg.Done()
		defer r.raBusy.Add(-1)
		r.life.RLock()
		defer r.life.RUnlock()
		if r.closed {
			return
		}
		r.trunc.RLock()
		defer r.trunc.RUnlock()
		if n, _ := r.fill(b, p0, p1, sizeOf, nil, nil); n > 0 {
			r.pc.ReadaheadPages.Add(uint64(n))
		}
	}()
}

// regionCapacity is the capacity a new region gets for a file of size
// bytes: room to grow before the first remap.
func regionCapacity(size int64) uint64 {
	return max(uint64(64<<20), 2*uint64(max(size, 0)))
}

// newRegion makes the region of a blob of the given size.
func (pc *pageCache) newRegion(id backend.BlobID, ino uint64, size int64) (*region, error) {
	r := &region{pc: pc, id: id, ino: ino}
	var err error
	if r.fd, err = newMemfd(fmt.Sprintf("weir-cache-%d", ino), 0); err != nil {
		return nil, fmt.Errorf("cache region of file %d: %w", ino, err)
	}
	// The data memfd at the largest capacity from the start, sealed there
	// (docs/cache-abi.md §1): a client holding it read-write cannot grow
	// it, and what it stores past the region's capacity scrub punches.
	if r.dfd, err = newMemfd(fmt.Sprintf("weir-data-%d", ino), cache.MaxCapacity); err != nil {
		r.fd.Close()
		return nil, fmt.Errorf("cache region of file %d: %w", ino, err)
	}
	r.flightCond = sync.NewCond(&r.flightMu)
	capa := regionCapacity(size)
	if capa > cache.MaxCapacity {
		capa = cache.MaxCapacity
	}
	meta, data, err := r.mapSize(capa)
	if err != nil {
		r.closeFiles()
		return nil, err
	}
	cr, err := cache.Format(meta, data, ino, capa)
	if err != nil {
		unix.Munmap(meta)
		unix.Munmap(data)
		r.closeFiles()
		return nil, err
	}
	r.maps = append(r.maps, meta, data)
	r.cur.Store(cr)
	pc.Regions.Add(1)
	return r, nil
}

// newMemfd makes one of a region's memfds, and returns io's read-write
// description of it.
//
// Sealed against shrinking (it only grows), so that a client that maps
// its pages (MAP_SHARED, pins.go) is never made to fault past its end,
// and the seals sealed, so that no client holding a writable description
// adds F_SEAL_WRITE and stops io's fills. A size above 0 fixes it (sealed
// against growing too: the data memfd, a session's write log, windows.go).
//
// The inode's mode is 0600: io's own user may open it again through
// /proc/self/fd (describe), and nobody else may (a client reopening the
// read-only description it was given, through /proc/<pid>/fd, is refused:
// only the service user or a process with CAP_DAC_OVERRIDE could, and
// either can write the data directory and io's memory anyway).
func newMemfd(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
	if size > 0 {
		if err := unix.Ftruncate(fd, size); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("size: %w", err)
		}
		seals |= unix.F_SEAL_GROW
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seal: %w", err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mode: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// describe opens a new file description of memfd f, read-only or
// read-write, for a client: its own description, so that a client's
// fcntl(F_SETFL), O_APPEND say, never changes how io's pwrites land, and
// read-only so that the client's mmap(PROT_WRITE) and mprotect(PROT_WRITE)
// fail. The caller closes it once it is sent. f must stay open meanwhile
// (the caller holds the region's life lock).
func describe(f *os.File, write bool) (*os.File, error) {
	flags := os.O_RDONLY
	if write {
		flags = os.O_RDWR
	}
	d, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), flags|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cache region: a client's description of %s: %w", f.Name(), err)
	}
	return d, nil
}

// describe returns new descriptions of the region's memfds for a client
// (describe): the meta memfd's read-only and the data memfd's, read-write
// when write. With meta false only the data memfd's (nil first). EBADF
// once the region closed.
func (r *region) describe(meta, write bool) (m, d *os.File, err error) {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return nil, nil, fmt.Errorf("cache region of file %d: closed: %w", r.ino, syscall.EBADF)
	}
	if meta {
		if m, err = describe(r.fd, false); err != nil {
			return nil, nil, err
		}
	}
	if d, err = describe(r.dfd, write); err != nil {
		if m != nil {
			m.Close()
		}
		return nil, nil, err
	}
	return m, d, nil
}

func (r *region) closeFiles() {
	for _, f := range []*os.File{r.fd, r.dfd} {
		if f != nil {
			f.Close()
		}
	}
}

// mapSize sizes the memfds for capa bytes of file and maps all of them.
// A memfd is only ever grown (the data memfd is made at the largest
// capacity, and sealed there: newRegion).
func (r *region) mapSize(capa uint64) (meta, data []byte, err error) {
	ms, ds, err := cache.Sizes(capa)
	if err != nil {
		return nil, nil, err
	}
	var mems [2][]byte
	for i, c := range []struct {
		f    *os.File
		size uint64
	}{{r.fd, ms}, {r.dfd, ds}} {
		st, err := c.f.Stat()
		if err == nil && st.Size() < int64(c.size) {
			err = c.f.Truncate(int64(c.size))
		}
		if err != nil {
			if i == 1 {
				unix.Munmap(mems[0])
			}
			return nil, nil, fmt.Errorf("cache region of file %d: size the memfd: %w", r.ino, err)
		}
		m, err := unix.Mmap(int(c.f.Fd()), 0, int(c.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			if i == 1 {
				unix.Munmap(mems[0])
			}
			return nil, nil, fmt.Errorf("cache region of file %d: mmap %d bytes: %w", r.ino, c.size, err)
		}
		mems[i] = m
	}
	return mems[0], mems[1], nil
}

// covering returns a mapping that covers page p (of a file position below
// cache.MaxCapacity), growing the region if it does not. The old mappings
// stay mapped until close, so a reader holding one is never cut off.
func (r *region) covering(p uint64) (*cache.Region, error) {
	cr := r.cur.Load()
	if p < cr.Pages() {
		return cr, nil
	}
	r.growMu.Lock()
	defer r.growMu.Unlock()
	if cr = r.cur.Load(); p < cr.Pages() {
		return cr, nil
	}
	need := (p + 1) * cache.PageSize
	if need > cache.MaxCapacity {
		return nil, fmt.Errorf("cache region: page %d is past the largest region: %w", p, syscall.EFBIG)
	}
	capa := min(max(2*cr.Capacity(), need), cache.MaxCapacity)
	meta, data, err := r.mapSize(capa)
	if err != nil {
		return nil, err
	}
	ncr, err := cache.Extend(meta, data)
	if err == nil {
		err = ncr.Grow(capa)
	}
	if err != nil {
		unix.Munmap(meta)
		unix.Munmap(data)
		return nil, err
	}
	r.maps = append(r.maps, meta, data)
	r.cur.Store(ncr)
	return ncr, nil
}

// close drops every page from the count and unmaps the region. Clients
// keep what they mapped (the memfd lives while they hold it), and no
// longer see changes: they ask io again, which has no region for a closed
// blob until it is opened again.
func (r *region) close() {
	r.life.Lock()
	defer r.life.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.dead.Store(true)
	r.cur.Load().Retire() // clients that still map it read through the ring
	r.bmu.Lock()
	n := r.nres
	r.nres = 0
	nd := r.ndirty
	r.ndirty = 0
	r.res, r.ref, r.dirty = nil, nil, nil
	r.bmu.Unlock()
	r.pc.resident.Add(-n)
	r.pc.dirty.Add(-nd)
	r.growMu.Lock()
	for _, m := range r.maps {
		unix.Munmap(m)
	}
	r.maps = nil
	r.growMu.Unlock()
	r.closeFiles()
	r.pc.Regions.Add(-1)
}

// Bits of res and ref; bmu is held.
func bitGet(b []uint64, p uint64) bool { return p/64 < uint64(len(b)) && b[p/64]&(1<<(p%64)) != 0 }

func bitSet(b *[]uint64, p uint64) {
	for p/64 >= uint64(len(*b)) {
		*b = append(*b, make([]uint64, max(len(*b), 16))...)
	}
	(*b)[p/64] |= 1 << (p % 64)
}

func bitClear(b []uint64, p uint64) {
	if p/64 < uint64(len(b)) {
		b[p/64] &^= 1 << (p % 64)
	}
}

func (r *region) markResident(p0 uint64, n int) {
	r.bmu.Lock()
	added := 0
	for i := range uint64(n) {
		if !bitGet(r.res, p0+i) {
			bitSet(&r.res, p0+i)
			added++
		}
	}
	r.nres += int64(added)
	r.bmu.Unlock()
	if added > 0 {
		r.pc.added(r, p0, n)
	}
}

func (r *region) markAbsent(p uint64) {
	r.bmu.Lock()
	was, dirty := bitGet(r.res, p), bitGet(r.dirty, p)
	bitClear(r.res, p)
	bitClear(r.ref, p)
	bitClear(r.dirty, p)
	if was {
		r.nres--
	}
	if dirty {
		r.ndirty--
	}
	r.bmu.Unlock()
	if was {
		r.pc.resident.Add(-1)
	}
	if dirty {
		r.pc.dirty.Add(-1)
	}
}

// markDirty records that page p (resident, busy with the caller) holds
// bytes the device has not.
func (r *region) markDirty(p uint64) {
	r.bmu.Lock()
	added := !bitGet(r.dirty, p)
	if added {
		bitSet(&r.dirty, p)
		r.ndirty++
	}
	r.bmu.Unlock()
	if added {
		r.pc.dirty.Add(1)
	}
}

func (r *region) clearDirty(p uint64) {
	r.bmu.Lock()
	was := bitGet(r.dirty, p)
	bitClear(r.dirty, p)
	if was {
		r.ndirty--
	}
	r.bmu.Unlock()
	if was {
		r.pc.dirty.Add(-1)
	}
}

// hasDirty reports whether any page waits to be written home.
func (r *region) hasDirty() bool {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	return r.ndirty > 0
}

// dirtyPages lists the dirty pages, ascending: the file's dirty set.
func (r *region) dirtyPages() []uint64 {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	return bitList(r.dirty, 0)
}

// hasDirtyIn reports whether a page of [p0, p1) waits to be written home.
func (r *region) hasDirtyIn(p0, p1 uint64) bool {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	if r.ndirty == 0 {
		return false
	}
	for p := p0; p < p1; p++ {
		if bitGet(r.dirty, p) {
			return true
		}
	}
	return false
}

// writeRun writes home the run of pages busy (pages, each busy with the
// word in words), the want bytes from off, and ends their transitions.
// The pages are busy only while they are copied (a shadow copy, as
// Oxbow's checkpoint has it): a writer to one of them waits for the copy,
// never for the device write. They stay dirty during the write; after it,
// each page all of whose bytes are still the copy's (zeros past the size
// included) is clean, one changed since
// (a write, or a direct write whose own device write the copy's may have
// overtaken) stays dirty for the next flush, as does a page busy then. A
// page past the size keeps its dirt: writes make the size cover their
// bytes before they make a page dirty, so such a page cannot be (a
// truncate drops them), but its bytes must never be taken for written.
// Truncates are held off by the caller (trunc), and evictions skip dirty
// pages, so no fill brings back the device's bytes before the write.
func (r *region) writeRun(cr *cache.Region, b backend.Blob, pages []uint64, words []cache.Word, off, want int64, size func() int64) error {
	if want <= 0 {
		for i, w := range words {
			_ = cr.Publish(pages[i], w, true)
		}
		return nil
	}
	data, _ := cr.Data(pages[0], len(words))
	var shadow []byte
	if want <= bounceSize {
		bp := getBounce()
		defer putBounce(bp)
		shadow = (*bp)[:want]
	} else {
		shadow = make([]byte, want)
	}
	copy(shadow, data[:want])
	r.flightBegin(off, off+want) // while the pages are still busy
	for i, w := range words {
		_ = cr.Publish(pages[i], w, true)
	}
	_, err := b.WriteAt(shadow, off)
	r.flightEnd()
	if err != nil {
		return err
	}
	for _, p := range pages {
		pOff := int64(p) * cache.PageSize
		if pOff >= off+want {
			continue // past the size
		}
		w, err := cr.Begin(p)
		if err != nil {
			continue // busy (a write on it): written again by the next flush
		}
		// The whole page: the copy's bytes up to the size, zeros past it
		// (a write that extended the file into the page meanwhile put
		// bytes there that the copy has not).
		n := min(int64(cache.PageSize), off+want-pOff)
		pg, _ := cr.Data(p, 1)
		if n < cache.PageSize && size() == off+want && !allZero(pg[n:]) {
			// Bytes past the end of the file in its last page, which only
			// a client's store through a writable mapping puts there:
			// dropped, as Linux drops them at write-back, or the page
			// would stay dirty for ever, and an extension would show
			// them. The file still ends here (an extension into the page
			// waits for it: zeroPastEnd), and the page is ours.
			_ = cr.WritePage(p, int(n), zeroPage[n:])
		}
		clean := bytes.Equal(pg[:n], shadow[pOff-off:pOff-off+n]) && allZero(pg[n:])
		if clean {
			r.clearDirty(p)
		}
		_ = cr.Publish(p, w, !clean)
	}
	return nil
}

// zeroPage is a page of zeros, never written.
var zeroPage [cache.PageSize]byte

// zeroPastEnd zeroes the bytes past the file's end (size()) in its last
// page, if resident, while the file still ends there: a write or a
// truncate is about to extend the file past that page, and its bytes past
// the old end, which only a client's store through a writable mapping can
// have made other than zeros, must read as zeros then (as Linux zeroes
// them when it extends a file). The caller holds trunc, and is not
// holding the page.
func (r *region) zeroPastEnd(size func() int64) {
	sz := size()
	tail := sz % cache.PageSize
	if tail == 0 {
		return
	}
	p := uint64(sz) / cache.PageSize
	cr := r.cur.Load()
	if p >= cr.Pages() {
		return
	}
	w, k, err := lockPage(cr, p)
	if err != nil {
		return
	}
	if k != cache.KindResident {
		_ = cr.Drop(p, w)
		return
	}
	// The end as of now that the page is ours: a write that extended the
	// file inside this page meanwhile leaves less past it to zero; one
	// that extended it past the page zeroed this tail itself, first.
	if cur := size(); uint64(cur)/cache.PageSize == p && cur%cache.PageSize != 0 {
		_ = cr.WritePage(p, int(cur%cache.PageSize), zeroPage[cur%cache.PageSize:])
	}
	_ = cr.Publish(p, w, w.Dirty())
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func (r *region) flightBegin(lo, hi int64) {
	r.flightMu.Lock()
	r.flightOn, r.flightLo, r.flightHi = true, lo, hi
	r.flightMu.Unlock()
}

func (r *region) flightEnd() {
	r.flightMu.Lock()
	r.flightOn = false
	r.flightCond.Broadcast()
	r.flightMu.Unlock()
}

// flightWait waits until no write-back device write overlaps [lo, hi).
func (r *region) flightWait(lo, hi int64) {
	r.flightMu.Lock()
	for r.flightOn && r.flightLo < hi && lo < r.flightHi {
		r.flightCond.Wait()
	}
	r.flightMu.Unlock()
}

// maxFlushRun bounds the pages one write-back write carries (1 MiB).
const maxFlushRun = 256

// flush writes the dirty pages home through b, the file of size bytes
// (size() is read per run: a write may extend it meanwhile), in runs of
// adjacent pages (one chunk, at most maxFlushRun), each one device write
// of a copy of the pages (writeRun): they are busy only for the copy.
// Pages busy in another transition are left for the next flush, unless
// wait. A page whose write fails stays dirty. It returns the pages written
// and the first error.
func (r *region) flush(b backend.Blob, size func() int64, wait bool) (int, error) {
	return r.flushRange(b, size, wait, 0, math.MaxUint64)
}

// flushRange is flush of the dirty pages in [p0, p1).
func (r *region) flushRange(b backend.Blob, size func() int64, wait bool, p0, p1 uint64) (int, error) {
	r.wbMu.Lock()
	defer r.wbMu.Unlock()
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return 0, nil
	}
	r.trunc.RLock()
	defer r.trunc.RUnlock()
	cr := r.cur.Load()
	pages := r.dirtyPages()
	for len(pages) > 0 && pages[0] < p0 {
		pages = pages[1:]
	}
	for len(pages) > 0 && pages[len(pages)-1] >= p1 {
		pages = pages[:len(pages)-1]
	}
	written := 0
	var first error
	for len(pages) > 0 {
		n := 1
		for n < len(pages) && n < maxFlushRun && pages[n] == pages[n-1]+1 && pages[n]/cache.ChunkPages == pages[0]/cache.ChunkPages {
			n++
		}
		run := pages[:n]
		var busy []cache.Word
		for _, p := range run {
			var w cache.Word
			var err error
			if wait {
				w, _, err = lockPage(cr, p)
			} else {
				w, err = cr.Begin(p)
			}
			if err != nil {
				break
			}
			busy = append(busy, w)
		}
		if len(busy) == 0 {
			pages = pages[1:] // busy: the next flush
			continue
		}
		pages = pages[len(busy):]
		off := int64(run[0]) * cache.PageSize
		want := min(int64(len(busy))*cache.PageSize, size()-off)
		err := r.writeRun(cr, b, run[:len(busy)], busy, off, want, size)
		if err != nil {
			r.pc.WritebackErrors.Add(1)
			if first == nil {
				first = fmt.Errorf("write back pages %d-%d of file %d: %w", run[0], run[len(busy)-1], r.ino, err)
			}
			continue
		}
		written += len(busy)
	}
	r.pc.WritebackPages.Add(uint64(written))
	return written, first
}

func (r *region) touched(p0, p1 uint64) {
	r.bmu.Lock()
	for p := p0; p < p1; p++ {
		if bitGet(r.res, p) {
			bitSet(&r.ref, p)
		}
	}
	r.bmu.Unlock()
}

// residentFrom lists the resident pages at or past p, ascending.
func (r *region) residentFrom(p uint64) []uint64 {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	return bitList(r.res, p)
}

// bitList lists the set bits of b at or past p, ascending.
func bitList(b []uint64, p uint64) []uint64 {
	var out []uint64
	for w := p / 64; w < uint64(len(b)); w++ {
		for x := b[w]; x != 0; x &= x - 1 {
			if q := w*64 + uint64(bits.TrailingZeros64(x)); q >= p {
				out = append(out, q)
			}
		}
	}
	return out
}

// punch frees the memory of pages [p, p+n) (they read as zeros
// afterwards).
func (r *region) punch(p uint64, n int) error {
	return unix.Fallocate(int(r.dfd.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
		int64(cache.PageOffset(p)), int64(n)*cache.PageSize)
}

// evict takes pages (of this region, in queue order) out of the cache,
// but not those busy or read since they were queued (that clears the mark
// and gives them another pass: requeue). Pages no longer resident are
// forgotten. Runs of adjacent pages go out in one punch.
func (r *region) evict(pages []uint64) (done int, requeue []uint64) {
	if !r.life.TryRLock() {
		return 0, pages // closing, or a close waits: the close frees them
	}
	defer r.life.RUnlock()
	if r.closed {
		return 0, nil
	}
	type victim struct {
		p    uint64
		busy cache.Word
	}
	var vs []victim
	cr := r.cur.Load()
	for _, p := range pages {
		r.bmu.Lock()
		res, ref, dirty, pinned := bitGet(r.res, p), bitGet(r.ref, p), bitGet(r.dirty, p), r.pinnedLocked(p)
		if ref {
			bitClear(r.ref, p)
		}
		r.bmu.Unlock()
		switch {
		case !res:
			continue
		case ref || dirty || pinned: // dirty: not before it is written home; pinned: mapped
			requeue = append(requeue, p)
			continue
		}
		busy, err := cr.Begin(p)
		if err != nil || busy.Dirty() {
			if err == nil {
				_ = cr.Publish(p, busy, true)
			}
			requeue = append(requeue, p)
			continue
		}
		vs = append(vs, victim{p, busy})
	}
	slices.SortFunc(vs, func(a, b victim) int { return cmp.Compare(a.p, b.p) })
	for i := 0; i < len(vs); {
		j := i + 1
		for j < len(vs) && vs[j].p == vs[j-1].p+1 && vs[j].p/cache.ChunkPages == vs[i].p/cache.ChunkPages {
			j++
		}
		if err := r.punch(vs[i].p, j-i); err != nil {
			// The memory stays; the pages stay resident and correct.
			for _, v := range vs[i:j] {
				_ = cr.Publish(v.p, v.busy, v.busy.Dirty())
				requeue = append(requeue, v.p)
			}
		} else {
			for _, v := range vs[i:j] {
				r.markAbsent(v.p)
				_ = cr.Drop(v.p, v.busy)
			}
			done += j - i
		}
		i = j
	}
	return done, requeue
}

// dropAll evicts every resident page that is not busy, whether read
// recently or not, and returns how many.
func (r *region) dropAll() int64 {
	pages := r.residentFrom(0)
	r.bmu.Lock()
	for _, p := range pages {
		bitClear(r.ref, p)
	}
	r.bmu.Unlock()
	done, _ := r.evict(pages)
	return int64(done)
}

// scrubSlack is the memory a region may hold past its resident pages
// before scrub punches it out (pages of fills in flight are allocated
// before they count).
const scrubSlack = 1 << 20

// scrub frees memory the region's memfd holds outside its resident pages:
// a client that reads pages of its read-only mapping that are not
// resident makes the kernel allocate them (a read fault on a hole of a
// memfd allocates a page, charged to the faulting process's memory
// cgroup), and they would stay when it goes. It punches every absent page
// that is not busy (a fill in flight) and returns the bytes it freed.
func (r *region) scrub() int64 {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return 0
	}
	before := r.memoryLocked()
	r.bmu.Lock()
	resident := r.nres
	r.bmu.Unlock()
	if before <= resident*cache.PageSize+scrubSlack {
		return 0
	}
	r.trunc.RLock()
	defer r.trunc.RUnlock()
	// Past the capacity: no page of the region, only what a client holding
	// the data memfd read-write stored there. growMu held: a growth (and
	// a write or fill into the pages it adds) waits for the punch.
	r.growMu.Lock()
	capa := r.cur.Load().Pages()
	_ = unix.Fallocate(int(r.dfd.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
		int64(cache.PageOffset(capa)), int64(cache.MaxCapacity-cache.PageOffset(capa)))
	r.growMu.Unlock()
	cr := r.cur.Load()
	for p := uint64(0); p < cr.Pages(); {
		// A run of absent pages, made busy, in one chunk.
		var busy []cache.Word
		start := p
		for end := min(cr.Pages(), (p/cache.ChunkPages+1)*cache.ChunkPages); p < end; p++ {
			w, k, err := cr.BeginKind(p)
			if err != nil {
				break
			}
			if k != cache.KindAbsent {
				_ = cr.Publish(p, w, w.Dirty())
				break
			}
			busy = append(busy, w)
		}
		if len(busy) > 0 {
			_ = r.punch(start, len(busy))
			for i, w := range busy {
				_ = cr.Drop(start+uint64(i), w)
			}
		}
		if len(busy) == 0 || p == start+uint64(len(busy)) && p%cache.ChunkPages != 0 {
			p++ // the page that ended the run: resident or busy
		}
	}
	freed := before - r.memoryLocked()
	r.pc.Scrubbed.Add(uint64(max(freed, 0)))
	return freed
}

// lockPage makes page p busy for a write or a truncate, waiting while it
// is busy (io's own fills, evictions and writes, each bounded). It returns
// the busy word and the kind the page had.
func lockPage(cr *cache.Region, p uint64) (cache.Word, cache.Kind, error) {
	for i := 0; ; i++ {
		busy, was, err := cr.BeginKind(p)
		if err == nil || !errors.Is(err, cache.ErrBusy) {
			return busy, was, err
		}
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// fill makes pages [p0, p1) resident where they are absent, reading the
// device into a bounce buffer and storing it into the memfd, run by run (a
// run ends at a chunk's end or at a page that is not absent). sizeOf is the
// file's size, read once a run is busy: bytes past it read as zeros. sink,
// if not nil, sees each run's bytes (and their file offset) as soon as the
// device returned them, before they are stored: a read takes its bytes
// from there instead of from the region.
//
// With last not nil, fill leaves the last run's store (a pwrite, then
// publishing its pages) to the caller, in *last: a read that has its bytes
// answers first and stores them after (region.read, session.serveIO). Its pages stay busy
// until then. It returns the number of pages it filled (or left to store).
func (r *region) fill(b backend.Blob, p0, p1 uint64, sizeOf func() int64, sink func(data []byte, at int64), last **fillRun) (int, error) {
	if p1 <= p0 {
		return 0, nil
	}
	cr, err := r.covering(p1 - 1)
	if err != nil {
		return 0, err
	}
	filled := 0
	for p := p0; p < p1; {
		// Take a run of absent pages.
		var busy []cache.Word
		end := min(p1, (p/cache.ChunkPages+1)*cache.ChunkPages, p+bounceSize/cache.PageSize)
		for q := p; q < end; q++ {
			w, was, err := cr.BeginKind(q)
			if err != nil {
				break
			}
			if was != cache.KindAbsent {
				_ = cr.Publish(q, w, w.Dirty())
				break
			}
			busy = append(busy, w)
		}
		if len(busy) == 0 {
			p++
			continue
		}
		// The device reads into a bounce buffer and a pwrite puts the
		// pages into the memfd: that allocates them without faulting them
		// into io's mapping, which costs more than the copy (a page fault
		// is 2.2 µs on the reference VM, a page's pwrite about 1.2 µs, or
		// 2 to 7 µs when the page is new).
		bp := getBounce()
		data := (*bp)[:len(busy)*cache.PageSize]
		off := int64(p) * cache.PageSize
		// The size now that the run is busy: a write that extends the file
		// extends the size before it releases its pages, so no fill cuts
		// that write's bytes at an older size.
		size := sizeOf()
		want := min(int64(len(data)), max(size-off, 0))
		n, err := 0, error(nil)
		if want > 0 {
			t0 := time.Now()
			n, err = b.ReadAt(data[:want], off)
			r.pc.FillNanos.Add(uint64(time.Since(t0)))
			if errors.Is(err, io.EOF) {
				err = nil
			}
		}
		if err != nil {
			putBounce(bp)
			r.abandon(cr, p, busy)
			return filled, err
		}
		clear(data[n:])
		if sink != nil {
			sink(data, off)
		}
		run := fillRun{cr: cr, p: p, busy: busy, bp: bp}
		p += uint64(len(busy))
		filled += len(busy)
		if last != nil && p >= p1 {
			*last = &run
			return filled, nil
		}
		if err := r.store(run); err != nil {
			return filled - len(busy), err
		}
	}
	return filled, nil
}

// fillRun is a run of busy pages a fill read from the device, and the
// bounce buffer holding their bytes.
type fillRun struct {
	cr   *cache.Region
	p    uint64
	busy []cache.Word
	bp   *[]byte
}

// store puts a run's bytes into the memfd and publishes its pages
// resident; if the memfd refuses them, the pages go back to absent (the
// device holds their bytes).
func (r *region) store(run fillRun) error {
	err := pwriteFull(int(r.dfd.Fd()), (*run.bp)[:len(run.busy)*cache.PageSize], int64(cache.PageOffset(run.p)))
	putBounce(run.bp)
	if err != nil {
		r.abandon(run.cr, run.p, run.busy)
		return err
	}
	for i, w := range run.busy {
		_ = run.cr.Publish(run.p+uint64(i), w, false)
	}
	r.markResident(run.p, len(run.busy))
	r.pc.Fills.Add(1)
	r.pc.FilledPages.Add(uint64(len(run.busy)))
	return nil
}

// abandon returns a run's busy pages to absent, freeing what the memfd
// holds of them.
func (r *region) abandon(cr *cache.Region, p uint64, busy []cache.Word) {
	_ = r.punch(p, len(busy))
	for i, w := range busy {
		_ = cr.Drop(p+uint64(i), w)
	}
}

// bounceSize is the bounce buffers' size: the most one fill reads at once.
const bounceSize = 1 << 20

// bounces keeps up to maxBounces page-aligned buffers (O_DIRECT) whose
// pages were faulted in when they were made (a sync.Pool would drop them
// at each GC, and each new one costs an mmap and 256 page faults).
var bounces = make(chan *[]byte, maxBounces)

const maxBounces = 16

func getBounce() *[]byte {
	select {
	case b := <-bounces:
		return b
	default:
	}
	b, err := unix.Mmap(-1, 0, bounceSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		b = make([]byte, bounceSize) // Go memory: the backend bounces it again if it must
	}
	for i := 0; i < len(b); i += cache.PageSize {
		b[i] = 0
	}
	return &b
}

func putBounce(b *[]byte) {
	select {
	case bounces <- b:
	default:
		_ = unix.Munmap(*b) // Go memory (an mmap that failed) fails here, harmlessly
	}
}

// pwriteFull writes all of p to fd at off.
func pwriteFull(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("cache region: pwrite: %w", err)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// busyWait bounds how long a read waits for a page busy in one of io's
// transitions (a fill, a write, a write-back: each ends in the device's
// time). A page busy for longer is a bug; the read fails with EIO rather
// than return bytes from anywhere else.
const busyWait = 30 * time.Second

// errStuck is the error of a read that waited busyWait for a page.
var errStuck = fmt.Errorf("cache: a page stayed busy for %v: %w", busyWait, syscall.EIO)

// copyOut copies file bytes at off into dst from the region, waiting while
// the next page is busy. It returns how many bytes it copied: all of dst,
// or up to a page that is absent (evicted, or never filled).
func (r *region) copyOut(cr *cache.Region, dst []byte, off int64) (int, error) {
	n := 0
	var since time.Time
	for tries := 0; n < len(dst); tries++ {
		m := cr.ReadAt(dst[n:], uint64(off)+uint64(n))
		n += m
		if n == len(dst) {
			break
		}
		p := (uint64(off) + uint64(n)) / cache.PageSize
		w, err := cr.State(p)
		if err != nil || w.Kind() == cache.KindAbsent {
			break
		}
		if m > 0 {
			tries, since = 0, time.Time{}
		}
		switch {
		case tries < 64:
			runtime.Gosched()
		case since.IsZero():
			since = time.Now()
		case time.Since(since) > busyWait:
			return n, errStuck
		default:
			time.Sleep(20 * time.Microsecond)
		}
	}
	return n, nil
}

// read serves a read of dst at off (inside the file of size bytes) from
// the cache, filling what is missing plus ra readahead pages. Pages that
// stay out of the cache (a fill failed, the page was evicted at once) are
// read from the device.
func (r *region) read(b backend.Blob, dst []byte, off int64, sizeOf func() int64, ra int, later *[]func()) (int, error) {
	r.life.RLock()
	held := true // false once a store of the fill's last run owns the hold
	defer func() {
		if held {
			r.life.RUnlock()
		}
	}()
	if r.closed {
		return deviceRead(b, dst, off, sizeOf)
	}
	p0 := uint64(off) / cache.PageSize
	pEnd := (uint64(off) + uint64(len(dst)) + cache.PageSize - 1) / cache.PageSize
	cr, err := r.covering(pEnd - 1)
	if errors.Is(err, syscall.EFBIG) {
		return deviceRead(b, dst, off, sizeOf) // past the largest region: never cached
	}
	if err != nil {
		return 0, err
	}
	n := cr.ReadAt(dst, uint64(off))
	if n == len(dst) {
		r.pc.Hits.Add(1)
		r.touched(p0, pEnd)
		return n, nil
	}
	r.pc.Misses.Add(1)
	// The bytes the fill reads go to dst as they come, as long as they
	// continue what dst has.
	sink := func(data []byte, at int64) {
		pos := off + int64(n)
		if at <= pos && pos < at+int64(len(data)) {
			n += copy(dst[n:], data[pos-at:])
		}
	}
	r.trunc.RLock()
	var last *fillRun
	filled, ferr := r.fill(b, (uint64(off)+uint64(n))/cache.PageSize, pEnd, sizeOf, sink, &last)
	if last != nil && (n < len(dst) || later == nil) {
		if err := r.store(*last); err != nil {
			filled -= len(last.busy)
		}
		last = nil
	}
	if last == nil {
		r.trunc.RUnlock()
	}
	if ferr != nil && filled == 0 {
		return n, ferr
	}
	if ra > 0 {
		// Sequential: read the window ahead (at least one more read of
		// this size) while the reader takes these.
		sizePages := (uint64(sizeOf()) + cache.PageSize - 1) / cache.PageSize
		r.readaheadAsync(b, pEnd, min(pEnd+max(uint64(ra), pEnd-p0), sizePages), sizeOf)
	}
	if last != nil {
		// dst has every byte: answer first, then store the last run into
		// the memfd (2 to 7 µs a new page, measured: a good part of a cold
		// read). Its pages stay busy until then; the store takes over this
		// read's holds on r.life and r.trunc.
		held = false
		run := *last
		*later = append(*later, func() {
			defer r.life.RUnlock()
			defer r.trunc.RUnlock()
			_ = r.store(run)
		})
		return n, nil
	}
	// What the fill did not hand over: pages resident already, busy in
	// another transition (wait), or absent again (evicted at once: fill
	// them again, a few times, then read the device; an absent page is
	// never dirty, so the device holds its bytes).
	cr = r.cur.Load()
	for refills := 0; n < len(dst); {
		m, err := r.copyOut(cr, dst[n:], off+int64(n))
		n += m
		if err != nil {
			return n, err
		}
		if n == len(dst) {
			break
		}
		pg := (uint64(off) + uint64(n)) / cache.PageSize
		if refills < 4 {
			refills++
			r.trunc.RLock()
			_, err := r.fill(b, pg, pg+1, sizeOf, sink, nil)
			r.trunc.RUnlock()
			if err == nil {
				continue
			}
			refills = 4 // the fill failed (no memory for the memfd, say): the device
		}
		pe := min(len(dst), n+int(cache.PageSize-(uint64(off)+uint64(n))%cache.PageSize))
		r.pc.Bypassed.Add(1)
		m, err = deviceRead(b, dst[n:pe], off+int64(n), sizeOf)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// deviceRead reads dst at off from the device, the bytes the device does
// not have (past its size, below the file's: a hole the cache's writes
// have not reached the device yet, or a blob not created yet) as zeros.
func deviceRead(b backend.Blob, dst []byte, off int64, sizeOf func() int64) (int, error) {
	want := int(min(int64(len(dst)), max(sizeOf()-off, 0)))
	n, err := b.ReadAt(dst[:want], off)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil {
		return n, err
	}
	clear(dst[n:want])
	return want, nil
}

// lockedRange is pages a write or truncate holds busy.
type lockedRange struct {
	cr   *cache.Region
	p0   uint64
	busy []cache.Word
	was  []cache.Kind
}

// lock makes pages [p0, p1) busy, in ascending order.
func (r *region) lock(p0, p1 uint64) (*lockedRange, error) {
	cr, err := r.covering(p1 - 1)
	if err != nil {
		return nil, err
	}
	lr := &lockedRange{cr: cr, p0: p0}
	for p := p0; p < p1; p++ {
		w, k, err := lockPage(cr, p)
		if err != nil {
			lr.release()
			return nil, err
		}
		lr.busy, lr.was = append(lr.busy, w), append(lr.was, k)
	}
	return lr, nil
}

// release ends every transition unchanged: resident pages stay resident,
// absent ones absent.
func (lr *lockedRange) release() {
	for i, w := range lr.busy {
		p := lr.p0 + uint64(i)
		if lr.was[i] == cache.KindResident {
			_ = lr.cr.Publish(p, w, w.Dirty())
		} else {
			_ = lr.cr.Drop(p, w)
		}
	}
	lr.busy = nil
}

// written updates the locked pages after a write of the bytes src (a list
// of runs; n bytes of them were written) at off: resident pages take the
// new bytes; absent pages are cached too when nothing else of the page
// holds file bytes from before (the write covers it, or the rest lies past
// the old size, where the file reads zeros); the others stay absent.
//
// With writeBack (the device has not seen the write), every page the
// write covers is cached (the caller checked cachable, and stage put the
// new pages' bytes in the memfd already) and dirty; with writeThrough a
// page keeps the dirtiness it had, and a new page the memfd cannot take
// (no memory) stays out of the cache; with writeDirect (O_DIRECT) too, and
// no page is cached anew: only resident copies take the bytes.
func (r *region) written(lr *lockedRange, src [][]byte, off, n, oldSize int64, mode writeMode) {
	dirty := mode == writeBack
	cur := runCursor{runs: src}
	var allocated []uint64
	for i, w := range lr.busy {
		p := lr.p0 + uint64(i)
		ps, pe := int64(p)*cache.PageSize, int64(p+1)*cache.PageSize
		ws, we := max(ps, off), min(pe, off+n)
		resident := lr.was[i] == cache.KindResident
		switch {
		case ws >= we: // the write stopped short of this page
		case resident:
			if ps < oldSize && oldSize < ws {
				// The file's old last page, written past its end: the bytes
				// between read as zeros (zeroPastEnd).
				_ = lr.cr.WritePage(p, int(oldSize-ps), zeroPage[oldSize-ps:ws-ps])
			}
			cur.each(we-ws, func(b []byte, at int64) { _ = lr.cr.WritePage(p, int(ws-ps+at), b) })
			r.pc.WriteUpdated.Add(1)
		case (mode != writeDirect || r.pinned(p)) && (ws == ps || ps >= oldSize) && (we == pe || we >= oldSize):
			if dirty {
				cur.each(we-ws, func([]byte, int64) {}) // staged
			} else if r.pwritePage(p, &cur, ws-ps, we-ws) != nil {
				_ = r.punch(p, 1)
				r.pc.PageFailures.Add(1)
				break
			}
			r.pc.WriteAllocated.Add(1)
			allocated = append(allocated, p)
			resident = true
		default:
			cur.each(we-ws, func([]byte, int64) {})
		}
		switch {
		case resident && dirty && ws < we:
			r.markDirty(p)
			_ = lr.cr.Publish(p, w, true)
		case resident:
			_ = lr.cr.Publish(p, w, w.Dirty())
		default:
			_ = lr.cr.Drop(p, w)
		}
	}
	lr.busy = nil
	for _, p := range allocated {
		r.markResident(p, 1)
	}
}

// writeMode is how a write reached the device (region.written).
type writeMode int

const (
	writeBack    writeMode = iota // not yet: the pages are dirty
	writeThrough                  // before the pages were updated
	writeDirect                   // O_DIRECT: as writeThrough, caching no page anew
)

// pwritePage stores k bytes from cur at byte in of new page p with pwrite,
// which allocates the page without faulting it into io's mapping. A page
// the bytes cover in part is written whole, zeros around them: the memfd
// may hold bytes of its own there, which a client holding the data memfd
// read-write (a writable mapping, a write window) stored while the page
// was absent, and they must not become the file's.
func (r *region) pwritePage(p uint64, cur *runCursor, in, k int64) error {
	fd, at := int(r.dfd.Fd()), int64(cache.PageOffset(p))
	if in == 0 && k == cache.PageSize {
		var err error
		cur.each(k, func(b []byte, o int64) {
			if err == nil {
				err = pwriteFull(fd, b, at+o)
			}
		})
		return err
	}
	bp := getBounce()
	defer putBounce(bp)
	pg := (*bp)[:cache.PageSize]
	clear(pg)
	cur.each(k, func(b []byte, o int64) { copy(pg[in+o:], b) })
	return pwriteFull(fd, pg, at)
}

// stage is the first half of a write-back: it stores the bytes of the
// pages the write caches anew (absent, locked) into the memfd, changing no
// state. false: the memfd could not take one (no memory); those pages are
// punched again and nothing changed, the pages still locked.
func (r *region) stage(lr *lockedRange, src [][]byte, off, n int64) bool {
	cur := runCursor{runs: src}
	for i := range lr.busy {
		p := lr.p0 + uint64(i)
		ps, pe := int64(p)*cache.PageSize, int64(p+1)*cache.PageSize
		ws, we := max(ps, off), min(pe, off+n)
		if ws >= we || lr.was[i] == cache.KindResident {
			cur.each(max(we-ws, 0), func([]byte, int64) {})
			continue
		}
		if r.pwritePage(p, &cur, ws-ps, we-ws) != nil {
			for j := range i + 1 {
				if lr.was[j] != cache.KindResident {
					_ = r.punch(lr.p0+uint64(j), 1)
				}
			}
			return false
		}
	}
	return true
}

// cachable reports whether written would cache every page a write of n
// bytes at off covers (each is resident, or the write leaves nothing of it
// that holds file bytes from before): then the write can stay in the
// cache, dirty, without the device.
func (lr *lockedRange) cachable(off, n, oldSize int64) bool {
	for i := range lr.busy {
		p := lr.p0 + uint64(i)
		ps, pe := int64(p)*cache.PageSize, int64(p+1)*cache.PageSize
		ws, we := max(ps, off), min(pe, off+n)
		if ws >= we || lr.was[i] == cache.KindResident {
			continue
		}
		if !((ws == ps || ps >= oldSize) && (we == pe || we >= oldSize)) {
			return false
		}
	}
	return true
}

// runCursor walks a list of byte runs.
type runCursor struct {
	runs [][]byte
	ri   int // the run at the cursor
	ro   int // the byte in it
}

// each calls fn on the next k bytes, run by run, with each piece's offset
// from the cursor, and moves the cursor past them.
func (c *runCursor) each(k int64, fn func(b []byte, at int64)) {
	var at int64
	for k > 0 && c.ri < len(c.runs) {
		run := c.runs[c.ri][c.ro:]
		step := min(int64(len(run)), k)
		fn(run[:step], at)
		at += step
		k -= step
		c.ro += int(step)
		if c.ro == len(c.runs[c.ri]) {
			c.ri, c.ro = c.ri+1, 0
		}
	}
}

// truncated drops the pages past a new size (under trunc, with the
// backend truncated already) and zeroes the tail of the last one.
func (r *region) truncated(size int64) {
	cr := r.cur.Load()
	first := (uint64(size) + cache.PageSize - 1) / cache.PageSize
	if tail := size % cache.PageSize; tail != 0 {
		p := uint64(size) / cache.PageSize
		if p < cr.Pages() {
			if w, k, err := lockPage(cr, p); err == nil {
				if k == cache.KindResident {
					zero := make([]byte, cache.PageSize-tail)
					_ = cr.WritePage(p, int(tail), zero)
					_ = cr.Publish(p, w, w.Dirty())
				} else {
					_ = cr.Drop(p, w)
				}
			}
		}
	}
	pages := r.residentFrom(first)
	for len(pages) > 0 {
		// A run of adjacent pages in one chunk: one punch.
		n := 1
		for n < len(pages) && pages[n] == pages[n-1]+1 && pages[n]/cache.ChunkPages == pages[0]/cache.ChunkPages {
			n++
		}
		run := pages[:n]
		pages = pages[n:]
		if run[0] >= cr.Pages() {
			break
		}
		var busy []cache.Word
		for _, p := range run {
			w, _, err := lockPage(cr, p)
			if err != nil {
				break // a malformed word: cannot be, io writes them all
			}
			busy = append(busy, w)
		}
		_ = r.punch(run[0], len(busy))
		for i, w := range busy {
			r.markAbsent(run[i])
			_ = cr.Drop(run[i], w)
		}
	}
	cr.NewGeneration()
}

// setFields publishes the blob's live size, mtime and data version in the
// region's field group.
func (r *region) setFields(live func() (size, mtime int64, dv uint64)) {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return
	}
	r.fieldsMu.Lock()
	// Read under the lock: of two changes' calls, the later stores the
	// newer fields (read before it, they could go back over them).
	size, mtime, dv := live()
	r.cur.Load().SetFields(cache.Fields{Size: uint64(max(size, 0)), Mtime: mtime, Ctime: mtime, DataVersion: dv})
	r.fieldsMu.Unlock()
}

// memoryBytes is the memory the memfds hold (their allocated blocks):
// what the region costs, whoever faulted the pages in.
func (r *region) memoryBytes() int64 {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return 0
	}
	return r.memoryLocked()
}

// memoryLocked is memoryBytes with life held.
func (r *region) memoryLocked() int64 {
	var n int64
	for _, f := range []*os.File{r.fd, r.dfd} {
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}
