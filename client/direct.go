package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"

	"github.com/weir-storage/weir/proto"
)

// Direct opens, the client's side (proto.FeatureDirOpen; docs/
// architecture.md, "Direct opens").
//
// After coldBeforeSnapshot read-only opens through metadata of files of
// one directory that the session held no lease of, the client asks
// metadata for the directory's snapshot (OpDirLease, in the background):
// its regular files this session may read, each with a capability. A
// read-only open of a name in it is then one request to io (OpClaimDir),
// which checks the capability against its directory generation and
// answers a handle of its own: a cold open wakes io alone, where an open
// through metadata wakes metadata and then io.
//
// The snapshot is a hint. A name it lacks is opened through metadata (it
// never answers ENOENT); a claim io refuses (the namespace changed since
// the snapshot: a generation moved) drops every snapshot, and the open
// goes through metadata. A file opened this way has no metadata handle:
// the first call that needs one (Chmod, a Stat its name no longer
// answers, a recovery) or an EBADF from io (a writer's grant ended the
// direct open) opens it through metadata by its name and checks that the
// name still names the same inode, and the file is an ordinary one from
// then on. If it does not (nameGone), the file stays a direct one: Stat
// and Sync are answered at io (statDirect, removedDirect), the rest is
// ESTALE.
// Its reads go through the ring (no mapping: io could not take one
// back), and its close queues an OpRelease that rides in the session's
// next claim or goes closeLinger later.
//
// A file opened directly twice goes through metadata the second time,
// where it gets a kept lease and its mapping (the warm path is faster).

// coldBeforeSnapshot is how many cold opens of one directory's files
// make the client ask for its snapshot.
const coldBeforeSnapshot = 2

// maxSnapshotEntries bounds a snapshot the client keeps (a larger
// directory's files are opened through metadata).
const maxSnapshotEntries = 1 << 16

// maxSeen bounds the inodes remembered as opened directly once.
const maxSeen = 1 << 16

// directState is the FS's snapshots, for the sessions of generation gen.
type directState struct {
	mu       sync.Mutex
	gen      uint64
	snaps    map[string]map[string]proto.SnapEntry // dir path -> name -> entry
	cold     map[string]int                        // dir path -> cold opens through metadata
	fetching map[string]bool
	seen     map[uint64]bool // inodes opened directly once
}

// resetLocked forgets everything unless it is of generation gen.
func (d *directState) resetLocked(gen uint64) {
	if d.gen == gen && d.snaps != nil {
		return
	}
	d.gen = gen
	d.snaps = map[string]map[string]proto.SnapEntry{}
	d.cold = map[string]int{}
	d.fetching = map[string]bool{}
	d.seen = map[uint64]bool{}
}

// dropSnapshots forgets every snapshot: io refused one's capability (the
// namespace changed since, which moved the generation all share).
func (f *FS) dropSnapshots() {
	d := &f.direct
	d.mu.Lock()
	if len(d.snaps) > 0 {
		d.snaps = map[string]map[string]proto.SnapEntry{}
	}
	d.mu.Unlock()
}

// directable says whether an open of name with flag may be direct.
func directable(c *conn, dir *File, name string, flag int) bool {
	return c.features&proto.FeatureDirOpen != 0 && dir == nil && flag&^syscall.O_CLOEXEC == os.O_RDONLY && fs.ValidPath(name) && name != "."
}

