package metadata

import (
	"crypto/rand"
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
	ino     ns.Ino
	blob    uint64
	granted bool           // the IO service holds a grant for it (regular files)
	pending *control.Grant // the grant to ask for at the first read or write
	write   bool
	unpriv  bool // opened for writing by a non-root session: a write drops setuid/setgid
}

// session is one client's metadata ring. id, pid, cred and token are set
// in Started, before the first request; handles is owned by the session's
// poller goroutine, where ring handlers run, and then by Ended.
type session struct {
	svc     *Service
	mux     *ring.Mux
	id      uint64
	pid     int32
	cred    ns.Cred
	token   [proto.TokenSize]byte
	handles map[uint64]*handle
}

func newSession(svc *Service) *session {
	se := &session{svc: svc, mux: ring.NewMux(), handles: make(map[uint64]*handle)}
	se.register()
	return se
}

func (se *session) Handler() ring.Handler { return se.mux }

// Started records who the kernel says the client is and gives the session
// its id and the token that binds the client's IO session to it.
func (se *session) Started(sc *ring.ServerConn) error {
	se.pid = sc.Cred.Pid
	se.cred = ns.Cred{UID: sc.Cred.Uid, GID: sc.Cred.Gid, Groups: supplementaryGroups(sc.Cred.Pid)}
	if _, err := rand.Read(se.token[:]); err != nil {
		return fmt.Errorf("session token: %w", err)
	}
	s := se.svc
	s.mu.Lock()
	s.nextSID++
	se.id = s.nextSID
	s.sessions[se.id] = se
	s.mu.Unlock()
	s.Stats.Sessions.Add(1)
	return nil
}

// Ended closes every handle the session left open (revoking its grants)
// and forgets the session.
func (se *session) Ended(err error) {
	se.closeAll()
	s := se.svc
	s.mu.Lock()
	delete(s.sessions, se.id)
	s.mu.Unlock()
	s.Stats.Sessions.Add(-1)
}

func (se *session) register() {
	for op, f := range map[uint8]ring.HandlerFunc{
		proto.OpHello: se.hello, proto.OpStat: se.stat, proto.OpOpen: se.open, proto.OpClose: se.close,
		proto.OpMkdir: se.mkdir, proto.OpRmdir: se.rmdir, proto.OpUnlink: se.unlink, proto.OpRename: se.rename,
		proto.OpChmod: se.chmod, proto.OpChown: se.chown, proto.OpChtimes: se.chtimes,
		proto.OpReadDir: se.readdir, proto.OpFStat: se.fstat, proto.OpSyncMeta: se.syncMeta,
		proto.OpGrant: se.grantOp,
	} {
		se.mux.Handle(op, func(q *ring.Request) (int64, uint64) {
			se.svc.Stats.Requests.Add(1)
			return f(q)
		})
	}
}

