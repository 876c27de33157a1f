package metadata

import (
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// openFile is the state of a regular file that some handle has open.
//
// Versions. Every grant and revoke carries a version from one counter of
// the service (Service.version), so the messages of each file are in
// increasing order whatever happens to its open state here: io refuses a
// grant not newer than the last message it applied to the file, and a
// revoke not newer than the grant it would end (one meant for an earlier
// grant of the same handle). Versions start at the incarnation in the top
// bits, so a new incarnation's are newer than any of an earlier one's.
type openFile struct {
	ino ns.Ino
	mu  sync.Mutex // serialises the file's grants and revocations

	// Protected by Service.mu:
	refs    int    // handles open on it
	epoch   uint64 // the io epoch that writers and unpriv count grants of
	writers int    // write grants in that epoch
	unpriv  int    // of which opened by non-root sessions
	lastDV  uint64 // io's data version of the last size report applied
	// timesSet is when utimensat or futimens last set the file's times
	// (Unix ns): a write's mtime from io older than that does not replace
	// them.
	timesSet int64

	// Protected by mu (groups.go):
	grants map[*grantRec]struct{} // the grants io holds on the file
	tenure uint64                 // lease epoch: the version of the grant that began the tenure
}

// openFileRef returns the open state of ino with one more reference.
func (s *Service) openFileRef(ino ns.Ino) *openFile {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.files[ino]
	if f == nil {
		f = &openFile{ino: ino}
		if c, ok := s.closedDV[ino]; ok {
			f.lastDV = c.dv
			delete(s.closedDV, ino)
		}
		s.files[ino] = f
	}
	f.refs++
	return f
}

// closeFileRef drops a reference. The data version of the last report
// applied outlives the open state for closedDVKeep, so that a report that
// arrives late (io's reports after a resync, at its shutdown) cannot take
// a closed file's size back either.
func (s *Service) closeFileRef(f *openFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.refs--; f.refs == 0 {
		delete(s.files, f.ino)
		if f.lastDV != 0 {
			s.keepClosedDVLocked(f.ino, f.lastDV)
		}
	}
}

// closedDVKeep is how long the data version of a closed file's last
// report is kept; closedDVMax bounds how many are (the oldest go first
// when it is reached).
const (
	closedDVKeep = 2 * time.Minute
	closedDVMax  = 1 << 16
)

type closedDV struct {
	dv uint64
	at time.Time
}

// closedEntry is one close, in the order of closes (Service.closedQ).
type closedEntry struct {
	ino ns.Ino
	at  time.Time
}

// keepClosedDVLocked records dv as ino's last report, and forgets, oldest
// first, the ones kept too long or too many; s.mu is held.
func (s *Service) keepClosedDVLocked(ino ns.Ino, dv uint64) {
	now := time.Now()
	s.closedDV[ino] = closedDV{dv: dv, at: now}
	s.closedQ = append(s.closedQ, closedEntry{ino: ino, at: now})
	for len(s.closedQ) > 0 {
		e := s.closedQ[0]
		if now.Sub(e.at) <= closedDVKeep && len(s.closedDV) <= closedDVMax {
			break
		}
		s.closedQ = s.closedQ[1:]
		if c, ok := s.closedDV[e.ino]; ok && c.at.Equal(e.at) {
			delete(s.closedDV, e.ino) // not closed again since
		}
	}
}

// staleForClosedLocked reports whether a report at dv for ino, which is
// not open, is older than one applied before it was closed.
func (s *Service) staleForClosedLocked(ino ns.Ino, dv uint64) bool {
	c, ok := s.closedDV[ino]
	if !ok {
		return false
	}
	if time.Since(c.at) > closedDVKeep {
		delete(s.closedDV, ino)
		return false
	}
	if dv < c.dv {
		return true
	}
	s.closedDV[ino] = closedDV{dv: dv, at: c.at}
	return false
}

// freshSet holds the regular files created since this service started
// that were never granted (control.Grant.Fresh): one bit per inode number
// from base, the first number of this start, so a million creates cost
// 125 KB.
type freshSet struct {
	mu   sync.Mutex
	base ns.Ino
	bits []uint64 // protected by mu
}

func (f *freshSet) add(ino ns.Ino) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ino < f.base {
		return
	}
	i := uint64(ino - f.base)
	for uint64(len(f.bits)) <= i/64 {
		f.bits = append(f.bits, 0)
	}
	f.bits[i/64] |= 1 << (i % 64)
}

