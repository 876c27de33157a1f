package ring

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ClientOptions tune one client session.
type ClientOptions struct {
	// Mode is how a caller waits for its completion.
	Mode WaitMode
	// NonBlocking makes Alloc and Do return ErrWouldBlock instead of
	// waiting when the arena or every request slot is in use, or when the
	// submission queue stays full for more than a short spin (a server
	// that is not taking requests).
	NonBlocking bool
}

// Waiter states. A waiter slot is owned by the Call that acquired it until
// it goes back to idle; deliver moves pending/parked to done.
const (
	wIdle uint32 = iota
	wPending
	wParked
	wDelivering
	wDone
	wAbandoned // the caller gave up; the completion frees the slot
	// wSleeping: the caller (of a long call, or of a quick one told not
	// to spin) sleeps on the CQ doorbell itself
	// (no reaper, no goroutine hand-off); a deliverer other than the
	// caller rings the doorbell after it.
	wSleeping
	// wLazy: the caller of a lazy call (Call.Lazy) waits on its channel;
	// nobody sleeps on the CQ doorbell for it.
	wLazy
)

type waiter struct {
	state atomic.Uint32
	gen   atomic.Uint32 // request-id generation; bumped on every use
	res   Completion    // written by deliver before state becomes wDone
	ch    chan struct{} // one token per transition out of wParked
}

// ClientStats are a client's counters.
type ClientStats struct {
	Calls  atomic.Uint64
	Stray  atomic.Uint64 // completions naming no waiting request
	Parked atomic.Uint64 // calls that went to sleep
	// LongParked counts long calls (Call.Long) that slept on the
	// completion queue's doorbell.
	LongParked atomic.Uint64
	// LongSpun counts long calls whose completion the caller caught in
	// the spin after its timed sleep (hybrid wait: no wake-up);
	// LongMissed those whose spin ended first (it slept again).
	LongSpun, LongMissed atomic.Uint64
	// NoSpin counts waits (after their first 31 polls of the CQ) that
	// went to sleep without a spin because the server's last completion
	// carried HintNoSpin; a wait may count more than once.
	NoSpin atomic.Uint64
}

// Client submits requests on one ring region. Any number of goroutines may
// call Alloc and Call at once; the hot path takes no mutex: a request slot
// and arena blocks come from lock-free bitmaps, the descriptor goes on the
// MPMC submission queue, and every waiting caller helps drain the
// completion queue, handing other callers' completions to them.
type Client struct {
	r      *Region
	g      Geometry
	opts   ClientOptions
	sq, cq *queue
	sqBell doorbell
	cqBell doorbell

	waiters []waiter // immutable slice; elements as described on waiter
	wfree   *bitmap
	wsem    *sema
	lazyOut atomic.Int32 // lazy calls in Do now (StartAside leaves them a slot)
	blocks  *bitmap
	bsem    *sema

	maxBlocks int           // blocks one Buffer may hold
	spinNs    atomic.Int64  // adaptive spin budget shared by callers
	longNs    atomic.Int64  // long calls' median completion time (estimate), 0 before the first
	longHits  atomic.Int32  // hybrid waits' recent catches: +1 a catch, -1 a miss (longHit)
	longCalls atomic.Uint32 // long calls so far (a hybrid probe every hybridProbe)
	// selfSleepers: quick calls asleep on the CQ doorbell themselves
	// (sleepShort): at most one.
	selfSleepers atomic.Int32
	aside        atomic.Bool   // a StartAside call is outstanding
	parked       atomic.Int32  // callers asleep on their channel
	reapWake     chan struct{} // tells the reaper a caller parked
	done         chan struct{} // closed on Close, peer loss or damage
	doneOnce     sync.Once
	doneErr      atomic.Pointer[error]
	reaperWG     sync.WaitGroup
	onClose      func() // handshake layer's clean-up; set before use
	files        *files // what the server passed on the socket; nil without one
	closeOnce    sync.Once

	Stats ClientStats
}

