package iosvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/staging"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/services/io/backend"
)

// The metadata service's control requests. They arrive on one ordered
// subscription (HandleOrdered), so each handler sees them in the order
// metadata sent them; a handler returns before the next message is taken,
// and one that must wait (a revocation waiting for requests in flight)
// waits on a goroutine of its own after it has changed the tables.
//
// Every message is validated as strictly as a ring descriptor: a body
// that does not decode, a grant for a session that is not attached here or
// belongs to another incarnation, a blob that metadata did not allocate,
// a version that is not newer than the file's last: refused with an error
// reply, counted by kind in stats (control_refused_*), logged once per
// kind, and nothing changes.

func (s *Service) onGrant(m *nats.Msg) {
	var g control.Grant
	if err := control.Decode(m.Data, &g); err != nil {
		s.host.Refuse(m, "malformed", control.Ack{}, err.Error())
		return
	}
	inc := s.inc.Load()
	switch {
	case g.Session == 0 || g.Handle == 0 || g.Blob == 0 || g.Ver == 0 || g.Ino != g.Blob:
		s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("grant %+v: zero field or blob is not the inode", g))
		return
	case !g.Read && !g.Write && !g.Truncate:
		s.host.Refuse(m, "malformed", control.Ack{}, "grant of no access")
		return
	case g.Sync > control.SyncAll:
		s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("sync mode %d", g.Sync))
		return
	case inc == 0 || proto.IncarnationOf(g.Session) != inc || proto.IncarnationOf(g.Handle) != inc:
		s.host.Refuse(m, "stale_incarnation", control.Ack{}, fmt.Sprintf("session %#x, handle %#x: not of incarnation %d", g.Session, g.Handle, inc))
		return
	case g.Blob >= s.allocLimit.Load() || g.Blob == uint64(backend.StagingBlob):
		s.host.Refuse(m, "unallocated_blob", control.Ack{}, fmt.Sprintf("blob %d: metadata allocated blob ids below %d only", g.Blob, s.allocLimit.Load()))
		return
	}
	s.mu.Lock()
	holder := s.sessions[g.Session]
	if holder == nil {
		s.mu.Unlock()
		s.host.Refuse(m, "unknown_session", control.Ack{}, fmt.Sprintf("session %#x is not attached here", g.Session))
		return
	}
	uid := holder.cred.Uid
	if e := s.uids.grantRoomLocked(uid); e != 0 {
		// Its uid holds its share of io's descriptors (limits.go): the
		// client's request fails with EMFILE, as past RLIMIT_NOFILE.
		s.mu.Unlock()
		control.Respond(m, control.Ack{Error: fmt.Sprintf("uid %d holds as many grants as limits.descriptors_share allows", uid), Errno: int(e)})
		return
	}
	if s.grants[g.Session][g.Handle] != nil {
		s.mu.Unlock()
		s.host.Refuse(m, "duplicate", control.Ack{}, fmt.Sprintf("handle %#x of session %#x is granted already", g.Handle, g.Session))
		return
	}
	if ob := s.blobs[backend.BlobID(g.Blob)]; ob != nil && g.Ver <= ob.ver {
		s.mu.Unlock()
		s.Stats.StaleControl.Add(1)
		s.host.Refuse(m, "stale_version", control.Ack{}, fmt.Sprintf("grant of blob %d at version %d: %d applied already", g.Blob, g.Ver, ob.ver))
		return
	}
	ob, err := s.openBlobLocked(backend.BlobID(g.Blob), g.Ino, g.Fresh)
	dup := err == nil && s.grants[g.Session][g.Handle] != nil // (made while the open gave descriptors back)
	s.mu.Unlock()
	if errors.Is(err, errAdoption) {
		s.adoptionRefused(backend.BlobID(g.Blob), err)
	}
	if err != nil {
		control.Respond(m, control.Ack{Error: err.Error(), Errno: int(errno(err))})
		return
	}
	if dup {
		s.releaseBlob(ob)
		s.host.Refuse(m, "duplicate", control.Ack{}, fmt.Sprintf("handle %#x of session %#x is granted already", g.Handle, g.Session))
		return
	}
	// The handle is not in the table yet, so no request can use it while
	// the blob is emptied; the next control message waits (ordered).
	if g.Truncate {
		if err := s.truncateBlob(ob, 0); err != nil {
			s.releaseBlob(ob)
			control.Respond(m, control.Ack{Error: err.Error(), Errno: int(errno(err))})
			return
		}
		s.touch(ob)
	}
	s.mu.Lock()
	ob.ver = max(ob.ver, g.Ver)
	hs := s.grants[g.Session]
	if hs == nil {
		hs = make(map[uint64]*grant)
		s.grants[g.Session] = hs
	}
	ng := &grant{blob: ob, read: g.Read, write: g.Write, sync: g.Sync, ver: g.Ver, drained: make(chan struct{})}
	hs[g.Handle] = ng
	s.uids.grantedLocked(uid, ng)
	var ended []*grant
	if g.Write {
		ob.writers++
	}
	if g.Write || g.Truncate {
		ended = s.endDirectLocked(ob, g.Session) // a writer's file takes no other session's direct opens
	}
	s.mu.Unlock()
	s.releaseWhenDrained(ended)
	s.Stats.Grants.Add(1)
	size, mtime, dv := ob.live()
	control.Respond(m, control.Ack{Size: size, Mtime: mtime, DV: dv, Wrote: ob.wrote.Load()})
}

