package ring

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// secondMapping maps r's memfd again, as a hostile peer process would see
// it. Writes through it are invisible to the race detector, as writes from
// another process are.
func secondMapping(t *testing.T, r *Region) *Region {
	t.Helper()
	fd, err := unix.Dup(int(r.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Attach(os.NewFile(uintptr(fd), "hostile"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestHostilePeerScribbles runs two sessions on one handler. On session A a
// hostile peer writes random bytes over the header, the queues and the arena
// while A's client submits requests; session B is an honest client doing
// checked work throughout. The server must not panic or hang, B must see
// every request served correctly, and A must end as damaged once its header
// is hit.
func TestHostilePeerScribbles(t *testing.T) {
	seed := testSeed(t)
	h := newTestHandler()
	close(h.gate) // a forged opBlock or opAsyncPark must not hang the session
	cfg := Config{SQEntries: 16, ArenaSize: 64 << 10, BlockSize: 1024}
	srvA, cliA, err := Pipe(cfg, h, WaitAdaptive, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cliA.Close()
	defer srvA.Close()
	b := newPipe(t, cfg, WaitAdaptive, ClientOptions{})

	serveA := make(chan error, 1)
	go func() { serveA <- srvA.Serve() }()
	evil := secondMapping(t, srvA.Region())
	g := evil.Geometry()

	var stop atomic.Bool
	var wg sync.WaitGroup
	// The victim client of A keeps submitting; any outcome but a panic or
	// a hang is fine for it.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := newRand(seed, 100)
		for !stop.Load() && cliA.Err() == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			if buf, err := cliA.Alloc(ctx, 1+rng.IntN(4000)); err == nil {
				op := uint8(opXor)
				if rng.IntN(2) == 0 {
					op = opAsyncXor // completed by another goroutine
				}
				cliA.Do(ctx, &Call{Op: op, Arg: 7, Buf: buf})
				// Only release when nothing can still be in flight with it.
				if cliA.Err() == nil {
					buf.Release()
				}
			}
			cancel()
		}
	}()
	// The honest session B checks every byte.
	bErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := newRand(seed, 200)
		for !stop.Load() {
			if err := stressOne(b.cli, rng); err != nil {
				bErr <- err
				return
			}
		}
	}()
	// Phase 1: forged descriptors. The scribbler writes random descriptor
	// bodies into the slot the server reads next and marks them ready, and
	// random bytes into the arena. Every forged request must be answered
	// (served or rejected) and the session must stay up.
	rng := newRand(seed, 300)
	evilCQ := newCQ(evil) // the scribbler takes completions too, so A's server keeps reading
	deadline := time.Now().Add(150 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		for {
			pos, off, ok, err := evilCQ.claimConsume()
			if !ok || err != nil {
				if err != nil {
					evilCQ.pos.Add(1)
				}
				break
			}
			evilCQ.recycle(pos, off)
		}
		if rng.IntN(2) == 0 {
			evil.mem[g.ArenaOffset+rng.Uint64N(g.ArenaSize)] = byte(rng.Uint32())
			continue
		}
		pos := srvA.sq.pos.Load()
		off := g.SQOffset + (pos&uint64(g.SQEntries-1))*SQSlotSize
		for j := uint64(8); j < SQSlotSize; j++ {
			evil.mem[off+j] = byte(rng.Uint32())
		}
		switch rng.IntN(3) {
		case 0:
			evil.mem[off+sqOffOpcode] = byte(rng.IntN(4))
			evil.mem[off+sqOffFlags] = byte(rng.IntN(2))
		case 1:
			evil.mem[off+sqOffNSeg] = byte(rng.IntN(12))
			evil.mem[off+sqOffNSeg+1] = 0
		}
		evil.store64(off, pos+1)
		evil.add32(offSQBell, 1)
		evil.futexWake(offSQBell)
		if i%16 == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	select {
	case err := <-serveA:
		t.Fatalf("session A ended during forged descriptors: %v", err)
	default:
	}
	if srvA.Stats.Rejected.Load() == 0 {
		t.Fatal("no forged descriptor was rejected: the scribbler did not reach validation")
	}
	// Phase 2: random bytes anywhere in the queues, the doorbell words and
	// the arena. The session may be torn down at any point (a sequence word
	// from the future is damage); it must never panic or hang.
	deadline = time.Now().Add(150 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		switch rng.IntN(3) {
		case 0:
			evil.mem[g.SQOffset+rng.Uint64N(uint64(g.SQEntries)*SQSlotSize)] = byte(rng.Uint32())
		case 1:
			evil.mem[g.CQOffset+rng.Uint64N(uint64(g.CQEntries)*CQSlotSize)] = byte(rng.Uint32())
		case 2:
			if rng.IntN(8) == 0 {
				evil.mem[offSQBell+rng.Uint64N(offServerState-offSQBell)] = byte(rng.Uint32())
			} else {
				evil.mem[g.ArenaOffset+rng.Uint64N(g.ArenaSize)] = byte(rng.Uint32())
			}
		}
		if i%64 == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	// Now hit the immutable header: the server must notice and tear A down.
	evil.mem[offArenaSize+3] ^= 0x40
	err = guard(t, serveA, "Serve of the scribbled session")
	stop.Store(true)
	wg.Wait()
	if !errors.Is(err, ErrDamaged) {
		t.Fatalf("session A ended with %v, want damaged", err)
	}
	t.Logf("session A: %v; requests %d, rejected %d; B served %d calls",
		err, srvA.Stats.Requests.Load(), srvA.Stats.Rejected.Load(), b.cli.Stats.Calls.Load())
	select {
	case err := <-bErr:
		t.Fatalf("honest session B: %v", err)
	default:
	}
	if b.cli.Stats.Calls.Load() == 0 {
		t.Fatal("session B made no calls")
	}
	// B still works after A's teardown.
	rng2 := newRand(seed, 400)
	for range 20 {
		if err := stressOne(b.cli, rng2); err != nil {
			t.Fatalf("B after A's teardown: %v", err)
		}
	}
	// A's client learns the session is over.
	if _, err := cliA.Do(context.Background(), &Call{Op: OpNop}); err == nil {
		t.Fatal("damaged session still answers")
	}
}

// TestHeaderScribbleDamagesSession flips one bit in each field of the
// immutable header of an idle session. The server must end that session as
// damaged with "header changed", its client must learn the session is
// gone, and a second session on the same handler must go on working.
func TestHeaderScribbleDamagesSession(t *testing.T) {
	fields := []struct {
		name string
		off  uint64
	}{
		{"magic", offMagic}, {"version", offVersion}, {"header size", offHeaderSize},
		{"features", offFeatures}, {"sq entries", offSQEntries}, {"cq entries", offCQEntries},
		{"sq slot size", offSQSlotSize}, {"cq slot size", offCQSlotSize},
		{"block size", offBlockSize}, {"max segments", offMaxSegments},
		{"sq offset", offSQOffset}, {"cq offset", offCQOffset},
		{"arena offset", offArenaOffset}, {"arena size", offArenaSize}, {"total size", offTotalSize},
	}
	other := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	for _, f := range fields {
		t.Run(f.name, func(t *testing.T) {
			e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
			if _, err := e.cli.Do(context.Background(), &Call{Op: OpNop}); err != nil {
				t.Fatal(err)
			}
			evil := secondMapping(t, e.srv.Region())
			evil.mem[f.off+1] ^= 0x10
			evil.add32(offSQBell, 1) // wake the server so that it looks
			evil.futexWake(offSQBell)
			err := guard(t, e.serveCh, "Serve after a header scribble")
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "header changed") {
				t.Fatalf("Serve: %v, want ErrDamaged (header changed)", err)
			}
			if _, err := e.cli.Do(context.Background(), &Call{Op: OpNop}); err == nil {
				t.Fatal("Do on a damaged session succeeded")
			}
			if r, err := other.cli.Do(context.Background(), &Call{Op: OpNop}); err != nil || r.Result != 0 {
				t.Fatalf("the other session after the scribble: %+v %v", r, err)
			}
		})
	}
}
