package metadata

import (
	"cmp"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Kept read leases (FeatureLeases).
//
// A session's first read grant of a file, for a read-only open, outlives
// the handle it was made for: when the handle closes, the IO service keeps
// the grant, under the handle's id (the lease id), and the session's next
// read-only opens of the file use it (proto.OpenResp.DataHandle) without
// asking io again. An open + read + close of a file the session read
// before then costs the open's and the close's metadata ring round trips
// and no NATS message at all, where a grant and a revoke at io cost two
// (issue 13).
//
// What a kept lease lets its session do is what an open read-only handle
// does: read the file at io. It is ended (revoked at io):
//   - when its session ends;
//   - when its file's mode or owner changes (chmod, chown: the session
//     might no longer be allowed to open it): at once if no handle uses
//     it, at its last close otherwise (an open handle keeps its access,
//     as on Linux);
//   - before its file's blob is deleted (the file lost its last name and
//     last open: io deletes no blob a grant holds);
//   - when the session keeps more than maxIdleLeases that no handle uses:
//     the least recently used of the session goes; when the sessions of
//     its uid keep more than their share (limits.leases_share of
//     maxIdleLeasesTotal; not for an exempt uid): the uid's least recently
//     used goes; when all sessions together keep more than
//     maxIdleLeasesTotal: the least recently used of the uid that keeps
//     the most goes, so that no user's leases push out another's;
//   - by an io restart or resynchronisation, which drops every grant: a
//     lease of an io epoch that is over is void, and the next open asks
//     for a new one.
//
// Leases are shared (read) only, so no two sessions' leases conflict: a
// writer of the file, in any session, is granted per handle as before and
// writes through io's page cache, which every reader reads. Exclusive
// leases, recalls and trust groups are not built yet (docs/architecture.md).
type lease struct {
	sid   uint64 // the session
	uid   uint32 // the session's uid
	id    uint64 // the handle id io knows the grant by
	ino   ns.Ino
	blob  uint64
	file  *openFile // a reference on the file's open state, held while the lease lives
	epoch uint64    // io epoch of the grant
	rec   *grantRec // the grant, in the file's registry (groups.go)

	// Protected by leaseTable.mu:
	refs   int  // open handles using it
	doomed bool // end it at its last close (its file's mode or owner changed)
	ended  bool // out of the table, its end done or under way (by whoever set it)

	done    chan struct{} // closed once it is ended (revoked at io, or void)
	idle    *list.Element // in its session's idle list while refs == 0
	uidIdle *list.Element // in its uid's idle list while refs == 0
}

// maxIdleLeases bounds the leases a session keeps that no handle uses,
// maxIdleLeasesTotal those of all sessions together: each holds a grant
// and an open blob (a file descriptor, on the file backend) at io.
const (
	maxIdleLeases      = 256
	maxIdleLeasesTotal = 4096
)

// leaseTable holds every kept lease of the service.
type leaseTable struct {
	// evicted are the leases pushed out of an idle list, for leaseEnder
	// to end (not the session goroutine that pushed them: the revoke is a
	// NATS round trip, and the session's next request would wait for it).
	evicted chan *lease

	mu    sync.Mutex
	byIno map[ns.Ino]map[uint64]*lease // ino -> session -> lease
	// ending are the leases out of byIno whose end is under way (a revoke
	// on its way to io), by inode: a delete of the blob waits for them.
	ending map[ns.Ino]map[*lease]struct{}
	idle   map[uint64]*list.List // session -> its idle leases, least recently used first
	byUID  map[uint32]*list.List // uid -> its sessions' idle leases, least recently used first
	n      int                   // leases
	nIdle  int                   // of which idle

	// uidShare bounds the idle leases of one uid not exempt (0: none);
	// immutable after setShare. OverShare counts the leases it ended.
	uidShare  int
	exempt    func(uint32) bool
	OverShare atomic.Uint64
}

func newLeaseTable() *leaseTable {
	return &leaseTable{byIno: map[ns.Ino]map[uint64]*lease{}, ending: map[ns.Ino]map[*lease]struct{}{},
		idle: map[uint64]*list.List{}, byUID: map[uint32]*list.List{}, evicted: make(chan *lease, evictedQueue),
		exempt: func(uint32) bool { return false }}
}

// setShare bounds each uid's idle leases to pct percent of
// maxIdleLeasesTotal (0 or 100: none but the total's), but for the uids
// exempt says; call it before the table is used.
func (t *leaseTable) setShare(pct int, exempt func(uint32) bool) {
	if pct > 0 && pct < 100 {
		t.uidShare = max(maxIdleLeasesTotal*pct/100, 1)
	}
	if exempt != nil {
		t.exempt = exempt
	}
}

// count returns the leases kept.
func (t *leaseTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// useLease returns the session's lease of ino if it is of the io epoch now,
// with one more handle on it; nil if it has none. A void one (an epoch
// that is over) is forgotten.
func (s *Service) useLease(sid uint64, ino ns.Ino) *lease {
	t := s.leases
	epoch := s.io.currentEpoch()
	t.mu.Lock()
	l := t.byIno[ino][sid]
	var recalled *lease
	switch {
	case l == nil:
	case l.doomed:
		l = nil // being ended: the open gets a grant of its own
	case l.recalled():
		// Another trust group's grant recalled it: it ends (with no
		// revoke: the recall was it), and the open gets a grant.
		if l.refs == 0 {
			recalled = l
			t.dropLocked(l)
		}
		l = nil
	case l.epoch != epoch || epoch == 0:
		var void *lease
		if l.refs == 0 {
			void = l
			t.dropVoidLocked(l)
		}
		t.mu.Unlock()
		if void != nil {
			s.closeFileRef(void.file) // io dropped its grant with the epoch
		}
		return nil
	default:
		l.refs++
		t.unidleLocked(l)
	}
	t.mu.Unlock()
	if recalled != nil {
		s.endLease(recalled)
	}
	if l != nil {
		s.Stats.LeaseOpens.Add(1)
	}
	return l
}

// recalled says whether another trust group's grant recalled the lease's.
func (l *lease) recalled() bool { return l.rec != nil && l.rec.revoked.Load() }

// keepLease makes the grant h just got (read-only, for handle id) the
// session's lease of its file, used by h, unless the session has one
// already (then h's grant stays its own, revoked at its close).
func (se *session) keepLease(id uint64, h *handle) {
	s := se.svc
	t := s.leases
	t.mu.Lock()
	m := t.byIno[h.ino]
	if old := m[se.id]; old != nil && (old.refs > 0 || old.doomed || (old.epoch == h.grantEpoch && !old.recalled())) {
		t.mu.Unlock()
		return
	}
	var void *lease
	if old := m[se.id]; old != nil {
		void = old // of an io epoch that is over, or recalled, and idle
		t.dropVoidLocked(old)
	}
	if m = t.byIno[h.ino]; m == nil { // (the drop may have removed it)
		m = map[uint64]*lease{}
		t.byIno[h.ino] = m
	}
	l := &lease{sid: se.id, uid: se.cred.UID, id: id, ino: h.ino, blob: h.blob, file: s.openFileRef(h.ino), epoch: h.grantEpoch, rec: h.rec, refs: 1, done: make(chan struct{})}
	m[se.id] = l
	t.n++
	t.mu.Unlock()
	if void != nil {
		s.closeFileRef(void.file)
	}
	h.lease = l
}

// dropVoidLocked is dropLocked of a lease of an io epoch that is over:
// there is nothing to revoke. The caller drops its file reference.
func (t *leaseTable) dropVoidLocked(l *lease) {
	t.dropLocked(l)
	t.endedLocked(l)
}

// endedLocked records that l's end is done; t.mu is held.
func (t *leaseTable) endedLocked(l *lease) {
	if m := t.ending[l.ino]; m != nil {
		delete(m, l)
		if len(m) == 0 {
			delete(t.ending, l.ino)
		}
	}
	select {
	case <-l.done:
	default:
		close(l.done)
	}
}

// dropLocked forgets l and marks it ended, its end under way; t.mu is
// held. The caller ends it (endLease).
func (t *leaseTable) dropLocked(l *lease) {
	if l.ended {
		return
	}
	l.ended = true
	if t.ending[l.ino] == nil {
		t.ending[l.ino] = map[*lease]struct{}{}
	}
	t.ending[l.ino][l] = struct{}{}
	if m := t.byIno[l.ino]; m[l.sid] == l {
		delete(m, l.sid)
		if len(m) == 0 {
			delete(t.byIno, l.ino)
		}
		t.n--
	}
	t.unidleLocked(l)
}

// unidleLocked takes l out of its session's idle list; t.mu is held.
func (t *leaseTable) unidleLocked(l *lease) {
	if l.idle != nil {
		t.idle[l.sid].Remove(l.idle)
		l.idle = nil
		t.nIdle--
	}
	if l.uidIdle != nil {
		q := t.byUID[l.uid]
		q.Remove(l.uidIdle)
		l.uidIdle = nil
		if q.Len() == 0 {
			delete(t.byUID, l.uid)
		}
	}
}

// heaviestLocked is the idle list of the uid that keeps the most idle
// leases; t.mu is held and some lease is idle.
func (t *leaseTable) heaviestLocked() *list.List {
	var top *list.List
	for _, q := range t.byUID {
		if top == nil || q.Len() > top.Len() {
			top = q
		}
	}
	return top
}

// closeLeased ends a handle's use of its lease: the lease stays, idle, or
// ends if it is doomed; a session with too many idle leases ends its
// least recently used one.
func (se *session) closeLeased(h *handle) {
	s := se.svc
	t := s.leases
	l := h.lease
	h.lease, h.rec = nil, nil
	var end []*lease
	t.mu.Lock()
	var evict []*lease
	l.refs--
	if l.refs == 0 && !l.ended {
		if l.doomed || t.byIno[l.ino][l.sid] != l || l.recalled() {
			t.dropLocked(l)
			end = append(end, l)
		} else {
			q := t.idle[l.sid]
			if q == nil {
				q = list.New()
				t.idle[l.sid] = q
			}
			l.idle = q.PushBack(l)
			t.nIdle++
			uq := t.byUID[l.uid]
			if uq == nil {
				uq = list.New()
				t.byUID[l.uid] = uq
			}
			l.uidIdle = uq.PushBack(l)
			// The session's own oldest go when it keeps too many, the
			// uid's when its sessions keep more than its share, and the
			// oldest of the uid that keeps the most when all sessions
			// together keep too many.
			for q.Len() > maxIdleLeases {
				old := q.Front().Value.(*lease)
				t.dropLocked(old)
				evict = append(evict, old)
			}
			for t.uidShare > 0 && !t.exempt(l.uid) && t.byUID[l.uid] != nil && t.byUID[l.uid].Len() > t.uidShare {
				old := t.byUID[l.uid].Front().Value.(*lease)
				t.dropLocked(old)
				evict = append(evict, old)
				t.OverShare.Add(1)
			}
			for t.nIdle > maxIdleLeasesTotal {
				old := t.heaviestLocked().Front().Value.(*lease)
				t.dropLocked(old)
				evict = append(evict, old)
			}
		}
	}
	t.mu.Unlock()
	for _, l := range end {
		s.endLease(l) // doomed: its end is what a chmod or delete waits for
	}
	for _, l := range evict {
		select {
		case t.evicted <- l:
		default:
			s.endLease(l) // leaseEnder is behind
		}
	}
}

// evictedQueue bounds the evicted leases waiting for leaseEnder.
const evictedQueue = 1024

// leaseEnder ends the evicted leases until the service stops (those
// still queued then end with their sessions and io's grants with them).
func (s *Service) leaseEnder() {
	for {
		select {
		case <-s.stop:
			return
		case l := <-s.leases.evicted:
			s.endLease(l)
		}
	}
}

// endLeasesOf ends every lease of a session that ended (its handles are
// closed: no handle uses them).
func (s *Service) endLeasesOf(sid uint64) {
	t := s.leases
	var end []*lease
	t.mu.Lock()
	if q := t.idle[sid]; q != nil {
		for e := q.Front(); e != nil; e = e.Next() {
			end = append(end, e.Value.(*lease))
		}
	}
	for _, l := range end {
		t.dropLocked(l)
	}
	delete(t.idle, sid)
	t.mu.Unlock()
	for _, l := range end {
		s.endLease(l)
	}
}

// doomLeases ends the leases of ino that no handle uses and dooms the
// others (they end at their last close): the file's mode or owner
// changed, so their sessions might no longer be allowed to open it.
func (s *Service) doomLeases(ino ns.Ino) {
	t := s.leases
	var end []*lease
	t.mu.Lock()
	for _, l := range t.byIno[ino] {
		if l.refs == 0 {
			end = append(end, l)
		} else {
			l.doomed = true
		}
	}
	for _, l := range end {
		t.dropLocked(l)
	}
	t.mu.Unlock()
	for _, l := range end {
		s.endLease(l)
	}
}

// endLeasesOfBlob ends every lease of blob before its delete (the file
// has no name and no open handle, so none uses them): io deletes no blob
// a grant holds.
func (s *Service) endLeasesOfBlob(blob uint64) {
	t := s.leases
	var end []*lease
	t.mu.Lock()
	// A blob's id is its file's inode number (io refuses a grant where
	// they differ). One in use cannot be (the file would have an open
	// handle): doomed all the same, never ended twice.
	for _, l := range t.byIno[ns.Ino(blob)] {
		switch {
		case l.blob != blob:
		case l.refs > 0:
			l.doomed = true
		default:
			end = append(end, l)
		}
	}
	for _, l := range end {
		t.dropLocked(l)
	}
	t.mu.Unlock()
	for _, l := range end {
		s.endLease(l)
	}
	// And the ends others began (a session's, an eviction): io deletes
	// no blob a grant still holds.
	t.mu.Lock()
	var waits []chan struct{}
	for l := range t.ending[ns.Ino(blob)] {
		waits = append(waits, l.done)
	}
	t.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-s.stop:
			return
		case <-time.After(2 * s.requestTimeout()):
			return // the delete fails and is tried again
		}
	}
}

