package ring

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// newLoadAt is a Load whose hint turns on at n requests in flight.
func newLoadAt(n int64) *Load { return &Load{noSpinAt: n, spinLimit: 1} }

// A server session that shares a Load tells its client not to spin while
// the requests in flight across the Load's sessions are at its bound: the
// hint rides on the completions posted meanwhile, the client's waits sleep
// at once (NoSpin), and the hint is gone with the first completion posted
// below the bound. Every request is counted once, whatever answered it.
func TestLoadHintsNoSpin(t *testing.T) {
	l := newLoadAt(2)
	share := func(sc *ServerConn) { sc.ShareLoad(l) }
	a := newPipeSetup(t, Config{SQEntries: 16, ArenaSize: 256 << 10, BlockSize: 4096}, WaitAdaptive, ClientOptions{}, share)
	b := newPipeSetup(t, Config{SQEntries: 16, ArenaSize: 256 << 10, BlockSize: 4096}, WaitAdaptive, ClientOptions{}, share)
	ctx := context.Background()
	if _, err := a.cli.Do(ctx, &Call{Op: OpNop}); err != nil {
		t.Fatal(err)
	}
	if h := a.cli.r.load32(offServerHints); h != 0 {
		t.Fatalf("hints %#x with nothing else in flight", h)
	}
	// Three requests held in b's handler: with a's, four in flight.
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := b.cli.Do(ctx, &Call{Op: opAsyncPark, Handle: uint64(i)})
			errs <- err
		}()
	}
	held := b.h.waitParked(t, 3)
	waitFor(t, "3 requests in flight", func() bool { return l.Pending() == 3 })
	// a's next completion is posted with 3 in flight besides it.
	before := a.cli.Stats.NoSpin.Load()
	if _, err := a.cli.Do(ctx, &Call{Op: OpNop}); err != nil {
		t.Fatal(err)
	}
	if h := a.cli.r.load32(offServerHints); h&HintNoSpin == 0 {
		t.Fatalf("hints %#x with 3 requests of another session in flight, want HintNoSpin", h)
	}
	// The next wait sees the hint: it sleeps at once, on the doorbell
	// itself (no other caller does).
	done := make(chan error, 1)
	go func() {
		_, err := a.cli.Do(ctx, &Call{Op: opAsyncPark, Handle: 99})
		done <- err
	}()
	p := a.h.waitParked(t, 1)[0]
	waitFor(t, "the wait told not to spin", func() bool {
		return a.cli.Stats.NoSpin.Load() > before && a.cli.selfSleepers.Load() == 1
	})
	close(p.release)
	if err := guard(t, done, "the call told not to spin"); err != nil {
		t.Fatal(err)
	}
	for _, p := range held {
		close(p.release)
	}
	for range held {
		if err := guard(t, errs, "a held call"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.cli.Do(ctx, &Call{Op: OpNop}); err != nil {
		t.Fatal(err)
	}
	if h := a.cli.r.load32(offServerHints); h != 0 {
		t.Fatalf("hints %#x once the held requests are answered, want 0", h)
	}
	if got := l.Pending(); got != 0 {
		t.Fatalf("%d requests in flight after every answer, want 0", got)
	}
	// A refused request (an unknown opcode) is answered, and counted out.
	if c, err := a.cli.Do(ctx, &Call{Op: 250}); err != nil || c.Result >= 0 {
		t.Fatalf("unknown opcode: %+v, %v", c, err)
	}
	if got := l.Pending(); got != 0 {
		t.Fatalf("%d requests in flight after a refused one, want 0", got)
	}
}

// Told not to spin, quick calls of many goroutines sleep on the doorbell
// (one caller at a time, the others parked for the reaper) and each gets
// its own completion.
func TestNoSpinCallsUnderLoad(t *testing.T) {
	l := newLoadAt(0) // the hint on every completion
	e := newPipeSetup(t, Config{SQEntries: 64, ArenaSize: 1 << 20, BlockSize: 4096}, WaitAdaptive, ClientOptions{},
		func(sc *ServerConn) { sc.ShareLoad(l) })
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				want := uint64(g<<20 | i)
				c, err := e.cli.Do(ctx, &Call{Op: opAsyncPark, Handle: want, Long: i%5 == 0})
				if err == nil && c.Aux != want {
					err = fmt.Errorf("goroutine %d call %d got the completion of %#x", g, i, c.Aux)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() {
		for p := range e.h.parked {
			close(p.release)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if e.cli.Stats.NoSpin.Load() == 0 {
		t.Fatal("no wait saw HintNoSpin")
	}
	if got := e.cli.selfSleepers.Load(); got != 0 {
		t.Fatalf("%d callers still counted asleep on the doorbell", got)
	}
}

// At most spinLimit sessions of a Load spin at once.
func TestSpinTurnsAreBounded(t *testing.T) {
	l := &Load{spinLimit: 2}
	for range 2 {
		if !l.spinTurn() {
			t.Fatal("a spin turn refused below the bound")
		}
	}
	if l.spinTurn() {
		t.Fatal("a spin turn granted past the bound")
	}
	l.spinDone()
	if !l.spinTurn() {
		t.Fatal("a spin turn refused once another ended")
	}
}
