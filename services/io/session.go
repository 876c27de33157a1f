package iosvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/proto/cache"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/io/backend"
)

// session is one client's ring session. Its fields are owned by the
// session's goroutine: Started, the ring handlers, Drained and Ended all
// run there. Reads and writes run their backend I/O on goroutines of their
// own (see register); those get what they need from the session's
// goroutine (the grant, looked up with sid there) and touch no session
// field.
type session struct {
	svc  *Service
	mux  *ring.Mux
	cred *unix.Ucred
	sid  uint64 // metadata session this ring is bound to; 0 until OpAttach
	// resync is the service's resync count at the attach: once another
	// resync happens, the session is stale (ESTALE) until it attaches
	// again.
	resync uint64
	mem    []byte // the region as registered with the backend; nil if not registered
	// later is the work an inline request left for after its answer
	// (serveIO); the session's goroutine only.
	later []func()
	sc    *ring.ServerConn
	tags  atomic.Uint64 // tags of the files passed on the socket (OpCacheMap)
	pins  sessionPins   // pinned cache pages (OpMapPin, pins.go)
	wlog  writeLog      // write windows' log (OpWriteLog, windows.go)
}

var _ host.Drainer = (*session)(nil)

func newSession(svc *Service) *session {
	s := &session{svc: svc, mux: ring.NewMux()}
	s.register()
	return s
}

func (s *session) Handler() ring.Handler { return s.mux }

func (s *session) Started(sc *ring.ServerConn) error {
	s.cred = sc.Cred
	s.sc = sc
	sc.ShareLoad(s.svc.load)
	s.svc.Stats.Sessions.Add(1)
	s.registerMem(sc.Region())
	return nil
}

// registerMem registers the session's whole region with a backend that
// registers memory, so that payloads move between the arena and the
// device without a copy. The whole mapping, not the arena: only the
// mapping of a huge-page region is 2 MiB aligned and sized, as SPDK needs.
// A failure costs a copy per request, not the session. Only the first is
// logged as a warning (a backend that refuses one region tends to refuse
// them all); mem_register_failures counts them all.
func (s *session) registerMem(r *ring.Region) {
	reg := s.svc.reg
	if reg == nil {
		return
	}
	if s.svc.opts.Ring.HugePages && r.Geometry().Features&ring.FeatureHugePages == 0 {
		// Fell back to ordinary pages (counted in createRegion): the
		// backend wants huge pages and could not register this mapping.
		return
	}
	mem := r.Bytes()
	if err := reg.RegisterMem(mem); err != nil {
		lvl := hclog.Debug
		if s.svc.Stats.MemRegisterFailures.Add(1) == 1 {
			lvl = hclog.Warn
		}
		s.svc.log.Log(lvl, "register session region with the backend: its payloads are copied (later failures are logged at debug level; all are counted in mem_register_failures)",
			"pid", s.cred.Pid, "bytes", len(mem), "error", err)
		return
	}
	s.mem = mem
}

// Drained unregisters the region after the session's last request, while
// it is still mapped.
func (s *session) Drained(*ring.ServerConn) {
	if s.mem == nil {
		return
	}
	if err := s.svc.reg.UnregisterMem(s.mem); err != nil {
		s.svc.Stats.MemUnregisterFailures.Add(1)
		s.svc.log.Error("unregister session region from the backend", "pid", s.cred.Pid,
			"bytes", len(s.mem), "error", err)
	}
	s.mem = nil
}

// Ended forgets the session's attachment. Its grants belong to the
// metadata session, which revokes them when it ends.
func (s *session) Ended(err error) {
	s.svc.Stats.Sessions.Add(-1)
	s.endPins()
	s.endWriteLog()
	if s.sid != 0 {
		s.svc.mu.Lock()
		if s.svc.sessions[s.sid] == s {
			delete(s.svc.sessions, s.sid)
		}
		if s.resync == s.svc.resyncs.Load() {
			s.svc.detachedLocked(s.sid)
		}
		s.svc.mu.Unlock()
	}
	s.svc.log.Debug("session ended", "session", s.sid, "error", err)
}