// onRevoke is a barrier: the grant leaves the table at once, so no new
// request can use it, and the answer (with the blob's final size and
// mtime) waits until every request in flight on it is done.
func (s *Service) onRevoke(m *nats.Msg) {
	var r control.Revoke
	if err := control.Decode(m.Data, &r); err != nil {
		s.host.Refuse(m, "malformed", control.Ack{}, err.Error())
		return
	}
	if r.Session == 0 || (r.Handle != 0 && (r.Blob == 0 || r.Ver == 0)) {
		s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("revoke %+v", r))
		return
	}
	s.mu.Lock()
	hs := s.grants[r.Session]
	var gone []*grant
	s.spendLocked(r.Session, r.Handle) // a capability of it claims nothing from now on
	if r.Handle == 0 {
		for _, g := range hs {
			gone = append(gone, g)
		}
		delete(s.grants, r.Session)
		delete(s.dirOpens, r.Session) // (its direct opens end below)
	} else if g := hs[r.Handle]; g != nil {
		if g.blob.id != backend.BlobID(r.Blob) {
			s.mu.Unlock()
			s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("revoke of handle %#x names blob %d; it holds %d", r.Handle, r.Blob, g.blob.id))
			return
		}
		// Against the grant it would end, not the file: a revoke sent
		// again late still ends the grant it was meant for, however many
		// other handles of the file were granted since. Only a revoke
		// older than this grant (one meant for an earlier grant of the
		// handle) is stale.
		if r.Ver <= g.ver {
			s.mu.Unlock()
			s.Stats.StaleControl.Add(1)
			s.host.Refuse(m, "stale_version", control.Ack{}, fmt.Sprintf("revoke of handle %#x at version %d: its grant is version %d", r.Handle, r.Ver, g.ver))
			return
		}
		g.blob.ver = max(g.blob.ver, r.Ver)
		gone = append(gone, g)
		delete(hs, r.Handle)
		if len(hs) == 0 {
			delete(s.grants, r.Session)
		}
	} else if ob := s.blobs[backend.BlobID(r.Blob)]; ob != nil && r.Ver > ob.ver {
		ob.ver = r.Ver // nothing to revoke; later stragglers are older still
	}
	// A single grant that served no request: metadata protects its
	// holder's next (services/metadata/groups.go).
	unused := r.Handle != 0 && len(gone) == 1 && !gone[0].used
	for _, g := range gone {
		g.revokeLocked()
	}
	s.mu.Unlock()
	s.Stats.Grants.Add(-int64(len(gone)))
	s.Stats.RevokesWaiting.Add(1)
	if !s.background(func() {
		defer s.Stats.RevokesWaiting.Add(-1)
		// The answer for a single handle carries the blob's attributes,
		// taken after its last request; for a whole session, none.
		var ack control.Ack
		for _, g := range gone {
			<-g.drained
			s.endPinsOf(g) // its windows' last drain and mappings' dirt first
			if r.Handle != 0 {
				ack.Size, ack.Mtime, ack.DV = g.blob.live()
				ack.Wrote = g.blob.wrote.Load()
				ack.Unused = unused
			}
			s.grantGone(g)
		}
		control.Respond(m, ack)
	}) {
		s.Stats.RevokesWaiting.Add(-1)
		control.Respond(m, control.Ack{Error: "the IO service is stopping: every grant ends with it"})
	}
}

