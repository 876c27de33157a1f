package iosvc

import (
	"encoding/binary"
	"fmt"
	"math"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/grantcap"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/io/backend"
)

// Direct opens (proto.FeatureDirOpen; docs/architecture.md, "Direct
// opens").
//
// The metadata service answers a session's OpDirLease with a snapshot of
// a directory: each regular file in it that the session may open for
// reading, with a capability (grantcap.AccessDirOpen) naming the session,
// the file's blob and the directory generation it was minted at. The
// client opens such a file here alone: OpClaimDir checks the capability
// and installs a read grant under a handle this service makes
// (proto.DirOpenBit set), which the client reads by and ends with
// OpRelease (or in its next OpClaimDir). No metadata request is made, so a
// cold open wakes one service.
//
// The generation is what keeps such an open as safe as one metadata
// checks. metadata moves it forward (DirGen, acked here) before it
// applies any change that could make a snapshot's answer wrong (an
// unlink, rename or rmdir, a change of mode or owner anywhere: a path's
// search permission) whenever a snapshot was minted at the current one,
// and a claim is refused unless it names the generation now. So a direct
// open takes effect at the check here, before the change, as an open
// through metadata would.
//
// A writer: a blob some session holds a write grant on takes no direct
// open, and a write grant's install ends every direct open of its blob by
// other sessions (their next read is EBADF, and the client opens through
// metadata, which recalls as for any read grant). A file that loses its
// last name while directly open keeps its blob: io deletes no open blob,
// and metadata's deleter tries again after the release.

// maxDirOpens bounds the direct opens a session holds at once (each is a
// grant, and a reference on its blob); past it a claim is EMFILE and the
// client opens through metadata.
const maxDirOpens = 4096

// onDirGen moves the directory generation forward; from the ack on, no
// claim of an earlier one is honoured.
func (s *Service) onDirGen(m *nats.Msg) {
	var d control.DirGen
	if err := control.Decode(m.Data, &d); err != nil || d.Gen == 0 {
		s.host.Refuse(m, "malformed", control.Ack{}, "dirgen: no generation")
		return
	}
	if inc := s.inc.Load(); d.Incarnation != inc {
		// A late one of an incarnation that is over (NATS orders no
		// messages across connections): the resync set the generation.
		s.host.Refuse(m, "stale_incarnation", control.Ack{}, fmt.Sprintf("dirgen of incarnation %d; serving %d", d.Incarnation, inc))
		return
	}
	s.mu.Lock()
	s.dirGen = max(s.dirGen, d.Gen)
	s.mu.Unlock()
	control.Respond(m, control.Ack{})
}

// claimDir opens a snapshot entry for reading (see above): the payload is
// the entry's capability and a direct-open handle of the session to
// release first (0: none). It answers the new handle in the aux.
// Refusals: EINVAL (not the payload's length, or a release of a handle
// that is not a direct open's), EKEYREJECTED (not of this epoch's key,
// not a direct-open capability, of another directory generation, or the
// session ended), EPERM (another session's), EBUSY (a writer holds the
// file), EMFILE (too many direct opens), ESTALE (the session predates a
// resync), and the errors of opening the blob. On any but ESTALE the
// client opens through metadata.
func (s *session) claimDir(q *ring.Request) (int64, uint64) {
	svc := s.svc
	if s.sid == 0 {
		return fail(syscall.ENOTCONN)
	}
	if s.resync != svc.resyncs.Load() {
		svc.Stats.Stale.Add(1)
		return fail(proto.ErrStale)
	}
	if q.Length != proto.ClaimDirSize {
		svc.Stats.DirClaimsRefused.Add(1)
		return fail(syscall.EINVAL)
	}
	var b [proto.ClaimDirSize]byte
	q.ReadPayload(b[:])
	rel := binary.LittleEndian.Uint64(b[proto.CapSize:])
	if rel != 0 {
		if res, _ := s.releaseDir(rel, true); res < 0 {
			svc.Stats.DirClaimsRefused.Add(1)
			return res, 0
		}
	}
	svc.mu.Lock()
	key := svc.capKey
	svc.mu.Unlock()
	if key == nil {
		svc.Stats.DirClaimsRefused.Add(1)
		return fail(syscall.EKEYREJECTED)
	}
	c, err := key.Check(b[:proto.CapSize])
	if err != nil || c.Access != grantcap.AccessDirOpen {
		svc.Stats.DirClaimsRefused.Add(1)
		return fail(syscall.EKEYREJECTED)
	}
	if c.Session != s.sid {
		svc.Stats.DirClaimsRefused.Add(1)
		return fail(syscall.EPERM)
	}
	if c.Handle != 0 || c.Blob == 0 || c.Ver == 0 || c.Blob >= svc.allocLimit.Load() || c.Blob == uint64(backend.StagingBlob) {
		// Minted with this epoch's key, so by the metadata service.
		svc.Stats.DirClaimsRefused.Add(1)
		svc.log.Error("direct-open capability with impossible fields", "session", s.sid, "blob", c.Blob)
		return fail(syscall.EIO)
	}
	svc.mu.Lock()
	refuse := syscall.Errno(0)
	n := svc.dirOpens[s.sid]
	switch {
	case s.resync != svc.resyncs.Load() || svc.capKey != key:
		svc.mu.Unlock()
		svc.Stats.Stale.Add(1)
		return fail(proto.ErrStale)
	case !svc.dirLive:
		refuse = syscall.EKEYREJECTED // the metadata session was lost and no resync came since
	case svc.capFloor[s.sid] == math.MaxUint64:
		refuse = syscall.EKEYREJECTED // the session ended: metadata revoked every grant of it
	case c.Ver != svc.dirGen:
		refuse = syscall.EKEYREJECTED // the snapshot is of an earlier generation
	case n != nil && *n >= maxDirOpens:
		refuse = syscall.EMFILE
	default:
		refuse = svc.uids.grantRoomLocked(s.cred.Uid) // the uid's share of descriptors (limits.go)
	}
	if ob := svc.blobs[backend.BlobID(c.Blob)]; refuse == 0 && ob != nil && ob.writers > 0 {
		refuse = syscall.EBUSY
	}
	if refuse != 0 {
		svc.mu.Unlock()
		svc.Stats.DirClaimsRefused.Add(1)
		return fail(refuse)
	}
	ob, err := svc.openBlobLocked(backend.BlobID(c.Blob), c.Blob, false)
	if err != nil {
		svc.mu.Unlock()
		svc.Stats.DirClaimsRefused.Add(1)
		return fail(errno(err))
	}
	if ob.writers > 0 {
		// A writer came while the open gave descriptors back.
		svc.mu.Unlock()
		svc.releaseBlob(ob)
		svc.Stats.DirClaimsRefused.Add(1)
		return fail(syscall.EBUSY)
	}
	if n == nil {
		n = new(int)
		svc.dirOpens[s.sid] = n
	}
	*n++
	h := proto.DirOpenBit | svc.dirSeq.Add(1)
	g := &grant{blob: ob, read: true, drained: make(chan struct{}), dirOpens: n}
	hs := svc.grants[s.sid]
	if hs == nil {
		hs = make(map[uint64]*grant)
		svc.grants[s.sid] = hs
	}
	hs[h] = g
	svc.uids.grantedLocked(s.cred.Uid, g)
	if ob.direct == nil {
		ob.direct = make(map[*grant]dirOpen)
	}
	ob.direct[g] = dirOpen{sid: s.sid, handle: h}
	svc.mu.Unlock()
	svc.Stats.Grants.Add(1)
	svc.Stats.DirClaims.Add(1)
	return 0, h
}

