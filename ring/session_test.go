package ring

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var seedFlag = flag.Uint64("seed", 0, "seed for randomized tests (0: pick one and log it)")

func testSeed(t testing.TB) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed=%d)", s, s)
	return s
}

func newRand(seed uint64, stream int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(stream)))
}

// Test opcodes.
const (
	opXor   = OpFirstService     // payload[i] ^= byte(Arg); result = payload length
	opSleep = OpFirstService + 1 // sleep Arg milliseconds
	opBlock = OpFirstService + 2 // wait until the test's gate opens
	opStore = OpFirstService + 3 // store Arg into testShared[Handle] (Go heap)

	// Async opcodes (AsyncHandler): they complete on another goroutine,
	// or at once for opAsyncNow.
	opAsyncXor  = OpFirstService + 4 // opXor after Offset%1000 µs
	opAsyncPark = OpFirstService + 5 // park until released, fill the payload with byte(Arg); result = Length, aux = Handle
	opAsyncNow  = OpFirstService + 6 // done from ServeAsync itself; result = Length, aux = Handle
	opAsyncLoad = OpFirstService + 7 // result = testShared[Handle], read on another goroutine
)

// parkedReq is an opAsyncPark request waiting for the test to release it.
type parkedReq struct {
	req     *Request
	release chan struct{}
}

type testHandler struct {
	*Mux
	gate    chan struct{}
	entered chan struct{}
	shared  []uint64

	parked    chan *parkedReq // opAsyncPark requests, as they arrive
	inside    atomic.Int32    // opAsyncPark requests not yet done
	maxInside atomic.Int32
}

func newTestHandler() *testHandler {
	h := &testHandler{Mux: NewMux(), gate: make(chan struct{}), entered: make(chan struct{}, 1024),
		shared: make([]uint64, 64), parked: make(chan *parkedReq, 1024)}
	h.HandleAsync(opAsyncXor, func(q *Request, done func(int64, uint64)) {
		q = q.Clone()
		go func() {
			if d := q.Offset % 1000; d != 0 {
				time.Sleep(time.Duration(d) * time.Microsecond)
			}
			for i := range q.Segs {
				b := q.Seg(i)
				for j := range b {
					b[j] ^= byte(q.Arg)
				}
			}
			done(int64(q.Length), q.Handle)
		}()
	})
	h.HandleAsync(opAsyncPark, func(q *Request, done func(int64, uint64)) {
		p := &parkedReq{req: q.Clone(), release: make(chan struct{})}
		n := h.inside.Add(1)
		for m := h.maxInside.Load(); n > m && !h.maxInside.CompareAndSwap(m, n); m = h.maxInside.Load() {
		}
		h.parked <- p
		go func() {
			select {
			case <-p.release:
			case <-h.gate: // the test is over
			}
			// Writes into the arena after the wait: a region unmapped
			// under a parked request would crash here.
			for i := range p.req.Segs {
				b := p.req.Seg(i)
				for j := range b {
					b[j] = byte(p.req.Arg)
				}
			}
			h.inside.Add(-1)
			done(int64(p.req.Length), p.req.Handle)
		}()
	})
	h.HandleAsync(opAsyncLoad, func(q *Request, done func(int64, uint64)) {
		if q.Handle >= uint64(len(h.shared)) {
			done(-int64(syscall.EINVAL), 0)
			return
		}
		v := h.shared[q.Handle] // the poller served every earlier request first
		go done(int64(v), 0)
	})
	h.HandleAsync(opAsyncNow, func(q *Request, done func(int64, uint64)) {
		done(int64(q.Length), q.Handle)
	})
	h.Handle(opXor, func(q *Request) (int64, uint64) {
		for i := range q.Segs {
			b := q.Seg(i)
			for j := range b {
				b[j] ^= byte(q.Arg)
			}
		}
		return int64(q.Length), q.Handle
	})
	h.Handle(opSleep, func(q *Request) (int64, uint64) {
		time.Sleep(time.Duration(q.Arg) * time.Millisecond)
		return 0, 0
	})
	h.Handle(opBlock, func(q *Request) (int64, uint64) {
		h.entered <- struct{}{}
		<-h.gate
		return 0, 0
	})
	h.Handle(opStore, func(q *Request) (int64, uint64) {
		if q.Handle >= uint64(len(h.shared)) {
			return -int64(syscall.EINVAL), 0
		}
		h.shared[q.Handle] = uint64(q.Arg) // plain write: the ring must order it
		return 0, 0
	})
	return h
}

