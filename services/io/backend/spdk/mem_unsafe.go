//go:build spdk

package spdk

// Pointer work on payload buffers and DMA memory. This file, spdk_unsafe.go
// and worker_unsafe.go are the only files of the package that import
// unsafe; the rest of it sees []byte and typed C values.

import "unsafe"

/*
#include "weir_spdk.h"
*/
import "C"

// bufPtr is the address of b's first byte, for SPDK calls and iovecs. The
// caller keeps b alive while C uses the pointer (until the I/O completes).
func bufPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// bufAddr is the address of b's first byte as a number, for alignment
// checks and registered-range lookups. It does not keep b alive.
func bufAddr(b []byte) uintptr { return uintptr(bufPtr(b)) }

// sameBuf reports whether a and b start at the same byte.
func sameBuf(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }

// dmaSlice views the n bytes of C (DMA) memory at mem as a slice. The
// memory is not Go's: it lives until dmaFree.
func dmaSlice(mem unsafe.Pointer, n int64) []byte { return unsafe.Slice((*byte)(mem), n) }

// dmaFree releases DMA memory viewed by dmaSlice; b may be resliced but
// must start where dmaSlice's view started.
func dmaFree(b []byte) { C.spdk_dma_free(bufPtr(b)) }
