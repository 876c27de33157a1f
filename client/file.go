package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

var errEOF = io.EOF

// File is an open file or directory. Its methods are safe for concurrent
// use; Read, Write and Seek share one file position, as with *os.File.
type File struct {
	fs     *FS
	name   string
	flags  int
	dir    bool
	closed atomic.Bool

	// hmu protects the handle and what belongs to it: the handle is valid
	// in sessions of generation gen; a recovery reopens it (rebind).
	hmu        sync.Mutex
	handle     uint64
	dataHandle uint64       // the handle IO requests name: handle, or the session's kept lease of the file (FeatureLeases)
	meta       *ring.Client // the metadata session the handle belongs to
	gen        uint64
	granted    bool                 // the IO service accepts the handle (in gen)
	noticed    bool                 // granted was cleared by a recall notice (leases.go)
	throughIO  bool                 // its grant was asked for through io after a claim failed (in gen; FeatureCaps)
	openCap    *[proto.CapSize]byte // the read capability open answered (in gen; FeatureOpenCap), to claim before the first request
	claiming   *pendingClaim        // its claim, submitted with the first request and not yet waited for (settleClaim)
	tenure     uint64               // the file's lease epoch its last write grant was made in (0: not told)
	ticket     proto.Ticket
	hasTicket  bool
	gone       error  // the file could not be reopened after a recovery
	writes     uint64 // writes done, and as of the last successful Sync:
	synced     uint64 // the file is dirty while they differ
	lost       error  // writes lost with an IO service that died: the next Sync returns it, once

	// The cache region's mapping (cache.go): fcache is the mapping of
	// generation fcache.gen; noCache is 1 + the generation in which
	// mapping failed (the file reads through the ring there).
	cmu       sync.Mutex
	fcache    *fileCache                // protected by cmu
	fcFast    atomic.Pointer[fileCache] // fcache, for reads that take no lock
	noCache   uint64                    // protected by cmu
	ringReads atomic.Int32
	// viaDir: opened at io alone from a directory snapshot (direct.go),
	// with no metadata handle yet; ino is its inode, known its attributes
	// as last learned (the snapshot's, then each stat by its name's;
	// protected by hmu), for a Stat once the name no longer names it.
	viaDir  atomic.Bool
	ino     uint64
	known   proto.Attr
	seqEnd  atomic.Int64 // where the last cached read ended (readahead)
	hinting atomic.Bool  // a readahead hint is in flight

	mu       sync.Mutex // protects off, dirAfter, dirDone
	off      int64
	dirAfter string
	dirDone  bool
}

var (
	_ io.ReadWriteSeeker = (*File)(nil)
	_ io.ReaderAt        = (*File)(nil)
	_ io.WriterAt        = (*File)(nil)
	_ io.Closer          = (*File)(nil)
	_ fs.ReadDirFile     = (*File)(nil)
)

// fileGone is the error of every call on a file that could not be reopened
// after the metadata service restarted: it was removed meanwhile.
type fileGone struct{ err error }

func (e *fileGone) Error() string {
	return fmt.Sprintf("%v (the file could not be reopened after the metadata service restarted: %v)", syscall.ESTALE, e.err)
}
func (e *fileGone) Unwrap() error { return syscall.ESTALE }

// Open opens a file for reading with the io/fs contract: name must satisfy
// fs.ValidPath. The result is a *File. Use OpenFile for os-style paths.
func (f *FS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, pathErr("open", name, fs.ErrInvalid)
	}
	file, err := f.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	return file, nil
}

// Create creates or truncates a file for reading and writing, mode 0666
// before umask.
func (f *FS) Create(name string) (*File, error) {
	return f.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// openFlags are the flags OpenFile understands; others are refused.
const openFlags = os.O_RDONLY | os.O_WRONLY | os.O_RDWR | os.O_CREATE | os.O_EXCL |
	os.O_TRUNC | os.O_APPEND | os.O_SYNC | syscall.O_DSYNC | syscall.O_DIRECTORY | syscall.O_CLOEXEC |
	syscall.O_DIRECT

// OpenFile opens name with flags (os.O_*) and, when creating, perm before
// umask. O_SYNC and O_DSYNC make every write durable before it returns.
// With O_DIRECT, reads and writes bypass the page cache, coherently with
// it (a direct read sees every write that returned, a direct write
// updates the cached copies of its pages), and their offsets and lengths
// must be multiples of proto.DirectAlign (512) or fail with EINVAL, as on
// Linux; the buffers need no alignment.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (*File, error) {
	return f.openAt(nil, name, flag, perm)
}

func (f *FS) openAt(dir *File, name string, flag int, perm fs.FileMode) (*File, error) {
	var file *File
	err := f.follow(dir, name, func(p string) (err error) {
		file, err = f.openOnce(dir, p, flag, perm)
		return err
	})
	if err != nil {
		return nil, err
	}
	return file, nil
}

// openOnce is openAt of a path as it is: the metadata service's
// followError when it meets a symbolic link.
func (f *FS) openOnce(dir *File, name string, flag int, perm fs.FileMode) (*File, error) {
	if err := checkPath(name); err != nil {
		return nil, pathErr("open", name, err)
	}
	if flag&^openFlags != 0 {
		return nil, pathErr("open", name, syscall.EINVAL)
	}
	body := (&proto.ModePathReq{Mode: modeBits(perm) &^ f.umask, Path: name}).Append(nil)
	// An exclusive create may not go again: it would fail on the file it
	// created the first time.
	idempotent := flag&os.O_EXCL == 0
	if c := f.current(); directable(c, dir, name, flag) {
		if file, ok := f.openDirect(c, name, flag); ok {
			f.filesMu.Lock()
			f.files[file] = struct{}{}
			f.filesMu.Unlock()
			return file, nil
		}
	}
	var file *File
	cold := false
	err := f.metaOp(idempotent, func(c *conn) error {
		h := proto.RootHandle
		if dir != nil {
			var err error
			if h, err = dir.handleIn(c); err != nil {
				return err
			}
		}
		out := make([]byte, proto.OpenRespSize(c.features))
		closing := f.closeAside(c.meta)
		comp, err := call(bgctx, c.meta, proto.OpOpen, uint32(flag&^syscall.O_CLOEXEC), h, 0, body, out)
		if closing != nil {
			_, _ = closing.Wait(bgctx) // as the closer's, its answer changes nothing
		}
		if err != nil {
			return err
		}
		r, err := proto.DecodeOpenResp(out[:comp.Result], c.features)
		if err != nil {
			return badCompletion(proto.OpOpen, "open answer does not decode")
		}
		file = &File{fs: f, name: name, flags: flag, dir: r.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR,
			handle: r.Handle, dataHandle: r.IOHandle(), meta: c.meta, gen: c.gen, granted: r.Granted,
			ticket: r.Ticket, hasTicket: r.HasTicket}
		if r.HasCap && !file.writable() && !file.dir {
			file.openCap = &r.Cap
			cold = directable(c, dir, name, flag) // no lease of it was kept
		}
		if c.features&proto.FeatureLeases != 0 && r.Granted && r.DataHandle != r.Handle && !file.writable() && !file.dir {
			// Under the session's kept lease (leases.go): the file was
			// opened before, and is likely to be again. The mapping of
			// its last close serves reads at once; without one, it maps
			// at its first read, and the next opens will not pay for it.
			file.ringReads.Store(mapAfterReads)
			if fc := f.kept.take(r.DataHandle, c.gen); fc != nil {
				file.fcache = fc
				file.fcFast.Store(fc)
			} else if cp := f.caps.take(r.DataHandle, c.gen); cp != nil {
				// The lease of an earlier open's capability, never claimed.
				file.granted, file.openCap = false, cp
			}
		}
		return nil
	})
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	if cold {
		f.noteCold(f.current(), name)
	}
	f.filesMu.Lock()
	f.files[file] = struct{}{}
	f.filesMu.Unlock()
	// Opened in sessions a recovery replaced meanwhile: rebind now.
	if c := f.current(); c.gen != file.gen {
		file.rebind(c, false)
	}
	return file, nil
}

