package ring

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Opcodes below 16 belong to the ring itself; services number theirs from
// OpFirstService up.
const (
	// OpNop completes at once with result 0: a round trip and nothing else.
	OpNop uint8 = 1
	// OpEcho reads the request's payload out of the arena into server
	// memory and writes it back: one copy each way, as a write and a read do.
	OpEcho uint8 = 2
	// OpFirstService is the first opcode a service may define.
	OpFirstService uint8 = 16
)

var (
	// ErrClosed is returned by a session used after its own Close.
	ErrClosed = errors.New("ring: session closed")
	// ErrPeerGone means the other side closed its session or died.
	ErrPeerGone = errors.New("ring: peer has gone")
	// ErrDamaged means the peer wrote something into shared memory that no
	// honest peer writes; the session is torn down.
	ErrDamaged = errors.New("ring: session damaged by peer")
	// ErrWouldBlock is returned in non-blocking mode instead of waiting for
	// queue or arena space.
	ErrWouldBlock = errors.New("ring: would block")
	// ErrTooLarge means a buffer larger than one request may carry.
	ErrTooLarge = errors.New("ring: buffer larger than one request may carry")
	// ErrForeignBuffer means a Call named a released Buffer or one of
	// another session.
	ErrForeignBuffer = errors.New("ring: buffer released or from another session")
)

func damaged(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrDamaged}, a...)...)
}

// Request is a validated submission as a Handler sees it. Segs are checked
// to lie inside the arena; the bytes they name stay peer-writable, so a
// handler copies what it must not see change.
type Request struct {
	Descriptor
	Segs []Segment
	// Alone is set for a request an AsyncHandler takes when no other
	// request of the session is in flight and none waits in the SQ: the
	// handler may serve it inline, on the poller goroutine, and save the
	// hand-off to another goroutine (tens of microseconds on a small VM).
	// A request arriving meanwhile waits for it, as with Serve.
	Alone bool
	arena []byte
}

// Seg returns the arena bytes of segment i.
func (q *Request) Seg(i int) []byte {
	s := q.Segs[i]
	return q.arena[s.Off : s.Off+s.Len : s.Off+s.Len]
}

// Run returns the arena bytes of segments i to j-1, the longest run of
// segments from i each of which starts where the one before ends in the
// arena, and j. A payload the client allocated in one piece is one run, so
// a service can hand it to a device in one I/O.
func (q *Request) Run(i int) (b []byte, j int) {
	start, end := q.Segs[i].Off, q.Segs[i].Off+q.Segs[i].Len
	for j = i + 1; j < len(q.Segs) && q.Segs[j].Off == end; j++ {
		end += q.Segs[j].Len
	}
	return q.arena[start:end:end], j
}

// ReadPayload copies the request's payload into dst and returns the count.
func (q *Request) ReadPayload(dst []byte) int {
	n := 0
	for i := range q.Segs {
		if n == len(dst) {
			break
		}
		n += copy(dst[n:], q.Seg(i))
	}
	return n
}

// WritePayload copies src into the request's segments and returns the count.
func (q *Request) WritePayload(src []byte) int {
	n := 0
	for i := range q.Segs {
		if n == len(src) {
			break
		}
		n += copy(q.Seg(i), src[n:])
	}
	return n
}

// Clone returns a copy of q that stays valid after the call that was given
// q has returned: the descriptor fields and the segment list are copied, the
// segments' arena bytes are not (they stay mapped until the request's
// completion has been posted; see AsyncHandler).
func (q *Request) Clone() *Request {
	c := &clonedRequest{Request: Request{Descriptor: q.Descriptor, Alone: q.Alone, arena: q.arena}}
	if len(q.Segs) <= len(c.segs) {
		c.Segs = append(c.segs[:0], q.Segs...)
	} else {
		c.Segs = append([]Segment(nil), q.Segs...)
	}
	return &c.Request
}

