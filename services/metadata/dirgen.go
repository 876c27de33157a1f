package metadata

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/grantcap"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// Directory snapshots and the directory generation (proto.FeatureDirOpen;
// docs/architecture.md, "Direct opens").
//
// OpDirLease answers a page of a directory's snapshot: each regular file
// the session may open read-only by its name there, with a capability
// (grantcap.AccessDirOpen: session, blob, generation) that io accepts as
// an open (OpClaimDir, services/io/direct.go) while its own directory
// generation is the one the capability names. A snapshot is a hint the
// client may act on without asking here again; what makes that safe is
// the generation:
//
//   - Every request that could make a snapshot's answer wrong (dirChanging
//     lists them: an entry's removal or replacement, a change of mode or
//     owner, which may also be a path's search permission) first moves the
//     generation forward at io, and waits for its ack, whenever a snapshot
//     was minted at the current one (out). From that ack on, io refuses
//     every capability of the earlier generation; so a direct open either
//     took effect before the change began or is refused, and the client
//     asks here. A change made while no snapshot is out costs nothing.
//   - A snapshot is minted only from a namespace no such change was
//     touching: started and finished count the changes, and a page is
//     answered only if no change started while it was being read that had
//     not finished before (else it is read again, and after a few tries
//     answered EAGAIN: the client opens through the metadata service).
//   - Creates need neither: a name a snapshot lacks is looked up here.
//
// What the generation does not cover, io does: a file a writer holds
// takes no direct open, and a write grant ends the direct opens of other
// sessions.
type dirGen struct {
	gen      atomic.Uint64 // the generation io was last told (at resync, or acked)
	out      atomic.Bool   // a snapshot was minted at gen
	started  atomic.Uint64 // changes begun
	finished atomic.Uint64 // changes done
	bumpMu   sync.Mutex    // one bump at a time, and no change applied while one is under way
	bumps    atomic.Uint64 // generations moved forward
	snaps    atomic.Uint64 // snapshot pages answered
}

// dirChanging lists the requests that may invalidate a snapshot.
var dirChanging = map[uint8]bool{
	proto.OpRmdir: true, proto.OpUnlink: true, proto.OpRename: true,
	proto.OpChmod: true, proto.OpChown: true, proto.OpFChmod: true, proto.OpFChown: true,
}

// errDirGen: io did not ack the generation's move, so the change that
// needed it is not made.
var errDirGen = errors.New("the IO service did not take the new directory generation")

// changeDir runs a request that may invalidate snapshots (dirChanging):
// the generation moves first if a snapshot is out at the current one.
func (s *Service) changeDir(f func() (int64, uint64)) (int64, uint64) {
	d := &s.dg
	d.started.Add(1)
	defer d.finished.Add(1)
	d.bumpMu.Lock()
	if d.out.Swap(false) {
		next := d.gen.Load() + 1
		var ack control.Ack
		err := s.request(s.subj.DirGen, control.DirGen{Incarnation: s.inc, Gen: next}, &ack)
		if err != nil && !errors.Is(err, errIODown) {
			// io may hold the old generation still, and serve it; or
			// it took next and the ack was lost: count on from next
			// (forward is always safe), and bump again at the next change.
			d.gen.Store(next)
			d.out.Store(true)
			d.bumpMu.Unlock()
			s.log.Error("directory generation not acked: the change is refused", "error", err)
			return -int64(syscall.EIO), 0
		}
		// (io down: its next resync carries the new generation, and a new
		// capability key with it.)
		d.gen.Store(next)
		d.bumps.Add(1)
	}
	d.bumpMu.Unlock()
	return f()
}

// snapshotTries bounds the reads of a page that changes raced.
const snapshotTries = 4

// dirLease serves OpDirLease: Handle is a directory handle (or
// RootHandle), the body a proto.ReadDirReq (path, and the name the page
// starts after), the answer proto.AppendSnapEntries's; Aux 1: more.
func (se *session) dirLease(q *ring.Request) (int64, uint64) {
	s := se.svc
	if se.features&proto.FeatureDirOpen == 0 {
		return se.errno(syscall.EOPNOTSUPP)
	}
	r, err := proto.DecodeReadDirReq(body(q))
	if err != nil {
		return se.errno(err)
	}
	dir, err := se.dirIno(q.Handle)
	if err != nil {
		return se.errno(err)
	}
	ce := s.caps.Load()
	epoch := s.io.currentEpoch()
	if ce == nil || epoch == 0 || ce.epoch != epoch {
		return se.errno(syscall.EAGAIN) // no key of this io epoch yet
	}
	d := &s.dg
	limit := s.allocLimit()
	for range snapshotTries {
		f1 := d.finished.Load()
		d.out.Store(true)
		gen := d.gen.Load()
		ents, err := s.ns.SnapshotAt(se.cred, dir, r.Path)
		if err != nil {
			return se.errno(err)
		}
		i := 0
		for i < len(ents) && r.After != "" && ents[i].Name <= r.After {
			i++
		}
		lim := int(min(q.Length, 1<<30))
		out := make([]proto.SnapEntry, 0, min(len(ents)-i, lim/proto.SnapEntrySize(8)+1))
		size, more := 4, uint64(0)
		for _, e := range ents[i:] {
			// As a capability at open (caps.go): a blob io knows of,
			// whose size io reported in this epoch.
			if e.Blob == 0 || e.Blob >= limit || s.fresh.has(e.Ino) || !s.sized.has(e.Ino, epoch) {
				continue
			}
			if size+proto.SnapEntrySize(len(e.Name)) > lim {
				more = 1
				break
			}
			size += proto.SnapEntrySize(len(e.Name))
			c := ce.key.Mint(grantcap.Cap{Session: se.id, Blob: e.Blob, Ver: gen, Access: grantcap.AccessDirOpen})
			out = append(out, proto.SnapEntry{Ino: uint64(e.Ino), Mode: e.Mode, Cap: c, Name: e.Name})
		}
		if d.started.Load() != f1 || d.gen.Load() != gen || s.caps.Load() != ce {
			continue // a change overlapped the read: read it again
		}
		if more == 1 && len(out) == 0 {
			return se.errno(syscall.ERANGE)
		}
		b, _ := proto.AppendSnapEntries(nil, out, lim)
		d.snaps.Add(1)
		res, _ := reply(q, b)
		return res, more
	}
	return se.errno(syscall.EAGAIN)
}
