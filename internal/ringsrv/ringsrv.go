// Package ringsrv is the session plumbing every weir service shares: a
// ring listener on a Unix socket open to every local user, one goroutine per
// client session (handshake, then Serve), and a shutdown that ends every
// session and waits for it. What a session does is the service's business,
// behind the Session interface.
package ringsrv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

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

// Server accepts ring sessions for one service.
type Server struct {
	Socket string
	Ring   ring.Config
	Mode   ring.WaitMode
	Log    hclog.Logger
	New    func() Session // makes the state of a new session
	// NewRegion creates each session's region from Ring; nil means
	// ring.Create. A service that falls back from huge pages sets it.
	NewRegion func(cfg ring.Config) (*ring.Region, error)

	ln     *ring.Listener                // immutable after Start
	sock   os.FileInfo                   // the socket file Start made; immutable after Start
	mu     sync.Mutex                    // protects started, conns, closed, acceptErr
	conns  map[*ring.ServerConn]struct{} // sessions being served
	closed bool
	// started is set once Start succeeded; acceptErr once the accept loop
	// has stopped on an error other than Shutdown's.
	started   bool
	acceptErr error
	wg        sync.WaitGroup // the accept loop and every session goroutine
}

// Start listens on Socket and accepts sessions in the background.
func (s *Server) Start() error {
	ln, err := ring.Listen(s.Socket, s.Ring)
	if err != nil {
		return err
	}
	// Every local user may connect: services check each request against
	// the credentials the kernel reports for the client.
	if err := os.Chmod(s.Socket, 0o666); err != nil {
		ln.Close()
		return fmt.Errorf("open socket to all users: %w", err)
	}
	sock, err := os.Stat(s.Socket)
	if err != nil {
		ln.Close()
		return fmt.Errorf("socket: %w", err)
	}
	s.ln, s.sock = ln, sock
	s.mu.Lock()
	s.conns = make(map[*ring.ServerConn]struct{})
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
func (s *Server) Err() error {
	s.mu.Lock()
	started, closed, acceptErr := s.started, s.closed, s.acceptErr
	s.mu.Unlock()
	switch {
	case closed:
		return errors.New("listener shut down")
	case !started:
		return errors.New("listener not started")
	case acceptErr != nil:
		return fmt.Errorf("listener stopped accepting: %w", acceptErr)
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

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.Log.Error("accept", "error", err)
				s.mu.Lock()
				s.acceptErr = err
				s.mu.Unlock()
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(conn)
		}()
	}
}

// serve runs one session: the handshake in this goroutine (a slow client
// delays no one else), then Serve. This goroutine alone closes the session,
// so the region stays mapped from Started to Drained.
func (s *Server) serve(conn *net.UnixConn) {
	newRegion := s.NewRegion
	if newRegion == nil {
		newRegion = ring.Create
	}
	r, err := newRegion(s.Ring)
	if err != nil {
		conn.Close()
		s.Log.Error("create session region", "error", err)
		return
	}
	sess := s.New()
	sc, err := ring.NewServerConnRegion(context.Background(), conn, r, sess.Handler(), s.Mode)
	if err != nil {
		s.Log.Warn("handshake failed", "error", err)
		return
	}
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

// Shutdown stops accepting, stops every session and waits until each has
// ended (Drained and Ended called, region unmapped) or ctx expires. It
// stops rather than closes a session: the session's own goroutine unmaps
// the region, after Drained.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
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

// Subscribe subscribes every handler to its subject and flushes, so the
// subscriptions are live on the server when it returns. On error nothing
// stays subscribed.
func Subscribe(nc *nats.Conn, handlers map[string]nats.MsgHandler) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	for subj, h := range handlers {
		sub, err := nc.Subscribe(subj, h)
		if err != nil {
			Unsubscribe(subs)
			return nil, fmt.Errorf("subscribe %s: %w", subj, err)
		}
		subs = append(subs, sub)
	}
	if err := nc.Flush(); err != nil {
		Unsubscribe(subs)
		return nil, fmt.Errorf("flush subscriptions: %w", err)
	}
	return subs, nil
}

// Unsubscribe ends subscriptions.
func Unsubscribe(subs []*nats.Subscription) {
	for _, sub := range subs {
		_ = sub.Unsubscribe()
	}
}
