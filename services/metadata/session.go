package metadata

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// handle is one open file or directory of a session.
type handle struct {
	ino   ns.Ino
	dir   bool
	blob  uint64
	flags int       // open flags as the ticket keeps them
	file  *openFile // regular files; nil for directories
	// grantEpoch is the io epoch of the handle's grant, 0 while it has
	// none; a grant of an epoch that is over is void.
	grantEpoch uint64
	pending    *control.Grant // the grant to ask for at the first read or write
	write      bool
	unpriv     bool   // granted for writing to a non-root session: a write drops setuid/setgid
	lease      *lease // the kept lease it uses (leases.go), whose grant is its grant; nil if none
	// throughIO: its grant was made through io after a refused claim
	// (GrantThroughIO, caps.go), which is honoured once per handle.
	throughIO bool
	rec       *grantRec // its grant in the file's registry (groups.go); nil while it has none
	noCap     bool      // a recall spent its capability: it is granted through io
	prev      *grantRec // its last grant, recalled: its next may be protected (groups.go)
	// origin names the open file description the handle is of (locks.go):
	// its own id, or for OpInherit the handle the ticket was issued with;
	// counted: it is counted among the origin's live handles.
	origin  uint64
	counted bool
}

// session is one client's metadata ring. id, pid, cred and token are set
// in Started, before the first request; features at OpHello, before any
// other request is served; handles is owned by the session's poller
// goroutine, where ring handlers run, and then by Ended.
type session struct {
	svc      *Service
	mux      *ring.Mux
	id       uint64
	pid      int32
	cred     ns.Cred
	token    [proto.TokenSize]byte
	hello    bool   // OpHello succeeded
	version  uint32 // negotiated protocol version
	features uint64 // negotiated features
	group    string // its trust group (groups.go)
	handles  map[uint64]*handle
	// warnedTicket: a refused ticket was logged (once per session).
	warnedTicket bool
	notices      notices // recall notices (notices.go)
	// in, out: the open's request and answer bodies, reused (the
	// session's requests are served one at a time, by its poller; an
	// open costs no allocation for either).
	in, out []byte
}

func newSession(svc *Service) *session {
	se := &session{svc: svc, mux: ring.NewMux(), handles: make(map[uint64]*handle)}
	se.register()
	return se
}

func (se *session) Handler() ring.Handler { return se.mux }

// Started records who the kernel says the client is and gives the session
// its id (in this incarnation) and the token that binds the client's IO
// session to it.
func (se *session) Started(sc *ring.ServerConn) error {
	se.pid = sc.Cred.Pid
	se.cred = ns.Cred{UID: sc.Cred.Uid, GID: sc.Cred.Gid, Groups: supplementaryGroups(sc.Cred.Pid)}
	if _, err := rand.Read(se.token[:]); err != nil {
		return fmt.Errorf("session token: %w", err)
	}
	s := se.svc
	s.mu.Lock()
	s.nextSID++
	se.id = proto.MakeID(s.inc, s.nextSID)
	se.group = s.groupOf(se.id, se.pid, se.cred.UID)
	s.sessions[se.id] = se
	s.mu.Unlock()
	s.Stats.Sessions.Add(1)
	go func() {
		<-sc.Ending()
		se.notices.end() // a pending OpRecallWait must not hold the session's end
	}()
	return nil
}

// Ended closes every handle the session left open (revoking its grants)
// and forgets the session.
func (se *session) Ended(err error) {
	se.closeAll()
	s := se.svc
	if se.features&proto.FeatureCaps != 0 {
		s.endClaims(se.id)
	}
	s.mu.Lock()
	delete(s.sessions, se.id)
	s.mu.Unlock()
	s.Stats.Sessions.Add(-1)
}

