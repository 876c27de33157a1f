//go:build spdk

package spdk

import "unsafe"

func unsafePointer(p []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(p)) }
