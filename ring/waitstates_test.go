package ring

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Shutdown while a caller waits, for every place a client caller can wait
// other than for its own completion (TestServerCloseWakesParkedClient and
// TestClientCloseWhileRequestInFlight cover that one): for arena blocks,
// for a request slot, for a free SQ slot. Each ends in two ways: the client
// closes (the caller gets ErrClosed) or the peer goes away (ErrPeerGone).
// No ending may leave the caller waiting.

// waitState puts one caller into a wait and returns its result channel,
// the client, and how to make its peer go away.
type waitState func(t *testing.T) (c *Client, peerGone func(), blocked <-chan error)

// pipeWait is a pipe whose server "goes away" by closing its socket, as a
// dying server process does.
func pipeWait(t *testing.T, cfg Config) *pipeEnv {
	e := newPipe(t, cfg, WaitAdaptive, ClientOptions{})
	if _, err := e.cli.Do(context.Background(), &Call{Op: OpNop}); err != nil {
		t.Fatal(err)
	}
	return e
}

func serverGone(e *pipeEnv) func() {
	// ServerConn.Close closes the socket first, then waits for the
	// handlers in flight (released by the test's cleanup): run it aside.
	return func() { go e.srv.Close() }
}

var waitStates = map[string]waitState{
	"arena full": func(t *testing.T) (*Client, func(), <-chan error) {
		e := pipeWait(t, Config{SQEntries: 4, ArenaSize: 64 << 10, BlockSize: 4096})
		for {
			b, err := e.cli.Alloc(context.Background(), 4096)
			if err != nil {
				t.Fatal(err)
			}
			if e.cli.bsem.n.Load() == 0 {
				t.Cleanup(b.Release)
				break
			}
			t.Cleanup(b.Release)
		}
		ch := make(chan error, 1)
		go func() { _, err := e.cli.Alloc(context.Background(), 4096); ch <- err }()
		return e.cli, serverGone(e), ch
	},
	"no request slot": func(t *testing.T) (*Client, func(), <-chan error) {
		e := pipeWait(t, Config{SQEntries: 2, ArenaSize: 64 << 10})
		for range 2 {
			go e.cli.Do(context.Background(), &Call{Op: opBlock})
		}
		<-e.h.entered
		for e.cli.wsem.n.Load() != 0 {
			time.Sleep(time.Millisecond)
		}
		ch := make(chan error, 1)
		go func() { _, err := e.cli.Do(context.Background(), &Call{Op: OpNop}); ch <- err }()
		return e.cli, serverGone(e), ch
	},
	"submission queue full": func(t *testing.T) (*Client, func(), <-chan error) {
		// No server: a hostile mapping makes slot 0 look taken, as a
		// server that stopped taking requests leaves it.
		c, _ := sqFullClient(t, ClientOptions{})
		ch := make(chan error, 1)
		go func() { _, err := c.Do(context.Background(), &Call{Op: OpNop}); ch <- err }()
		return c, c.PeerGone, ch
	},
}