func (se *session) register() {
	for op, f := range map[uint8]ring.HandlerFunc{
		proto.OpHello: se.helloOp, proto.OpStat: se.stat, proto.OpOpen: se.open, proto.OpClose: se.close,
		proto.OpMkdir: se.mkdir, proto.OpRmdir: se.rmdir, proto.OpUnlink: se.unlink, proto.OpRename: se.rename,
		proto.OpChmod: se.chmod, proto.OpChown: se.chown, proto.OpChtimes: se.chtimes,
		proto.OpReadDir: se.readdir, proto.OpFStat: se.fstat, proto.OpSyncMeta: se.syncMeta,
		proto.OpGrant: se.grantOp, proto.OpFChmod: se.fchmod, proto.OpFChown: se.fchown,
		proto.OpFChtimes: se.fchtimes, proto.OpReopen: se.reopen, proto.OpDirLease: se.dirLease,
		proto.OpInherit: se.inherit, proto.OpLock: se.lock,
		proto.OpReadlink: se.readlink, proto.OpSymlink: se.symlink, proto.OpLink: se.link,
		proto.OpCut: se.cut,
	} {
		se.mux.Handle(op, func(q *ring.Request) (int64, uint64) {
			se.svc.Stats.Requests.Add(1)
			if !se.hello && op != proto.OpHello {
				return se.errno(syscall.ENOTCONN) // the protocol starts with OpHello
			}
			if dirChanging[op] {
				return se.svc.changeDir(func() (int64, uint64) { return f(q) })
			}
			return f(q)
		})
	}
	se.mux.HandleAsync(proto.OpRecallWait, se.recallWait)
}

// errno turns a namespace or control error into what the client is told.
func (se *session) errno(err error) (int64, uint64) {
	var fe *ns.FollowError
	if errors.As(err, &fe) {
		// A symbolic link for the client to follow: not an error.
		if se.features&proto.FeatureLinks == 0 {
			return -int64(syscall.ELOOP), 0
		}
		return -int64(proto.ErrFollow), proto.FollowAux(fe.Start, fe.End, fe.Second, fe.Above)
	}
	se.svc.Stats.Errors.Add(1)
	var e syscall.Errno
	if errors.As(err, &e) {
		return -int64(e), 0
	}
	se.svc.log.Error("request failed", "session", se.id, "error", err)
	return -int64(syscall.EIO), 0
}

// body copies the request payload out of the arena once: the client can
// rewrite the arena while we work.
func body(q *ring.Request) []byte { return readBody(q, nil) }

// maxKeptBody bounds the request buffer a session keeps for its opens
// (a longer body, which a client may send, is read into one of its own).
const maxKeptBody = 8 << 10

// readBody reads q's body into buf's storage, grown if it is too small
// (at most to the request's length, which the ring bounds by its arena).
func readBody(q *ring.Request, buf []byte) []byte {
	if uint64(cap(buf)) < q.Length {
		buf = make([]byte, q.Length)
	}
	buf = buf[:q.Length]
	q.ReadPayload(buf)
	return buf
}

// reply writes a response body over the request; a response that does not
// fit the client's buffer is ERANGE (the client sizes buffers so that
// cannot happen).
func reply(q *ring.Request, out []byte) (int64, uint64) {
	if uint64(len(out)) > q.Length {
		return -int64(syscall.ERANGE), 0
	}
	return int64(q.WritePayload(out)), 0
}

func toProto(a ns.Attr) proto.Attr {
	return proto.Attr{Ino: uint64(a.Ino), Mode: a.Mode, UID: a.UID, GID: a.GID, Nlink: a.Nlink,
		Size: a.Size, Atime: a.Atime, Mtime: a.Mtime, Ctime: a.Ctime}
}

func (se *session) attrReply(q *ring.Request, a ns.Attr) (int64, uint64) {
	w := toProto(se.svc.liveAttr(a))
	return reply(q, proto.AppendAttr(nil, &w))
}

