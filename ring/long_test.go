package ring

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Long calls (Call.Long) sleep on the CQ doorbell themselves, several at
// once and beside the reaper's parked quick calls: every one gets its own
// completion, whichever goroutine reaps it, in any completion order; a
// long call whose context ends gives up, and its slot comes back.
func TestLongCalls(t *testing.T) {
	e := newPipe(t, Config{SQEntries: 64, ArenaSize: 1 << 20, BlockSize: 4096}, WaitAdaptive, ClientOptions{})
	const n = 12
	errs := make(chan error, 2*n)
	for i := range n {
		go func() {
			c, err := e.cli.Do(context.Background(), &Call{Op: opAsyncPark, Handle: uint64(i), Long: i%2 == 0})
			if err == nil && c.Aux != uint64(i) {
				err = fmt.Errorf("call %d got the completion of %d", i, c.Aux)
			}
			errs <- err
		}()
	}
	parked := e.h.waitParked(t, n)
	// Let every caller reach its sleep (the long ones on the doorbell,
	// the quick ones parked for the reaper), then complete them in
	// reverse order, one by one.
	waitFor(t, "long callers asleep", func() bool { return e.cli.Stats.LongParked.Load() == n/2 })
	for i := len(parked) - 1; i >= 0; i-- {
		close(parked[i].release)
		time.Sleep(time.Millisecond)
	}
	for range n {
		if err := guard(t, errs, "a call's result"); err != nil {
			t.Fatal(err)
		}
	}

	// A long call whose context ends.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.cli.Do(ctx, &Call{Op: opAsyncPark, Long: true})
		done <- err
	}()
	p := e.h.waitParked(t, 1)[0]
	waitFor(t, "the long caller asleep", func() bool { return e.cli.Stats.LongParked.Load() == n/2+1 })
	cancel()
	if err := guard(t, done, "the cancelled call"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled long call: %v", err)
	}
	close(p.release) // its completion frees the slot
	if _, err := e.cli.Do(context.Background(), &Call{Op: OpNop, Long: true}); err != nil {
		t.Fatalf("a long call after the cancelled one: %v", err)
	}
}

// TestHybridLongWait: once long calls have a median time, a long call
// sleeps for most of it and spins for the rest (sleepLong). Every call
// still gets its own completion, from one caller or several at once,
// with completion times steady or swinging between none and 900 µs.
func TestHybridLongWait(t *testing.T) {
	e := newPipe(t, Config{SQEntries: 64, ArenaSize: 1 << 20, BlockSize: 4096}, WaitAdaptive, ClientOptions{})
	call := func(i int, delay uint64) error {
		c, err := e.cli.Do(context.Background(), &Call{Op: opAsyncXor, Handle: uint64(i), Offset: delay, Long: true})
		if err == nil && c.Aux != uint64(i) {
			err = fmt.Errorf("call %d got the completion of %d", i, c.Aux)
		}
		return err
	}
	for i := range 40 {
		if err := call(i, 900); err != nil {
			t.Fatal(err)
		}
	}
	st := &e.cli.Stats
	if st.LongSpun.Load()+st.LongMissed.Load() == 0 {
		t.Fatalf("40 long calls of 900 µs, and none waited hybrid: %d slept on the doorbell", st.LongParked.Load())
	}
	t.Logf("steady: %d long calls asleep, %d caught spinning, %d missed", st.LongParked.Load(), st.LongSpun.Load(), st.LongMissed.Load())
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			var err error
			for i := 0; i < 50 && err == nil; i++ {
				err = call(g*1000+i, uint64(900*(i%2)))
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := guard(t, errs, "a caller's calls"); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("then: %d asleep, %d caught spinning, %d missed", st.LongParked.Load(), st.LongSpun.Load(), st.LongMissed.Load())
}
