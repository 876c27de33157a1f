//go:build spdk

package spdk

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weir-storage/weir/services/io/backend"
)

/*
#include "weir_spdk.h"
*/
import "C"

// maxInflight bounds the I/Os one worker has submitted to SPDK at once
// (the blobstore channel allows 512 by default). Requests beyond it wait in
// the worker's Go queue.
const maxInflight = 128

// maxIO is the largest single I/O, in bytes: longer reads and writes are
// split at multiples of maxIO, each piece its own SPDK I/O, one after
// another.
const maxIO = 1 << 20

// ioReq is one read or write of whole io units, from a caller to a worker.
type ioReq struct {
	blob   *C.struct_spdk_blob
	write  bool
	off, n uint64 // io units
	iov    [C.WEIR_MAX_IOV][]byte
	niov   int

	rc   atomic.Int32
	done atomic.Bool
	wake chan struct{} // cap 1; a send follows done
}

var reqPool = sync.Pool{New: func() any { return &ioReq{wake: make(chan struct{}, 1)} }}

func getReq() *ioReq {
	q := reqPool.Get().(*ioReq)
	q.blob, q.write, q.off, q.n, q.niov = nil, false, 0, 0, 0
	q.done.Store(false)
	return q
}

func putReq(q *ioReq) {
	clear(q.iov[:])
	q.blob = nil
	reqPool.Put(q)
}

func (q *ioReq) add(b []byte) { q.iov[q.niov] = b; q.niov++ }

func (q *ioReq) finish(rc int32) {
	q.rc.Store(rc)
	q.done.Store(true)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *ioReq) err() error {
	if rc := q.rc.Load(); rc != 0 {
		return syscall.Errno(-rc)
	}
	return nil
}

// worker is one I/O worker: a locked OS thread that owns an SPDK thread and
// a blobstore I/O channel, takes requests from reqs, submits them and polls
// its thread for their completions. It polls while it has I/O in flight,
// and for idleSleep after; then it sleeps until a request, a kick (the
// metadata thread waits on a barrier that needs this thread) or a 1 ms tick
// for SPDK's timed pollers.
type worker struct {
	be   *Backend
	idx  int
	tag  uint64 // high 32 bits of the cgo-callback tags of this worker's ops
	reqs chan *ioReq
	kick chan struct{}
	quit chan struct{}
	done chan struct{}
	load atomic.Int64 // requests handed to this worker and not yet returned

	// Owned by the worker's goroutine:
	thread   *C.struct_spdk_thread
	ch       *C.struct_spdk_io_channel
	ops      []C.weir_op // C memory
	cq       *C.weir_cq  // C memory
	cqSlots  []C.uint32_t
	slots    [maxInflight]*ioReq
	mdWanted [maxInflight]bool // the op holds a wantMD
	free     []uint32
	waiting  []*ioReq // taken from reqs, no free slot yet
	inflight int
}

// workerTags numbers workers for cgo-callback tags; callbackWorkers maps a
// tag's number back to its worker.
var (
	workerTags      atomic.Uint64
	callbackWorkers sync.Map // uint64 -> *worker
)

func startWorker(be *Backend, idx int) (*worker, error) {
	w := &worker{be: be, idx: idx, tag: workerTags.Add(1),
		reqs: make(chan *ioReq, 2*maxInflight), kick: make(chan struct{}, 1),
		quit: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan error, 1)
	go w.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	if be.opts.CGOCallbacks {
		callbackWorkers.Store(w.tag, w)
	}
	addProcs(1)
	return w, nil
}

// wake makes a sleeping worker poll (for idleSleep at least).
func (w *worker) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// stop asks the worker to finish: it completes what it has in flight,
// releases its channel and exits its SPDK thread.
func (w *worker) stop() {
	close(w.quit)
	<-w.done
	callbackWorkers.Delete(w.tag)
	addProcs(-1)
}