// Name returns the name the file was opened with.
func (fl *File) Name() string { return fl.name }

func (fl *File) err(op string, err error) error { return pathErr(op, fl.name, err) }

func (fl *File) check(op string) error {
	if fl == nil {
		return os.ErrInvalid
	}
	if fl.closed.Load() {
		return fl.err(op, os.ErrClosed)
	}
	return nil
}

func (fl *File) readable() bool  { return fl.flags&(os.O_WRONLY|os.O_RDWR) != os.O_WRONLY }
func (fl *File) writable() bool  { return fl.flags&(os.O_WRONLY|os.O_RDWR) != 0 }
func (fl *File) appending() bool { return fl.flags&os.O_APPEND != 0 }
func (fl *File) direct() bool    { return fl.flags&syscall.O_DIRECT != 0 }

// chunkIn is the most one request of the file carries in the sessions c:
// for O_DIRECT a multiple of proto.DirectAlign, so that a long transfer
// splits at aligned offsets.
func (fl *File) chunkIn(c *conn) int {
	if fl.direct() && c.chunk >= proto.DirectAlign {
		return c.chunk - c.chunk%proto.DirectAlign
	}
	return c.chunk
}

// readArg is the Arg of the file's reads.
func (fl *File) readArg() uint32 {
	if fl.direct() {
		return proto.ReadDirect
	}
	return 0
}

// writeArg is the Arg of the file's writes, at the end of the file with
// appendMode.
func (fl *File) writeArg(appendMode bool) uint32 {
	var arg uint32
	if appendMode {
		arg |= proto.WriteAppend
	}
	if fl.direct() {
		arg |= proto.WriteDirect
	}
	return arg
}

// rebind makes the file usable in the sessions c of a recovery (see
// moveLocked). When the IO service died (ioLost), writes since the last
// Sync may be lost: the next Sync says so, once.
func (fl *File) rebind(c *conn, ioLost bool) {
	fl.hmu.Lock()
	defer fl.hmu.Unlock()
	if ioLost && fl.writes != fl.synced && fl.lost == nil {
		fl.lost = fmt.Errorf("%w (the IO service stopped before writes since the last sync were made durable; they may be lost)", syscall.EIO)
	}
	_ = fl.moveLocked(c) // a session lost again: the next use tries again
}

// moveLocked moves the file's handle to the sessions c: reopened with its
// ticket when c has another metadata session than the one the handle
// belongs to, kept otherwise; either way the grant is asked for again. A
// reopen the service refuses makes the file gone (its calls fail with
// that error); a session lost meanwhile leaves it for the next try. hmu
// is held.
func (fl *File) moveLocked(c *conn) error {
	if fl.gone != nil {
		return fl.gone
	}
	fl.dropClaimLocked()
	fl.granted, fl.throughIO, fl.openCap = false, false, nil
	if fl.viaDir.Load() {
		// Its direct open went with its sessions: open it through
		// metadata, or it is gone.
		if err := fl.promoteLocked(c); err != nil {
			if lostSession(err) {
				return err
			}
			fl.gone = &fileGone{err: err}
			return fl.gone
		}
		return nil
	}
	if c.meta != fl.meta {
		if err := fl.reopenLocked(c); err != nil {
			if lostSession(err) {
				return err
			}
			fl.gone = &fileGone{err: err}
			return fl.gone
		}
	}
	fl.gen = c.gen
	return nil
}

// reopenLocked opens the file again in the sessions c with its ticket.
// hmu is held.
func (fl *File) reopenLocked(c *conn) error {
	if !fl.hasTicket {
		return errors.New("no reopen ticket")
	}
	out := make([]byte, proto.OpenRespSize(c.features|proto.FeatureReopen))
	comp, err := call(bgctx, c.meta, proto.OpReopen, 0, 0, 0, fl.ticket[:], out)
	if err != nil {
		return err
	}
	r, err := proto.DecodeOpenResp(out[:comp.Result], c.features|proto.FeatureReopen)
	if err != nil || (r.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR) != fl.dir {
		return badCompletion(proto.OpReopen, "reopen answer does not decode or names another kind of file")
	}
	fl.handle, fl.dataHandle, fl.meta, fl.gen, fl.granted, fl.ticket = r.Handle, r.IOHandle(), c.meta, c.gen, r.Granted, r.Ticket
	fl.throughIO, fl.openCap = false, nil
	if r.HasCap && !fl.writable() && !fl.dir {
		fl.openCap = &r.Cap
	}
	return nil
}

// handleIn returns the file's handle in the sessions c, reopening it there
// if a recovery left it behind.
func (fl *File) handleIn(c *conn) (uint64, error) {
	fl.hmu.Lock()
	defer fl.hmu.Unlock()
	return fl.handleInLocked(c)
}

func (fl *File) handleInLocked(c *conn) (uint64, error) {
	if fl.gone != nil {
		return 0, fl.gone
	}
	if fl.viaDir.Load() {
		// A metadata handle is wanted: open it through metadata (direct.go).
		if err := fl.promoteLocked(c); err != nil {
			return 0, err
		}
	}
	if fl.gen != c.gen {
		if err := fl.moveLocked(c); err != nil {
			return 0, err
		}
	}
	return fl.handle, nil
}