// helloOp negotiates the protocol version and features, and answers the
// session id and token. No version in common is EPROTONOSUPPORT with this
// service's range in Aux.
func (se *session) helloOp(q *ring.Request) (int64, uint64) {
	if se.hello {
		return se.errno(syscall.EISCONN)
	}
	r, err := proto.DecodeHelloReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	v, ok := proto.Negotiate(r.MinVersion, r.MaxVersion)
	if !ok {
		se.svc.log.Warn("client speaks no protocol version of this service", "pid", se.pid,
			"client_versions", fmt.Sprintf("%d-%d", r.MinVersion, r.MaxVersion),
			"service_versions", fmt.Sprintf("%d-%d", proto.MinVersion, proto.MaxVersion))
		se.svc.Stats.Errors.Add(1)
		return -int64(proto.ErrVersion), proto.VersionRange(proto.MinVersion, proto.MaxVersion)
	}
	feats := r.Features & proto.KnownFeatures
	if need := proto.FeatureCaps | proto.FeatureLeases | proto.FeatureOpenCap; feats&need != need {
		// Direct opens end with the session's revoke of every grant,
		// which only a capability session is sent (endClaims).
		feats &^= proto.FeatureDirOpen
	}
	if !se.svc.opts.RecordCuts {
		feats &^= proto.FeatureRecordCuts // io's staging log makes its cuts durable (cuts.go)
	}
	resp := proto.HelloResp{Version: v, Features: feats, Session: se.id, Token: se.token}
	res, aux := reply(q, resp.Append(nil))
	if res >= 0 {
		se.hello, se.version, se.features = true, v, resp.Features
		se.cred.Mounted = resp.Features&proto.FeatureMounted != 0
		se.notices.mu.Lock()
		se.notices.on = resp.Features&proto.FeatureRecalls != 0
		se.notices.mu.Unlock()
	}
	return res, aux
}

// dirIno returns the inode a path operation starts from: the root for
// proto.RootHandle, else the directory the session has open as that
// handle (EBADF: no such handle; ENOTDIR: not a directory).
func (se *session) dirIno(handle uint64) (ns.Ino, error) {
	if handle == proto.RootHandle {
		return ns.RootIno, nil
	}
	h := se.handles[handle]
	switch {
	case h == nil:
		return 0, syscall.EBADF
	case !h.dir:
		return 0, syscall.ENOTDIR
	}
	return h.ino, nil
}

func (se *session) stat(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodePathReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	stat := se.svc.ns.StatAt
	if q.Arg&proto.PathNoFollow != 0 {
		stat = se.svc.ns.LstatAt
	}
	a, err := stat(se.cred, dir, r.Path)
	if err != nil {
		return se.errno(err)
	}
	return se.attrReply(q, a)
}

func (se *session) readlink(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodePathReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	t, err := se.svc.ns.ReadlinkAt(se.cred, dir, r.Path)
	if err != nil {
		return se.errno(err)
	}
	return reply(q, []byte(t))
}

func (se *session) symlink(q *ring.Request) (int64, uint64) {
	if q.Length < proto.AttrSize {
		return se.errno(syscall.ERANGE) // (refused before the link is made)
	}
	r, err := proto.DecodeSymlinkReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	a, err := se.svc.ns.SymlinkAt(se.cred, r.Target, dir, r.Path)
	if err != nil {
		return se.errno(err)
	}
	return se.attrReply(q, a)
}

func (se *session) link(q *ring.Request) (int64, uint64) {
	if q.Length < proto.AttrSize {
		return se.errno(syscall.ERANGE)
	}
	r, err := proto.DecodeRenameReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	olddir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	newdir, err := se.dirIno(r.NewDir)
	if err != nil {
		return se.errno(err)
	}
	a, err := se.svc.ns.LinkAt(se.cred, olddir, r.Old, newdir, r.New, q.Arg&proto.LinkFollow != 0)
	if err != nil {
		return se.errno(err)
	}
	return se.attrReply(q, a)
}

func (se *session) fstat(q *ring.Request) (int64, uint64) {
	h := se.handles[q.Handle]
	if h == nil {
		return se.errno(syscall.EBADF)
	}
	a, err := se.svc.ns.GetAttr(h.ino)
	if err != nil {
		return se.errno(err)
	}
	return se.attrReply(q, a)
}