// register routes the opcodes. Reads and writes are served asynchronously:
// the session's goroutine checks the grant and hands the backend I/O to a
// goroutine of its own, then goes on taking requests, so one client session
// keeps as many backend I/Os in flight as it has requests (the ring bounds
// them at its SQ size). The other opcodes are rare and run on the session's
// goroutine.
//
// Running requests of one session concurrently reorders nothing a client
// relies on: a client goroutine that writes and then syncs (or truncates,
// or reads back) sends the second request only after the first one's
// completion, so the write is done before the sync is even taken. Requests
// that are in flight together were issued concurrently and have no order,
// as with pwrite(2) from two threads. O_APPEND writes are serialised per
// blob by openBlob.appendMu.
func (s *session) register() {
	s.mux.Handle(proto.OpAttach, s.attach)
	s.mux.HandleAsync(proto.OpRead, s.readAsync)
	s.mux.HandleAsync(proto.OpWrite, s.writeAsync)
	s.mux.Handle(proto.OpTruncate, s.truncate)
	s.mux.Handle(proto.OpSync, s.sync)
	s.mux.Handle(proto.OpGetAttr, s.getattr)
	s.mux.Handle(proto.OpCacheMap, s.cacheMap)
	s.mux.Handle(proto.OpReadahead, s.readaheadHint)
	s.mux.Handle(proto.OpClaim, s.claim)
	s.mux.Handle(proto.OpClaimDir, s.claimDir)
	s.mux.Handle(proto.OpRelease, s.release)
	s.mux.Handle(proto.OpStatFS, s.statfs)
	s.mux.Handle(proto.OpMapPin, s.mapPin)
	s.mux.Handle(proto.OpMapUnpin, s.mapUnpin)
	s.mux.Handle(proto.OpMapSync, s.mapSync)
	s.mux.Handle(proto.OpMapWritable, s.mapWritable)
	s.mux.Handle(proto.OpWriteLog, s.writeLogFile)
	s.mux.Handle(proto.OpWritePin, s.writePin)
	s.mux.Handle(proto.OpWriteUnpin, s.writeUnpin)
	s.mux.Handle(proto.OpSyncFS, s.syncFS)
}

// syncFS is syncfs(2) of the store (OpSyncFS): any attached session may
// ask, as any process may call sync(2); it costs the store a device flush
// per file with changes, nothing else.
func (s *session) syncFS(q *ring.Request) (int64, uint64) {
	if s.sid == 0 {
		return fail(syscall.ENOTCONN)
	}
	if q.Handle != 0 || q.Arg != 0 || q.Offset != 0 {
		return fail(syscall.EINVAL)
	}
	switch e := s.svc.syncAll(s.cred.Uid); e {
	case 0:
		s.svc.Stats.SyncFSs.Add(1)
		return 0, 0
	case errMetadataUnreachable:
		s.svc.Stats.Stale.Add(1)
		return fail(proto.ErrStale) // as OpSync: the client syncs again
	case syscall.ENOENT, errFileGone:
		return fail(syscall.EIO) // a blob missing under a file: not syncfs(2)'s errno
	default:
		return fail(e)
	}
}

// statfs answers the store's room (OpStatFS), for statfs(2) of a weir
// path: any attached session may ask, as any process may statfs a path.
func (s *session) statfs(q *ring.Request) (int64, uint64) {
	if s.sid == 0 {
		return fail(syscall.ENOTCONN)
	}
	if q.Length < proto.StatFSRespSize {
		return fail(syscall.ERANGE)
	}
	sp, ok := s.svc.be.(backend.Spacer)
	if !ok {
		return fail(syscall.EOPNOTSUPP)
	}
	room, err := sp.Space()
	if err != nil {
		s.svc.log.Warn("statfs of the store", "error", err)
		return fail(syscall.EIO)
	}
	r := proto.StatFSResp{Total: room.Total, Free: room.Free, Avail: room.Avail}
	return int64(q.WritePayload(r.Append(nil))), 0
}

var errEOF = io.EOF

func fail(e syscall.Errno) (int64, uint64) { return -int64(e), 0 }

