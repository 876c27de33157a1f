package ring

import (
	"testing"
	"time"
)

// The spinner's budget: a spin that runs out takes a quarter off, down to
// minSpin; one that finds work resets it to maxSpin, so a peer that comes
// back after one late request is waited for in full again.
func TestSpinnerBudget(t *testing.T) {
	var sp spinner
	never := func() bool { return false }
	if sp.spin(func() bool { return true }) != true || sp.budget != maxSpin {
		t.Fatalf("a hit: budget %v, want %v", sp.budget, maxSpin)
	}
	want := maxSpin
	for range 3 {
		if sp.spin(never) {
			t.Fatal("spin reported work that never came")
		}
		want = want * 3 / 4
		if sp.budget != want {
			t.Fatalf("after a miss: budget %v, want %v", sp.budget, want)
		}
	}
	for range 40 {
		sp.budget = max(sp.budget, minSpin) // (each miss spins its budget: keep this short)
		sp.spin(never)
	}
	if sp.budget != minSpin {
		t.Fatalf("after many misses: budget %v, want the floor %v", sp.budget, minSpin)
	}
	if !sp.spin(func() bool { return true }) || sp.budget != maxSpin {
		t.Fatalf("a hit after the floor: budget %v, want %v", sp.budget, maxSpin)
	}
}

// An async completion that answers the last request in flight while the
// poller sleeps wakes it to spin for the client's next request (a
// follow); the session serves that request and every later one as
// before. Whether the next request comes within the spin is timing, so
// only its bound is checked: FollowHits never exceeds Follows.
func TestAsyncCompletionWakesPollerToFollow(t *testing.T) {
	s, h, c, _ := rawSession(t, Config{SQEntries: 8, ArenaSize: 64 << 10, BlockSize: 4096}, WaitAdaptive)
	asleep := func() bool { return s.r.load32(offSQWaiters) != 0 }
	for i := uint64(1); i <= 3; i++ {
		if !c.submit(t, &Descriptor{Opcode: opAsyncPark, ReqID: i}) {
			t.Fatal("SQ full")
		}
		p := h.waitParked(t, 1)[0]
		waitFor(t, "the poller asleep with the request in flight", asleep)
		before := s.Stats.Follows.Load()
		close(p.release)
		var got []Completion
		waitFor(t, "the completion", func() bool { got = append(got, c.reap(t)...); return len(got) == 1 })
		if got[0].ReqID != i {
			t.Fatalf("completion for %d, want %d", got[0].ReqID, i)
		}
		waitFor(t, "the follow counted", func() bool { return s.Stats.Follows.Load() == before+1 })
	}
	// Two in flight: the first completion leaves one, so it wakes no one.
	for i := uint64(10); i < 12; i++ {
		if !c.submit(t, &Descriptor{Opcode: opAsyncPark, ReqID: i}) {
			t.Fatal("SQ full")
		}
	}
	ps := h.waitParked(t, 2)
	waitFor(t, "the poller asleep with two in flight", asleep)
	before := s.Stats.Follows.Load()
	close(ps[0].release)
	waitFor(t, "the first completion", func() bool { return len(c.reap(t)) == 1 })
	time.Sleep(time.Millisecond) // (a wrong follow would be counted by now; a late one fails below)
	if n := s.Stats.Follows.Load(); n != before {
		t.Fatalf("a completion with another request in flight counted a follow (%d, was %d)", n, before)
	}
	close(ps[1].release)
	waitFor(t, "the second completion", func() bool { return len(c.reap(t)) == 1 })
	waitFor(t, "its follow", func() bool { return s.Stats.Follows.Load() == before+1 })
	if hits, n := s.Stats.FollowHits.Load(), s.Stats.Follows.Load(); hits > n {
		t.Fatalf("FollowHits %d > Follows %d", hits, n)
	}
}
