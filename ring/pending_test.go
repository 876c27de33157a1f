package ring

import (
	"context"
	"testing"
	"time"
)

// TestStartThenDo: a call begun and not yet waited for is served before
// a call submitted after it (the server takes a session's queue in order
// and a synchronous handler ends before the next request starts), so a
// client can put a request and the one that depends on it on the ring
// together and wait once; each Pending is waited for once.
func TestStartThenDo(t *testing.T) {
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newPipe(t, smallCfg(), mode, ClientOptions{Mode: mode})
			ctx := context.Background()
			for i := 1; i <= 500; i++ {
				p, err := e.cli.begin(ctx, &Call{Op: opStore, Arg: uint32(i), Handle: 3}, true)
				if err != nil {
					t.Fatal(err)
				}
				c, err := e.cli.Do(ctx, &Call{Op: opAsyncLoad, Handle: 3})
				if err != nil || c.Result != int64(i) {
					t.Fatalf("load after store %d started: %+v %v", i, c, err)
				}
				if c, err := p.Wait(ctx); err != nil || c.Result != 0 {
					t.Fatalf("store %d: %+v %v", i, c, err)
				}
				if _, err := p.Wait(ctx); err == nil {
					t.Fatal("a pending call waited for twice")
				}
			}
			if _, err := e.cli.begin(ctx, &Call{Op: OpNop, Lazy: true}, true); err == nil {
				t.Fatal("a lazy call started")
			}
			// Every waiter slot came back: as many calls as slots go
			// through at once.
			var ps []*Pending
			for range smallCfg().SQEntries {
				p, err := e.cli.begin(ctx, &Call{Op: OpNop}, true)
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, p)
			}
			for _, p := range ps {
				if c, err := p.Wait(ctx); err != nil || c.Result != 0 {
					t.Fatalf("nop: %+v %v", c, err)
				}
			}
		})
	}
}

// TestStartAside: one call at a time stands aside, only where its slot
// and buffer leave room for a call of any size beside them, and it never
// waits for either; with it outstanding a MaxBuffer call still goes
// through, and Wait gives back what it held.
func TestStartAside(t *testing.T) {
	ctx := context.Background()
	// 4 MiB of 4 KiB blocks: a buffer holds at most 512 (one indirect
	// table's worth), far from the arena's 1,024.
	e := newPipe(t, Config{SQEntries: 16, ArenaSize: 4 << 20, BlockSize: 4096}, WaitAdaptive, ClientOptions{})
	payload := []byte("a capability, say")
	for round := range 3 {
		p, ok, err := e.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload)
		if err != nil || !ok {
			t.Fatalf("round %d: StartAside = %v, %v", round, ok, err)
		}
		if _, ok, err := e.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload); ok || err != nil {
			t.Fatalf("a second call aside: %v, %v", ok, err)
		}
		echoMaxBuffer(t, e.cli)
		if c, err := p.Wait(ctx); err != nil || c.Result != int64(len(payload)) {
			t.Fatalf("the aside call: %+v %v", c, err)
		}
	}
	// An arena a MaxBuffer call fills whole (64 blocks: 63 and their
	// table): nothing may stand aside.
	tight := smallCfg()
	et := newPipe(t, tight, WaitAdaptive, ClientOptions{})
	if _, ok, err := et.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload); ok || err != nil {
		t.Fatalf("aside in an arena without room: %v, %v", ok, err)
	}
	// A call without a payload takes no arena: it may, and a MaxBuffer
	// call still goes through beside it.
	if p, ok, err := et.cli.StartAside(ctx, OpEcho, 0, 0, 0, nil); !ok || err != nil {
		t.Fatalf("aside without a payload: %v, %v", ok, err)
	} else {
		echoMaxBuffer(t, et.cli)
		if c, err := p.Wait(ctx); err != nil || c.Result != 0 {
			t.Fatalf("the payload-less aside call: %+v %v", c, err)
		}
	}
	// A queue of two slots: never aside (a lazy call could take the
	// other, and the caller's next call would wait for ever).
	pair := newPipe(t, Config{SQEntries: 2, ArenaSize: 4 << 20, BlockSize: 4096}, WaitAdaptive, ClientOptions{})
	if _, ok, err := pair.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload); ok || err != nil {
		t.Fatalf("aside on a 2-slot queue: %v, %v", ok, err)
	}
	// No free slot: not aside, and no wait.
	two := newPipe(t, Config{SQEntries: 4, ArenaSize: 4 << 20, BlockSize: 4096}, WaitAdaptive, ClientOptions{})
	var held []*Pending
	for range 4 {
		p, err := two.cli.begin(ctx, &Call{Op: opBlock}, true)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if _, ok, err := two.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload); ok || err != nil {
		t.Fatalf("aside with no free slot: %v, %v", ok, err)
	}
	close(two.h.gate)
	for _, p := range held {
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p, ok, err := two.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload); !ok || err != nil {
		t.Fatalf("aside once the slots are free: %v, %v", ok, err)
	} else if c, err := p.Wait(ctx); err != nil || c.Result != int64(len(payload)) {
		t.Fatalf("the aside call: %+v %v", c, err)
	}
	// Two lazy calls outstanding on four slots: the aside call and a
	// third lazy call would leave the caller's next call none.
	lz := newPipe(t, Config{SQEntries: 4, ArenaSize: 4 << 20, BlockSize: 4096}, WaitAdaptive, ClientOptions{})
	lazyDone := make(chan error, 2)
	var parked []*parkedReq
	for range 2 {
		go func() {
			_, err := lz.cli.Do(ctx, &Call{Op: opAsyncPark, Lazy: true})
			lazyDone <- err
		}()
		parked = append(parked, <-lz.h.parked)
	}
	if _, ok, err := lz.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload); ok || err != nil {
		t.Fatalf("aside beside two lazy calls on 4 slots: %v, %v", ok, err)
	}
	for _, p := range parked {
		close(p.release)
	}
	for n := 0; n < 2; {
		// Lazy completions go to whoever reaps the queue next.
		lz.cli.Poll()
		select {
		case err := <-lazyDone:
			if err != nil {
				t.Fatal(err)
			}
			n++
		case <-time.After(time.Millisecond):
		}
	}
	if p, ok, err := lz.cli.StartAside(ctx, OpEcho, 0, 0, 0, payload); !ok || err != nil {
		t.Fatalf("aside once the lazy call is done: %v, %v", ok, err)
	} else if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// echoMaxBuffer makes a call with a buffer of MaxBuffer, which must go
// through beside a call left aside.
func echoMaxBuffer(t *testing.T, cli *Client) {
	t.Helper()
	ctx := context.Background()
	b, err := cli.Alloc(ctx, cli.MaxBuffer())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if c, err := cli.Do(ctx, &Call{Op: OpEcho, Buf: b}); err != nil || c.Result != int64(b.Len()) {
		t.Fatalf("a MaxBuffer call beside the aside one: %+v %v", c, err)
	}
}
