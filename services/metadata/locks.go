package metadata

import (
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Advisory locks (OpLock): POSIX record locks, OFD locks and flock locks
// of regular files, held here for every client as the kernel holds them
// for its processes, so that processes (each with its own session)
// exclude each other through weir as through a kernel file system.
//
// Owners. A POSIX lock is its session's (a process's: the C shim dials one
// per process), and goes when the session closes any handle of the file
// or ends, as POSIX has it. An OFD or flock lock is its open file
// description's, named by the description's first handle (its origin):
// a description shared across fork or exec has a handle in each process
// (OpInherit gives the new one the same origin), and its locks go when
// the last of those handles closes. What is left: a process that has not
// used an inherited description yet holds no handle of it, so the locks
// can go while it still could use them.
//
// Blocking (F_SETLKW, flock without LOCK_NB) is the client's: it retries
// on EAGAIN. There is no deadlock detection (EDEADLK is never answered).

// maxLocksPerFile bounds the lock ranges one file holds in one space
// (ENOLCK past it, as Linux answers when its lock table is full).
const maxLocksPerFile = 4096

// lockOwner names a lock's owner: a session (POSIX), or a description's
// origin handle (OFD, flock).
type lockOwner struct {
	posix bool
	id    uint64
}

type heldLock struct {
	owner      lockOwner
	write      bool
	start, end uint64 // [start, end); end proto.LockEOF: to the end of the file
	pid        int32  // the session's process (POSIX)
}

// fileLocks are one file's locks in their two spaces: fcntl's (POSIX and
// OFD, which conflict with each other) and flock's.
type fileLocks struct {
	rec, fl []heldLock
}

// lockTable is the service's locks and the live handles of each origin
// that holds (or may hold) description locks.
type lockTable struct {
	mu      sync.Mutex
	files   map[ns.Ino]*fileLocks
	origins map[uint64]int // origin handle -> its counted live handles
	n       atomic.Int64   // locks held: 0 keeps close free of the table
}

func newLockTable() *lockTable {
	return &lockTable{files: map[ns.Ino]*fileLocks{}, origins: map[uint64]int{}}
}

func overlaps(a, b *heldLock) bool { return a.start < b.end && b.start < a.end }

// conflict returns the first lock in space that is in the way of want.
func conflict(space []heldLock, want *heldLock) *heldLock {
	for i := range space {
		l := &space[i]
		if l.owner != want.owner && overlaps(l, want) && (l.write || want.write) {
			return l
		}
	}
	return nil
}

// carve removes owner's coverage of [start, end) from space, splitting
// the locks that reach out of it.
func carve(space []heldLock, owner lockOwner, start, end uint64) []heldLock {
	out := space[:0:0]
	for _, l := range space {
		if l.owner != owner || l.end <= start || end <= l.start {
			out = append(out, l)
			continue
		}
		if l.start < start {
			left := l
			left.end = start
			out = append(out, left)
		}
		if end < l.end {
			right := l
			right.start = end
			out = append(out, right)
		}
	}
	return out
}

// set applies a lock request of owner to ino's file: EAGAIN if another
// owner's lock is in the way.
func (t *lockTable) set(ino ns.Ino, space uint8, want heldLock, unlock bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.files[ino]
	if f == nil {
		if unlock {
			return nil
		}
		f = &fileLocks{}
		t.files[ino] = f
	}
	locks := &f.rec
	if space == proto.LockFlock {
		locks = &f.fl
	}
	if !unlock && conflict(*locks, &want) != nil {
		return syscall.EAGAIN
	}
	before := len(*locks)
	carved := carve(*locks, want.owner, want.start, want.end)
	if !unlock && len(carved) >= maxLocksPerFile {
		return syscall.ENOLCK // a client's flood of ranges must not grow the service without bound
	}
	*locks = carved
	if !unlock {
		*locks = append(*locks, want)
	}
	t.n.Add(int64(len(*locks) - before))
	if len(f.rec) == 0 && len(f.fl) == 0 {
		delete(t.files, ino)
	}
	return nil
}

// test returns the first lock in the way of want (nil: none).
func (t *lockTable) test(ino ns.Ino, space uint8, want heldLock) (heldLock, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.files[ino]
	if f == nil {
		return heldLock{}, false
	}
	locks := f.rec
	if space == proto.LockFlock {
		locks = f.fl
	}
	if l := conflict(locks, &want); l != nil {
		return *l, true
	}
	return heldLock{}, false
}

// dropOwner removes every lock of owner on ino.
func (t *lockTable) dropOwner(ino ns.Ino, owner lockOwner) {
	if t.n.Load() == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropLocked(ino, owner)
}

func (t *lockTable) dropLocked(ino ns.Ino, owner lockOwner) {
	f := t.files[ino]
	if f == nil {
		return
	}
	before := len(f.rec) + len(f.fl)
	f.rec = carve(f.rec, owner, 0, proto.LockEOF)
	f.fl = carve(f.fl, owner, 0, proto.LockEOF)
	t.n.Add(int64(len(f.rec) + len(f.fl) - before))
	if len(f.rec) == 0 && len(f.fl) == 0 {
		delete(t.files, ino)
	}
}

// count counts one more live handle of origin.
func (t *lockTable) count(origin uint64) {
	t.mu.Lock()
	t.origins[origin]++
	t.mu.Unlock()
}

// uncount counts a handle of origin out; with the last one, the
// description's locks on ino go.
func (t *lockTable) uncount(origin uint64, ino ns.Ino) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.origins[origin]--; t.origins[origin] > 0 {
		return
	}
	delete(t.origins, origin)
	t.dropLocked(ino, lockOwner{id: origin})
}