// syncMode is what O_SYNC and O_DSYNC ask of every write.
func syncMode(flags int) control.SyncMode {
	switch {
	case flags&syscall.O_SYNC == syscall.O_SYNC:
		return control.SyncAll
	case flags&syscall.O_DSYNC != 0:
		return control.SyncData
	}
	return control.SyncNone
}

func (se *session) open(q *ring.Request) (int64, uint64) {
	if q.Length < uint64(proto.OpenRespSize(se.features)) {
		// Refused before anything happens: an answer that cannot be
		// written would leave a created file, a handle and a lease
		// behind that the client never hears of.
		return se.errno(syscall.ERANGE)
	}
	in := readBody(q, se.in)
	if cap(in) <= maxKeptBody {
		se.in = in
	}
	r, err := proto.DecodeModePathReq(in) // (the path is copied out)
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	flags := int(int32(q.Arg))
	a, created, err := se.svc.ns.OpenAt(se.cred, dir, r.Path, flags, r.Mode)
	if err != nil {
		return se.errno(err)
	}
	se.svc.Stats.Opens.Add(1)
	return se.finishOpen(q, a, created, flags, 0)
}

// finishOpen makes the handle of an open (or reopen) of a and answers it;
// origin is the handle whose description it shares (OpInherit), or 0.
func (se *session) finishOpen(q *ring.Request, a ns.Attr, created bool, flags int, origin uint64) (int64, uint64) {
	s := se.svc
	n := s.nextH.Add(1)
	if n >= 1<<proto.CounterBits {
		se.release(&handle{ino: a.Ino})
		return se.errno(syscall.ENFILE)
	}
	id := proto.MakeID(s.inc, n)
	if created && a.Mode&syscall.S_IFMT == syscall.S_IFREG {
		s.fresh.add(a.Ino)
	}
	h := &handle{ino: a.Ino, blob: a.Blob, flags: flags & ticketFlags, dir: a.IsDir(), origin: id}
	if origin != 0 && !h.dir {
		h.origin, h.counted = origin, true
		s.locks.count(origin)
	}
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG {
		h.file = s.openFileRef(a.Ino)
		acc := flags & syscall.O_ACCMODE
		h.pending = &control.Grant{Session: se.id, Handle: id, Ino: uint64(a.Ino), Blob: a.Blob,
			Read:  acc == syscall.O_RDONLY || acc == syscall.O_RDWR,
			Write: acc == syscall.O_WRONLY || acc == syscall.O_RDWR,
			// Linux truncates with O_TRUNC even on a read-only open (the
			// namespace required write permission for it).
			Truncate: flags&syscall.O_TRUNC != 0,
			Sync:     syncMode(flags),
		}
		// The grant waits for the first read or write (OpGrant), so
		// that opening and closing a file costs no round trip to the IO
		// service; O_TRUNC must empty the blob now.
		if h.pending.Truncate {
			size, err := se.grant(h)
			if err != nil {
				se.locksClosed(h)
				se.release(h)
				return se.errno(err)
			}
			a.Size = size
		}
	}
	dataHandle := id
	if h.file != nil && se.features&proto.FeatureLeases != 0 && leaseable(flags) {
		if l := s.useLease(se.id, a.Ino); l != nil {
			// The session read the file before: its kept lease is the
			// handle's grant, and io needs no word of this open.
			h.lease, h.pending, h.grantEpoch, h.rec = l, nil, l.epoch, l.rec
			dataHandle = l.id
		}
	}
	resp := proto.OpenResp{Handle: id, Attr: toProto(a), Created: created,
		HasDataHandle: se.features&proto.FeatureLeases != 0, DataHandle: dataHandle,
		CapRoom: se.features&proto.FeatureOpenCap != 0}
	if h.pending != nil && h.file != nil && resp.CapRoom {
		// A read-only open of a file the session holds no lease of: its
		// capability now, so that the first read needs no OpGrant.
		resp.Cap, resp.HasCap = se.openCap(id, h)
	}
	resp.Granted = h.grantEpoch != 0 && !resp.HasCap
	se.handles[id] = h
	s.Stats.Handles.Add(1)
	if se.features&proto.FeatureReopen != 0 {
		resp.HasTicket = true
		resp.Ticket = s.ticket(id, a.Ino, flags, se.cred.UID)
	}
	se.out = resp.Append(se.out[:0])
	return reply(q, se.out)
}

