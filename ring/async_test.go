package ring

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// regionMapped reports whether mem is still mapped in this process (msync
// fails with ENOMEM on unmapped pages, where reading would fault) and still
// starts with the ring header.
func regionMapped(mem []byte) error {
	if err := unix.Msync(mem, unix.MS_ASYNC); err != nil {
		return fmt.Errorf("msync of the region: %w", err)
	}
	if m := binary.LittleEndian.Uint64(mem); m != Magic {
		return fmt.Errorf("region starts with %#x, not the ring magic", m)
	}
	return nil
}

// waitFor polls cond until it holds. A hang fails the test; the bound is
// generous and not a performance assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30s (hang)", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// waitParked receives the next n opAsyncPark requests.
func (h *testHandler) waitParked(t *testing.T, n int) []*parkedReq {
	t.Helper()
	out := make([]*parkedReq, 0, n)
	for range n {
		out = append(out, guard(t, h.parked, "parked request"))
	}
	return out
}

// rawClient drives a server session's queues directly, as a peer that
// keeps no request slots would: it can submit more than SQEntries requests
// in flight, and forge any descriptor.
type rawClient struct {
	r      *Region
	sq, cq *queue
	bell   doorbell
}

func newRawClient(r *Region) *rawClient {
	return &rawClient{r: r, sq: newSQ(r), cq: newCQ(r), bell: doorbell{r: r, bell: offSQBell, waiters: offSQWaiters}}
}

// submit puts d on the SQ; false if the SQ is full.
func (c *rawClient) submit(t *testing.T, d *Descriptor) bool {
	t.Helper()
	pos, off, ok, err := c.sq.claimProduce()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return false
	}
	encodeDescriptor(c.r.mem[off:off+SQSlotSize], d)
	c.sq.publish(pos, off)
	c.bell.notify()
	return true
}

// reap takes every completion in the CQ.
func (c *rawClient) reap(t *testing.T) []Completion {
	t.Helper()
	var out []Completion
	for {
		pos, off, ok, err := c.cq.claimConsume()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, decodeCompletion(c.r.mem[off:off+CQSlotSize]))
		c.cq.recycle(pos, off)
	}
}

// rawSession serves a new region of cfg with a test handler and no client.
func rawSession(t *testing.T, cfg Config, mode WaitMode) (*ServerSession, *testHandler, *rawClient, <-chan error) {
	t.Helper()
	r, err := Create(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHandler()
	s := NewServerSession(r, h, mode)
	serveCh := make(chan error, 1)
	go func() { serveCh <- s.Serve() }()
	t.Cleanup(func() {
		close(h.gate) // releases whatever a failed test left parked
		s.Close()
	})
	return s, h, newRawClient(r), serveCh
}

// Thirty-two goroutines of one client share a session: all their requests
// are inside the handler at once, and completions released in a random
// order reach the right callers with the right payloads.
func TestAsyncOutOfOrderCompletions(t *testing.T) {
	seed := testSeed(t)
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			const n = 32
			e := newPipe(t, Config{SQEntries: 64, ArenaSize: 1 << 20, BlockSize: 4096}, mode, ClientOptions{Mode: mode})
			ctx := context.Background()
			type result struct {
				i       int
				c       Completion
				payload []byte
				err     error
			}
			results := make(chan result, n)
			for i := range n {
				go func() {
					b, err := e.cli.Alloc(ctx, 1000+100*i)
					if err != nil {
						results <- result{i: i, err: err}
						return
					}
					defer b.Release()
					c, err := e.cli.Do(ctx, &Call{Op: opAsyncPark, Arg: uint32(i), Handle: uint64(1000 + i), Buf: b})
					got := make([]byte, b.Len())
					b.CopyTo(got)
					results <- result{i, c, got, err}
				}()
			}
			parked := e.h.waitParked(t, n)
			if in := e.h.inside.Load(); in != n {
				t.Fatalf("%d requests inside the handler, want %d", in, n)
			}
			rng := newRand(seed, 1)
			rng.Shuffle(len(parked), func(i, j int) { parked[i], parked[j] = parked[j], parked[i] })
			// One at a time: each completion overtakes every request
			// submitted before it and still parked.
			for _, p := range parked {
				close(p.release)
				r := guard(t, results, "completion")
				if r.err != nil {
					t.Fatalf("request %d: %v", r.i, r.err)
				}
				if r.i != int(p.req.Arg) {
					t.Fatalf("released request %d, request %d completed", p.req.Arg, r.i)
				}
				if r.c.Result != int64(len(r.payload)) || r.c.Aux != uint64(1000+r.i) {
					t.Fatalf("request %d: completion %+v, want result %d aux %d", r.i, r.c, len(r.payload), 1000+r.i)
				}
				if !bytes.Equal(r.payload, bytes.Repeat([]byte{byte(r.i)}, len(r.payload))) {
					t.Fatalf("request %d: payload not filled with %#x", r.i, r.i)
				}
			}
			if a := e.srv.Stats.Async.Load(); a != n {
				t.Fatalf("Stats.Async = %d, want %d", a, n)
			}
			if s := e.cli.Stats.Stray.Load(); s != 0 {
				t.Fatalf("%d stray completions", s)
			}
		})
	}
}

