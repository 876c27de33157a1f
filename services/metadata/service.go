// Package metadata is the metadata service: the namespace, the authoritative
// permission table, open handles and the grants that let a session touch a
// file's blob through the IO service (docs/architecture.md). The namespace
// and its write-ahead log live in package ns; this package serves it on
// rings and speaks to the IO service over NATS, on the service skeleton of
// package host.
//
// Every request is checked against the credentials the kernel reported for
// the client at its handshake (SO_PEERCRED, plus the supplementary groups
// read from /proc at that moment). Opening a regular file checks
// permissions and returns a handle; the client's first read or write on it
// asks for the grant (proto.OpGrant), which completes only after the IO
// service acknowledged it (an open with O_TRUNC grants at once, to empty
// the blob). Closing revokes the grant first: the IO service stops taking
// requests on the handle, finishes the ones in flight and reports the
// final size and mtime, which this service records.
//
// The IO service keeps a service session with this one (ServiceSocket):
// while it is up, and once the IO service has been resynchronised for this
// incarnation, grants and revocations go to io; when it ends (io stopped or
// died) every request to io in flight fails at once and new ones fail
// with EIO without waiting for a timeout.
//
// Incarnations. Every start of the service is a new incarnation (package
// ns persists the number). Session ids and handles carry it, so none is
// reused across restarts, and the resync at the IO service's session makes
// io drop every grant of an earlier incarnation. A client whose metadata
// session died reopens its files with the tickets its opens returned
// (proto.FeatureReopen); files it had unlinked while open are held for
// them for ReclaimGrace.
package metadata

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// ServiceName is the service's name on NATS: Start registers it as a NATS
// micro service with the endpoints "health" (Health) and "stats"
// (Snapshot), which `weir status` and `nats micro` query.
const ServiceName = "weir-metadata"

// DefaultReclaimGrace is how long files unlinked while open are held after
// a restart for their holders to reopen.
const DefaultReclaimGrace = 30 * time.Second

// Options configure a metadata service.
type Options struct {
	Socket string // Unix socket clients connect to
	// ServiceSocket is where the IO service opens its service session; ""
	// means none can, and every request to io fails (a namespace alone).
	ServiceSocket string
	NS            ns.Options // where and how the namespace is persisted
	NATS          *nats.Conn // the service's authenticated connection; not owned
	Ring          ring.Config
	WaitMode      ring.WaitMode
	Logger        hclog.Logger
	// RequestTimeout bounds each control request to the IO service.
	RequestTimeout time.Duration
	// NATSNamespace starts every NATS subject of the stack
	// (control.SubjectsIn) and the service's health and stats endpoints;
	// "" means control.DefaultNamespace. The IO service must use the same.
	NATSNamespace string
	// Version is the version the service reports on NATS; "" means
	// "0.0.0-dev".
	Version string
	// ReclaimGrace is how long after a start files that were unlinked
	// while open stay for their holders to reopen; 0 means
	// DefaultReclaimGrace.
	ReclaimGrace time.Duration
	// TrustGroups is which sessions share leases without checks:
	// GroupsByUID ("" too), GroupsByProcess or GroupsBySession
	// (groups.go).
	TrustGroups string
	// NamedGroups puts uids into named trust groups, whatever the mode:
	// uid -> group name.
	NamedGroups map[uint32]string
	// MinTenure is how long a protected grant is safe from another
	// group's recall (groups.go): 0 means DefaultMinTenure, negative none.
	MinTenure time.Duration
	// Limits bound each uid's handshakes and sessions on Socket, and name
	// the uids LeasesShare does not bind (docs/architecture.md, "Limits
	// per uid").
	Limits host.Limits
	// LeasesShare is the part, in percent, of the kept read leases one
	// uid's sessions may keep idle (leases.go); 0 means 100.
	LeasesShare int
	// RecordCuts: the IO service keeps no staging log, so sessions
	// record each truncate's size here before io cuts the blob
	// (proto.FeatureRecordCuts, cuts.go).
	RecordCuts bool
}