// NewClient starts a client on r (normally from Attach). The client owns r.
func NewClient(r *Region, opts ClientOptions) *Client {
	g := r.g
	nblocks := int(g.ArenaSize / uint64(g.BlockSize))
	c := &Client{
		r: r, g: g, opts: opts,
		sq:       newSQ(r),
		cq:       newCQ(r),
		sqBell:   doorbell{r: r, bell: offSQBell, waiters: offSQWaiters},
		cqBell:   doorbell{r: r, bell: offCQBell, waiters: offCQWaiters},
		waiters:  make([]waiter, g.SQEntries),
		wfree:    newBitmap(int(g.SQEntries)),
		wsem:     newSema(int64(g.SQEntries)),
		blocks:   newBitmap(nblocks),
		bsem:     newSema(int64(nblocks)),
		reapWake: make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	// A Buffer holds at most as many blocks as one indirect table block can
	// list, and leaves one block for that table.
	c.maxBlocks = min(int(g.MaxSegments), int(g.BlockSize/SegmentSize), nblocks-1)
	for i := range c.waiters {
		c.waiters[i].ch = make(chan struct{}, 1)
	}
	c.spinNs.Store(int64(minSpin * 8))
	r.store32(offClientState, StateRunning)
	if opts.Mode == WaitAdaptive {
		c.reaperWG.Add(1)
		go c.reaper()
	}
	return c
}

// Region returns the client's shared memory.
func (c *Client) Region() *Region { return c.r }

// MaxBuffer is the largest payload one Buffer (one request) can carry.
func (c *Client) MaxBuffer() int { return c.maxBlocks * int(c.g.BlockSize) }

func (c *Client) finish(err error) {
	c.doneOnce.Do(func() {
		c.doneErr.Store(&err)
		close(c.done)
		c.cqBell.kick()
	})
}

// Err returns why the client stopped, or nil while it runs.
func (c *Client) Err() error {
	if p := c.doneErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Done is closed when the client stops for any reason (Close, peer loss,
// damage); Err then says why. A caller can watch it to learn at once that
// the server went away.
func (c *Client) Done() <-chan struct{} { return c.done }

// PeerGone tells the client that the server closed or died: every waiting
// and later call fails with ErrPeerGone.
func (c *Client) PeerGone() { c.finish(ErrPeerGone) }

// Close ends the session. Calls in flight return ErrClosed; the mapping is
// released when the last Buffer is.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.finish(ErrClosed)
		c.r.store32(offClientState, StateClosed)
		c.reaperWG.Wait()
		if c.onClose != nil {
			c.onClose()
		}
		c.r.Close()
	})
	return nil
}

// Buffer is a payload area in the arena, made of whole blocks. The caller
// fills it (zero copy) or copies into it, passes it to Call, and releases it.
// A Buffer is used by one goroutine at a time.
type Buffer struct {
	c      *Client
	blocks []uint32  // arena block indices, sorted
	segs   []Segment // merged runs covering exactly n bytes
	table  uint32    // block index of the indirect table, if hasTbl
	hasTbl bool
	n      int
}

// Alloc reserves n bytes of arena. It waits for space (or returns
// ErrWouldBlock in non-blocking mode); n above MaxBuffer is ErrTooLarge.
func (c *Client) Alloc(ctx context.Context, n int) (*Buffer, error) {
	return c.alloc(ctx, n, !c.opts.NonBlocking)
}

// alloc is Alloc; wait false: ErrWouldBlock rather than wait for space.
func (c *Client) alloc(ctx context.Context, n int, wait bool) (*Buffer, error) {
	bs := int(c.g.BlockSize)
	k := (n + bs - 1) / bs
	if n <= 0 || k > c.maxBlocks {
		return nil, ErrTooLarge
	}
	needTable := k > InlineSegs
	units := int64(k)
	if needTable {
		units++
	}
	if err := c.Err(); err != nil {
		return nil, err
	}
	if !c.bsem.tryAcquire(units) {
		if !wait {
			return nil, ErrWouldBlock
		}
		if err := c.bsem.acquire(ctx, units, c.done, c.Err); err != nil {
			return nil, err
		}
	}
	if !c.r.acquire() {
		c.bsem.release(units)
		return nil, ErrClosed
	}
	b := &Buffer{c: c, n: n}
	b.blocks = c.blocks.take(int(units), make([]uint32, 0, units))
	slices.Sort(b.blocks)
	if needTable {
		b.table = b.blocks[len(b.blocks)-1]
		b.blocks = b.blocks[:len(b.blocks)-1]
		b.hasTbl = true
	}
	rest := n
	for _, blk := range b.blocks {
		l := min(rest, bs)
		rest -= l
		off := blk * uint32(bs)
		if m := len(b.segs); m > 0 && b.segs[m-1].Off+b.segs[m-1].Len == off {
			b.segs[m-1].Len += uint32(l)
			continue
		}
		b.segs = append(b.segs, Segment{Off: off, Len: uint32(l)})
	}
	return b, nil
}

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int { return b.n }