// openDirect opens name read-only at io from its directory's snapshot;
// ok false: open it through metadata.
func (f *FS) openDirect(c *conn, name string, flag int) (*File, bool) {
	dir, base := path.Dir(name), path.Base(name)
	d := &f.direct
	d.mu.Lock()
	d.resetLocked(c.gen)
	e, ok := d.snaps[dir][base]
	if ok && d.seen[e.Ino] {
		ok = false // a second open: through metadata, for its kept lease
	}
	if ok {
		if len(d.seen) >= maxSeen {
			d.seen = map[uint64]bool{}
		}
		d.seen[e.Ino] = true
	}
	d.mu.Unlock()
	if !ok {
		return nil, false
	}
	var b [proto.ClaimDirSize]byte
	copy(b[:], e.Cap[:])
	r, queued := f.late.take(c.data)
	if queued {
		binary.LittleEndian.PutUint64(b[proto.CapSize:], r.handle)
	}
	comp, err := call(bgctx, c.data, proto.OpClaimDir, 0, 0, 0, b[:], nil)
	if err != nil || comp.Aux&proto.DirOpenBit == 0 {
		if queued && err != nil {
			f.late.giveBack(r) // (io may have released it already: a second release is no error)
		}
		f.DirectRefused.Add(1)
		if errors.Is(err, syscall.EKEYREJECTED) {
			f.dropSnapshots()
		}
		return nil, false
	}
	f.DirectOpens.Add(1)
	fl := &File{fs: f, name: name, flags: flag, dataHandle: comp.Aux, meta: c.meta, gen: c.gen, granted: true, ino: e.Ino}
	fl.known = proto.Attr{Ino: e.Ino, Mode: e.Mode, Nlink: 1, UID: unknownID, GID: unknownID}
	fl.viaDir.Store(true)
	return fl, true
}

// noteCold counts a cold read-only open through metadata of a file of
// name's directory, and asks for the directory's snapshot at the
// coldBeforeSnapshot-th.
func (f *FS) noteCold(c *conn, name string) {
	dir := path.Dir(name)
	d := &f.direct
	d.mu.Lock()
	d.resetLocked(c.gen)
	_, have := d.snaps[dir]
	d.cold[dir]++
	fetch := !have && !d.fetching[dir] && d.cold[dir] >= coldBeforeSnapshot
	if fetch {
		d.fetching[dir] = true
		d.cold[dir] = 0
	}
	if len(d.cold) > 1024 {
		d.cold = map[string]int{}
	}
	d.mu.Unlock()
	if fetch {
		go f.fetchSnapshot(c, dir)
	}
}

// fetchSnapshot asks for dir's snapshot, page by page, and keeps it.
func (f *FS) fetchSnapshot(c *conn, dir string) {
	ents := map[string]proto.SnapEntry{}
	after := ""
	ok := true
	out := make([]byte, min(c.meta.MaxBuffer(), 256<<10))
	for {
		body := (&proto.ReadDirReq{Path: dir, After: after}).Append(nil)
		comp, err := call(bgctx, c.meta, proto.OpDirLease, 0, proto.RootHandle, 0, body, out)
		if err != nil {
			ok = false
			break
		}
		page, err := proto.DecodeSnapEntries(out[:comp.Result])
		if err != nil || (comp.Aux != 0 && len(page) == 0) {
			ok = false
			break
		}
		for _, e := range page {
			ents[e.Name] = e
		}
		if comp.Aux == 0 || len(ents) > maxSnapshotEntries {
			ok = comp.Aux == 0
			break
		}
		after = page[len(page)-1].Name
	}
	d := &f.direct
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gen != c.gen || d.snaps == nil {
		return
	}
	delete(d.fetching, dir)
	if ok {
		d.snaps[dir] = ents
		f.Snapshots.Add(1)
	}
}

// promoteLocked makes a directly opened file an ordinary one: opened
// through metadata by its name in the sessions c, which must name the
// same inode (ESTALE otherwise: it was renamed or removed meanwhile),
// with its direct open released. On an error the file stays a direct
// one: the call that needed metadata fails, its reads go on while io
// honours the direct open. hmu is held.
func (fl *File) promoteLocked(c *conn) error {
	if !fl.viaDir.Load() {
		return nil
	}
	f := fl.fs
	body := (&proto.ModePathReq{Path: fl.name}).Append(nil)
	out := make([]byte, proto.OpenRespSize(c.features))
	comp, err := call(bgctx, c.meta, proto.OpOpen, uint32(os.O_RDONLY), proto.RootHandle, 0, body, out)
	if err != nil && !lostSession(err) && !errors.Is(err, proto.ErrStale) {
		// Renamed, removed, or no longer readable by its name: as
		// below, the descriptor is good, but weir cannot reach it here.
		return &nameGone{why: fmt.Sprintf("the file cannot be opened by its name now: %v", err)}
	}
	if err != nil {
		return err
	}
	r, err := proto.DecodeOpenResp(out[:comp.Result], c.features)
	if err != nil {
		return badCompletion(proto.OpOpen, "open answer does not decode")
	}
	if r.Attr.Ino != fl.ino || r.Attr.Mode&syscall.S_IFMT != syscall.S_IFREG {
		_, _ = call(bgctx, c.meta, proto.OpClose, 0, r.Handle, 0, nil, nil)
		return &nameGone{why: "the file's name now names another file or none"}
	}
	if fl.gen == c.gen {
		fl.releaseDirectLocked(c)
	}
	fl.viaDir.Store(false)
	fl.handle, fl.dataHandle, fl.meta, fl.gen, fl.granted = r.Handle, r.IOHandle(), c.meta, c.gen, r.Granted
	fl.ticket, fl.hasTicket, fl.throughIO, fl.openCap = r.Ticket, r.HasTicket, false, nil
	if r.HasCap {
		fl.openCap = &r.Cap
	}
	f.DirectPromoted.Add(1)
	return nil
}

