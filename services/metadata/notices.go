package metadata

import (
	"encoding/binary"
	"sync"
	"syscall"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// Recall notices (proto.FeatureRecalls). A recall needs nothing from its
// holder (groups.go), but the holder should hear of it: to ask for the
// grant again before its next request instead of after io's EBADF, and to
// drop the cache mappings it keeps under the recalled grant (io keeps a
// region coherent but cannot refuse a load from a client's mapping). The
// client keeps one OpRecallWait outstanding on its metadata ring, a long
// poll: an async request that takes one of the ring's slots and no more,
// so the ring's flow control is untouched. A recall of one of the
// session's grants completes it with the recalled data handles (at most
// proto.RecallBatch; aux proto.RecallAll when more were recalled than the
// reply or the queue holds); recalls while no wait is outstanding queue
// (at most maxQueuedRecalls, then one RecallAll). The session's end
// completes a pending wait with ECANCELED, before the ring waits for its
// async requests.

// maxQueuedRecalls bounds the recalled handles a session queues while it
// has no wait outstanding.
const maxQueuedRecalls = 1024

// notices is a session's recall-notice state.
type notices struct {
	mu     sync.Mutex
	queued []uint64 // recalled data handles not told yet
	all    bool     // more were recalled than queued holds
	wait   *ring.Request
	done   func(int64, uint64)
	on     bool // the session negotiated FeatureRecalls (set at OpHello)
	ended  bool // the session is ending: waits complete with ECANCELED
}

// recallWait serves OpRecallWait (async): it answers at once if recalls
// are queued, else keeps the request until one comes or the session ends.
// A second wait while one is outstanding is EBUSY.
func (se *session) recallWait(q *ring.Request, done func(int64, uint64)) {
	se.svc.Stats.Requests.Add(1)
	switch {
	case !se.hello:
		done(-int64(syscall.ENOTCONN), 0)
		return
	case se.features&proto.FeatureRecalls == 0:
		done(-int64(syscall.EOPNOTSUPP), 0)
		return
	case q.Length < 8:
		done(-int64(syscall.EINVAL), 0) // no room for one handle
		return
	}
	n := &se.notices
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.ended:
		done(-int64(syscall.ECANCELED), 0)
	case n.done != nil:
		done(-int64(syscall.EBUSY), 0)
	case len(n.queued) > 0 || n.all:
		n.answerLocked(q, done)
	default:
		n.wait, n.done = q.Clone(), done
	}
}

// answerLocked completes the wait q with what is queued; n.mu is held.
func (n *notices) answerLocked(q *ring.Request, done func(int64, uint64)) {
	if n.all {
		// Everything may be recalled: say so now, the list is moot.
		n.queued, n.all = n.queued[:0], false
		done(0, proto.RecallAll)
		return
	}
	k := min(len(n.queued), int(min(q.Length/8, proto.RecallBatch)))
	b := make([]byte, 8*k)
	for i, id := range n.queued[:k] {
		binary.LittleEndian.PutUint64(b[8*i:], id)
	}
	n.queued = append(n.queued[:0], n.queued[k:]...)
	done(int64(q.WritePayload(b)), 0) // what is left queued goes with the next wait
}

// tell queues a recalled data handle of the session and answers its
// outstanding wait, if any; false: the session takes no notices.
func (n *notices) tell(id uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ended || !n.on {
		return false
	}
	if len(n.queued) < maxQueuedRecalls {
		n.queued = append(n.queued, id)
	} else {
		n.all = true
	}
	if n.done != nil {
		q, done := n.wait, n.done
		n.wait, n.done = nil, nil
		n.answerLocked(q, done)
	}
	return true
}

// end completes the outstanding wait with ECANCELED; later waits get it
// at once.
func (n *notices) end() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ended = true
	if n.done != nil {
		done := n.done
		n.wait, n.done = nil, nil
		done(-int64(syscall.ECANCELED), 0)
	}
}

// noticeRecall tells session sid that its grant of data handle id was
// recalled (FeatureRecalls sessions only).
func (s *Service) noticeRecall(sid, id uint64) {
	s.mu.Lock()
	se := s.sessions[sid]
	s.mu.Unlock()
	if se != nil && se.notices.tell(id) {
		s.recallStats.notices.Add(1)
	}
}
