package metadata

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weir-storage/weir/internal/control"
)

// Trust groups and the file's grant registry (issue 13).
//
// A trust group is a set of sessions that trust each other: they share a
// file's leases without any check between them. Which sessions form one
// is Options.TrustGroups:
//
//   - "uid" (the default): the sessions of one uid. Processes of one
//     user can already ptrace each other, read each other's memory and
//     open each other's files, so isolating them from each other would
//     cost every hand-over between them and protect nothing the kernel
//     does not already give away.
//   - "process": the sessions of one process (pid), the strict mode: two
//     processes of one user then hand a written file over as two users'
//     processes do.
//   - "session": every session alone, stricter still (a process that
//     dials twice has two groups; tests use it to make groups in one
//     process).
//
// Options.NamedGroups put uids into one named group whatever the mode
// (config: trust_group "name" { uids = [...] }): the processes of those
// users share leases as one user's do.
//
// Every grant io holds is in its file's registry (openFile.grants, under
// the file's lock), with its session's group and its access. A grant for
// writing is the group's exclusive lease of the file; one for reading
// only, a shared lease. Before io is asked for a grant, every grant of
// another group it conflicts with (a write grant, or any grant when the
// new one writes) is recalled: revoked at io, whose revoke is a barrier
// (no new request on it is served, and the answer waits for those in
// flight), and marked revoked for its session, whose next OpGrant of the
// handle asks for a new grant (which recalls in turn). Nothing waits for
// the holder: a client holds nothing a recall must flush, as every write
// it made is in io's cache when the write returns; a holder that is
// stopped, looping or dead delays the recaller by io's revoke, and at
// most MinTenure more if its grant is protected (below; docs/architecture.md,
// "Exclusive leases"). The holder learns of the recall from
// io's EBADF on its next request, and asks again.
//
// Progress: two groups that conflict on a file could take it from each
// other forever with no request served between (a grant is made, and
// recalled by the other's before its holder's first request reaches io).
// io's answer to a recall's revoke says whether the grant served a
// request (control.Ack.Unused); a handle whose grant was recalled unused
// gets its next grant protected: it is not recalled before it is
// MinTenure old (DefaultMinTenure, 250 µs; config
// metadata.lease_min_tenure), the recaller waiting out the rest. So a
// holder's next grant serves it if its request reaches io within
// MinTenure, and a recaller waits at most MinTenure plus io's revoke;
// grants that are used (the common case, a ping-pong of writers) are
// recalled with no wait at all. Never two protected grants in a row: a
// holder that never uses its grants (hostile, or stopped) must not make
// every recall wait.
//
// A file's lease epoch is the version of the grant that began its
// current tenure: it changes at every recall and whenever a grant finds
// the file with no grant, and increases over the service's life (versions
// start at the incarnation). A writer's OpGrant reports it, so that what
// the holder wrote under one tenure can be told from another's.

// Trust-group modes (Options.TrustGroups).
const (
	GroupsByUID     = "uid"
	GroupsByProcess = "process"
	GroupsBySession = "session"
)

// groupOf returns the trust group of a session.
func (s *Service) groupOf(sid uint64, pid int32, uid uint32) string {
	if name, ok := s.opts.NamedGroups[uid]; ok {
		return "group:" + name
	}
	switch s.opts.TrustGroups {
	case GroupsByProcess:
		return "pid:" + strconv.Itoa(int(pid))
	case GroupsBySession:
		return "session:" + strconv.FormatUint(sid, 16)
	}
	return "uid:" + strconv.FormatUint(uint64(uid), 10)
}

// validGroups checks the trust-group options.
func validGroups(mode string) error {
	switch mode {
	case "", GroupsByUID, GroupsByProcess, GroupsBySession:
		return nil
	}
	return fmt.Errorf("metadata: trust groups %q: want %q, %q or %q", mode, GroupsByUID, GroupsByProcess, GroupsBySession)
}

