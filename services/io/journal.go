package iosvc

import (
	"syscall"
	"time"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/internal/journalproto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/io/backend"
)

// The journal service's session (internal/journalproto has the protocol
// and a picture of one pass). With Options.JournalSocket set, io runs no
// checkpointer of its own: the journal service asks for batches, io makes
// their files durable at home, the journal service commits their inode
// fields to the metadata service, then io trims. While no journal service
// is connected the log fills, and then fsync waits (staging_waiting,
// staging_backpressure in weir status). At Shutdown io still runs a last
// checkpoint itself (stager.close).
//
// Every value read from the session is checked: the peer is the service
// user, but a bug there must cost it an errno, not io its log.

// journalBatch is the batch the journal service works on: at most one.
type journalBatch struct {
	b       *ckptBatch
	done    map[backend.BlobID]bool        // checkpointed
	reports map[backend.BlobID]*liveReport // checkpointed with a report
}

// serveJournal adds the journal socket's listener (Start, before the
// host starts).
func (s *Service) serveJournal() {
	st := s.stg
	s.jpeers = s.host.ServePeersWith(s.opts.JournalSocket, []string{string(control.RoleJournal)}, st.onJournal,
		map[uint8]ring.HandlerFunc{
			journalproto.OpNext:       st.jNext,
			journalproto.OpCheckpoint: st.jCheckpoint,
			journalproto.OpCommit:     st.jCommit,
		})
}

// onJournal follows the journal service's session: a batch of a session
// that ended is dropped (its successor asks for a new one).
func (st *stager) onJournal(_ string, up bool) {
	st.ckptMu.Lock()
	st.jb = nil
	st.ckptMu.Unlock()
	if up {
		st.svc.log.Info("journal service connected: it checkpoints the staging log")
	} else if !st.svc.closed.Load() {
		st.svc.log.Info("journal service session ended: fsync goes on until the staging log is full, then waits for the journal service")
	}
}

// journalConnected reports whether a journal service session is up.
func (s *Service) journalConnected() bool {
	return s.jpeers != nil && s.jpeers.Up(string(control.RoleJournal))
}

// jNext serves OpNext: waits for work (a poke, a resync, the wait; after
// failed passes, q.Offset of them, only a resync or the wait, so that
// pokes do not cut the journal's backoff short), then returns the next
// batch.
func (st *stager) jNext(q *ring.Request) (int64, uint64) {
	if q.Arg > journalproto.MaxWaitMs || q.Length < journalproto.BatchHeader || q.Length > uint64(host.PeerRing.ArenaSize) {
		return -int64(syscall.EINVAL), 0
	}
	if !st.opened.Load() {
		return -int64(syscall.EAGAIN), 0
	}
	st.mu.Lock()
	started, stopping := st.started, st.stopping
	st.mu.Unlock()
	if !started || stopping {
		return -int64(syscall.EAGAIN), 0
	}
	st.journalFailing.Store(q.Offset)
	if q.Arg > 0 {
		kick := st.kick
		if q.Offset > 0 {
			kick = nil
		}
		t := time.NewTimer(time.Duration(q.Arg) * time.Millisecond)
		select {
		case <-kick:
		case <-st.resync:
		case <-st.stop:
		case <-t.C:
		}
		t.Stop()
	}
	st.ckptMu.Lock()
	defer st.ckptMu.Unlock()
	st.jb = nil
	limit := int(q.Length-journalproto.BatchHeader) / journalproto.File
	b := st.collect(false, max(limit, 1))
	switch {
	case b == nil || len(b.todo) > limit:
		st.passEnded(nil)
		return 0, 0
	case len(b.todo) == 0:
		// Only void records (replay found their files gone): nothing
		// to make durable, trim them here.
		err := st.commit(b, nil)
		st.passEnded(err)
		return 0, 0
	}
	st.nextBatch++
	b.id = st.nextBatch
	out := journalproto.Batch{ID: b.id, Trim: b.trim, Upto: b.upto}
	for _, id := range b.order {
		out.Files = append(out.Files, journalproto.BatchFile{Blob: uint64(id), Ino: b.todo[id], Closed: b.closed[id]})
	}
	buf := make([]byte, out.Size())
	out.Encode(buf)
	q.WritePayload(buf)
	st.jb = &journalBatch{b: b, done: map[backend.BlobID]bool{}, reports: map[backend.BlobID]*liveReport{}}
	st.JournalBatches.Add(1)
	return int64(len(out.Files)), b.id
}