func (f *freshSet) has(ino ns.Ino) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ino < f.base {
		return false
	}
	i := uint64(ino - f.base)
	return i/64 < uint64(len(f.bits)) && f.bits[i/64]&(1<<(i%64)) != 0
}

func (f *freshSet) drop(ino ns.Ino) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ino < f.base {
		return
	}
	if i := uint64(ino - f.base); i/64 < uint64(len(f.bits)) {
		f.bits[i/64] &^= 1 << (i % 64)
	}
}

// addWriter counts a write grant of epoch in (d = 1) or out (d = -1).
func (s *Service) addWriter(f *openFile, epoch uint64, unpriv bool, d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.epoch != epoch {
		if d < 0 {
			return // counted in an epoch that is over
		}
		f.epoch, f.writers, f.unpriv = epoch, 0, 0
	}
	f.writers += d
	if unpriv {
		f.unpriv += d
	}
}

// writersNow returns the write grants of the current io epoch on ino.
func (s *Service) writersNow(ino ns.Ino) (all, unpriv int) {
	epoch := s.io.currentEpoch()
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.files[ino]
	if f == nil || f.epoch != epoch || epoch == 0 {
		return 0, 0
	}
	return f.writers, f.unpriv
}

// noteTimesSet records that the times of ino were set explicitly now.
func (s *Service) noteTimesSet(ino ns.Ino) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.files[ino]; f != nil {
		f.timesSet = time.Now().UnixNano()
	}
}

// timesSetOf is when the times of the open file ino were last set
// explicitly (0: never while open).
func (s *Service) timesSetOf(ino ns.Ino) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.files[ino]; f != nil {
		return f.timesSet
	}
	return 0
}

// noteDVIfSame is noteDV of the answer to a revoke that wrote nothing,
// only when the size it reports is the one recorded: other sessions may
// have written the file since the last report applied (the revoke of a
// read grant, or of a kept lease, can come at any time), and noting
// their data version without their size would make the report that
// brings it look stale (and drop it: a size lost).
func (s *Service) noteDVIfSame(ino ns.Ino, f *openFile, ack control.Ack) {
	if a, err := s.ns.GetAttr(ino); err == nil && a.Size == ack.Size {
		s.noteDV(f, ack.DV)
	}
}

// noteDV records that the file was as io reported at data version dv, so
// that an older report is ignored.
func (s *Service) noteDV(f *openFile, dv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.lastDV = max(f.lastDV, dv)
	s.maxDV = max(s.maxDV, dv)
}

// voidGrants forgets every grant: the IO service they were made at is
// gone or is being resynchronised (which drops them there too).
func (s *Service) voidGrants() {
	s.revokes.clear()
}

// errnoOf is the errno a client gets for a failed request to io.
func errnoOf(err error) syscall.Errno {
	var ref *control.Refusal
	if errors.As(err, &ref) && ref.Errno > 0 {
		return syscall.Errno(ref.Errno)
	}
	return syscall.EIO
}

