package host

// The session plumbing every weir service shares: a ring listener on a
// Unix socket (open to every local user, or the service user's alone),
// one goroutine per session (handshake, then Serve), and a shutdown that
// ends every session and waits for it. What a session does is the
// service's business, behind the Session interface.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/ring"
)

// Session is one client session as a service sees it.
type Session interface {
	// Handler serves the session's requests; it is asked for before the
	// handshake.
	Handler() ring.Handler
	// Started is called after the handshake, before the first request;
	// an error ends the session at once.
	Started(sc *ring.ServerConn) error
	// Ended is called once Serve has returned and the region is unmapped
	// (nil: stopped by Shutdown; ring.ErrPeerGone: the client went;
	// anything else: torn down).
	Ended(err error)
}

// Drainer is implemented by sessions that must act after their last
// request and before their region is unmapped: an IO service whose backend
// registered the region for DMA unregisters it in Drained.
type Drainer interface {
	// Drained is called once, on the session's goroutine, after Started
	// has returned (whatever its result) and Serve, if it ran, has
	// returned: no request is being served or will be (Serve waits for
	// the requests a ring.AsyncHandler completes later). The region
	// (sc.Region()) is still mapped; Ended follows.
	Drained(sc *ring.ServerConn)
}

// Limits bound what the peers of one uid may hold of a client listener, so
// that no local user can take the service from the others
// (docs/architecture.md, "Limits per uid"). A zero bound is no bound.
//
// A handshake is pending from the accept until the client's ack: it holds
// a goroutine and a region (the ring's queues touched: ~50 KiB) and waits
// for a peer that may never answer. A session counts from its accept to
// its end, pending or served; a served one holds a poller goroutine, and
// an OS thread while that sleeps on its doorbell.
type Limits struct {
	// HandshakesPerUID bounds one uid's pending handshakes, Handshakes
	// every uid's: past either the connection is refused with EAGAIN.
	HandshakesPerUID, Handshakes int
	// HandshakeTimeout drops a handshake the client has not acked by then;
	// 0 is ring.HandshakeTimeout.
	HandshakeTimeout time.Duration
	// SessionsPerUID bounds one uid's sessions, Sessions every uid's:
	// past either the connection is refused with EUSERS.
	SessionsPerUID, Sessions int
	// Exempt are uids no bound applies to (their sessions are counted in
	// every uid's all the same): the configuration's limits.exempt_uids
	// and the service's own uid (package stack adds it).
	Exempt []uint32
}

// Exempts reports whether uid is exempt from l's bounds (and from the
// services' per-uid budgets, which take the same list).
func (l *Limits) Exempts(uid uint32) bool { return slices.Contains(l.Exempt, uid) }

// uidCount is what one uid holds of a listener.
type uidCount struct{ pending, sessions int }

// Listener accepts ring sessions for one service on a Unix socket: one
// goroutine per session (handshake, then Serve), and a shutdown that ends
// every session and waits for it. What a session does is the service's
// business, behind the Session interface.
//
// A client listener's socket is open to every local user: the service
// checks each request against the credentials the kernel reports for the
// client. A service listener (ServiceOnly) is for the other services of
// the stack: its socket is 0600 and a peer whose uid is not this
// process's effective uid is refused before the handshake.
type Listener struct {
	Socket string
	// ServiceOnly makes this a service listener.
	ServiceOnly bool
	Ring        ring.Config
	Mode        ring.WaitMode
	Log         hclog.Logger
	New         func() Session // makes the state of a new session
	// NewRegion creates each session's region from Ring; nil means
	// ring.Create. A service that falls back from huge pages sets it.
	NewRegion func(cfg ring.Config) (*ring.Region, error)
	// Limits bound each uid's handshakes and sessions (client listeners;
	// a service listener admits the service user only).
	Limits Limits

	ln     *ring.Listener                // immutable after Start
	uid    uint32                        // the service uid; immutable after Start
	sock   os.FileInfo                   // the socket file Start made; immutable after Start
	mu     sync.Mutex                    // protects started, conns, closed, uids, pending, sessions
	conns  map[*ring.ServerConn]struct{} // sessions being served
	closed bool
	// uids counts each uid's pending handshakes and sessions; pending and
	// sessions are every uid's (Limits).
	uids              map[uint32]*uidCount
	pending, sessions int
	// started is set once Start succeeded.
	started bool
	wg      sync.WaitGroup // the accept loop and every session goroutine

	// Refused counts peers a service listener turned away; AcceptErrors
	// the accepts that failed (acceptLoop).
	Refused, AcceptErrors atomic.Uint64
	// RefusedHandshakes and RefusedSessions count the connections Limits
	// refused (EAGAIN, EUSERS); HandshakeTimeouts the handshakes dropped
	// at their deadline, HandshakeFailures every failed one (those too).
	RefusedHandshakes, RefusedSessions, HandshakeTimeouts, HandshakeFailures atomic.Uint64
	stop                                                                     chan struct{} // closed by Shutdown; made by Start
}