// Many goroutines mix synchronous requests with asynchronous ones that
// complete on other goroutines after random delays (out of order) or at
// once; more goroutines than request slots. Every result is checked byte
// for byte. Seeded: -seed replays a failure.
func TestAsyncConcurrentStress(t *testing.T) {
	seed := testSeed(t)
	e := newPipe(t, Config{SQEntries: 16, ArenaSize: 1 << 20, BlockSize: 1024}, WaitAdaptive, ClientOptions{})
	ops := 50
	if testing.Short() {
		ops = 20
	}
	runStress(t, e, seed, 32, ops)
	if e.srv.Stats.Async.Load() == 0 {
		t.Fatal("no request was served asynchronously")
	}
}

// At the bound on async requests in flight the poller takes no more
// descriptors; each completion lets exactly one more in, and none is lost.
func TestAsyncBoundBackpressure(t *testing.T) {
	const bound, calls = 4, 12
	e := newPipeSetup(t, Config{SQEntries: 16, ArenaSize: 256 << 10, BlockSize: 4096}, WaitAdaptive, ClientOptions{},
		func(sc *ServerConn) { sc.maxAsync = bound })
	ctx := context.Background()
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			c, err := e.cli.Do(ctx, &Call{Op: opAsyncPark, Handle: uint64(i)})
			if err == nil && c.Aux != uint64(i) {
				err = fmt.Errorf("call %d got the completion of %d", i, c.Aux)
			}
			errs <- err
		}()
	}
	parked := e.h.waitParked(t, bound)
	// The poller found descriptors waiting and left them in the SQ.
	waitFor(t, "a throttled poll", func() bool { return e.srv.Stats.Throttled.Load() > 0 })
	select {
	case p := <-e.h.parked:
		t.Fatalf("request %d taken beyond the bound of %d", p.req.Handle, bound)
	default:
	}
	if n := e.srv.inflight.Load(); n != bound {
		t.Fatalf("%d async requests in flight, want %d", n, bound)
	}
	taken := bound
	for len(parked) > 0 {
		close(parked[0].release)
		parked = parked[1:]
		if err := guard(t, errs, "call"); err != nil {
			t.Fatal(err)
		}
		if taken < calls {
			parked = append(parked, e.h.waitParked(t, 1)...)
			taken++
		}
	}
	if m := e.h.maxInside.Load(); m != bound {
		t.Fatalf("at most %d requests were inside the handler at once, want %d", m, bound)
	}
	if a := e.srv.Stats.Async.Load(); a != calls {
		t.Fatalf("Stats.Async = %d, want %d", a, calls)
	}
}

// A peer that keeps no request slots floods the SQ: the server holds at
// most SQEntries async requests in flight (the default bound), leaves the
// rest in the SQ, and answers every one in the end.
func TestAsyncBoundFloodingPeer(t *testing.T) {
	const entries, total = 8, 4 * 8
	s, h, c, serveCh := rawSession(t, Config{SQEntries: entries, ArenaSize: 64 << 10, BlockSize: 4096}, WaitAdaptive)
	next := uint64(1) // request ids 1..total
	submit := func() bool {
		if next > total || !c.submit(t, &Descriptor{Opcode: opAsyncPark, ReqID: next, Handle: next}) {
			return false
		}
		next++
		return true
	}
	// entries requests in the handler and entries more in the SQ.
	waitFor(t, "a full SQ", func() bool {
		submit()
		return next == 2*entries+1
	})
	waitFor(t, "a throttled poll", func() bool { return s.Stats.Throttled.Load() > 0 })
	if submit() {
		t.Fatal("the SQ took a descriptor beyond its size: the server consumed past the bound")
	}
	if in, n := h.inside.Load(), s.inflight.Load(); in != entries || n != entries {
		t.Fatalf("%d requests inside the handler, %d in flight; want %d", in, n, entries)
	}
	seen := make(map[uint64]bool)
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < total {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d completions after 30s (hang)", len(seen), total)
		}
		for released := false; !released; {
			select {
			case p := <-h.parked:
				close(p.release)
			default:
				released = true
			}
		}
		for _, comp := range c.reap(t) {
			if comp.ReqID == 0 || comp.ReqID > total || seen[comp.ReqID] || comp.Aux != comp.ReqID {
				t.Fatalf("unexpected completion %+v", comp)
			}
			seen[comp.ReqID] = true
		}
		for submit() {
		}
		time.Sleep(50 * time.Microsecond)
	}
	if m := h.maxInside.Load(); m != entries {
		t.Fatalf("at most %d requests were inside the handler at once, want %d", m, entries)
	}
	s.Close()
	if err := guard(t, serveCh, "Serve"); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// Whatever ends a session, Serve (and Close) return only after every async