func (s *Service) onLive(m *nats.Msg) {
	var q control.LiveQuery
	if err := control.Decode(m.Data, &q); err != nil || q.Blob == 0 {
		s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("live query %q", m.Data))
		return
	}
	s.mu.Lock()
	ob := s.blobs[backend.BlobID(q.Blob)]
	if ob != nil {
		ob.refs++
	}
	s.mu.Unlock()
	if ob == nil {
		control.Respond(m, control.Ack{Error: "blob not open"}) // a race with a close, not a fault
		return
	}
	size, mtime, dv := ob.live()
	control.Respond(m, control.Ack{Size: size, Mtime: mtime, DV: dv, Wrote: ob.wrote.Load()})
	s.releaseBlob(ob)
}

func (s *Service) onDelete(m *nats.Msg) {
	var d control.Delete
	if err := control.Decode(m.Data, &d); err != nil || d.Blob == 0 || d.Blob == uint64(backend.StagingBlob) {
		s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("delete %q", m.Data))
		return
	}
	id := backend.BlobID(d.Blob)
	s.mu.Lock()
	_, open := s.blobs[id]
	_, deleting := s.deleting[id]
	if !open && !deleting {
		s.deleting[id] = struct{}{} // not to be opened until the delete is done
		delete(s.unsynced, id)      // nothing of it for a syncfs to keep
	}
	s.mu.Unlock()
	switch {
	case open:
		control.Respond(m, control.Ack{Error: "blob is still open", Errno: int(syscall.EBUSY)})
		return
	case deleting:
		control.Respond(m, control.Ack{Error: "blob is being deleted", Errno: int(syscall.EBUSY)})
		return
	}
	done := func() {
		s.mu.Lock()
		delete(s.deleting, id)
		s.mu.Unlock()
	}
	// At most maxDeletes at once; more are refused, and metadata's
	// deleter tries them again later (a delete it gave up waiting for
	// still runs here).
	select {
	case s.delSem <- struct{}{}:
	default:
		done()
		control.Respond(m, control.Ack{Error: "too many deletes in progress", Errno: int(syscall.EBUSY)})
		return
	}
	// Off the ordered subscription: deleting a large file can take long,
	// and grants and revokes must not wait for it.
	s.dropRegion(id)
	if !s.background(func() {
		if s.stg != nil {
			// Not while a live record names the blob: replay would make
			// it again (a blob missing at replay is one whose create was
			// not durable). The checkpointer takes such records as void.
			if !s.stg.awaitTrimmed(id) {
				<-s.delSem
				done()
				control.Respond(m, control.Ack{Error: "the IO service is stopping", Errno: int(syscall.EBUSY)})
				return
			}
		}
		err := s.be.Delete(id)
		if s.stg != nil && (err == nil || errors.Is(err, syscall.ENOENT)) && s.stg.opened.Load() {
			s.stg.forget(id) // before done(): a checkpoint must not open it again
		}
		<-s.delSem
		done()
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			control.Respond(m, control.Ack{Error: err.Error(), Errno: int(errno(err))})
			return
		}
		s.Stats.Deletes.Add(1)
		control.Respond(m, control.Ack{})
	}) {
		<-s.delSem
		done()
		control.Respond(m, control.Ack{Error: "the IO service is stopping", Errno: int(syscall.EBUSY)})
	}
}

