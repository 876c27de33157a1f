//go:build spdk

package spdk

// A worker's C memory: its ops and its completion queue.

import "unsafe"

/*
#include "weir_spdk.h"
*/
import "C"

// allocOps allocates n zeroed weir_ops in C memory, viewed as a slice.
// Free them with freeOps.
func allocOps(n int) []C.weir_op {
	mem := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.weir_op{})))
	return unsafe.Slice((*C.weir_op)(mem), n)
}

func freeOps(ops []C.weir_op) { C.free(unsafe.Pointer(unsafe.SliceData(ops))) }

// allocCQ allocates a zeroed completion queue with room for n slots, in C
// memory, and returns it with a view of its slots. Free it with freeCQ.
func allocCQ(n int) (*C.weir_cq, []C.uint32_t) {
	cq := (*C.weir_cq)(C.calloc(1, C.size_t(unsafe.Sizeof(C.weir_cq{}))+C.size_t(n)*4))
	return cq, unsafe.Slice(C.weir_cq_slots(cq), n)
}

func freeCQ(cq *C.weir_cq) { C.free(unsafe.Pointer(cq)) }