// errno maps a backend or control error to what the client is told.
func errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// attach binds this ring to the client's metadata session, which the
// metadata service vouches for: the session must be of the incarnation
// this service was last resynchronised for, and belong to this ring's
// process and uid. A session already attached attaches again only when a
// resync made it stale (the client re-establishes itself).
func (s *session) attach(q *ring.Request) (int64, uint64) {
	svc := s.svc
	attached := s.sid != 0 && s.resync == svc.resyncs.Load()
	b := make([]byte, min(q.Length, proto.AttachReqSize))
	q.ReadPayload(b)
	r, err := proto.DecodeAttachReq(b)
	if err != nil {
		return fail(syscall.EINVAL)
	}
	if r.Version < proto.MinVersion || r.Version > proto.MaxVersion {
		svc.log.Warn("attach refused: protocol version", "pid", s.cred.Pid, "client_version", r.Version,
			"service_versions", fmt.Sprintf("%d-%d", proto.MinVersion, proto.MaxVersion))
		return -int64(proto.ErrVersion), proto.VersionRange(proto.MinVersion, proto.MaxVersion)
	}
	if attached {
		if r.Session == s.sid {
			return 0, 0 // attached already: nothing to do
		}
		return fail(syscall.EISCONN)
	}
	inc := svc.inc.Load()
	switch si := proto.IncarnationOf(r.Session); {
	case inc == 0 || si > inc:
		// Not resynchronised by the session's metadata incarnation yet
		// (io just started, or metadata's resync is on its way): the
		// client tries again. ESTALE would tell it its metadata session
		// is gone, and it would reopen every file in a new one, which
		// the same metadata incarnation refuses (the handles are its
		// own): TestIORestartUnderLoad failed so under load.
		return fail(syscall.EAGAIN)
	case si != inc:
		return fail(proto.ErrStale) // the session is of a metadata service that is gone
	}
	resync := svc.resyncs.Load()
	var info control.SessionInfo
	ctx := context.Background()
	if err := svc.request(ctx, svc.subj.Session, control.SessionQuery{Session: r.Session, Token: r.Token[:]}, &info); err != nil {
		if info.Err() == nil {
			// Not refused: metadata did not answer. The client may try again.
			svc.log.Warn("attach failed: the metadata service did not answer", "pid", s.cred.Pid, "session", r.Session, "error", err)
			return fail(syscall.EAGAIN)
		}
		svc.log.Warn("attach refused", "pid", s.cred.Pid, "session", r.Session, "error", err)
		return fail(syscall.EPERM)
	}
	// The metadata session and this ring must belong to the same process,
	// as the kernel reported it to each service.
	if info.PID != s.cred.Pid || info.UID != s.cred.Uid {
		svc.log.Warn("attach from another process", "pid", s.cred.Pid, "owner_pid", info.PID)
		return fail(syscall.EPERM)
	}
	svc.mu.Lock()
	if svc.resyncs.Load() != resync {
		svc.mu.Unlock()
		return fail(syscall.EAGAIN) // a resync came in between: the next try sees which
	}
	if s.sid != 0 && svc.sessions[s.sid] == s {
		delete(svc.sessions, s.sid)
	}
	svc.sessions[r.Session] = s
	svc.attachedLocked(r.Session)
	svc.mu.Unlock()
	s.sid, s.resync = r.Session, resync
	return 0, 0
}

// access is what a request needs from its handle's grant.
type access int

const (
	accAny access = iota // any grant: sync, getattr
	accRead
	accWrite
)

// use looks up the grant for a request's handle and checks the access it
// needs. The grant stays active until done(g) is called. It reads sid, so
// it runs on the session's goroutine.
func (s *session) use(q *ring.Request, need access) (*grant, syscall.Errno) {
	if s.sid == 0 {
		return nil, syscall.ENOTCONN
	}
	if s.resync != s.svc.resyncs.Load() {
		s.svc.Stats.Stale.Add(1)
		return nil, proto.ErrStale
	}
	g := s.svc.lookup(s.sid, q.Handle)
	if g == nil {
		s.svc.Stats.Denied.Add(1)
		return nil, syscall.EBADF
	}
	if (need == accWrite && !g.write) || (need == accRead && !g.read) {
		s.svc.done(g)
		s.svc.Stats.Denied.Add(1)
		return nil, syscall.EBADF
	}
	return g, 0
}

// readAsync and writeAsync serve reads and writes: see serveIO.
func (s *session) readAsync(q *ring.Request, done func(int64, uint64)) {
	s.serveIO(q, accRead, s.read, done)
}

func (s *session) writeAsync(q *ring.Request, done func(int64, uint64)) {
	s.serveIO(q, accWrite, func(g *grant, q *ring.Request, _ *[]func()) (int64, uint64) { return s.write(g, q) }, done)
}

// serveIO checks the grant on the session's goroutine, then runs do there
// if the request is alone (nothing else of the session in flight or queued:
// a hand-off would only add latency), else on a goroutine of its own. do
// may leave work for after its answer (a fill's store into the memfd) in
// later: it runs once the answer is posted.
func (s *session) serveIO(q *ring.Request, need access, do func(*grant, *ring.Request, *[]func()) (int64, uint64), done func(int64, uint64)) {
	g, e := s.use(q, need)
	if e != 0 {
		done(fail(e))
		return
	}
	if q.Alone && !s.svc.handOffAlways.Load() {
		s.svc.Stats.InlineIO.Add(1)
		later := s.later[:0]
		done(do(g, q, &later))
		runLater(later)
		s.later = later[:0]
		return
	}
	s.svc.Stats.HandedOffIO.Add(1)
	q = q.Clone()
	go func() {
		var later []func()
		done(do(g, q, &later))
		runLater(later)
	}()
}

// runLater runs what a request left for after its answer.
func runLater(fns []func()) {
	for i, f := range fns {
		f()
		fns[i] = nil
	}
}