// Slices returns the buffer's arena bytes, one slice per segment, for the
// caller to fill or read in place. They are invalid after Release.
func (b *Buffer) Slices() [][]byte {
	a := b.c.r.arena()
	out := make([][]byte, len(b.segs))
	for i, s := range b.segs {
		out[i] = a[s.Off : s.Off+s.Len : s.Off+s.Len]
	}
	return out
}

// CopyFrom copies p into the buffer and returns the count.
func (b *Buffer) CopyFrom(p []byte) int {
	a, n := b.c.r.arena(), 0
	for _, s := range b.segs {
		if n == len(p) {
			break
		}
		n += copy(a[s.Off:s.Off+s.Len], p[n:])
	}
	return n
}

// CopyTo copies the buffer into p and returns the count.
func (b *Buffer) CopyTo(p []byte) int {
	a, n := b.c.r.arena(), 0
	for _, s := range b.segs {
		if n == len(p) {
			break
		}
		n += copy(p[n:], a[s.Off:s.Off+s.Len])
	}
	return n
}

// Release gives the buffer's blocks back. A buffer must not be released
// while a Call using it is in flight.
func (b *Buffer) Release() {
	if b.c == nil {
		return
	}
	c := b.c
	b.c = nil
	units := int64(len(b.blocks))
	if b.hasTbl {
		b.blocks = append(b.blocks, b.table)
		units++
	}
	c.blocks.put(b.blocks)
	c.bsem.release(units)
	c.r.release()
}

// Call is one request.
type Call struct {
	Op     uint8
	Arg    uint32
	Handle uint64
	Offset uint64
	Buf    *Buffer // payload, or nil
	// Long says the call waits long (a device flush): in adaptive mode
	// the caller spins for it only as long as for the first 32 polls,
	// then waits hybrid (sleepLong): asleep on the completion queue's
	// doorbell for most of the median time long calls take, then
	// spinning for the completion, as Linux's hybrid block polling does;
	// the spin budget of quick calls is left as it is. Spinning through
	// the whole flush would take the CPU that the service and the
	// kernel's I/O threads need to complete it on a small machine;
	// sleeping through all of it costs a thread wake-up after it
	// (docs/benchmarks.md, fsync).
	Long bool
	// Lazy says the call may wait for ever (a long poll: the service
	// answers when something happens): its caller waits without spinning
	// and without sleeping on the completion queue's doorbell, so that
	// the service need not wake anyone for the other calls' completions
	// while it is outstanding. Its completion is delivered by whoever
	// reaps the queue next: another call's wait, the reaper while a call
	// is parked, or Poll.
	Lazy bool
}

// Do submits call and waits for its completion. The returned error is about
// the transport (closed, peer gone, damaged, ctx); the operation's own
// outcome is in the Completion (Result, Err).
func (c *Client) Do(ctx context.Context, call *Call) (Completion, error) {
	if !c.r.acquire() {
		return Completion{}, ErrClosed
	}
	defer c.r.release()
	if call.Lazy {
		c.lazyOut.Add(1)
		defer c.lazyOut.Add(-1)
	}
	idx, w, err := c.start(ctx, call, !c.opts.NonBlocking)
	if err != nil {
		return Completion{}, err
	}
	if call.Lazy {
		return c.waitLazy(ctx, idx, w)
	}
	return c.wait(ctx, idx, w, call.Long)
}

// Pending is a call submitted by StartAside whose completion is waited
// for later, so that a caller can put two requests on the queue and wait once:
// the server takes a session's requests in queue order, and a synchronous
// handler finishes before the next request starts (ServerSession.Poll),
// so a request submitted after a Pending one sees what it did.
//
// Every Pending must be waited for exactly once: until then it holds a
// waiter slot and a reference on the ring's mapping.
type Pending struct {
	c     *Client
	idx   uint32
	w     *waiter
	long  bool
	buf   *Buffer // StartAside's payload, freed by Wait
	aside bool
}

