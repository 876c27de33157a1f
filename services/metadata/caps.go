package metadata

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/grantcap"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Read capabilities (proto.FeatureCaps, internal/grantcap).
//
// A read-only handle's grant (OpGrant) costs a NATS round trip to io and
// back: most of a cold open + read + close. With FeatureCaps this service
// decides the grant as before and answers the client a capability for it,
// minted with the key io sent in the last resync; the client claims it at
// io on its IO ring (OpClaim), and io installs the grant itself. No
// control-plane message is sent, and io's enforcement stays whole: it
// serves the handle only once it checked the capability, names of its own
// epoch, session and handle.
//
// The grant is recorded here as made (the handle's grantEpoch, the
// session's kept lease) when the capability is minted, so everything that
// ends a grant sends its revoke to io as before; io marks a revoked
// handle's capability spent whether it was claimed or not (services/io
// claims.go). A client whose claim is refused (EKEYREJECTED: another io
// epoch, or a capability spent by a revoke of a later handle of the
// session) asks again with Arg = GrantThroughIO, which grants the same
// data handle over NATS.
//
// With proto.FeatureOpenCap the capability comes in OpOpen's answer
// (openCap), minted as OpGrant would mint it, except that an open never
// recalls nor waits for a recall: a file another trust group holds a
// conflicting grant of, or that a recall holds locked now, gets none at
// open, and its first read's OpGrant recalls (or waits) as before.
//
// Capabilities are minted only where a control-plane grant would add
// nothing: a read-only open (leaseable, no O_TRUNC), of a file that has a
// blob io knows of (below the allocation limit io was told, not created
// since this start and never granted), whose size io reported in this io
// epoch (sized): the first grant of a file after an io restart puts a
// size the namespace lost right, and that one goes through io.

// capEpoch is the key of one io epoch.
type capEpoch struct {
	epoch uint64
	key   *grantcap.Key
}

// maxSized bounds the files sized remembers in an epoch; past it, the
// first reader of a file that is not in it in a session is granted
// through io (and nothing is lost but that round trip).
const maxSized = 1 << 18

// sizedSet remembers the files whose size io reported (a grant's ack) in
// the current io epoch.
type sizedSet struct {
	mu    sync.Mutex
	epoch uint64
	inos  map[ns.Ino]struct{}
}

func (z *sizedSet) add(ino ns.Ino, epoch uint64) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.epoch != epoch {
		z.epoch, z.inos = epoch, map[ns.Ino]struct{}{}
	}
	if len(z.inos) < maxSized {
		z.inos[ino] = struct{}{}
	}
}

func (z *sizedSet) has(ino ns.Ino, epoch uint64) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	_, ok := z.inos[ino]
	return ok && z.epoch == epoch
}

// setCapKey records the key io sent in epoch's resync (none: io made no
// key, so nothing is minted in that epoch).
func (s *Service) setCapKey(epoch uint64, b []byte) {
	if len(b) == 0 {
		s.caps.Store(nil)
		return
	}
	k, err := grantcap.NewKey(b)
	if err != nil {
		s.log.Error("the IO service sent a capability key that is not one: read grants go through it", "error", err)
		s.caps.Store(nil)
		return
	}
	s.caps.Store(&capEpoch{epoch: epoch, key: k})
}

// capStats counts capabilities.
type capStats struct {
	Minted    atomic.Uint64 // capabilities answered to OpGrant or OpOpen
	ThroughIO atomic.Uint64 // OpGrant with GrantThroughIO: a claim was refused
}

// mintCap answers OpGrant of handle id with a capability when it may
// (see above); ok false: grant through io.
func (se *session) mintCap(q *ring.Request, id uint64, h *handle) (res int64, aux uint64, ok bool) {
	if q.Arg == proto.GrantThroughIO || q.Length < proto.CapSize {
		return 0, 0, false
	}
	c, ok := se.mint(id, h, true)
	if !ok {
		return 0, 0, false
	}
	res, _ = reply(q, c[:])
	return res, id, true
}

// openCap mints the capability of handle id at its open
// (proto.FeatureOpenCap), where OpGrant would: the client claims it at io
// with no OpGrant between. An open never waits for a recall: a file
// another trust group holds for writing gets none, and its first read's
// OpGrant recalls as before.
func (se *session) openCap(id uint64, h *handle) (c [proto.CapSize]byte, ok bool) {
	if se.features&proto.FeatureOpenCap == 0 {
		return c, false
	}
	return se.mint(id, h, false)
}