// Stats are the service's counters.
type Stats struct {
	Sessions atomic.Int64
	Requests atomic.Uint64
	Opens    atomic.Uint64
	Reopens  atomic.Uint64
	Inherits atomic.Uint64 // OpInherit: a handle of a description shared across fork or exec
	Handles  atomic.Int64
	Errors   atomic.Uint64 // requests answered with an errno

	Grants         atomic.Uint64 // grants io acknowledged
	GrantFailures  atomic.Uint64 // grants io refused or did not answer
	Revokes        atomic.Uint64 // revocations io acknowledged
	RevokeRetries  atomic.Uint64 // revocations sent again after a failure
	StaleReports   atomic.Uint64 // size reports older than one already applied: ignored
	CutsRecorded   atomic.Uint64 // truncates' sizes recorded before io cut (cuts.go)
	LiveBatches    atomic.Uint64 // checkpoint batches of the journal service committed
	Resyncs        atomic.Uint64 // resynchronisations of the IO service
	OrphansFound   atomic.Uint64 // blobs of no file found in the backend, now deleted
	DeletesDone    atomic.Uint64
	DeleteFailures atomic.Uint64 // attempts that failed (each is retried)
	LeaseOpens     atomic.Uint64 // opens that used the session's kept lease: no grant (leases.go)
	LeasesEnded    atomic.Uint64 // kept leases revoked (session end, chmod/chown, delete, too many idle)
}

// Snapshot returns the counters for the stats endpoint.
func (s *Service) Snapshot() map[string]any {
	st := &s.Stats
	p50, p99 := s.recallStats.percentiles()
	m := map[string]any{
		"sessions": st.Sessions.Load(), "requests": st.Requests.Load(), "opens": st.Opens.Load(),
		"reopens": st.Reopens.Load(), "inherits": st.Inherits.Load(), "handles": st.Handles.Load(), "errors": st.Errors.Load(),
		"grants": st.Grants.Load(), "grant_failures": st.GrantFailures.Load(),
		"revokes": st.Revokes.Load(), "revoke_retries": st.RevokeRetries.Load(),
		"stale_reports": st.StaleReports.Load(), "cuts_recorded": st.CutsRecorded.Load(), "resyncs": st.Resyncs.Load(), "live_batches": st.LiveBatches.Load(),
		"orphans_found":   st.OrphansFound.Load(),
		"deletes_pending": s.dels.pending(), "deletes_done": st.DeletesDone.Load(),
		"delete_failures": st.DeleteFailures.Load(),
		"leases":          s.leases.count(), "lease_opens": st.LeaseOpens.Load(), "leases_ended": st.LeasesEnded.Load(),
		"dir_gen_bumps": s.dg.bumps.Load(), "dir_snapshot_pages": s.dg.snaps.Load(),
		"caps_minted": s.capsN.Minted.Load(), "caps_refused_grants": s.capsN.ThroughIO.Load(),
		"live_from_table": s.liveN.table.Load(), "live_queries": s.liveN.nats.Load(),
		"recalls": s.recallStats.recalls.Load(), "recall_waits": s.recallStats.waits.Load(), "recalls_unused": s.recallStats.unused.Load(), "recall_notices": s.recallStats.notices.Load(), "recall_p50_us": p50, "recall_p99_us": p99,
		"trust_groups": cmp.Or(s.opts.TrustGroups, GroupsByUID),
		"incarnation":  s.inc, "io_connected": s.io.isUp(),
	}
	m["limits_leases_over_share"] = s.leases.OverShare.Load()
	maps.Copy(m, s.host.Counters())
	return m
}

// Service is the metadata service.
type Service struct {
	opts Options
	log  hclog.Logger
	ns   *ns.NS
	host *host.Host
	subj control.Subjects // immutable after New
	inc  uint32           // this incarnation; immutable after New
	key  [32]byte         // ticket key; immutable after New

	mu          sync.Mutex
	sessions    map[uint64]*session      // by id; protected by mu
	files       map[ns.Ino]*openFile     // open files; protected by mu
	closedDV    map[ns.Ino]closedDV      // last report of recently closed files (files.go); protected by mu
	closedQ     []closedEntry            // their closes, oldest first; protected by mu
	maxDV       uint64                   // newest data version applied or noted; protected by mu
	nextSID     uint64                   // protected by mu
	nextH       atomic.Uint64            // handle counter, unique across sessions
	version     atomic.Uint64            // version of the last grant or revoke (files.go)
	fresh       freshSet                 // files created in this start and never granted (files.go)
	io          ioLink                   // the IO service's session and resync
	dels        *deleter                 // blob deletes at the IO service
	alloc       allocation               // blob ids io accepts grants for
	revokes     *retrier                 // revocations to send again
	leases      *leaseTable              // kept read leases (leases.go)
	caps        atomic.Pointer[capEpoch] // the capability key of the current io epoch (caps.go)
	dg          dirGen                   // directory snapshots' generation (dirgen.go)
	live        liveTables               // io's live tables (live.go)
	liveN       liveStats
	sized       sizedSet // files whose size io reported in this io epoch (caps.go)
	capsN       capStats
	recallStats recallStats       // recalls between trust groups (groups.go)
	reclaim     *time.Timer       // ReleaseHeld after the grace; protected by mu
	started     time.Time         // when Start began the grace; protected by mu
	macs        sync.Pool         // keyed HMAC states for tickets (tickets.go)
	locks       *lockTable        // advisory locks (locks.go)
	reopened    map[uint64]uint64 // handle of the last incarnation -> the session that reopened it by ticket; protected by mu
	// The orphan scan runs once per start, after a resync.
	orphanMu    sync.Mutex
	orphansDone bool           // protected by orphanMu
	bg          sync.WaitGroup // background goroutines
	stop        chan struct{}  // closed by Shutdown
	closed      atomic.Bool

	Stats Stats
}