type pipeEnv struct {
	srv     *ServerConn
	cli     *Client
	h       *testHandler
	serveCh chan error
}

func newPipe(t testing.TB, cfg Config, smode WaitMode, copts ClientOptions) *pipeEnv {
	t.Helper()
	return newPipeSetup(t, cfg, smode, copts, nil)
}

// newPipeSetup is newPipe; setup, if not nil, runs before Serve starts.
func newPipeSetup(t testing.TB, cfg Config, smode WaitMode, copts ClientOptions, setup func(*ServerConn)) *pipeEnv {
	t.Helper()
	h := newTestHandler()
	srv, cli, err := Pipe(cfg, h, smode, copts)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(srv)
	}
	e := &pipeEnv{srv: srv, cli: cli, h: h, serveCh: make(chan error, 1)}
	go func() { e.serveCh <- srv.Serve() }()
	t.Cleanup(func() {
		select {
		case <-h.gate:
		default:
			close(h.gate)
		}
		cli.Close()
		srv.Close()
	})
	return e
}

func smallCfg() Config { return Config{SQEntries: 16, ArenaSize: 256 << 10, BlockSize: 4096} }

func TestPipeNopEchoXor(t *testing.T) {
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newPipe(t, smallCfg(), mode, ClientOptions{Mode: mode})
			ctx := context.Background()
			c, err := e.cli.Do(ctx, &Call{Op: OpNop})
			if err != nil || c.Result != 0 {
				t.Fatalf("nop: %+v %v", c, err)
			}
			for _, n := range []int{1, 7, 4096, 4097, 50000} {
				b, err := e.cli.Alloc(ctx, n)
				if err != nil {
					t.Fatal(err)
				}
				src := make([]byte, n)
				for i := range src {
					src[i] = byte(i * 7)
				}
				b.CopyFrom(src)
				c, err := e.cli.Do(ctx, &Call{Op: OpEcho, Buf: b})
				if err != nil || c.Result != int64(n) {
					t.Fatalf("echo %d: %+v %v", n, c, err)
				}
				c, err = e.cli.Do(ctx, &Call{Op: opXor, Arg: 0x5a, Handle: 42, Buf: b})
				if err != nil || c.Result != int64(n) || c.Aux != 42 {
					t.Fatalf("xor %d: %+v %v", n, c, err)
				}
				got := make([]byte, n)
				b.CopyTo(got)
				for i := range got {
					if got[i] != src[i]^0x5a {
						t.Fatalf("xor %d: byte %d is %#x, want %#x", n, i, got[i], src[i]^0x5a)
					}
				}
				b.Release()
			}
			c, err = e.cli.Do(ctx, &Call{Op: 200})
			if err != nil || !errors.Is(c.Err(), syscall.ENOSYS) {
				t.Fatalf("unknown op: %+v %v", c, err)
			}
		})
	}
}

// fragment leaves the arena with every other block free, so that a buffer
// of more than InlineSegs blocks needs an indirect segment list.
func fragment(t *testing.T, c *Client) (hold []*Buffer) {
	t.Helper()
	ctx := context.Background()
	var all []*Buffer
	for {
		b, err := c.Alloc(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b)
		if c.bsem.n.Load() == 0 {
			break
		}
	}
	for i, b := range all {
		if i%2 == 0 {
			b.Release()
		} else {
			hold = append(hold, b)
		}
	}
	return hold
}

