//go:build race

// Package race tells the race detector about happens-before edges that it
// cannot see: the ring's atomics live in shared memory outside the Go heap,
// where the detector ignores them, so every publish and observe of a queue
// slot is annotated with a release and an acquire on a Go-heap key.
package race

import (
	"runtime"
	"unsafe"
)

// Enabled is true when the binary is built with -race.
const Enabled = true

// Acquire makes everything released on key visible to the caller.
func Acquire(key unsafe.Pointer) { runtime.RaceAcquire(key) }

// ReleaseMerge publishes the caller's history on key.
func ReleaseMerge(key unsafe.Pointer) { runtime.RaceReleaseMerge(key) }