func (w *worker) loop(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
	defer close(w.done)
	name := C.CString(fmt.Sprintf("weir-io-%d", w.idx))
	w.thread = C.weir_thread_start(name)
	freeCString(name)
	if w.thread == nil {
		ready <- errors.New("spdk: create a worker thread: out of memory")
		return
	}
	w.ch = C.spdk_bs_alloc_io_channel(w.be.bs)
	if w.ch == nil {
		C.weir_thread_stop(w.thread)
		ready <- errors.New("spdk: no I/O channel for a worker")
		return
	}
	w.ops = allocOps(maxInflight)
	w.cq, w.cqSlots = allocCQ(maxInflight)
	for i := range w.ops {
		w.ops[i].cq = w.cq
		w.ops[i].slot = C.uint32_t(i)
		w.ops[i].tag = C.uint64_t(w.tag<<32 | uint64(i))
		w.free = append(w.free, uint32(maxInflight-1-i))
	}
	ready <- nil

	var idle idler
	quitting := false
	for {
		took := w.take()
		polled := C.spdk_thread_poll(w.thread, 0, 0)
		if w.cq.n > 0 {
			w.reap()
		}
		if quitting && w.inflight == 0 && len(w.waiting) == 0 && len(w.reqs) == 0 {
			break
		}
		if !idle.sleepy(took || polled != 0 || w.inflight > 0) {
			continue
		}
		select {
		case q := <-w.reqs:
			w.waiting = append(w.waiting, q)
			idle.reset()
		case <-w.kick:
			idle.reset()
		case <-w.quit:
			quitting = true
			w.quit = nil // a closed channel would always be ready
		case <-idle.tick():
		}
	}
	// Release the channel before the thread exits; weir_thread_stop polls
	// until the release (a message to this thread) has run.
	C.spdk_bs_free_io_channel(w.ch)
	C.weir_thread_stop(w.thread)
	freeOps(w.ops)
	freeCQ(w.cq)
}

// take moves new requests from reqs into SPDK while slots are free.
func (w *worker) take() bool {
	took := false
	for len(w.free) > 0 {
		var q *ioReq
		if len(w.waiting) > 0 {
			q = w.waiting[0]
			w.waiting = w.waiting[1:]
		} else {
			select {
			case q = <-w.reqs:
			default:
				return took
			}
		}
		w.submit(q)
		took = true
	}
	return took
}

func (w *worker) submit(q *ioReq) {
	slot := w.free[len(w.free)-1]
	w.free = w.free[:len(w.free)-1]
	op := &w.ops[slot]
	op.iovcnt = C.int(q.niov)
	for i := range q.niov {
		op.iov[i].iov_base = bufPtr(q.iov[i])
		op.iov[i].iov_len = C.size_t(len(q.iov[i]))
	}
	w.slots[slot] = q
	w.inflight++
	write, cgo := C.int(0), C.int(0)
	if q.write {
		write = 1
	}
	if w.be.opts.CGOCallbacks {
		cgo = 1
	}
	if C.weir_io_submit(q.blob, w.ch, write, op, C.uint64_t(q.off), C.uint64_t(q.n), cgo) != 0 {
		// The write allocates a cluster: keep the metadata thread awake
		// until it completes.
		w.mdWanted[slot] = true
		w.be.r.wantMD()
	}
}

// reap completes the ops the C completion queue holds.
func (w *worker) reap() {
	for _, slot := range w.cqSlots[:w.cq.n] {
		w.complete(uint32(slot), int32(w.ops[slot].rc))
	}
	w.cq.n = 0
}

func (w *worker) complete(slot uint32, rc int32) {
	q := w.slots[slot]
	w.slots[slot] = nil
	if w.mdWanted[slot] {
		w.mdWanted[slot] = false
		w.be.r.doneMD()
	}
	w.free = append(w.free, slot)
	w.inflight--
	q.finish(rc)
}