// onResync starts serving an incarnation of the metadata service (or a new
// service session with it): every grant made so far is dropped (that
// incarnation's handles are gone, or that session's grants are void),
// every attached session becomes stale (ESTALE until it attaches again),
// and the allocation limit is set. The reply waits until the requests in
// flight on the dropped grants are done and carries the size and mtime of
// every blob they wrote, so that metadata records them before it serves
// this incarnation's grants.
func (s *Service) onResync(m *nats.Msg) {
	var r control.Resync
	if err := control.Decode(m.Data, &r); err != nil {
		s.host.Refuse(m, "malformed", control.ResyncReply{}, err.Error())
		return
	}
	stack, err := control.ParseStack(r.Stack)
	if r.Incarnation == 0 || r.Incarnation > proto.MaxIncarnation || r.AllocLimit == 0 || err != nil {
		s.host.Refuse(m, "malformed", control.ResyncReply{}, fmt.Sprintf("resync %+v", r))
		return
	}
	if cur := s.inc.Load(); r.Incarnation < cur {
		s.host.Refuse(m, "stale_incarnation", control.ResyncReply{}, fmt.Sprintf("resync for incarnation %d; serving %d", r.Incarnation, cur))
		return
	}
	// A stale resync claims nothing: the store is checked after.
	if err := s.checkStore(backend.Identity(stack), r.Empty); err != nil {
		s.host.Refuse(m, "wrong_store", control.ResyncReply{}, err.Error())
		if s.storeErr.CompareAndSwap(nil, &err) {
			s.log.Error("refusing to serve the store", "error", err)
		}
		s.wrongOnce.Do(func() { close(s.wrongStore) })
		return
	}
	startStaging := false
	if st := s.stg; st != nil && !st.opened.Load() {
		// Once the store is known to be this stack's, and before any
		// session can attach (this resync lets them): the replay is the
		// recovery of every acknowledged fsync, and nothing may read a
		// blob before it.
		blocks := uint64(max(s.opts.StagingBytes/staging.BlockSize, 16))
		if err := st.open(blocks); err != nil {
			err = fmt.Errorf("staging log: %w", err)
			s.host.Refuse(m, "staging_failed", control.ResyncReply{}, err.Error())
			if s.storeErr.CompareAndSwap(nil, &err) {
				s.log.Error("cannot recover the staging log: not serving the store", "error", err)
			}
			s.wrongOnce.Do(func() { close(s.wrongStore) })
			return
		}
		startStaging = true
	}
	s.storeErr.Store(nil)
	s.mu.Lock()
	var dropped []*grant
	for _, hs := range s.grants {
		for _, g := range hs {
			g.revokeLocked()
			dropped = append(dropped, g)
		}
	}
	s.grants = make(map[uint64]map[uint64]*grant)
	s.sessions = make(map[uint64]*session) // every session must attach again
	s.uids.forgetLocked()                  // every grant is revoked
	capKey, keyErr := s.newCapKeyLocked()
	if r.Incarnation != s.inc.Load() {
		s.dirGen = r.DirGen // a new metadata service counts from its own start
	} else {
		s.dirGen = max(s.dirGen, r.DirGen) // (a DirGen racing the resync is not undone)
	}
	s.dirLive = keyErr == nil
	s.inc.Store(r.Incarnation)
	s.resyncs.Add(1)
	for { // data versions stay above every one metadata applied
		cur := s.dv.Load()
		if cur >= r.DVFloor || s.dv.CompareAndSwap(cur, r.DVFloor) {
			break
		}
	}
	s.allocLimit.Store(r.AllocLimit)
	s.mu.Unlock()
	s.Stats.Grants.Add(-int64(len(dropped)))
	s.Stats.GrantsDropped.Add(uint64(len(dropped)))
	s.Stats.Resyncs.Add(1)
	s.meta.resynced(s.opts.RequestTimeout)
	if startStaging {
		s.stg.start()
	} else if s.stg != nil {
		s.stg.resynced() // files with live records: their sizes reach this incarnation
	}
	s.resyncOnce.Do(func() { close(s.resynced) })
	s.log.Info("resynchronised by the metadata service", "incarnation", r.Incarnation, "grants_dropped", len(dropped),
		"allocated_below", r.AllocLimit)
	if !s.background(func() {
		reply := control.ResyncReply{CapKey: capKey}
		if s.live != nil {
			reply.LiveTable, reply.LiveTableID = s.opts.LiveTable, s.live.ID()
		}
		if keyErr != nil {
			s.log.Error("no capability key for this epoch: every read grant goes through the control plane", "error", keyErr)
		}
		var rest []control.SetLive
		seen := map[*openBlob]bool{}
		for _, g := range dropped {
			<-g.drained
			s.endPinsOf(g) // its windows' last drain and mappings' dirt first
			ob := g.blob
			if ob.wrote.Load() && !seen[ob] {
				seen[ob] = true
				size, mtime, dv := ob.live()
				l := control.SetLive{Ino: ob.ino, Size: size, Mtime: mtime, DV: dv}
				if len(reply.Live) < control.MaxResyncLive {
					reply.Live = append(reply.Live, l)
				} else {
					rest = append(rest, l)
				}
			}
			s.grantGone(g)
		}
		if s.stg != nil {
			// Files with live staging records (all the replay wrote, at
			// the first resync): their acknowledged sizes may be only in
			// the log, and the metadata service records them before it
			// serves a grant or a stat.
			for _, l := range s.stg.stagedSizes() {
				if len(reply.Live) < control.MaxResyncLive {
					reply.Live = append(reply.Live, l)
				} else {
					rest = append(rest, l)
				}
			}
		}
		control.Respond(m, reply)
		for _, l := range rest {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
			if err := s.reportLive(ctx, l.Ino, l.Size, l.Mtime, l.DV, false); err != nil {
				s.log.Warn("after a resync: size not reported", "ino", l.Ino, "error", err)
			}
			cancel()
		}
	}) {
		control.Respond(m, control.ResyncReply{Error: "the IO service is stopping"})
	}
}

