package metadata

import (
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/weir-storage/weir/internal/livetab"
)

// The IO service's live table (internal/livetab): io publishes there the
// size and mtime of every blob it has open, after every change and before
// the change's request completes; this service maps it read-only, so a
// stat of a file some session may be writing reads them from memory
// instead of asking io over NATS (weir.io.live). A table is used only in
// the io epoch whose resync named it: an io that died leaves a frozen
// one. A blob with no slot (its slot taken by another) is asked for over
// NATS as before.

// liveEpoch is the table of one io epoch.
type liveEpoch struct {
	epoch uint64
	t     *livetab.Table
}

// liveTables are the tables mapped so far: a table replaced by a new io's
// stays mapped (a stat may be reading it) until the service stops.
type liveTables struct {
	cur atomic.Pointer[liveEpoch]
	mu  sync.Mutex
	all []*livetab.Table // protected by mu
}

// setLiveTable records the table io named in epoch's resync (none: path
// "", or a table that cannot be mapped: stats ask io).
func (s *Service) setLiveTable(epoch uint64, path string, id uint64) {
	lt := &s.live
	if path == "" || id == 0 || !filepath.IsAbs(path) {
		lt.cur.Store(nil)
		return
	}
	if cur := lt.cur.Load(); cur != nil && cur.t.ID() == id {
		lt.cur.Store(&liveEpoch{epoch: epoch, t: cur.t}) // the same io, resynchronised
		return
	}
	t, err := livetab.Open(path, id)
	if err != nil {
		lt.cur.Store(nil)
		if !errors.Is(err, livetab.ErrOtherTable) {
			s.log.Warn("the IO service's live table cannot be mapped: stat of a file being written asks io", "error", err)
		}
		return
	}
	lt.mu.Lock()
	lt.all = append(lt.all, t)
	lt.mu.Unlock()
	lt.cur.Store(&liveEpoch{epoch: epoch, t: t})
}

// liveFromTable returns blob's live size, mtime and whether it was
// written since io opened it, from the table of the current io epoch;
// ok false: ask io.
func (s *Service) liveFromTable(blob uint64) (size, mtime int64, wrote, ok bool) {
	cur := s.live.cur.Load()
	if cur == nil || cur.epoch != s.io.currentEpoch() {
		return 0, 0, false, false
	}
	size, mtime, wrote, ok = cur.t.Read(blob)
	if ok {
		s.liveN.table.Add(1)
	}
	return size, mtime, wrote, ok
}

// closeLiveTables unmaps every table (the service stopped: no stat runs).
func (s *Service) closeLiveTables() {
	lt := &s.live
	lt.cur.Store(nil)
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, t := range lt.all {
		_ = t.Close()
	}
	lt.all = nil
}

// liveStats counts how stat found the live attributes of files being
// written.
type liveStats struct {
	table atomic.Uint64 // from io's live table
	nats  atomic.Uint64 // from a weir.io.live query
}
