package iosvc

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/weir-storage/weir/services/io/backend"
)

// Room on the store. A write that stays in the cache (write-back) is
// acknowledged before its bytes go home, and an fsync's staging record
// before its checkpoint writes them there: both must find room at home
// later, or an acknowledged write would be lost to a full store (and a
// restart could not replay the staging log into it). So io reserves a
// cached write's room when it takes the write (backend.Reserver: the file
// backend's fallocate with FALLOC_FL_KEEP_SIZE), and a full store fails
// that write with ENOSPC, as the kernel's delayed allocation does at
// write(2). Write-back, checkpoints and replay then write into room that
// is theirs already.
//
// Reserving costs a system call, so a blob keeps a mark below which every
// byte has room (its size at open when the blob has no hole, then each
// reservation's end): writes below it reserve nothing, and an appending
// writer reserves a quarter of its file's size ahead (at most 8 MiB),
// which the last close gives back (Trim).

// reserveAhead bounds how far past a write's end a reservation goes.
const reserveAhead = 8 << 20

// reservation is a blob's reserved room (openBlob.res).
type reservation struct {
	mu     sync.Mutex
	init   bool  // mark set from the blob (protected by mu)
	mark   int64 // every byte below it has room at home (protected by mu)
	ahead  bool  // room was reserved past the size (protected by mu)
	failed bool  // the last reservation found the store full (protected by mu)
}

// reserve gives [off, off+n) of ob room at home before a cached write
// takes it: ENOSPC (or the backend's error) when the store has none.
func (s *Service) reserve(ob *openBlob, off, n int64) error {
	rb, ok := ob.b.(backend.Reserver)
	if !ok || n <= 0 {
		return nil
	}
	res := &ob.res
	res.mu.Lock()
	defer res.mu.Unlock()
	if !res.init {
		res.init = true
		if rb.Dense() {
			res.mark = ob.b.Size()
		}
	}
	end := off + n
	if end <= res.mark {
		return nil
	}
	from, to := off, end
	if off <= res.mark {
		from = res.mark
		to = min((end+min(end/4, reserveAhead)+4095)&^4095, backend.MaxBlobSize)
	}
	err := rb.Reserve(from, to-from)
	if err != nil && to > end {
		to = end // no room ahead: just the write's
		err = rb.Reserve(from, to-from)
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			s.noSpace(err)
		}
		res.failed = true
		return err
	}
	res.failed = false
	s.full.Store(false)
	if off <= res.mark {
		res.mark = to
		res.ahead = res.ahead || to > end
	}
	return nil
}

// truncatedRoom lowers ob's mark to a size it was cut to (the cut freed
// the room past it).
func (ob *openBlob) truncatedRoom(size int64) {
	ob.res.mu.Lock()
	ob.res.mark = min(ob.res.mark, size)
	ob.res.mu.Unlock()
}

// trimRoom gives back the room reserved past ob's size (its last close,
// once its pages are home).
func (s *Service) trimRoom(ob *openBlob) {
	rb, ok := ob.b.(backend.Reserver)
	if !ok {
		return
	}
	ob.res.mu.Lock()
	defer ob.res.mu.Unlock()
	if !ob.res.ahead {
		return
	}
	if err := rb.Trim(ob.res.mark); err != nil {
		s.log.Warn("the room reserved past a closed file's end could not be given back", "blob", ob.id, "error", err)
		return
	}
	ob.res.ahead = false
	ob.res.mark = min(ob.res.mark, ob.b.Size())
}

// roomAgain is the free room at which a full store counts as usable again.
const roomAgain = 4 << 20

// roomHealth is Health's word on room: an error while the last write found
// the store full and it still has less than roomAgain free.
func (s *Service) roomHealth() error {
	if !s.full.Load() {
		return nil
	}
	sp, ok := s.be.(backend.Spacer)
	if !ok {
		return fmt.Errorf("the store is full: writes fail with ENOSPC until room is freed")
	}
	space, err := sp.Space()
	if err == nil && space.Avail >= roomAgain {
		s.full.Store(false)
		return nil
	}
	return fmt.Errorf("the store is full (%d bytes free): writes fail with ENOSPC until room is freed", space.Avail)
}

// noSpace counts a write the store had no room for, and marks the service
// short of room until a reservation or write succeeds again (Health).
func (s *Service) noSpace(err error) {
	if n := s.Stats.NoSpace.Add(1); n&(n-1) == 0 {
		s.log.Warn("the store is full: writes fail with ENOSPC until room is freed", "error", err, "count", n)
	}
	s.full.Store(true)
}
