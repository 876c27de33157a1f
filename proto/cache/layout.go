package cache

import (
	"errors"
	"fmt"
	"syscall"
)

// Geometry of every region (ABI version 2). A region is two memfds: the
// meta memfd holds the header page and the state pages, the data memfd
// the file's pages at their file offsets (page p at p*PageSize), so that
// a writer of the file can be given the data memfd read-write (a writable
// MAP_SHARED mapping) without any power over the words other readers
// trust.
const (
	Magic      = 0x32524357 // "WCR2" in memory order on a little-endian host
	Version    = 2
	PageShift  = 12
	PageSize   = 1 << PageShift
	HeaderSize = PageSize
	// ChunkPages is the number of data pages one state page describes:
	// 1024 words of 4 bytes.
	ChunkPages = PageSize / StateSize
	StateSize  = 4
	// ChunkBytes is how much of the file one chunk (one state page of
	// the meta memfd) describes.
	ChunkBytes = ChunkPages * PageSize
	// MaxCapacity bounds the file bytes a region covers (16 TiB).
	MaxCapacity = 1 << 44
)

// Header offsets. The immutable geometry is written once by the service
// before any client maps the region; the capacity grows (only) while
// clients run; the field group is a seqlock-protected set of live inode
// fields.
const (
	offMagic       = 0  // u32 Magic
	offVersion     = 4  // u16 Version
	offPageShift   = 6  // u16 PageShift
	offChunkPages  = 8  // u32 ChunkPages
	offReserved    = 12 // u32, zero
	offIno         = 16 // u64 the file's inode number
	offCapacity    = 24 // u64 file bytes covered: a multiple of ChunkBytes, grows only
	offGeneration  = 32 // u64 bumped when the service drops pages wholesale (truncate)
	offFieldsSeq   = 64 // u64 seqlock of the field group: odd while it changes
	offSize        = 72 // u64 the file's size
	offMtime       = 80 // i64 modification time, ns since the epoch
	offCtime       = 88 // i64 change time, ns since the epoch
	offDataVersion = 96 // u64 bumped on every change of the file's bytes
	headerFixedLen = 104
)

// Kind is the state of a page.
type Kind uint32

const (
	// KindAbsent: the page holds nothing (zeros); ask the service.
	KindAbsent Kind = 0
	// KindResident: the page holds the file's bytes.
	KindResident Kind = 1
	// KindBusy: the service is writing the page (filling it from the
	// device, applying a write, or evicting it); readers retry or ask.
	KindBusy Kind = 2
)

// A state word (u32, one per page):
//
//	bit  0-1   kind: 0 absent, 1 resident, 2 busy (3 is invalid)
//	bit  2     dirty: resident bytes not yet written home
//	bit  3-7   reserved, zero
//	bit  8-15  pins: writers storing into the page (eviction waits)
//	bit 16-31  sequence: bumped by every transition, so that a reader that
//	           saw the same word before and after its copy copied one
//	           version of the page
type Word uint32

const (
	kindMask     Word = 0x3
	flagDirty    Word = 1 << 2
	reservedMask Word = 0xf8
	pinShift          = 8
	pinMask      Word = 0xff << pinShift
	seqShift          = 16
	// MaxPins is the most pins a word counts.
	MaxPins = 0xff
)

// MakeWord builds a state word.
func MakeWord(k Kind, dirty bool, pins uint32, seq uint16) Word {
	w := Word(k)&kindMask | Word(pins&MaxPins)<<pinShift | Word(seq)<<seqShift
	if dirty {
		w |= flagDirty
	}
	return w
}

// Kind is the page's state.
func (w Word) Kind() Kind { return Kind(w & kindMask) }

// Dirty says whether resident bytes are not written home yet.
func (w Word) Dirty() bool { return w&flagDirty != 0 }

// Pins is the number of writers storing into the page.
func (w Word) Pins() uint32 { return uint32(w&pinMask) >> pinShift }

// Seq is the transition counter (it wraps).
func (w Word) Seq() uint16 { return uint16(w >> seqShift) }

// next is w with its sequence bumped and kind and dirty set as given.
func (w Word) next(k Kind, dirty bool) Word {
	return MakeWord(k, dirty, w.Pins(), w.Seq()+1)
}

// ErrInvalid wraps every malformed value: EINVAL.
var ErrInvalid = fmt.Errorf("cache region: %w", syscall.EINVAL)

// Valid reports whether w is a well-formed state word: a defined kind, no
// reserved bit, and no pins or dirt on a page that is not resident.
func (w Word) Valid() error {
	switch {
	case w&kindMask == 3:
		return fmt.Errorf("%w: state word %#x has kind 3", ErrInvalid, uint32(w))
	case w&reservedMask != 0:
		return fmt.Errorf("%w: state word %#x has reserved bits", ErrInvalid, uint32(w))
	case w.Kind() == KindAbsent && (w.Dirty() || w.Pins() != 0):
		return fmt.Errorf("%w: state word %#x: an absent page is dirty or pinned", ErrInvalid, uint32(w))
	}
	return nil
}

// Fields are the live inode fields of the header's field group.
type Fields struct {
	Size        uint64
	Mtime       int64
	Ctime       int64
	DataVersion uint64
}

// Check says whether f could be a file's: the size within MaxCapacity.
func (f Fields) Check() error {
	if f.Size > MaxCapacity {
		return fmt.Errorf("%w: size %d above %d", ErrInvalid, f.Size, uint64(MaxCapacity))
	}
	return nil
}

// Sizes are the byte sizes of the two memfds of a region covering
// capacity bytes of file, rounded up to whole chunks: the meta memfd (the
// header and a state page a chunk) and the data memfd (the chunks' pages).
func Sizes(capacity uint64) (meta, data uint64, err error) {
	if capacity > MaxCapacity {
		return 0, 0, fmt.Errorf("%w: capacity %d above %d", ErrInvalid, capacity, uint64(MaxCapacity))
	}
	c := chunksOf(capacity)
	return HeaderSize + c*PageSize, c * ChunkBytes, nil
}

func chunksOf(capacity uint64) uint64 { return (capacity + ChunkBytes - 1) / ChunkBytes }

// DataMapSize is how much of a data memfd of dataSize bytes a client maps
// beside a meta memfd of metaSize bytes: the chunks the meta memfd has
// state pages for. The service sizes the data memfd for the largest
// capacity from the start (sealed at that size, so that no client can
// grow it: docs/cache-abi.md §1), and grows only the meta memfd.
func DataMapSize(metaSize, dataSize uint64) uint64 {
	if metaSize < HeaderSize {
		return 0
	}
	return min((metaSize-HeaderSize)/PageSize*ChunkBytes, dataSize/ChunkBytes*ChunkBytes)
}

// stateOff is the offset of page p's state word in the meta memfd: the
// state pages follow the header, one after another.
func stateOff(p uint64) uint64 { return HeaderSize + p*StateSize }

// pageOff is the offset of page p's data in the data memfd: its offset in
// the file.
func pageOff(p uint64) uint64 { return p * PageSize }

// errRange is a page past the region's mapping.
var errRange = errors.New("cache region: page past the mapped capacity")