// read serves a read with the grant use returned and ends it. A read at or
// past the end of the file reads nothing (EOF), whatever the offset, as on
// Linux. Safe on any goroutine.
//
// The grant's use ends after what the read left in later (a store that
// holds the region, with pages busy): ending it may be a close's last
// reference, which writes the file's dirty pages home and so takes the
// region's locks and pages again on this goroutine.
func (s *session) read(g *grant, q *ring.Request, later *[]func()) (int64, uint64) {
	defer func() { *later = append(*later, func() { s.svc.done(g) }) }()
	if int64(q.Offset) < 0 || q.Arg&^proto.ReadDirect != 0 {
		return fail(syscall.EINVAL)
	}
	off := int64(q.Offset)
	direct := q.Arg&proto.ReadDirect != 0
	if direct && (off%proto.DirectAlign != 0 || q.Length%proto.DirectAlign != 0) {
		return fail(syscall.EINVAL) // as Linux's O_DIRECT: block-aligned offset and length
	}
	size := g.blob.logical()
	if off >= size {
		s.svc.Stats.Reads.Add(1)
		return 0, 0
	}
	if direct {
		return s.readDirect(g, q, off, size)
	}
	if r := s.svc.regionOf(g.blob); r != nil && off < cache.MaxCapacity {
		return s.readCached(g, r, q, off, size, later)
	}
	var n int64
	for i := 0; i < len(q.Segs); {
		var run []byte
		run, i = q.Run(i)
		m, err := g.blob.b.ReadAt(run, off+n)
		n += int64(m)
		if err != nil {
			if errors.Is(err, errEOF) || (errors.Is(err, syscall.EFBIG) && n > 0) {
				break
			}
			return fail(errno(err))
		}
	}
	s.svc.Stats.Reads.Add(1)
	s.svc.Stats.BytesRead.Add(uint64(n))
	return n, 0
}

// readDirect is an O_DIRECT read of the bytes at off, below size: from
// the device (into the request's arena buffer, which the SPDK backend
// reads into without a copy), after the file's dirty pages in the range
// are written home, so that it returns every write that returned before it, as Linux's
// O_DIRECT read does (filemap_write_and_wait_range). Bytes past the
// device's end, below the size, read as zeros.
func (s *session) readDirect(g *grant, q *ring.Request, off, size int64) (int64, uint64) {
	p0 := uint64(off) / cache.PageSize
	p1 := (uint64(off) + uint64(q.Length) + cache.PageSize - 1) / cache.PageSize
	s.svc.drainRegion(g.blob.cached.Load()) // clients' stores into write windows are dirty pages
	if r := g.blob.cached.Load(); r != nil && r.hasDirtyIn(p0, p1) {
		s.svc.pc.DirectFlushes.Add(1)
		if _, err := r.flushRange(g.blob.b, g.blob.logical, true, p0, p1); err != nil {
			s.svc.log.Warn("O_DIRECT read: writing dirty pages home failed", "blob", g.blob.id, "error", err)
			return fail(syscall.EIO)
		}
	}
	return s.readRuns(q, off, size, func(run []byte, at int64) (int, error) {
		return deviceRead(g.blob.b, run, at, g.blob.logical)
	})
}

// readCached is read through the blob's cache region: the bytes up to the
// file's size, from resident pages, filling the missing ones with
// readahead.
func (s *session) readCached(g *grant, r *region, q *ring.Request, off, size int64, later *[]func()) (int64, uint64) {
	ra := g.readahead(off, int64(q.Length), s.svc.pc.readahead)
	return s.readRuns(q, off, size, func(run []byte, at int64) (int, error) {
		// A run's read may leave its store for after the answer, holding
		// the region: it must end before the next run's read holds it again.
		runLater(*later)
		*later = (*later)[:0]
		return r.read(g.blob.b, run, at, g.blob.logical, ra, later)
	})
}

// readRuns reads the request's payload runs at off with read (run's bytes
// at file offset at), up to size: a short run ends the read, and so does
// an error, which fails it if nothing was read.
func (s *session) readRuns(q *ring.Request, off, size int64, read func(run []byte, at int64) (int, error)) (int64, uint64) {
	var n int64
	for i := 0; i < len(q.Segs) && off+n < size; {
		var run []byte
		run, i = q.Run(i)
		run = run[:min(int64(len(run)), size-(off+n))]
		m, err := read(run, off+n)
		n += int64(m)
		if err != nil {
			if n > 0 {
				break
			}
			return fail(errno(err))
		}
		if m < len(run) {
			break
		}
	}
	s.svc.Stats.Reads.Add(1)
	s.svc.Stats.BytesRead.Add(uint64(n))
	return n, 0
}

