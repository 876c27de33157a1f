package iosvc

import (
	"crypto/rand"
	"fmt"
	"math"
	"syscall"

	"github.com/weir-storage/weir/internal/grantcap"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/io/backend"
)

// Claimed read grants (proto.FeatureCaps, internal/grantcap).
//
// The metadata service may answer a session's read-only grant with a
// capability instead of a control-plane grant; the client presents it here
// (OpClaim) and this service installs the grant itself: an open of a file
// the session never read costs no NATS round trip.
//
// A capability is good for the io epoch whose key minted it (a new random
// key at every resync) and for the session it names, and only until the
// grant it stands for is revoked. Metadata revokes a claimed and an
// unclaimed grant alike (it cannot tell them apart), so a revoke marks the
// handle's capability spent whether or not it was claimed: capFloor holds,
// per session, the largest handle revoked (handle ids only grow), and a
// claim at or below it is refused with EKEYREJECTED. The client then asks
// metadata to grant the handle through io (OpGrant, GrantThroughIO), which
// metadata does only for a handle that is still the session's. A revoke of
// every grant of the session (its end) sets the floor to the top.
//
// A floor lives as long as an IO ring of its session may still claim:
// until the metadata session ended (metadata revokes every grant of the
// session once it closed its handles) and its rings are gone, or a resync. A
// session's end revoked before any ring of it attached here is kept in
// endedUnattached (the last maxEndedUnattached), so that an attach racing
// the end cannot bring the session's capabilities back.

const maxEndedUnattached = 1024

// newCapKeyLocked makes the key of a new io epoch (at a resync) and
// returns its bytes for the metadata service; every capability of the
// last epoch is worth nothing from now on. Called with s.mu held.
func (s *Service) newCapKeyLocked() ([]byte, error) {
	s.capKey = nil // (none at all if the new one cannot be made)
	b := make([]byte, grantcap.KeySize)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("capability key: %w", err)
	}
	k, err := grantcap.NewKey(b)
	if err != nil {
		return nil, err
	}
	s.capKey = k
	s.capFloor = make(map[uint64]uint64)
	s.dirOpens = make(map[uint64]*int)
	s.rings = make(map[uint64]int) // every ring attaches again
	s.endedUnattached = s.endedUnattached[:0]
	return b, nil
}

// spendLocked marks handle (0: every handle) of session sid revoked for
// claims. Called with s.mu held, by onRevoke.
func (s *Service) spendLocked(sid, handle uint64) {
	if s.capKey == nil {
		return
	}
	if handle == 0 {
		handle = math.MaxUint64
		if s.rings[sid] == 0 {
			// No ring of it here: forget its floor, and remember the end
			// for an attach that may be racing it, and no more.
			delete(s.capFloor, sid)
			s.endedLocked(sid)
			return
		}
	}
	s.capFloor[sid] = max(s.capFloor[sid], handle)
}

// attachedLocked runs when a ring attaches for sid (rings counts them: a
// session may attach several): a session whose end was revoked before the
// ring attached claims nothing.
func (s *Service) attachedLocked(sid uint64) {
	s.rings[sid]++
	for _, e := range s.endedUnattached {
		if e == sid {
			s.capFloor[sid] = math.MaxUint64
			return
		}
	}
}

// detachedLocked runs when a ring attached for sid in this epoch ends: a
// floor of an ended session is not needed once no ring of it is left.
func (s *Service) detachedLocked(sid uint64) {
	if s.rings[sid]--; s.rings[sid] > 0 {
		return
	}
	delete(s.rings, sid)
	if s.capFloor[sid] == math.MaxUint64 {
		delete(s.capFloor, sid)
		s.endedLocked(sid) // for an attach racing the end, as above
	}
}

// endedLocked remembers that session sid ended, for attachedLocked.
func (s *Service) endedLocked(sid uint64) {
	if len(s.endedUnattached) == maxEndedUnattached {
		s.endedUnattached = s.endedUnattached[1:]
	}
	s.endedUnattached = append(s.endedUnattached, sid)
}

