package iosvc

import (
	"sync/atomic"
	"unsafe"
)

// swapWord atomically takes the little-endian u64 at mem[off:off+8] (off
// a multiple of 8 in a page-aligned mapping the client shares) and leaves
// zero: a bit the client sets at the same time is either taken or stays.
func swapWord(mem []byte, off int) uint64 {
	_ = mem[off+7]
	return atomic.SwapUint64((*uint64)(unsafe.Pointer(&mem[off])), 0)
}

// storeWord atomically stores v as the little-endian u64 at mem[off:off+8]
// (sequentially consistent: a store of 0 before the final swap of a slot,
// windows.go endWindow).
func storeWord(mem []byte, off int, v uint64) {
	_ = mem[off+7]
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[off])), v)
}