func TestIndirectSegments(t *testing.T) {
	e := newPipe(t, Config{SQEntries: 8, ArenaSize: 256 << 10, BlockSize: 4096}, WaitAdaptive, ClientOptions{})
	hold := fragment(t, e.cli)
	defer func() {
		for _, b := range hold {
			b.Release()
		}
	}()
	n := 20*4096 - 100
	b, err := e.cli.Alloc(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if len(b.segs) <= InlineSegs {
		t.Fatalf("fragmented buffer has only %d segments", len(b.segs))
	}
	src := bytes.Repeat([]byte("weir"), n/4+1)[:n]
	b.CopyFrom(src)
	c, err := e.cli.Do(context.Background(), &Call{Op: opXor, Arg: 1, Buf: b})
	if err != nil || c.Result != int64(n) {
		t.Fatalf("xor over %d segments: %+v %v", len(b.segs), c, err)
	}
	got := make([]byte, n)
	b.CopyTo(got)
	for i := range got {
		if got[i] != src[i]^1 {
			t.Fatalf("byte %d", i)
		}
	}
}

func TestAllocLimits(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{NonBlocking: true})
	ctx := context.Background()
	if _, err := e.cli.Alloc(ctx, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("alloc 0: %v", err)
	}
	if _, err := e.cli.Alloc(ctx, e.cli.MaxBuffer()+1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("alloc over max: %v", err)
	}
	// Fill the arena, then a non-blocking alloc must say so.
	var held []*Buffer
	for {
		b, err := e.cli.Alloc(ctx, 4096)
		if errors.Is(err, ErrWouldBlock) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	if len(held) != int(e.cli.g.ArenaSize/4096) {
		t.Fatalf("held %d blocks of %d", len(held), e.cli.g.ArenaSize/4096)
	}
	held[0].Release()
	b, err := e.cli.Alloc(ctx, 4096)
	if err != nil {
		t.Fatalf("alloc after release: %v", err)
	}
	b.Release()
	for _, b := range held[1:] {
		b.Release()
	}
	if e.cli.bsem.n.Load() != int64(e.cli.g.ArenaSize/4096) {
		t.Fatalf("blocks leaked: %d free", e.cli.bsem.n.Load())
	}
}

func TestAllocBackpressureWaits(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	ctx := context.Background()
	all, err := e.cli.Alloc(ctx, e.cli.MaxBuffer())
	if err != nil {
		t.Fatal(err)
	}
	var rest []*Buffer
	for e.cli.bsem.n.Load() > 0 {
		b, err := e.cli.Alloc(ctx, 4096)
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, b)
	}
	got := make(chan error, 1)
	go func() {
		b, err := e.cli.Alloc(ctx, 8192)
		if err == nil {
			b.Release()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("alloc on a full arena returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	all.Release()
	if err := <-got; err != nil {
		t.Fatalf("waiting alloc: %v", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	big, err := e.cli.Alloc(ctx, e.cli.MaxBuffer())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.Alloc(tctx, e.cli.MaxBuffer()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("alloc past deadline: %v", err)
	}
	big.Release()
	for _, b := range rest {
		b.Release()
	}
}

func TestRequestSlotBackpressure(t *testing.T) {
	cfg := Config{SQEntries: 4, ArenaSize: 64 << 10}
	e := newPipe(t, cfg, WaitAdaptive, ClientOptions{NonBlocking: true})
	ctx := context.Background()
	var wg sync.WaitGroup
	// One request blocks the server; three more queue behind it: all four
	// request slots are in flight.
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.cli.Do(ctx, &Call{Op: opBlock}); err != nil {
				t.Error(err)
			}
		}()
	}
	<-e.h.entered
	for e.cli.wsem.n.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := e.cli.Do(ctx, &Call{Op: OpNop}); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("fifth request: %v, want ErrWouldBlock", err)
	}
	close(e.h.gate)
	wg.Wait()
	if c, err := e.cli.Do(ctx, &Call{Op: OpNop}); err != nil || c.Result != 0 {
		t.Fatalf("after drain: %+v %v", c, err)
	}
}

func TestContextCancelAbandonsAndRecovers(t *testing.T) {
	e := newPipe(t, Config{SQEntries: 2, ArenaSize: 64 << 10}, WaitAdaptive, ClientOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := e.cli.Do(ctx, &Call{Op: opSleep, Arg: 50}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline, got %v", err)
	}
	// The abandoned slot comes back when its completion arrives; both slots
	// are usable again.
	for range 10 {
		if _, err := e.cli.Do(context.Background(), &Call{Op: OpNop}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.cli.wsem.n.Load() != 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := e.cli.wsem.n.Load(); n != 2 {
		t.Fatalf("%d request slots free, want 2", n)
	}
}

// TestRaceAnnotations: the handler writes Go memory with plain stores and the
// caller reads it after Do returns. The only ordering between them is the
// ring's shared-memory atomics, which the race detector cannot see; without
// the annotations in queue.go, `go test -race` reports this.
func TestRaceAnnotations(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				slot := uint64(g)
				c, err := e.cli.Do(context.Background(), &Call{Op: opStore, Handle: slot, Arg: uint32(i)})
				if err != nil || c.Result != 0 {
					t.Error(err)
					return
				}
				if got := e.h.shared[slot]; got != uint64(i) {
					t.Errorf("shared[%d]=%d want %d", slot, got, i)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// runStress runs producers goroutines of ops random requests each
// (stressOne) on e's client and checks that no completion went astray.
func runStress(t *testing.T, e *pipeEnv, seed uint64, producers, ops int) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := newRand(seed, g)
			for i := range ops {
				if err := stressOne(e.cli, rng); err != nil {
					t.Errorf("producer %d op %d: %v", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s := e.cli.Stats.Stray.Load(); s != 0 {
		t.Fatalf("%d stray completions", s)
	}
}

// TestStress: several producers, random sizes and opcodes, each result
// checked byte for byte. Seeded: -seed replays a failure.
func TestStress(t *testing.T) {
	seed := testSeed(t)
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newPipe(t, Config{SQEntries: 32, ArenaSize: 1 << 20, BlockSize: 1024}, mode, ClientOptions{Mode: mode})
			ops := 400
			if testing.Short() {
				ops = 100
			}
			runStress(t, e, seed, 6, ops)
		})
	}
}

// stressOne runs one random request and checks its result: a no-op, or an
// xor served synchronously, asynchronously on another goroutine (after a
// random delay, so completions overtake each other) or asynchronously at
// once.
func stressOne(c *Client, rng *rand.Rand) error {
	ctx := context.Background()
	switch rng.IntN(6) {
	case 0:
		r, err := c.Do(ctx, &Call{Op: OpNop})
		if err != nil || r.Result != 0 {
			return fmt.Errorf("nop: %+v %v", r, err)
		}
		return nil
	case 1:
		h := rng.Uint64()
		r, err := c.Do(ctx, &Call{Op: opAsyncNow, Handle: h})
		if err != nil || r.Result != 0 || r.Aux != h {
			return fmt.Errorf("async now: %+v %v", r, err)
		}
		return nil
	default:
		n := 1 + rng.IntN(c.MaxBuffer())
		if rng.IntN(2) == 0 {
			n = 1 + rng.IntN(8192)
		}
		b, err := c.Alloc(ctx, n)
		if err != nil {
			return err
		}
		defer b.Release()
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		b.CopyFrom(src)
		k := uint32(rng.IntN(255) + 1)
		h := rng.Uint64()
		call := &Call{Op: opXor, Arg: k, Handle: h, Buf: b}
		if rng.IntN(2) == 0 {
			call.Op, call.Offset = opAsyncXor, uint64(rng.IntN(200))
		}
		r, err := c.Do(ctx, call)
		if err != nil || r.Result != int64(n) || r.Aux != h {
			return fmt.Errorf("xor (op %d) %d bytes: %+v %v", call.Op, n, r, err)
		}
		got := make([]byte, n)
		b.CopyTo(got)
		for i := range got {
			if got[i] != src[i]^byte(k) {
				return fmt.Errorf("xor %d bytes: byte %d wrong", n, i)
			}
		}
		return nil
	}
}

// TestServeDoesNotAllocate: a round trip costs no heap allocation on either
// side once warm (GC pressure steals the cores the pollers spin on).
func TestServeDoesNotAllocate(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitBusyPoll, ClientOptions{Mode: WaitBusyPoll})
	ctx := context.Background()
	b, err := e.cli.Alloc(ctx, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	call := &Call{Op: OpEcho, Buf: b}
	for range 100 {
		e.cli.Do(ctx, call)
	}
	if a := testing.AllocsPerRun(1000, func() { e.cli.Do(ctx, call) }); a != 0 {
		t.Fatalf("%.2f allocations per echo round trip", a)
	}
}

// TestIdleServerSleepsLonger: a server poller whose wake-ups find nothing
// sleeps longer each time (up to maxIdleSleep), so that an idle session
// costs its service about a wake-up a second; the client's next request
// still wakes it at once, and so does the client's close.
func TestIdleServerSleepsLonger(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	ctx := context.Background()
	if c, err := e.cli.Do(ctx, &Call{Op: OpNop}); err != nil || c.Result != 0 {
		t.Fatalf("nop: %+v %v", c, err)
	}
	idle := 3 * time.Second
	w0 := e.srv.Stats.Wakeups.Load()
	time.Sleep(idle)
	// At maxSleep every time: idle/maxSleep (60) wake-ups; doubling from
	// it to maxIdleSleep: 6 or so.
	if n := e.srv.Stats.Wakeups.Load() - w0; n > uint64(idle/maxSleep)/4 {
		t.Fatalf("%d wake-ups in %v of an idle session, want at most %d", n, idle, uint64(idle/maxSleep)/4)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.cli.Do(ctx, &Call{Op: OpNop})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // a hang, not a latency bound
		t.Fatal("a request to a long-idle server was not served")
	}
}