// clonedRequest holds a clone's segment list when it is short, so that
// Clone allocates once.
type clonedRequest struct {
	Request
	segs [InlineSegs]Segment
}

// Handler serves validated requests of one session. Serve runs on the
// session's poller goroutine and returns the completion's Result and Aux.
// The *Request is valid only during the call.
//
// A Handler that also implements AsyncHandler may instead take requests of
// some opcodes and complete them later, so that one session has many
// requests in flight.
type Handler interface {
	Known(op uint8) bool
	Serve(req *Request) (result int64, aux uint64)
}

// AsyncHandler is a Handler that completes the requests of some opcodes
// asynchronously. For each validated request whose opcode Async reports
// true, the poller calls ServeAsync instead of Serve and goes on taking
// descriptors; the handler answers by calling done, from any goroutine
// (ServeAsync's own included), exactly once. A second call panics.
//
// The contract:
//   - req and its Segs are the poller's and are reused as soon as
//     ServeAsync returns: a handler that works on after returning keeps
//     req.Clone(). The segments' arena bytes stay mapped until done is
//     called, and an honest client leaves them alone until it has the
//     completion; after done the handler must not touch them.
//   - ServeAsync runs on the poller goroutine, like Serve, and should
//     return quickly: it decides and hands the work to another goroutine.
//   - A session has at most SQEntries async requests in flight (taken,
//     done not yet called), as many as an honest client can have; at the
//     bound the poller takes no descriptor until one completes, so a
//     client cannot make the service start unbounded work.
//   - Whatever ends the session (Stop, Close, the peer's death, damage),
//     Serve returns, and Close unmaps the region, only after done has
//     been called for every request taken: a handler may use the arena
//     until then. A handler that never calls done hangs its session's
//     shutdown. A completion posted after the session stopped serving, or
//     that finds the completion queue full then, may never reach the
//     client.
//   - Completions are posted in the order done is called, not in the order
//     of the requests; clients match them by request id.
type AsyncHandler interface {
	Handler
	// Async reports whether requests of op are served by ServeAsync.
	Async(op uint8) bool
	// ServeAsync starts serving req and calls done with the completion's
	// Result and Aux when it is finished.
	ServeAsync(req *Request, done func(result int64, aux uint64))
}

// HandlerFunc serves one opcode.
type HandlerFunc func(req *Request) (result int64, aux uint64)

// AsyncHandlerFunc serves one opcode asynchronously, as AsyncHandler's
// ServeAsync does.
type AsyncHandlerFunc func(req *Request, done func(result int64, aux uint64))

// Mux routes opcodes to functions. NewMux serves OpNop and OpEcho. A Mux is
// filled before the first session uses it and read-only afterwards.
type Mux struct {
	h       [256]HandlerFunc
	async   [256]AsyncHandlerFunc
	echoBuf sync.Pool
}

var _ AsyncHandler = (*Mux)(nil)

// NewMux returns a Mux that serves the ring's own opcodes.
func NewMux() *Mux {
	m := &Mux{}
	m.echoBuf.New = func() any { b := make([]byte, 0, 64<<10); return &b }
	m.h[OpNop] = func(*Request) (int64, uint64) { return 0, 0 }
	m.h[OpEcho] = m.echo
	return m
}

// Handle registers f for op. It panics on the ring's reserved opcodes or a
// second registration: both are programming errors of the service.
func (m *Mux) Handle(op uint8, f HandlerFunc) {
	m.checkFree(op)
	m.h[op] = f
}

// HandleAsync registers f to serve op asynchronously (see AsyncHandler). It
// panics where Handle does.
func (m *Mux) HandleAsync(op uint8, f AsyncHandlerFunc) {
	m.checkFree(op)
	m.async[op] = f
}

func (m *Mux) checkFree(op uint8) {
	if op < OpFirstService {
		panic(fmt.Sprintf("ring: opcode %d is reserved for the ring", op))
	}
	if m.h[op] != nil || m.async[op] != nil {
		panic(fmt.Sprintf("ring: opcode %d registered twice", op))
	}
}