// releaseDirectLocked queues the release of the file's direct open (or
// sends it, if the queue is full). hmu is held.
func (fl *File) releaseDirectLocked(c *conn) {
	if fl.fs.late.put(closeReq{meta: c.data, handle: fl.dataHandle, op: proto.OpRelease}) {
		return
	}
	_, _ = call(bgctx, c.data, proto.OpRelease, 0, fl.dataHandle, 0, nil, nil)
}

// nameGone is promoteLocked's error when the file's name no longer names
// it (removed or renamed since the direct open): the descriptor is good,
// and io serves it, but weir can give it no metadata handle. What needs
// only io still works: reads, fstat (statDirect) and fsync.
type nameGone struct{ why string }

func (e *nameGone) Error() string {
	return fmt.Sprintf("%v (opened at io from a directory snapshot, %s; weir gives such a file no metadata handle)", syscall.ESTALE, e.why)
}
func (e *nameGone) Unwrap() error { return syscall.ESTALE }

// unknownID is the owner a direct file's fstat answers when no stat by
// its name told it the real one before the name went (Linux's
// overflowuid and overflowgid: an id the kernel cannot represent).
const unknownID = 65534

// statDirect answers fstat of a direct file whose name no longer names
// it: the attributes it last learned (the snapshot's inode and mode, then
// a stat by its name's owner, links and times), with the size io holds
// for the open blob, and io's mtime if the blob changed since io opened
// it. An error: io no longer serves the direct open (a writer's grant
// ended it, or io restarted), and the file is unreachable.
func (fl *File) statDirect() (proto.Attr, error) {
	var r proto.GetAttrResp
	err := fl.dataOp(true, func(c *conn, h uint64) error {
		out := make([]byte, proto.GetAttrRespSize)
		comp, err := call(bgctx, c.data, proto.OpGetAttr, 0, h, 0, nil, out)
		if err != nil {
			return err
		}
		if r, err = proto.DecodeGetAttrResp(out[:comp.Result]); err != nil {
			return badCompletion(proto.OpGetAttr, "attributes do not decode")
		}
		return nil
	})
	if err != nil {
		return proto.Attr{}, err
	}
	fl.hmu.Lock()
	a := fl.known
	fl.hmu.Unlock()
	a.Size = r.Size
	if r.Changed && r.Mtime > a.Mtime {
		a.Mtime, a.Ctime = r.Mtime, max(a.Ctime, r.Mtime)
	}
	return a, nil
}

// removedDirect says whether an EIO from a direct file's fsync is io
// failing to record the size of a file that no longer exists: io syncs
// the blob's bytes, then reports its size to metadata when it changed
// (or its name is not durable yet), and metadata refuses the report of a
// removed file; io answers that refusal EIO. A direct open has no
// metadata handle to keep its inode, so the removal of its last name
// removes the file. It says so when the name no longer names the file.
// A file renamed away whose sync failed at the device looks the same; a
// failed sync makes io unhealthy (weir status) until it restarts.
func (fl *File) removedDirect() bool {
	fi, err := fl.fs.statAt(nil, "stat", fl.name)
	if err != nil {
		return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR)
	}
	return fi.a.Ino != fl.ino
}