// grant asks the IO service to let the session use h and returns the
// blob's size. The blob is the truth for size: after a crash the
// namespace may hold a stale one, and the first grant puts it right.
func (se *session) grant(h *handle) (int64, error) {
	s := se.svc
	f := h.file
	f.mu.Lock()
	defer f.mu.Unlock()
	_, epoch, err := s.io.current(s.requestTimeout())
	if err == nil {
		err = s.ensureAllocated(h.blob)
	}
	if err == nil {
		err = s.recallLocked(f, se.group, h.pending.Write, epoch)
	}
	var ack control.Ack
	var ver uint64
	if err == nil {
		g := *h.pending
		g.Ver = s.version.Add(1)
		ver = g.Ver
		g.Fresh = s.fresh.has(h.ino)
		err = s.request(s.subj.Grant, g, &ack)
		var ref *control.Refusal
		if err != nil && !errors.As(err, &ref) && !errors.Is(err, errIODown) {
			// No answer: the grant may have reached io anyway. Revoke it,
			// so that it cannot outlive this failure; and the file may
			// have a blob from now on.
			s.revokes.add(control.Revoke{Session: g.Session, Handle: g.Handle, Blob: g.Blob, Ver: s.version.Add(1)}, epoch)
			s.fresh.drop(h.ino)
		}
	}
	if err != nil {
		s.Stats.GrantFailures.Add(1)
		s.log.Error("grant failed", "ino", h.ino, "session", se.id, "error", err)
		return 0, errnoOf(err)
	}
	s.Stats.Grants.Add(1)
	s.fresh.drop(h.ino) // it may have a blob from now on
	g := h.pending
	h.pending, h.grantEpoch = nil, epoch
	h.write, h.unpriv = g.Write, g.Write && se.cred.UID != 0
	h.rec = &grantRec{sid: se.id, id: g.Handle, group: se.group, write: h.write, unpriv: h.unpriv, epoch: epoch, at: time.Now(),
		// Its last grant was recalled before it served a request; never
		// two in a row (a holder that never uses its grants must not make
		// every recaller wait).
		protected: h.prev != nil && h.prev.unused.Load() && !h.prev.protected}
	h.prev = nil
	f.addGrantLocked(h.rec, ver, epoch)
	if h.write {
		s.addWriter(f, epoch, h.unpriv, 1)
	}
	if a, err := s.ns.GetAttr(h.ino); err == nil && (ack.Size != a.Size || g.Truncate) {
		_ = s.applyLive(h.ino, ack.Size, max(a.Mtime, ack.Mtime), ack.DV)
	} else {
		s.noteDV(f, ack.DV) // reports older than what io had now are stale
	}
	s.sized.add(h.ino, epoch) // its namespace size is io's: later readers may claim (caps.go)
	return ack.Size, nil
}

// revoke ends h's grant at the IO service: io stops taking requests on it,
// waits for the ones in flight and reports the final size and mtime, which
// are recorded. A grant of an io epoch that is over needs nothing: that io
// dropped it.
func (se *session) revoke(id uint64, h *handle) error {
	s := se.svc
	if h.grantEpoch == 0 {
		return nil
	}
	epoch := h.grantEpoch
	rec := h.rec
	h.grantEpoch, h.rec = 0, nil
	if epoch != s.io.currentEpoch() {
		return nil // (and its writer count is of an epoch that is over)
	}
	f := h.file
	f.mu.Lock()
	if !f.dropGrantLocked(rec) {
		f.mu.Unlock()
		return nil // another group's grant recalled it, and recorded what io said
	}
	if h.write {
		defer s.addWriter(f, epoch, h.unpriv, -1)
	}
	r := control.Revoke{Session: se.id, Handle: id, Blob: h.blob, Ver: s.version.Add(1)}
	var ack control.Ack
	err := s.request(s.subj.Revoke, r, &ack)
	f.mu.Unlock()
	if err != nil {
		var ref *control.Refusal
		if !errors.As(err, &ref) && !errors.Is(err, errIODown) {
			s.revokes.add(r, epoch) // io may still hold it: make sure it goes
		}
		s.log.Error("revoke failed", "ino", h.ino, "session", se.id, "error", err)
		return syscall.EIO
	}
	s.Stats.Revokes.Add(1)
	return s.revokedAck(f, ack, h.unpriv)
}

