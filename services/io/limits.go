package iosvc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/internal/staging"
)

// Per-uid budgets (docs/architecture.md, "Limits per uid"). io's shared
// resources are bounded for all sessions together (pins: half the cache,
// windows a quarter; the staging log; its descriptors), and one session
// is bounded too; but a uid runs as many sessions as it has processes, so
// without a bound per uid one user could hold all of a resource and the
// next user's map, fsync or open would fail or wait for it. Each budget
// is a share (a percentage) of the resource's bound for all, taken by the
// uid's sessions together, the session's credentials (SO_PEERCRED) saying
// whose they are:
//
//   - pins: a uid's pinned pages (MAP_SHARED mappings and write windows)
//     at most Shares.Pins of the pins' half of the cache, its windows'
//     pages at most that of the windows' quarter: ENOMEM past it, as past
//     the session's own bound;
//   - staging: a uid's fsyncs' live records at most Shares.Staging of the
//     log's ring; past it the uid's fsync makes the file durable at home
//     instead (a FlagHome record, one block), as it does for a file whose
//     changes are more than a record should carry, and with no room left
//     for that either it waits for a checkpoint pass, as every fsync waits
//     for a full log: slower for that user, no room taken from the others
//     (checked per record: concurrent fsyncs of one uid may each pass the
//     share by one record);
//   - descriptors: the grants of a uid's sessions at most
//     Shares.Descriptors of io's RLIMIT_NOFILE at three descriptors each
//     (the blob's file and its cache region's two memfds): past it a grant
//     (NATS, a claim, a direct open) is EMFILE.
//
// The uids in Options.Limits.Exempt (root, the service's own) have no
// budget; what they hold still counts in everyone's bounds.

// noUID stands for work no client's uid asked for (io's own, or a path
// that does not know whose it is): no budget applies to it.
const noUID = ^uint32(0)

// exempt reports whether no budget applies to uid.
func (b *uidBudgets) exempt(uid uint32) bool { return uid == noUID || b.limits.Exempts(uid) }

// Shares are the parts of io's shared resources one uid's sessions may
// hold, in percent (1 to 100; 0 means 100: the resource's own bound only).
type Shares struct {
	Pins, Staging, Descriptors int
}

// uidBudgets are what each uid's sessions hold. Immutable after init but
// for what the locks protect.
type uidBudgets struct {
	limits host.Limits
	shares Shares
	// grantCap bounds the live grants of one uid (Shares.Descriptors).
	grantCap int

	mu   sync.Mutex
	uses map[uint32]*uidUse // protected by mu

	// grants lists each uid's grants, revoked ones included until the
	// next prune; protected by Service.mu, which every grant's install and
	// revoke hold.
	grants map[uint32][]*grant

	// Refusals (weir status): pins and windows past the uid's share;
	// fsyncs sent home for the uid's staging share, and those that waited
	// for a pass; grants refused for its descriptors.
	RefusedPins, RefusedWindows, StagingHome, StagingWaits, RefusedGrants atomic.Uint64
}

// uidUse is one uid's part; protected by uidBudgets.mu.
type uidUse struct {
	pinned, winPinned int64 // pages
	// staged are the uid's records not known trimmed (lsn, blocks), in
	// lsn order; stagedBlocks their sum.
	staged       []stagedCharge
	stagedBlocks int64
}

type stagedCharge struct{ lsn, blocks uint64 }

// init sets the budgets from the options.
func (b *uidBudgets) init(opts *Options) {
	b.limits, b.shares = opts.Limits, opts.Shares
	b.uses = map[uint32]*uidUse{}
	b.grants = map[uint32][]*grant{}
	b.grantCap = 0
	if pct := b.shares.Descriptors; pct > 0 && pct < 100 {
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
			b.grantCap = max(int(min(rl.Cur, 1<<30)/3*uint64(pct)/100), 1)
		}
	}
}

// share is pct (0: 100) percent of n.
func share(n int64, pct int) int64 {
	if pct <= 0 || pct >= 100 {
		return n
	}
	return n * int64(pct) / 100
}

// useLocked returns uid's part, made if needed; b.mu is held.
func (b *uidBudgets) useLocked(uid uint32) *uidUse {
	u := b.uses[uid]
	if u == nil {
		u = &uidUse{}
		b.uses[uid] = u
	}
	return u
}

// dropIfIdleLocked forgets uid's part once it holds nothing; b.mu is held.
func (b *uidBudgets) dropIfIdleLocked(uid uint32, u *uidUse) {
	if u.pinned == 0 && u.winPinned == 0 && len(u.staged) == 0 {
		delete(b.uses, uid)
	}
}

// pin takes n pages of uid's pin budget (and of its windows' if win),
// whose bounds for all are pinLimit and winLimit pages; ENOMEM if they
// are not in its share.
func (b *uidBudgets) pin(uid uint32, n, pinLimit, winLimit int64, win bool) syscall.Errno {
	exempt := b.exempt(uid)
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.useLocked(uid)
	switch {
	case !exempt && u.pinned+n > share(pinLimit, b.shares.Pins):
		b.RefusedPins.Add(1)
		b.dropIfIdleLocked(uid, u)
		return syscall.ENOMEM
	case !exempt && win && u.winPinned+n > share(winLimit, b.shares.Pins):
		b.RefusedWindows.Add(1)
		b.dropIfIdleLocked(uid, u)
		return syscall.ENOMEM
	}
	u.pinned += n
	if win {
		u.winPinned += n
	}
	return 0
}