// do runs the requests on a worker and waits for all of them; it returns
// the first error.
//
// Workers fill in order: a request goes to the first worker with fewer
// than fillDepth requests outstanding (the least loaded if none is). At a
// low queue depth one worker polls and the others sleep, instead of every
// worker spinning for a share of the load; as the depth grows the next
// workers join.
func (be *Backend) do(qs ...*ioReq) error {
	w := be.workers[0]
	if len(be.workers) > 1 {
		for _, c := range be.workers {
			if c.load.Load() < fillDepth {
				w = c
				break
			}
			if c.load.Load() < w.load.Load() {
				w = c
			}
		}
	}
	w.load.Add(int64(len(qs)))
	defer w.load.Add(-int64(len(qs)))
	for _, q := range qs {
		w.reqs <- q
	}
	w.wake()
	var err error
	for _, q := range qs {
		spinWait(q.done.Load, q.wake)
		if e := q.err(); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// fillDepth is the queue depth one worker takes before the next one is
// used.
const fillDepth = 16

// A read or write is cut into pieces of at most maxIO bytes at multiples of
// maxIO. Each piece covers the io units [first, last); its bytes are
// [from, to). A piece's partial head and tail units go through edge
// buffers (read-modify-write for writes); its whole units go straight to or
// from the caller's memory when that memory is registered and aligned, and
// through a bounce buffer otherwise.
type piece struct {
	from, to    int64 // bytes, absolute
	first, last int64 // io-unit aligned bytes, absolute
	head, tail  bool  // partial first / last unit
	midFrom     int64 // whole units [midFrom, midTo)
	midTo       int64
}

func (be *Backend) pieces(off, end int64, f func(pc piece) error) error {
	u := be.ioUnit
	for from := off; from < end; {
		to := min(end, alignDown(from, maxIO)+maxIO)
		pc := piece{from: from, to: to, first: alignDown(from, u), last: alignUp(to, u)}
		pc.head = from%u != 0 || (pc.last-pc.first == u && to%u != 0)
		pc.tail = to%u != 0 && !(pc.head && pc.last-pc.first == u)
		pc.midFrom, pc.midTo = pc.first, pc.last
		if pc.head {
			pc.midFrom += u
		}
		if pc.tail {
			pc.midTo -= u
		}
		if err := f(pc); err != nil {
			return err
		}
		from = to
	}
	return nil
}

// direct says whether b may be handed to SPDK as is: registered memory,
// aligned to the io unit.
func (be *Backend) direct(b []byte) bool {
	if len(b) == 0 || bufAddr(b)%uintptr(be.ioUnit) != 0 {
		return false
	}
	return be.regs.contains(b)
}

// begin checks a read or write of len(p) bytes at off and holds the
// backend open (Close waits) until the returned release is called. An
// empty p passes the checks with nothing to hold: release is nil.
func (h *handle) begin(op string, p []byte, off int64) (release func(), err error) {
	if err := h.usable(op); err != nil {
		return nil, err
	}
	if err := backend.CheckRange(off, len(p)); err != nil {
		return nil, errorf(op, h.s.id, err)
	}
	if len(p) == 0 {
		return nil, nil
	}
	h.be.life.RLock()
	if h.be.gone.Load() {
		h.be.life.RUnlock()
		return nil, errorf(op, h.s.id, syscall.EBADF)
	}
	return h.be.life.RUnlock, nil
}

func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	release, err := h.begin("read", p, off)
	if err != nil || release == nil {
		return 0, err
	}
	defer release()
	be, s := h.be, h.s
	s.rw.RLock()
	defer s.rw.RUnlock()
	size := s.size.Load()
	if off >= size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-off))
	err = be.pieces(off, off+int64(n), func(pc piece) error { return be.readPiece(s, p[pc.from-off:pc.to-off], pc) })
	if err != nil {
		return 0, errorf("read", s.id, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// middle adds a piece's whole units m to q: m itself when the device may
// use it (registered and aligned), else a bounce buffer, which it returns
// for the caller to copy from (reads) and to put back; for a write it
// copies m into it.
func (be *Backend) middle(q *ioReq, m []byte, write bool) ([]byte, error) {
	if be.direct(m) {
		q.add(m)
		be.directBytes.Add(uint64(len(m)))
		return nil, nil
	}
	b, err := be.bufs.get(int64(len(m)))
	if err != nil {
		return nil, err
	}
	if write {
		copy(b, m)
		be.bounceBytes.Add(uint64(len(m)))
	}
	q.add(b)
	return b, nil
}

func (be *Backend) readPiece(s *blobState, p []byte, pc piece) error {
	u := be.ioUnit
	q := getReq()
	defer putReq(q)
	q.blob, q.off, q.n = s.blob, uint64(pc.first/u), uint64((pc.last-pc.first)/u)
	var head, mid, tail []byte
	var err error
	if pc.head {
		if head, err = be.bufs.get(u); err != nil {
			return err
		}
		defer be.bufs.put(head)
		q.add(head)
	}
	if pc.midTo > pc.midFrom {
		if mid, err = be.middle(q, p[pc.midFrom-pc.from:pc.midTo-pc.from], false); err != nil {
			return err
		}
		if mid != nil {
			defer be.bufs.put(mid)
		}
	}
	if pc.tail {
		if tail, err = be.bufs.get(u); err != nil {
			return err
		}
		defer be.bufs.put(tail)
		q.add(tail)
	}
	if err := be.do(q); err != nil {
		return err
	}
	if head != nil {
		n := copy(p, head[pc.from-pc.first:])
		be.bounceBytes.Add(uint64(n))
	}
	if mid != nil {
		n := copy(p[pc.midFrom-pc.from:], mid)
		be.bounceBytes.Add(uint64(n))
	}
	if tail != nil {
		n := copy(p[pc.midTo-pc.from:], tail[:pc.to-pc.midTo])
		be.bounceBytes.Add(uint64(n))
	}
	return nil
}

func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	if err := h.writable("write"); err != nil {
		return 0, err
	}
	release, err := h.begin("write", p, off)
	if err != nil || release == nil {
		return 0, err
	}
	defer release()
	be, s := h.be, h.s
	end := off + int64(len(p))
	// A write with a partial unit reads it, changes it and writes it back:
	// it holds the blob exclusively so that no other write of that unit
	// lands in between. Whole-unit writes share it.
	partial := off%be.ioUnit != 0 || end%be.ioUnit != 0
	if partial {
		s.rw.Lock()
		defer s.rw.Unlock()
		if err := be.grow(s, end); err != nil {
			return 0, errorf("write", s.id, err)
		}
	} else {
		s.rw.RLock()
		defer s.rw.RUnlock()
		if err := be.ensure(s, end); err != nil {
			return 0, errorf("write", s.id, err)
		}
	}
	size := s.size.Load()
	err = be.pieces(off, end, func(pc piece) error { return be.writePiece(s, p[pc.from-off:pc.to-off], pc, size) })
	if err != nil {
		return 0, errorf("write", s.id, err)
	}
	s.growSize(end)
	return len(p), nil
}

// loadUnit reads the unit at pos into buf for a read-modify-write, or
// zeros it if the unit lies wholly past the blob's size.
func (be *Backend) loadUnit(s *blobState, pos, size int64, buf []byte) *ioReq {
	if pos >= size {
		clear(buf)
		return nil
	}
	be.edgeReads.Add(1)
	q := getReq()
	q.blob, q.off, q.n = s.blob, uint64(pos/be.ioUnit), 1
	q.add(buf)
	return q
}

func (be *Backend) writePiece(s *blobState, p []byte, pc piece, size int64) error {
	u := be.ioUnit
	var head, tail []byte
	var loads []*ioReq
	var err error
	if pc.head {
		if head, err = be.bufs.get(u); err != nil {
			return err
		}
		defer be.bufs.put(head)
		if q := be.loadUnit(s, pc.first, size, head); q != nil {
			loads = append(loads, q)
		}
	}
	if pc.tail {
		if tail, err = be.bufs.get(u); err != nil {
			return err
		}
		defer be.bufs.put(tail)
		if q := be.loadUnit(s, pc.last-u, size, tail); q != nil {
			loads = append(loads, q)
		}
	}
	if len(loads) > 0 {
		err = be.do(loads...)
		for _, q := range loads {
			putReq(q)
		}
		if err != nil {
			return err
		}
	}
	q := getReq()
	defer putReq(q)
	q.blob, q.write, q.off, q.n = s.blob, true, uint64(pc.first/u), uint64((pc.last-pc.first)/u)
	if head != nil {
		n := copy(head[pc.from-pc.first:], p)
		be.bounceBytes.Add(uint64(n))
		q.add(head)
	}
	if pc.midTo > pc.midFrom {
		mid, err := be.middle(q, p[pc.midFrom-pc.from:pc.midTo-pc.from], true)
		if err != nil {
			return err
		}
		if mid != nil {
			defer be.bufs.put(mid)
		}
	}
	if tail != nil {
		n := copy(tail, p[pc.midTo-pc.from:])
		be.bounceBytes.Add(uint64(n))
		q.add(tail)
	}
	q.write = true
	return be.do(q)
}
