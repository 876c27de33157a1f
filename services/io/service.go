package iosvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/wire"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/io/backend"
)

// Options configure an IO service.
type Options struct {
	Socket   string          // Unix socket clients connect to
	Backend  backend.Backend // owned by the service from New on
	NATS     *nats.Conn      // control plane; not owned
	Ring     ring.Config     // per-session ring size
	WaitMode ring.WaitMode   // how session pollers wait
	Logger   hclog.Logger
	// RequestTimeout bounds each control request to the metadata service.
	RequestTimeout time.Duration
}

// Stats are the service's counters, reported on NATS.
type Stats struct {
	Sessions     atomic.Int64
	Reads        atomic.Uint64
	Writes       atomic.Uint64
	BytesRead    atomic.Uint64
	BytesWritten atomic.Uint64
	Syncs        atomic.Uint64
	Grants       atomic.Int64
	Denied       atomic.Uint64 // requests refused for lack of a grant
}

// Snapshot returns the counters as a map for the stats endpoint.
func (s *Stats) Snapshot() map[string]any {
	return map[string]any{
		"sessions": s.Sessions.Load(), "reads": s.Reads.Load(), "writes": s.Writes.Load(),
		"bytes_read": s.BytesRead.Load(), "bytes_written": s.BytesWritten.Load(),
		"syncs": s.Syncs.Load(), "grants": s.Grants.Load(), "denied": s.Denied.Load(),
	}
}

// openBlob is a blob with at least one grant or request in flight.
type openBlob struct {
	id  backend.BlobID
	ino uint64
	b   backend.Blob

	appendMu sync.Mutex   // serialises O_APPEND writes (offset = size)
	mtime    atomic.Int64 // Unix ns of the last change through this service
	wrote    atomic.Bool  // changed since it was opened here

	refs int // grants + in-flight requests; protected by Service.mu
}

type grant struct {
	blob        *openBlob
	read, write bool
}

// Service is the IO service.
type Service struct {
	opts Options
	log  hclog.Logger
	be   backend.Backend

	mu     sync.Mutex
	blobs  map[backend.BlobID]*openBlob // protected by mu
	grants map[uint64]map[uint64]*grant // session -> handle -> grant; protected by mu
	conns  map[*session]struct{}        // live ring sessions; protected by mu
	subs   []*nats.Subscription         // immutable after Start
	ln     *ring.Listener               // immutable after Start
	wg     sync.WaitGroup               // accept loop and session goroutines
	ready  chan struct{}                // closed when Start succeeded
	closed atomic.Bool

	Stats Stats
}

// New checks opts and builds a service; Start makes it serve.
func New(opts Options) (*Service, error) {
	if opts.Socket == "" || opts.Backend == nil || opts.NATS == nil {
		return nil, errors.New("iosvc: Socket, Backend and NATS are required")
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	return &Service{
		opts: opts, log: opts.Logger, be: opts.Backend,
		blobs:  make(map[backend.BlobID]*openBlob),
		grants: make(map[uint64]map[uint64]*grant),
		conns:  make(map[*session]struct{}),
		ready:  make(chan struct{}),
	}, nil
}

// Start subscribes to the control subjects and accepts client sessions.
func (s *Service) Start() error {
	for subj, h := range map[string]nats.MsgHandler{
		wire.SubjGrant:  s.onGrant,
		wire.SubjRevoke: s.onRevoke,
		wire.SubjLive:   s.onLive,
		wire.SubjDelete: s.onDelete,
	} {
		sub, err := s.opts.NATS.Subscribe(subj, h)
		if err != nil {
			s.unsubscribe()
			return fmt.Errorf("iosvc: subscribe %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	if err := s.opts.NATS.Flush(); err != nil {
		s.unsubscribe()
		return fmt.Errorf("iosvc: flush subscriptions: %w", err)
	}
	ln, err := ring.Listen(s.opts.Socket, s.opts.Ring)
	if err != nil {
		s.unsubscribe()
		return fmt.Errorf("iosvc: %w", err)
	}
	// Every local user may connect: permissions are checked per request
	// against the credentials the kernel reports.
	if err := os.Chmod(s.opts.Socket, 0o666); err != nil {
		ln.Close()
		s.unsubscribe()
		return fmt.Errorf("iosvc: open socket to all users: %w", err)
	}
	s.ln = ln
	s.wg.Add(1)
	go s.acceptLoop()
	close(s.ready)
	s.log.Info("serving", "socket", s.opts.Socket, "backend", s.be.Name(), "wait", s.opts.WaitMode)
	return nil
}

// Ready is closed once the service accepts sessions.
func (s *Service) Ready() <-chan struct{} { return s.ready }

func (s *Service) unsubscribe() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
}

func (s *Service) acceptLoop() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("accept", "error", err)
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(conn)
		}()
	}
}