// unpin gives back what pin took.
func (b *uidBudgets) unpin(uid uint32, n int64, win bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.useLocked(uid)
	u.pinned -= n
	if win {
		u.winPinned -= n
	}
	b.dropIfIdleLocked(uid, u)
}

// stageRoom reports whether uid may stage a record of blocks more in a
// log of ring blocks whose records up to trimmed are trimmed.
func (b *uidBudgets) stageRoom(uid uint32, blocks, ring, trimmed uint64) bool {
	if b.exempt(uid) || b.shares.Staging <= 0 || b.shares.Staging >= 100 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.useLocked(uid)
	b.trimLocked(u, trimmed)
	ok := u.stagedBlocks+int64(blocks) <= share(int64(ring), b.shares.Staging)
	b.dropIfIdleLocked(uid, u)
	return ok
}

// stageFits reports whether rec fits in uid's share of the log now.
func (s *Service) stageFits(uid uint32, rec *staging.Record) bool {
	blocks, err := rec.Blocks()
	if err != nil {
		return true // (plan refuses such a record first)
	}
	ls := s.stg.log.Stats()
	return s.uids.stageRoom(uid, uint64(blocks), uint64(ls.RingBytes/staging.BlockSize), ls.TrimLSN)
}

// awaitStagingShare waits until uid's share of the log has room for a
// home record (one block): a checkpoint pass after another (their own
// pace: it asks for none, as an fsync waiting for a full log does, so a
// uid that fsyncs faster than passes trim gets its share per pass and
// makes the checkpointer do no more), and nobody else waits. It fails
// once the service's storage failed or it stops.
func (s *Service) awaitStagingShare(uid uint32) error {
	st := s.stg
	home := staging.Record{Flags: staging.FlagHome}
	waited := false
	for !s.stageFits(uid, &home) {
		if p := s.syncFailure.Load(); p != nil {
			return fmt.Errorf("the uid's share of the staging log is full, and no checkpoint can make room: %w", *p)
		}
		if !waited {
			waited = true
			s.uids.StagingWaits.Add(1)
		}
		st.mu.Lock()
		pass := st.pass
		for st.pass == pass && !st.stopping {
			st.room.Wait()
		}
		stopping := st.stopping
		st.mu.Unlock()
		if stopping {
			return errors.New("the uid's share of the staging log is full and the IO service is stopping")
		}
	}
	return nil
}

// staged charges uid's record lsn of blocks to it (exempt uids are not
// charged: they have no share).
func (b *uidBudgets) staged(uid uint32, lsn, blocks uint64) {
	if b.exempt(uid) || b.shares.Staging <= 0 || b.shares.Staging >= 100 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.useLocked(uid)
	i := len(u.staged)
	for i > 0 && u.staged[i-1].lsn > lsn { // appends return out of order, rarely far
		i--
	}
	u.staged = append(u.staged, stagedCharge{})
	copy(u.staged[i+1:], u.staged[i:])
	u.staged[i] = stagedCharge{lsn: lsn, blocks: blocks}
	u.stagedBlocks += int64(blocks)
}

// trimLocked forgets u's records at or below trimmed; b.mu is held.
func (b *uidBudgets) trimLocked(u *uidUse, trimmed uint64) {
	i := 0
	for i < len(u.staged) && u.staged[i].lsn <= trimmed {
		u.stagedBlocks -= int64(u.staged[i].blocks)
		i++
	}
	u.staged = u.staged[i:]
}

// grantRoomLocked returns EMFILE when uid holds as many live grants as
// its descriptors' share allows (counted, before the grant opens
// anything), else 0; Service.mu is held.
func (b *uidBudgets) grantRoomLocked(uid uint32) syscall.Errno {
	gs := b.grants[uid]
	if b.grantCap == 0 || len(gs) < b.grantCap || b.exempt(uid) {
		return 0
	}
	live := gs[:0]
	for _, x := range gs {
		if !x.revoked {
			live = append(live, x)
		}
	}
	clear(gs[len(live):])
	b.grants[uid] = live
	if len(live) >= b.grantCap {
		b.RefusedGrants.Add(1)
		return syscall.EMFILE
	}
	return 0
}

// grantedLocked records g, just installed, as uid's; Service.mu is held.
// Revoked grants leave the list at the next grantRoomLocked that needs
// the room.
func (b *uidBudgets) grantedLocked(uid uint32, g *grant) {
	if b.grantCap > 0 && !b.exempt(uid) {
		b.grants[uid] = append(b.grants[uid], g)
	}
}

// forgetLocked drops the revoked grants of every uid (a resync revoked
// them all); Service.mu is held.
func (b *uidBudgets) forgetLocked() { clear(b.grants) }

// snapshot adds the counters to m (weir status).
func (b *uidBudgets) snapshot(m map[string]any) {
	m["limits_refused_pins"] = b.RefusedPins.Load()
	m["limits_refused_windows"] = b.RefusedWindows.Load()
	m["limits_staging_home"] = b.StagingHome.Load()
	m["limits_staging_waits"] = b.StagingWaits.Load()
	m["limits_refused_grants"] = b.RefusedGrants.Load()
	m["limits_grants_per_uid"] = b.grantCap
	b.mu.Lock()
	m["limits_uids"] = len(b.uses)
	b.mu.Unlock()
}
