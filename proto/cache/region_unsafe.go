package cache

// Every raw access to the shared mapping lives here. Offsets come from the
// checked accessors of region.go.
//
// The service stores page bytes with 8-byte atomic stores (copyIn). A
// reader's copy races with the service's transitions by design (the seqlock
// of ReadPage detects it), and its loads must not be reordered after the
// state word's second load: on amd64 without the race detector it is a
// plain copy (copy_amd64.go: TSO keeps loads in order), elsewhere a copy of
// 8-byte atomic loads (copyAtomic).

import (
	"encoding/binary"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Words of the meta memfd (header, state words).
func (r *Region) word32(off uint64) *uint32 { return (*uint32)(unsafe.Pointer(&r.meta[off])) }
func (r *Region) word64(off uint64) *uint64 { return (*uint64)(unsafe.Pointer(&r.meta[off])) }

// Words of the data memfd (page bytes).
func (r *Region) dataWord(off uint64) *uint64 { return (*uint64)(unsafe.Pointer(&r.data[off])) }
func (r *Region) dload64(off uint64) uint64   { return atomic.LoadUint64(r.dataWord(off)) }
func (r *Region) dstore64(off uint64, v uint64) {
	atomic.StoreUint64(r.dataWord(off), v)
}
func (r *Region) dcas64(off uint64, o, n uint64) bool {
	return atomic.CompareAndSwapUint64(r.dataWord(off), o, n)
}

func (r *Region) load32(off uint64) uint32     { return atomic.LoadUint32(r.word32(off)) }
func (r *Region) store32(off uint64, v uint32) { atomic.StoreUint32(r.word32(off), v) }
func (r *Region) cas32(off uint64, o, n uint32) bool {
	return atomic.CompareAndSwapUint32(r.word32(off), o, n)
}
func (r *Region) load64(off uint64) uint64     { return atomic.LoadUint64(r.word64(off)) }
func (r *Region) store64(off uint64, v uint64) { atomic.StoreUint64(r.word64(off), v) }
func (r *Region) add64(off uint64, d uint64)   { atomic.AddUint64(r.word64(off), d) }

// copyAtomic copies len(dst) bytes of the data memfd at off into dst with aligned 8-byte
// atomic loads (the words at the edges are loaded whole): the copy for
// weakly ordered hosts and for the race detector, which would otherwise
// see the seqlock's intended race.
func (r *Region) copyAtomic(dst []byte, off uint64) {
	for len(dst) > 0 && off&7 != 0 {
		var w [8]byte
		base := off &^ 7
		binary.LittleEndian.PutUint64(w[:], r.dload64(base))
		n := copy(dst, w[off-base:])
		dst, off = dst[n:], off+uint64(n)
	}
	for len(dst) >= 8 {
		binary.LittleEndian.PutUint64(dst, r.dload64(off))
		dst, off = dst[8:], off+8
	}
	if len(dst) > 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.dload64(off))
		copy(dst, w[:])
	}
}

// maxMerge bounds how long copyInAtomic retries the compare-and-swap of one word a
// client keeps storing into: past it io stores its merge anyway (the
// client may lose a store of its own) rather than be held. Two goroutines
// racing on one word under the race detector failed each other's
// compare-and-swap for over 10 ms (TestCopyInKeepsNeighbourStores).
const maxMerge = 50 * time.Millisecond

// copyInAtomic stores src at off with aligned 8-byte atomic stores. A
// word at an edge, which src covers only in part, is merged with a
// compare-and-swap: the caller holds the page busy, but a client storing
// through a writable mapping or a write window (docs/cache-abi.md §7) may
// store into the word's other bytes at the same time, and a load, merge
// and store would take its store back.
func (r *Region) copyInAtomic(off uint64, src []byte) {
	var w [8]byte
	for len(src) > 0 {
		base := off &^ 7
		if off == base && len(src) >= 8 {
			r.dstore64(base, binary.LittleEndian.Uint64(src))
			src, off = src[8:], off+8
			continue
		}
		n := 0
		var since time.Time
		for try := 0; ; try++ {
			old := r.dload64(base)
			binary.LittleEndian.PutUint64(w[:], old)
			n = copy(w[off-base:], src)
			if r.dcas64(base, old, binary.LittleEndian.Uint64(w[:])) {
				break
			}
			if try%16 != 15 {
				continue
			}
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) > maxMerge {
				// A client storing into the word without pause: it may
				// lose a store of its own, and holds io no longer.
				r.dstore64(base, binary.LittleEndian.Uint64(w[:]))
				break
			}
			runtime.Gosched() // let the racing store land
		}
		src, off = src[n:], off+uint64(n)
	}
}
