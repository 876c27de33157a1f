package ring

import (
	"errors"
	"fmt"
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
	Segs  []Segment
	arena []byte
}

// Seg returns the arena bytes of segment i.
func (q *Request) Seg(i int) []byte {
	s := q.Segs[i]
	return q.arena[s.Off : s.Off+s.Len : s.Off+s.Len]
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

// Handler serves validated requests of one session. Serve runs on the
// session's poller goroutine and returns the completion's Result and Aux.
// The *Request is valid only during the call.
type Handler interface {
	Known(op uint8) bool
	Serve(req *Request) (result int64, aux uint64)
}

// HandlerFunc serves one opcode.
type HandlerFunc func(req *Request) (result int64, aux uint64)

// Mux routes opcodes to functions. NewMux serves OpNop and OpEcho. A Mux is
// filled before the first session uses it and read-only afterwards.
type Mux struct {
	h       [256]HandlerFunc
	echoBuf sync.Pool
}

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
	if op < OpFirstService {
		panic(fmt.Sprintf("ring: opcode %d is reserved for the ring", op))
	}
	if m.h[op] != nil {
		panic(fmt.Sprintf("ring: opcode %d registered twice", op))
	}
	m.h[op] = f
}

// Known reports whether op has a handler.
func (m *Mux) Known(op uint8) bool { return m.h[op] != nil }

// Serve dispatches req.
func (m *Mux) Serve(req *Request) (int64, uint64) { return m.h[req.Opcode](req) }

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
	Backlog   atomic.Uint64 // completions that found the CQ full
	Wakeups   atomic.Uint64 // futex sleeps ended
	Damaged   atomic.Bool
	BusyPolls atomic.Uint64
}

// ServerSession serves one ring region: it takes descriptors from the SQ,
// validates them, calls the Handler and posts completions. All fields but
// the atomics are owned by the goroutine running Serve (or Poll).
type ServerSession struct {
	r      *Region
	g      Geometry
	h      Handler
	mode   WaitMode
	sq, cq *queue
	sqBell doorbell
	cqBell doorbell

	req      Request      // the request being served; reused to keep Serve allocation-free
	backlog  []Completion // completions waiting for CQ space; Poll takes no new request while it is non-empty, so it holds at most one
	slotBuf  [SQSlotSize]byte
	segBuf   []Segment
	tableBuf []byte

	stopping atomic.Bool
	peerGone atomic.Bool
	done     chan struct{} // closed when Serve returns
	running  atomic.Bool
	once     sync.Once

	Stats ServerStats
}

// NewServerSession serves r with h. The session owns r from now on.
func NewServerSession(r *Region, h Handler, mode WaitMode) *ServerSession {
	return &ServerSession{
		r: r, g: r.g, h: h, mode: mode,
		sq:       newSQ(r),
		cq:       newCQ(r),
		sqBell:   doorbell{r: r, bell: offSQBell, waiters: offSQWaiters},
		cqBell:   doorbell{r: r, bell: offCQBell, waiters: offCQWaiters},
		segBuf:   make([]Segment, 0, InlineSegs),
		tableBuf: make([]byte, MaxSegments*SegmentSize),
		done:     make(chan struct{}),
	}
}

// Region returns the session's shared memory.
func (s *ServerSession) Region() *Region { return s.r }

// PeerGone tells the session that the client closed or died. Safe from any
// goroutine; Serve returns ErrPeerGone soon after.
func (s *ServerSession) PeerGone() {
	s.peerGone.Store(true)
	s.sqBell.kick()
}

// Stop makes Serve return nil soon, as Close does, but keeps the region
// mapped: the owner may still use it (a service unregisters it from a
// backend) and calls Close afterwards. Safe from any goroutine; a Serve
// that has not started yet returns at once.
func (s *ServerSession) Stop() {
	s.stopping.Store(true)
	s.sqBell.kick()
}

// Close stops Serve, waits for it and releases the region.
func (s *ServerSession) Close() {
	s.once.Do(func() {
		s.stopping.Store(true)
		if s.running.Load() {
			s.sqBell.kick()
			<-s.done
		}
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
	return nil
}

func (s *ServerSession) readyOrStopped() bool {
	return s.sq.ready() || s.stopping.Load() || s.peerGone.Load()
}

// Serve runs the session until Close (returns nil), the peer goes (returns
// ErrPeerGone) or the peer damages the region (returns an error wrapping
// ErrDamaged). It may be called once.
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
		if errors.Is(err, ErrDamaged) {
			s.Stats.Damaged.Store(true)
		}
		if errors.Is(err, ErrClosed) {
			err = nil
		}
	}()
	var sp spinner
	var backoff time.Duration
	for i := 0; ; i++ {
		if err := s.stopErr(); err != nil {
			return err
		}
		n, err := s.Poll(64)
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if !s.r.HeaderIntact() {
			return damaged("header changed")
		}
		if st := s.r.load32(offClientState); st == StateClosed {
			return ErrPeerGone
		}
		if len(s.backlog) > 0 {
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
			if !sp.spin(s.readyOrStopped) {
				s.sqBell.sleep(s.readyOrStopped)
				s.Stats.Wakeups.Add(1)
			}
		}
	}
}

// Poll serves at most max requests that are already queued and returns how
// many it took. It never blocks. Services that multiplex many sessions on
// one worker call Poll instead of Serve.
func (s *ServerSession) Poll(max int) (int, error) {
	n := 0
	for n < max {
		if len(s.backlog) > 0 {
			if err := s.flushBacklog(); err != nil {
				return n, err
			}
			if len(s.backlog) > 0 {
				break
			}
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
		d, _ := DecodeDescriptor(s.slotBuf[:])
		if err := s.post(s.serveOne(&d)); err != nil {
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

func (s *ServerSession) serveOne(d *Descriptor) Completion {
	segs, e := ValidateDescriptor(d, &s.g, s.readTable, s.h.Known, s.segBuf[:0])
	if e != 0 {
		s.Stats.Rejected.Add(1)
		return errCompletion(d.ReqID, e)
	}
	// req is owned by this goroutine and reused: a Handler must not keep it.
	s.req = Request{Descriptor: *d, Segs: segs, arena: s.r.arena()}
	res, aux := s.h.Serve(&s.req)
	if cap(segs) > cap(s.segBuf) && cap(segs) <= MaxSegments {
		s.segBuf = segs[:0]
	}
	return Completion{ReqID: d.ReqID, Result: res, Aux: aux}
}

// post puts c on the CQ, or on the backlog if the client has not made room.
func (s *ServerSession) post(c Completion) error {
	if len(s.backlog) > 0 {
		s.backlog = append(s.backlog, c)
		s.Stats.Backlog.Add(1)
		return nil
	}
	pos, off, ok, err := s.cq.claimProduce()
	if err != nil {
		return damaged("completion queue: %v", err)
	}
	if !ok {
		s.backlog = append(s.backlog, c)
		s.Stats.Backlog.Add(1)
		return nil
	}
	encodeCompletion(s.r.mem[off:off+CQSlotSize], c)
	s.cq.publish(pos, off)
	return nil
}

func (s *ServerSession) flushBacklog() error {
	sent := 0
	for _, c := range s.backlog {
		pos, off, ok, err := s.cq.claimProduce()
		if err != nil {
			return damaged("completion queue: %v", err)
		}
		if !ok {
			break
		}
		encodeCompletion(s.r.mem[off:off+CQSlotSize], c)
		s.cq.publish(pos, off)
		sent++
	}
	s.backlog = append(s.backlog[:0], s.backlog[sent:]...)
	if sent > 0 {
		s.cqBell.notify()
	}
	return nil
}