// reopen opens again, by ticket, a file this uid had open before the
// service restarted (FeatureReopen). The ticket proves the open was
// allowed; the path is not looked up again, as an open file descriptor
// survives a rename and an unlink (see tickets.go for what is checked).
func (se *session) reopen(q *ring.Request) (int64, uint64) {
	if se.features&proto.FeatureReopen == 0 {
		return se.errno(syscall.EOPNOTSUPP)
	}
	if q.Length < uint64(proto.OpenRespSize(se.features)) {
		return se.errno(syscall.ERANGE) // as open's
	}
	t, err := proto.DecodeTicket(body(q))
	if err != nil {
		return se.errno(err)
	}
	th, ino, flags, why := se.svc.checkTicket(t, se.cred.UID, se.id)
	switch why {
	case ticketForged:
		if !se.warnedTicket {
			se.warnedTicket = true // once per session: a client cannot flood the log
			se.svc.log.Warn("reopen with a ticket that is not genuine or not this uid's", "pid", se.pid, "uid", se.cred.UID)
		}
		return se.errno(syscall.EPERM)
	case ticketCurrent:
		return se.errno(syscall.EPERM) // its handle is of this incarnation: use it
	case ticketLate:
		return se.errno(proto.ErrStale) // the grace is over or it was used: the handle is gone
	}
	a, err := se.svc.ns.Reopen(se.cred, ino, flags) // inode numbers are never reused: ino is the same file or gone
	switch {
	case errors.Is(err, syscall.ENOENT):
		return se.errno(proto.ErrStale) // the file is gone
	case err != nil:
		se.svc.releaseTicket(th)
		return se.errno(err)
	}
	res, aux := se.finishOpen(q, a, false, flags, 0)
	if res < 0 {
		se.svc.releaseTicket(th)
		return res, aux
	}
	se.svc.Stats.Reopens.Add(1)
	return res, aux
}

// inherit opens again, by a ticket of this incarnation, a file this uid
// has open (OpInherit): a process that shares an open file description
// with the process that opened it, across fork or exec, gets its own
// handle of the same inode with the same flags, as its descriptor names
// the same file whatever happened to the path since. The file's mode is
// checked again for a uid that is not its owner (ns.Reopen), as a reopen
// after a restart is; what is left is the same as there (tickets.go).
func (se *session) inherit(q *ring.Request) (int64, uint64) {
	if se.features&proto.FeatureReopen == 0 {
		return se.errno(syscall.EOPNOTSUPP)
	}
	if q.Length < uint64(proto.OpenRespSize(se.features)) {
		return se.errno(syscall.ERANGE)
	}
	t, err := proto.DecodeTicket(body(q))
	if err != nil {
		return se.errno(err)
	}
	ino, flags, ok := se.svc.checkInheritTicket(t, se.cred.UID)
	if !ok {
		if !se.warnedTicket {
			se.warnedTicket = true
			se.svc.log.Warn("inherit with a ticket that is not genuine, not this uid's or not this incarnation's", "pid", se.pid, "uid", se.cred.UID)
		}
		return se.errno(syscall.EPERM)
	}
	a, err := se.svc.ns.Reopen(se.cred, ino, flags)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return se.errno(proto.ErrStale)
	case err != nil:
		return se.errno(err)
	}
	se.svc.Stats.Inherits.Add(1)
	return se.finishOpen(q, a, false, flags, binary.LittleEndian.Uint64(t[0:]))
}