// claim installs the read grant a capability stands for. Refusals: EINVAL
// (not a capability's length), EKEYREJECTED (not of this epoch's key, or
// its grant was revoked: ask metadata again), EPERM (another session's),
// ESTALE (the session predates a resync, as for every request), and the
// errors of opening the blob.
func (s *session) claim(q *ring.Request) (int64, uint64) {
	svc := s.svc
	if s.sid == 0 {
		return fail(syscall.ENOTCONN)
	}
	if s.resync != svc.resyncs.Load() {
		svc.Stats.Stale.Add(1)
		return fail(proto.ErrStale)
	}
	if q.Length != proto.CapSize {
		svc.Stats.ClaimsRefused.Add(1)
		return fail(syscall.EINVAL)
	}
	b := make([]byte, proto.CapSize)
	q.ReadPayload(b)
	svc.mu.Lock()
	key := svc.capKey
	svc.mu.Unlock()
	if key == nil {
		svc.Stats.ClaimsRefused.Add(1)
		return fail(syscall.EKEYREJECTED)
	}
	c, err := key.Check(b)
	if err != nil || c.Access != grantcap.AccessRead {
		svc.Stats.ClaimsRefused.Add(1)
		return fail(syscall.EKEYREJECTED)
	}
	inc := svc.inc.Load()
	switch {
	case c.Session != s.sid || c.Handle != q.Handle:
		svc.Stats.ClaimsRefused.Add(1)
		return fail(syscall.EPERM)
	case c.Handle == 0 || c.Blob == 0 || c.Ver == 0 || proto.IncarnationOf(c.Handle) != inc ||
		c.Blob >= svc.allocLimit.Load() || c.Blob == uint64(backend.StagingBlob):
		// Minted with this epoch's key, so by the metadata service: a bug
		// there, not a client's doing.
		svc.Stats.ClaimsRefused.Add(1)
		svc.log.Error("capability with impossible fields", "session", s.sid, "handle", c.Handle, "blob", c.Blob)
		return fail(syscall.EIO)
	}
	svc.mu.Lock()
	if s.resync != svc.resyncs.Load() || svc.capKey != key {
		// A resync came in between: the capability is of the epoch it
		// ended, and this ring must attach again.
		svc.mu.Unlock()
		svc.Stats.Stale.Add(1)
		return fail(proto.ErrStale)
	}
	if floor, ok := svc.capFloor[s.sid]; ok && c.Handle <= floor {
		svc.mu.Unlock()
		svc.Stats.ClaimsRefused.Add(1)
		return fail(syscall.EKEYREJECTED)
	}
	if g := svc.grants[s.sid][c.Handle]; g != nil {
		same := g.blob.id == backend.BlobID(c.Blob) && g.read
		svc.mu.Unlock()
		if same {
			return 0, 0 // claimed already (the completion was lost to a retry)
		}
		svc.Stats.ClaimsRefused.Add(1)
		return fail(syscall.EEXIST)
	}
	if e := svc.uids.grantRoomLocked(s.cred.Uid); e != 0 {
		svc.mu.Unlock()
		svc.Stats.ClaimsRefused.Add(1)
		return fail(e) // the uid's share of descriptors (limits.go)
	}
	ob, err := svc.openBlobLocked(backend.BlobID(c.Blob), c.Blob, false)
	if err != nil {
		svc.mu.Unlock()
		svc.Stats.ClaimsRefused.Add(1)
		return fail(errno(err))
	}
	if svc.grants[s.sid][c.Handle] != nil {
		// The same handle claimed while the open gave descriptors back.
		svc.mu.Unlock()
		svc.releaseBlob(ob)
		svc.Stats.ClaimsRefused.Add(1)
		return fail(syscall.EEXIST)
	}
	hs := svc.grants[s.sid]
	if hs == nil {
		hs = make(map[uint64]*grant)
		svc.grants[s.sid] = hs
	}
	// ver orders the handle's revoke after this grant; the blob's own
	// version is not raised: a control-plane grant minted before this
	// capability may still be on its way, and it is not stale.
	ng := &grant{blob: ob, read: true, ver: c.Ver, drained: make(chan struct{})}
	hs[c.Handle] = ng
	svc.uids.grantedLocked(s.cred.Uid, ng)
	svc.mu.Unlock()
	svc.Stats.Grants.Add(1)
	svc.Stats.Claims.Add(1)
	return 0, 0
}