// Known reports whether op has a handler.
func (m *Mux) Known(op uint8) bool { return m.h[op] != nil || m.async[op] != nil }

// Async reports whether op was registered with HandleAsync.
func (m *Mux) Async(op uint8) bool { return m.async[op] != nil }

// Serve dispatches req to its synchronous handler.
func (m *Mux) Serve(req *Request) (int64, uint64) { return m.h[req.Opcode](req) }

// ServeAsync dispatches req to its asynchronous handler.
func (m *Mux) ServeAsync(req *Request, done func(int64, uint64)) { m.async[req.Opcode](req, done) }

func (m *Mux) echo(req *Request) (int64, uint64) {
	bp := m.echoBuf.Get().(*[]byte)
	if uint64(cap(*bp)) < req.Length {
		*bp = make([]byte, req.Length)
	}
	b := (*bp)[:req.Length]
	req.ReadPayload(b)
	n := req.WritePayload(b)
	m.echoBuf.Put(bp)
	return int64(n), 0
}

// ServerStats are a session's counters. Safe to read while it runs.
type ServerStats struct {
	Requests  atomic.Uint64 // descriptors taken from the SQ
	Rejected  atomic.Uint64 // answered with an error by validation
	Async     atomic.Uint64 // requests handed to an AsyncHandler
	Throttled atomic.Uint64 // Poll calls that left descriptors in the SQ: the async bound was reached
	Backlog   atomic.Uint64 // completions that found the CQ full
	Wakeups   atomic.Uint64 // futex sleeps ended
	Damaged   atomic.Bool
	BusyPolls atomic.Uint64
	// Follows counts the sleeping pollers an async completion woke to
	// spin for the request its client sends next (followSpin); FollowHits
	// those that found it while spinning.
	Follows    atomic.Uint64
	FollowHits atomic.Uint64
}

// ServerSession serves one ring region: it takes descriptors from the SQ,
// validates them, calls the Handler and posts completions.
//
// Requests an AsyncHandler takes complete on other goroutines, which post
// their completions themselves: the CQ is a multi-producer queue, and the
// doorbells are atomics on shared memory. The backlog is the one piece of
// state they share with the poller, behind bmu. The synchronous path takes
// no lock: it looks at backlogN and goes to the CQ directly.
type ServerSession struct {
	// Immutable after NewServerSession (maxAsync: tests lower it before
	// Serve).
	r        *Region
	g        Geometry
	h        Handler
	ah       AsyncHandler // h if it is one, else nil
	mode     WaitMode
	sq, cq   *queue
	sqBell   doorbell
	cqBell   doorbell
	maxAsync int32 // async requests in flight at most: SQEntries

	// Owned by the goroutine running Serve (or Poll).
	req      Request // the request being served; reused to keep Serve allocation-free
	slotBuf  [SQSlotSize]byte
	segBuf   []Segment
	tableBuf []byte

	// Completions waiting for CQ space. Poll takes no new request while
	// the backlog is non-empty, so it holds at most one completion of a
	// synchronous request plus one per async request in flight.
	bmu      sync.Mutex
	backlog  []Completion // protected by bmu
	backlogN atomic.Int32 // len(backlog); written under bmu, read anywhere

	// Async requests: inflight counts those taken whose completion has not
	// been posted (or put on the backlog) yet; asyncWG holds one count for
	// each, added only by the poller, so that Serve and Close can wait for
	// them. asyncErr is the first damage an async completion found.
	inflight atomic.Int32
	asyncWG  sync.WaitGroup
	asyncErr atomic.Pointer[error]

	// follow is set by an async completion that found the poller asleep
	// with nothing else in flight: the poller, woken, spins for the
	// client's next request (followSpin) instead of going back to sleep.
	follow atomic.Bool

	// load, when shared (ShareLoad), counts this session's requests in
	// flight with its siblings'; outstanding is this session's part (a
	// request taken but never answered, the session ended by damage, is
	// given back at the end of Serve); hint is the hints word as last
	// stored (changed under hintMu).
	load        *Load
	outstanding atomic.Int64
	hint        atomic.Uint32
	hintMu      sync.Mutex // orders changes of the hints word

	stopping atomic.Bool
	peerGone atomic.Bool
	done     chan struct{} // closed when Serve returns
	ending   chan struct{} // closed when the session stops taking requests (Ending)
	endOnce  sync.Once
	running  atomic.Bool
	once     sync.Once

	Stats ServerStats
}