func (s *Service) onAlloc(m *nats.Msg) {
	var a control.Alloc
	if err := control.Decode(m.Data, &a); err != nil || a.Limit == 0 {
		s.host.Refuse(m, "malformed", control.Ack{}, fmt.Sprintf("alloc %q", m.Data))
		return
	}
	for {
		cur := s.allocLimit.Load()
		if a.Limit <= cur || s.allocLimit.CompareAndSwap(cur, a.Limit) {
			break
		}
	}
	control.Respond(m, control.Ack{})
}

// blobListing caches the backend's sorted blob list for the pages of one
// orphan scan, so that a scan costs one List.
type blobListing struct {
	mu    sync.Mutex
	ids   []uint64
	taken time.Time
}

const listingTTL = time.Minute

func (s *Service) onBlobs(m *nats.Msg) {
	var q control.BlobsQuery
	if err := control.Decode(m.Data, &q); err != nil || q.Max <= 0 || q.Max > 1<<16 {
		s.host.Refuse(m, "malformed", control.BlobsReply{}, fmt.Sprintf("blobs query %q", m.Data))
		return
	}
	// Off the ordered subscription, as a listing of many blobs can take
	// long; pages of one scan are serialised by the listing's lock.
	if !s.background(func() { s.blobsPage(m, q) }) {
		control.Respond(m, control.BlobsReply{Error: "the IO service is stopping"})
	}
}

func (s *Service) blobsPage(m *nats.Msg, q control.BlobsQuery) {
	l := &s.listing
	l.mu.Lock()
	defer l.mu.Unlock()
	if q.After == 0 || l.ids == nil || time.Since(l.taken) > listingTTL {
		ids, err := s.be.List()
		if err != nil {
			control.Respond(m, control.BlobsReply{Error: err.Error()})
			return
		}
		l.ids = l.ids[:0]
		for _, id := range ids {
			if id == backend.StagingBlob {
				continue // io's own, not a file's
			}
			l.ids = append(l.ids, uint64(id))
		}
		slices.Sort(l.ids)
		l.taken = time.Now()
	}
	i := sort.Search(len(l.ids), func(i int) bool { return l.ids[i] > q.After })
	end := min(len(l.ids), i+q.Max)
	control.Respond(m, control.BlobsReply{Blobs: slices.Clone(l.ids[i:end]), More: end < len(l.ids)})
}