// Start listens on Socket and accepts sessions in the background.
func (s *Listener) Start() error {
	ln, err := ring.Listen(s.Socket, s.Ring)
	if err != nil {
		return err
	}
	// A client socket is open to every local user: services check each
	// request against the credentials the kernel reports for the client.
	// A service socket is the service user's alone, and the peer's uid is
	// checked too (a socket's mode is not honoured everywhere).
	mode, what := os.FileMode(0o666), "open socket to all users"
	if s.ServiceOnly {
		mode, what = 0o600, "restrict service socket to the service user"
	}
	if err := os.Chmod(s.Socket, mode); err != nil {
		ln.Close()
		return fmt.Errorf("%s: %w", what, err)
	}
	s.uid = uint32(os.Geteuid())
	sock, err := os.Stat(s.Socket)
	if err != nil {
		ln.Close()
		return fmt.Errorf("socket: %w", err)
	}
	s.ln, s.sock = ln, sock
	s.mu.Lock()
	s.conns = make(map[*ring.ServerConn]struct{})
	s.uids = make(map[uint32]*uidCount)
	s.stop = make(chan struct{})
	s.started = true
	s.mu.Unlock()
	s.wg.Add(1)
	go s.acceptLoop()
	return nil
}

// Err says whether the server accepts sessions: nil while it does, else
// why not: not started, shut down, the accept loop stopped on an error,
// or the socket file is gone or was replaced (clients can no longer reach
// this listener). Safe to call at any time, from any goroutine.
func (s *Listener) Err() error {
	s.mu.Lock()
	started, closed := s.started, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return errors.New("listener shut down")
	case !started:
		return errors.New("listener not started")
	}
	fi, err := os.Stat(s.Socket)
	if err != nil {
		return fmt.Errorf("listener unreachable: %w", err)
	}
	if !os.SameFile(fi, s.sock) {
		return fmt.Errorf("listener unreachable: %s is no longer its socket", s.Socket)
	}
	return nil
}

// acceptLoop accepts until Shutdown closes the listener. A failed accept
// (no descriptor left for the connection: EMFILE, ENFILE; no memory) is
// counted, logged at its first and at each power of two after, and
// retried after a pause that doubles from 5 ms to 1 s while accepts keep
// failing, as net/http's Serve does: a listener never dies of a
// resource that comes back. The client whose connection was not taken
// waits in the backlog.
func (s *Listener) acceptLoop() {
	defer s.wg.Done()
	var pause time.Duration
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if n := s.AcceptErrors.Add(1); n&(n-1) == 0 {
				s.Log.Error("accept failed: retrying with backoff", "error", err, "count", n)
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(pause):
			case <-s.stop:
				return
			}
			continue
		}
		pause = 0
		// Who the peer is comes first, before any work for it: the
		// kernel's answer costs one getsockopt, and a peer past its
		// uid's bounds costs nothing more.
		cred, err := peerCred(conn)
		if s.ServiceOnly && (err != nil || cred.Uid != s.uid) {
			s.refuse(conn, cred, err)
			continue
		}
		if err != nil {
			conn.Close()
			s.handshakeFailed(fmt.Errorf("peer credentials: %w", err))
			continue
		}
		if e := s.admit(cred.Uid); e != 0 {
			s.refuseLimit(conn, cred, e)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(conn, cred)
		}()
	}
}

// admit counts a new connection of uid as a pending handshake and a
// session, or returns the errno of the bound it would pass: EUSERS for
// sessions, EAGAIN for handshakes.
func (s *Listener) admit(uid uint32) syscall.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := &s.Limits
	u := s.uids[uid]
	if u == nil {
		u = &uidCount{}
	}
	if !l.Exempts(uid) {
		switch {
		case l.SessionsPerUID > 0 && u.sessions >= l.SessionsPerUID, l.Sessions > 0 && s.sessions >= l.Sessions:
			return syscall.EUSERS
		case l.HandshakesPerUID > 0 && u.pending >= l.HandshakesPerUID, l.Handshakes > 0 && s.pending >= l.Handshakes:
			return syscall.EAGAIN
		}
	}
	s.uids[uid] = u
	u.pending++
	u.sessions++
	s.pending++
	s.sessions++
	return 0
}

// handshakeDone ends uid's pending handshake; handshakeDone with gone
// ends its session too.
func (s *Listener) handshakeDone(uid uint32, gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.uids[uid]
	u.pending--
	s.pending--
	if gone {
		s.leftLocked(uid, u)
	}
}

// left ends a session of uid.
func (s *Listener) left(uid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leftLocked(uid, s.uids[uid])
}

func (s *Listener) leftLocked(uid uint32, u *uidCount) {
	u.sessions--
	s.sessions--
	if u.sessions == 0 {
		delete(s.uids, uid)
	}
}

// Pending returns the handshakes in progress and the sessions (pending or
// served) now.
func (s *Listener) Pending() (handshakes, sessions int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending, s.sessions
}