// readahead is the window (pages) a read of n bytes at off gets: a read
// that starts where the last one ended, or inside the window that one read
// ahead (the client read those pages from its mapping), is sequential and
// doubles the window from 4 pages up to max; any other resets it.
func (g *grant) readahead(off, n int64, maxPages int) int {
	if maxPages <= 0 {
		return 0
	}
	prev := g.raNext.Swap(off + n)
	win := int(g.raWin.Load())
	if off < prev || off > prev+int64(win)*cache.PageSize {
		g.raWin.Store(0)
		return 0
	}
	win = min(max(2*win, 4), maxPages)
	g.raWin.Store(int32(win))
	return win
}

// write serves a write with the grant use returned and ends it. A write
// that fails changes nothing (the backends guarantee it). With O_SYNC or
// O_DSYNC the write is followed by what fsync does, and fails if that
// does. Safe on any goroutine.
func (s *session) write(g *grant, q *ring.Request) (int64, uint64) {
	defer s.svc.done(g)
	ob := g.blob
	off := int64(q.Offset)
	if q.Arg&^(proto.WriteAppend|proto.WriteDirect) != 0 {
		return fail(syscall.EINVAL)
	}
	if q.Arg&proto.WriteAppend != 0 {
		ob.appendMu.Lock()
		defer ob.appendMu.Unlock()
		off = ob.logical()
	} else if off < 0 {
		return fail(syscall.EINVAL)
	}
	direct := q.Arg&proto.WriteDirect != 0
	if direct && (off%proto.DirectAlign != 0 || q.Length%proto.DirectAlign != 0) {
		return fail(syscall.EINVAL) // as Linux's O_DIRECT: block-aligned offset and length
	}
	if q.Length > 0 {
		if off > math.MaxInt64-int64(q.Length) {
			return fail(syscall.EINVAL) // the end overflows: EINVAL, as Linux's rw_verify_area says
		}
		if err := backend.CheckRange(off, int(min(q.Length, 1<<31))); err != nil {
			return fail(errno(err))
		}
	}
	n, e := s.writeData(ob, q, off, direct)
	if e == syscall.EMFILE || e == syscall.ENFILE {
		// No descriptor to make the blob's file with (its first write
		// creates it): a failed write changed nothing, so it is tried
		// again once the idle descriptors are back.
		s.svc.resourceRefused(e)
		if s.svc.relieve() {
			n, e = s.writeData(ob, q, off, direct)
		}
	}
	if e != 0 {
		return fail(e)
	}
	return s.wrote(g, ob, n, off)
}