// grantOp grants a handle before its first read or write; a handle whose
// grant is void (the IO service restarted or was resynchronised) is
// granted again. The completion's aux is the data handle, what the
// handle's IO requests name from then on: its own id, or the id of the
// kept lease it uses (FeatureLeases).
func (se *session) grantOp(q *ring.Request) (int64, uint64) {
	h := se.handles[q.Handle]
	if h == nil || h.file == nil {
		return se.errno(syscall.EBADF)
	}
	recalled := h.rec != nil && h.rec.revoked.Load()
	if recalled {
		// A recall marks the grant before io answers (and leaves it marked
		// if io never did): the recaller holds the file's lock until it
		// knows.
		h.file.mu.Lock()
		recalled = h.rec.revoked.Load()
		h.file.mu.Unlock()
	}
	if h.grantEpoch != 0 && h.grantEpoch == se.svc.io.currentEpoch() && !recalled {
		id := q.Handle
		if h.lease != nil && se.features&proto.FeatureLeases != 0 {
			id = h.lease.id // the data handle stays its lease's
		}
		if q.Arg == proto.GrantThroughIO && !h.write && !h.throughIO {
			// io refused the claim of its capability (caps.go), or the
			// session's kept lease was never claimed.
			err := se.grantThroughIO(id, h)
			switch {
			case errors.Is(err, errRecalled):
				recalled = true // granted anew below
			case err != nil:
				return se.errno(errnoOf(err))
			default:
				h.throughIO = true
				return 0, id
			}
		} else {
			return se.tenureReply(q, h, id)
		}
	}
	if recalled {
		// Another trust group's grant recalled this one (groups.go),
		// which counted its writer out: the handle is granted again,
		// under its own id, through io (its capability was spent).
		h.prev = h.rec // grant() decides, under the file's lock, whether the next is protected
		h.grantEpoch, h.noCap, h.rec = 0, true, nil
	}
	if h.lease != nil {
		// Its lease is void (io restarted) or recalled: the handle gets
		// a grant of its own, under its own id (the client names it from
		// now on), which may become the session's new lease.
		se.closeLeased(h)
		h.grantEpoch = 0
	}
	if h.pending == nil {
		// A void grant: ask for the same access again, without O_TRUNC.
		acc := h.flags & syscall.O_ACCMODE
		h.pending = &control.Grant{Session: se.id, Handle: q.Handle, Ino: uint64(h.ino), Blob: h.blob,
			Read: acc == syscall.O_RDONLY || acc == syscall.O_RDWR, Write: acc == syscall.O_WRONLY || acc == syscall.O_RDWR,
			Sync: syncMode(h.flags)}
		if h.grantEpoch != 0 && h.write {
			se.svc.addWriter(h.file, h.grantEpoch, h.unpriv, -1)
		}
		h.grantEpoch = 0
	}
	if res, aux, ok := se.mintCap(q, q.Handle, h); ok {
		return res, aux
	}
	if _, err := se.grant(h); err != nil {
		return se.errno(err)
	}
	if se.features&proto.FeatureLeases != 0 && leaseable(h.flags) {
		se.keepLease(q.Handle, h)
	}
	return se.tenureReply(q, h, q.Handle)
}

// tenureReply answers an OpGrant of h whose data handle is id: a handle
// open for writing, asked with a reply buffer of proto.TenureSize bytes,
// is told its file's lease epoch (groups.go).
func (se *session) tenureReply(q *ring.Request, h *handle, id uint64) (int64, uint64) {
	if !h.write || q.Length < proto.TenureSize {
		return 0, id
	}
	// The tenure the grant was made in (recorded under the file's lock):
	// the file's may be a later one by now, another group's.
	var t uint64
	if h.rec != nil {
		t = h.rec.tenure
	}
	var b [proto.TenureSize]byte
	binary.LittleEndian.PutUint64(b[:], t)
	res, _ := reply(q, b[:])
	return res, id
}