// grantedHandle returns the data handle in c (what IO requests name),
// asking the metadata service, once per session generation, to grant the
// handle at the IO service unless open said it is (a kept lease): opening
// a file costs no round trip to the IO service until the file is read or
// written.
func (fl *File) grantedHandle(c *conn) (uint64, error) {
	fl.hmu.Lock()
	defer fl.hmu.Unlock()
	if fl.viaDir.Load() && fl.granted && fl.gen == c.gen && fl.gone == nil {
		return fl.dataHandle, nil // a direct open: io's own handle
	}
	h, err := fl.handleInLocked(c)
	if err != nil {
		return 0, err
	}
	if fl.granted {
		return fl.dataHandle, nil
	}
	if fl.noticed && testNoRegrant.Load() {
		return 0, syscall.EBADF // as io would have answered (tests that watch each recall)
	}
	fl.noticed = false
	if fl.openCap != nil {
		// Open answered the capability (FeatureOpenCap): claim it, in the
		// same wake-up of io as the request that needs it (startClaim).
		capBuf := fl.openCap[:]
		fl.openCap = nil
		dh, err := fl.startClaimLocked(c, h, fl.dataHandle, capBuf)
		if err != nil {
			return 0, err
		}
		fl.granted, fl.dataHandle = true, dh
		return dh, nil
	}
	// A read-only file may get a capability to claim at io itself
	// (FeatureCaps): no control-plane round trip between the services.
	var capBuf []byte
	var tenure [proto.TenureSize]byte
	switch {
	case c.features&proto.FeatureCaps != 0 && !fl.writable() && !fl.dir:
		capBuf = make([]byte, proto.CapSize)
	case fl.writable():
		capBuf = tenure[:] // the file's lease epoch comes back
	}
	comp, err := call(bgctx, c.meta, proto.OpGrant, 0, h, 0, nil, capBuf)
	if err != nil {
		return 0, err
	}
	if fl.writable() {
		if comp.Result == proto.TenureSize {
			fl.tenure = binary.LittleEndian.Uint64(tenure[:])
		}
		capBuf, comp.Result = nil, 0
	}
	// The handle's own grant, or the kept lease it uses at open if that
	// is still good (FeatureLeases: the aux says which).
	dh := h
	if c.features&proto.FeatureLeases != 0 && comp.Aux != 0 {
		dh = comp.Aux
	}
	if capBuf != nil && comp.Result == proto.CapSize {
		if dh, err = fl.claimLocked(c, h, dh, capBuf); err != nil {
			return 0, err
		}
	} else if comp.Result != 0 {
		return 0, badCompletion(proto.OpGrant, fmt.Sprintf("result %d", comp.Result))
	}
	fl.granted, fl.dataHandle = true, dh
	return fl.dataHandle, nil
}

// pendingClaim is a claim of an open's capability on the IO ring whose
// completion is not yet waited for.
type pendingClaim struct {
	c *conn
	p *ring.Pending
	h uint64 // the file's handle (a refused claim's grant through io names it)
}

// startClaimLocked claims the capability capBuf of data handle dh (of
// handle h) on c's IO ring. Where the ring lets a call stand aside
// (ring.Client.StartAside: one at a time, with room left for any
// request) it submits the claim and returns without waiting: the
// caller's request goes on the ring right behind it, and io, which takes
// a session's requests in order and installs a claimed grant before it
// takes the next (ring.Pending), serves both in one wake-up. settleClaim
// waits for the claim after the request; a refused claim is granted
// through io then, and the request (which io refused with EBADF) runs
// again. A cold open + read + close pays one IO round trip instead of
// two. Otherwise it claims and waits (claimLocked). fl.hmu is held.
func (fl *File) startClaimLocked(c *conn, h, dh uint64, capBuf []byte) (uint64, error) {
	if testClaimSkip(capBuf) {
		return dh, nil
	}
	p, ok, err := c.data.StartAside(bgctx, proto.OpClaim, 0, dh, 0, capBuf)
	if err != nil {
		return 0, transportErr(err)
	}
	if !ok {
		return fl.claimOnceLocked(c, h, dh, capBuf)
	}
	fl.claiming = &pendingClaim{c: c, p: p, h: h}
	return dh, nil
}

// settleClaim waits for the claim startClaimLocked submitted, if one is
// outstanding. again: the claim was refused and the file is now granted
// through io, so a request io answered EBADF should be sent again.
func (fl *File) settleClaim() (again bool, err error) {
	fl.hmu.Lock()
	defer fl.hmu.Unlock()
	pc := fl.claiming
	if pc == nil {
		return false, nil
	}
	fl.claiming = nil
	err = pc.wait()
	if err == nil || fl.gen != pc.c.gen {
		return false, nil // (a session moved meanwhile: the recovery's business)
	}
	if lostSession(err) || errors.Is(err, proto.ErrStale) {
		return false, err
	}
	// Refused (EKEYREJECTED: of an io epoch that is over, or spent) or
	// failed: the grant goes through io after all, as claimLocked's.
	dh, err := fl.grantThroughIOLocked(pc.c, pc.h)
	if err != nil {
		fl.granted = false
		return false, err
	}
	fl.granted, fl.dataHandle = true, dh
	return true, nil
}

// wait waits for the claim; its error as call's.
func (pc *pendingClaim) wait() error {
	comp, err := pc.p.Wait(bgctx)
	switch {
	case err != nil:
		return transportErr(err)
	case comp.Result < 0:
		return syscall.Errno(-comp.Result)
	case comp.Result != 0:
		return badCompletion(proto.OpClaim, fmt.Sprintf("result %d for a request without a response", comp.Result))
	}
	return nil
}

// dropClaimLocked waits for an outstanding claim whose outcome no longer
// matters (the file moves to other sessions, or closes). fl.hmu is held.
func (fl *File) dropClaimLocked() {
	if pc := fl.claiming; pc != nil {
		fl.claiming = nil
		_ = pc.wait()
	}
}

// claimLocked claims the read capability capBuf of data handle dh (of
// handle h) at io, and returns the data handle to use: dh, or the one a
// grant through io gave when io refused the capability. fl.hmu is held.
func (fl *File) claimLocked(c *conn, h, dh uint64, capBuf []byte) (uint64, error) {
	if testClaimSkip(capBuf) {
		return dh, nil
	}
	return fl.claimOnceLocked(c, h, dh, capBuf)
}

// testClaimSkip applies testClaim to a claim of capBuf: damages it, or
// says to skip it.
func testClaimSkip(capBuf []byte) bool {
	switch testClaim.Load() {
	case claimSkipped:
		return true
	case claimDamaged:
		capBuf[0] ^= 1
	}
	return false
}

