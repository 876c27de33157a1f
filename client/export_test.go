package client

import (
	"context"
	"errors"
	"os"
	"syscall"
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

// CacheDataFile returns the data memfd of f's cache region as f mapped it
// (nil if it has not mapped it).
func CacheDataFile(f *File) *os.File {
	f.cmu.Lock()
	defer f.cmu.Unlock()
	if f.fcache == nil {
		return nil
	}
	return f.fcache.df
}

// CacheDataMapped is how many bytes of the data memfd f's cache region
// mapping covers (0 if it has not mapped it).
func CacheDataMapped(f *File) int {
	f.cmu.Lock()
	defer f.cmu.Unlock()
	if f.fcache == nil {
		return 0
	}
	f.fcache.mu.RLock()
	defer f.fcache.mu.RUnlock()
	return len(f.fcache.dmem)
}

// IOCall sends op with arg and offset for f's granted handle to the IO
// service and returns the completion's result and Aux (a negative result
// is the errno), and the file passed with Aux when withFile is set: a
// test's hostile or raw use of the map operations.
func IOCall(f *File, op uint8, arg uint32, offset uint64, withFile bool) (int64, *os.File, error) {
	c := f.fs.current()
	h, err := f.grantedHandle(c)
	if err != nil {
		return 0, nil, err
	}
	comp, err := call(bgctx, c.data, op, arg, h, offset, nil, nil)
	var en syscall.Errno
	if errors.As(err, &en) {
		return -int64(en), nil, nil
	}
	if err != nil || !withFile {
		return comp.Result, nil, err
	}
	ctx, cancel := context.WithTimeout(bgctx, 5*time.Second)
	defer cancel()
	mf, err := c.data.ReceiveFile(ctx, comp.Aux)
	return comp.Result, mf, err
}