// mint records h's pending read grant as made and returns its capability,
// when one may be minted (see above). recall: first recall the
// conflicting grants of other trust groups (OpGrant); otherwise mint only
// if there are none.
func (se *session) mint(id uint64, h *handle, recall bool) (c [proto.CapSize]byte, ok bool) {
	s := se.svc
	g := h.pending
	if se.features&(proto.FeatureCaps|proto.FeatureLeases) != proto.FeatureCaps|proto.FeatureLeases ||
		g == nil || !g.Read || g.Write || g.Truncate || !leaseable(h.flags) || h.noCap {
		return c, false
	}
	ce := s.caps.Load()
	epoch := s.io.currentEpoch()
	if ce == nil || epoch == 0 || ce.epoch != epoch || h.blob >= s.allocLimit() || s.fresh.has(h.ino) ||
		!s.sized.has(h.ino, epoch) {
		return c, false
	}
	f := h.file
	if recall {
		f.mu.Lock()
	} else if !f.mu.TryLock() {
		// A recall holds the file (its MinTenure wait, io's revoke):
		// an open does not wait for it, and the first read's OpGrant
		// does.
		return c, false
	}
	if recall {
		if err := s.recallLocked(f, se.group, false, epoch); err != nil {
			f.mu.Unlock()
			return c, false // (and the grant through io fails too)
		}
	} else if s.conflictsLocked(f, se.group, false, epoch) {
		f.mu.Unlock()
		return c, false
	}
	ver := s.version.Add(1)
	c = ce.key.Mint(grantcap.Cap{Session: se.id, Handle: id, Blob: h.blob, Ver: ver, Access: grantcap.AccessRead})
	h.rec = &grantRec{sid: se.id, id: id, group: se.group, epoch: epoch, at: time.Now()}
	f.addGrantLocked(h.rec, ver, epoch)
	f.mu.Unlock()
	s.capsN.Minted.Add(1)
	h.pending, h.grantEpoch = nil, epoch
	h.write, h.unpriv = false, false
	se.keepLease(id, h)
	return c, true
}

// endClaims tells io that session sid ended, once its handles are closed
// and its leases revoked (each revoke reported what it must): a revoke of
// every grant of the session, which also ends the claims of its
// capabilities for good and lets io forget the session's claim floor.
func (s *Service) endClaims(sid uint64) {
	epoch := s.io.currentEpoch()
	if epoch == 0 {
		return // io dropped every grant, and its floors, at its resync
	}
	r := control.Revoke{Session: sid}
	var ack control.Ack
	if err := s.request(s.subj.Revoke, r, &ack); err != nil {
		var ref *control.Refusal
		if !errors.As(err, &ref) && !errors.Is(err, errIODown) {
			s.revokes.add(r, epoch)
		}
	}
}

// errRecalled: the grant a GrantThroughIO would make again was recalled
// by another trust group's since.
var errRecalled = errors.New("the grant was recalled")

// grantThroughIO grants data handle id (the handle's own, or its kept
// lease's) at io over NATS for a handle recorded as granted in this epoch
// by a capability whose claim io refused. A grant io holds already (the
// claim went through after all) is no failure.
func (se *session) grantThroughIO(id uint64, h *handle) error {
	s := se.svc
	s.capsN.ThroughIO.Add(1)
	f := h.file
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.rec == nil || h.rec.revoked.Load() {
		return errRecalled // another group's grant recalled it: granted anew
	}
	g := control.Grant{Session: se.id, Handle: id, Ino: uint64(h.ino), Blob: h.blob, Read: true, Ver: s.version.Add(1)}
	var ack control.Ack
	err := s.request(s.subj.Grant, g, &ack)
	var ref *control.Refusal
	if errors.As(err, &ref) && strings.HasPrefix(ref.Msg, "duplicate: ") {
		return nil
	}
	if err == nil {
		s.Stats.Grants.Add(1)
	}
	if err != nil && !errors.As(err, &ref) && !errors.Is(err, errIODown) {
		// No answer: io may hold it now. It is recorded as the session's
		// either way, and its revoke (at the lease's end) ends it.
		s.log.Error("grant through io failed", "ino", h.ino, "session", se.id, "error", err)
	}
	return err
}