// locksClosed drops what a handle's close ends: the session's POSIX locks
// of the file, and, with its description's last handle, the
// description's locks.
func (se *session) locksClosed(h *handle) {
	if h.file == nil {
		return
	}
	t := se.svc.locks
	t.dropOwner(h.ino, lockOwner{posix: true, id: se.id})
	if h.counted {
		t.uncount(h.origin, h.ino)
	}
}

// lock serves OpLock.
func (se *session) lock(q *ring.Request) (int64, uint64) {
	h := se.handles[q.Handle]
	if h == nil {
		return se.errno(syscall.EBADF)
	}
	if h.file == nil {
		return se.errno(syscall.EINVAL) // a directory: no record locks (the shim answers flock itself)
	}
	r, err := proto.DecodeLockReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	if r.Get && q.Length < proto.LockReqSize {
		return se.errno(syscall.ERANGE)
	}
	acc := h.flags & syscall.O_ACCMODE
	if r.Class != proto.LockFlock && !r.Get &&
		((r.Type == proto.LockRead && acc == syscall.O_WRONLY) || (r.Type == proto.LockWrite && acc == syscall.O_RDONLY)) {
		return se.errno(syscall.EBADF) // as fcntl(2)
	}
	want := heldLock{owner: lockOwner{posix: r.Class == proto.LockPOSIX, id: se.id},
		write: r.Type == proto.LockWrite, start: r.Start, end: r.End, pid: se.pid}
	if r.Class == proto.LockFlock {
		want.start, want.end = 0, proto.LockEOF // the whole file
	}
	t := se.svc.locks
	if !want.owner.posix {
		want.owner.id, want.pid = h.origin, -1
		if !h.counted && !r.Get {
			h.counted = true
			t.count(h.origin)
		}
	}
	if r.Get {
		l, in := t.test(h.ino, r.Class, want)
		resp := proto.LockResp{Type: proto.LockUnlock}
		if in {
			resp = proto.LockResp{Type: proto.LockRead, Class: proto.LockOFD, PID: l.pid, Start: l.start, End: l.end}
			if l.write {
				resp.Type = proto.LockWrite
			}
			if l.owner.posix {
				resp.Class = proto.LockPOSIX
			} else if r.Class == proto.LockFlock {
				resp.Class = proto.LockFlock
			}
		}
		se.out = resp.Append(se.out[:0])
		return reply(q, se.out)
	}
	if err := t.set(h.ino, r.Class, want, r.Type == proto.LockUnlock); err != nil {
		return se.errno(err)
	}
	return 0, 0
}