// writeData writes the request's bytes at off: into the cache when the
// blob has a region (write-back, or write-through past the dirty limit),
// else to the device. It returns holding no lock of the region, so that
// what follows (an O_SYNC write's flush) may take them.
//
// A cached file's pages in the range stay busy from before the device
// write until the cache holds the new bytes, and the size covers them
// before they are released: no fill can publish older bytes or cut them
// at an older size, no reader sees a page half updated.
//
// A direct write (O_DIRECT) goes to the device with the pages held, and
// updates only the pages the cache holds already: it caches nothing anew.
func (s *session) writeData(ob *openBlob, q *ring.Request, off int64, direct bool) (int64, syscall.Errno) {
	if s.svc.pc != nil && q.Length > 0 && !direct {
		s.svc.regionOf(ob) // a file written is cached as it is written
	}
	r, ungate := ob.cachedGated()
	defer ungate()
	var runs [][]byte
	for i := 0; i < len(q.Segs); {
		var run []byte
		run, i = q.Run(i)
		runs = append(runs, run)
	}
	if r == nil || q.Length == 0 || off >= cache.MaxCapacity {
		if r != nil {
			// Past what a region caches: the device takes it, with the
			// region's truncate lock shared like every other change, so
			// that an fsync's holdChanges waits for it.
			r.life.RLock()
			defer r.life.RUnlock()
			r.trunc.RLock()
			defer r.trunc.RUnlock()
		}
		if ob.sf != nil && q.Length > 0 {
			ob.sf.markHome()
		}
		return deviceWrite(ob, runs, off)
	}
	r.life.RLock()
	defer r.life.RUnlock()
	r.trunc.RLock()
	defer r.trunc.RUnlock()
	if !direct {
		// Its room at home before the cache takes it (space.go): a full
		// store is this write's ENOSPC, not a lost write-back.
		if err := s.svc.reserve(ob, off, int64(q.Length)); err != nil {
			return 0, errno(err)
		}
	}
	p0 := uint64(off) / cache.PageSize
	p1 := min((uint64(off)+uint64(q.Length)+cache.PageSize-1)/cache.PageSize, cache.MaxCapacity/cache.PageSize)
	// A write that covers part of a page holding file bytes that are not
	// cached has that page filled first, so that the write can stay in
	// the cache (never a whole-page read for aligned writes).
	if !direct && off%cache.PageSize != 0 && int64(p0)*cache.PageSize < ob.logical() {
		_, _ = r.fill(ob.b, p0, p0+1, ob.logical, nil, nil)
	}
	if end := off + int64(q.Length); !direct && end%cache.PageSize != 0 && p1-1 != p0 && int64(p1-1)*cache.PageSize < ob.logical() {
		_, _ = r.fill(ob.b, p1-1, p1, ob.logical, nil, nil)
	}
	if sz := ob.logical(); off > sz && uint64(sz)/cache.PageSize < p0 {
		r.zeroPastEnd(ob.logical)         // the old last page, which the write does not hold
		r.zeroPinnedGap(pageCeil(sz), p0) // pages between, mapped by a client
	}
	lr, err := r.lock(p0, p1)
	if err != nil {
		return 0, errno(err)
	}
	// The size as of now that the pages are ours: every write that put
	// bytes in them is done, so bytes of theirs lie below it (written
	// caches a page only where the rest reads zeros).
	oldSize := ob.logical()
	n := int64(q.Length)
	if !direct && p1*cache.PageSize >= uint64(off)+uint64(n) && lr.cachable(off, n, oldSize) &&
		s.svc.pc.admitDirty(int64(len(lr.busy))) {
		// Write-back: the bytes stay in the cache, dirty, and the flusher
		// (or an fsync) writes them home. The size first: the flusher
		// writes a dirty page up to the size, so the size must cover its
		// bytes before it is dirty. Marked changed for the next fsync's
		// record before either (stagedSync reads the size first).
		if ob.sf != nil {
			ob.sf.markChanged(p0, p1)
			if h := testAfterMark; h != nil {
				h() // tests widen the window an fsync must not fall into
			}
		}
		if r.stage(lr, runs, off, n) {
			ob.extend(off + n)
			r.written(lr, runs, off, n, oldSize, writeBack)
			return n, 0
		}
		// The memfd could not take a new page (no memory): the device
		// takes the write, the pages still held.
		s.svc.pc.PageFailures.Add(1)
	}
	if ob.sf != nil {
		ob.sf.markHome() // the device takes the bytes: the next fsync syncs home
	}
	mode := writeThrough
	if direct {
		mode = writeDirect
		s.svc.pc.DirectWrites.Add(1)
	} else {
		s.svc.pc.WriteThroughs.Add(1)
	}
	r.flightWait(off, off+n)           // not over a write-back's device write to these pages
	n, e := deviceWrite(ob, runs, off) // extends the size before the pages go
	if e != 0 && n == 0 {
		lr.release()
		return 0, e
	}
	r.written(lr, runs, off, n, oldSize, mode)
	return n, 0
}

// deviceWrite writes runs at off to the blob and extends the size: the
// count, or the errno of a write that wrote nothing (a partial write
// reports its count, as write(2) does).
func deviceWrite(ob *openBlob, runs [][]byte, off int64) (int64, syscall.Errno) {
	if len(runs) > 1 {
		// One device write, not one per run of arena segments: a run
		// boundary falls anywhere in a page, and a crash between two
		// writes would leave a page half old, half new (TestCrash found
		// one). A single write tears at a page at worst.
		total := 0
		for _, r := range runs {
			total += len(r)
		}
		var buf []byte
		if total <= bounceSize {
			b := getBounce()
			defer putBounce(b)
			buf = (*b)[:0]
		} else {
			buf = make([]byte, 0, total)
		}
		for _, r := range runs {
			buf = append(buf, r...)
		}
		runs = [][]byte{buf}
	}
	var n int64
	for _, run := range runs {
		m, err := ob.b.WriteAt(run, off+n)
		n += int64(m)
		if err != nil {
			if n > 0 {
				break
			}
			return 0, errno(err)
		}
	}
	if n > 0 {
		ob.extend(off + n)
	}
	return n, 0
}

// wrote ends a write of n bytes at off: the change is recorded, and with
// O_SYNC or O_DSYNC made durable.
func (s *session) wrote(g *grant, ob *openBlob, n, off int64) (int64, uint64) {
	if n > 0 {
		s.svc.touch(ob)
	}
	s.svc.Stats.Writes.Add(1)
	s.svc.Stats.BytesWritten.Add(uint64(n))
	if g.sync != control.SyncNone && n > 0 {
		if e := s.svc.syncBlobAs(ob, s.cred.Uid); e != 0 {
			if e == errMetadataUnreachable || e == errFileGone {
				e = syscall.EIO
			}
			return fail(e)
		}
	}
	return n, uint64(off)
}