// begin submits call (a lazy call cannot be) and returns without waiting
// for its completion, which Pending.Wait returns. wait false:
// ErrWouldBlock rather than wait for a slot. Only StartAside, which makes
// sure an outstanding call cannot starve the next, and tests use it.
func (c *Client) begin(ctx context.Context, call *Call, wait bool) (*Pending, error) {
	if call.Lazy {
		return nil, errors.New("ring: a lazy call cannot be started")
	}
	if !c.r.acquire() {
		return nil, ErrClosed
	}
	idx, w, err := c.start(ctx, call, wait)
	if err != nil {
		c.r.release()
		return nil, err
	}
	return &Pending{c: c, idx: idx, w: w, long: call.Long}, nil
}

// StartAside submits a quick call with payload (copied into a buffer of
// its own; none if payload is empty) and returns without waiting
// (Pending), but only where leaving it outstanding cannot starve its
// caller's next calls, which it makes before it waits: at most one call
// is aside at a time, the arena leaves room for a buffer of MaxBuffer
// beside its payload, the queue two slots beside its own and those lazy
// calls hold, and it takes nothing it would have to wait for. ok false:
// nothing was submitted (make the call with Do).
func (c *Client) StartAside(ctx context.Context, op uint8, arg uint32, handle, offset uint64, payload []byte) (p *Pending, ok bool, err error) {
	bs := int(c.g.BlockSize)
	k := (len(payload) + bs - 1) / bs
	// Slots: its own, one for a lazy call that may start meanwhile (a
	// long poll holds its slot until the service has news), and one at
	// least for the caller's next call, whatever the lazy calls already
	// outstanding hold.
	if int(c.g.SQEntries)-int(c.lazyOut.Load()) < 3 || k > InlineSegs ||
		(k > 0 && int(c.g.ArenaSize/uint64(bs)) < c.maxBlocks+1+k) || !c.aside.CompareAndSwap(false, true) {
		return nil, false, nil
	}
	p, err = c.beginAside(ctx, op, arg, handle, offset, payload)
	if err != nil {
		c.aside.Store(false)
		if errors.Is(err, ErrWouldBlock) {
			return nil, false, nil
		}
		return nil, false, err
	}
	p.aside = true
	return p, true, nil
}

// beginAside allocates payload's buffer and begins the call, waiting for
// neither.
func (c *Client) beginAside(ctx context.Context, op uint8, arg uint32, handle, offset uint64, payload []byte) (*Pending, error) {
	if len(payload) == 0 {
		return c.begin(ctx, &Call{Op: op, Arg: arg, Handle: handle, Offset: offset}, false)
	}
	b, err := c.alloc(ctx, len(payload), false)
	if err != nil {
		return nil, err
	}
	b.CopyFrom(payload)
	p, err := c.begin(ctx, &Call{Op: op, Arg: arg, Handle: handle, Offset: offset, Buf: b}, false)
	if err != nil {
		b.Release()
		return nil, err
	}
	p.buf = b
	return p, nil
}

// Wait waits for p's completion, as Do does after it submitted.
func (p *Pending) Wait(ctx context.Context) (Completion, error) {
	c := p.c
	if c == nil {
		return Completion{}, errors.New("ring: a pending call waited for twice")
	}
	p.c = nil
	defer c.r.release()
	comp, err := c.wait(ctx, p.idx, p.w, p.long)
	if p.buf != nil {
		p.buf.Release() // as a caller of Do releases its buffer after it
	}
	if p.aside {
		c.aside.Store(false)
	}
	return comp, err
}

