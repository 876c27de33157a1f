package iosvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/ringsrv"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/io/backend"
)

// ServiceName is the service's name on NATS: Start registers it as a NATS
// micro service with the endpoints "health" (Health) and "stats"
// (Snapshot), which `weir status` and `nats micro` query.
const ServiceName = "weir-io"

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
	// NATSNamespace starts every NATS subject of the stack (control.SubjectsIn)
	// and the service's health and stats endpoints; "" means
	// control.DefaultNamespace. The metadata service must use the same.
	NATSNamespace string
	// Version is the version the service reports on NATS; "" means
	// "0.0.0-dev".
	Version string
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
	// Reads and writes served on the session's poller (alone: nothing else
	// of the session in flight or queued) and handed to a goroutine.
	InlineIO    atomic.Uint64
	HandedOffIO atomic.Uint64

	// Zero-copy memory (backends that implement backend.MemRegistrar).
	HugePageFallbacks     atomic.Uint64 // sessions given ordinary pages: no huge page region could be made
	MemRegisterFailures   atomic.Uint64 // regions the backend refused to register: it bounces their payloads
	MemUnregisterFailures atomic.Uint64 // regions the backend failed to unregister
}

// Snapshot returns the service's counters and the backend's, for the
// stats endpoint.
func (s *Service) Snapshot() map[string]any {
	m := s.Stats.snapshot()
	m["backend_syncs"] = s.creates.syncs.Load()
	if r, ok := s.be.(backend.Reporter); ok {
		for k, v := range r.Counters() {
			m[k] = v
		}
	}
	return m
}