func (se *session) close(q *ring.Request) (int64, uint64) {
	h := se.handles[q.Handle]
	if h == nil {
		return se.errno(syscall.EBADF)
	}
	delete(se.handles, q.Handle)
	if err := se.closeHandle(q.Handle, h); err != nil {
		return se.errno(err)
	}
	return 0, 0
}

// closeHandle revokes the IO grant (recording what the IO service reports),
// then releases the open in the namespace and schedules the delete of a
// blob that lost its last name and last open.
func (se *session) closeHandle(id uint64, h *handle) error {
	se.svc.Stats.Handles.Add(-1)
	se.locksClosed(h)
	var firstErr error
	switch {
	case h.lease != nil:
		se.closeLeased(h) // the grant stays, the session's kept lease
	case h.file != nil:
		firstErr = se.revoke(id, h)
	}
	if err := se.release(h); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}

func (se *session) release(h *handle) error {
	if h.file != nil {
		se.svc.closeFileRef(h.file)
	}
	blob, err := se.svc.ns.Release(h.ino)
	if err != nil {
		return err
	}
	se.svc.queueDelete(blob)
	return nil
}

// closeAll closes every handle of a session that ended.
func (se *session) closeAll() {
	for id, h := range se.handles {
		if err := se.closeHandle(id, h); err != nil {
			se.svc.log.Warn("close on session end", "session", se.id, "ino", h.ino, "error", err)
		}
	}
	se.handles = nil
	se.svc.endLeasesOf(se.id)
}

func (se *session) mkdir(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeModePathReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	a, err := se.svc.ns.MkdirAt(se.cred, dir, r.Path, r.Mode)
	if err != nil {
		return se.errno(err)
	}
	return se.attrReply(q, a)
}

// pathOp decodes a single-path body and runs f on it from its directory.
func (se *session) pathOp(q *ring.Request, f func(dir ns.Ino, path string) (uint64, error)) (int64, uint64) {
	r, err := proto.DecodePathReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	blob, err := f(dir, r.Path)
	if err != nil {
		return se.errno(err)
	}
	se.svc.queueDelete(blob)
	return 0, 0
}

func (se *session) rmdir(q *ring.Request) (int64, uint64) {
	return se.pathOp(q, func(dir ns.Ino, p string) (uint64, error) { return 0, se.svc.ns.RmdirAt(se.cred, dir, p) })
}

func (se *session) unlink(q *ring.Request) (int64, uint64) {
	return se.pathOp(q, func(dir ns.Ino, p string) (uint64, error) { return se.svc.ns.UnlinkAt(se.cred, dir, p) })
}

func (se *session) rename(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeRenameReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	olddir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	newdir, err := se.dirIno(r.NewDir)
	if err != nil {
		return se.errno(err)
	}
	blob, err := se.svc.ns.RenameAt(se.cred, olddir, r.Old, newdir, r.New)
	if err != nil {
		return se.errno(err)
	}
	se.svc.queueDelete(blob)
	return 0, 0
}

func (se *session) chmod(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeModePathReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	ino, err := se.svc.ns.ChmodAt(se.cred, dir, r.Path, r.Mode)
	if err != nil {
		return se.errno(err)
	}
	se.svc.doomLeases(ino) // its mode changed
	return 0, 0
}

// ownerArgs checks a chown's uid and gid: uid_t and gid_t are 32 bits,
// and -1 and 0xffffffff both mean "unchanged", as in chown(2).
func ownerArgs(r proto.OwnerReq) (int, int, error) {
	if r.UID < -1<<31 || r.UID > 1<<32-1 || r.GID < -1<<31 || r.GID > 1<<32-1 {
		return 0, 0, syscall.EINVAL
	}
	return int(r.UID), int(r.GID), nil
}

func (se *session) chown(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeOwnerReq(body(q), true)
	if err != nil {
		return se.errno(err)
	}
	uid, gid, err := ownerArgs(r)
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	chown := se.svc.ns.ChownAt
	if q.Arg&proto.PathNoFollow != 0 {
		chown = se.svc.ns.LchownAt
	}
	ino, err := chown(se.cred, dir, r.Path, uid, gid)
	if err != nil {
		return se.errno(err)
	}
	se.svc.doomLeases(ino) // its owner changed
	return 0, 0
}

