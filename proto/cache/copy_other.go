//go:build !amd64 || race

package cache

// copyOut copies len(dst) bytes at off into dst with atomic loads: on a
// weakly ordered host a plain copy's loads could be reordered after the
// state word's second load, and under the race detector the seqlock's
// intended race would be reported.
func (r *Region) copyOut(dst []byte, off uint64) { r.copyAtomic(dst, off) }

// copyIn stores src at off with atomic stores (copyInAtomic): on a weakly
// ordered host, and so that the race detector sees the seqlock's writes as
// the synchronised accesses they are.
func (r *Region) copyIn(off uint64, src []byte) { r.copyInAtomic(off, src) }
