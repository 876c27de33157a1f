package client_test

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/ring"
)

// rawRing is a client of a ring region that submits by hand
// (docs/ring-abi.md §3, §4) and never takes a completion: what no honest
// client does, and the ring.Client cannot do (its callers reap).
type rawRing struct {
	r   *ring.Region
	mem []byte
	g   ring.Geometry
	pos uint64 // the SQ producer position
	id  uint64
}

func newRawRing(r *ring.Region) *rawRing { return &rawRing{r: r, mem: r.Bytes(), g: r.Geometry()} }

// ABI offsets the attacker writes (docs/ring-abi.md).
const (
	rawSQBell    = 128
	rawSQWaiters = 132
	rawOpcode    = 8
	rawReqID     = 16
	futexWake    = 1 // FUTEX_WAKE (shared: the service sleeps on the word)
)

func (rr *rawRing) word64(off uint64) *uint64 { return (*uint64)(unsafe.Pointer(&rr.mem[off])) }
func (rr *rawRing) word32(off uint64) *uint32 { return (*uint32)(unsafe.Pointer(&rr.mem[off])) }

// fill submits op (no payload) into every free SQ slot and rings the
// doorbell; it returns how many it submitted.
func (rr *rawRing) fill(op uint8) int {
	n := 0
	for {
		off := rr.g.SQOffset + (rr.pos&uint64(rr.g.SQEntries-1))*ring.SQSlotSize
		if atomic.LoadUint64(rr.word64(off)) != rr.pos {
			break
		}
		slot := rr.mem[off+8 : off+ring.SQSlotSize]
		clear(slot)
		rr.mem[off+rawOpcode] = op
		rr.id++
		binary.LittleEndian.PutUint64(rr.mem[off+rawReqID:], rr.id)
		atomic.StoreUint64(rr.word64(off), rr.pos+1)
		rr.pos++
		n++
	}
	if n > 0 {
		atomic.AddUint32(rr.word32(rawSQBell), 1)
		if atomic.LoadUint32(rr.word32(rawSQWaiters)) != 0 {
			unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(rr.word32(rawSQBell))), futexWake, 1, 0, 0, 0)
		}
	}
	return n
}
