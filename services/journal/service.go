package journal

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/internal/journalproto"
	"github.com/weir-storage/weir/ring"
)

// ServiceName is the service's micro service name.
var ServiceName = control.RoleJournal.ServiceName()

// Options configure a journal service.
type Options struct {
	// IOSocket is the IO service's journal socket (io.journal_socket).
	IOSocket string
	NATS     *nats.Conn // the service's authenticated connection; not owned
	Logger   hclog.Logger
	// NATSNamespace and Version as for the other services.
	NATSNamespace, Version string
	// RequestTimeout bounds each request to the metadata service.
	RequestTimeout time.Duration
	// Interval is how long a pass waits for a poke from io before it
	// checkpoints what is there (default 200ms): the longest a record
	// stays live while nothing asks for room.
	Interval time.Duration
}

// DefaultInterval is Options.Interval's default.
const DefaultInterval = 200 * time.Millisecond

// batchBytes is the buffer of one batch: at most (batchBytes - header) /
// journalproto.File files, within host.PeerRing's arena.
const batchBytes = 32 << 10

// Stats are the service's counters (weir status).
type Stats struct {
	Passes    atomic.Uint64 // batches committed
	Files     atomic.Uint64 // files checkpointed
	Empty     atomic.Uint64 // passes that found nothing to do
	Failures  atomic.Uint64 // passes that failed (retried)
	Stale     atomic.Uint64 // batches io refused at commit as stale (a metadata restart): retried
	CommitNs  atomic.Uint64 // total time of committed passes
	LastFiles atomic.Uint64 // files of the last committed batch
}

// Service is a journal service.
type Service struct {
	opts Options
	log  hclog.Logger
	host *host.Host
	peer *host.Peer

	Stats   Stats
	lastErr atomic.Pointer[error]
	up      chan struct{} // a signal per session that came up
	stop    chan struct{}
	done    chan struct{}
	started atomic.Bool
}