// grantRec is one grant io holds, in its file's registry.
type grantRec struct {
	sid    uint64 // the session
	id     uint64 // the data handle io knows the grant by
	group  string
	write  bool
	unpriv bool      // a write grant of a non-root session (a write drops setuid/setgid)
	epoch  uint64    // io epoch of the grant
	at     time.Time // when it was made
	// protected: the grant's holder lost its last one to a recall before
	// using it, so this one is not recalled before it is MinTenure old.
	protected bool
	tenure    uint64 // the file's lease epoch when it was made (under f.mu)

	// revoked is set, under the file's lock, when another group's grant
	// recalled it; its session (which reads it without the lock) then
	// asks for a new grant.
	revoked atomic.Bool
	// unused is set, before revoked, when io answered the recall's revoke
	// saying the grant served no request: the session's next grant of the
	// handle is protected.
	unused atomic.Bool
}

// addGrantLocked records a grant io acknowledged; f.mu is held. It
// begins a new tenure (epoch ver) if the file had no live grant.
func (f *openFile) addGrantLocked(r *grantRec, ver, ioEpoch uint64) {
	if f.grants == nil {
		f.grants = map[*grantRec]struct{}{}
	}
	live := false
	for o := range f.grants {
		if o.epoch == ioEpoch {
			live = true
		} else {
			delete(f.grants, o) // void: io dropped it with its epoch
		}
	}
	if !live || f.tenure == 0 {
		f.tenure = ver
	}
	r.tenure = f.tenure
	f.grants[r] = struct{}{}
}

// dropGrantLocked forgets a grant that was revoked; f.mu is held. It
// reports whether the caller is the one that ended it (false: a recall
// did, and reported what io said).
func (f *openFile) dropGrantLocked(r *grantRec) bool {
	if r == nil {
		return true
	}
	if r.revoked.Load() {
		return false
	}
	delete(f.grants, r)
	return true
}

// recallAnswered ends grant record r of f, whose recall's revoke io did
// not answer in time, once the retrier's revoke of it was answered (ack
// nil: refused, io held no such grant): what recallLocked would have
// done then. A record a later recall already ended is left alone.
func (s *Service) recallAnswered(f *openFile, r *grantRec, ack *control.Ack) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.grants[r]; !ok {
		return
	}
	delete(f.grants, r)
	if ack != nil {
		if err := s.revokedAck(f, *ack, r.unpriv); err != nil {
			s.log.Warn("recording a recalled grant's size", "ino", f.ino, "error", err)
		}
	}
	if r.write {
		s.addWriter(f, r.epoch, r.unpriv, -1)
	}
}

// errRecallFailed: io did not answer a recall's revoke, so the grant it
// would have ended may still be in force, and no conflicting one is made.
var errRecallFailed = errors.New("a conflicting grant of another trust group could not be revoked")

// conflictsLocked says whether f has a grant of ioEpoch of a group other
// than group that a new grant (for writing if write) conflicts with, what
// recallLocked would recall; f.mu is held.
func (s *Service) conflictsLocked(f *openFile, group string, write bool, ioEpoch uint64) bool {
	for r := range f.grants {
		if r.epoch == ioEpoch && r.group != group && (r.write || write) {
			return true
		}
	}
	return false
}