func (s *session) truncate(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accWrite)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	if int64(q.Offset) < 0 {
		return fail(syscall.EINVAL)
	}
	if err := s.svc.truncateBlob(g.blob, int64(q.Offset)); err != nil {
		return fail(errno(err))
	}
	s.svc.touch(g.blob)
	if g.sync != control.SyncNone {
		if e := s.svc.syncBlobAs(g.blob, s.cred.Uid); e != 0 {
			if e == errMetadataUnreachable || e == errFileGone {
				e = syscall.EIO
			}
			return fail(e)
		}
	}
	return 0, 0
}

// sync is fsync (and fdatasync: Arg = proto.SyncData, which is no cheaper
// here yet): see syncBlob.
func (s *session) sync(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accAny)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	if q.Arg&^proto.SyncData != 0 {
		return fail(syscall.EINVAL)
	}
	if e := s.svc.syncBlobAs(g.blob, s.cred.Uid); e != 0 {
		if e == errFileGone {
			e = syscall.EIO // (a handle holds the file: not expected)
		}
		if e == errMetadataUnreachable {
			// The data is durable; its size is not recorded because the
			// metadata service is away (restarting): the client
			// re-establishes its sessions and syncs again.
			s.svc.Stats.Stale.Add(1)
			return fail(proto.ErrStale)
		}
		return fail(e)
	}
	s.svc.Stats.Syncs.Add(1)
	return 0, 0
}

// syncBlob makes the blob durable (its bytes, and its existence if it was
// created since creates were last made durable), then the size and mtime
// it had when the sync began, before it returns: the size reported is the
// size synced, never one that writes racing the sync made larger.
func (svc *Service) syncBlob(ob *openBlob) syscall.Errno { return svc.syncBlobAs(ob, noUID) }

// syncBlobAs is syncBlob for a client of uid, whose share of the staging
// log it keeps to (limits.go).
func (svc *Service) syncBlobAs(ob *openBlob, uid uint32) syscall.Errno {
	svc.drainRegion(ob.cached.Load()) // every store into a write window before the fsync is in it
	if ob.sf != nil {
		return svc.stagedSyncAs(ob, uid)
	}
	size, mtime, dv := ob.live()
	if err := svc.flushBlob(ob, true); err != nil {
		svc.log.Error("fsync: write-back failed; the pages stay dirty", "blob", ob.id, "error", err)
		return errno(err)
	}
	if err := ob.b.Sync(); err != nil {
		svc.syncFailed(fmt.Errorf("sync blob %d: %w", ob.id, err))
		return errno(err)
	}
	if err := svc.ownWork(svc.creates.sync); err != nil {
		svc.syncFailed(fmt.Errorf("sync backend (blob creates): %w", err))
		return errno(err)
	}
	if ob.wrote.Load() {
		if err := svc.reportLive(context.Background(), ob.ino, size, mtime, dv, true); err != nil {
			e := reportErrno(err)
			switch e {
			case errMetadataUnreachable:
				svc.log.Warn("fsync: the metadata service did not record the size (not reachable)", "blob", ob.id, "error", err)
			case syscall.EIO:
				svc.log.Error("fsync: metadata refused the size", "blob", ob.id, "error", err)
			}
			return e
		}
	}
	return 0
}

// reportErrno is a sync's answer when its synced size report failed:
// errFileGone if the file no longer exists, errMetadataUnreachable if
// metadata did not answer, EIO if it refused the size.
func reportErrno(err error) syscall.Errno {
	var ref *control.Refusal
	switch {
	case fileGone(err):
		return errFileGone
	case !errors.As(err, &ref):
		return errMetadataUnreachable
	}
	return syscall.EIO
}

// errMetadataUnreachable is syncBlob's answer when the data is durable but
// the metadata service could not be reached to record the size: an fsync
// answers ESTALE (the client re-establishes itself and syncs again), a
// write with O_SYNC EIO (it happened; the size is not durable).
const errMetadataUnreachable = syscall.EHOSTUNREACH

// errFileGone is syncBlob's answer when metadata refused the size because
// the file no longer exists: a syncfs of a file closed and removed since
// (syncAll) has nothing to keep; a sync through a handle answers EIO.
const errFileGone = syscall.Errno(1 << 20) // (no kernel errno: never a backend's ENOENT)