// Stalled returns the sessions served now whose client takes no
// completions (ring.ServerSession.Stalled): each stalls only itself.
func (s *Listener) Stalled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for sc := range s.conns {
		if sc.Stalled() {
			n++
		}
	}
	return n
}

// refuseLimit refuses a connection past a bound of its uid's with e
// (ring.Refuse: the client's handshake fails with e), counted; the first
// refusal of each kind is a warning, later ones debug lines.
func (s *Listener) refuseLimit(conn *net.UnixConn, cred *unix.Ucred, e syscall.Errno) {
	count, what, key := &s.RefusedHandshakes, "handshakes", "limits.handshakes_per_uid, limits.handshakes"
	if e == syscall.EUSERS {
		count, what, key = &s.RefusedSessions, "sessions", "limits.sessions_per_uid, limits.sessions"
	}
	n := count.Add(1) // (before the client can learn of it)
	ring.Refuse(conn, e)
	lvl := hclog.Debug
	if n == 1 {
		lvl = hclog.Warn
	}
	s.Log.Log(lvl, "connection refused: its uid has as many "+what+" as it may (later refusals are logged at debug level; all are counted in limits_refused_"+what+")",
		"socket", s.Socket, "pid", cred.Pid, "uid", cred.Uid, "errno", e.Error(), "config", key)
}

// handshakeFailed counts a failed handshake; the first is a warning,
// later ones debug lines (a peer can fail as many as it likes).
func (s *Listener) handshakeFailed(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.HandshakeTimeouts.Add(1)
	}
	lvl := hclog.Debug
	if s.HandshakeFailures.Add(1) == 1 {
		lvl = hclog.Warn
	}
	s.Log.Log(lvl, "handshake failed (later failures are logged at debug level; all are counted in handshakes_failed)",
		"socket", s.Socket, "error", err)
}

// handshakeTimeout is how long a client has to ack the hello.
func (s *Listener) handshakeTimeout() time.Duration {
	if t := s.Limits.HandshakeTimeout; t > 0 {
		return t
	}
	return ring.HandshakeTimeout
}

// serve runs one session of the peer cred (admitted: its handshake and
// session counted): the handshake in this goroutine (a slow client
// delays no one else), bounded by the handshake timeout, then Serve. This
// goroutine alone closes the session, so the region stays mapped from
// Started to Drained.
func (s *Listener) serve(conn *net.UnixConn, cred *unix.Ucred) {
	newRegion := s.NewRegion
	if newRegion == nil {
		newRegion = ring.Create
	}
	r, err := newRegion(s.Ring)
	if err != nil {
		conn.Close()
		s.handshakeDone(cred.Uid, true)
		s.Log.Error("create session region", "error", err)
		return
	}
	sess := s.New()
	ctx, cancel := context.WithTimeout(context.Background(), s.handshakeTimeout())
	sc, err := ring.NewServerConnRegion(ctx, conn, r, sess.Handler(), s.Mode)
	cancel()
	if err != nil {
		s.handshakeDone(cred.Uid, true)
		s.handshakeFailed(err)
		return
	}
	s.handshakeDone(cred.Uid, false)
	defer s.left(cred.Uid)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sc.Close()
		return
	}
	s.conns[sc] = struct{}{}
	s.mu.Unlock()
	if err = sess.Started(sc); err == nil {
		err = sc.Serve()
	}
	if d, ok := sess.(Drainer); ok {
		d.Drained(sc)
	}
	sc.Close()
	s.mu.Lock()
	delete(s.conns, sc)
	s.mu.Unlock()
	sess.Ended(err)
	if err != nil && !errors.Is(err, ring.ErrPeerGone) {
		s.Log.Warn("session torn down", "pid", sc.Cred.Pid, "error", err)
	}
}

// refuse closes a connection to a service listener from a peer that is not
// the service user; the first refusal is a warning, later ones debug lines
// (all counted in Refused).
func (s *Listener) refuse(conn *net.UnixConn, cred *unix.Ucred, err error) {
	conn.Close()
	lvl := hclog.Debug
	if s.Refused.Add(1) == 1 {
		lvl = hclog.Warn
	}
	if err != nil {
		s.Log.Log(lvl, "service socket: cannot read the peer's credentials; refused", "socket", s.Socket, "error", err)
		return
	}
	s.Log.Log(lvl, "service socket: peer is not the service user; refused (later refusals are logged at debug level)",
		"socket", s.Socket, "pid", cred.Pid, "uid", cred.Uid, "service_uid", s.uid)
}

// peerCred is what the kernel says about the other end of conn.
func peerCred(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// Shutdown stops accepting, stops every session and waits until each has
// ended (Drained and Ended called, region unmapped) or ctx expires. It
// stops rather than closes a session: the session's own goroutine unmaps
// the region, after Drained.
func (s *Listener) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.stop != nil {
		close(s.stop)
	}
	conns := make([]*ring.ServerConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	if s.ln != nil {
		s.ln.Close()
	}
	for _, sc := range conns {
		sc.Stop()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sessions still running: %w", ctx.Err())
	}
}