func (s *Service) serveConn(conn *net.UnixConn) {
	sess := &session{svc: s, mux: ring.NewMux()}
	sess.register()
	sc, err := ring.NewServerConn(context.Background(), conn, s.ln.Config(), sess.mux, s.opts.WaitMode)
	if err != nil {
		s.log.Warn("handshake failed", "error", err)
		return
	}
	sess.sc = sc
	sess.cred = sc.Cred
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		sc.Close()
		return
	}
	s.conns[sess] = struct{}{}
	s.mu.Unlock()
	s.Stats.Sessions.Add(1)
	err = sc.Serve()
	sc.Close()
	s.Stats.Sessions.Add(-1)
	s.mu.Lock()
	delete(s.conns, sess)
	s.mu.Unlock()
	switch {
	case err == nil, errors.Is(err, ring.ErrPeerGone):
		s.log.Debug("session ended", "pid", sess.cred.Pid, "session", sess.sid)
	default:
		s.log.Warn("session torn down", "pid", sess.cred.Pid, "session", sess.sid, "error", err)
	}
}

// Shutdown stops accepting, ends every session, reports the live size and
// mtime of every changed blob to the metadata service, syncs and closes the
// backend.
func (s *Service) Shutdown(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.unsubscribe()
	if s.ln != nil {
		s.ln.Close()
	}
	s.mu.Lock()
	conns := make([]*session, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.sc.Close()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("iosvc: shutdown: sessions still running: %w", ctx.Err())
	}
	var errs []error
	s.mu.Lock()
	blobs := make([]*openBlob, 0, len(s.blobs))
	for _, ob := range s.blobs {
		blobs = append(blobs, ob)
	}
	s.blobs = map[backend.BlobID]*openBlob{}
	s.grants = map[uint64]map[uint64]*grant{}
	s.mu.Unlock()
	for _, ob := range blobs {
		if err := ob.b.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("sync blob %d: %w", ob.id, err))
		}
		if ob.wrote.Load() {
			if err := s.reportLive(ob, true); err != nil {
				errs = append(errs, err)
			}
		}
		if err := ob.b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close blob %d: %w", ob.id, err))
		}
	}
	if err := s.be.Sync(); err != nil {
		errs = append(errs, err)
	}
	if err := s.be.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// reportLive tells the metadata service a blob's size and mtime.
func (s *Service) reportLive(ob *openBlob, sync bool) error {
	msg := wire.SetLive{Ino: ob.ino, Size: ob.b.Size(), Mtime: ob.mtime.Load(), Sync: sync}
	var ack wire.Ack
	if err := s.request(wire.SubjSetLive, msg, &ack); err != nil {
		return fmt.Errorf("report size of blob %d: %w", ob.id, err)
	}
	return nil
}

// request sends a control request and decodes its reply; a reply that
// carries an Error becomes an error.
func (s *Service) request(subj string, msg any, reply any) error {
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	m, err := s.opts.NATS.Request(subj, data, s.opts.RequestTimeout)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	if err := json.Unmarshal(m.Data, reply); err != nil {
		return fmt.Errorf("%s: bad reply: %w", subj, err)
	}
	if a, ok := reply.(*wire.Ack); ok && a.Error != "" {
		return fmt.Errorf("%s: %s", subj, a.Error)
	}
	if a, ok := reply.(*wire.SessionInfo); ok && a.Error != "" {
		return fmt.Errorf("%s: %s", subj, a.Error)
	}
	return nil
}

func respond(m *nats.Msg, v any) {
	data, _ := json.Marshal(v)
	_ = m.Respond(data)
}

func (s *Service) onGrant(m *nats.Msg) {
	var g wire.Grant
	if err := json.Unmarshal(m.Data, &g); err != nil || g.Blob == 0 || g.Handle == 0 {
		respond(m, wire.Ack{Error: "malformed grant"})
		return
	}
	ob, err := s.openBlob(backend.BlobID(g.Blob), g.Ino)
	if err != nil {
		respond(m, wire.Ack{Error: err.Error()})
		return
	}
	if g.Truncate {
		if err := ob.b.Truncate(0); err != nil {
			s.releaseBlob(ob)
			respond(m, wire.Ack{Error: err.Error()})
			return
		}
		ob.touch()
	}
	s.mu.Lock()
	hs := s.grants[g.Session]
	if hs == nil {
		hs = make(map[uint64]*grant)
		s.grants[g.Session] = hs
	}
	if old := hs[g.Handle]; old != nil {
		s.mu.Unlock()
		s.releaseBlob(ob)
		respond(m, wire.Ack{Error: "handle already granted"})
		return
	}
	hs[g.Handle] = &grant{blob: ob, read: g.Read, write: g.Write}
	s.mu.Unlock()
	s.Stats.Grants.Add(1)
	respond(m, wire.Ack{Size: ob.b.Size(), Mtime: ob.mtime.Load(), Wrote: ob.wrote.Load()})
}