// start takes a waiter slot and submits call; c.r is held. wait false:
// ErrWouldBlock rather than wait for a slot.
func (c *Client) start(ctx context.Context, call *Call, wait bool) (uint32, *waiter, error) {
	if err := c.Err(); err != nil {
		return 0, nil, err
	}
	if call.Buf != nil && call.Buf.c != c {
		return 0, nil, ErrForeignBuffer
	}
	if !c.wsem.tryAcquire(1) {
		if !wait {
			return 0, nil, ErrWouldBlock
		}
		if err := c.wsem.acquire(ctx, 1, c.done, c.Err); err != nil {
			return 0, nil, err
		}
	}
	var idxBuf [1]uint32
	idx := c.wfree.take(1, idxBuf[:0])[0]
	w := &c.waiters[idx]
	gen := w.gen.Add(1)
	w.state.Store(wPending)
	c.Stats.Calls.Add(1)

	d := Descriptor{Opcode: call.Op, Arg: call.Arg, ReqID: uint64(gen)<<32 | uint64(idx),
		Handle: call.Handle, Offset: call.Offset}
	if b := call.Buf; b != nil {
		d.Length = uint64(b.n)
		d.NSeg = uint16(len(b.segs))
		if len(b.segs) <= InlineSegs {
			copy(d.Inline[:], b.segs)
		} else {
			toff := b.table * c.g.BlockSize
			t := c.r.arena()[toff : toff+uint32(len(b.segs))*SegmentSize]
			for i, s := range b.segs {
				binary.LittleEndian.PutUint32(t[i*SegmentSize:], s.Off)
				binary.LittleEndian.PutUint32(t[i*SegmentSize+4:], s.Len)
			}
			d.Flags |= FlagIndirect
			d.Inline[0] = Segment{Off: toff, Len: uint32(len(t))}
		}
	}
	if err := c.submit(ctx, &d); err != nil {
		c.putWaiter(idx, w)
		return 0, nil, err
	}
	return idx, w, nil
}

// waitLazy waits for a lazy call's completion (Call.Lazy).
func (c *Client) waitLazy(ctx context.Context, idx uint32, w *waiter) (Completion, error) {
	if !w.state.CompareAndSwap(wPending, wLazy) {
		for w.state.Load() != wDone { // delivered already, or being delivered
			pollPause(1)
		}
		return c.collectLazy(idx, w), nil
	}
	var err error
	select {
	case <-w.ch:
		return c.collectLazy(idx, w), nil
	case <-c.done:
		err = c.Err()
	case <-ctx.Done():
		err = ctx.Err()
	}
	if w.state.CompareAndSwap(wLazy, wAbandoned) {
		return Completion{}, err // its completion, if it comes, frees the slot
	}
	<-w.ch // delivered meanwhile
	return c.collectLazy(idx, w), nil
}

// collectLazy takes a lazy call's completion and frees its waiter (the
// spin budget of quick calls is not theirs to change).
func (c *Client) collectLazy(idx uint32, w *waiter) Completion {
	res := w.res
	c.putWaiter(idx, w)
	return res
}

// Poll delivers the completions the queue holds now, without blocking,
// and reports how many. A lazy call's owner calls it where it wants the
// answer seen soon (its data path), at the cost of a shared-memory load
// when there is none.
func (c *Client) Poll() int {
	if c.Err() != nil || !c.r.acquire() {
		return 0 // closed: the region may be unmapped
	}
	defer c.r.release()
	if !c.cq.ready() {
		return 0
	}
	return c.reap()
}