// New opens (and recovers) the namespace; Start makes the service serve.
func New(opts Options) (*Service, error) {
	if opts.Socket == "" || opts.NATS == nil {
		return nil, errors.New("metadata: Socket and NATS are required")
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if err := validGroups(opts.TrustGroups); err != nil {
		return nil, err
	}
	if opts.ReclaimGrace <= 0 {
		opts.ReclaimGrace = DefaultReclaimGrace
	}
	if opts.NS.Logger == nil {
		opts.NS.Logger = opts.Logger.Named("ns")
	}
	var s *Service // the endpoints run once Start registered them, after New
	h, err := host.New(host.Options{
		Name: ServiceName, Description: "namespace, permissions, handles", Version: opts.Version,
		Namespace: opts.NATSNamespace, NATS: opts.NATS, Logger: opts.Logger, RequestTimeout: opts.RequestTimeout,
		Endpoints: map[string]func([]byte) (any, error){
			control.LeasesEndpoint:      func([]byte) (any, error) { return s.Leases(), nil },
			control.LeaseRevokeEndpoint: func(b []byte) (any, error) { return s.revokeLeasesBody(b) },
		},
	})
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	n, err := ns.Open(opts.NS)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	s = &Service{
		locks: newLockTable(),
		opts:  opts, log: opts.Logger, ns: n, host: h, subj: h.Subjects(),
		inc: n.Incarnation(), key: n.TicketKey(),
		sessions: make(map[uint64]*session),
		files:    make(map[ns.Ino]*openFile),
		closedDV: make(map[ns.Ino]closedDV),
		leases:   newLeaseTable(),
		stop:     make(chan struct{}),
	}
	s.leases.setShare(opts.LeasesShare, s.opts.Limits.Exempts)
	s.version.Store(uint64(s.inc) << proto.CounterBits)
	s.dg.gen.Store(1) // (0 is no generation: io honours no snapshot of it)
	s.fresh.base = ns.Ino(n.NextIno())
	s.io.init()
	s.dels = newDeleter(s)
	s.revokes = newRetrier(s)
	return s, nil
}

// firstResyncWait bounds how long after a start a stat of a regular file
// waits for the IO service's first resync (io reconnects within a quarter
// second when it is up; when it is not, stats must not hang for a long
// request timeout).
const firstResyncWait = 5 * time.Second

// requestTimeout bounds a control request to io.
func (s *Service) requestTimeout() time.Duration {
	if s.opts.RequestTimeout > 0 {
		return s.opts.RequestTimeout
	}
	return host.DefaultRequestTimeout
}

// NS exposes the namespace (for checks and tests).
func (s *Service) NS() *ns.NS { return s.ns }

// Incarnation is this start's incarnation number.
func (s *Service) Incarnation() uint32 { return s.inc }

// Start subscribes to the control subjects, accepts client sessions and
// the IO service's service session, registers the health and stats
// endpoints (ServiceName), starts deleting the blobs awaiting deletion and
// the clock of the reclaim grace.
func (s *Service) Start() error {
	s.mu.Lock()
	s.started = time.Now()
	s.reopened = map[uint64]uint64{}
	s.mu.Unlock()
	s.host.Handle(s.subj.Session, s.onSession)
	s.host.Handle(s.subj.SetLive, s.onSetLive)
	s.host.Handle(s.subj.SetLiveBatch, s.onSetLiveBatch)
	s.host.Serve(&host.Listener{Socket: s.opts.Socket, Ring: s.opts.Ring, Mode: s.opts.WaitMode,
		New: func() host.Session { return newSession(s) }, Limits: s.opts.Limits})
	if s.opts.ServiceSocket != "" {
		s.host.ServePeers(s.opts.ServiceSocket, []string{string(control.RoleIO)}, s.onPeer)
		// An IO service that ran on reconnects soon: until its first
		// resync, a stat of a file it may hold waits for that.
		s.io.expectIO(time.Now().Add(min(s.requestTimeout(), firstResyncWait)))
	}
	if err := s.host.Start(s.Health, s.Snapshot); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	for _, b := range s.ns.PendingDeletes() {
		s.dels.add(b)
	}
	s.bg.Add(3)
	go func() { defer s.bg.Done(); s.dels.run() }()
	go func() { defer s.bg.Done(); s.revokes.run() }()
	go func() { defer s.bg.Done(); s.leaseEnder() }()
	if held := s.ns.Held(); len(held) > 0 {
		s.log.Info("files unlinked while open are held for their holders to reopen", "files", len(held), "grace", s.opts.ReclaimGrace)
	}
	s.mu.Lock()
	s.reclaim = time.AfterFunc(s.opts.ReclaimGrace, s.releaseHeld)
	s.mu.Unlock()
	s.log.Info("serving", "socket", s.opts.Socket, "incarnation", s.inc)
	return nil
}

// releaseHeld frees the files unlinked while open before the restart that
// nobody reopened within the grace, and deletes their blobs.
func (s *Service) releaseHeld() {
	if s.closed.Load() {
		return
	}
	s.mu.Lock()
	s.reopened = nil // the grace is over: no ticket is accepted any more
	s.mu.Unlock()
	blobs, err := s.ns.ReleaseHeld()
	if err != nil {
		s.log.Error("release held files", "error", err)
		return
	}
	if len(blobs) > 0 {
		s.log.Info("reclaim grace over: files unlinked while open before the restart are freed", "blobs", len(blobs))
	}
	for _, b := range blobs {
		s.dels.add(b)
	}
}

// Ready is closed once the service accepts sessions.
func (s *Service) Ready() <-chan struct{} { return s.host.Ready() }

// Health says whether the service does its job: nil while it accepts
// sessions and can change the namespace; otherwise why not: not started
// or shut down, a listener that no longer accepts, or the namespace
// read-only after a WAL failure (sticky: only a restart, which recovers
// from the WAL, clears it). It is what the health endpoint reports; safe
// to call at any time, from any goroutine.
func (s *Service) Health() error {
	if err := s.host.Health(); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if err := s.ns.Err(); err != nil {
		return fmt.Errorf("metadata: namespace is read-only: %w", err)
	}
	return nil
}

// Shutdown withdraws the health and stats endpoints, ends every session
// (revoking its grants, recording the sizes io reports), tries once more
// each blob delete still pending (those that fail stay pending in the
// namespace for the next start), and closes the namespace with a final
// checkpoint.
func (s *Service) Shutdown(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.mu.Lock()
	if s.reclaim != nil {
		s.reclaim.Stop()
	}
	s.mu.Unlock()
	err := s.host.Shutdown(ctx)
	close(s.stop)
	s.bg.Wait()
	s.closeLiveTables() // the sessions are gone: no stat reads them
	s.dels.final(ctx)
	if cerr := s.ns.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("close namespace: %w", cerr))
	}
	if err != nil {
		return fmt.Errorf("metadata: shutdown: %w", err)
	}
	return nil
}