// NewServerSession serves r with h. The session owns r from now on.
func NewServerSession(r *Region, h Handler, mode WaitMode) *ServerSession {
	ah, _ := h.(AsyncHandler)
	return &ServerSession{
		r: r, g: r.g, h: h, ah: ah, mode: mode,
		sq:       newSQ(r),
		cq:       newCQ(r),
		sqBell:   doorbell{r: r, bell: offSQBell, waiters: offSQWaiters},
		cqBell:   doorbell{r: r, bell: offCQBell, waiters: offCQWaiters},
		maxAsync: int32(r.g.SQEntries),
		segBuf:   make([]Segment, 0, InlineSegs),
		tableBuf: make([]byte, MaxSegments*SegmentSize),
		done:     make(chan struct{}),
		ending:   make(chan struct{}),
	}
}

// Ending returns a channel closed once the session has stopped taking
// requests (Serve is returning, or Close ran), before it waits for the
// async requests in flight: an async handler that waits for something
// with no bound of its own (a long poll) completes its request then, or
// the session's end waits for it forever.
func (s *ServerSession) Ending() <-chan struct{} { return s.ending }

func (s *ServerSession) end() { s.endOnce.Do(func() { close(s.ending) }) }

// Region returns the session's shared memory.
func (s *ServerSession) Region() *Region { return s.r }

// Stalled reports whether completions of the session wait for room in its
// CQ now: its client is not taking them (it serves no request meanwhile).
func (s *ServerSession) Stalled() bool { return s.backlogN.Load() > 0 }

// Load counts the requests in flight across a set of server sessions (a
// service's client sessions), so that each completion can tell its client
// whether to spin for the next (HintNoSpin). Requests that wait on
// purpose (a long poll) belong in sessions that do not share it.
//
// The sessions sharing a Load also take turns to spin for their queues:
// at most half the process's Ps (at least one) spin at once (spinTurn),
// the others sleep on their bell at once. Past that a spinner holds a P
// that a session woken by its doorbell needs: on a 2-CPU host with 8
// sessions spinning in turn, woken sessions waited in the run queue (a
// 4 KiB write took 530 µs at 8 fsync writers against 23 µs at 1).
type Load struct {
	pending   atomic.Int64
	noSpinAt  int64
	spinners  atomic.Int32
	spinLimit int32
}

// NewLoad returns a Load whose sessions' clients are told not to spin
// while at least half the host's CPUs' worth of requests are in flight.
func NewLoad() *Load {
	return &Load{noSpinAt: int64(max(1, runtime.NumCPU()/2)), spinLimit: int32(max(1, runtime.GOMAXPROCS(0)/2))}
}

// spinTurn reports whether a session of l may spin now; if so it must
// call spinDone when its spin ends.
func (l *Load) spinTurn() bool {
	if l.spinners.Add(1) > l.spinLimit {
		l.spinners.Add(-1)
		return false
	}
	return true
}

func (l *Load) spinDone() { l.spinners.Add(-1) }

// spin is the server's spin for its queue: sp's, in a turn of the Load
// when the session shares one.
func (s *ServerSession) spin(sp *spinner) bool {
	l := s.load
	if l == nil {
		return sp.spin(s.readyOrStopped)
	}
	if !l.spinTurn() {
		return false
	}
	defer l.spinDone()
	return sp.spin(s.readyOrStopped)
}

// Pending returns the requests in flight now.
func (l *Load) Pending() int64 { return l.pending.Load() }

