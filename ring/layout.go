package ring

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// ABI constants. docs/ring-abi.md and include/weir_ring.h describe the same
// values; TestCHeaderMatchesGo keeps the three in step.
const (
	// Magic is the first eight bytes of every ring region: "WEIRRING" read as
	// a little-endian uint64.
	Magic uint64 = 0x474e495252494557
	// ABIVersion is bumped on any incompatible change of the layout below.
	ABIVersion uint32 = 1

	HeaderSize   = 4096 // the header occupies the first page
	SQSlotSize   = 128  // one submission descriptor
	CQSlotSize   = 32   // one completion
	SegmentSize  = 8    // one scatter-gather entry {u32 off, u32 len}
	InlineSegs   = 10   // segments carried inside a descriptor
	pageSize     = 4096 // alignment of the queues and the arena
	cacheLine    = 64
	maxQueueLog2 = 16 // at most 65536 entries per queue

	// MaxSegments bounds a descriptor's scatter-gather list (inline or
	// indirect). It keeps an indirect table to 8 KiB.
	MaxSegments = 1024
	// SegAlign is the alignment every segment offset (and an indirect
	// table) must have inside the arena.
	SegAlign = 8
	// MaxArenaSize keeps every arena offset in a uint32.
	MaxArenaSize = 1 << 32
)

// Header field offsets (bytes from the start of the region).
const (
	offMagic       = 0
	offVersion     = 8
	offHeaderSize  = 12
	offFeatures    = 16
	offSQEntries   = 24
	offCQEntries   = 28
	offSQSlotSize  = 32
	offCQSlotSize  = 36
	offBlockSize   = 40
	offMaxSegments = 44
	offSQOffset    = 48
	offCQOffset    = 56
	offArenaOffset = 64
	offArenaSize   = 72
	offTotalSize   = 80
	headerFixedLen = 88 // immutable part: written once by the creator

	offSQBell      = 128 // u32 bell, u32 waiters: the server sleeps here
	offSQWaiters   = 132
	offCQBell      = 192 // u32 bell, u32 waiters: the client sleeps here
	offCQWaiters   = 196
	offServerState = 256 // u32, written only by the server
	offServerHints = 260 // u32, written only by the server: Hint* bits
	offClientState = 320 // u32, written only by the client
)

// Submission descriptor field offsets (bytes from the start of a slot).
const (
	sqOffSeq    = 0
	sqOffOpcode = 8
	sqOffFlags  = 9
	sqOffNSeg   = 10
	sqOffArg    = 12
	sqOffReqID  = 16
	sqOffHandle = 24
	sqOffOffset = 32
	sqOffLength = 40
	sqOffSegs   = 48
)

// Completion field offsets.
const (
	cqOffSeq    = 0
	cqOffReqID  = 8
	cqOffResult = 16
	cqOffAux    = 24
)

// Feature bits advertised in the header. A client refuses a region with a
// required bit it does not know.
const (
	// FeatureIndirect: descriptors may carry FlagIndirect.
	FeatureIndirect uint64 = 1 << 0
	// FeatureHugePages: the region is backed by huge pages (MFD_HUGETLB).
	FeatureHugePages uint64 = 1 << 1

	knownFeatures = FeatureIndirect | FeatureHugePages
)

// Descriptor flags. The flags byte belongs to the ring and unknown bits are
// refused with EINVAL; a service carries its own flags in Arg.
const (
	// FlagIndirect: Segs[0] names an arena table of NSeg segments instead of
	// the segments themselves.
	FlagIndirect uint8 = 1 << 0

	knownFlags = FlagIndirect
)

// Server hints (offServerHints), advice to the client that it may ignore.
const (
	// HintNoSpin: the requests in flight across the server's sessions
	// (Load) were at least half the host's CPUs when the server posted
	// its last completion to this session: a client that spins for a
	// completion then holds a CPU that the server, or another client,
	// needs. The Go client sleeps without its spin instead.
	HintNoSpin uint32 = 1 << 0
)

// Session states published in the header, one word per side.
const (
	StateInit    uint32 = 0 // region created, handshake not complete
	StateRunning uint32 = 1 // this side serves / submits
	// 2 is reserved (an earlier draft's "closing"; never written).
	StateClosed uint32 = 3 // this side is gone
)

// Geometry is the immutable shape of a ring region. The creator chooses it;
// the other side learns it from the header and checks it with Validate.
type Geometry struct {
	Features    uint64
	SQEntries   uint32
	CQEntries   uint32
	BlockSize   uint32
	MaxSegments uint32
	SQOffset    uint64
	CQOffset    uint64
	ArenaOffset uint64
	ArenaSize   uint64
	TotalSize   uint64
}

