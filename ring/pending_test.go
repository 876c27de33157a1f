package ring

import (
	"context"
	"testing"
)

// TestStartThenDo: a call started and not yet waited for is served before
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
				p, err := e.cli.Start(ctx, &Call{Op: opStore, Arg: uint32(i), Handle: 3})
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
			if _, err := e.cli.Start(ctx, &Call{Op: OpNop, Lazy: true}); err == nil {
				t.Fatal("a lazy call started")
			}
			// Every waiter slot came back: as many calls as slots go
			// through at once.
			var ps []*Pending
			for range smallCfg().SQEntries {
				p, err := e.cli.Start(ctx, &Call{Op: OpNop})
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
