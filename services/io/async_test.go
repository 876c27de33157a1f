package iosvc_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/mem"
)

var seedFlag = flag.Uint64("seed", 0, "seed for randomized tests (0: pick one and log it)")

func testSeed(t *testing.T) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed=%d)", s, s)
	return s
}

// Thirty-two goroutines of one client share one session and one file, each
// writing and reading back its own range with requests of random offsets
// and sizes; every read and, at the end, the whole file is checked byte for
// byte against what each goroutine wrote. Seeded: -seed replays a failure.
func TestOneSessionConcurrentReadsWrites(t *testing.T) {
	seed := testSeed(t)
	e := startIO(t, mem.New(), nil)
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("shared")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const goroutines, span = 32, 64 << 10
	ops := 40
	if testing.Short() {
		ops = 10
	}
	want := make([]byte, goroutines*span) // goroutine g owns want[g*span:(g+1)*span]
	if err := f.Truncate(int64(len(want))); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			mine := want[g*span : (g+1)*span]
			base := int64(g * span)
			for i := range ops {
				off := rng.IntN(span/512) * 512
				n := 1 + rng.IntN(min(span-off, 16<<10))
				if i%2 == 0 {
					p := make([]byte, n)
					for j := range p {
						p[j] = byte(rng.Uint32())
					}
					if m, err := f.WriteAt(p, base+int64(off)); err != nil || m != n {
						t.Errorf("goroutine %d: write %d bytes at %d: %d %v", g, n, off, m, err)
						return
					}
					copy(mine[off:], p)
					continue
				}
				got := make([]byte, n)
				if m, err := f.ReadAt(got, base+int64(off)); err != nil || m != n {
					t.Errorf("goroutine %d: read %d bytes at %d: %d %v", g, n, off, m, err)
					return
				}
				if !bytes.Equal(got, mine[off:off+n]) {
					t.Errorf("goroutine %d: read %d bytes at %d: not what was written", g, n, off)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	got := make([]byte, len(want))
	if n, err := f.ReadAt(got, 0); err != nil || n != len(want) || !bytes.Equal(got, want) {
		t.Fatalf("the file is not what the goroutines wrote: %d bytes read, %v", n, err)
	}
	if w := e.counter(t, "writes"); w < goroutines*uint64(ops)/2 {
		t.Fatalf("%d writes served, want at least %d", w, goroutines*ops/2)
	}
}

// barrierBackend is the mem backend whose blobs, while armed, hold each
// ReadAt and WriteAt until n of them are inside at once. A service that
// serves one request of a session at a time never gets n calls inside: the
// first call then gives up after a while and fails with ETIMEDOUT, and the
// barrier lets later calls through at once.
type barrierBackend struct {
	backend.Backend
	mu     sync.Mutex
	armed  bool          // protected by mu
	n      int           // protected by mu
	inside int           // protected by mu
	met    chan struct{} // closed when n calls were inside together
	broken chan struct{} // closed when a call gave up waiting
}

func (b *barrierBackend) arm(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed, b.n, b.inside = true, n, 0
	b.met, b.broken = make(chan struct{}), make(chan struct{})
}

func (b *barrierBackend) arrive() error {
	b.mu.Lock()
	if !b.armed {
		b.mu.Unlock()
		return nil
	}
	b.inside++
	met, broken := b.met, b.broken
	if b.inside == b.n {
		close(met)
		b.armed = false
	}
	b.mu.Unlock()
	select {
	case <-met:
		return nil
	case <-broken:
	case <-time.After(10 * time.Second):
		b.mu.Lock()
		if b.armed {
			b.armed = false
			close(broken)
		}
		b.mu.Unlock()
	}
	return fmt.Errorf("barrier of %d calls: %w", b.n, syscall.ETIMEDOUT)
}

func (b *barrierBackend) Open(id backend.BlobID) (backend.Blob, error) {
	bl, err := b.Backend.Open(id)
	if err != nil {
		return nil, err
	}
	return barrierBlob{bl, b}, nil
}

type barrierBlob struct {
	backend.Blob
	be *barrierBackend
}

func (c barrierBlob) ReadAt(p []byte, off int64) (int, error) {
	if err := c.be.arrive(); err != nil {
		return 0, err
	}
	return c.Blob.ReadAt(p, off)
}

func (c barrierBlob) WriteAt(p []byte, off int64) (int, error) {
	if err := c.be.arrive(); err != nil {
		return 0, err
	}
	return c.Blob.WriteAt(p, off)
}

// Requests of one session reach the backend together: the backend holds
// each read and write until n of them are inside at once, which only
// happens if the IO service serves n requests of the session concurrently.
// With n = 32 this is queue depth 32 through one ring.
func TestSessionRequestsInFlightTogether(t *testing.T) {
	for _, n := range []int{2, 32} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			be := &barrierBackend{Backend: mem.New()}
			e := startIO(t, be, nil)
			// A request alone (nothing else of the session in flight or
			// queued) is served inline; the first of these may be, and
			// would then wait at the barrier holding the poller.
			iosvc.SetHandOffAlways(e.io, true)
			fsys := e.dial(t)
			defer fsys.Close()
			f, err := fsys.Create("f")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const block = 4096
			want := make([]byte, n*block)
			for i := range want {
				want[i] = byte(i / block)
			}
			if _, err := f.WriteAt(want, 0); err != nil {
				t.Fatal(err)
			}
			be.arm(n)
			// Half of the goroutines read their block, half rewrite theirs.
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					off := int64(i * block)
					if i%2 == 0 {
						got := make([]byte, block)
						if m, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, want[off:off+block]) {
							t.Errorf("read of block %d: %d %v", i, m, err)
						}
						return
					}
					p := bytes.Repeat([]byte{0xf0 | byte(i)}, block)
					if _, err := f.WriteAt(p, off); err != nil {
						t.Errorf("write of block %d: %v", i, err)
						return
					}
					copy(want[off:], p)
				}()
			}
			wg.Wait()
			select {
			case <-be.met:
			default:
				t.Fatalf("%d requests of one session never were at the backend together", n)
			}
			got := make([]byte, len(want))
			if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("file after the concurrent requests: %v, same bytes %v", err, bytes.Equal(got, want))
			}
		})
	}
}