// Config chooses the size of a new ring region.
type Config struct {
	SQEntries uint32 // power of two, default 256
	CQEntries uint32 // power of two, default 2*SQEntries
	ArenaSize uint64 // bytes, default 8 MiB, rounded up to BlockSize
	BlockSize uint32 // arena allocation unit, power of two >= 64, default 4096
	HugePages bool   // back the region with MFD_HUGETLB pages
}

// DefaultConfig is what a session gets when it asks for nothing.
func DefaultConfig() Config {
	return Config{SQEntries: 256, CQEntries: 512, ArenaSize: 8 << 20, BlockSize: 4096}
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

func isPow2(v uint64) bool { return v != 0 && v&(v-1) == 0 }

// NewGeometry lays out a region for cfg, filling in defaults.
func NewGeometry(cfg Config) (Geometry, error) {
	def := DefaultConfig()
	if cfg.SQEntries == 0 {
		cfg.SQEntries = def.SQEntries
	}
	if cfg.CQEntries == 0 {
		cfg.CQEntries = 2 * cfg.SQEntries
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = def.BlockSize
	}
	if cfg.ArenaSize == 0 {
		cfg.ArenaSize = def.ArenaSize
	}
	var g Geometry
	if !isPow2(uint64(cfg.SQEntries)) || bits.Len32(cfg.SQEntries) > maxQueueLog2+1 || cfg.SQEntries < 2 {
		return g, fmt.Errorf("ring: SQ entries %d: want a power of two in [2, %d]", cfg.SQEntries, 1<<maxQueueLog2)
	}
	if !isPow2(uint64(cfg.CQEntries)) || bits.Len32(cfg.CQEntries) > maxQueueLog2+1 || cfg.CQEntries < cfg.SQEntries {
		return g, fmt.Errorf("ring: CQ entries %d: want a power of two in [SQ entries, %d]", cfg.CQEntries, 1<<maxQueueLog2)
	}
	if !isPow2(uint64(cfg.BlockSize)) || cfg.BlockSize < 64 || cfg.BlockSize > 1<<20 {
		return g, fmt.Errorf("ring: block size %d: want a power of two in [64, 1 MiB]", cfg.BlockSize)
	}
	arena := alignUp(cfg.ArenaSize, uint64(max(cfg.BlockSize, pageSize)))
	if arena >= MaxArenaSize {
		return g, fmt.Errorf("ring: arena size %d: must be below 4 GiB", cfg.ArenaSize)
	}
	g = Geometry{
		Features:    FeatureIndirect,
		SQEntries:   cfg.SQEntries,
		CQEntries:   cfg.CQEntries,
		BlockSize:   cfg.BlockSize,
		MaxSegments: MaxSegments,
		SQOffset:    HeaderSize,
	}
	if cfg.HugePages {
		g.Features |= FeatureHugePages
	}
	g.CQOffset = alignUp(g.SQOffset+uint64(g.SQEntries)*SQSlotSize, pageSize)
	g.ArenaOffset = alignUp(g.CQOffset+uint64(g.CQEntries)*CQSlotSize, pageSize)
	g.ArenaSize = arena
	g.TotalSize = g.ArenaOffset + g.ArenaSize
	if cfg.HugePages {
		g.TotalSize = alignUp(g.TotalSize, 2<<20)
	}
	return g, nil
}

// Validate checks a geometry read from a peer's header against the size of
// the mapping it came with. Every offset is checked before any use.
func (g Geometry) Validate(mapped uint64) error {
	// Size and offsets first, so that no sum below can wrap.
	switch {
	case g.TotalSize != mapped:
		return fmt.Errorf("ring: header says %d bytes, mapping has %d", g.TotalSize, mapped)
	case g.CQOffset >= mapped || g.ArenaOffset >= mapped || g.ArenaSize > mapped:
		return fmt.Errorf("ring: offsets (CQ %d, arena %d+%d) beyond the %d-byte region",
			g.CQOffset, g.ArenaOffset, g.ArenaSize, mapped)
	}
	switch {
	case g.Features&^knownFeatures != 0:
		return fmt.Errorf("ring: unknown feature bits %#x", g.Features&^knownFeatures)
	case !isPow2(uint64(g.SQEntries)) || g.SQEntries < 2 || bits.Len32(g.SQEntries) > maxQueueLog2+1:
		return fmt.Errorf("ring: bad SQ entries %d", g.SQEntries)
	case !isPow2(uint64(g.CQEntries)) || g.CQEntries < g.SQEntries || bits.Len32(g.CQEntries) > maxQueueLog2+1:
		return fmt.Errorf("ring: bad CQ entries %d", g.CQEntries)
	case !isPow2(uint64(g.BlockSize)) || g.BlockSize < 64 || g.BlockSize > 1<<20:
		return fmt.Errorf("ring: bad block size %d", g.BlockSize)
	case g.MaxSegments == 0 || g.MaxSegments > MaxSegments:
		return fmt.Errorf("ring: bad max segments %d", g.MaxSegments)
	case g.SQOffset != HeaderSize:
		return fmt.Errorf("ring: SQ offset %d, want %d", g.SQOffset, HeaderSize)
	case g.CQOffset%pageSize != 0 || g.CQOffset < g.SQOffset+uint64(g.SQEntries)*SQSlotSize:
		return fmt.Errorf("ring: CQ offset %d overlaps the SQ or is unaligned", g.CQOffset)
	case g.ArenaOffset%pageSize != 0 || g.ArenaOffset < g.CQOffset+uint64(g.CQEntries)*CQSlotSize:
		return fmt.Errorf("ring: arena offset %d overlaps the CQ or is unaligned", g.ArenaOffset)
	case g.ArenaSize == 0 || g.ArenaSize >= MaxArenaSize || g.ArenaSize%uint64(g.BlockSize) != 0:
		return fmt.Errorf("ring: bad arena size %d", g.ArenaSize)
	case g.ArenaOffset+g.ArenaSize < g.ArenaOffset || g.ArenaOffset+g.ArenaSize > g.TotalSize:
		return fmt.Errorf("ring: arena [%d,+%d) beyond region size %d", g.ArenaOffset, g.ArenaSize, g.TotalSize)
	}
	return nil
}

// encodeHeader writes the immutable part of the header.
func encodeHeader(b []byte, g Geometry) {
	le := binary.LittleEndian
	le.PutUint64(b[offMagic:], Magic)
	le.PutUint32(b[offVersion:], ABIVersion)
	le.PutUint32(b[offHeaderSize:], HeaderSize)
	le.PutUint64(b[offFeatures:], g.Features)
	le.PutUint32(b[offSQEntries:], g.SQEntries)
	le.PutUint32(b[offCQEntries:], g.CQEntries)
	le.PutUint32(b[offSQSlotSize:], SQSlotSize)
	le.PutUint32(b[offCQSlotSize:], CQSlotSize)
	le.PutUint32(b[offBlockSize:], g.BlockSize)
	le.PutUint32(b[offMaxSegments:], g.MaxSegments)
	le.PutUint64(b[offSQOffset:], g.SQOffset)
	le.PutUint64(b[offCQOffset:], g.CQOffset)
	le.PutUint64(b[offArenaOffset:], g.ArenaOffset)
	le.PutUint64(b[offArenaSize:], g.ArenaSize)
	le.PutUint64(b[offTotalSize:], g.TotalSize)
}

// DecodeHeader parses and validates a header copy. b must be a private copy
// of at least headerFixedLen bytes; mapped is the size of the mapping.
func DecodeHeader(b []byte, mapped uint64) (Geometry, error) {
	var g Geometry
	if len(b) < headerFixedLen {
		return g, fmt.Errorf("ring: header is %d bytes, want at least %d", len(b), headerFixedLen)
	}
	le := binary.LittleEndian
	if m := le.Uint64(b[offMagic:]); m != Magic {
		return g, fmt.Errorf("ring: bad magic %#x", m)
	}
	if v := le.Uint32(b[offVersion:]); v != ABIVersion {
		return g, fmt.Errorf("ring: ABI version %d, this side speaks %d", v, ABIVersion)
	}
	if hs := le.Uint32(b[offHeaderSize:]); hs != HeaderSize {
		return g, fmt.Errorf("ring: header size %d, want %d", hs, HeaderSize)
	}
	if s := le.Uint32(b[offSQSlotSize:]); s != SQSlotSize {
		return g, fmt.Errorf("ring: SQ slot size %d, want %d", s, SQSlotSize)
	}
	if s := le.Uint32(b[offCQSlotSize:]); s != CQSlotSize {
		return g, fmt.Errorf("ring: CQ slot size %d, want %d", s, CQSlotSize)
	}
	g = Geometry{
		Features:    le.Uint64(b[offFeatures:]),
		SQEntries:   le.Uint32(b[offSQEntries:]),
		CQEntries:   le.Uint32(b[offCQEntries:]),
		BlockSize:   le.Uint32(b[offBlockSize:]),
		MaxSegments: le.Uint32(b[offMaxSegments:]),
		SQOffset:    le.Uint64(b[offSQOffset:]),
		CQOffset:    le.Uint64(b[offCQOffset:]),
		ArenaOffset: le.Uint64(b[offArenaOffset:]),
		ArenaSize:   le.Uint64(b[offArenaSize:]),
		TotalSize:   le.Uint64(b[offTotalSize:]),
	}
	if err := g.Validate(mapped); err != nil {
		return Geometry{}, err
	}
	return g, nil
}
