//go:build spdk

package spdk

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"github.com/weir-storage/weir/services/io/backend"
)

/*
#include "weir_spdk.h"
*/
import "C"

// bouncePool keeps DMA-able buffers (spdk_dma_malloc) for the payloads
// that cannot go to the device from where they are: unregistered or
// unaligned memory, and the partial edge units of a read-modify-write. Two
// sizes: one io unit, and maxIO. Callers on any goroutine.
type bouncePool struct {
	unit int64

	mu    sync.Mutex
	small [][]byte // one io unit each; protected by mu
	large [][]byte // maxIO each; protected by mu
	all   [][]byte // every buffer made, to free; protected by mu
}

// poolKeep bounds the buffers of each size kept for reuse.
const poolKeep = 64

// get returns n bytes (at most maxIO) of DMA-able memory, or ENOMEM when
// SPDK has none left (io.spdk_mem_mb, or free huge pages, too small).
func (p *bouncePool) get(n int64) ([]byte, error) {
	size := int64(maxIO)
	if n <= p.unit {
		size = p.unit
	}
	p.mu.Lock()
	list := &p.large
	if size == p.unit {
		list = &p.small
	}
	if k := len(*list); k > 0 {
		b := (*list)[k-1]
		*list = (*list)[:k-1]
		p.mu.Unlock()
		return b[:n], nil
	}
	p.mu.Unlock()
	mem := C.spdk_dma_malloc(C.size_t(size), 4096, nil)
	if mem == nil {
		return nil, fmt.Errorf("no DMA memory for a %d-byte bounce buffer: %w", size, syscall.ENOMEM)
	}
	b := dmaSlice(mem, size)
	p.mu.Lock()
	p.all = append(p.all, b)
	p.mu.Unlock()
	return b[:n], nil
}

func (p *bouncePool) put(b []byte) {
	b = b[:cap(b)]
	p.mu.Lock()
	defer p.mu.Unlock()
	list := &p.large
	if int64(len(b)) == p.unit {
		list = &p.small
	}
	if len(*list) < poolKeep {
		*list = append(*list, b)
		return
	}
	p.all = slices.DeleteFunc(p.all, func(x []byte) bool { return sameBuf(x, b) })
	dmaFree(b)
}

// free releases every buffer; no I/O may be in flight.
func (p *bouncePool) free() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.all {
		dmaFree(b)
	}
	p.all, p.small, p.large = nil, nil, nil
}

// memRegistry is the memory registered with SPDK (spdk_mem_register) for
// direct I/O: address ranges, few (one per session).
type memRegistry struct {
	mu       sync.RWMutex
	ranges   [][2]uintptr // [start, end); protected by mu
	failures uint64       // protected by mu
}

func (m *memRegistry) contains(b []byte) bool {
	start := bufAddr(b)
	end := start + uintptr(len(b))
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, r := range m.ranges {
		if start >= r[0] && end <= r[1] {
			return true
		}
	}
	return false
}

func (m *memRegistry) counts() (regions, failures uint64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return uint64(len(m.ranges)), m.failures
}

var _ backend.MemRegistrar = (*Backend)(nil)

// hugePage is the unit SPDK registers memory in.
const hugePage = 2 << 20

// HugePages is true unless SPDK runs on ordinary memory (Options.NoHuge).
func (be *Backend) HugePages() bool { return !be.opts.NoHuge }

// RegisterMem registers mem with SPDK so that reads and writes of it go to
// the device with no copy. mem must start and end on a 2 MiB boundary
// (a huge-page memfd mapping does). On failure the memory is still served,
// through bounce buffers, and the failure is counted.
func (be *Backend) RegisterMem(mem []byte) error {
	start := bufAddr(mem)
	if len(mem) == 0 || start%hugePage != 0 || len(mem)%hugePage != 0 {
		be.regs.fail()
		return fmt.Errorf("backend spdk: register memory at %#x (%d bytes): %w: SPDK registers whole 2 MiB pages",
			start, len(mem), syscall.EINVAL)
	}
	if be.gone.Load() {
		return fmt.Errorf("backend spdk: register memory: %w", syscall.EBADF)
	}
	if rc := C.spdk_mem_register(bufPtr(mem), C.size_t(len(mem))); rc != 0 {
		be.regs.fail()
		return fmt.Errorf("backend spdk: register memory at %#x (%d bytes): %w", start, len(mem), syscall.Errno(-rc))
	}
	be.regs.mu.Lock()
	be.regs.ranges = append(be.regs.ranges, [2]uintptr{start, start + uintptr(len(mem))})
	be.regs.mu.Unlock()
	return nil
}

func (m *memRegistry) fail() {
	m.mu.Lock()
	m.failures++
	m.mu.Unlock()
}

// UnregisterMem undoes RegisterMem(mem). No I/O of mem may be in flight.
func (be *Backend) UnregisterMem(mem []byte) error {
	start := bufAddr(mem)
	r := [2]uintptr{start, start + uintptr(len(mem))}
	be.regs.mu.Lock()
	i := slices.Index(be.regs.ranges, r)
	if i >= 0 {
		be.regs.ranges = slices.Delete(be.regs.ranges, i, i+1)
	}
	be.regs.mu.Unlock()
	if i < 0 {
		return fmt.Errorf("backend spdk: unregister memory at %#x (%d bytes): %w", start, len(mem), errors.New("not registered"))
	}
	if rc := C.spdk_mem_unregister(bufPtr(mem), C.size_t(len(mem))); rc != 0 {
		return fmt.Errorf("backend spdk: unregister memory at %#x: %w", start, syscall.Errno(-rc))
	}
	return nil
}
