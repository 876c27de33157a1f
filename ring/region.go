package ring

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	mmap "github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/ring/internal/race"
)

// Region is one session's shared memory: a sealed memfd and its mapping.
// The service creates it (Create) and passes the fd to the client, which
// maps it with Attach. The geometry is immutable after creation; each side
// keeps a private copy of the header and never re-reads geometry from the
// shared bytes.
type Region struct {
	f   *os.File  // the memfd; immutable after New
	mem mmap.MMap // the mapping; valid until the last reference is dropped
	g   Geometry  // private copy, immutable after New

	hdr      [headerFixedLen]byte // private copy of the immutable header bytes
	raceKeys []uint64             // race-detector keys, one per SQ and CQ slot

	refs      atomic.Int64 // users of mem: 1 for the owner + 1 per live Buffer
	closeOnce sync.Once
}

// Create makes a new sealed memfd of the geometry cfg asks for, maps it and
// writes the header. The memfd is sealed against shrinking and growing, so
// the peer cannot make accesses to the mapping fault (SIGBUS).
func Create(cfg Config) (*Region, error) {
	g, err := NewGeometry(cfg)
	if err != nil {
		return nil, err
	}
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	if cfg.HugePages {
		flags |= unix.MFD_HUGETLB
	}
	fd, err := unix.MemfdCreate("weir-ring", flags)
	if err != nil {
		return nil, fmt.Errorf("ring: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "weir-ring")
	if err := unix.Ftruncate(fd, int64(g.TotalSize)); err != nil {
		f.Close()
		return nil, fmt.Errorf("ring: size memfd to %d bytes: %w", g.TotalSize, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS,
		unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("ring: seal memfd: %w", err)
	}
	r, err := mapRegion(f, g)
	if err != nil {
		f.Close()
		return nil, err
	}
	encodeHeader(r.mem, g)
	copy(r.hdr[:], r.mem[:headerFixedLen])
	for i := uint32(0); i < g.SQEntries; i++ {
		r.store64(r.sqSlot(uint64(i)), uint64(i))
	}
	for i := uint32(0); i < g.CQEntries; i++ {
		r.store64(r.cqSlot(uint64(i)), uint64(i))
	}
	return r, nil
}

// Attach maps a region received from a peer. It checks the seals (a region
// that can shrink could fault this process), then reads the header once into
// private memory and validates it against the mapping's real size.
// On success the Region owns f.
func Attach(f *os.File) (*Region, error) {
	fd := int(f.Fd())
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("ring: read seals: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("ring: region is not sealed against shrinking")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("ring: stat region: %w", err)
	}
	if st.Size < HeaderSize {
		return nil, fmt.Errorf("ring: region is %d bytes, smaller than a header", st.Size)
	}
	hdr := make([]byte, headerFixedLen)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil, fmt.Errorf("ring: read header: %w", err)
	}
	g, err := DecodeHeader(hdr, uint64(st.Size))
	if err != nil {
		return nil, err
	}
	r, err := mapRegion(f, g)
	if err != nil {
		return nil, err
	}
	copy(r.hdr[:], hdr)
	return r, nil
}

func mapRegion(f *os.File, g Geometry) (*Region, error) {
	m, err := mmap.MapRegion(f, int(g.TotalSize), mmap.RDWR, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("ring: map %d bytes: %w", g.TotalSize, err)
	}
	r := &Region{f: f, mem: m, g: g}
	if race.Enabled {
		r.raceKeys = raceKeysFor(f, int(g.SQEntries+g.CQEntries))
	}
	r.refs.Store(1)
	return r, nil
}

// Geometry returns the region's immutable layout.
func (r *Region) Geometry() Geometry { return r.g }

// File returns the memfd, for passing to the peer.
func (r *Region) File() *os.File { return r.f }

// Bytes returns the whole mapping: header, queues and arena, TotalSize bytes
// from the start of the region. It stays valid until the region is closed.
// A service hands it to a backend that registers memory for DMA: the
// mapping of a huge-page region is 2 MiB aligned and a multiple of 2 MiB
// long (NewGeometry rounds TotalSize up); its arena is neither.
func (r *Region) Bytes() []byte { return r.mem[:len(r.mem):len(r.mem)] }

// HeaderIntact reports whether the shared copy of the immutable header still
// matches the private one. A mismatch means the peer scribbled on it.
func (r *Region) HeaderIntact() bool {
	return bytes.Equal(r.mem[:headerFixedLen], r.hdr[:])
}

// arena returns the payload arena of the mapping.
func (r *Region) arena() []byte {
	return r.mem[r.g.ArenaOffset : r.g.ArenaOffset+r.g.ArenaSize : r.g.ArenaOffset+r.g.ArenaSize]
}

func (r *Region) sqSlot(pos uint64) uint64 {
	return r.g.SQOffset + (pos&uint64(r.g.SQEntries-1))*SQSlotSize
}

func (r *Region) cqSlot(pos uint64) uint64 {
	return r.g.CQOffset + (pos&uint64(r.g.CQEntries-1))*CQSlotSize
}

// acquire takes a reference on the mapping; it fails once the region is
// closed and the mapping may be gone.
func (r *Region) acquire() bool {
	for {
		n := r.refs.Load()
		if n <= 0 {
			return false
		}
		if r.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release drops a reference; the last one unmaps.
func (r *Region) release() {
	if r.refs.Add(-1) == 0 {
		_ = r.mem.Unmap()
		_ = r.f.Close()
	}
}

// Close drops the owner's reference. The mapping stays until the last
// Buffer referring to it is released.
func (r *Region) Close() {
	r.closeOnce.Do(r.release)
}

var raceKeyRegistry struct {
	sync.Mutex
	m map[[2]uint64]*[]uint64
}

// raceKeysFor returns the key array shared by every mapping of f's memfd in
// this process, so that two mappings of one region synchronise.
func raceKeysFor(f *os.File, n int) []uint64 {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return make([]uint64, n)
	}
	id := [2]uint64{uint64(st.Dev), st.Ino}
	raceKeyRegistry.Lock()
	defer raceKeyRegistry.Unlock()
	if raceKeyRegistry.m == nil {
		raceKeyRegistry.m = make(map[[2]uint64]*[]uint64)
	}
	if k, ok := raceKeyRegistry.m[id]; ok && len(*k) >= n {
		return *k
	}
	k := make([]uint64, n)
	raceKeyRegistry.m[id] = &k
	return k
}