// request in flight is done, and the region stays mapped until then: the
// parked handlers write into the arena after they are released.
func TestAsyncShutdownWaitsForHandlers(t *testing.T) {
	cases := []struct {
		name      string
		end       func(e *pipeEnv)
		want      error
		blocksEnd bool // end itself waits for the handlers
	}{
		{"Close", func(e *pipeEnv) { e.srv.Close() }, nil, true},
		{"Stop", func(e *pipeEnv) { e.srv.Stop() }, nil, false},
		{"PeerGone", func(e *pipeEnv) { e.srv.PeerGone() }, ErrPeerGone, false},
		{"client Close", func(e *pipeEnv) { e.cli.Close() }, ErrPeerGone, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
			mem := e.srv.Region().Bytes()
			ctx := context.Background()
			for i := range 2 {
				go func() {
					b, err := e.cli.Alloc(ctx, 8192)
					if err != nil {
						return
					}
					e.cli.Do(ctx, &Call{Op: opAsyncPark, Arg: uint32(0xa0 + i), Buf: b})
					b.Release()
				}()
			}
			parked := e.h.waitParked(t, 2)
			ended := make(chan struct{})
			go func() {
				tc.end(e)
				close(ended)
			}()
			// Give a server that does not wait time to return and unmap.
			time.Sleep(20 * time.Millisecond)
			select {
			case err := <-e.serveCh:
				t.Fatalf("Serve returned %v with 2 async requests in flight", err)
			default:
			}
			if tc.blocksEnd {
				select {
				case <-ended:
					t.Fatalf("%s returned with 2 async requests in flight", tc.name)
				default:
				}
			}
			if err := regionMapped(mem); err != nil {
				t.Fatalf("with 2 async requests in flight: %v", err)
			}
			if n := e.srv.inflight.Load(); n != 2 {
				t.Fatalf("%d async requests in flight, want 2", n)
			}
			for _, p := range parked {
				close(p.release)
			}
			if err := guard(t, e.serveCh, "Serve"); !errors.Is(err, tc.want) {
				t.Fatalf("Serve: %v, want %v", err, tc.want)
			}
			guard(t, ended, tc.name)
			if n := e.srv.inflight.Load(); n != 0 {
				t.Fatalf("Serve returned with %d async requests in flight", n)
			}
			if tc.name == "Stop" {
				if err := regionMapped(mem); err != nil {
					t.Fatalf("after Stop: %v", err)
				}
			}
		})
	}
}

// A service that calls Poll itself: Close waits for the async requests
// Poll started.
func TestAsyncClosePollUser(t *testing.T) {
	r, err := Create(smallCfg())
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHandler()
	s := NewServerSession(r, h, WaitBusyPoll)
	c := newRawClient(r)
	for id := range uint64(2) {
		c.submit(t, &Descriptor{Opcode: opAsyncPark, ReqID: id + 1})
	}
	if n, err := s.Poll(8); n != 2 || err != nil {
		t.Fatalf("Poll: %d %v", n, err)
	}
	parked := h.waitParked(t, 2)
	mem := r.Bytes()
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-closed:
		t.Fatal("Close returned with 2 async requests in flight")
	default:
	}
	if err := regionMapped(mem); err != nil {
		t.Fatal(err)
	}
	for _, p := range parked {
		close(p.release)
	}
	guard(t, closed, "Close")
}