// onPeer follows the IO service's service session.
func (s *Service) onPeer(role string, up bool) {
	if role != string(control.RoleIO) {
		return
	}
	if !up {
		s.io.down()
		if !s.closed.Load() {
			s.log.Warn("IO service session ended: requests to io fail at once until it is back")
		}
		return
	}
	epoch := s.io.up()
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.resync(epoch)
	}()
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

// onSession vouches for a session to the IO service: the token must match
// and the answer is who the kernel said the client is.
func (s *Service) onSession(m *nats.Msg) {
	var q control.SessionQuery
	if err := control.Decode(m.Data, &q); err != nil {
		s.host.Refuse(m, "malformed", control.SessionInfo{}, err.Error())
		return
	}
	if q.Session == 0 || len(q.Token) != proto.TokenSize {
		s.host.Refuse(m, "malformed", control.SessionInfo{}, "session 0 or a token that is not 32 bytes")
		return
	}
	s.mu.Lock()
	se := s.sessions[q.Session]
	s.mu.Unlock()
	if se == nil || subtle.ConstantTimeCompare(se.token[:], q.Token) != 1 {
		s.host.Refuse(m, "unknown_session", control.SessionInfo{}, fmt.Sprintf("session %#x unknown or the token is wrong", q.Session))
		return
	}
	control.Respond(m, control.SessionInfo{UID: se.cred.UID, GID: se.cred.GID, PID: se.pid})
}