// sqFullClient is a client on a region no server serves, whose first SQ slot
// carries the sequence of a slot published a lap ago and never taken.
func sqFullClient(t *testing.T, opts ClientOptions) (*Client, *Region) {
	t.Helper()
	r, err := Create(Config{SQEntries: 4, ArenaSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	evil := secondMapping(t, r)
	evil.store64(evil.sqSlot(0), ^uint64(2)) // pos 0 - entries + 1 = -3
	c := NewClient(r, opts)
	t.Cleanup(func() { c.Close() })
	return c, evil
}

func TestShutdownWhileWaiting(t *testing.T) {
	endings := []struct {
		name string
		end  func(c *Client, peerGone func())
		want error
	}{
		{"client closes", func(c *Client, _ func()) { c.Close() }, ErrClosed},
		{"peer goes away", func(_ *Client, peerGone func()) { peerGone() }, ErrPeerGone},
	}
	for name, state := range waitStates {
		for _, ending := range endings {
			t.Run(name+"/"+ending.name, func(t *testing.T) {
				c, peerGone, blocked := state(t)
				select {
				case err := <-blocked:
					t.Fatalf("the caller did not wait: %v", err)
				case <-time.After(20 * time.Millisecond):
				}
				ending.end(c, peerGone)
				if err := guard(t, blocked, "the waiting caller"); !errors.Is(err, ending.want) {
					t.Fatalf("got %v, want %v", err, ending.want)
				}
			})
		}
	}
}

// TestSubmissionQueueFull: a caller facing a full SQ waits (blocking mode:
// until its context ends) or returns ErrWouldBlock (non-blocking mode); in
// neither case is the request dropped or sent another way, and the waiter
// slot it held is free again afterwards.
func TestSubmissionQueueFull(t *testing.T) {
	t.Run("blocking", func(t *testing.T) {
		c, _ := sqFullClient(t, ClientOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := c.Do(ctx, &Call{Op: OpNop}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do: %v, want context.DeadlineExceeded", err)
		}
		if n := c.wsem.n.Load(); n != 4 {
			t.Fatalf("%d request slots free after the failed call, want 4", n)
		}
	})
	t.Run("non-blocking", func(t *testing.T) {
		c, _ := sqFullClient(t, ClientOptions{NonBlocking: true})
		done := make(chan error, 1)
		go func() { _, err := c.Do(context.Background(), &Call{Op: OpNop}); done <- err }()
		if err := guard(t, done, "non-blocking Do on a full SQ"); !errors.Is(err, ErrWouldBlock) {
			t.Fatalf("Do: %v, want ErrWouldBlock", err)
		}
		if n := c.wsem.n.Load(); n != 4 {
			t.Fatalf("%d request slots free after the failed call, want 4", n)
		}
		if got := c.Stats.Calls.Load(); got != 1 {
			t.Fatalf("Calls = %d", got)
		}
	})
}

// TestBacklog: a raw client submits more requests than the CQ holds and
// does not take completions. The server must keep the overflow in its
// backlog (bounded: it stops taking requests), then deliver every
// completion exactly once when the client starts taking them; and a client
// that dies with a backlog pending must end the session, not hang it.
func TestBacklog(t *testing.T) {
	for _, ending := range []string{"client reaps", "client dies"} {
		t.Run(ending, func(t *testing.T) {
			r, err := Create(Config{SQEntries: 4, CQEntries: 4, ArenaSize: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			s := NewServerSession(r, newTestHandler(), WaitAdaptive)
			defer s.Close()
			served := make(chan error, 1)
			go func() { served <- s.Serve() }()
			raw := secondMapping(t, r)
			sq, cq := newSQ(raw), newCQ(raw)
			bell := doorbell{r: raw, bell: offSQBell, waiters: offSQWaiters}
			submitted := 0
			submit := func() bool {
				pos, off, ok, err := sq.claimProduce()
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					return false
				}
				encodeDescriptor(raw.mem[off:off+SQSlotSize], &Descriptor{Opcode: OpNop, ReqID: uint64(submitted)})
				sq.publish(pos, off)
				bell.notify()
				submitted++
				return true
			}
			// Submit until the server stops taking requests: the CQ (4)
			// and the backlog are full and the SQ (4) fills up.
			for idle := 0; idle < 50; {
				if submit() {
					idle = 0
				} else {
					idle++
					time.Sleep(time.Millisecond)
				}
			}
			if s.Stats.Backlog.Load() == 0 {
				t.Fatalf("%d requests submitted and none went to the backlog", submitted)
			}
			if submitted > 4+4+4+1 {
				t.Fatalf("the server took %d requests with nobody taking completions: its backlog is not bounded", submitted)
			}
			if ending == "client dies" {
				raw.store32(offClientState, StateClosed)
				s.PeerGone()
				if err := guard(t, served, "Serve with a backlog and a dead client"); !errors.Is(err, ErrPeerGone) {
					t.Fatalf("Serve: %v, want ErrPeerGone", err)
				}
				return
			}
			// Now take completions, and go on submitting 100 more requests
			// through the freed room, until every one has come back.
			t.Logf("%d requests taken before the client took any completion; %d went to the backlog",
				submitted, s.Stats.Backlog.Load())
			total := submitted + 100
			seen := make(map[uint64]int)
			for n := 0; n < total; {
				pos, off, ok, err := cq.claimConsume()
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					comp := decodeCompletion(raw.mem[off : off+CQSlotSize])
					cq.recycle(pos, off)
					seen[comp.ReqID]++
					n++
					if comp.Result != 0 {
						t.Fatalf("completion %d: result %d", comp.ReqID, comp.Result)
					}
					continue
				}
				for submitted < total && submit() {
				}
				time.Sleep(10 * time.Microsecond)
			}
			for id := range uint64(submitted) {
				if seen[id] != 1 {
					t.Fatalf("request %d completed %d times (submitted %d)", id, seen[id], submitted)
				}
			}
			if len(seen) != submitted {
				t.Fatalf("%d completions for %d requests", len(seen), submitted)
			}
		})
	}
}

// TestCloseWithUnreapedCompletions: a busy-poll client (no reaper) abandons
// a call; its completion lands in the CQ and nobody takes it. Closing the
// client must not hang, the server must see the client go, and a call that
// is still parked in the backlog must not keep it from ending.
func TestCloseWithUnreapedCompletions(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitBusyPoll, ClientOptions{Mode: WaitBusyPoll})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	if _, err := e.cli.Do(ctx, &Call{Op: opSleep, Arg: 20}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do: %v", err)
	}
	time.Sleep(40 * time.Millisecond) // the completion is now in the CQ
	if !e.cli.cq.ready() {
		t.Fatal("no completion waiting in the CQ")
	}
	closed := make(chan error, 1)
	go func() { closed <- e.cli.Close() }()
	if err := guard(t, closed, "Close"); err != nil {
		t.Fatal(err)
	}
	if err := guard(t, e.serveCh, "Serve after the client closed"); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("Serve: %v, want ErrPeerGone", err)
	}
}