func (s *Stats) snapshot() map[string]any {
	return map[string]any{
		"sessions": s.Sessions.Load(), "reads": s.Reads.Load(), "writes": s.Writes.Load(),
		"bytes_read": s.BytesRead.Load(), "bytes_written": s.BytesWritten.Load(),
		"syncs": s.Syncs.Load(), "grants": s.Grants.Load(), "denied": s.Denied.Load(),
		"io_inline": s.InlineIO.Load(), "io_handed_off": s.HandedOffIO.Load(),
		"ring_hugepage_fallbacks": s.HugePageFallbacks.Load(),
		"mem_register_failures":   s.MemRegisterFailures.Load(),
		"mem_unregister_failures": s.MemUnregisterFailures.Load(),
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
	subj control.Subjects // immutable after New
	// reg is be when it registers memory, else nil; immutable after New.
	// When it wants huge pages, opts.Ring.HugePages is set.
	reg backend.MemRegistrar
	// newRegion creates a session's region: ring.Create; tests replace it
	// before Start to make huge pages fail. Immutable after Start.
	newRegion func(ring.Config) (*ring.Region, error)
	// handOffAlways serves every read and write on a goroutine of its own,
	// even one that is alone; tests of concurrency set it.
	handOffAlways atomic.Bool

	mu     sync.Mutex
	blobs  map[backend.BlobID]*openBlob // protected by mu
	grants map[uint64]map[uint64]*grant // session -> handle -> grant; protected by mu
	subs   []*nats.Subscription         // immutable after Start
	ctl    micro.Service                // health and stats endpoints; immutable after Start
	srv    ringsrv.Server               // client sessions
	ready  chan struct{}                // closed when Start succeeded
	closed atomic.Bool
	// syncFailure is the first failed sync of a blob or of the backend:
	// set once, never cleared (after a failed fsync the device may have
	// dropped data, so a later success proves nothing). Health reports it.
	syncFailure atomic.Pointer[error]
	// creates makes blob creates durable at the fsync that needs them.
	creates createSync

	Stats Stats
}

// New checks opts and builds a service; Start makes it serve.
func New(opts Options) (*Service, error) {
	if opts.Socket == "" || opts.Backend == nil || opts.NATS == nil {
		return nil, errors.New("iosvc: Socket, Backend and NATS are required")
	}
	if opts.NATSNamespace == "" {
		opts.NATSNamespace = control.DefaultNamespace
	}
	if err := control.CheckNamespace(opts.NATSNamespace); err != nil {
		return nil, fmt.Errorf("iosvc: nats namespace: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	reg, _ := opts.Backend.(backend.MemRegistrar)
	if reg != nil && reg.HugePages() {
		opts.Ring.HugePages = true
	}
	s := &Service{
		opts: opts, log: opts.Logger, be: opts.Backend, subj: control.SubjectsIn(opts.NATSNamespace),
		reg: reg, newRegion: ring.Create,
		blobs:  make(map[backend.BlobID]*openBlob),
		grants: make(map[uint64]map[uint64]*grant),
		ready:  make(chan struct{}),
	}
	s.creates.be = opts.Backend
	return s, nil
}

// Start subscribes to the control subjects, registers the health and
// stats endpoints (ServiceName) and accepts client sessions.
func (s *Service) Start() error {
	subs, err := ringsrv.Subscribe(s.opts.NATS, map[string]nats.MsgHandler{
		s.subj.Grant:  s.onGrant,
		s.subj.Revoke: s.onRevoke,
		s.subj.Live:   s.onLive,
		s.subj.Delete: s.onDelete,
	})
	if err != nil {
		return fmt.Errorf("iosvc: %w", err)
	}
	s.subs = subs
	s.ctl, err = control.Register(s.opts.NATS, control.ServiceInfo{
		Name: ServiceName, Version: s.opts.Version, Namespace: s.opts.NATSNamespace,
		Description: "blob storage and the data path",
	}, s.Health, func() any { return s.Snapshot() })
	if err != nil {
		ringsrv.Unsubscribe(s.subs)
		return fmt.Errorf("iosvc: %w", err)
	}
	s.srv = ringsrv.Server{Socket: s.opts.Socket, Ring: s.opts.Ring, Mode: s.opts.WaitMode, Log: s.log,
		New: func() ringsrv.Session { return newSession(s) }, NewRegion: s.createRegion}
	if err := s.srv.Start(); err != nil {
		_ = s.ctl.Stop()
		ringsrv.Unsubscribe(s.subs)
		return fmt.Errorf("iosvc: %w", err)
	}
	close(s.ready)
	s.log.Info("serving", "socket", s.opts.Socket, "backend", s.be.Name(), "wait", s.opts.WaitMode,
		"register_mem", s.reg != nil, "hugepages", s.opts.Ring.HugePages)
	return nil
}

// createRegion makes a session's region. When huge pages were asked for
// and none can be had (none free, or no hugetlb support), the session gets
// ordinary pages: it works, but the backend cannot register the region and
// copies its payloads through a bounce buffer. Only the first fallback is
// logged as a warning; ring_hugepage_fallbacks counts them all.
func (s *Service) createRegion(cfg ring.Config) (*ring.Region, error) {
	r, err := s.newRegion(cfg)
	if err == nil || !cfg.HugePages {
		return r, err
	}
	cfg.HugePages = false
	r, err2 := s.newRegion(cfg)
	if err2 != nil {
		return nil, fmt.Errorf("iosvc: session region: huge pages: %w; ordinary pages: %w", err, err2)
	}
	lvl := hclog.Debug
	if s.Stats.HugePageFallbacks.Add(1) == 1 {
		lvl = hclog.Warn
	}
	s.log.Log(lvl, "no huge pages for a session region: it gets ordinary pages and the backend copies its payloads (later fallbacks are logged at debug level; all are counted in ring_hugepage_fallbacks)",
		"error", err)
	return r, nil
}

// Ready is closed once the service accepts sessions.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Health says whether the service does its job: nil while it accepts
// sessions and its storage has not failed; otherwise why not: not started
// or shut down, a failed sync of a blob or of the backend (sticky: data
// may be lost, so only a restart clears it), or a ring listener that no
// longer accepts. It is what the health endpoint reports; safe to call at
// any time, from any goroutine.
func (s *Service) Health() error {
	select {
	case <-s.ready:
	default:
		return errors.New("iosvc: not started")
	}
	if s.closed.Load() {
		return errors.New("iosvc: shut down")
	}
	if p := s.syncFailure.Load(); p != nil {
		return fmt.Errorf("iosvc: storage failed: %w", *p)
	}
	if err := s.srv.Err(); err != nil {
		return fmt.Errorf("iosvc: %w", err)
	}
	return nil
}

// syncFailed records err, a failed sync, for Health if it is the first.
// EBADF is not a storage failure: the blob or backend closed under the
// caller.
func (s *Service) syncFailed(err error) {
	if errors.Is(err, syscall.EBADF) {
		return
	}
	if s.syncFailure.CompareAndSwap(nil, &err) {
		s.log.Error("sync failed; the service reports itself unhealthy until restarted", "error", err)
	}
}

// Shutdown withdraws the health and stats endpoints, stops accepting,
// ends every session, reports the live size and mtime of every changed
// blob to the metadata service, syncs and closes the backend.
func (s *Service) Shutdown(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	if s.ctl != nil {
		control.Deregister(s.opts.NATS, s.ctl)
	}
	ringsrv.Unsubscribe(s.subs)
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("iosvc: shutdown: %w", err)
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
			err = fmt.Errorf("sync blob %d: %w", ob.id, err)
			s.syncFailed(err)
			errs = append(errs, err)
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
		err = fmt.Errorf("sync backend: %w", err)
		s.syncFailed(err)
		errs = append(errs, err)
	}
	if err := s.be.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// reportLive tells the metadata service a blob's size and mtime.
func (s *Service) reportLive(ob *openBlob, sync bool) error {
	msg := control.SetLive{Ino: ob.ino, Size: ob.b.Size(), Mtime: ob.mtime.Load(), Sync: sync}
	var ack control.Ack
	if err := s.request(s.subj.SetLive, msg, &ack); err != nil {
		return fmt.Errorf("report size of blob %d: %w", ob.id, err)
	}
	return nil
}

// request sends a control request to the metadata service; a refusal in
// the reply becomes an error.
func (s *Service) request(subj string, msg any, reply interface{ Err() error }) error {
	if err := control.Request(s.opts.NATS, subj, msg, reply, s.opts.RequestTimeout); err != nil {
		return err
	}
	if err := reply.Err(); err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	return nil
}

func (s *Service) onGrant(m *nats.Msg) {
	var g control.Grant
	if err := json.Unmarshal(m.Data, &g); err != nil || g.Blob == 0 || g.Handle == 0 {
		control.Respond(m, control.Ack{Error: "malformed grant"})
		return
	}
	ob, err := s.openBlob(backend.BlobID(g.Blob), g.Ino)
	if err != nil {
		control.Respond(m, control.Ack{Error: err.Error()})
		return
	}
	if g.Truncate {
		if err := ob.b.Truncate(0); err != nil {
			s.releaseBlob(ob)
			control.Respond(m, control.Ack{Error: err.Error()})
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
		control.Respond(m, control.Ack{Error: "handle already granted"})
		return
	}
	hs[g.Handle] = &grant{blob: ob, read: g.Read, write: g.Write}
	s.mu.Unlock()
	s.Stats.Grants.Add(1)
	control.Respond(m, control.Ack{Size: ob.b.Size(), Mtime: ob.mtime.Load(), Wrote: ob.wrote.Load()})
}

func (ob *openBlob) touch() {
	ob.mtime.Store(time.Now().UnixNano())
	ob.wrote.Store(true)
}

func (s *Service) onRevoke(m *nats.Msg) {
	var r control.Revoke
	if err := json.Unmarshal(m.Data, &r); err != nil {
		control.Respond(m, control.Ack{Error: "malformed revoke"})
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
	var ack control.Ack
	for _, g := range gone {
		s.Stats.Grants.Add(-1)
		if r.Handle != 0 {
			ack.Size, ack.Mtime, ack.Wrote = g.blob.b.Size(), g.blob.mtime.Load(), g.blob.wrote.Load()
		}
		s.releaseBlob(g.blob)
	}
	control.Respond(m, ack)
}

func (s *Service) onLive(m *nats.Msg) {
	var q control.LiveQuery
	if err := json.Unmarshal(m.Data, &q); err != nil {
		control.Respond(m, control.Ack{Error: "malformed query"})
		return
	}
	s.mu.Lock()
	ob := s.blobs[backend.BlobID(q.Blob)]
	if ob != nil {
		ob.refs++
	}
	s.mu.Unlock()
	if ob == nil {
		control.Respond(m, control.Ack{Error: "blob not open"})
		return
	}
	control.Respond(m, control.Ack{Size: ob.b.Size(), Mtime: ob.mtime.Load(), Wrote: ob.wrote.Load()})
	s.releaseBlob(ob)
}

func (s *Service) onDelete(m *nats.Msg) {
	var d control.Delete
	if err := json.Unmarshal(m.Data, &d); err != nil || d.Blob == 0 {
		control.Respond(m, control.Ack{Error: "malformed delete"})
		return
	}
	s.mu.Lock()
	_, busy := s.blobs[backend.BlobID(d.Blob)]
	s.mu.Unlock()
	if busy {
		control.Respond(m, control.Ack{Error: "blob is still open"})
		return
	}
	err := s.be.Delete(backend.BlobID(d.Blob))
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		control.Respond(m, control.Ack{Error: err.Error()})
		return
	}
	control.Respond(m, control.Ack{})
}

// openBlob returns the open blob for id, opening it if need be, with one
// reference for the caller. A blob that does not exist yet is created on
// its first write (lazyBlob).
func (s *Service) openBlob(id backend.BlobID, ino uint64) (*openBlob, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ob := s.blobs[id]; ob != nil {
		ob.refs++
		return ob, nil
	}
	var b backend.Blob
	b, err := s.be.Open(id)
	if errors.Is(err, syscall.ENOENT) {
		b, err = &lazyBlob{be: s.be, creates: &s.creates, id: id}, nil // created on first write
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