// endLease revokes an ended lease at io (a grant of an io epoch that is
// over needs nothing) and drops its file reference. A revoke io does not
// answer is sent again (retrier) until that epoch ends.
func (s *Service) endLease(l *lease) {
	defer func() {
		s.leases.mu.Lock()
		s.leases.endedLocked(l)
		s.leases.mu.Unlock()
	}()
	defer s.closeFileRef(l.file)
	s.Stats.LeasesEnded.Add(1)
	if l.epoch != s.io.currentEpoch() {
		return
	}
	f := l.file
	f.mu.Lock()
	if !f.dropGrantLocked(l.rec) {
		f.mu.Unlock()
		return // recalled: the recall revoked it
	}
	r := control.Revoke{Session: l.sid, Handle: l.id, Blob: l.blob, Ver: s.version.Add(1)}
	var ack control.Ack
	err := s.request(s.subj.Revoke, r, &ack)
	f.mu.Unlock()
	if err != nil {
		var ref *control.Refusal
		if !errors.As(err, &ref) && !errors.Is(err, errIODown) {
			s.revokes.add(r, l.epoch)
		}
		s.log.Warn("revoke of a kept lease failed", "ino", l.ino, "session", l.sid, "error", err)
		return
	}
	s.Stats.Revokes.Add(1)
	s.noteDVIfSame(l.ino, f, ack) // a read grant wrote nothing
}

