package metadata

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// errIODown is the cause of a request to io made while its service
// session is not up (or not yet resynchronised): clients get EIO at once.
var errIODown = errors.New("the IO service is not connected")

// ioLink is the state of the IO service's service session. Each session
// is an epoch: requests of an epoch carry its context, which is cancelled
// the moment the session ends, so a request in flight to a dead io fails
// at once instead of waiting out its timeout.
type ioLink struct {
	mu       sync.Mutex
	epoch    uint64             // sessions so far; protected by mu
	conn     bool               // a session is up; protected by mu
	resynced bool               // the resync of this epoch completed; protected by mu
	ctx      context.Context    // of this epoch; protected by mu
	cancel   context.CancelFunc // protected by mu
	changed  chan struct{}      // closed and replaced at every change; protected by mu
	// everResynced: some epoch's resync completed since this service
	// started, so the sizes io held for earlier grants are recorded.
	everResynced bool      // protected by mu
	firstBy      time.Time // see expectIO; protected by mu
}

func (l *ioLink) init() {
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.cancel()
	l.changed = make(chan struct{})
}

func (l *ioLink) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// up starts a new epoch and returns its number.
func (l *ioLink) up() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel()
	l.epoch++
	l.conn, l.resynced = true, false
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.notifyLocked()
	return l.epoch
}

// down ends the epoch: its requests fail now.
func (l *ioLink) down() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel()
	l.conn, l.resynced = false, false
	l.notifyLocked()
}

// markResynced makes epoch's requests possible, if it is still current.
func (l *ioLink) markResynced(epoch uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.epoch != epoch || !l.conn {
		return false
	}
	l.resynced, l.everResynced = true, true
	l.notifyLocked()
	return true
}

// expectIO starts the window in which a stat waits for the first resync:
// the IO service reconnects within it after this service (re)starts.
func (l *ioLink) expectIO(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.firstBy = until
}

// needFirstResync reports whether a stat should wait for the first
// resync: none completed yet, and the window of expectIO is open.
func (l *ioLink) needFirstResync() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.everResynced && time.Now().Before(l.firstBy)
}

// waitFirstResync waits until some resync completed since this service
// started (before that, the sizes of files written through grants of the
// previous incarnation may not be recorded yet), or until the window of
// expectIO closes.
func (l *ioLink) waitFirstResync() {
	for {
		l.mu.Lock()
		done, changed, deadline := l.everResynced, l.changed, l.firstBy
		l.mu.Unlock()
		if done || !time.Now().Before(deadline) {
			return
		}
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
			return
		}
	}
}

func (l *ioLink) isUp() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn && l.resynced
}

// current returns the context and epoch for a request to io, or
// errIODown at once when io is not connected. While the session is up but
// its resync is still running it waits for the resync, at most wait.
func (l *ioLink) current(wait time.Duration) (context.Context, uint64, error) {
	deadline := time.Now().Add(wait)
	for {
		l.mu.Lock()
		conn, resynced, changed := l.conn, l.resynced, l.changed
		ctx, epoch := l.ctx, l.epoch
		l.mu.Unlock()
		switch {
		case !conn:
			return nil, 0, errIODown
		case resynced:
			return ctx, epoch, nil
		}
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
			return nil, 0, errIODown
		}
	}
}

// epochCtx returns epoch's context, whether or not its resync completed
// (for the resync itself), or errIODown if epoch is over.
func (l *ioLink) epochCtx(epoch uint64) (context.Context, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.epoch != epoch || !l.conn {
		return nil, errIODown
	}
	return l.ctx, nil
}

// wait returns a channel closed at the next change.
func (l *ioLink) wait() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// currentEpoch is the epoch whose grants are valid (0: none).
func (l *ioLink) currentEpoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.conn {
		return 0
	}
	return l.epoch
}

// request sends a control request to io in the current epoch.
func (s *Service) request(subj string, msg any, reply interface{ Err() error }) error {
	ctx, _, err := s.io.current(s.requestTimeout())
	if err != nil {
		return err
	}
	return s.host.Request(ctx, subj, msg, reply)
}

// allocChunk is how far beyond the next inode number io is told blob ids
// are allocated, so that a create costs no message to io.
const allocChunk = 4096

// allocation is the limit below which io accepts grants: every blob id
// below it was allocated (blob ids are inode numbers).
type allocation struct {
	mu    sync.Mutex
	limit uint64 // what io was last told; protected by mu
}

// ensure tells io, if need be, that blob is allocated.
func (s *Service) ensureAllocated(blob uint64) error {
	s.alloc.mu.Lock()
	defer s.alloc.mu.Unlock()
	if blob < s.alloc.limit {
		return nil
	}
	limit := s.nextAllocLimit()
	if err := s.ns.PromiseAlloc(limit); err != nil {
		return fmt.Errorf("record the allocation limit: %w", err)
	}
	var ack control.Ack
	if err := s.request(s.subj.Alloc, control.Alloc{Limit: limit}, &ack); err != nil {
		return fmt.Errorf("raise the allocation limit: %w", err)
	}
	s.alloc.limit = limit
	return nil
}