// submit puts d on the SQ. In-flight requests never outnumber SQ slots
// (each holds a waiter slot, and there are SQEntries of those), so a full
// SQ only lasts while the server is between taking a slot and freeing it.
func (c *Client) submit(ctx context.Context, d *Descriptor) error {
	for i := 0; ; i++ {
		pos, off, ok, err := c.sq.claimProduce()
		if err != nil {
			c.finish(damaged("submission queue: %v", err))
			return c.Err()
		}
		if ok {
			encodeDescriptor(c.r.mem[off:off+SQSlotSize], d)
			c.sq.publish(pos, off)
			c.sqBell.notify()
			return nil
		}
		if err := c.Err(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i > 64 {
			// Still full after a short spin: the server is slow to take
			// slots, or is not taking them at all.
			if c.opts.NonBlocking {
				return ErrWouldBlock
			}
			time.Sleep(10 * time.Microsecond)
		}
		pollPause(i)
	}
}

func (c *Client) putWaiter(idx uint32, w *waiter) {
	w.state.Store(wIdle)
	c.wfree.put([]uint32{idx})
	c.wsem.release(1)
}

// wait spins (helping to drain the CQ) and, in adaptive mode, parks until
// the completion for w arrives.
func (c *Client) wait(ctx context.Context, idx uint32, w *waiter, long bool) (Completion, error) {
	take := c.collect
	if long {
		take = c.collectLong
	}
	var start time.Time
	var submitted time.Time
	if long {
		submitted = time.Now()
	}
	for i := 0; ; i++ {
		if w.state.Load() == wDone {
			return take(idx, w), nil
		}
		c.reap()
		if w.state.Load() == wDone {
			return take(idx, w), nil
		}
		if err := c.Err(); err != nil {
			return c.giveUp(idx, w, err)
		}
		if err := ctx.Err(); err != nil {
			return c.giveUp(idx, w, err)
		}
		if c.opts.Mode == WaitBusyPoll {
			pollPause(i)
			continue
		}
		if i&31 != 31 {
			continue
		}
		// Let other goroutines run now and then: with many callers of one
		// client spinning at once (queue depth 32 from 32 goroutines) on a
		// small machine, the spinners otherwise starve the goroutines that
		// would complete their requests (measured: 10k against 15k 4 KiB
		// reads/s through weir at QD32 on the 2-CPU reference VM).
		runtime.Gosched()
		now := time.Now()
		if start.IsZero() {
			start = now
		}
		noSpin := c.r.load32(offServerHints)&HintNoSpin != 0
		if noSpin {
			c.Stats.NoSpin.Add(1)
		}
		if long {
			return c.sleepLong(ctx, idx, w, submitted, noSpin)
		}
		budget := time.Duration(c.spinNs.Load())
		if noSpin {
			budget = 0 // and the budget learnt stays for when the server is idle again
		}
		if now.Sub(start) < budget {
			continue
		}
		if !noSpin {
			c.spinNs.Store(int64(max(budget/2, minSpin)))
		}
		if res, err, ok := c.sleepShort(ctx, idx, w, !noSpin); ok {
			return res, err
		}
		if !w.state.CompareAndSwap(wPending, wParked) {
			continue // being delivered right now
		}
		c.Stats.Parked.Add(1)
		c.parked.Add(1)
		select {
		case c.reapWake <- struct{}{}:
		default:
		}
		select {
		case <-w.ch:
		case <-ctx.Done():
			if w.state.CompareAndSwap(wParked, wAbandoned) {
				c.parked.Add(-1)
				return Completion{}, ctx.Err()
			}
			<-w.ch
		case <-c.done:
			if w.state.CompareAndSwap(wParked, wAbandoned) {
				c.parked.Add(-1)
				return Completion{}, c.Err()
			}
			<-w.ch
		}
		c.parked.Add(-1)
		return take(idx, w), nil
	}
}

// Hybrid waits of long calls (sleepLong).
const (
	// hybridMinSleep: a timed sleep shorter than this is not worth its
	// wake-up (and the timer's slack, 50 µs by default, is as long).
	hybridMinSleep = 20 * time.Microsecond
	// hybridMaxSpin bounds one spin after the timed sleep: the CPU a
	// catch may cost, whatever the estimate.
	hybridMaxSpin = 300 * time.Microsecond
	// hybridOff, hybridProbe: once spins have missed hybridOff times more
	// than they caught (recently: longHits counts within ±2·hybridOff),
	// as on a loaded machine or with completion times that vary more
	// than a spin covers, only every hybridProbe-th long call waits
	// hybrid, to see whether that changed; the others sleep until the
	// doorbell rings.
	hybridOff   = 4
	hybridProbe = 16
)

// sleepLong waits for a long call's completion, submitted at submitted.
// Hybrid, once long calls have a median completion time: asleep on the
// CQ doorbell for half of it, or until hybridMaxSpin/2 before it when
// that is later (any completion rings the doorbell and ends the sleep
// early), then spinning, for at most the median again and hybridMaxSpin:
// a completion caught spinning costs no wake-up of the caller's thread,
// which on a VM is tens of µs after the flush and leaves its CPU cold
// (docs/benchmarks.md, fsync). Otherwise, and after a spin that missed,
// asleep on the doorbell until it rings, reaping the CQ itself when it
// wakes: one thread wake-up between the service's completion and the
// caller, where parking costs two (the reaper's, then the caller
// goroutine's). A cancelled ctx rings the doorbell (sleepOnBell), so
// the caller sees it at once.
func (c *Client) sleepLong(ctx context.Context, idx uint32, w *waiter, submitted time.Time, noSpin bool) (Completion, error) {
	if !w.state.CompareAndSwap(wPending, wSleeping) {
		for w.state.Load() != wDone { // being delivered right now
			pollPause(1)
		}
		return c.longDone(idx, w, submitted), nil
	}
	c.Stats.LongParked.Add(1)
	if ctx.Done() != nil {
		// A cancelled (or expired) ctx rings the bell, in the hybrid
		// sleep as in sleepOnBell's.
		defer context.AfterFunc(ctx, c.cqBell.kick)()
	}
	ready := func() bool {
		return w.state.Load() == wDone || c.cq.ready() || c.Err() != nil || ctx.Err() != nil
	}
	if est := time.Duration(c.longNs.Load()); !noSpin && est > 0 && (c.longHits.Load() > -hybridOff || c.longCalls.Add(1)%hybridProbe == 0) {
		// Until then, or the doorbell: a futex wait also ends at a
		// signal (the Go runtime's preemption) or a stray bell.
		// Other callers' completions are reaped on the way, not taken
		// for the end of the sleep.
		wake := submitted.Add(max(est/2, est-hybridMaxSpin/2))
		for d := time.Until(wake); d >= hybridMinSleep; d = time.Until(wake) {
			c.reap()
			if w.state.Load() == wDone || c.Err() != nil || ctx.Err() != nil {
				break
			}
			c.cqBell.sleepFor(ready, d)
		}
		spinEnd := time.Now().Add(min(est, hybridMaxSpin))
		for i := 0; ; i++ {
			c.reap()
			if w.state.Load() == wDone {
				c.Stats.LongSpun.Add(1)
				c.longHit(1)
				return c.longDone(idx, w, submitted), nil
			}
			if c.Err() != nil || ctx.Err() != nil {
				break
			}
			if i&15 == 15 && time.Now().After(spinEnd) {
				c.Stats.LongMissed.Add(1)
				c.longHit(-1)
				break
			}
			pollPause(i)
		}
	}
	return c.sleepOnBell(ctx, w, ready, func() Completion { return c.longDone(idx, w, submitted) })
}

// sleepOnBell sleeps on the CQ doorbell until w (wSleeping) is done, then
// returns finish(); or abandons w once the client or ctx ends.
func (c *Client) sleepOnBell(ctx context.Context, w *waiter, ready func() bool, finish func() Completion) (Completion, error) {
	if ctx.Done() != nil {
		// A cancelled (or expired) ctx rings the bell: the sleeper sees
		// it at once, not when the sleep times out.
		defer context.AfterFunc(ctx, c.cqBell.kick)()
	}
	for {
		c.cqBell.sleep(ready)
		c.reap()
		if w.state.Load() == wDone {
			return finish(), nil
		}
		err := c.Err()
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			if w.state.CompareAndSwap(wSleeping, wAbandoned) {
				return Completion{}, err
			}
			for w.state.Load() != wDone {
				pollPause(1)
			}
			return finish(), nil
		}
	}
}