// claimOnceLocked sends the claim and waits for it; see claimLocked.
func (fl *File) claimOnceLocked(c *conn, h, dh uint64, capBuf []byte) (uint64, error) {
	_, err := call(bgctx, c.data, proto.OpClaim, 0, dh, 0, capBuf, nil)
	if err != nil && !lostSession(err) && !errors.Is(err, proto.ErrStale) {
		// Refused (EKEYREJECTED: of an io epoch that is over, or
		// spent) or failed: the grant goes through io after all.
		// metadata records the grant as made once it minted the
		// capability, so a later OpGrant would not ask io again.
		return fl.grantThroughIOLocked(c, h)
	}
	if err != nil {
		return 0, err
	}
	return dh, nil
}

// testClaim makes tests' claims fail: claimDamaged sends a damaged
// capability (io refuses it), claimSkipped sends none (io never hears of
// the grant metadata recorded).
var testClaim atomic.Int32

const (
	claimDamaged = 1
	claimSkipped = 2
)

// grantThroughIOLocked asks metadata to grant handle h at io over the
// control plane (proto.GrantThroughIO): a capability's claim failed, or io
// does not hold a grant metadata recorded as made. It returns the data
// handle to use. fl.hmu is held.
func (fl *File) grantThroughIOLocked(c *conn, h uint64) (uint64, error) {
	comp, err := call(bgctx, c.meta, proto.OpGrant, proto.GrantThroughIO, h, 0, nil, nil)
	if err != nil {
		return 0, err
	}
	fl.throughIO = true
	if c.features&proto.FeatureLeases != 0 && comp.Aux != 0 {
		return comp.Aux, nil
	}
	return h, nil
}

// regrant runs when io answered EBADF on the file's granted data handle
// dh: another trust group's grant recalled the handle's (its lease), or,
// with FeatureCaps, a read grant metadata recorded as made never reached
// io (a claim that failed, or a kept lease of a claim that did). It asks
// metadata for the grant again; a read-only file asks for it through io
// (proto.GrantThroughIO), which covers both in one round trip: metadata
// grants a recalled handle anew, and grants one it holds as granted at
// io (once per handle and session generation). False with no error:
// nothing to try (io's EBADF stands); an error: the grant failed.
func (fl *File) regrant(c *conn, dh uint64) (bool, error) {
	if fl.dir || testNoRegrant.Load() {
		return false, nil
	}
	fl.hmu.Lock()
	defer fl.hmu.Unlock()
	if fl.gen != c.gen {
		return false, nil // a recovery's business
	}
	if !fl.granted || fl.dataHandle != dh {
		return true, nil // granted anew meanwhile
	}
	if fl.viaDir.Load() {
		// A writer's grant ended the direct open: open it through metadata.
		fl.granted = false
		if err := fl.promoteLocked(c); err != nil {
			return false, err
		}
		return true, nil
	}
	fl.granted = false
	if fl.writable() || c.features&proto.FeatureCaps == 0 {
		fl.hmu.Unlock()
		_, err := fl.grantedHandle(c)
		fl.hmu.Lock()
		return err == nil && fl.gen == c.gen, err
	}
	ndh, err := fl.grantThroughIOLocked(c, fl.handle)
	if err != nil {
		return false, err
	}
	fl.granted, fl.dataHandle = true, ndh
	return true, nil
}

// testNoRegrant makes an EBADF from io final (tests that watch each
// recall).
var testNoRegrant atomic.Bool

// maxRegrants bounds how many times one request is granted again after
// io refused it: each time, another trust group's grant recalled the
// file's between the grant and the request.
const maxRegrants = 8

// dataOp runs fn with the file's granted handle in the current sessions,
// recovering as FS.dataOp does. A file that could not be reopened is not
// a stale session: it fails at once.
func (fl *File) dataOp(idempotent bool, fn func(c *conn, h uint64) error) error {
	run := func(c *conn) error {
		c.meta.Poll() // hands a recall notice waiting there to its goroutine (leases.go)
		h, err := fl.grantedHandle(c)
		if err != nil {
			return err
		}
		err = fn(c, h)
		if again, cerr := fl.settleClaim(); cerr != nil {
			return cerr
		} else if again && errors.Is(err, syscall.EBADF) {
			if h, err = fl.grantedHandle(c); err == nil {
				err = fn(c, h)
			}
		}
		for i := 0; errors.Is(err, syscall.EBADF); i++ {
			if i == maxRegrants && !fl.dir && !testNoRegrant.Load() {
				// The descriptor is good; the grants kept being taken.
				return fmt.Errorf("%w (other trust groups' grants recalled this file's %d times in a row)", syscall.EIO, maxRegrants)
			}
			ok, rerr := fl.regrant(c, h)
			if rerr != nil {
				return rerr // the grant failed: its error, not io's EBADF
			}
			if !ok {
				break
			}
			// io refused before doing anything: the same request again.
			if h, err = fl.grantedHandle(c); err == nil {
				err = fn(c, h)
			}
		}
		return err
	}
	c := fl.fs.current()
	err := run(c)
	var gone *fileGone
	var nameless *nameGone
	if err == nil || errors.As(err, &gone) || errors.As(err, &nameless) || !(lostSession(err) || errors.Is(err, proto.ErrStale)) {
		return err
	}
	nc, rerr := fl.fs.recover(c, err)
	if rerr != nil {
		return rerr
	}
	if !retryable(err, idempotent) {
		return fmt.Errorf("%w (the IO service went away during the request: it may or may not have taken effect)", syscall.EIO)
	}
	return stillStale(run(nc))
}

// stillStale turns an ESTALE that survived a recovery into EIO: the
// services could not serve the request even on new sessions.
func stillStale(err error) error {
	var gone *fileGone
	if errors.Is(err, proto.ErrStale) && !errors.As(err, &gone) {
		return fmt.Errorf("%w (the services answered ESTALE again after the sessions were re-established)", syscall.EIO)
	}
	return err
}

// Close closes the file. A second Close returns an error, as with os.
func (fl *File) Close() error {
	if fl == nil {
		return os.ErrInvalid
	}
	if !fl.closed.CompareAndSwap(false, true) {
		return fl.err("close", os.ErrClosed)
	}
	f := fl.fs
	f.filesMu.Lock()
	delete(f.files, fl)
	f.filesMu.Unlock()
	c := f.current()
	fl.hmu.Lock()
	fl.dropClaimLocked()
	if fl.viaDir.Load() {
		if fl.gen == c.gen && fl.granted {
			fl.releaseDirectLocked(c)
		}
		fl.hmu.Unlock()
		return nil
	}
	h, dh, granted, gen, gone, openCap := fl.handle, fl.dataHandle, fl.granted, fl.gen, fl.gone, fl.openCap
	fl.hmu.Unlock()
	// A read-only handle's grant is, or joins, the session's kept lease
	// of the file: its mapping stays for the next open under it, and its
	// close is sent in the background (leases.go).
	leased := c.features&proto.FeatureLeases != 0 && !fl.writable() && !fl.dir && gone == nil && gen == c.gen
	fl.cmu.Lock()
	if fc := fl.fcache; fc != nil {
		fl.fcFast.Store(nil)
		if leased && granted && fc.gen == c.gen {
			f.kept.put(dh, fc)
		} else {
			fc.unmap()
		}
		fl.fcache = nil
	}
	fl.cmu.Unlock()
	if leased && openCap != nil {
		f.caps.put(dh, gen, openCap) // for the next open under the lease
	}
	if gone != nil || gen != c.gen {
		return nil // the handle died with the sessions that opened it
	}
	if leased && f.late.put(closeReq{meta: c.meta, handle: h}) {
		return nil // sent with the next open, or by the closer
	}
	if _, err := call(bgctx, c.meta, proto.OpClose, 0, h, 0, nil, nil); err != nil {
		if lostSession(err) {
			return nil // the metadata service is gone, and the handle with it
		}
		return fl.err("close", err)
	}
	return nil
}

