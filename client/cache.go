package client

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/edsrzf/mmap-go"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/proto/cache"
)

// A readable file maps its cache region (docs/cache-abi.md) read-only, the
// first time it is read in a session generation, and reads resident pages
// straight from it: no system call, no round trip. What is not resident it
// reads through the ring, which has the IO service fill it (with
// readahead) for the next read. The service keeps the region coherent with
// every write, so bytes a WriteAt returned are what a ReadAt anywhere
// reads.

// fileCache is a file's mapping of its cache region in one session
// generation.
type fileCache struct {
	gen   uint64
	f, df *os.File // the region's meta and data memfds (read-only descriptions)

	mu        sync.RWMutex // readers hold it shared; remap and unmap exclusive
	mem, dmem mmap.MMap    // nil once unmapped
	cr        *cache.Region
}

// mapAfterReads: a handle maps its region at its third read. Mapping costs
// a round trip, a message on the socket and an mmap; a file read once or
// twice (ReadFile: its bytes, then EOF) does not pay it, and its reads
// through the ring are served from the IO service's cache all the same.
const mapAfterReads = 2

// cacheMapTimeout bounds the wait for the region's memfd on the socket
// (the service sends it before it answers).
const cacheMapTimeout = 5 * time.Second

// cacheIn returns the file's mapping for the sessions c, mapping the
// region if need be; nil when it has none (the service has no cache, or
// mapping failed: the file reads through the ring).
func (fl *File) cacheIn(c *conn) *fileCache {
	fl.cmu.Lock()
	defer fl.cmu.Unlock()
	if fc := fl.fcache; fc != nil && fc.gen == c.gen {
		return fc
	}
	fl.fcFast.Store(nil)
	if fl.noCache == c.gen+1 {
		return nil
	}
	if old := fl.fcache; old != nil {
		old.unmap() // of a session that is gone: its service too
		fl.fcache = nil
	}
	fc, err := fl.mapCache(c)
	if err != nil {
		fl.noCache = c.gen + 1
		return nil
	}
	fl.fcache = fc
	fl.fcFast.Store(fc)
	return fc
}