// New returns a journal service; Start runs it.
func New(opts Options) (*Service, error) {
	if opts.IOSocket == "" {
		return nil, errors.New("journal: the IO service's journal socket is required")
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	// io waits at most MaxWaitMs for work; a wait under a millisecond
	// would be none.
	opts.Interval = min(max(opts.Interval, time.Millisecond), journalproto.MaxWaitMs*time.Millisecond)
	h, err := host.New(host.Options{
		Name: ServiceName, Description: "checkpoints the staging log: home locations through io, inode fields to metadata",
		Version: opts.Version, Namespace: opts.NATSNamespace, NATS: opts.NATS, Logger: opts.Logger,
		RequestTimeout: opts.RequestTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return &Service{opts: opts, log: opts.Logger, host: h,
		up: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start registers the service on NATS, opens the session with io (kept up
// from then on) and starts the passes.
func (s *Service) Start() error {
	if err := s.host.Start(s.Health, s.Snapshot); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	s.peer = host.DialPeer(s.opts.IOSocket, string(control.RoleJournal), s.log.Named("peer"), func(up bool) {
		if up {
			select {
			case s.up <- struct{}{}:
			default:
			}
		}
	})
	s.started.Store(true)
	go s.run()
	s.log.Info("serving", "io_socket", s.opts.IOSocket, "interval", s.opts.Interval)
	return nil
}

// Ready is closed once the service is registered on NATS.
func (s *Service) Ready() <-chan struct{} { return s.host.Ready() }

// Shutdown stops the passes (a pass in flight ends first: its batch is
// committed or dropped, never half-trimmed), the session and the host.
func (s *Service) Shutdown(ctx context.Context) error {
	if s.started.CompareAndSwap(true, false) {
		close(s.stop)
		select {
		case <-s.done:
		case <-ctx.Done():
		}
		s.peer.Close()
	}
	return s.host.Shutdown(ctx)
}

// Health is nil while the service can do its work: the session with io
// is up.
func (s *Service) Health() error {
	if err := s.host.Health(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if s.peer != nil && !s.peer.Up() {
		return fmt.Errorf("journal: no session with the IO service at %s", s.opts.IOSocket)
	}
	return nil
}

// Snapshot returns the service's state for weir status.
func (s *Service) Snapshot() map[string]any {
	m := map[string]any{
		"io_connected":     s.peer != nil && s.peer.Up(),
		"passes":           s.Stats.Passes.Load(),
		"files":            s.Stats.Files.Load(),
		"empty_passes":     s.Stats.Empty.Load(),
		"failed_passes":    s.Stats.Failures.Load(),
		"stale_batches":    s.Stats.Stale.Load(),
		"last_batch_files": s.Stats.LastFiles.Load(),
	}
	if n := s.Stats.Passes.Load(); n > 0 {
		m["commit_us_mean"] = s.Stats.CommitNs.Load() / n / 1000
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		m["cpu_user_ms"] = ru.Utime.Sec*1000 + int64(ru.Utime.Usec)/1000
		m["cpu_system_ms"] = ru.Stime.Sec*1000 + int64(ru.Stime.Usec)/1000
	}
	if p := s.lastErr.Load(); p != nil {
		m["last_error"] = (*p).Error()
	}
	return m
}

// run does passes until Shutdown. After a failed pass the next one waits
// in io for a resync of io by the metadata service (the usual end of a
// failure: metadata was down) or for a backoff from the interval to 5s,
// whichever comes first; a new session with io cuts the backoff too.
func (s *Service) run() {
	defer close(s.done)
	backoff := s.opts.Interval
	var failures uint64
	var warned string
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		c := s.peer.Client()
		if c == nil || c.Err() != nil {
			select {
			case <-s.stop:
				return
			case <-s.up:
				backoff, failures = s.opts.Interval, 0
			case <-time.After(min(s.opts.Interval, 20*time.Millisecond)):
			}
			continue
		}
		wait := s.opts.Interval
		if failures > 0 {
			wait = backoff
		}
		err := s.pass(c, wait, failures)
		if err == nil {
			backoff, failures = s.opts.Interval, 0
			warned = ""
			s.lastErr.Store(nil)
			continue
		}
		if errors.Is(err, ring.ErrPeerGone) || errors.Is(err, ring.ErrClosed) {
			continue // the session ended: the peer dials again
		}
		failures++
		s.Stats.Failures.Add(1)
		s.lastErr.Store(&err)
		if err.Error() != warned {
			warned = err.Error()
			s.log.Warn("checkpoint pass did not finish; it is tried again", "error", err, "retry_within", backoff)
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// errAgain: io has nothing to give yet (its log not open); not a failure.
var errAgain = errors.New("journal: the IO service's staging log is not open yet")

// pass runs one checkpoint pass on session c: io may wait up to wait
// for work (failures: the failed passes before this one).
func (s *Service) pass(c *ring.Client, wait time.Duration, failures uint64) error {
	// No cancellation: io's wait is at most Interval, and a pass's
	// device work is not cut short (Shutdown waits for it).
	ctx := context.Background()
	buf, err := c.Alloc(ctx, batchBytes)
	if err != nil {
		return fmt.Errorf("journal: batch buffer: %w", err)
	}
	defer buf.Release()
	comp, err := c.Do(ctx, &ring.Call{Op: journalproto.OpNext, Arg: uint32(min(wait.Milliseconds(), journalproto.MaxWaitMs)), Offset: failures, Buf: buf})
	if err != nil {
		return fmt.Errorf("journal: next batch: %w", err)
	}
	switch {
	case comp.Result == -int64(syscall.EAGAIN):
		select {
		case <-s.stop:
		case <-time.After(s.opts.Interval):
		}
		return nil
	case comp.Result < 0:
		return fmt.Errorf("journal: next batch: %w", comp.Err())
	case comp.Result == 0:
		s.Stats.Empty.Add(1)
		return nil
	}
	start := time.Now()
	raw := make([]byte, batchBytes)
	buf.CopyTo(raw)
	b, err := journalproto.DecodeBatch(raw, int(comp.Result))
	if err != nil {
		return fmt.Errorf("journal: next batch: %w", err)
	}
	// Home locations first: each file durable at home, its inode fields
	// as of then.
	msg := control.SetLiveBatch{Live: make([]control.SetLive, 0, len(b.Files))}
	rep, err := c.Alloc(ctx, journalproto.ReportSize)
	if err != nil {
		return fmt.Errorf("journal: report buffer: %w", err)
	}
	defer rep.Release()
	var rb [journalproto.ReportSize]byte
	for _, f := range b.Files {
		comp, err := c.Do(context.Background(), &ring.Call{Op: journalproto.OpCheckpoint, Handle: f.Blob, Offset: b.ID, Buf: rep})
		if err != nil {
			return fmt.Errorf("journal: checkpoint blob %d: %w", f.Blob, err)
		}
		if comp.Result < 0 {
			return fmt.Errorf("journal: checkpoint blob %d (inode %d): %w", f.Blob, f.Ino, comp.Err())
		}
		if comp.Result == 0 {
			continue // being deleted: nothing to commit
		}
		rep.CopyTo(rb[:])
		r, err := journalproto.DecodeReport(rb[:])
		if err != nil {
			return fmt.Errorf("journal: checkpoint blob %d: %w", f.Blob, err)
		}
		msg.Live = append(msg.Live, control.SetLive{Ino: f.Ino, Size: r.Size, Mtime: r.Mtime, DV: r.DV})
	}
	// The journal commit: every file's inode fields in one synced WAL
	// record at the metadata service.
	var reply control.SetLiveBatchReply
	if len(msg.Live) > 0 {
		if err := s.host.Request(context.Background(), s.host.Subjects().SetLiveBatch, msg, &reply); err != nil {
			return fmt.Errorf("journal: commit %d files to the metadata service: %w", len(msg.Live), err)
		}
	}
	// Then the trim. The files metadata says are gone: only the batch's,
	// each once.
	inBatch := make(map[uint64]bool, len(msg.Live))
	for _, l := range msg.Live {
		inBatch[l.Ino] = true
	}
	var goneInos []uint64
	for _, ino := range reply.Gone {
		if inBatch[ino] {
			goneInos = append(goneInos, ino)
			delete(inBatch, ino)
		}
	}
	call := &ring.Call{Op: journalproto.OpCommit, Offset: b.ID}
	if len(goneInos) > 0 {
		gone := journalproto.EncodeInodes(goneInos)
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		gb, err := c.Alloc(actx, len(gone))
		if err != nil {
			return fmt.Errorf("journal: commit buffer: %w", err)
		}
		defer gb.Release()
		gb.CopyFrom(gone)
		call.Buf = gb
	}
	comp, err = c.Do(context.Background(), call)
	if err != nil {
		return fmt.Errorf("journal: trim: %w", err)
	}
	if comp.Result == -int64(syscall.ESTALE) {
		s.Stats.Stale.Add(1)
		return nil // the next batch covers the same records
	}
	if comp.Result < 0 {
		return fmt.Errorf("journal: trim up to lsn %d: %w", b.Upto, comp.Err())
	}
	s.Stats.Passes.Add(1)
	s.Stats.Files.Add(uint64(len(b.Files)))
	s.Stats.LastFiles.Store(uint64(len(b.Files)))
	s.Stats.CommitNs.Add(uint64(time.Since(start)))
	return nil
}