// errno turns a namespace or control error into what the client is told.
func (se *session) errno(err error) (int64, uint64) {
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
func body(q *ring.Request) []byte {
	b := make([]byte, q.Length)
	q.ReadPayload(b)
	return b
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

func toWire(a ns.Attr) proto.Attr {
	return proto.Attr{Ino: uint64(a.Ino), Mode: a.Mode, UID: a.UID, GID: a.GID, Nlink: a.Nlink,
		Size: a.Size, Atime: a.Atime, Mtime: a.Mtime, Ctime: a.Ctime}
}

func (se *session) attrReply(q *ring.Request, a ns.Attr) (int64, uint64) {
	w := toWire(se.svc.liveAttr(a))
	var e proto.Enc
	e.Attr(&w)
	return reply(q, e.B)
}

func (se *session) hello(q *ring.Request) (int64, uint64) {
	var e proto.Enc
	e.U64(se.id)
	e.Bytes(se.token[:])
	return reply(q, e.B)
}

func (se *session) stat(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	path := d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	a, err := se.svc.ns.Stat(se.cred, path)
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

const accMode = syscall.O_RDONLY | syscall.O_WRONLY | syscall.O_RDWR

func (se *session) open(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	perm := d.U32()
	path := d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	flags := int(int32(q.Arg))
	a, created, err := se.svc.ns.Open(se.cred, path, flags, perm)
	if err != nil {
		return se.errno(err)
	}
	se.svc.Stats.Opens.Add(1)
	h := &handle{ino: a.Ino, blob: a.Blob}
	id := se.svc.nextH.Add(1)
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG {
		acc := flags & accMode
		h.pending = &control.Grant{Session: se.id, Handle: id, Ino: uint64(a.Ino), Blob: a.Blob,
			Read:  acc == syscall.O_RDONLY || acc == syscall.O_RDWR,
			Write: acc == syscall.O_WRONLY || acc == syscall.O_RDWR,
			// Linux truncates with O_TRUNC even on a read-only open (the
			// namespace required write permission for it).
			Truncate: flags&syscall.O_TRUNC != 0,
		}
		// The grant waits for the first read or write (OpGrant), so
		// that opening and closing a file costs no round trip to the IO
		// service; O_TRUNC must empty the blob now.
		if h.pending.Truncate {
			if size, err := se.grant(h); err != nil {
				se.release(h)
				return se.errno(err)
			} else {
				a.Size = size
			}
		}
	}
	se.handles[id] = h
	se.svc.Stats.Handles.Add(1)
	var e proto.Enc
	e.U64(id)
	w := toWire(a)
	e.Attr(&w)
	e.U8(boolByte(created))
	e.U8(boolByte(h.granted))
	return reply(q, e.B)
}

// grant asks the IO service to let this session use h and returns the
// blob's size. The blob is the truth for size: after a crash the
// namespace may hold a stale one, and the first grant puts it right.
func (se *session) grant(h *handle) (int64, error) {
	g := h.pending
	ack, err := se.svc.request(se.svc.subj.Grant, g)
	if err != nil {
		se.svc.log.Error("grant failed", "ino", h.ino, "error", err)
		return 0, syscall.EIO
	}
	h.pending = nil
	h.granted, h.write, h.unpriv = true, g.Write, g.Write && se.cred.UID != 0
	if h.write {
		se.svc.addWriter(h.ino, h.unpriv, 1)
	}
	if a, err := se.svc.ns.GetAttr(h.ino); err == nil && (ack.Size != a.Size || g.Truncate) {
		_ = se.svc.ns.SetLive(h.ino, ack.Size, max(a.Mtime, ack.Mtime))
	}
	return ack.Size, nil
}

// grantOp grants a handle before its first read or write.
func (se *session) grantOp(q *ring.Request) (int64, uint64) {
	h := se.handles[q.Handle]
	if h == nil || (h.pending == nil && !h.granted) {
		return se.errno(syscall.EBADF)
	}
	if h.pending != nil {
		if _, err := se.grant(h); err != nil {
			return se.errno(err)
		}
	}
	return 0, 0
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
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
// then releases the open in the namespace and deletes a blob that lost its
// last name and last open.
func (se *session) closeHandle(id uint64, h *handle) error {
	se.svc.Stats.Handles.Add(-1)
	var firstErr error
	if h.granted {
		ack, err := se.svc.request(se.svc.subj.Revoke, control.Revoke{Session: se.id, Handle: id})
		if err != nil {
			se.svc.log.Error("revoke failed", "ino", h.ino, "error", err)
			firstErr = syscall.EIO
		} else if ack.Wrote {
			if err := se.svc.ns.SetLive(h.ino, ack.Size, ack.Mtime); err != nil && !errors.Is(err, syscall.ENOENT) {
				firstErr = err
			}
			if h.unpriv {
				if err := se.svc.ns.KillPriv(h.ino); err != nil && !errors.Is(err, syscall.ENOENT) && firstErr == nil {
					firstErr = err
				}
			}
		}
		if h.write {
			se.svc.addWriter(h.ino, h.unpriv, -1)
		}
	}
	if err := se.release(h); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}

func (se *session) release(h *handle) error {
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
}

func (se *session) mkdir(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	perm := d.U32()
	path := d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	a, err := se.svc.ns.Mkdir(se.cred, path, perm)
	if err != nil {
		return se.errno(err)
	}
	return se.attrReply(q, a)
}

// pathOp decodes a single-path body and runs f on it.
func (se *session) pathOp(q *ring.Request, f func(path string) (uint64, error)) (int64, uint64) {
	d := proto.NewDec(body(q))
	path := d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	blob, err := f(path)
	if err != nil {
		return se.errno(err)
	}
	se.svc.queueDelete(blob)
	return 0, 0
}

func (se *session) rmdir(q *ring.Request) (int64, uint64) {
	return se.pathOp(q, func(p string) (uint64, error) { return 0, se.svc.ns.Rmdir(se.cred, p) })
}

func (se *session) unlink(q *ring.Request) (int64, uint64) {
	return se.pathOp(q, func(p string) (uint64, error) { return se.svc.ns.Unlink(se.cred, p) })
}

func (se *session) rename(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	from, to := d.Str(), d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	blob, err := se.svc.ns.Rename(se.cred, from, to)
	if err != nil {
		return se.errno(err)
	}
	se.svc.queueDelete(blob)
	return 0, 0
}

func (se *session) chmod(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	mode := d.U32()
	path := d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	if err := se.svc.ns.Chmod(se.cred, path, mode); err != nil {
		return se.errno(err)
	}
	return 0, 0
}

func (se *session) chown(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	uid, gid := d.I64(), d.I64()
	path := d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	// uid_t and gid_t are 32 bits: -1 and 0xffffffff both mean
	// "unchanged", -2 is uid 0xfffffffe, as in chown(2).
	if uid < -1<<31 || uid > 1<<32-1 || gid < -1<<31 || gid > 1<<32-1 {
		return se.errno(syscall.EINVAL)
	}
	if err := se.svc.ns.Chown(se.cred, path, int(uid), int(gid)); err != nil {
		return se.errno(err)
	}
	return 0, 0
}

func (se *session) chtimes(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	atime, mtime := d.I64(), d.I64()
	path := d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	if err := se.svc.ns.Chtimes(se.cred, path, atime, mtime); err != nil {
		return se.errno(err)
	}
	return 0, 0
}

// readdir answers one page of entries after a name, as many as fit.
func (se *session) readdir(q *ring.Request) (int64, uint64) {
	d := proto.NewDec(body(q))
	path, after := d.Str(), d.Str()
	if err := d.Err(); err != nil {
		return se.errno(err)
	}
	ents, err := se.svc.ns.ReadDir(se.cred, path)
	if err != nil {
		return se.errno(err)
	}
	i := 0
	if after != "" {
		for i < len(ents) && ents[i].Name <= after {
			i++
		}
	}
	var e proto.Enc
	e.U32(0) // count, filled in below
	n, more := uint32(0), uint64(0)
	for ; i < len(ents); i++ {
		need := 8 + 4 + 2 + len(ents[i].Name)
		if len(e.B)+need > int(q.Length) {
			more = 1
			break
		}
		e.U64(uint64(ents[i].Ino))
		e.U32(ents[i].Mode)
		e.Str(ents[i].Name)
		n++
	}
	if n == 0 && more == 1 {
		return se.errno(syscall.ERANGE)
	}
	e.B[0], e.B[1], e.B[2], e.B[3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	res, _ := reply(q, e.B)
	return res, more
}

func (se *session) syncMeta(q *ring.Request) (int64, uint64) {
	if err := se.svc.ns.Sync(); err != nil {
		return se.errno(err)
	}
	return 0, 0
}