// gateBackend is regBackend (memory registration, checked) whose blobs,
// while armed, hold each WriteAt until released, before the payload check.
type gateBackend struct {
	*regBackend
	mu      sync.Mutex
	armed   bool // protected by mu
	entered chan struct{}
	release chan struct{}
}

func (g *gateBackend) Open(id backend.BlobID) (backend.Blob, error) {
	bl, err := g.regBackend.Open(id)
	if err != nil {
		return nil, err
	}
	return gateBlob{bl, g}, nil
}

type gateBlob struct {
	backend.Blob
	g *gateBackend
}

func (c gateBlob) WriteAt(p []byte, off int64) (int, error) {
	c.g.mu.Lock()
	armed := c.g.armed
	c.g.armed = false
	c.g.mu.Unlock()
	if armed {
		c.g.entered <- struct{}{}
		<-c.g.release
	}
	return c.Blob.WriteAt(p, off)
}

// A session that ends (Shutdown, or the client closes) while a write of
// its is at the backend keeps its region registered and mapped until the
// write is done: the write's payload is still in registered memory when
// the backend moves it, and the region is unregistered after.
func TestSessionEndWaitsForInFlightWrite(t *testing.T) {
	for _, end := range []string{"Shutdown", "client Close"} {
		t.Run(end, func(t *testing.T) {
			be := &gateBackend{regBackend: newRegBackend(false), entered: make(chan struct{}, 1), release: make(chan struct{})}
			e := startIO(t, be, nil)
			fsys := e.dial(t)
			defer fsys.Close()
			f, err := fsys.Create("f")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil {
				t.Fatal(err)
			}
			be.mu.Lock()
			be.armed = true
			be.mu.Unlock()
			go f.WriteAt(bytes.Repeat([]byte{1}, 8192), 0) // its outcome depends on when the session ends
			<-be.entered
			ended := make(chan error, 1)
			go func() {
				if end == "Shutdown" {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					ended <- e.io.Shutdown(ctx)
					return
				}
				ended <- fsys.Close()
			}()
			// Give a service that does not wait time to unregister.
			time.Sleep(50 * time.Millisecond)
			if st := be.state(); len(st.unregistered) != 0 {
				t.Fatal("region unregistered while a write of the session was at the backend")
			}
			if end == "Shutdown" {
				select {
				case err := <-ended:
					t.Fatalf("Shutdown returned (%v) while a write was at the backend", err)
				default:
				}
			}
			close(be.release)
			if end == "client Close" {
				waitUnregistered(t, be.regBackend)
			}
			if err := <-ended; err != nil {
				t.Fatalf("%s: %v", end, err)
			}
			st := be.state()
			if len(st.registered) != 1 || len(st.unregistered) != 1 {
				t.Fatalf("%d registrations, %d unregistrations; want 1 of each", len(st.registered), len(st.unregistered))
			}
			checkNoProblems(t, st)
		})
	}
}

// A request alone is served on the session's poller, with no hand-off: one
// goroutine's reads and writes, one at a time, are all inline; 32 goroutines
// at once hand requests off.
func TestAloneRequestsInline(t *testing.T) {
	e := startIO(t, mem.New(), nil)
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	in0, off0 := e.io.Stats.InlineIO.Load(), e.io.Stats.HandedOffIO.Load()
	for i := range 20 {
		if _, err := f.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if in, off := e.io.Stats.InlineIO.Load()-in0, e.io.Stats.HandedOffIO.Load()-off0; in != 40 || off != 0 {
		t.Fatalf("one request at a time: %d inline, %d handed off; want 40 and 0", in, off)
	}
}