func (ob *openBlob) touch() {
	ob.mtime.Store(time.Now().UnixNano())
	ob.wrote.Store(true)
}

func (s *Service) onRevoke(m *nats.Msg) {
	var r wire.Revoke
	if err := json.Unmarshal(m.Data, &r); err != nil {
		respond(m, wire.Ack{Error: "malformed revoke"})
		return
	}
	s.mu.Lock()
	hs := s.grants[r.Session]
	var gone []*grant
	if r.Handle == 0 {
		for _, g := range hs {
			gone = append(gone, g)
		}
		delete(s.grants, r.Session)
	} else if g := hs[r.Handle]; g != nil {
		gone = append(gone, g)
		delete(hs, r.Handle)
		if len(hs) == 0 {
			delete(s.grants, r.Session)
		}
	}
	s.mu.Unlock()
	// The ack carries the blob's attributes for a single handle; for a
	// whole session (Handle 0) it carries none.
	var ack wire.Ack
	for _, g := range gone {
		s.Stats.Grants.Add(-1)
		if r.Handle != 0 {
			ack.Size, ack.Mtime, ack.Wrote = g.blob.b.Size(), g.blob.mtime.Load(), g.blob.wrote.Load()
		}
		s.releaseBlob(g.blob)
	}
	respond(m, ack)
}

func (s *Service) onLive(m *nats.Msg) {
	var q wire.LiveQuery
	if err := json.Unmarshal(m.Data, &q); err != nil {
		respond(m, wire.Ack{Error: "malformed query"})
		return
	}
	s.mu.Lock()
	ob := s.blobs[backend.BlobID(q.Blob)]
	if ob != nil {
		ob.refs++
	}
	s.mu.Unlock()
	if ob == nil {
		respond(m, wire.Ack{Error: "blob not open"})
		return
	}
	respond(m, wire.Ack{Size: ob.b.Size(), Mtime: ob.mtime.Load(), Wrote: ob.wrote.Load()})
	s.releaseBlob(ob)
}

func (s *Service) onDelete(m *nats.Msg) {
	var d wire.Delete
	if err := json.Unmarshal(m.Data, &d); err != nil || d.Blob == 0 {
		respond(m, wire.Ack{Error: "malformed delete"})
		return
	}
	s.mu.Lock()
	_, busy := s.blobs[backend.BlobID(d.Blob)]
	s.mu.Unlock()
	if busy {
		respond(m, wire.Ack{Error: "blob is still open"})
		return
	}
	err := s.be.Delete(backend.BlobID(d.Blob))
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		respond(m, wire.Ack{Error: err.Error()})
		return
	}
	respond(m, wire.Ack{})
}

// openBlob returns the open blob for id, opening (and creating) it if need
// be, with one reference for the caller.
func (s *Service) openBlob(id backend.BlobID, ino uint64) (*openBlob, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ob := s.blobs[id]; ob != nil {
		ob.refs++
		return ob, nil
	}
	b, err := s.be.Open(id)
	if errors.Is(err, syscall.ENOENT) {
		if err = s.be.Create(id); err == nil || errors.Is(err, syscall.EEXIST) {
			b, err = s.be.Open(id)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open blob %d: %w", id, err)
	}
	ob := &openBlob{id: id, ino: ino, b: b, refs: 1}
	s.blobs[id] = ob
	return ob, nil
}

// releaseBlob drops a reference; the last one closes the blob.
func (s *Service) releaseBlob(ob *openBlob) {
	s.mu.Lock()
	ob.refs--
	last := ob.refs == 0
	if last {
		delete(s.blobs, ob.id)
	}
	s.mu.Unlock()
	if last {
		if err := ob.b.Close(); err != nil {
			s.log.Warn("close blob", "blob", ob.id, "error", err)
		}
	}
}

// lookup returns the grant of a session's handle with a reference on its
// blob held for the duration of one request.
func (s *Service) lookup(sid, handle uint64) *grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.grants[sid][handle]
	if g != nil {
		g.blob.refs++
	}
	return g
}