// liveAttr overlays the IO service's live size and mtime on a regular
// file's attributes while some session may be writing it.
func (s *Service) liveAttr(a ns.Attr) ns.Attr {
	if a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return a
	}
	if s.io.needFirstResync() {
		// Just started: io may hold this file's size from grants of the
		// previous incarnation, which the first resync records.
		s.io.waitFirstResync()
		if na, err := s.ns.GetAttr(a.Ino); err == nil {
			a = na
		}
	}
	all, unpriv := s.writersNow(a.Ino)
	if all == 0 {
		return a
	}
	var ack control.Ack
	if size, mtime, wrote, ok := s.liveFromTable(a.Blob); ok {
		ack.Size, ack.Mtime, ack.Wrote = size, mtime, wrote
	} else {
		s.liveN.nats.Add(1)
		if err := s.request(s.subj.Live, control.LiveQuery{Blob: a.Blob}, &ack); err != nil {
			s.log.Warn("live attributes unavailable", "ino", a.Ino, "error", err)
			return a
		}
	}
	a.Size = ack.Size
	if ack.Wrote && ack.Mtime > s.timesSetOf(a.Ino) {
		a.Mtime, a.Ctime = ack.Mtime, max(a.Ctime, ack.Mtime)
		// Some non-root writer may have written: Linux would have dropped
		// setuid/setgid at that write.
		if unpriv > 0 && s.ns.KillPriv(a.Ino) == nil {
			if na, err := s.ns.GetAttr(a.Ino); err == nil {
				a.Mode = na.Mode
			}
		}
	}
	return a
}

// retrier sends revocations again until io acknowledges them or the io
// epoch they belong to ends (a resync drops every grant at io anyway).
type retrier struct {
	s     *Service
	mu    sync.Mutex
	queue []pendingRevoke // protected by mu
	wake  chan struct{}
}

type pendingRevoke struct {
	r        control.Revoke
	epoch    uint64
	attempts int
	next     time.Time
	// answered, if set, runs once io answered the revoke: ack nil when
	// io refused it (it held no such grant).
	answered func(ack *control.Ack)
}

func newRetrier(s *Service) *retrier { return &retrier{s: s, wake: make(chan struct{}, 1)} }

func (q *retrier) add(r control.Revoke, epoch uint64) { q.addThen(r, epoch, nil) }

// addThen is add, with answered to run when io answers the revoke (not
// when its io epoch ends: a resync drops the grant and everything about
// it).
func (q *retrier) addThen(r control.Revoke, epoch uint64, answered func(ack *control.Ack)) {
	q.mu.Lock()
	q.queue = append(q.queue, pendingRevoke{r: r, epoch: epoch, next: time.Now(), answered: answered})
	q.mu.Unlock()
	q.kick()
}

func (q *retrier) kick() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *retrier) clear() {
	q.mu.Lock()
	q.queue = nil
	q.mu.Unlock()
}

func (q *retrier) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-q.s.stop:
			return
		case <-q.wake:
		case <-t.C:
		}
		now := time.Now()
		q.mu.Lock()
		var due []pendingRevoke
		keep := q.queue[:0]
		for _, p := range q.queue {
			if p.next.After(now) {
				keep = append(keep, p)
			} else {
				due = append(due, p)
			}
		}
		q.queue = keep
		q.mu.Unlock()
		for _, p := range due {
			if p.epoch != q.s.io.currentEpoch() {
				continue // that io epoch is over: its grants are gone
			}
			q.s.Stats.RevokeRetries.Add(1)
			var ack control.Ack
			err := q.s.request(q.s.subj.Revoke, p.r, &ack)
			var ref *control.Refusal
			if err == nil || errors.As(err, &ref) {
				// Done, or io says there is nothing to revoke.
				if p.answered != nil {
					if err == nil {
						p.answered(&ack)
					} else {
						p.answered(nil)
					}
				}
				continue
			}
			p.attempts++
			p.next = time.Now().Add(backoff(p.attempts))
			q.mu.Lock()
			q.queue = append(q.queue, p)
			q.mu.Unlock()
		}
		q.mu.Lock()
		next := time.Hour
		for _, p := range q.queue {
			next = min(next, time.Until(p.next))
		}
		q.mu.Unlock()
		t.Reset(max(next, time.Millisecond))
	}
}

// backoff is the wait before attempt n+1 of a failed control request:
// doubling from 100ms to 30s.
func backoff(attempts int) time.Duration {
	d := 100 * time.Millisecond << min(attempts-1, 9)
	return min(d, 30*time.Second)
}
