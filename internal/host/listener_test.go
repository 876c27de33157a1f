package host

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/ring"
)

// mapped reports whether all of mem is still mapped in this process and
// still starts with a ring header: msync fails with ENOMEM on a range with
// unmapped pages, where reading would fault.
func mapped(mem []byte) error {
	if err := unix.Msync(mem, unix.MS_ASYNC); err != nil {
		return fmt.Errorf("msync of the region: %w", err)
	}
	if m := binary.LittleEndian.Uint64(mem); m != ring.Magic {
		return fmt.Errorf("region starts with %#x, not the ring magic", m)
	}
	return nil
}

// recSession records what the server calls, in order.
type recSession struct {
	mux    *ring.Mux
	mu     sync.Mutex
	events []string
	mem    []byte // the region, from Started
	ended  chan error
}

func (s *recSession) log(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *recSession) Handler() ring.Handler { return s.mux }

func (s *recSession) Started(sc *ring.ServerConn) error {
	s.mem = sc.Region().Bytes()
	s.log("started")
	return nil
}

func (s *recSession) Drained(sc *ring.ServerConn) {
	// Give anything that would unmap the region behind the session's back
	// (a Shutdown that closed rather than stopped it) time to do so. A
	// correct server cannot fail for it.
	time.Sleep(20 * time.Millisecond)
	if err := mapped(s.mem); err != nil {
		s.log("drained: " + err.Error())
		return
	}
	s.log("drained")
}

func (s *recSession) Ended(err error) {
	s.log("ended")
	s.ended <- err
}

func (s *recSession) history() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

// startServer runs a Listener whose sessions are recSessions, handed out on
// the returned channel as they are made.
func startServer(t *testing.T) (*Listener, <-chan *recSession, *atomic.Int32) {
	t.Helper()
	return startServerWith(t, Limits{})
}