// resync brings the IO service up to date for this incarnation when its
// service session starts: io drops every grant of an earlier incarnation
// (or of an io that died, which had all of them) and learns the
// allocation limit; then the orphan blobs are found and deleted; then
// grants and revocations may go to io. It retries until it succeeds or the
// epoch ends.
func (s *Service) resync(epoch uint64) {
	// Grants made through a previous io are void: that io is gone.
	s.voidGrants()
	for attempt := 0; ; attempt++ {
		ctx, err := s.io.epochCtx(epoch)
		if err != nil {
			return
		}
		err = s.resyncIO(ctx, epoch)
		if err == nil {
			break
		}
		s.log.Warn("resync of the IO service failed; retrying", "error", err, "attempt", attempt+1)
		select {
		case <-s.stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second)):
		}
	}
	if !s.io.markResynced(epoch) {
		return
	}
	s.Stats.Resyncs.Add(1)
	s.log.Info("IO service resynchronised", "incarnation", s.inc, "allocated_below", s.allocLimit())
	s.revokes.kick()
	s.scanOrphans(epoch)
	s.dels.kick()
}

// scanOrphans finds the orphan blobs once per start of this service, in
// the first io epoch that lets it finish.
func (s *Service) scanOrphans(epoch uint64) {
	s.orphanMu.Lock()
	defer s.orphanMu.Unlock()
	for attempt := 0; !s.orphansDone; attempt++ {
		ctx, err := s.io.epochCtx(epoch)
		if err != nil {
			return // the next epoch tries again
		}
		if err = s.reclaimOrphans(ctx); err == nil {
			s.orphansDone = true
			return
		}
		s.log.Warn("orphan scan failed; retrying", "error", err, "attempt", attempt+1)
		select {
		case <-s.stop:
			return
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second)):
		}
	}
}

// nextAllocLimit is the limit to tell io next: allocChunk past the next
// inode number. It is recorded (ns.PromiseAlloc) before io is told, so
// that after a restart no new inode gets a number io may have made a blob
// for.
func (s *Service) nextAllocLimit() uint64 {
	return min(s.ns.NextIno()+allocChunk, uint64(ns.MaxIno)+1)
}

func (s *Service) allocLimit() uint64 {
	s.alloc.mu.Lock()
	defer s.alloc.mu.Unlock()
	return s.alloc.limit
}

func (s *Service) resyncIO(ctx context.Context, epoch uint64) error {
	s.alloc.mu.Lock()
	limit := s.nextAllocLimit()
	if err := s.ns.PromiseAlloc(limit); err != nil {
		// A namespace that went read-only (its WAL failed) creates
		// nothing more: io gets the limit already promised, and reads go
		// on (of files created since that promise, in this life, too
		// young to be below it, grants fail: the service is unhealthy
		// and wants a restart anyway).
		promised := s.ns.AllocLimit()
		if s.ns.Err() == nil || promised == 0 {
			s.alloc.mu.Unlock()
			return fmt.Errorf("record the allocation limit: %w", err)
		}
		s.log.Warn("namespace is read-only: resynchronising io with the allocation limit recorded before", "limit", promised, "error", err)
		limit = promised
	}
	var r control.ResyncReply
	s.mu.Lock()
	floor := s.maxDV
	s.mu.Unlock()
	msg := control.Resync{Incarnation: s.inc, AllocLimit: limit, DVFloor: floor,
		Stack: control.FormatStack(s.ns.StackID()), Empty: s.ns.Empty(), DirGen: s.dg.gen.Load()}
	err := s.host.Request(ctx, s.subj.Resync, msg, &r)
	if err == nil {
		s.alloc.limit = limit
	}
	s.alloc.mu.Unlock()
	if err != nil {
		return err
	}
	// The sizes the dropped grants left: recorded before any grant of
	// this epoch, and before a stat that waited for the resync answers.
	for _, l := range r.Live {
		if l.Ino == 0 || l.Size < 0 || l.DV == 0 {
			return fmt.Errorf("resync: bad size report %+v", l)
		}
		if err := s.applyLive(ns.Ino(l.Ino), l.Size, l.Mtime, l.DV); err != nil {
			return fmt.Errorf("resync: record the size of file %d: %w", l.Ino, err)
		}
	}
	s.setCapKey(epoch, r.CapKey)
	s.setLiveTable(epoch, r.LiveTable, r.LiveTableID)
	return nil
}

// blobsPage is how many blob ids one Blobs request asks for.
const blobsPage = 2048

// reclaimOrphans lists the backend's blobs and marks every one that no
// file owns and no pending delete covers as awaiting deletion: blobs left
// by a create that raced a crash, or by anything else that lost track of
// them. They are deleted like any other.
func (s *Service) reclaimOrphans(ctx context.Context) error {
	after := uint64(0)
	found := 0
	for {
		var page control.BlobsReply
		if err := s.host.Request(ctx, s.subj.Blobs, control.BlobsQuery{After: after, Max: blobsPage}, &page); err != nil {
			return fmt.Errorf("list blobs: %w", err)
		}
		for _, b := range page.Blobs {
			if b <= after {
				return fmt.Errorf("list blobs: %d after %d: not ascending", b, after)
			}
			after = b
			if s.ns.PendingDelete(b) {
				continue
			}
			if ns.Ino(b) > ns.MaxIno {
				// No inode can have made it (nor io: the allocation limit).
				s.log.Warn("blob past the largest inode number: not weir's, left alone", "blob", b)
				continue
			}
			if a, err := s.ns.GetAttr(ns.Ino(b)); err == nil && a.Blob == b {
				continue
			}
			if err := s.ns.MarkDead(b); err != nil && !errors.Is(err, syscall.EEXIST) {
				return fmt.Errorf("mark orphan blob %d: %w", b, err)
			} else if err == nil {
				found++
				s.Stats.OrphansFound.Add(1)
				s.dels.add(b)
			}
		}
		if !page.More {
			break
		}
	}
	if found > 0 {
		s.log.Warn("orphan blobs found in the backend (no file owns them): deleting them", "blobs", found)
	}
	return nil
}