// recallLocked revokes at io every grant on f of a group other than
// group that a new grant (for writing if write) conflicts with, and
// starts a new tenure if it revoked any; f.mu is held. ioEpoch is the io
// epoch the new grant is for.
func (s *Service) recallLocked(f *openFile, group string, write bool, ioEpoch uint64) error {
	var conflicts []*grantRec
	for r := range f.grants {
		switch {
		case r.epoch != ioEpoch:
			delete(f.grants, r) // void
		case r.group != group && (r.write || write):
			conflicts = append(conflicts, r)
		}
	}
	if len(conflicts) == 0 {
		return nil
	}
	start := time.Now()
	if hold := s.minTenure(); hold > 0 {
		var young time.Time
		for _, r := range conflicts {
			if r.protected && r.at.After(young) {
				young = r.at
			}
		}
		if wait := hold - start.Sub(young); !young.IsZero() && wait > 0 {
			time.Sleep(wait) // each grant gets its tenure (above)
			s.recallStats.waits.Add(1)
		}
	}
	for _, r := range conflicts {
		rv := control.Revoke{Session: r.sid, Handle: r.id, Blob: uint64(f.ino), Ver: s.version.Add(1)}
		// Marked before io is asked: io refuses requests on it from the
		// moment it takes the revoke, and the holder's OpGrant after that
		// EBADF must find it recalled (it then waits for the file's lock,
		// which this recall holds), not granted.
		r.revoked.Store(true)
		var ack control.Ack
		err := s.request(s.subj.Revoke, rv, &ack)
		if err != nil {
			var ref *control.Refusal
			if !errors.As(err, &ref) && !errors.Is(err, errIODown) {
				// io may still hold it, or may have revoked it after the
				// timeout: the retrier makes sure it goes, and it stays in
				// the registry (no conflicting grant is made while io may
				// honour it) but marked revoked, so that its holder's next
				// OpGrant grants it anew (a newer version, which the
				// retrier's older revoke cannot end) instead of answering
				// "granted" to a handle io refuses. The next recall sends
				// its revoke again.
				// Once io answers the retried revoke, the record goes as
				// a recall's would: out of the registry, its size
				// recorded and its writer counted out.
				s.revokes.addThen(rv, ioEpoch, func(ack *control.Ack) { s.recallAnswered(f, r, ack) })
				s.log.Error("recall failed", "ino", f.ino, "session", r.sid, "error", err)
				return errRecallFailed
			}
			// Refused (io holds no such grant) or io gone: either way it
			// is not in force.
		} else {
			s.Stats.Revokes.Add(1)
		}
		if err == nil && ack.Unused {
			r.unused.Store(true)
			s.recallStats.unused.Add(1)
		}
		delete(f.grants, r)
		s.recallStats.recalls.Add(1)
		s.noticeRecall(r.sid, r.id)
		if err == nil {
			if rerr := s.revokedAck(f, ack, r.unpriv); rerr != nil {
				s.log.Warn("recording a recalled grant's size", "ino", f.ino, "error", rerr)
			}
		}
		// After its size is recorded: with no writer counted, stat
		// answers from the namespace.
		if r.write {
			s.addWriter(f, r.epoch, r.unpriv, -1)
		}
	}
	f.tenure = 0 // the grant being made begins the next
	s.recallStats.observe(time.Since(start))
	return nil
}

// revokedAck records what io reported when it revoked a grant: the
// file's size and mtime, if the grant wrote; and a write by a non-root
// session drops setuid and setgid.
func (s *Service) revokedAck(f *openFile, ack control.Ack, unpriv bool) error {
	if !ack.Wrote {
		s.noteDVIfSame(f.ino, f, ack)
		return nil
	}
	err := s.applyLive(f.ino, ack.Size, ack.Mtime, ack.DV)
	if unpriv {
		if kerr := s.ns.KillPriv(f.ino); kerr != nil && !errors.Is(kerr, syscall.ENOENT) && err == nil {
			err = kerr
		}
	}
	return err
}

// recallStats counts recalls and keeps the durations of the last
// recallWindow, for their percentiles in the stats.
type recallStats struct {
	recalls atomic.Uint64 // grants recalled by another group's
	unused  atomic.Uint64 // recalled grants that had served no request
	notices atomic.Uint64 // recalled grants told to their sessions (notices.go)
	waits   atomic.Uint64 // recall passes that waited for a protected grant's MinTenure

	mu   sync.Mutex
	last []time.Duration // a ring of the last recallWindow recall passes' durations
	next int
}

const recallWindow = 1024

func (r *recallStats) observe(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.last) < recallWindow {
		r.last = append(r.last, d)
		return
	}
	r.last[r.next] = d
	r.next = (r.next + 1) % recallWindow
}

// percentiles returns the p50 and p99 recall durations in µs (0 if none).
func (r *recallStats) percentiles() (p50, p99 float64) {
	r.mu.Lock()
	d := slices.Clone(r.last)
	r.mu.Unlock()
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	at := func(q float64) float64 {
		return float64(d[min(len(d)-1, int(q*float64(len(d))))].Nanoseconds()) / 1e3
	}
	return at(0.50), at(0.99)
}

// DefaultMinTenure is how long a grant is safe from recall by default.
const DefaultMinTenure = 250 * time.Microsecond

func (s *Service) minTenure() time.Duration {
	if s.opts.MinTenure == 0 {
		return DefaultMinTenure
	}
	return max(s.opts.MinTenure, 0)
}