// sleepShort is the wait of a quick call whose spin ran out, or that was
// told not to spin (HintNoSpin): asleep on the CQ doorbell itself, when
// no other caller does so now, so that its completion costs one wake-up
// (the reaper's and then the caller's are two). false: another caller
// sleeps there; park instead. learn: the completion counts for the spin
// budget as a parked call's does (it doubles); a call told not to spin
// leaves the budget as it is. A cancelled ctx rings the doorbell
// (sleepOnBell): the caller sees it at once.
func (c *Client) sleepShort(ctx context.Context, idx uint32, w *waiter, learn bool) (Completion, error, bool) {
	if c.selfSleepers.Add(1) > 1 {
		c.selfSleepers.Add(-1)
		return Completion{}, nil, false
	}
	defer c.selfSleepers.Add(-1)
	if !w.state.CompareAndSwap(wPending, wSleeping) {
		for w.state.Load() != wDone { // being delivered right now
			pollPause(1)
		}
		return c.collectShort(idx, w, learn), nil, true
	}
	c.Stats.Parked.Add(1)
	ready := func() bool {
		return w.state.Load() == wDone || c.cq.ready() || c.Err() != nil || ctx.Err() != nil
	}
	res, err := c.sleepOnBell(ctx, w, ready, func() Completion { return c.collectShort(idx, w, learn) })
	return res, err, true
}