// startServerWith is startServer with limits.
func startServerWith(t *testing.T, limits Limits) (*Listener, <-chan *recSession, *atomic.Int32) {
	t.Helper()
	dir, err := os.MkdirTemp("", "ringsrv-") // socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sessions := make(chan *recSession, 64)
	var regions atomic.Int32 // NewRegion calls
	srv := &Listener{
		Socket: filepath.Join(dir, "s.sock"),
		Ring:   ring.Config{SQEntries: 16, ArenaSize: 256 << 10, BlockSize: 4096},
		Mode:   ring.WaitAdaptive,
		Log:    hclog.NewNullLogger(),
		New: func() Session {
			s := &recSession{mux: ring.NewMux(), ended: make(chan error, 1)}
			sessions <- s
			return s
		},
		NewRegion: func(cfg ring.Config) (*ring.Region, error) {
			regions.Add(1)
			return ring.Create(cfg)
		},
		Limits: limits,
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv, sessions, &regions
}

func dialNop(t *testing.T, srv *Listener) *ring.Client {
	t.Helper()
	c, err := ring.Dial(context.Background(), srv.Socket, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cp, err := c.Do(context.Background(), &ring.Call{Op: ring.OpNop}); err != nil || cp.Result != 0 {
		c.Close()
		t.Fatalf("nop: %+v %v", cp, err)
	}
	return c
}

func waitEnded(t *testing.T, s *recSession) error {
	t.Helper()
	select {
	case err := <-s.ended:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("session did not end; calls so far: %v", s.history())
		return nil
	}
}

func checkHistory(t *testing.T, s *recSession) {
	t.Helper()
	want := []string{"started", "drained", "ended"}
	got := s.history()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("session calls %q, want %q", got, want)
	}
}

// Drained runs after the last request and before the region is unmapped,
// whether the client goes or the server shuts down.
func TestDrainedBeforeUnmap(t *testing.T) {
	t.Run("client closes", func(t *testing.T) {
		srv, sessions, regions := startServer(t)
		c := dialNop(t, srv)
		s := <-sessions
		c.Close()
		if err := waitEnded(t, s); !errors.Is(err, ring.ErrPeerGone) {
			t.Fatalf("Ended(%v), want ErrPeerGone", err)
		}
		checkHistory(t, s)
		if n := regions.Load(); n != 1 {
			t.Fatalf("NewRegion called %d times, want 1", n)
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		srv, sessions, _ := startServer(t)
		c := dialNop(t, srv)
		defer c.Close()
		s := <-sessions
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Shutdown returns once every session has ended.
		select {
		case err := <-s.ended:
			if err != nil {
				t.Fatalf("Ended(%v), want nil after Shutdown", err)
			}
		default:
			t.Fatalf("Shutdown returned before the session ended; calls: %v", s.history())
		}
		checkHistory(t, s)
	})
}

// Err is nil exactly while clients can reach the listener.
func TestServerErr(t *testing.T) {
	if err := (&Listener{}).Err(); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Errorf("Err before Start = %v", err)
	}
	srv, _, _ := startServer(t)
	if err := srv.Err(); err != nil {
		t.Fatalf("Err while serving = %v", err)
	}
	// Another process removed the socket: nobody can connect any more.
	if err := os.Remove(srv.Socket); err != nil {
		t.Fatal(err)
	}
	if err := srv.Err(); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("Err without the socket file = %v", err)
	}
	// Something else took the path.
	if err := os.WriteFile(srv.Socket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Err(); err == nil || !strings.Contains(err.Error(), "no longer its socket") {
		t.Errorf("Err with another file at the socket path = %v", err)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Err(); err == nil || !strings.Contains(err.Error(), "shut down") {
		t.Errorf("Err after Shutdown = %v", err)
	}
}

// idleConn connects to srv and never acks its hello: a pending handshake
// until the listener drops it.
func idleConn(t *testing.T, srv *Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialErr dials srv through the ring's handshake and returns its error
// (closing the session if there is none).
func dialErr(srv *Listener) error {
	c, err := ring.Dial(context.Background(), srv.Socket, ring.ClientOptions{})
	if err == nil {
		c.Close()
	}
	return err
}

// waitFor polls cond (every 5 ms, for at most 10 s: a bound on a hang,
// not on the time it takes) and fails the test if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
	}
}

// TestLimits: past a uid's pending handshakes a connection is refused
// with EAGAIN, past its sessions with EUSERS (the client's handshake says
// so), each counted; a handshake never acked is dropped at the deadline;
// an exempt uid is never refused.
func TestLimits(t *testing.T) {
	uid := uint32(os.Geteuid())
	t.Run("handshakes per uid", func(t *testing.T) {
		srv, _, regions := startServerWith(t, Limits{HandshakesPerUID: 2, HandshakeTimeout: 200 * time.Millisecond})
		idleConn(t, srv)
		idleConn(t, srv)
		waitFor(t, "two pending handshakes", func() bool { p, _ := srv.Pending(); return p == 2 })
		if err := dialErr(srv); !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("a third handshake of the uid: %v, want EAGAIN", err)
		}
		if n := srv.RefusedHandshakes.Load(); n != 1 {
			t.Fatalf("limits_refused_handshakes = %d, want 1", n)
		}
		if n := regions.Load(); n != 2 {
			t.Fatalf("%d regions made, want 2: a refused connection costs none", n)
		}
		waitFor(t, "idle handshakes dropped at their deadline", func() bool { p, n := srv.Pending(); return p == 0 && n == 0 })
		if n := srv.HandshakeTimeouts.Load(); n != 2 {
			t.Fatalf("handshakes_timed_out = %d, want 2", n)
		}
		if err := dialErr(srv); err != nil {
			t.Fatalf("a handshake once the idle ones were dropped: %v", err)
		}
	})
	t.Run("handshakes in all", func(t *testing.T) {
		srv, _, _ := startServerWith(t, Limits{Handshakes: 1})
		idleConn(t, srv)
		waitFor(t, "one pending handshake", func() bool { p, _ := srv.Pending(); return p == 1 })
		if err := dialErr(srv); !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("a second handshake: %v, want EAGAIN", err)
		}
	})
	t.Run("sessions per uid", func(t *testing.T) {
		srv, sessions, _ := startServerWith(t, Limits{SessionsPerUID: 3})
		var cs []*ring.Client
		for range 3 {
			cs = append(cs, dialNop(t, srv))
		}
		err := dialErr(srv)
		var re *ring.RefusedError
		if !errors.Is(err, unix.EUSERS) || !errors.As(err, &re) {
			t.Fatalf("a fourth session of the uid: %v, want the refusal EUSERS", err)
		}
		if n := srv.RefusedSessions.Load(); n != 1 {
			t.Fatalf("limits_refused_sessions = %d, want 1", n)
		}
		cs[0].Close()
		waitEnded(t, <-sessions)
		waitFor(t, "the closed session uncounted", func() bool { _, n := srv.Pending(); return n == 2 })
		c := dialNop(t, srv)
		c.Close()
		for _, c := range cs[1:] {
			c.Close()
		}
	})
	t.Run("sessions in all", func(t *testing.T) {
		srv, _, _ := startServerWith(t, Limits{Sessions: 1})
		c := dialNop(t, srv)
		defer c.Close()
		if err := dialErr(srv); !errors.Is(err, unix.EUSERS) {
			t.Fatalf("a second session: %v, want EUSERS", err)
		}
	})
	t.Run("exempt", func(t *testing.T) {
		srv, _, _ := startServerWith(t, Limits{HandshakesPerUID: 1, SessionsPerUID: 1, Exempt: []uint32{uid}})
		idleConn(t, srv)
		c := dialNop(t, srv)
		defer c.Close()
		if err := dialErr(srv); err != nil {
			t.Fatalf("an exempt uid past its bounds: %v", err)
		}
		if n := srv.RefusedHandshakes.Load() + srv.RefusedSessions.Load(); n != 0 {
			t.Fatalf("%d refusals of an exempt uid", n)
		}
	})
}
