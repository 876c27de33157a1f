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