// readAt reads into p at off, splitting into requests of at most one chunk.
// Linux checks the descriptor's mode before its type: a directory opened
// read-only reads EISDIR, a file opened write-only EBADF.
func (fl *File) readAt(p []byte, off int64) (int, error) {
	if !fl.readable() {
		return 0, syscall.EBADF
	}
	if fl.dir {
		return 0, syscall.EISDIR
	}
	if !fl.direct() && !fl.viaDir.Load() {
		if n, err, ok := fl.readCached(p, off); ok {
			return n, err
		}
	}
	return fl.readRing(p, off)
}

// readRing reads into p at off through the ring, in requests of at most
// one chunk.
func (fl *File) readRing(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		c := fl.fs.current()
		want := min(len(p)-n, fl.chunkIn(c))
		m, err := fl.transfer(proto.OpRead, p[n:n+want], off+int64(n), fl.readArg())
		n += m
		if err != nil {
			return n, err
		}
		if m < want {
			return n, io.EOF
		}
	}
	return n, nil
}

// transfer moves one chunk through the arena: for a write p is copied in,
// for a read the answer is copied out to p. It returns the byte count and,
// for writes, the offset the service wrote at.
func (fl *File) transfer(op uint8, p []byte, off int64, arg uint32) (int, error) {
	var n int
	err := fl.dataOp(op == proto.OpRead || arg&proto.WriteAppend == 0, func(c *conn, h uint64) error {
		b, err := c.data.Alloc(bgctx, len(p))
		if err != nil {
			return transportErr(err)
		}
		defer b.Release()
		if op == proto.OpWrite {
			b.CopyFrom(p)
		}
		var at uint64
		n, at, err = fl.do(c, h, op, b, off, arg)
		_ = at
		if op == proto.OpRead && n > 0 {
			b.CopyTo(p[:n])
		}
		return err
	})
	return n, err
}

// do submits one data request on an arena buffer and validates its
// completion: a count beyond the buffer, or a write at another offset than
// the one asked, is EIO.
func (fl *File) do(c *conn, h uint64, op uint8, b *ring.Buffer, off int64, arg uint32) (int, uint64, error) {
	comp, err := c.data.Do(bgctx, &ring.Call{Op: op, Arg: arg, Handle: h, Offset: uint64(off), Buf: b})
	if err != nil {
		return 0, 0, transportErr(err)
	}
	if comp.Result < 0 {
		return 0, 0, syscall.Errno(-comp.Result)
	}
	if comp.Result > int64(b.Len()) {
		return 0, 0, badCompletion(op, fmt.Sprintf("%d bytes for a buffer of %d", comp.Result, b.Len()))
	}
	if op == proto.OpWrite {
		if (arg&proto.WriteAppend == 0 && comp.Aux != uint64(off)) || comp.Aux > 1<<62 {
			return 0, 0, badCompletion(op, fmt.Sprintf("written at %d, asked at %d", comp.Aux, off))
		}
		if comp.Result > 0 {
			fl.hmu.Lock()
			fl.writes++
			fl.hmu.Unlock()
		}
	}
	return int(comp.Result), comp.Aux, nil
}

// writeAt writes p at off (or at the end with O_APPEND) and returns the
// count and the offset after the last byte written. Linux checks the
// descriptor's mode before its type: writing a directory (which can only
// be open read-only) is EBADF.
func (fl *File) writeAt(p []byte, off int64, appendMode bool) (int, int64, error) {
	if !fl.writable() {
		return 0, off, syscall.EBADF
	}
	if fl.dir {
		return 0, off, syscall.EISDIR
	}
	n := 0
	arg := fl.writeArg(appendMode)
	end := off
	for n < len(p) {
		var m int
		var at uint64
		err := fl.dataOp(!appendMode, func(c *conn, h uint64) error {
			chunk := p[n:min(len(p), n+fl.chunkIn(c))]
			b, err := c.data.Alloc(bgctx, len(chunk))
			if err != nil {
				return transportErr(err)
			}
			defer b.Release()
			b.CopyFrom(chunk)
			m, at, err = fl.do(c, h, proto.OpWrite, b, off+int64(n), arg)
			if err == nil && m < len(chunk) {
				err = io.ErrShortWrite
			}
			return err
		})
		n += m
		if appendMode {
			end = int64(at) + int64(m)
		} else {
			end = off + int64(n)
		}
		if err != nil {
			return n, end, err
		}
	}
	return n, end, nil
}

// Read reads up to len(p) bytes at the file position and advances it.
func (fl *File) Read(p []byte) (int, error) {
	if err := fl.check("read"); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	n, err := fl.readAt(p, fl.off)
	fl.off += int64(n)
	if errors.Is(err, io.EOF) {
		if n > 0 {
			return n, nil
		}
		return 0, io.EOF
	}
	if err != nil {
		return n, fl.err("read", err)
	}
	return n, nil
}

// ReadAt reads len(p) bytes at off; fewer only with an error (io.EOF at
// the end of the file).
func (fl *File) ReadAt(p []byte, off int64) (int, error) {
	if err := fl.check("read"); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fl.err("readat", errors.New("negative offset"))
	}
	n, err := fl.readAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, fl.err("read", err)
	}
	return n, err
}

// Write writes p at the file position (or the end, with O_APPEND).
func (fl *File) Write(p []byte) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	n, end, err := fl.writeAt(p, fl.off, fl.appending())
	fl.off = end
	if err != nil {
		return n, fl.err("write", err)
	}
	return n, nil
}

// WriteAt writes p at off. Like os, it refuses files opened with O_APPEND.
func (fl *File) WriteAt(p []byte, off int64) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	if fl.appending() {
		return 0, errors.New("weir: invalid use of WriteAt on file opened with O_APPEND")
	}
	if off < 0 {
		return 0, fl.err("writeat", errors.New("negative offset"))
	}
	n, _, err := fl.writeAt(p, off, false)
	if err != nil {
		return n, fl.err("write", err)
	}
	return n, nil
}

