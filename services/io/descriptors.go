package iosvc

import (
	"errors"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/services/io/backend"
)

// Descriptors. io holds a descriptor for each open blob (the backend's
// file), two for each cache region (its meta and data memfds; clients'
// descriptions are made when sent and closed once in flight), and a few
// for each session (its socket, ring and write log). Regions and blob
// files outlive their file's last close, so that opening the file again
// is cheap, as the kernel keeps inodes and pages after close: those of
// files nobody has open are bounded by a budget (Options.Descriptors), a
// quarter of the process's RLIMIT_NOFILE at most, three quarters of it
// for idle regions and a quarter for the backend's idle files. Nothing
// else is cached per file, so io's descriptors grow with what is open now,
// not with the number of files ever touched.
//
// Should a descriptor still be refused (EMFILE, ENFILE) or memory run out
// making one (ENOMEM), io gives back every idle one (relieve) and tries
// once more; a request that still fails gets that errno. It is never a
// storage failure: no sync ran, so nothing is known lost.

// DefaultDescriptors is Options.Descriptors' default: 1,536 descriptors
// for files nobody has open (576 idle regions, two each, and 384 idle blob
// files).
const DefaultDescriptors = 1536

// minIdleRegions is the fewest idle regions any budget keeps.
const minIdleRegions = 16

// descriptorBudget is the budget of descriptors for files nobody has open:
// n (DefaultDescriptors when 0), at most a quarter of RLIMIT_NOFILE.
func descriptorBudget(n int) int {
	if n <= 0 {
		n = DefaultDescriptors
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < uint64(4*n) {
		n = int(rl.Cur / 4)
	}
	return max(n, 2*minIdleRegions)
}

// splitBudget divides a descriptor budget between idle regions (two
// descriptors each) and the backend's idle blob files.
func splitBudget(n int) (regions, files int) {
	files = n / 4
	return max((n-files)/2, minIdleRegions), files
}

// isResourceErr reports whether err is the kernel refusing a resource,
// not the storage failing: a descriptor (EMFILE, ENFILE) or memory
// (ENOMEM).
func isResourceErr(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOMEM)
}

// descriptorErrno is the errno a client gets for err, a failure to make a
// descriptor for it: the resource's (counted and logged once), else EIO.
func (s *Service) descriptorErrno(err error) syscall.Errno {
	if isResourceErr(err) {
		s.resourceRefused(err)
		var e syscall.Errno
		if errors.As(err, &e) {
			return e
		}
	}
	s.log.Error("a client's description could not be made", "error", err)
	return syscall.EIO
}

// resourceRefused counts a resource the kernel refused (logged the first
// time, and at each power of two after, so that a flood stays readable).
func (s *Service) resourceRefused(err error) {
	n := s.Stats.ResourceErrors.Add(1)
	if n&(n-1) == 0 {
		s.log.Warn("the kernel refused a resource: idle descriptors given back, the request failed with its errno",
			"error", err, "count", n)
	}
}

// withRelief runs fn; if the kernel refuses it a resource, it gives back
// every idle descriptor (relieve) and runs it once more.
func withRelief[T any](s *Service, fn func() (T, error)) (T, error) {
	v, err := fn()
	if err != nil && isResourceErr(err) {
		s.resourceRefused(err)
		if s.relieve() {
			v, err = fn()
		}
	}
	return v, err
}

// withRelief2 is withRelief for a function of two results.
func withRelief2[T, U any](s *Service, fn func() (T, U, error)) (T, U, error) {
	type pair struct {
		t T
		u U
	}
	p, err := withRelief(s, func() (pair, error) {
		t, u, err := fn()
		return pair{t, u}, err
	})
	return p.t, p.u, err
}

// relieve closes every idle region and idle blob file, and says whether
// it closed any. s.mu must not be held.
func (s *Service) relieve() bool {
	s.mu.Lock()
	var drop []*region
	for e := s.idle.Front(); e != nil; {
		next := e.Next()
		if r := e.Value.(*region); !r.hasPins() {
			s.idle.Remove(e)
			r.idleAt = nil
			delete(s.regions, r.id)
			drop = append(drop, r)
		}
		e = next
	}
	s.mu.Unlock()
	for _, r := range drop {
		r.close()
	}
	n := len(drop)
	if k, ok := s.be.(backend.IdleKeeper); ok {
		n += k.DropIdle(1 << 30)
	}
	s.Stats.Relieved.Add(uint64(n))
	return n > 0
}

// openDescriptors counts the process's open descriptors (for weir status;
// -1 if /proc cannot say).
func openDescriptors() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // ReadDir's own
}

// spares are descriptors (of /dev/null) io holds in reserve for its own
// work when the kernel refuses one: writing home the dirty pages of files
// closed at the limit (which may create the blob's file), so that they
// close and give their descriptors back. Clients' requests never take one,
// so at the limit they fail first and io's write-back goes on. Refilled
// after each flusher pass. The zero value holds none; safe for concurrent
// use.
type spares struct {
	mu  sync.Mutex
	fds []int // protected by mu
}

// numSpares is how many spares io holds.
const numSpares = 8

// fill opens spares until numSpares are held or the kernel refuses one.
func (sp *spares) fill() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for len(sp.fds) < numSpares {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		sp.fds = append(sp.fds, fd)
	}
}

// release closes one spare; false when none is left.
func (sp *spares) release() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if len(sp.fds) == 0 {
		return false
	}
	unix.Close(sp.fds[len(sp.fds)-1])
	sp.fds = sp.fds[:len(sp.fds)-1]
	return true
}

func (sp *spares) count() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.fds)
}

// short reports whether fewer than numSpares are held: io is at its
// descriptor limit, and keeps nothing idle until they are back.
func (sp *spares) short() bool { return sp.count() < numSpares }

// ownWork runs fn, io's own work for data it holds (writing dirty pages
// home, syncing): while the kernel refuses fn a descriptor, it gives back
// the idle ones, then spares, and tries again. s.mu must not be held.
func (s *Service) ownWork(fn func() error) error {
	err := fn()
	for tries := 0; err != nil && tries < 3 && (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)); tries++ {
		s.resourceRefused(err)
		if !s.relieve() && !s.spares.release() {
			break
		}
		err = fn()
	}
	return err
}

// idleCount is how many idle regions are kept.
func (s *Service) idleCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idle.Len()
}