// release serves OpRelease: the end of the direct open q.Handle.
func (s *session) release(q *ring.Request) (int64, uint64) {
	if s.sid == 0 {
		return fail(syscall.ENOTCONN)
	}
	if s.resync != s.svc.resyncs.Load() {
		s.svc.Stats.Stale.Add(1)
		return fail(proto.ErrStale)
	}
	return s.releaseDir(q.Handle, false)
}

// releaseDir ends the session's direct open h: EINVAL if h is not a
// direct open's handle; one the session does not hold (a writer's grant
// ended it, or it was released already) is no error. later: drop the
// blob's reference off the poller (a release inside a claim: the blob's
// close, and its region's, need not delay the claim's answer).
func (s *session) releaseDir(h uint64, later bool) (int64, uint64) {
	svc := s.svc
	if h&proto.DirOpenBit == 0 {
		return fail(syscall.EINVAL)
	}
	svc.mu.Lock()
	hs := svc.grants[s.sid]
	g := hs[h]
	if g == nil {
		svc.mu.Unlock()
		return 0, 0
	}
	delete(hs, h)
	if len(hs) == 0 {
		delete(svc.grants, s.sid)
	}
	g.revokeLocked()
	svc.mu.Unlock()
	svc.Stats.Grants.Add(-1)
	svc.Stats.DirReleases.Add(1)
	if !later || !svc.background(func() { svc.releaseWhenDrained([]*grant{g}) }) {
		svc.releaseWhenDrained([]*grant{g})
	}
	return 0, 0
}

// dirOpen names a direct open in its blob's table.
type dirOpen struct{ sid, handle uint64 }

// endDirectLocked ends the direct opens of ob by sessions other than
// sid (a write grant of sid's is being installed); the caller passes
// what it returns to releaseWhenDrained once it let go of s.mu.
func (s *Service) endDirectLocked(ob *openBlob, sid uint64) []*grant {
	var gone []*grant
	for g, d := range ob.direct {
		if d.sid == sid {
			continue
		}
		if hs := s.grants[d.sid]; hs[d.handle] == g {
			delete(hs, d.handle)
			if len(hs) == 0 {
				delete(s.grants, d.sid)
			}
		}
		g.revokeLocked() // (out of ob.direct)
		gone = append(gone, g)
	}
	s.Stats.Grants.Add(-int64(len(gone)))
	s.Stats.DirEnded.Add(uint64(len(gone)))
	return gone
}

// releaseWhenDrained drops each grant's blob reference once the requests
// in flight on it are done.
func (s *Service) releaseWhenDrained(gs []*grant) {
	for _, g := range gs {
		select {
		case <-g.drained:
			s.grantGone(g)
		default:
			if !s.background(func() { <-g.drained; s.grantGone(g) }) {
				<-g.drained
				s.grantGone(g)
			}
		}
	}
}
