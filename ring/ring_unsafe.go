package ring

// All pointer arithmetic on the shared mapping and every raw atomic on it
// lives in this file. The rest of the package sees typed accessors that take
// offsets it has already bounds-checked against the region's geometry.

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/ring/internal/race"
)

// word32 returns the shared uint32 at off. off must be 4-aligned and inside
// the mapping; callers only pass header constants and slot offsets derived
// from the validated geometry.
func (r *Region) word32(off uint64) *uint32 {
	return (*uint32)(unsafe.Pointer(&r.mem[off]))
}

func (r *Region) word64(off uint64) *uint64 {
	return (*uint64)(unsafe.Pointer(&r.mem[off]))
}

func (r *Region) load32(off uint64) uint32     { return atomic.LoadUint32(r.word32(off)) }
func (r *Region) store32(off uint64, v uint32) { atomic.StoreUint32(r.word32(off), v) }
func (r *Region) add32(off uint64, d uint32)   { atomic.AddUint32(r.word32(off), d) }
func (r *Region) load64(off uint64) uint64     { return atomic.LoadUint64(r.word64(off)) }
func (r *Region) store64(off uint64, v uint64) { atomic.StoreUint64(r.word64(off), v) }

// raceRelease and raceAcquire annotate the publish / observe of the slot
// whose index is key (see package race). Keys are shared by every mapping of
// the same memfd in this process.
func (r *Region) raceRelease(key int) {
	if race.Enabled {
		race.ReleaseMerge(unsafe.Pointer(&r.raceKeys[key]))
	}
}

func (r *Region) raceAcquire(key int) {
	if race.Enabled {
		race.Acquire(unsafe.Pointer(&r.raceKeys[key]))
	}
}

// Futex operations (linux/futex.h). Not FUTEX_PRIVATE_FLAG: the word is
// shared with another process.
const (
	futexOpWait = 0
	futexOpWake = 1
)

// futexWait sleeps while the shared word at off still holds val, for at most
// d. The futex is not private: the other side lives in another process.
// EAGAIN (value changed), EINTR and ETIMEDOUT all mean "look again".
func (r *Region) futexWait(off uint64, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(r.word32(off))),
		futexOpWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every sleeper on the shared word at off.
func (r *Region) futexWake(off uint64) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(r.word32(off))),
		futexOpWake, uintptr(1<<30), 0, 0, 0)
}
