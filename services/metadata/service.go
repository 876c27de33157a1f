// Package metadata is the metadata service: the namespace, the authoritative
// permission table, open handles and the grants that let a session touch a
// file's blob through the IO service (docs/architecture.md). The namespace
// and its write-ahead log live in package ns; this package serves it on
// rings and speaks to the IO service over NATS.
//
// Every request is checked against the credentials the kernel reported for
// the client at its handshake (SO_PEERCRED, plus the supplementary groups
// read from /proc at that moment). Opening a regular file checks
// permissions and returns a handle; the client's first read or write on it
// asks for the grant (OpGrant), which completes only after the IO service
// acknowledged it (an open with O_TRUNC grants at once, to empty the blob).
// Closing revokes the grant first and then records the size and mtime the
// IO service reports.
package metadata

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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
	"github.com/weir-storage/weir/services/metadata/ns"
)

// ServiceName is the service's name on NATS: Start registers it as a NATS
// micro service with the endpoints "health" (Health) and "stats"
// (Stats.Snapshot), which `weir status` and `nats micro` query.
const ServiceName = "weir-metadata"

// Options configure a metadata service.
type Options struct {
	Socket   string     // Unix socket clients connect to
	NS       ns.Options // where and how the namespace is persisted
	NATS     *nats.Conn // control plane; not owned
	Ring     ring.Config
	WaitMode ring.WaitMode
	Logger   hclog.Logger
	// RequestTimeout bounds each control request to the IO service.
	RequestTimeout time.Duration
	// NATSNamespace starts every NATS subject of the stack (control.SubjectsIn)
	// and the service's health and stats endpoints; "" means
	// control.DefaultNamespace. The IO service must use the same.
	NATSNamespace string
	// Version is the version the service reports on NATS; "" means
	// "0.0.0-dev".
	Version string
}

// Stats are the service's counters.
type Stats struct {
	Sessions atomic.Int64
	Requests atomic.Uint64
	Opens    atomic.Uint64
	Handles  atomic.Int64
	Errors   atomic.Uint64 // requests answered with an errno
}

// Snapshot returns the counters for the stats endpoint.
func (s *Stats) Snapshot() map[string]any {
	return map[string]any{
		"sessions": s.Sessions.Load(), "requests": s.Requests.Load(), "opens": s.Opens.Load(),
		"handles": s.Handles.Load(), "errors": s.Errors.Load(),
	}
}

// Service is the metadata service.
type Service struct {
	opts Options
	log  hclog.Logger
	ns   *ns.NS
	subj control.Subjects // immutable after New

	mu       sync.Mutex
	sessions map[uint64]*session // by id; protected by mu
	writers  map[ns.Ino]writers  // open write grants per inode; protected by mu
	nextSID  uint64              // protected by mu
	nextH    atomic.Uint64       // handle ids, unique across sessions

	subs   []*nats.Subscription // immutable after Start
	ctl    micro.Service        // health and stats endpoints; immutable after Start
	srv    ringsrv.Server       // client sessions
	dels   chan uint64          // blobs to delete at the IO service (deleteLoop)
	bg     sync.WaitGroup       // deleteLoop
	ready  chan struct{}
	closed atomic.Bool

	Stats Stats
}