// ShareLoad makes s count its requests in l and publish HintNoSpin from
// it. Call it before Serve.
func (s *ServerSession) ShareLoad(l *Load) { s.load = l }

// taken counts a request taken from the SQ.
func (s *ServerSession) taken() {
	if s.load != nil {
		s.outstanding.Add(1)
		s.load.pending.Add(1)
	}
}

// answered ends a request's count and stores the hint its completion
// carries: before the completion is published, so that the client sees
// it when it takes the completion.
func (s *ServerSession) answered() {
	l := s.load
	if l == nil {
		return
	}
	s.outstanding.Add(-1)
	if l.hintAt(l.pending.Add(-1)) == s.hint.Load() {
		return
	}
	// A change: under hintMu, from the count as it is now, so that
	// completions posted at once from several goroutines cannot leave
	// an older count's hint in the header.
	s.hintMu.Lock()
	if h := l.hintAt(l.pending.Load()); s.hint.Load() != h {
		s.hint.Store(h)
		s.r.store32(offServerHints, h)
	}
	s.hintMu.Unlock()
}

// hintAt is the hint of a completion posted with n requests in flight.
func (l *Load) hintAt(n int64) uint32 {
	if n >= l.noSpinAt {
		return HintNoSpin
	}
	return 0
}

// PeerGone tells the session that the client closed or died. Safe from any
// goroutine; Serve returns ErrPeerGone soon after, once the async requests
// in flight are done.
func (s *ServerSession) PeerGone() {
	s.peerGone.Store(true)
	s.sqBell.kick()
}

// Stop makes Serve return nil soon, as Close does, but keeps the region
// mapped: the owner may still use it (a service unregisters it from a
// backend) and calls Close afterwards. Safe from any goroutine; a Serve
// that has not started yet returns at once. Serve returns only once every
// async request in flight is done.
func (s *ServerSession) Stop() {
	s.stopping.Store(true)
	s.sqBell.kick()
}

// Close stops Serve, waits for it and for every async request in flight
// (also those a Poll caller started; Close must not run concurrently with
// Poll) and releases the region.
func (s *ServerSession) Close() {
	s.once.Do(func() {
		s.stopping.Store(true)
		if s.running.Load() {
			s.sqBell.kick()
			<-s.done
		}
		s.end()
		s.asyncWG.Wait()
		s.r.store32(offServerState, StateClosed)
		s.r.Close()
	})
}

func (s *ServerSession) stopErr() error {
	switch {
	case s.stopping.Load():
		return ErrClosed
	case s.peerGone.Load():
		return ErrPeerGone
	}
	if p := s.asyncErr.Load(); p != nil {
		return *p
	}
	return nil
}

// readyOrStopped reports whether the poller has something to do: a
// descriptor it may take, completions to flush, or an end.
func (s *ServerSession) readyOrStopped() bool {
	return (s.sq.ready() && s.inflight.Load() < s.maxAsync) || s.backlogN.Load() > 0 ||
		s.stopping.Load() || s.peerGone.Load() || s.asyncErr.Load() != nil
}

