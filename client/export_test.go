package client

import (
	"os"
	"time"
)

// CacheFile returns the memfd of f's cache region as f mapped it (nil if
// it has not mapped it), for tests that act as a hostile client.
func CacheFile(f *File) *os.File {
	f.cmu.Lock()
	defer f.cmu.Unlock()
	if f.fcache == nil {
		return nil
	}
	return f.fcache.f
}

// KeptMappings returns how many cache mappings f keeps for files closed
// under a kept lease.
func KeptMappings(f *FS) int {
	f.kept.mu.Lock()
	defer f.kept.mu.Unlock()
	return f.kept.lru.Len()
}

// BreakClaims makes the client's claims of read capabilities fail: damaged
// (io refuses them) or skipped (never sent), until the test ends.
func BreakClaims(t interface{ Cleanup(func()) }, skip bool) {
	mode := int32(claimDamaged)
	if skip {
		mode = claimSkipped
	}
	testClaim.Store(mode)
	t.Cleanup(func() { testClaim.Store(0) })
}

// Tenure returns the lease epoch f's last write grant was made in (0:
// none yet).
func Tenure(f *File) uint64 {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	return f.tenure
}

// NoRegrant makes io's EBADF final (no grant is asked for again) until
// the test ends.
func NoRegrant(t interface{ Cleanup(func()) }) {
	testNoRegrant.Store(true)
	t.Cleanup(func() { testNoRegrant.Store(false) })
}

// RefuseCloseRide plays an open whose close could not stand aside: it
// takes the oldest close queued on f's metadata session, waits until
// the closer has looked and found nothing, and gives the close back.
// false: none was queued.
func RefuseCloseRide(f *FS) bool {
	r, ok := f.late.take(f.current().meta)
	if !ok {
		return false
	}
	time.Sleep(5 * closeLinger)
	f.late.giveBack(r)
	return true
}