// collectShort takes a quick call's completion after sleepShort.
func (c *Client) collectShort(idx uint32, w *waiter, learn bool) Completion {
	if learn {
		return c.collect(idx, w)
	}
	return c.collectLong(idx, w)
}

// longHit moves the hybrid waits' record of catches by d, within
// ±2·hybridOff.
func (c *Client) longHit(d int32) {
	if h := c.longHits.Load(); (d > 0 && h < 2*hybridOff) || (d < 0 && h > -2*hybridOff) {
		c.longHits.Add(d)
	}
}

// longDone takes a long call's completion and moves the estimate of the
// median completion time towards its time, by a sixteenth: up if it took
// longer, down if not (a streaming median; a mean would follow the tail
// of flushes that take milliseconds, and sleep through the common case).
// Racing callers may lose an update, which only slows the estimate.
func (c *Client) longDone(idx uint32, w *waiter, submitted time.Time) Completion {
	took := int64(time.Since(submitted))
	switch old := c.longNs.Load(); {
	case old == 0:
		c.longNs.Store(took)
	case took > old:
		c.longNs.Store(old + max(old/16, 1))
	default:
		c.longNs.Store(old - old/16)
	}
	return c.collectLong(idx, w)
}

// giveUp abandons a pending request: its slot is freed when (if) its
// completion arrives. If the completion is being delivered right now, it is
// taken instead.
func (c *Client) giveUp(idx uint32, w *waiter, err error) (Completion, error) {
	if w.state.CompareAndSwap(wPending, wAbandoned) {
		return Completion{}, err
	}
	for w.state.Load() != wDone {
		pollPause(1)
	}
	return c.collect(idx, w), nil
}

// collectLong takes a long call's completion: the spin budget of quick
// calls stays as it was.
func (c *Client) collectLong(idx uint32, w *waiter) Completion {
	res := w.res
	c.putWaiter(idx, w)
	return res
}

func (c *Client) collect(idx uint32, w *waiter) Completion {
	res := w.res
	if budget := c.spinNs.Load(); budget < int64(maxSpin) {
		c.spinNs.Store(min(budget*2, int64(maxSpin)))
	}
	c.putWaiter(idx, w)
	return res
}

// reap drains the CQ without blocking and delivers what it finds.
func (c *Client) reap() int {
	n := 0
	for {
		pos, off, ok, err := c.cq.claimConsume()
		if err != nil {
			c.finish(damaged("completion queue: %v", err))
			return n
		}
		if !ok {
			return n
		}
		comp := decodeCompletion(c.r.mem[off : off+CQSlotSize])
		c.cq.recycle(pos, off)
		c.deliver(comp)
		n++
	}
}

// deliver hands comp to the caller waiting for it. A completion whose id
// names no waiting request (a stale or forged one) is counted and dropped.
func (c *Client) deliver(comp Completion) {
	idx := uint32(comp.ReqID)
	if int(idx) >= len(c.waiters) {
		c.Stats.Stray.Add(1)
		return
	}
	w := &c.waiters[idx]
	if w.gen.Load() != uint32(comp.ReqID>>32) {
		c.Stats.Stray.Add(1)
		return
	}
	for {
		switch st := w.state.Load(); st {
		case wPending, wParked, wSleeping, wLazy:
			if !w.state.CompareAndSwap(st, wDelivering) {
				continue
			}
			w.res = comp
			w.state.Store(wDone)
			switch st {
			case wParked, wLazy:
				w.ch <- struct{}{}
			case wSleeping:
				c.cqBell.notify() // a caller asleep on the doorbell: wake it
			}
			return
		case wAbandoned:
			if w.state.CompareAndSwap(st, wIdle) {
				c.wfree.put([]uint32{idx})
				c.wsem.release(1)
			}
			return
		default:
			c.Stats.Stray.Add(1)
			return
		}
	}
}

// reaper drains the CQ for parked callers in adaptive mode: it sleeps on the
// CQ doorbell while someone is parked, and on reapWake otherwise.
func (c *Client) reaper() {
	defer c.reaperWG.Done()
	ready := func() bool { return c.cq.ready() || c.Err() != nil }
	for c.Err() == nil {
		if c.reap() > 0 {
			continue
		}
		if c.parked.Load() == 0 {
			select {
			case <-c.reapWake:
			case <-c.done:
				return
			}
			continue
		}
		c.cqBell.sleep(ready)
	}
}
