//go:build spdk

package spdk

// C memory for metadata operations and C strings; see mem_unsafe.go for
// payload buffers.

import "unsafe"

/*
#include "weir_spdk.h"
*/
import "C"

// newOp allocates one zeroed weir_op in C memory, so that SPDK may keep a
// pointer to it. Free it with freeOp.
func newOp() *C.weir_op {
	return (*C.weir_op)(C.calloc(1, C.size_t(unsafe.Sizeof(C.weir_op{}))))
}

func freeOp(op *C.weir_op) { C.free(unsafe.Pointer(op)) }

// freeCString releases a string made by C.CString.
func freeCString(s *C.char) { C.free(unsafe.Pointer(s)) }

// newDevState allocates the filter device's zeroed state (weir_filter_dev,
// wStateLen ints); freeDevState releases it.
func newDevState() *C.int { return (*C.int)(C.calloc(wStateLen, C.size_t(unsafe.Sizeof(C.int(0))))) }

func freeDevState(p *C.int) { C.free(unsafe.Pointer(p)) }

// devStateAt reads entry i of the filter device's state; setDevState sets
// it (atomically: the device's threads read it).
func devStateAt(p *C.int, i int) int { return int(C.weir_filter_at(p, C.int(i))) }

func setDevState(p *C.int, i, v int) { C.weir_filter_set(p, C.int(i), C.int(v)) }

// dmaAlloc allocates n bytes of zeroed DMA memory, aligned to align, as a
// slice (nil without memory); dmaFree releases it.
func dmaAlloc(n, align int64) []byte {
	p := C.spdk_dma_zmalloc(C.size_t(n), C.size_t(align), nil)
	if p == nil {
		return nil
	}
	return dmaSlice(p, n)
}

// getIdentityXattr and setIdentityXattr move an identity through a blob
// xattr.
func getIdentityXattr(blob *C.struct_spdk_blob, name *C.char, id *[16]byte) C.int {
	return C.weir_get_bytes(blob, name, unsafe.Pointer(&id[0]), 16)
}

func setIdentityXattr(blob *C.struct_spdk_blob, name *C.char, id *[16]byte) C.int {
	return C.weir_set_bytes(blob, name, unsafe.Pointer(&id[0]), 16)
}