// mapCache asks the IO service for the file's region and maps it.
func (fl *File) mapCache(c *conn) (*fileCache, error) {
	h, err := fl.grantedHandle(c)
	if err != nil {
		return nil, err
	}
	if again, err := fl.settleClaim(); err != nil {
		return nil, err
	} else if again {
		if h, err = fl.grantedHandle(c); err != nil {
			return nil, err
		}
	}
	comp, err := call(bgctx, c.data, proto.OpCacheMap, 0, h, 0, nil, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(bgctx, cacheMapTimeout)
	defer cancel()
	f, err := c.data.ReceiveFile(ctx, comp.Aux)
	if err != nil {
		return nil, err
	}
	df, err := c.data.ReceiveFile(ctx, comp.Aux+1)
	if err != nil {
		f.Close()
		return nil, err
	}
	fc := &fileCache{gen: c.gen, f: f, df: df}
	if err := fc.remap(); err != nil {
		f.Close()
		df.Close()
		return nil, err
	}
	return fc, nil
}

// remap maps the meta memfd whole as it is now (the service grows it,
// never shrinks it), and the part of the data memfd it has state pages
// for (cache.DataMapSize). fc.mu is held exclusive, or fc is not shared
// yet.
func (fc *fileCache) remap() error {
	var ms [2]mmap.MMap
	var metaSize int64
	for i, f := range []*os.File{fc.f, fc.df} {
		st, err := f.Stat()
		if err == nil && (st.Size() < int64(1-i)*cache.HeaderSize || st.Size() > int64(^uint(0)>>1)) {
			err = fmt.Errorf("cache region memfd of %d bytes", st.Size())
		}
		size := st.Size()
		if i == 0 {
			metaSize = size
		} else if err == nil {
			size = int64(cache.DataMapSize(uint64(metaSize), uint64(size)))
		}
		if err == nil && size > 0 {
			ms[i], err = mmap.MapRegion(f, int(size), mmap.RDONLY, 0, 0)
		}
		if err != nil {
			if ms[0] != nil {
				ms[0].Unmap()
			}
			return fmt.Errorf("map the cache region: %w", err)
		}
	}
	cr, err := cache.Attach(ms[0], ms[1])
	if err != nil {
		ms[0].Unmap()
		if ms[1] != nil {
			ms[1].Unmap()
		}
		return err
	}
	fc.unmapLocked()
	fc.mem, fc.dmem, fc.cr = ms[0], ms[1], cr
	return nil
}

// unmapLocked unmaps both mappings; fc.mu is held exclusive.
func (fc *fileCache) unmapLocked() {
	if fc.mem != nil {
		fc.mem.Unmap()
	}
	if fc.dmem != nil {
		fc.dmem.Unmap()
	}
	fc.mem, fc.dmem, fc.cr = nil, nil, nil
}

// unmap releases the mappings and the memfds, once no read uses them.
func (fc *fileCache) unmap() {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.mem != nil {
		fc.unmapLocked()
		fc.f.Close()
		fc.df.Close()
	}
}

// read copies file bytes at off into p from the region. It returns how
// many it copied, whether the region answered at all (false: read
// everything through the ring), and io.EOF when the read reaches the end
// of the file (the region's live size).
func (fc *fileCache) read(p []byte, off int64) (int, bool, error) {
	fc.mu.RLock()
	n, ok, err, grow := fc.readLocked(p, off)
	fc.mu.RUnlock()
	if !grow {
		return n, ok, err
	}
	// The file grew past the mapping: map the region's new size.
	fc.mu.Lock()
	if fc.cr != nil && fc.cr.Capacity() > fc.cr.Pages()*cache.PageSize {
		_ = fc.remap()
	}
	fc.mu.Unlock()
	fc.mu.RLock()
	defer fc.mu.RUnlock()
	n, ok, err, _ = fc.readLocked(p, off)
	return n, ok, err
}

func (fc *fileCache) readLocked(p []byte, off int64) (n int, ok bool, err error, grow bool) {
	if fc.cr == nil {
		return 0, false, nil, false
	}
	fields, stable := fc.cr.Fields()
	if !stable || fields.Check() != nil {
		return 0, false, nil, false
	}
	size := int64(fields.Size)
	if off >= size {
		return 0, true, io.EOF, false
	}
	want := int(min(int64(len(p)), size-off))
	if uint64(off) >= cache.MaxCapacity {
		return 0, false, nil, false
	}
	n = fc.cr.ReadAt(p[:want], uint64(off))
	if n < want && (uint64(off)+uint64(n))/cache.PageSize >= fc.cr.Pages() && fc.cr.Capacity() > fc.cr.Pages()*cache.PageSize {
		return n, true, nil, true
	}
	if n == want && want < len(p) {
		return n, true, io.EOF, false
	}
	return n, true, nil, false
}

// readCached reads p at off from the file's region, and what it does not
// hold through the ring. ok false: the file has no region; read through
// the ring.
func (fl *File) readCached(p []byte, off int64) (n int, err error, ok bool) {
	if fl.ringReads.Load() < mapAfterReads {
		fl.ringReads.Add(1)
		return 0, nil, false
	}
	meta := fl.fs.metaNow.Load()
	if meta == nil {
		return 0, nil, false // the FS is closed: the ring path says so
	}
	meta.Poll() // hands a recall notice waiting there to its goroutine (leases.go)
	fc := fl.fcFast.Load()
	if fc == nil || fc.gen != fl.fs.gen.Load() {
		if fc = fl.cacheIn(fl.fs.current()); fc == nil {
			return 0, nil, false
		}
	}
	n, ok, err = fc.read(p, off)
	if !ok || err != nil || n == len(p) {
		if ok {
			fl.fs.CacheHits.Add(1)
			fl.readahead(fc, off, n)
		}
		return n, err, ok
	}
	fl.fs.CacheMisses.Add(1)
	m, err := fl.readRing(p[n:], off+int64(n))
	fl.readahead(fc, off, n+m)
	return n + m, err, true
}

// maxHint bounds the bytes one readahead hint asks for (the service's
// bound too).
const maxHint = 8 << 20

// readahead keeps a sequential reader ahead of the device: after a read of
// n bytes at off that continues the last one, if the page one more such
// read ahead is not resident, it asks the service (on a goroutine, one at a
// time per file) to fill the next two reads' worth.
func (fl *File) readahead(fc *fileCache, off int64, n int) {
	prev := fl.seqEnd.Swap(off + int64(n))
	if prev != off || n == 0 || fc.resident(off+2*int64(n)) || !fl.hinting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer fl.hinting.Store(false)
		_ = fl.dataOp(true, func(c *conn, h uint64) error {
			_, err := call(bgctx, c.data, proto.OpReadahead, uint32(min(2*n, maxHint)), h, uint64(off+int64(n)), nil, nil)
			return err
		})
	}()
}

// resident reports whether the page holding file byte off is resident, or
// lies at or past the end of the file (nothing to read ahead).
func (fc *fileCache) resident(off int64) bool {
	fc.mu.RLock()
	defer fc.mu.RUnlock()
	if fc.cr == nil {
		return true
	}
	if f, ok := fc.cr.Fields(); !ok || off >= int64(f.Size) {
		return true
	}
	w, err := fc.cr.State(uint64(off) / cache.PageSize)
	return err != nil || w.Kind() != cache.KindAbsent
}