// Serve runs the session until Close (returns nil), the peer goes (returns
// ErrPeerGone) or the peer damages the region (returns an error wrapping
// ErrDamaged). Whatever ends it, Serve returns only after every async
// request it started is done. It may be called once.
func (s *ServerSession) Serve() (err error) {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("ring: Serve called twice")
	}
	defer close(s.done)
	if s.stopping.Load() {
		return nil
	}
	s.r.store32(offServerState, StateRunning)
	defer func() {
		// A handler that panicked is a bug: crash (the process restarts,
		// its state recovered) rather than wait below for requests it
		// will never finish, which would hang the session and hide the
		// panic.
		if p := recover(); p != nil {
			panic(p)
		}
		// Async handlers may still use the arena and post completions:
		// nobody may unmap the region before they are done.
		s.end()
		s.asyncWG.Wait()
		if s.load != nil {
			s.load.pending.Add(-s.outstanding.Swap(0))
		}
		if errors.Is(err, ErrDamaged) {
			s.Stats.Damaged.Store(true)
		}
		if errors.Is(err, ErrClosed) {
			err = nil
		}
	}()
	var sp spinner
	var backoff time.Duration
	var follow spinner
	nap := maxSleep // the next sleep on the doorbell: grows while they find nothing
	for i := 0; ; i++ {
		if err := s.stopErr(); err != nil {
			return err
		}
		n, err := s.Poll(64)
		if err != nil {
			return err
		}
		if n > 0 {
			nap = maxSleep
			continue
		}
		if !s.r.HeaderIntact() {
			return damaged("header changed")
		}
		if st := s.r.load32(offClientState); st == StateClosed {
			return ErrPeerGone
		}
		if s.backlogN.Load() > 0 {
			// The client is not taking completions and nothing rings for
			// that: look again, backing off so that a client that never
			// takes them costs little.
			backoff = min(max(2*backoff, 10*time.Microsecond), maxSleep)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		switch s.mode {
		case WaitBusyPoll:
			s.Stats.BusyPolls.Add(1)
			pollPause(i)
		default:
			if s.follow.Swap(false) {
				// An async completion woke this poller: its client has
				// the answer and most often sends again at once (the
				// next read after a miss). Spinning for it here, while
				// the client itself wakes, saves the second
				// cross-process wake-up.
				if s.spin(&follow) {
					s.Stats.FollowHits.Add(1)
					continue
				}
			}
			if !s.spin(&sp) {
				s.sqBell.sleepUpTo(s.readyOrStopped, nap)
				s.Stats.Wakeups.Add(1)
				if s.readyOrStopped() {
					nap = maxSleep
				} else {
					nap = min(2*nap, maxIdleSleep)
				}
			}
		}
	}
}

// Poll serves at most max requests that are already queued and returns how
// many it took. It never blocks. Services that multiplex many sessions on
// one worker call Poll instead of Serve. While SQEntries async requests are
// in flight it takes none: an async completion that frees a place rings
// the SQ doorbell.
func (s *ServerSession) Poll(max int) (int, error) {
	if p := s.asyncErr.Load(); p != nil {
		return 0, *p
	}
	n := 0
	for n < max {
		if s.backlogN.Load() > 0 {
			if err := s.flushBacklog(); err != nil {
				return n, err
			}
			if s.backlogN.Load() > 0 {
				break
			}
		}
		if s.inflight.Load() >= s.maxAsync {
			if s.sq.ready() {
				s.Stats.Throttled.Add(1)
			}
			break
		}
		pos, off, ok, err := s.sq.claimConsume()
		if err != nil {
			return n, damaged("submission queue: %v", err)
		}
		if !ok {
			break
		}
		// Read once: copy the slot, give it back, then look at the copy.
		copy(s.slotBuf[:], s.r.mem[off:off+SQSlotSize])
		s.sq.recycle(pos, off)
		s.Stats.Requests.Add(1)
		s.taken()
		d, _ := DecodeDescriptor(s.slotBuf[:])
		if err := s.serveOne(&d); err != nil {
			return n, err
		}
		n++
	}
	if n > 0 {
		s.cqBell.notify()
	}
	return n, nil
}

func (s *ServerSession) readTable(off, n uint32) []byte {
	b := s.tableBuf[:n]
	copy(b, s.r.arena()[off:off+n])
	return b
}

