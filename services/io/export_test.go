package iosvc

import (
	"testing"

	"github.com/weir-storage/weir/ring"
)

// SetNewRegion replaces how s creates a session's region (ring.Create), so
// that tests can make huge pages fail. Call it before Start.
func SetNewRegion(s *Service, f func(ring.Config) (*ring.Region, error)) { s.newRegion = f }

// SetHandOffAlways makes s serve every read and write on a goroutine of its
// own, even a request that is alone, so that tests can count on requests
// of one session meeting at the backend.
func SetHandOffAlways(s *Service, on bool) { s.handOffAlways.Store(on) }

// SetAfterMark makes every cached write call f between marking its pages
// changed for the next fsync and extending the size (nil: nothing).
func SetAfterMark(f func()) { testAfterMark = f }

// FlushAll writes every open blob's dirty pages home and waits, as the
// flusher does every few seconds.
func FlushAll(s *Service) { s.flushAll(true) }

// HoldCheckpoints keeps checkpoint passes from running (the live records
// stay live, as when a crash comes before the next pass) until the
// returned func is called.
func HoldCheckpoints(s *Service) (release func()) {
	s.stg.ckptMu.Lock()
	return s.stg.ckptMu.Unlock
}

// SetAfterTruncateLog makes every truncate that shrinks a file call f
// between logging the cut and making it (nil: nothing).
func SetAfterTruncateLog(f func()) { testAfterTruncateLog = f }

// SetMaxUnsynced sets the bound of closed changed blobs listed for a
// syncfs (maxUnsynced) for the test.
func SetMaxUnsynced(t testing.TB, n int) {
	old := maxUnsynced.Swap(int64(n))
	t.Cleanup(func() { maxUnsynced.Store(old) })
}

// Unsynced says how many closed changed blobs wait for a syncfs.
func Unsynced(s *Service) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unsynced)
}