// New opens (and recovers) the namespace; Start makes the service serve.
func New(opts Options) (*Service, error) {
	if opts.Socket == "" || opts.NATS == nil {
		return nil, errors.New("metadata: Socket and NATS are required")
	}
	if opts.NATSNamespace == "" {
		opts.NATSNamespace = control.DefaultNamespace
	}
	if err := control.CheckNamespace(opts.NATSNamespace); err != nil {
		return nil, fmt.Errorf("metadata: nats namespace: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	if opts.NS.Logger == nil {
		opts.NS.Logger = opts.Logger.Named("ns")
	}
	n, err := ns.Open(opts.NS)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	return &Service{
		opts: opts, log: opts.Logger, ns: n, subj: control.SubjectsIn(opts.NATSNamespace),
		sessions: make(map[uint64]*session),
		writers:  make(map[ns.Ino]writers),
		dels:     make(chan uint64, 1<<16),
		ready:    make(chan struct{}),
	}, nil
}

// NS exposes the namespace (for checks and tests).
func (s *Service) NS() *ns.NS { return s.ns }

// Start subscribes to the control subjects, registers the health and
// stats endpoints (ServiceName), accepts client sessions and starts
// deleting the blobs of files orphaned by the last shutdown.
func (s *Service) Start() error {
	subs, err := ringsrv.Subscribe(s.opts.NATS, map[string]nats.MsgHandler{
		s.subj.Session: s.onSession,
		s.subj.SetLive: s.onSetLive,
	})
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	s.subs = subs
	s.ctl, err = control.Register(s.opts.NATS, control.ServiceInfo{
		Name: ServiceName, Version: s.opts.Version, Namespace: s.opts.NATSNamespace,
		Description: "namespace, permissions, handles",
	}, s.Health, func() any { return s.Stats.Snapshot() })
	if err != nil {
		ringsrv.Unsubscribe(s.subs)
		return fmt.Errorf("metadata: %w", err)
	}
	s.srv = ringsrv.Server{Socket: s.opts.Socket, Ring: s.opts.Ring, Mode: s.opts.WaitMode, Log: s.log,
		New: func() ringsrv.Session { return newSession(s) }}
	if err := s.srv.Start(); err != nil {
		_ = s.ctl.Stop()
		ringsrv.Unsubscribe(s.subs)
		return fmt.Errorf("metadata: %w", err)
	}
	s.bg.Add(1)
	go s.deleteLoop()
	for _, b := range s.ns.Orphans() {
		s.queueDelete(b)
	}
	close(s.ready)
	s.log.Info("serving", "socket", s.opts.Socket)
	return nil
}

// Ready is closed once the service accepts sessions.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Health says whether the service does its job: nil while it accepts
// sessions and can change the namespace; otherwise why not: not started
// or shut down, the namespace read-only after a WAL failure (sticky: only
// a restart, which recovers from the WAL, clears it), or a ring listener
// that no longer accepts. It is what the health endpoint reports; safe to
// call at any time, from any goroutine.
func (s *Service) Health() error {
	select {
	case <-s.ready:
	default:
		return errors.New("metadata: not started")
	}
	if s.closed.Load() {
		return errors.New("metadata: shut down")
	}
	if err := s.ns.Err(); err != nil {
		return fmt.Errorf("metadata: namespace is read-only: %w", err)
	}
	if err := s.srv.Err(); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	return nil
}

// queueDelete hands a blob whose file lost its last name and last open to
// the deleter: the reply to an unlink or close does not wait for the IO
// service. A crash before the delete leaves the blob behind, exactly as a
// crash between the namespace change and a synchronous delete would;
// `weir check` reports it as an orphan blob.
func (s *Service) queueDelete(blob uint64) {
	if blob == 0 {
		return
	}
	select {
	case s.dels <- blob:
	default: // the queue is full: delete in the caller, as backpressure
		if err := s.deleteBlob(blob); err != nil {
			s.log.Warn("blob delete failed; weir check will report it", "blob", blob, "error", err)
		}
	}
}

// deleteLoop asks the IO service to delete queued blobs, retrying while it
// is unreachable (it may start after this service). After Shutdown closed
// the queue it makes one more attempt for each blob left.
func (s *Service) deleteLoop() {
	defer s.bg.Done()
	for b := range s.dels {
		for attempt := 0; ; attempt++ {
			err := s.deleteBlob(b)
			if err == nil {
				break
			}
			if s.closed.Load() && attempt > 0 {
				s.log.Warn("blob delete failed; weir check will report it", "blob", b, "error", err)
				break
			}
			s.log.Debug("blob delete deferred", "blob", b, "error", err)
			time.Sleep(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second))
		}
	}
}

// supplementaryGroups reads a process's groups from /proc. SO_PEERCRED
// gives only the primary gid; a process that cannot be read gets none.
func supplementaryGroups(pid int32) []uint32 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		var gs []uint32
		for _, f := range strings.Fields(rest) {
			if g, err := strconv.ParseUint(f, 10, 32); err == nil {
				gs = append(gs, uint32(g))
			}
		}
		return gs
	}
	return nil
}