// leaseable says whether an open with flags may use or become a kept
// lease: read-only, without O_TRUNC (which needs a grant that truncates).
func leaseable(flags int) bool {
	return flags&syscall.O_ACCMODE == syscall.O_RDONLY && flags&syscall.O_TRUNC == 0
}

// Leases lists the kept leases and the exclusive ones (write grants, in
// the files' registries: groups.go), by inode then session (the leases
// endpoint: `weir lease ls`).
func (s *Service) Leases() []control.LeaseInfo {
	t := s.leases
	t.mu.Lock()
	var out []control.LeaseInfo
	for _, m := range t.byIno {
		for _, l := range m {
			out = append(out, control.LeaseInfo{Lease: l.id, Session: l.sid, Ino: uint64(l.ino), Handles: l.refs, Doomed: l.doomed, Epoch: l.epoch, Mode: "shared"})
		}
	}
	t.mu.Unlock()
	out = append(out, s.exclusiveLeases(0, 0)...)
	s.mu.Lock()
	for i := range out {
		if se := s.sessions[out[i].Session]; se != nil {
			out[i].PID, out[i].UID, out[i].Group = se.pid, se.cred.UID, se.group
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b control.LeaseInfo) int {
		return cmp.Or(cmp.Compare(a.Ino, b.Ino), cmp.Compare(a.Session, b.Session), cmp.Compare(a.Lease, b.Lease))
	})
	return out
}