// vecLen is the total length of bufs; E2BIG if one request cannot carry it.
func (fl *File) vecLen(bufs [][]byte) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if total > fl.fs.MaxBuffer() {
		return 0, syscall.E2BIG
	}
	return total, nil
}

// ReadV reads into several buffers with one request, at the file position,
// scattering straight from the shared arena (one copy per byte). Like
// readv(2) it returns fewer bytes at the end of the file, and io.EOF only
// when there are none.
func (fl *File) ReadV(bufs [][]byte) (int, error) {
	if err := fl.check("readv"); err != nil {
		return 0, err
	}
	total, err := fl.vecLen(bufs)
	if err != nil {
		return 0, fl.err("readv", err)
	}
	if total == 0 {
		return 0, nil
	}
	if !fl.readable() {
		return 0, fl.err("readv", syscall.EBADF)
	}
	if fl.dir {
		return 0, fl.err("readv", syscall.EISDIR)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var n int
	err = fl.dataOp(true, func(c *conn, h uint64) error {
		b, err := c.data.Alloc(bgctx, total)
		if err != nil {
			return transportErr(err)
		}
		defer b.Release()
		if n, _, err = fl.do(c, h, proto.OpRead, b, fl.off, fl.readArg()); err != nil {
			return err
		}
		src, si, soff, left := b.Slices(), 0, 0, n
		for _, dst := range bufs {
			for d := 0; d < len(dst) && left > 0; {
				k := copy(dst[d:min(len(dst), d+left)], src[si][soff:])
				d, soff, left = d+k, soff+k, left-k
				if soff == len(src[si]) {
					si, soff = si+1, 0
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, fl.err("readv", err)
	}
	fl.off += int64(n)
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// WriteV writes several buffers with one request, at the file position.
func (fl *File) WriteV(bufs [][]byte) (int, error) {
	if err := fl.check("writev"); err != nil {
		return 0, err
	}
	total, err := fl.vecLen(bufs)
	if err != nil {
		return 0, fl.err("writev", err)
	}
	if total == 0 {
		return 0, nil
	}
	if !fl.writable() || fl.dir {
		return 0, fl.err("writev", syscall.EBADF)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	arg := fl.writeArg(fl.appending())
	var n int
	var at uint64
	err = fl.dataOp(arg&proto.WriteAppend == 0, func(c *conn, h uint64) error {
		b, err := c.data.Alloc(bgctx, total)
		if err != nil {
			return transportErr(err)
		}
		defer b.Release()
		// Gather straight into the arena: one copy per byte.
		dst := b.Slices()
		di, doff := 0, 0
		for _, src := range bufs {
			for len(src) > 0 {
				k := copy(dst[di][doff:], src)
				src, doff = src[k:], doff+k
				if doff == len(dst[di]) {
					di, doff = di+1, 0
				}
			}
		}
		n, at, err = fl.do(c, h, proto.OpWrite, b, fl.off, arg)
		return err
	})
	if err != nil {
		return 0, fl.err("writev", err)
	}
	fl.advance(n, at)
	return n, nil
}

// advance moves the file position past n bytes written at at. fl.mu is
// held.
func (fl *File) advance(n int, at uint64) {
	if fl.appending() {
		fl.off = int64(at) + int64(n)
	} else {
		fl.off += int64(n)
	}
}

// AllocBuffer reserves n bytes of this session's shared arena for the
// zero-copy calls: fill b.Slices() in place, then WriteBuffer or
// WriteBufferAt; or ReadBufferAt into it and read b.Slices(). Release it
// when done. n is at most MaxBuffer. A buffer belongs to the IO session it
// was allocated in: after a recovery replaced that session, calls with it
// fail with EINVAL (allocate a new one).
func (f *FS) AllocBuffer(n int) (*ring.Buffer, error) {
	b, err := f.current().data.Alloc(bgctx, n)
	if err != nil {
		return nil, transportErr(err)
	}
	return b, nil
}

// MaxBuffer is the largest buffer one zero-copy call can carry.
func (f *FS) MaxBuffer() int { return f.current().chunk }

// bufferOp runs a zero-copy request: the buffer cannot move to new
// sessions, so a request refused as stale or lost with its session is not
// sent again (the sessions are recovered for later calls).
func (fl *File) bufferOp(op uint8, b *ring.Buffer, off int64, arg uint32) (int, uint64, error) {
	var n int
	var at uint64
	err := fl.dataOp(false, func(c *conn, h uint64) error {
		var err error
		n, at, err = fl.do(c, h, op, b, off, arg)
		return err
	})
	return n, at, err
}

// WriteBuffer writes an arena buffer at the file position (zero copy).
func (fl *File) WriteBuffer(b *ring.Buffer) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	if !fl.writable() || fl.dir {
		return 0, fl.err("write", syscall.EBADF)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	n, at, err := fl.bufferOp(proto.OpWrite, b, fl.off, fl.writeArg(fl.appending()))
	if err != nil {
		return 0, fl.err("write", err)
	}
	fl.advance(n, at)
	return n, nil
}

// WriteBufferAt writes an arena buffer at off (zero copy).
func (fl *File) WriteBufferAt(b *ring.Buffer, off int64) (int, error) {
	if err := fl.check("write"); err != nil {
		return 0, err
	}
	if !fl.writable() || fl.dir || fl.appending() || off < 0 {
		return 0, fl.err("write", syscall.EINVAL)
	}
	n, _, err := fl.bufferOp(proto.OpWrite, b, off, fl.writeArg(false))
	if err != nil {
		return 0, fl.err("write", err)
	}
	return n, nil
}

// ReadBufferAt reads into an arena buffer at off (zero copy). Like ReadAt
// it returns io.EOF with a short count at the end of the file.
func (fl *File) ReadBufferAt(b *ring.Buffer, off int64) (int, error) {
	if err := fl.check("read"); err != nil {
		return 0, err
	}
	if !fl.readable() || fl.dir || off < 0 {
		return 0, fl.err("read", syscall.EBADF)
	}
	n, _, err := fl.bufferOp(proto.OpRead, b, off, fl.readArg())
	if err != nil {
		return 0, fl.err("read", err)
	}
	if n < b.Len() {
		return n, io.EOF
	}
	return n, nil
}

// Seek sets the file position, as os.File.Seek.
func (fl *File) Seek(offset int64, whence int) (int64, error) {
	if err := fl.check("seek"); err != nil {
		return 0, err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var base int64
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		base = fl.off
	case io.SeekEnd:
		fi, err := fl.Stat()
		if err != nil {
			return 0, err
		}
		base = fi.Size()
	default:
		return 0, fl.err("seek", syscall.EINVAL)
	}
	pos := base + offset
	if pos < 0 || (offset > 0 && pos < base) || (!fl.dir && pos > proto.MaxFileSize) {
		// Before 0, past what an offset holds, or past weir's largest
		// file (Linux's s_maxbytes: ext4 answers so past 16 TiB - 4 KiB).
		return 0, fl.err("seek", syscall.EINVAL)
	}
	fl.off = pos
	if fl.dir && pos == 0 {
		fl.dirAfter, fl.dirDone = "", false
	}
	return pos, nil
}

// Truncate changes the file's size (ftruncate).
func (fl *File) Truncate(size int64) error {
	if err := fl.check("truncate"); err != nil {
		return err
	}
	if fl.dir || !fl.writable() || size < 0 {
		return fl.err("truncate", syscall.EINVAL)
	}
	err := fl.dataOp(true, func(c *conn, h uint64) error {
		if c.features&proto.FeatureRecordCuts != 0 {
			// io keeps no staging log: metadata records the size
			// first, so that no crash leaves it above the blob's.
			mh, err := fl.handleIn(c)
			if err != nil {
				return err
			}
			if _, err := call(bgctx, c.meta, proto.OpCut, 0, mh, uint64(size), nil, nil); err != nil {
				return err
			}
		}
		_, err := call(bgctx, c.data, proto.OpTruncate, 0, h, uint64(size), nil, nil)
		return err
	})
	if err != nil {
		return fl.err("truncate", err)
	}
	fl.hmu.Lock()
	fl.writes++
	fl.hmu.Unlock()
	return nil
}

// Sync makes the file's data and attributes durable. If the IO service
// died with writes of this file not yet durable, Sync returns EIO once.
func (fl *File) Sync() error { return fl.sync(0) }

// Datasync is fdatasync: the data and the size, durable.
func (fl *File) Datasync() error { return fl.sync(proto.SyncData) }

func (fl *File) sync(arg uint32) error {
	if err := fl.check("sync"); err != nil {
		return err
	}
	fl.hmu.Lock()
	lost := fl.lost
	fl.lost = nil
	start := fl.writes
	fl.hmu.Unlock()
	if lost != nil {
		return fl.err("sync", lost)
	}
	var err error
	if fl.dir {
		err = fl.fs.metaOp(true, func(c *conn) error {
			_, err := call(bgctx, c.meta, proto.OpSyncMeta, 0, 0, 0, nil, nil)
			return err
		})
	} else {
		err = fl.dataOp(true, func(c *conn, h uint64) error {
			_, err := call(bgctx, c.data, proto.OpSync, arg, h, 0, nil, nil)
			return err
		})
		if errors.Is(err, syscall.EIO) && fl.viaDir.Load() && fl.removedDirect() {
			// A direct open of a file removed since: its bytes are
			// synced, and it has no size left to record.
			err = nil
		}
	}
	if err != nil {
		return fl.err("sync", err)
	}
	fl.hmu.Lock()
	if fl.lost == nil {
		fl.synced = start
	}
	fl.hmu.Unlock()
	return nil
}

// Stat returns the file's attributes, including writes not yet closed.
func (fl *File) Stat() (fs.FileInfo, error) {
	if err := fl.check("stat"); err != nil {
		return nil, err
	}
	if fl.viaDir.Load() {
		// A direct open (direct.go): its name's attributes, if the name
		// still names it; else it is opened through metadata first, and
		// if its name no longer names it, io and what the file learned
		// answer.
		if fi, err := fl.fs.statAt(nil, "stat", fl.name); err == nil && fi.a.Ino == fl.ino {
			fl.hmu.Lock()
			fl.known = fi.a
			fl.hmu.Unlock()
			return newFileInfo(baseName(fl.name), fi.a), nil
		}
	}
	var a proto.Attr
	var gone *nameGone
	err := fl.fs.metaOp(true, func(c *conn) error {
		h, err := fl.handleIn(c)
		if err != nil {
			return err
		}
		out := make([]byte, proto.AttrSize)
		comp, err := call(bgctx, c.meta, proto.OpFStat, 0, h, 0, nil, out)
		if err != nil {
			return err
		}
		if a, err = proto.DecodeAttr(out[:comp.Result]); err != nil {
			return badCompletion(proto.OpFStat, "attr does not decode")
		}
		return nil
	})
	if errors.As(err, &gone) {
		a, err = fl.statDirect()
	}
	if err != nil {
		return nil, fl.err("stat", err)
	}
	return newFileInfo(baseName(fl.name), a), nil
}

// handleCall runs an attribute change on the file's handle (fchmod,
// fchown, futimens).
func (fl *File) handleCall(op uint8, arg uint32, body []byte) error {
	return fl.fs.metaOp(true, func(c *conn) error {
		h, err := fl.handleIn(c)
		if err != nil {
			return err
		}
		_, err = call(bgctx, c.meta, op, arg, h, 0, body, nil)
		return err
	})
}

// Chmod changes the file's mode bits (fchmod).
func (fl *File) Chmod(mode fs.FileMode) error {
	if err := fl.check("chmod"); err != nil {
		return err
	}
	if err := fl.handleCall(proto.OpFChmod, modeBits(mode), nil); err != nil {
		return fl.err("chmod", err)
	}
	return nil
}

// Chown changes the file's owner and group; -1 leaves one unchanged
// (fchown).
func (fl *File) Chown(uid, gid int) error {
	if err := fl.check("chown"); err != nil {
		return err
	}
	if err := fl.handleCall(proto.OpFChown, 0, (&proto.OwnerReq{UID: int64(uid), GID: int64(gid)}).Append(nil, false)); err != nil {
		return fl.err("chown", err)
	}
	return nil
}

// Chtimes sets the file's access and modification times; a zero time.Time
// leaves one unchanged (futimens).
func (fl *File) Chtimes(atime, mtime time.Time) error {
	if err := fl.check("chtimes"); err != nil {
		return err
	}
	body := (&proto.TimesReq{Atime: timeArg(atime), Mtime: timeArg(mtime)}).Append(nil, false)
	if err := fl.handleCall(proto.OpFChtimes, 0, body); err != nil {
		return fl.err("chtimes", err)
	}
	return nil
}

// Touch sets both times of the file to the metadata service's clock, as
// futimens(fd, NULL): the owner, root or a caller that may write the
// file may.
func (fl *File) Touch() error {
	if err := fl.check("touch"); err != nil {
		return err
	}
	body := (&proto.TimesReq{Atime: proto.TimeNow, Mtime: proto.TimeNow}).Append(nil, false)
	if err := fl.handleCall(proto.OpFChtimes, 0, body); err != nil {
		return fl.err("touch", err)
	}
	return nil
}

// dirOnly refuses a path operation relative to a file that is not a
// directory, as the *at() calls do with ENOTDIR.
func (fl *File) dirOnly(op, name string) error {
	if err := fl.check(op); err != nil {
		return err
	}
	if !fl.dir {
		return pathErr(op, name, syscall.ENOTDIR)
	}
	return nil
}

// OpenAt opens name relative to this directory, as openat(2): a relative
// name resolves from here, an absolute one from the root, and ".." may
// leave the directory.
func (fl *File) OpenAt(name string, flag int, perm fs.FileMode) (*File, error) {
	if err := fl.dirOnly("open", name); err != nil {
		return nil, err
	}
	return fl.fs.openAt(fl, name, flag, perm)
}

// StatAt is Stat of name relative to this directory (fstatat).
func (fl *File) StatAt(name string) (fs.FileInfo, error) {
	if err := fl.dirOnly("stat", name); err != nil {
		return nil, err
	}
	return fl.fs.statAt(fl, "stat", name)
}

// MkdirAt is Mkdir of name relative to this directory (mkdirat).
func (fl *File) MkdirAt(name string, perm fs.FileMode) error {
	if err := fl.dirOnly("mkdir", name); err != nil {
		return err
	}
	return fl.fs.mkdirAt(fl, name, perm)
}

// RemoveAt is Remove of name relative to this directory (unlinkat).
func (fl *File) RemoveAt(name string) error {
	if err := fl.dirOnly("remove", name); err != nil {
		return err
	}
	return fl.fs.removeAt(fl, name)
}

// RenameAt renames oldname, relative to this directory, to newname,
// relative to newdir (renameat); a nil newdir is the root.
func (fl *File) RenameAt(oldname string, newdir *File, newname string) error {
	if err := fl.dirOnly("rename", oldname); err != nil {
		return err
	}
	if newdir != nil {
		if err := newdir.dirOnly("rename", newname); err != nil {
			return err
		}
	}
	return fl.fs.renameAt(fl, oldname, newdir, newname)
}

// ChmodAt is Chmod of name relative to this directory (fchmodat).
func (fl *File) ChmodAt(name string, mode fs.FileMode) error {
	if err := fl.dirOnly("chmod", name); err != nil {
		return err
	}
	return fl.fs.chmodAt(fl, name, mode)
}

// ChownAt is Chown of name relative to this directory (fchownat).
func (fl *File) ChownAt(name string, uid, gid int) error {
	if err := fl.dirOnly("chown", name); err != nil {
		return err
	}
	return fl.fs.chownAt(fl, name, uid, gid, 0)
}

// ChtimesAt is Chtimes of name relative to this directory (utimensat).
func (fl *File) ChtimesAt(name string, atime, mtime time.Time) error {
	if err := fl.dirOnly("chtimes", name); err != nil {
		return err
	}
	return fl.fs.chtimesAt(fl, name, atime, mtime)
}

// ReadDirAt reads directory name relative to this directory.
func (fl *File) ReadDirAt(name string) ([]fs.DirEntry, error) {
	if err := fl.dirOnly("open", name); err != nil {
		return nil, err
	}
	return fl.fs.readDir(fl, "open", name, "", -1)
}

// ReadDir reads the directory's entries in name order, n at a time (n <= 0:
// all remaining), like os.File.ReadDir.
func (fl *File) ReadDir(n int) ([]fs.DirEntry, error) {
	if err := fl.check("readdirent"); err != nil {
		return nil, err
	}
	if !fl.dir {
		return nil, fl.err("readdirent", syscall.ENOTDIR)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.dirDone {
		if n > 0 {
			return nil, io.EOF
		}
		return []fs.DirEntry{}, nil
	}
	limit := n
	if n <= 0 {
		limit = -1
	}
	ents, err := fl.fs.readDir(fl, "readdirent", ".", fl.dirAfter, limit)
	if len(ents) > 0 {
		fl.dirAfter = ents[len(ents)-1].Name()
	}
	if err != nil {
		return ents, err
	}
	if n <= 0 || len(ents) < n {
		fl.dirDone = true
	}
	if n > 0 && len(ents) == 0 {
		return nil, io.EOF
	}
	if ents == nil {
		ents = []fs.DirEntry{}
	}
	return ents, nil
}

// fileInfo is an fs.FileInfo from protocol attributes.
type fileInfo struct {
	name string
	a    proto.Attr
}

func newFileInfo(name string, a proto.Attr) *fileInfo { return &fileInfo{name: name, a: a} }

func (i *fileInfo) Name() string       { return i.name }
func (i *fileInfo) Size() int64        { return i.a.Size }
func (i *fileInfo) Mode() fs.FileMode  { return fileMode(i.a.Mode) }
func (i *fileInfo) ModTime() time.Time { return time.Unix(0, i.a.Mtime) }
func (i *fileInfo) IsDir() bool        { return i.a.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// Sys returns a *syscall.Stat_t, as package os does on Linux.
func (i *fileInfo) Sys() any {
	return &syscall.Stat_t{
		Ino: i.a.Ino, Nlink: uint64(i.a.Nlink), Mode: i.a.Mode, Uid: i.a.UID, Gid: i.a.GID,
		Size: i.a.Size, Blksize: 4096, Blocks: (i.a.Size + 511) / 512,
		Atim: syscall.NsecToTimespec(i.a.Atime), Mtim: syscall.NsecToTimespec(i.a.Mtime),
		Ctim: syscall.NsecToTimespec(i.a.Ctime),
	}
}

// fileMode converts POSIX mode bits to an fs.FileMode, as package os does.
func fileMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		fm |= fs.ModeDir
	case syscall.S_IFLNK:
		fm |= fs.ModeSymlink
	case syscall.S_IFREG:
	default:
		fm |= fs.ModeIrregular
	}
	if m&syscall.S_ISUID != 0 {
		fm |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		fm |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// baseName is the last element of a path, as os.Stat names its FileInfo.
func baseName(name string) string {
	name = strings.TrimRight(name, "/")
	if name == "" {
		return "/"
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		return name[i+1:]
	}
	return name
}

// dirEntry is one ReadDir result; Info stats it on demand, like os.
type dirEntry struct {
	fs   *FS
	dir  *File // the directory path is relative to; nil: the root
	path string
	name string
	ino  uint64
	mode uint32
}

func (d *dirEntry) Name() string      { return d.name }
func (d *dirEntry) IsDir() bool       { return d.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (d *dirEntry) Type() fs.FileMode { return fileMode(d.mode & syscall.S_IFMT).Type() }
func (d *dirEntry) Info() (fs.FileInfo, error) {
	return d.fs.statAt(d.dir, "lstat", strings.TrimSuffix(d.path, "/")+"/"+d.name)
}
func (d *dirEntry) String() string { return fs.FormatDirEntry(d) }
