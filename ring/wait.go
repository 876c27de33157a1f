package ring

import (
	"fmt"
	"runtime"
	"time"
)

// WaitMode says how a consumer waits for its queue.
type WaitMode int

const (
	// WaitAdaptive spins for a budget that follows recent arrivals, then
	// sleeps on the queue's futex doorbell. The default.
	WaitAdaptive WaitMode = iota
	// WaitBusyPoll never sleeps: for a service pinned to a dedicated core.
	WaitBusyPoll
)

func (m WaitMode) String() string {
	switch m {
	case WaitAdaptive:
		return "adaptive"
	case WaitBusyPoll:
		return "busy-poll"
	default:
		return fmt.Sprintf("WaitMode(%d)", int(m))
	}
}

// ParseWaitMode reads a mode name as printed by String.
func ParseWaitMode(s string) (WaitMode, error) {
	switch s {
	case "adaptive", "":
		return WaitAdaptive, nil
	case "busy-poll", "busypoll", "poll":
		return WaitBusyPoll, nil
	}
	return 0, fmt.Errorf("ring: unknown wait mode %q (want adaptive or busy-poll)", s)
}

// Spin budget bounds for adaptive waiting, and the longest single sleep:
// a sleeper re-checks the peer's liveness at least this often even if no
// wake-up comes.
const (
	minSpin  = 2 * time.Microsecond
	maxSpin  = 100 * time.Microsecond
	maxSleep = 50 * time.Millisecond
	// maxIdleSleep bounds a server poller's sleep on its doorbell once
	// its wake-ups keep finding nothing (ServerSession.Serve): the
	// client's notify wakes it at once (it announces itself in waiters
	// before it sleeps), and a close, the peer's death or an async
	// completion kick it, so its timeout is only a safety net. Past
	// maxSleep it doubles at each wake-up that finds nothing, so that an
	// idle session costs the service a wake-up a second, not twenty.
	maxIdleSleep = time.Second
)

// doorbell is one direction's wake-up word pair in the header: the consumer
// sets waiters before sleeping on bell; a producer that sees waiters bumps
// bell and wakes it. Both words are peer-writable: a wrong value can only
// cause a spurious wake-up or a sleep cut short by maxSleep.
type doorbell struct {
	r       *Region
	bell    uint64 // header offset of the bell word
	waiters uint64 // header offset of the waiters word
}

// notify wakes the consumer if it announced that it sleeps. Called by a
// producer after publish; the seq-cst atomics order the publish before the
// load of waiters, and the consumer's store of waiters before its re-check.
func (d doorbell) notify() {
	if d.r.load32(d.waiters) != 0 {
		d.r.add32(d.bell, 1)
		d.r.futexWake(d.bell)
	}
}

// kick wakes the consumer unconditionally (local close, peer death). It may
// run on any goroutine, so it holds a reference on the mapping.
func (d doorbell) kick() {
	if !d.r.acquire() {
		return
	}
	defer d.r.release()
	d.r.add32(d.bell, 1)
	d.r.futexWake(d.bell)
}

// sleep blocks until the bell moves or maxSleep passes, unless ready()
// (which must also report close and peer death) is already true.
//
// waiters counts the sleepers (a client's reaper, its long calls and a
// quick call told not to spin may sleep on the CQ doorbell together): a producer wakes them all while it
// is not zero.
func (d doorbell) sleep(ready func() bool) { d.sleepFor(ready, maxSleep) }

// sleepFor is sleep ending after dur (at most maxSleep) at the latest.
func (d doorbell) sleepFor(ready func() bool, dur time.Duration) {
	d.sleepUpTo(ready, min(dur, maxSleep))
}

// sleepUpTo is sleep ending after dur at the latest (a server's idle
// sleep may pass maxSleep: maxIdleSleep).
func (d doorbell) sleepUpTo(ready func() bool, dur time.Duration) {
	v := d.r.load32(d.bell)
	d.r.add32(d.waiters, 1)
	if !ready() {
		d.r.futexWait(d.bell, v, dur)
	}
	d.r.add32(d.waiters, ^uint32(0))
}

// spinner is the adaptive part: a spin that ends with work resets the
// budget to maxSpin; one that runs out takes a quarter off it, down to
// minSpin. A peer whose next request takes a wake-up to come (a client
// woken from its own sleep by the last completion: 50-120 µs on a
// loaded 2-CPU VM) is still caught after an idle gap or two; one that
// goes quiet costs a few µs per request after a dozen misses. (Halving
// on a miss and doubling on a hit collapsed: once both sides slept,
// every request came late, and the budget stayed at its floor.) Owned
// by one goroutine.
type spinner struct {
	budget time.Duration
}

// spin polls ready() until it is true or the budget is spent; it reports
// whether ready() became true.
func (s *spinner) spin(ready func() bool) bool {
	if s.budget == 0 {
		s.budget = maxSpin
	}
	start := time.Now()
	for i := 0; ; i++ {
		if ready() {
			s.budget = maxSpin
			return true
		}
		if i&31 == 31 {
			if time.Since(start) > s.budget {
				s.budget = max(s.budget*3/4, minSpin)
				return false
			}
			runtime.Gosched()
		}
	}
}

// pollPause is one turn of a busy-poll loop: it lets other goroutines of
// this process run, so a busy poller never starves its own peers.
func pollPause(i int) {
	if i&15 == 15 {
		runtime.Gosched()
	}
}