// exclusiveLeases lists the write grants of the io epoch now in the
// files' registries: of every open file, or of ino; with id, only that
// one.
func (s *Service) exclusiveLeases(id uint64, ino ns.Ino) []control.LeaseInfo {
	epoch := s.io.currentEpoch()
	s.mu.Lock()
	files := make([]*openFile, 0, len(s.files))
	for i, f := range s.files {
		if ino == 0 || i == ino {
			files = append(files, f)
		}
	}
	s.mu.Unlock()
	var out []control.LeaseInfo
	for _, f := range files { // (a file's lock is taken before s.mu, never under it)
		f.mu.Lock()
		for r := range f.grants {
			if r.write && r.epoch == epoch && !r.revoked.Load() && (id == 0 || r.id == id) {
				out = append(out, control.LeaseInfo{Lease: r.id, Session: r.sid, Ino: uint64(f.ino), Handles: 1, Epoch: r.epoch, Mode: "exclusive", Tenure: f.tenure})
			}
		}
		f.mu.Unlock()
	}
	return out
}

// revokeLeasesBody serves the lease-revoke endpoint: body is a
// control.LeaseRevokeRequest (from the CLI role; checked as any input).
func (s *Service) revokeLeasesBody(body []byte) (control.LeaseRevokeReply, error) {
	var q control.LeaseRevokeRequest
	if err := json.Unmarshal(body, &q); err != nil {
		return control.LeaseRevokeReply{}, fmt.Errorf("lease-revoke: %w", err)
	}
	if (q.Lease == 0) == (q.Ino == 0) {
		return control.LeaseRevokeReply{}, errors.New("lease-revoke: name a lease or an inode, one of them")
	}
	return s.RevokeLeases(q.Lease, ns.Ino(q.Ino)), nil
}

// RevokeLeases ends the lease with id, or every lease of ino (the other
// is 0), as an operator asks: one no handle uses ends now, one in
// use is doomed (it ends at its last close: an open descriptor keeps
// its access). An exclusive lease is always in use (a write grant lasts
// while its handle is open): it is counted, and ends at its close.
func (s *Service) RevokeLeases(id uint64, ino ns.Ino) control.LeaseRevokeReply {
	t := s.leases
	var end []*lease
	var r control.LeaseRevokeReply
	t.mu.Lock()
	for i, m := range t.byIno {
		if ino != 0 && i != ino {
			continue
		}
		for _, l := range m {
			if id != 0 && l.id != id {
				continue
			}
			if l.refs == 0 {
				end = append(end, l)
			} else if !l.doomed {
				l.doomed = true
				r.Doomed++
			}
		}
	}
	for _, l := range end {
		t.dropLocked(l)
	}
	t.mu.Unlock()
	for _, l := range end {
		s.endLease(l)
	}
	r.Ended = len(end)
	r.Exclusive = len(s.exclusiveLeases(id, ino))
	return r
}
