package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/ring"
)

// Service sessions. A service of the stack opens a ring session on
// another service's service socket (a ServiceOnly listener) and says who
// it is; from then on the session's life is the peer's presence: its end
// (a closed socket or the peer's pidfd) tells the other side at once that
// the peer is gone, with no timeout. Later issues carry the services'
// shared rings (S1-S5 in docs/architecture.md) on these sessions.
//
// Service ring opcodes are 0x60-0x7f, apart from the client protocol's.
//
//	OpPeerHello  in: str role ("io", "journal", ...); Result 0, or
//	             -EPERM (a role this listener does not take),
//	             -EBUSY (a peer of that role is already connected),
//	             -EISCONN (this session already said hello)
const OpPeerHello uint8 = 0x60

// PeerRing is the ring of a service session: small, it carries control.
var PeerRing = ring.Config{SQEntries: 16, CQEntries: 32, ArenaSize: 64 << 10, BlockSize: 4096}

// Peers tracks the service sessions of one service listener.
type Peers struct {
	roles    []string
	onChange func(role string, up bool)
	ops      map[uint8]ring.HandlerFunc

	mu   sync.Mutex
	conn map[string]bool // roles connected now; protected by mu
}

// ServePeers adds a service listener on socket that takes sessions from
// the service user for the given roles, and calls onChange(role, true)
// when a peer of that role has said hello, onChange(role, false) when its
// session ends. onChange runs on the session's goroutine; it must not
// block for long.
func (h *Host) ServePeers(socket string, roles []string, onChange func(role string, up bool)) *Peers {
	return h.ServePeersWith(socket, roles, onChange, nil)
}

// ServePeersWith is ServePeers with the opcodes the service serves on
// these sessions: each is served only after the session's hello (a
// request before it is answered -EPERM), on the session's poller.
func (h *Host) ServePeersWith(socket string, roles []string, onChange func(role string, up bool), ops map[uint8]ring.HandlerFunc) *Peers {
	p := &Peers{roles: slices.Clone(roles), onChange: onChange, conn: map[string]bool{}, ops: ops}
	h.Serve(&Listener{Socket: socket, ServiceOnly: true, Ring: PeerRing, Mode: ring.WaitAdaptive,
		New: func() Session { return newPeerSession(p) }})
	return p
}

// Up reports whether a peer of role is connected.
func (p *Peers) Up(role string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn[role]
}

type peerSession struct {
	p    *Peers
	mux  *ring.Mux
	role string // set by the hello; owned by the session's goroutine
}

func newPeerSession(p *Peers) *peerSession {
	s := &peerSession{p: p, mux: ring.NewMux()}
	s.mux.Handle(OpPeerHello, s.hello)
	for op, f := range p.ops {
		s.mux.Handle(op, func(q *ring.Request) (int64, uint64) {
			if s.role == "" {
				return -int64(syscall.EPERM), 0
			}
			return f(q)
		})
	}
	return s
}

func (s *peerSession) Handler() ring.Handler          { return s.mux }
func (s *peerSession) Started(*ring.ServerConn) error { return nil }

func (s *peerSession) hello(q *ring.Request) (int64, uint64) {
	if s.role != "" {
		return -int64(syscall.EISCONN), 0
	}
	if q.Length > 64 {
		return -int64(syscall.EINVAL), 0
	}
	b := make([]byte, q.Length)
	q.ReadPayload(b)
	role := string(b)
	if !slices.Contains(s.p.roles, role) {
		return -int64(syscall.EPERM), 0
	}
	s.p.mu.Lock()
	busy := s.p.conn[role]
	if !busy {
		s.p.conn[role] = true
	}
	s.p.mu.Unlock()
	if busy {
		return -int64(syscall.EBUSY), 0
	}
	s.role = role
	s.p.onChange(role, true)
	return 0, 0
}

func (s *peerSession) Ended(error) {
	if s.role == "" {
		return
	}
	s.p.mu.Lock()
	delete(s.p.conn, s.role)
	s.p.mu.Unlock()
	s.p.onChange(s.role, false)
}

// Peer is this service's session with another service's service socket,
// kept up for as long as the Peer lives: when the session ends (the other
// service stopped or died) it dials again, backing off from 20ms to 250ms
// (a restarted service is back soon; the dial is cheap).
type Peer struct {
	socket, role string
	log          hclog.Logger
	onChange     func(up bool)

	mu  sync.Mutex
	up  bool
	cli *ring.Client // protected by mu

	stop chan struct{}
	done chan struct{}
}

// DialPeer starts keeping a session with the service socket at socket as
// role; onChange(true) runs after each successful hello, onChange(false)
// when that session ends. Close stops it.
func DialPeer(socket, role string, log hclog.Logger, onChange func(up bool)) *Peer {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	p := &Peer{socket: socket, role: role, log: log, onChange: onChange,
		stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p
}

// Client returns the session's ring, or nil while it is not up. A call
// on it after the session ended fails with ring.ErrPeerGone or
// ring.ErrClosed.
func (p *Peer) Client() *ring.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cli
}

// Up reports whether the session is established.
func (p *Peer) Up() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up
}

func (p *Peer) loop() {
	defer close(p.done)
	backoff := 20 * time.Millisecond
	warned := false
	for {
		c, err := p.dial()
		if err == nil {
			backoff = 20 * time.Millisecond
			warned = false
			p.set(true, c)
			select {
			case <-c.Done():
				p.log.Info("service session ended: the peer service stopped or died", "socket", p.socket, "error", c.Err())
			case <-p.stop:
			}
			p.set(false, nil)
			c.Close()
		} else if !warned && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
			warned = true
			p.log.Warn("service session: cannot connect (retrying)", "socket", p.socket, "error", err)
		} else {
			p.log.Debug("service session: cannot connect (retrying)", "socket", p.socket, "error", err)
		}
		select {
		case <-p.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

func (p *Peer) dial() (*ring.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ring.HandshakeTimeout)
	defer cancel()
	c, err := ring.Dial(ctx, p.socket, ring.ClientOptions{})
	if err != nil {
		return nil, err
	}
	b, err := c.Alloc(ctx, len(p.role))
	if err == nil {
		b.CopyFrom([]byte(p.role))
		var comp ring.Completion
		comp, err = c.Do(ctx, &ring.Call{Op: OpPeerHello, Buf: b})
		b.Release()
		if err == nil && comp.Result < 0 {
			err = fmt.Errorf("peer hello as %q: %w", p.role, syscall.Errno(-comp.Result))
		}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (p *Peer) set(up bool, c *ring.Client) {
	p.mu.Lock()
	p.up, p.cli = up, c
	p.mu.Unlock()
	p.onChange(up)
}

// Close ends the session and stops dialing; onChange(false) has run when
// it returns if the session was up.
func (p *Peer) Close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}