func (se *session) chtimes(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeTimesReq(body(q), true)
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	chtimes, stat := se.svc.ns.ChtimesAt, se.svc.ns.StatAt
	if q.Arg&proto.PathNoFollow != 0 {
		chtimes, stat = se.svc.ns.LchtimesAt, se.svc.ns.LstatAt
	}
	if err := chtimes(se.cred, dir, r.Path, r.Atime, r.Mtime); err != nil {
		return se.errno(err)
	}
	if r.Mtime != proto.TimeOmit {
		if a, err := stat(se.cred, dir, r.Path); err == nil && a.IsReg() {
			se.svc.noteTimesSet(a.Ino)
		}
	}
	return 0, 0
}

// handleIno is the inode of one of the session's handles (EBADF if none).
func (se *session) handleIno(handle uint64) (ns.Ino, error) {
	h := se.handles[handle]
	if h == nil {
		return 0, syscall.EBADF
	}
	return h.ino, nil
}

func (se *session) fchmod(q *ring.Request) (int64, uint64) {
	ino, err := se.handleIno(q.Handle)
	if err == nil {
		err = se.svc.ns.FChmod(se.cred, ino, q.Arg)
	}
	if err != nil {
		return se.errno(err)
	}
	se.svc.doomLeases(ino)
	return 0, 0
}

func (se *session) fchown(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeOwnerReq(body(q), false)
	if err != nil {
		return se.errno(err)
	}
	uid, gid, err := ownerArgs(r)
	var ino ns.Ino
	if err == nil {
		ino, err = se.handleIno(q.Handle)
	}
	if err == nil {
		err = se.svc.ns.FChown(se.cred, ino, uid, gid)
	}
	if err != nil {
		return se.errno(err)
	}
	se.svc.doomLeases(ino)
	return 0, 0
}

func (se *session) fchtimes(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeTimesReq(body(q), false)
	if err != nil {
		return se.errno(err)
	}
	ino, err := se.handleIno(q.Handle)
	if err == nil {
		err = se.svc.ns.FChtimes(se.cred, ino, r.Atime, r.Mtime)
	}
	if err != nil {
		return se.errno(err)
	}
	if r.Mtime != proto.TimeOmit {
		se.svc.noteTimesSet(ino)
	}
	return 0, 0
}

// readdir answers one page of entries after a name, as many as fit.
func (se *session) readdir(q *ring.Request) (int64, uint64) {
	r, err := proto.DecodeReadDirReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	// As many entries as the smallest could fill the page with: the
	// page, not the directory, is what a call costs.
	limit := int(min(q.Length, 1<<30))
	var out []proto.Dirent
	cursor, after := r.After, true
	for len(out) == 0 && after {
		var ents []ns.Dirent
		ents, after, err = se.svc.ns.ReadDirAfter(se.cred, dir, r.Path, cursor, min(limit/proto.DirentSize(1)+1, 1<<16))
		if err != nil {
			return se.errno(err)
		}
		for _, e := range ents {
			if e.Mode == syscall.S_IFLNK && se.features&proto.FeatureLinks == 0 {
				continue // (a client without links could not decode it)
			}
			out = append(out, proto.Dirent{Ino: uint64(e.Ino), Mode: e.Mode, Name: e.Name})
		}
		if len(ents) > 0 {
			cursor = ents[len(ents)-1].Name
		}
	}
	b, n := proto.AppendDirents(nil, out, limit)
	more := uint64(0)
	if n < len(out) || after {
		more = 1
		if n == 0 && len(out) > 0 {
			return se.errno(syscall.ERANGE)
		}
	}
	res, _ := reply(q, b)
	return res, more
}

func (se *session) syncMeta(q *ring.Request) (int64, uint64) {
	if err := se.svc.ns.Sync(); err != nil {
		return se.errno(err)
	}
	return 0, 0
}
