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