// onSetLive records a file's size and mtime reported by the IO service,
// unless a newer report for the file was applied already.
func (s *Service) onSetLive(m *nats.Msg) {
	var l control.SetLive
	if err := control.Decode(m.Data, &l); err != nil {
		s.host.Refuse(m, "malformed", control.Ack{}, err.Error())
		return
	}
	if l.Ino == 0 || l.Size < 0 || l.DV == 0 {
		s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("ino %d, size %d, data version %d", l.Ino, l.Size, l.DV))
		return
	}
	a, err := s.ns.GetAttr(ns.Ino(l.Ino))
	if err != nil || a.IsDir() {
		s.host.Refuse(m, "unknown_file", control.Ack{}, fmt.Sprintf("inode %d is not a file", l.Ino))
		return
	}
	err = s.applyLive(ns.Ino(l.Ino), l.Size, l.Mtime, l.DV)
	if err == nil && l.Sync {
		err = s.ns.Sync()
	}
	if err != nil {
		control.Respond(m, control.Ack{Error: err.Error()})
		return
	}
	control.Respond(m, control.Ack{})
}

// onSetLiveBatch records the sizes and mtimes of a checkpoint's files
// (from the journal service) and makes them durable with one WAL sync:
// the journal's commit. Files that are gone are named in the reply.
func (s *Service) onSetLiveBatch(m *nats.Msg) {
	var b control.SetLiveBatch
	if err := control.Decode(m.Data, &b); err != nil {
		s.host.Refuse(m, "malformed", control.SetLiveBatchReply{}, err.Error())
		return
	}
	if len(b.Live) > control.MaxLiveBatch {
		s.host.Refuse(m, "malformed", control.SetLiveBatchReply{}, fmt.Sprintf("%d files in one batch; at most %d", len(b.Live), control.MaxLiveBatch))
		return
	}
	for _, l := range b.Live {
		if l.Ino == 0 || l.Size < 0 || l.DV == 0 || l.Mtime < 0 || l.Sync {
			s.host.Refuse(m, "malformed", control.SetLiveBatchReply{}, fmt.Sprintf("ino %d, size %d, mtime %d, data version %d, sync %v", l.Ino, l.Size, l.Mtime, l.DV, l.Sync))
			return
		}
	}
	var reply control.SetLiveBatchReply
	for _, l := range b.Live {
		a, err := s.ns.GetAttr(ns.Ino(l.Ino))
		if err != nil || a.IsDir() {
			reply.Gone = append(reply.Gone, l.Ino)
			continue
		}
		if err := s.applyLive(ns.Ino(l.Ino), l.Size, l.Mtime, l.DV); err != nil {
			control.Respond(m, control.SetLiveBatchReply{Error: err.Error()})
			return
		}
	}
	if err := s.ns.Sync(); err != nil {
		control.Respond(m, control.SetLiveBatchReply{Error: err.Error()})
		return
	}
	s.Stats.LiveBatches.Add(1)
	control.Respond(m, reply)
}

// applyLive records a size and mtime from io if dv is newer than the
// last report applied to the file, so that a size never goes backwards.
func (s *Service) applyLive(ino ns.Ino, size, mtime int64, dv uint64) error {
	if mtime == 0 { // io knows of no write: keep the recorded mtime
		if a, err := s.ns.GetAttr(ino); err == nil {
			mtime = a.Mtime
		}
	}
	s.mu.Lock()
	f := s.files[ino]
	if f != nil && mtime <= f.timesSet {
		// The times were set after the write this mtime is of: keep
		// them, record only the size.
		s.mu.Unlock()
		if a, err := s.ns.GetAttr(ino); err == nil {
			mtime = a.Mtime
		}
		s.mu.Lock()
		f = s.files[ino]
	}
	// Data versions are unique per change: an equal one describes the
	// state already applied (a report of a grant's state, say), an older
	// one a state that a newer report replaced.
	if (f != nil && dv < f.lastDV) || (f == nil && s.staleForClosedLocked(ino, dv)) {
		s.mu.Unlock()
		s.Stats.StaleReports.Add(1)
		return nil
	}
	if f != nil {
		f.lastDV = dv
	}
	s.maxDV = max(s.maxDV, dv)
	s.mu.Unlock()
	err := s.ns.SetLive(ino, size, mtime)
	if errors.Is(err, syscall.ENOENT) {
		return nil // the file is gone: nothing to record
	}
	return err
}