// cacheMap passes the handle's cache region to the client: read-only
// descriptions of its meta memfd and its data memfd on the session socket,
// tagged with the completion's Aux and Aux+1. A handle that cannot read
// gets EBADF; without the cache, EOPNOTSUPP (the client reads through the
// ring); a client that leaves its socket unread, EAGAIN.
func (s *session) cacheMap(q *ring.Request) (int64, uint64) {
	g, e := s.mappable(q)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	r := s.svc.regionOf(g.blob)
	if r == nil {
		return fail(syscall.EOPNOTSUPP)
	}
	m, d, err := withRelief2(s.svc, func() (*os.File, *os.File, error) { return r.describe(true, false) })
	if err != nil {
		return fail(s.svc.descriptorErrno(err))
	}
	defer m.Close()
	defer d.Close()
	tag := s.tags.Add(2) - 1
	for i, f := range []*os.File{m, d} {
		if e := s.sendFile(tag+uint64(i), f); e != 0 {
			return fail(e)
		}
	}
	s.svc.pc.Maps.Add(1)
	return 0, tag
}

// mapWritable serves OpMapWritable: a read-write description of the
// handle's data memfd on the session socket, tagged with the completion's
// Aux, for a writable MAP_SHARED mapping of the file (the client's stores
// reach io's cache; OpMapSync, a writable pin's OpMapUnpin and the
// session's end make them dirty). Only a handle that may write the file
// gets it (EBADF): the data memfd holds nothing but the file's bytes, so
// its holder can change nothing a write could not. Direct opens and a
// service without the cache: as cacheMap.
func (s *session) mapWritable(q *ring.Request) (int64, uint64) {
	g, e := s.writableMappable(q)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	r := s.svc.regionOf(g.blob)
	if r == nil {
		return fail(syscall.EOPNOTSUPP)
	}
	_, d, err := withRelief2(s.svc, func() (*os.File, *os.File, error) { return r.describe(false, true) })
	if err != nil {
		return fail(s.svc.descriptorErrno(err))
	}
	defer d.Close()
	tag := s.tags.Add(1)
	if e := s.sendFile(tag, d); e != 0 {
		return fail(e)
	}
	s.svc.pc.Maps.Add(1)
	return 0, tag
}

// sendFile passes f on the session socket with tag: EAGAIN when the client
// leaves its socket unread, EIO when it failed.
func (s *session) sendFile(tag uint64, f *os.File) syscall.Errno {
	if err := s.sc.SendFile(tag, f); err != nil {
		if errors.Is(err, ring.ErrSocketFull) {
			return syscall.EAGAIN
		}
		return syscall.EIO
	}
	return 0
}

// mappable is the grant of a request that maps or pins the handle's cache
// pages (OpCacheMap, OpMapPin): a readable one, not a direct open's
// (direct.go: a writer's grant ends it, and could not take a mapping
// back: EBADF). The caller calls done(g).
func (s *session) mappable(q *ring.Request) (*grant, syscall.Errno) {
	g, e := s.use(q, accRead)
	if e != 0 {
		return nil, e
	}
	if g.dirOpens != nil {
		s.svc.done(g)
		s.svc.Stats.Denied.Add(1)
		return nil, syscall.EBADF
	}
	return g, 0
}

// writableMappable is mappable for a handle that may also write the file
// (EBADF: one that may not): OpMapWritable's and OpWritePin's.
func (s *session) writableMappable(q *ring.Request) (*grant, syscall.Errno) {
	g, e := s.mappable(q)
	if e != 0 {
		return nil, e
	}
	if !g.write {
		s.svc.done(g)
		s.svc.Stats.Denied.Add(1)
		return nil, syscall.EBADF
	}
	return g, 0
}

// maxReadaheadHint bounds the bytes one OpReadahead asks for.
const maxReadaheadHint = 8 << 20

// readaheadHint starts filling Arg bytes of the file at Offset (at most
// maxReadaheadHint, inside the file) on a goroutine and answers at once:
// a client reading sequentially from its mapping asks for what it will
// read next. Nothing to do (no cache, past the end, one running) is 0 too.
func (s *session) readaheadHint(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accRead)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	off := int64(q.Offset)
	if off < 0 || q.Arg == 0 {
		return fail(syscall.EINVAL)
	}
	r := s.svc.regionOf(g.blob)
	size := g.blob.logical()
	if r == nil || off >= size || off >= cache.MaxCapacity {
		return 0, 0
	}
	end := min(off+int64(min(q.Arg, maxReadaheadHint)), size, cache.MaxCapacity)
	r.readaheadAsync(g.blob.b, uint64(off)/cache.PageSize, (uint64(end)+cache.PageSize-1)/cache.PageSize, g.blob.logical)
	return 0, 0
}

func (s *session) getattr(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accAny)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.done(g)
	if q.Length < proto.GetAttrRespSize {
		return fail(syscall.EINVAL)
	}
	size, mtime, _ := g.blob.live()
	r := proto.GetAttrResp{Size: size, Mtime: mtime, Changed: g.blob.wrote.Load()}
	return int64(q.WritePayload(r.Append(nil))), 0
}
