package file

// The only use of unsafe in the package: finding where a Go byte slice
// starts in memory, to align O_DIRECT bounce buffers. The Go heap does not
// move objects, so an address aligned once stays aligned.

import "unsafe"

// alignedBuf returns a slice of size bytes whose first byte sits at an
// address that is a multiple of align (a power of two).
func alignedBuf(size, align int) []byte {
	raw := make([]byte, size+align)
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(raw)))
	skip := int(-addr & uintptr(align-1))
	return raw[skip : skip+size : skip+size]
}

// isAligned reports whether p starts at a multiple of align.
func isAligned(p []byte, align int) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(p)))&uintptr(align-1) == 0
}
