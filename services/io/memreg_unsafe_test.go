package iosvc_test

import "unsafe"

// span returns the address range [start, end) of b.
func span(b []byte) (start, end uintptr) {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p, p + uintptr(len(b))
}

// within reports whether p lies inside mem.
func within(p, mem []byte) bool {
	ps, pe := span(p)
	ms, me := span(mem)
	return ps >= ms && pe <= me
}

// sameSlice reports whether a and b are the same bytes: same start, same length.
func sameSlice(a, b []byte) bool {
	as, ae := span(a)
	bs, be := span(b)
	return as == bs && ae == be
}