// serveOne validates d and serves it: synchronously, posting the
// completion, or by handing it to the AsyncHandler.
func (s *ServerSession) serveOne(d *Descriptor) error {
	segs, e := ValidateDescriptor(d, &s.g, s.readTable, s.h.Known, s.segBuf[:0])
	if e != 0 {
		s.Stats.Rejected.Add(1)
		return s.post(errCompletion(d.ReqID, e))
	}
	// req is owned by this goroutine and reused: a Handler must not keep it.
	s.req = Request{Descriptor: *d, Segs: segs, arena: s.r.arena()}
	var err error
	if s.ah != nil && s.ah.Async(d.Opcode) {
		s.req.Alone = s.inflight.Load() == 0 && !s.sq.ready()
		s.serveAsync(&s.req)
	} else {
		res, aux := s.h.Serve(&s.req)
		err = s.post(Completion{ReqID: d.ReqID, Result: res, Aux: aux})
	}
	if cap(segs) > cap(s.segBuf) && cap(segs) <= MaxSegments {
		s.segBuf = segs[:0]
	}
	return err
}

// serveAsync hands req to the AsyncHandler. Called by the poller only.
func (s *ServerSession) serveAsync(req *Request) {
	s.inflight.Add(1)
	s.asyncWG.Add(1)
	s.Stats.Async.Add(1)
	c := &asyncCall{s: s, id: req.ReqID}
	s.ah.ServeAsync(req, c.done)
}

// asyncCall is one async request's completion handle.
type asyncCall struct {
	s      *ServerSession
	id     uint64
	called atomic.Bool
}

func (c *asyncCall) done(result int64, aux uint64) {
	if c.called.Swap(true) {
		panic(fmt.Sprintf("ring: done called twice for request %#x", c.id))
	}
	c.s.complete(Completion{ReqID: c.id, Result: result, Aux: aux})
}

// complete posts an async request's completion, from any goroutine, and
// ends the request. The region stays mapped until asyncWG.Done.
func (s *ServerSession) complete(c Completion) {
	if err := s.post(c); err != nil {
		s.fail(err)
	}
	s.cqBell.notify()
	n := s.inflight.Add(-1)
	switch {
	case n == 0 && s.mode != WaitBusyPoll && s.r.load32(s.sqBell.waiters) != 0:
		// The last request in flight is answered and the poller sleeps:
		// wake it to spin for the client's next one (Serve, follow).
		s.follow.Store(true)
		s.Stats.Follows.Add(1)
		s.sqBell.notify()
	case n == s.maxAsync-1:
		// The poller may be asleep at the bound with descriptors waiting.
		s.sqBell.notify()
	}
	s.asyncWG.Done()
}

// fail records damage an async completion found and wakes the poller,
// which ends the session with it.
func (s *ServerSession) fail(err error) {
	if s.asyncErr.CompareAndSwap(nil, &err) {
		s.sqBell.kick()
	}
}

// post puts c on the CQ, or on the backlog if the client has not made room
// or completions are waiting there already. Safe from any goroutine.
func (s *ServerSession) post(c Completion) error {
	s.answered()
	if s.backlogN.Load() == 0 {
		pos, off, ok, err := s.cq.claimProduce()
		if err != nil {
			return damaged("completion queue: %v", err)
		}
		if ok {
			encodeCompletion(s.r.mem[off:off+CQSlotSize], c)
			s.cq.publish(pos, off)
			return nil
		}
	}
	s.bmu.Lock()
	s.backlog = append(s.backlog, c)
	s.backlogN.Store(int32(len(s.backlog)))
	s.bmu.Unlock()
	s.Stats.Backlog.Add(1)
	s.sqBell.notify() // a sleeping poller wakes to flush it
	return nil
}

// flushBacklog moves what it can of the backlog to the CQ. Called by the
// poller only.
func (s *ServerSession) flushBacklog() error {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	sent := 0
	var err error
	for _, c := range s.backlog {
		pos, off, ok, cerr := s.cq.claimProduce()
		if cerr != nil {
			err = damaged("completion queue: %v", cerr)
			break
		}
		if !ok {
			break
		}
		encodeCompletion(s.r.mem[off:off+CQSlotSize], c)
		s.cq.publish(pos, off)
		sent++
	}
	s.backlog = append(s.backlog[:0], s.backlog[sent:]...)
	s.backlogN.Store(int32(len(s.backlog)))
	if sent > 0 {
		s.cqBell.notify()
	}
	return err
}