// Descriptors of async opcodes that fail validation are answered with the
// validation errno and never reach the handler; the valid ones around them
// are served.
func TestAsyncHostileDescriptors(t *testing.T) {
	cfg := Config{SQEntries: 16, ArenaSize: 64 << 10, BlockSize: 4096}
	s, _, c, _ := rawSession(t, cfg, WaitAdaptive)
	g := s.r.Geometry()
	arena := s.r.arena()
	for i := range 100 {
		arena[i] = byte(i)
	}
	seg := func(off, n uint32) [InlineSegs]Segment { return [InlineSegs]Segment{{Off: off, Len: n}} }
	tbl := make([]byte, 16) // an indirect table naming a segment outside the arena
	binary.LittleEndian.PutUint32(tbl[0:], uint32(g.ArenaSize))
	binary.LittleEndian.PutUint32(tbl[4:], 8)
	copy(arena[8192:], tbl)
	cases := []struct {
		d    Descriptor
		want int64
	}{
		{Descriptor{Opcode: opAsyncXor, Arg: 0xff, NSeg: 1, Length: 100, Inline: seg(0, 100)}, 100},
		{Descriptor{Opcode: opAsyncXor, NSeg: 1, Length: 8, Inline: seg(uint32(g.ArenaSize), 8)}, -int64(syscall.EFAULT)},
		{Descriptor{Opcode: opAsyncXor, NSeg: 1, Length: 99, Inline: seg(0, 100)}, -int64(syscall.EINVAL)},
		{Descriptor{Opcode: opAsyncXor, NSeg: InlineSegs + 1, Length: 8, Inline: seg(0, 8)}, -int64(syscall.E2BIG)},
		{Descriptor{Opcode: opAsyncXor, Flags: 0x80, NSeg: 1, Length: 8, Inline: seg(0, 8)}, -int64(syscall.EINVAL)},
		{Descriptor{Opcode: opAsyncXor, Flags: FlagIndirect, NSeg: 2, Length: 8, Inline: seg(8192, 16)}, -int64(syscall.EFAULT)},
		{Descriptor{Opcode: opAsyncXor, Flags: FlagIndirect, NSeg: 1, Length: 8, Inline: seg(8192, 8)}, -int64(syscall.EFAULT)},
		{Descriptor{Opcode: opAsyncPark, NSeg: 1, Length: 8, Inline: seg(3, 8)}, -int64(syscall.EFAULT)},
		{Descriptor{Opcode: opAsyncNow, NSeg: 1, Length: 0, Inline: seg(0, 0)}, -int64(syscall.EFAULT)},
		{Descriptor{Opcode: opAsyncNow, NSeg: 1, Length: 50, Inline: seg(4096, 50)}, 50},
	}
	for i := range cases {
		cases[i].d.ReqID = uint64(i + 1)
		cases[i].d.Handle = uint64(i + 1)
		if !c.submit(t, &cases[i].d) {
			t.Fatal("SQ full")
		}
	}
	got := make(map[uint64]Completion)
	waitFor(t, "every completion", func() bool {
		for _, comp := range c.reap(t) {
			got[comp.ReqID] = comp
		}
		return len(got) == len(cases)
	})
	for i, tc := range cases {
		comp, ok := got[uint64(i+1)]
		if !ok || comp.Result != tc.want {
			t.Errorf("case %d (%+v): completion %+v, want result %d", i, tc.d, comp, tc.want)
		}
	}
	if a, r := s.Stats.Async.Load(), s.Stats.Rejected.Load(); a != 2 || r != uint64(len(cases)-2) {
		t.Errorf("Stats: %d async, %d rejected; want 2 and %d", a, r, len(cases)-2)
	}
	for i := range 100 {
		if arena[i] != byte(i)^0xff {
			t.Fatalf("arena byte %d is %#x after the async xor, want %#x", i, arena[i], byte(i)^0xff)
		}
	}
}

// Request.Alone is set exactly when no other request of the session is in
// flight and none waits in the SQ.
func TestAsyncAlone(t *testing.T) {
	r, err := Create(Config{SQEntries: 8, ArenaSize: 64 << 10, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHandler()
	s := NewServerSession(r, h, WaitBusyPoll)
	defer s.Close()
	c := newRawClient(r)
	id := uint64(0)
	submit := func(k int) {
		for range k {
			id++
			if !c.submit(t, &Descriptor{Opcode: opAsyncPark, ReqID: id}) {
				t.Fatal("SQ full")
			}
		}
	}
	poll := func(k int) []*parkedReq {
		if n, err := s.Poll(64); err != nil || n != k {
			t.Fatalf("Poll took %d, %v; want %d", n, err, k)
		}
		return h.waitParked(t, k)
	}
	finish := func(ps []*parkedReq) {
		for _, p := range ps {
			close(p.release)
		}
		got := 0
		waitFor(t, "completions", func() bool { got += len(c.reap(t)); return got == len(ps) })
	}
	alone := func(ps []*parkedReq) []bool {
		var out []bool
		for _, p := range ps {
			out = append(out, p.req.Alone)
		}
		return out
	}
	submit(1)
	first := poll(1)
	submit(2)
	more := poll(2)
	if got := alone(append(first, more...)); fmt.Sprint(got) != "[true false false]" {
		t.Fatalf("one alone, then two while it is in flight: Alone = %v", got)
	}
	finish(append(first, more...))
	submit(2)
	two := poll(2)
	if got := alone(two); fmt.Sprint(got) != "[false false]" {
		t.Fatalf("two queued together: Alone = %v", got)
	}
	finish(two)
	submit(1)
	last := poll(1)
	if got := alone(last); fmt.Sprint(got) != "[true]" {
		t.Fatalf("one after the others finished: Alone = %v", got)
	}
	finish(last)
}