// batchOf returns the current batch if it has id.
func (st *stager) batchOf(id uint64) *journalBatch {
	if st.jb == nil || st.jb.b.id != id {
		return nil
	}
	return st.jb
}

// jCheckpoint serves OpCheckpoint: one file of the batch made durable at
// home, its report written.
func (st *stager) jCheckpoint(q *ring.Request) (int64, uint64) {
	if q.Length != journalproto.ReportSize {
		return -int64(syscall.EINVAL), 0
	}
	st.ckptMu.Lock()
	defer st.ckptMu.Unlock()
	jb := st.batchOf(q.Offset)
	id := backend.BlobID(q.Handle)
	if jb == nil {
		return -int64(syscall.ENOENT), 0
	}
	ino, ok := jb.b.todo[id]
	if !ok {
		return -int64(syscall.ENOENT), 0
	}
	l, err := st.checkpointFile(id, ino, jb.b.closed[id] && !jb.done[id])
	if err != nil {
		st.passEnded(err)
		st.jb = nil
		return -int64(syscall.EIO), 0
	}
	jb.done[id] = true
	if l == nil {
		delete(jb.reports, id)
		return 0, 0
	}
	jb.reports[id] = l
	var buf [journalproto.ReportSize]byte
	journalproto.Report{Size: l.size, Mtime: l.mtime, DV: l.dv}.Encode(buf[:])
	q.WritePayload(buf[:])
	return 1, 0
}

// jCommit serves OpCommit: the batch's reports are durable at the
// metadata service (but for the files it named gone): trim.
func (st *stager) jCommit(q *ring.Request) (int64, uint64) {
	if q.Length > uint64(host.PeerRing.ArenaSize) {
		return -int64(syscall.EINVAL), 0
	}
	buf := make([]byte, q.Length)
	q.ReadPayload(buf)
	gone, err := journalproto.DecodeInodes(buf)
	if err != nil {
		return -int64(syscall.EINVAL), 0
	}
	st.ckptMu.Lock()
	defer st.ckptMu.Unlock()
	jb := st.batchOf(q.Offset)
	if jb == nil {
		return -int64(syscall.ENOENT), 0
	}
	if len(jb.done) != len(jb.b.todo) {
		return -int64(syscall.EINVAL), 0
	}
	isGone := map[uint64]bool{}
	for _, ino := range gone {
		isGone[ino] = true
	}
	var accepted []*liveReport
	for _, id := range jb.b.order {
		if l := jb.reports[id]; l != nil && !isGone[l.ino] {
			accepted = append(accepted, l)
		}
	}
	st.jb = nil
	if st.log.Stats().TrimLSN != jb.b.trim {
		st.passEnded(nil)
		return -int64(syscall.ESTALE), 0 // trimmed meanwhile (Shutdown's own pass): take another
	}
	err = st.commit(jb.b, accepted)
	st.passEnded(err)
	switch {
	case err == nil:
		st.JournalCommits.Add(1)
		st.lastCkptErr.Store(nil)
		return 0, 0
	case st.svc.resyncs.Load() != jb.b.resyncs:
		return -int64(syscall.ESTALE), 0
	default:
		return -int64(syscall.EIO), 0
	}
}

// passEnded ends a checkpoint pass: fsyncs waiting for room try again.
// A failure is kept for status until a commit succeeds.
func (st *stager) passEnded(err error) {
	st.mu.Lock()
	st.pass++
	st.room.Broadcast()
	st.mu.Unlock()
	if err != nil {
		st.lastCkptErr.Store(&err)
	}
}

// awaitCheckpointed waits until the log is trimmed past lsn (the
// ablation without background journaling: an fsync returns only once its
// record is checkpointed). It also ends when no checkpoint can come (the
// service stops, or its storage failed): the record is durable, and so
// is the fsync.
func (st *stager) awaitCheckpointed(lsn uint64) {
	st.Waiting.Add(1)
	defer st.Waiting.Add(-1)
	st.mu.Lock()
	defer st.mu.Unlock()
	for st.log.Stats().TrimLSN < lsn && !st.stopping && st.svc.syncFailure.Load() == nil {
		st.poke()
		st.room.Wait()
	}
}
