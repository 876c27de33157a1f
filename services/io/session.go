package iosvc

import (
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/ringsrv"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// session is one client's ring session. Its fields are owned by the
// session's goroutine: Started, the ring handlers and Drained all run there.
// Reads and writes run their backend I/O on goroutines of their own (see
// register); those get what they need from the session's goroutine (the
// grant, looked up with sid there) and touch no session field.
type session struct {
	svc  *Service
	mux  *ring.Mux
	cred *unix.Ucred
	sid  uint64 // metadata session this ring is bound to; 0 until OpAttach
	mem  []byte // the region as registered with the backend; nil if not registered
}

var _ ringsrv.Drainer = (*session)(nil)

func newSession(svc *Service) *session {
	s := &session{svc: svc, mux: ring.NewMux()}
	s.register()
	return s
}

func (s *session) Handler() ring.Handler { return s.mux }

func (s *session) Started(sc *ring.ServerConn) error {
	s.cred = sc.Cred
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

// Ended needs no clean-up: grants belong to the metadata session, which
// revokes them when it ends.
func (s *session) Ended(err error) {
	s.svc.Stats.Sessions.Add(-1)
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

func (s *session) attach(q *ring.Request) (int64, uint64) {
	if s.sid != 0 {
		return fail(syscall.EISCONN)
	}
	if q.Length < 8+proto.TokenSize {
		return fail(syscall.EINVAL)
	}
	body := make([]byte, 8+proto.TokenSize)
	q.ReadPayload(body)
	d := proto.NewDec(body)
	sid := d.U64()
	token := d.Bytes(proto.TokenSize)
	var info control.SessionInfo
	if err := s.svc.request(s.svc.subj.Session, control.SessionQuery{Session: sid, Token: token}, &info); err != nil {
		s.svc.log.Warn("attach refused", "pid", s.cred.Pid, "session", sid, "error", err)
		return fail(syscall.EPERM)
	}
	// The metadata session and this ring must belong to the same process,
	// as the kernel reported it to each service.
	if info.PID != s.cred.Pid || info.UID != s.cred.Uid {
		s.svc.log.Warn("attach from another process", "pid", s.cred.Pid, "owner_pid", info.PID)
		return fail(syscall.EPERM)
	}
	s.sid = sid
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
// needs. The grant's blob holds a reference until releaseBlob(g.blob) is
// called. It reads sid, so it runs on the session's goroutine.
func (s *session) use(q *ring.Request, need access) (*grant, syscall.Errno) {
	if s.sid == 0 {
		return nil, syscall.ENOTCONN
	}
	g := s.svc.lookup(s.sid, q.Handle)
	if g == nil {
		s.svc.Stats.Denied.Add(1)
		return nil, syscall.EBADF
	}
	if (need == accWrite && !g.write) || (need == accRead && !g.read) {
		s.svc.releaseBlob(g.blob)
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
	s.serveIO(q, accWrite, s.write, done)
}

// serveIO checks the grant on the session's goroutine, then runs do there
// if the request is alone (nothing else of the session in flight or queued:
// a hand-off would only add latency), else on a goroutine of its own.
func (s *session) serveIO(q *ring.Request, need access, do func(*grant, *ring.Request) (int64, uint64), done func(int64, uint64)) {
	g, e := s.use(q, need)
	if e != 0 {
		done(fail(e))
		return
	}
	if q.Alone && !s.svc.handOffAlways.Load() {
		s.svc.Stats.InlineIO.Add(1)
		done(do(g, q))
		return
	}
	s.svc.Stats.HandedOffIO.Add(1)
	q = q.Clone()
	go func() { done(do(g, q)) }()
}

// read serves a read with the grant use returned; it drops the grant's
// blob reference. Safe on any goroutine.
func (s *session) read(g *grant, q *ring.Request) (int64, uint64) {
	defer s.svc.releaseBlob(g.blob)
	if int64(q.Offset) < 0 {
		return fail(syscall.EINVAL)
	}
	off := int64(q.Offset)
	var n int64
	for i := 0; i < len(q.Segs); {
		var run []byte
		run, i = q.Run(i)
		m, err := g.blob.b.ReadAt(run, off+n)
		n += int64(m)
		if err != nil {
			if errors.Is(err, errEOF) {
				break
			}
			return fail(errno(err))
		}
	}
	s.svc.Stats.Reads.Add(1)
	s.svc.Stats.BytesRead.Add(uint64(n))
	return n, 0
}

// write serves a write with the grant use returned; it drops the grant's
// blob reference. Safe on any goroutine.
func (s *session) write(g *grant, q *ring.Request) (int64, uint64) {
	defer s.svc.releaseBlob(g.blob)
	ob := g.blob
	off := int64(q.Offset)
	switch q.Arg {
	case 0:
		if off < 0 {
			return fail(syscall.EINVAL)
		}
	case proto.WriteAppend:
		ob.appendMu.Lock()
		defer ob.appendMu.Unlock()
		off = ob.b.Size()
	default:
		return fail(syscall.EINVAL)
	}
	var n int64
	for i := 0; i < len(q.Segs); {
		var run []byte
		run, i = q.Run(i)
		m, err := ob.b.WriteAt(run, off+n)
		n += int64(m)
		if err != nil {
			if n > 0 {
				break // report the partial write, as write(2) does
			}
			return fail(errno(err))
		}
	}
	ob.touch()
	s.svc.Stats.Writes.Add(1)
	s.svc.Stats.BytesWritten.Add(uint64(n))
	return n, uint64(off)
}

func (s *session) truncate(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accWrite)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.releaseBlob(g.blob)
	if int64(q.Offset) < 0 {
		return fail(syscall.EINVAL)
	}
	if err := g.blob.b.Truncate(int64(q.Offset)); err != nil {
		return fail(errno(err))
	}
	g.blob.touch()
	return 0, 0
}

// sync makes the blob durable (its bytes, and its existence if it was
// created since creates were last made durable), then its size and mtime,
// before answering.
func (s *session) sync(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accAny)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.releaseBlob(g.blob)
	if err := g.blob.b.Sync(); err != nil {
		s.svc.syncFailed(fmt.Errorf("sync blob %d: %w", g.blob.id, err))
		return fail(errno(err))
	}
	if err := s.svc.creates.sync(); err != nil {
		s.svc.syncFailed(fmt.Errorf("sync backend (blob creates): %w", err))
		return fail(errno(err))
	}
	if g.blob.wrote.Load() {
		if err := s.svc.reportLive(g.blob, true); err != nil {
			s.svc.log.Error("fsync: metadata not updated", "blob", g.blob.id, "error", err)
			return fail(syscall.EIO)
		}
	}
	s.svc.Stats.Syncs.Add(1)
	return 0, 0
}

func (s *session) getattr(q *ring.Request) (int64, uint64) {
	g, e := s.use(q, accAny)
	if e != 0 {
		return fail(e)
	}
	defer s.svc.releaseBlob(g.blob)
	if q.Length < 17 {
		return fail(syscall.EINVAL)
	}
	var out proto.Enc
	out.I64(g.blob.b.Size())
	out.I64(g.blob.mtime.Load())
	out.U8(boolByte(g.blob.wrote.Load()))
	return int64(q.WritePayload(out.B)), 0
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