// Shutdown withdraws the health and stats endpoints, stops accepting,
// ends every session (revoking its grants) and closes the namespace with
// a final checkpoint.
func (s *Service) Shutdown(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	if s.ctl != nil {
		control.Deregister(s.opts.NATS, s.ctl)
	}
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("metadata: shutdown: %w", err)
	}
	// Every session has ended: nothing queues deletes any more.
	close(s.dels)
	s.bg.Wait()
	ringsrv.Unsubscribe(s.subs)
	if err := s.ns.Close(); err != nil {
		return fmt.Errorf("metadata: close namespace: %w", err)
	}
	return nil
}

// request sends a control request to the IO service; a refusal in the
// reply becomes an error.
func (s *Service) request(subj string, msg any) (control.Ack, error) {
	var ack control.Ack
	if err := control.Request(s.opts.NATS, subj, msg, &ack, s.opts.RequestTimeout); err != nil {
		return ack, err
	}
	if err := ack.Err(); err != nil {
		return ack, fmt.Errorf("%s: %w", subj, err)
	}
	return ack, nil
}

func (s *Service) deleteBlob(blob uint64) error {
	_, err := s.request(s.subj.Delete, control.Delete{Blob: blob})
	return err
}

// onSession vouches for a session to the IO service: the token must match
// and the answer is who the kernel said the client is.
func (s *Service) onSession(m *nats.Msg) {
	var q control.SessionQuery
	if err := json.Unmarshal(m.Data, &q); err != nil {
		control.Respond(m, control.SessionInfo{Error: "malformed query"})
		return
	}
	s.mu.Lock()
	se := s.sessions[q.Session]
	s.mu.Unlock()
	if se == nil || subtle.ConstantTimeCompare(se.token[:], q.Token) != 1 {
		control.Respond(m, control.SessionInfo{Error: "unknown session or wrong token"})
		return
	}
	control.Respond(m, control.SessionInfo{UID: se.cred.UID, GID: se.cred.GID, PID: se.pid})
}

// onSetLive records a file's size and mtime reported by the IO service.
func (s *Service) onSetLive(m *nats.Msg) {
	var l control.SetLive
	if err := json.Unmarshal(m.Data, &l); err != nil {
		control.Respond(m, control.Ack{Error: "malformed setlive"})
		return
	}
	err := s.ns.SetLive(ns.Ino(l.Ino), l.Size, l.Mtime)
	if err == nil && l.Sync {
		err = s.ns.Sync()
	}
	if err != nil {
		control.Respond(m, control.Ack{Error: err.Error()})
		return
	}
	control.Respond(m, control.Ack{})
}

// writers counts the write grants open on one inode.
type writers struct {
	all    int
	unpriv int // of which opened by non-root sessions
}

// addWriter counts a write grant in (d = 1) or out (d = -1).
func (s *Service) addWriter(ino ns.Ino, unpriv bool, d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.writers[ino]
	w.all += d
	if unpriv {
		w.unpriv += d
	}
	if w.all <= 0 {
		delete(s.writers, ino)
		return
	}
	s.writers[ino] = w
}

// liveAttr overlays the IO service's live size and mtime on a regular
// file's attributes while some session may be writing it.
func (s *Service) liveAttr(a ns.Attr) ns.Attr {
	if a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return a
	}
	s.mu.Lock()
	w := s.writers[a.Ino]
	s.mu.Unlock()
	if w.all == 0 {
		return a
	}
	ack, err := s.request(s.subj.Live, control.LiveQuery{Blob: a.Blob})
	if err != nil {
		s.log.Warn("live attributes unavailable", "ino", a.Ino, "error", err)
		return a
	}
	a.Size = ack.Size
	if ack.Wrote {
		a.Mtime, a.Ctime = ack.Mtime, max(a.Ctime, ack.Mtime)
		// Some non-root writer may have written: Linux would have dropped
		// setuid/setgid at that write.
		if w.unpriv > 0 && s.ns.KillPriv(a.Ino) == nil {
			if na, err := s.ns.GetAttr(a.Ino); err == nil {
				a.Mode = na.Mode
			}
		}
	}
	return a
}
