//go:build amd64 && !race

package cache

// copyOut copies len(dst) bytes at off into dst. On amd64 (TSO) loads are
// not reordered with other loads, and the compiler does not move memory
// accesses across the atomic loads of the state word around the copy, so
// a plain copy (SIMD) keeps the seqlock's order.
func (r *Region) copyOut(dst []byte, off uint64) { copy(dst, r.data[off:off+uint64(len(dst))]) }

// copyIn stores src at off (the service, holding the page busy): on amd64
// stores are not reordered with other stores, so a plain copy lands before
// the compare-and-swap that publishes the page.
func (r *Region) copyIn(off uint64, src []byte) { copy(r.data[off:off+uint64(len(src))], src) }
