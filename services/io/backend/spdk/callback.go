//go:build spdk

package spdk

// #include <stdint.h>
import "C"

// weirGoIODone completes a worker's I/O from SPDK's completion callback
// through cgo: the alternative to the C completion queue, kept to measure
// it (Options.CGOCallbacks, docs/spdk-backend.md). It runs on the worker's
// goroutine, inside spdk_thread_poll.
//
//export weirGoIODone
func weirGoIODone(tag C.uint64_t, rc C.int) {
	v, ok := callbackWorkers.Load(uint64(tag) >> 32)
	if !ok {
		panic("spdk: completion for an unknown worker")
	}
	v.(*worker).complete(uint32(tag), int32(rc))
}
