// Package staging is the staging log of Split Journaling (issue 10): the
// persistent ring an fsync writes one self-contained record to, with one
// device flush, and that a checkpoint later trims. It holds the on-device
// format (docs/journal-format.md), the log writer with group commit, and
// recovery, which reads back every record a flush made durable and drops
// a torn or zeroed tail. The IO service writes and replays it
// (services/io/staged.go); weir check reads it (Inspect). The journal
// service that is to take the checkpoint over is not built yet.
package staging

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Format constants (version 1). Every offset and length is in bytes unless
// it says blocks; integers are little-endian.
const (
	// Version is the format version of superblocks and records.
	Version = 1
	// BlockSize is the unit of the log: records start on a block and span
	// whole blocks, so that they can be written with O_DIRECT from
	// page-aligned memory and a torn write tears at a block's sectors.
	BlockSize = 4096
	// PageSize is the size of a file page a record carries.
	PageSize = 4096
	// SuperSize is the size of one superblock; the log starts with two
	// (A at 0, B at SuperSize) and its ring follows them.
	SuperSize = BlockSize
	// RingOffset is the byte offset of the ring in the log.
	RingOffset = 2 * SuperSize
	// headerSize is the fixed part of a record header; extents follow.
	headerSize = 96
	// extentSize is the size of one extent entry.
	extentSize = 16
	// MaxExtents bounds the extents of one record.
	MaxExtents = 1 << 16
	// MaxRecordBlocks bounds one record's length (64 MiB).
	MaxRecordBlocks = 64 << 20 / BlockSize
)

// Record types.
const (
	// TypeFile is a file's staged state: its dirty pages and inode fields.
	TypeFile = 1
	// TypeWrap says the ring continues at its start: the rest of the ring
	// after this block holds nothing of this lap.
	TypeWrap = 2
)

// FlagHome says the file's home location held its whole state, durably,
// when the record was made (the writer synced it first): recovery skips
// the file's earlier records, which would take pages back to older
// states. Its pages, if any, go on top.
const FlagHome = 1

// FlagTruncate says the file was cut to Size here (a truncate that shrank
// it, logged before the blob was cut): recovery cuts the blob to Size at
// this point of the sequence, so that an earlier record's pages and size
// past the cut do not come back. It carries no pages.
const FlagTruncate = 2

// flagsKnown are the flags this version writes and reads.
const flagsKnown = FlagHome | FlagTruncate

var (
	recordMagic = [4]byte{'W', 'S', 'R', '1'}
	superMagic  = [8]byte{'W', 'S', 'T', 'G', 'S', 'B', '0', '1'}
	castagnoli  = crc32.MakeTable(crc32.Castagnoli)
)

// checksum is CRC-32C, the checksum of every structure of the log.
func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// recordChecksum is the checksum of a record's blocks with its checksum
// field (bytes 92 to 96) taken as zero, without writing into b.
func recordChecksum(b []byte) uint32 {
	c := crc32.Update(0, castagnoli, b[:92])
	c = crc32.Update(c, castagnoli, []byte{0, 0, 0, 0})
	return crc32.Update(c, castagnoli, b[96:])
}

// Extent is a run of a file's pages: Pages pages from page First (file
// offset First*PageSize).
type Extent struct {
	First uint64
	Pages uint32
}

// Record is one staged file state: the inode field group and the pages of
// Extents, whose bytes are Data (the extents' pages in order).
type Record struct {
	LSN         uint64 // sequence number: consecutive in the log, from 1
	Blob        uint64 // the file's blob
	Ino         uint64 // the file's inode
	Size        int64  // the file's size
	MtimeNs     int64  // modification time, ns since the epoch
	DataVersion uint64 // the file's data version (docs/architecture.md)
	// Flags: FlagHome, FlagTruncate or 0. Without FlagHome the file's
	// state is what its earlier live records and its home location give,
	// with this record's pages on top; with it, the home location alone.
	// FlagTruncate: a cut to Size, no pages.
	Flags uint64
	// Epoch is the log's incarnation that wrote the record (the log sets
	// it): recovery stops at a record older than one before it, which is
	// a previous incarnation's unflushed write, not part of the log.
	Epoch uint64
	// Log is the log's identity, random at Format (the log sets it):
	// recovery takes only records that carry it, so a file's page that
	// imitates a record (its bytes are the user's) is not one.
	Log     uint64
	Extents []Extent
	Data    []byte
}

// ErrBadRecord says bytes are not a valid record (a torn or zeroed tail,
// or damage); Decode wraps it with the reason.
var ErrBadRecord = errors.New("staging: not a valid record")

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRecord, fmt.Sprintf(format, a...))
}

// headerBlocks is the number of blocks a header with n extents takes.
func headerBlocks(n int) int { return (headerSize + n*extentSize + BlockSize - 1) / BlockSize }

// pages is the number of pages of the extents, or an error past the bounds.
func pagesOf(ext []Extent) (uint64, error) {
	var n uint64
	for i, e := range ext {
		if e.Pages == 0 {
			return 0, bad("extent %d is empty", i)
		}
		if e.First > math.MaxInt64/PageSize-uint64(e.Pages) {
			return 0, bad("extent %d ends past the largest file", i)
		}
		if i > 0 && e.First < ext[i-1].First+uint64(ext[i-1].Pages) {
			return 0, bad("extent %d is not after extent %d", i, i-1)
		}
		n += uint64(e.Pages)
		if n > MaxRecordBlocks {
			return 0, bad("more than %d pages", MaxRecordBlocks)
		}
	}
	return n, nil
}

// Blocks is the length of r encoded, in blocks.
func (r *Record) Blocks() (int, error) {
	if len(r.Extents) > MaxExtents {
		return 0, bad("%d extents (at most %d)", len(r.Extents), MaxExtents)
	}
	n, err := pagesOf(r.Extents)
	if err != nil {
		return 0, err
	}
	b := headerBlocks(len(r.Extents)) + int(n)
	if b > MaxRecordBlocks {
		return 0, bad("%d blocks (at most %d)", b, MaxRecordBlocks)
	}
	return b, nil
}

// Encode appends r's encoding (docs/journal-format.md) to dst, which it
// returns. r.Data must hold exactly the extents' pages.
//
//	 0  [4]byte magic "WSR1"     4  u16 version      6  u16 type
//	 8  u64 lsn                 16  u32 blocks       20  u32 extents
//	24  u64 blob                32  u64 ino          40  i64 size
//	48  i64 mtime ns            56  u64 data version 64  u64 flags (FlagHome, FlagTruncate)
//	72  u64 epoch               80  u64 log identity
//	88  u32 payload pages       92  u32 crc32c of all blocks (this field 0)
//	96  extents: u64 first page, u32 pages, u32 0 (16 bytes each)
//	    zeros to the end of the header blocks, then the pages
func (r *Record) Encode(dst []byte) ([]byte, error) {
	blocks, err := r.Blocks()
	if err != nil {
		return dst, err
	}
	pages, _ := pagesOf(r.Extents)
	if uint64(len(r.Data)) != pages*PageSize {
		return dst, fmt.Errorf("staging: %d data bytes for %d pages", len(r.Data), pages)
	}
	if r.LSN == 0 || r.Size < 0 || r.Flags&^flagsKnown != 0 || r.Flags&FlagTruncate != 0 && len(r.Extents) > 0 {
		return dst, fmt.Errorf("staging: record with lsn %d, size %d, flags %#x", r.LSN, r.Size, r.Flags)
	}
	start := len(dst)
	dst = append(dst, make([]byte, blocks*BlockSize)...)
	b := dst[start:]
	copy(b[0:4], recordMagic[:])
	le := binary.LittleEndian
	le.PutUint16(b[4:], Version)
	le.PutUint16(b[6:], TypeFile)
	le.PutUint64(b[8:], r.LSN)
	le.PutUint32(b[16:], uint32(blocks))
	le.PutUint32(b[20:], uint32(len(r.Extents)))
	le.PutUint64(b[24:], r.Blob)
	le.PutUint64(b[32:], r.Ino)
	le.PutUint64(b[40:], uint64(r.Size))
	le.PutUint64(b[48:], uint64(r.MtimeNs))
	le.PutUint64(b[56:], r.DataVersion)
	le.PutUint64(b[64:], r.Flags)
	le.PutUint64(b[72:], r.Epoch)
	le.PutUint64(b[80:], r.Log)
	le.PutUint32(b[88:], uint32(pages))
	for i, e := range r.Extents {
		o := headerSize + i*extentSize
		le.PutUint64(b[o:], e.First)
		le.PutUint32(b[o+8:], e.Pages)
	}
	copy(b[headerBlocks(len(r.Extents))*BlockSize:], r.Data)
	le.PutUint32(b[92:], recordChecksum(b))
	return dst, nil
}

// encodeWrap is the one block of a wrap marker with lsn, epoch and the
// log's identity.
func encodeWrap(lsn, epoch, log uint64) []byte {
	b := make([]byte, BlockSize)
	copy(b[0:4], recordMagic[:])
	le := binary.LittleEndian
	le.PutUint16(b[4:], Version)
	le.PutUint16(b[6:], TypeWrap)
	le.PutUint64(b[8:], lsn)
	le.PutUint32(b[16:], 1)
	le.PutUint64(b[72:], epoch)
	le.PutUint64(b[80:], log)
	le.PutUint32(b[92:], recordChecksum(b))
	return b
}

// header is what peek reads of a record's fixed header.
type header struct {
	typ    uint16
	lsn    uint64
	epoch  uint64
	log    uint64
	blocks int
}

// peek reads the fixed header at the start of b (at least headerSize
// bytes), checked as far as the header alone allows. The caller reads
// h.blocks blocks and decodes them.
func peek(b []byte) (h header, err error) {
	if len(b) < headerSize {
		return h, bad("%d bytes: shorter than a header", len(b))
	}
	if [4]byte(b[0:4]) != recordMagic {
		return h, bad("no record magic")
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[4:]); v != Version {
		return h, bad("version %d (this build reads %d)", v, Version)
	}
	h = header{typ: le.Uint16(b[6:]), lsn: le.Uint64(b[8:]), epoch: le.Uint64(b[72:]), log: le.Uint64(b[80:]), blocks: int(le.Uint32(b[16:]))}
	switch {
	case h.typ != TypeFile && h.typ != TypeWrap:
		return h, bad("type %d", h.typ)
	case h.lsn == 0:
		return h, bad("lsn 0")
	case h.blocks < 1 || h.blocks > MaxRecordBlocks:
		return h, bad("%d blocks", h.blocks)
	case h.typ == TypeWrap && h.blocks != 1:
		return h, bad("a wrap marker of %d blocks", h.blocks)
	}
	return h, nil
}

// Decode decodes the record that b holds whole (its blocks, as peek
// gave). A wrap marker decodes to a Record with only LSN set and wrap
// true. Data aliases b.
func Decode(b []byte) (rec Record, wrap bool, err error) {
	h, err := peek(b)
	if err != nil {
		return Record{}, false, err
	}
	blocks := h.blocks
	if len(b) != blocks*BlockSize {
		return Record{}, false, bad("%d bytes for a record of %d blocks", len(b), blocks)
	}
	le := binary.LittleEndian
	sum := le.Uint32(b[92:])
	if got := recordChecksum(b); got != sum {
		return Record{}, false, bad("checksum %08x, header says %08x", got, sum)
	}
	if h.typ == TypeWrap {
		for i, c := range b {
			if c != 0 && !(i < 20 || (i >= 72 && i < 88) || (i >= 92 && i < 96)) {
				return Record{}, false, bad("wrap marker: byte %d set", i)
			}
		}
		return Record{LSN: h.lsn, Epoch: h.epoch, Log: h.log}, true, nil
	}
	n := int(le.Uint32(b[20:]))
	if n > MaxExtents || headerBlocks(n) > blocks {
		return Record{}, false, bad("%d extents in %d blocks", n, blocks)
	}
	rec = Record{LSN: h.lsn, Blob: le.Uint64(b[24:]), Ino: le.Uint64(b[32:]), Size: int64(le.Uint64(b[40:])),
		MtimeNs: int64(le.Uint64(b[48:])), DataVersion: le.Uint64(b[56:]), Flags: le.Uint64(b[64:]), Epoch: h.epoch, Log: h.log}
	if rec.Size < 0 || rec.Flags&^flagsKnown != 0 || rec.Flags&FlagTruncate != 0 && n > 0 {
		return Record{}, false, bad("size %d, flags %#x", rec.Size, rec.Flags)
	}
	if n > 0 {
		rec.Extents = make([]Extent, n)
	}
	for i := range rec.Extents {
		o := headerSize + i*extentSize
		if le.Uint32(b[o+12:]) != 0 {
			return Record{}, false, bad("extent %d: reserved bytes set", i)
		}
		rec.Extents[i] = Extent{First: le.Uint64(b[o:]), Pages: le.Uint32(b[o+8:])}
	}
	pages, err := pagesOf(rec.Extents)
	if err != nil {
		return Record{}, false, err
	}
	if p := le.Uint32(b[88:]); uint64(p) != pages || headerBlocks(n)+int(pages) != blocks {
		return Record{}, false, bad("%d payload pages, %d in the extents, %d blocks", p, pages, blocks)
	}
	hb := headerBlocks(n) * BlockSize
	for _, c := range b[headerSize+n*extentSize : hb] {
		if c != 0 {
			return Record{}, false, bad("header padding not zero")
		}
	}
	rec.Data = b[hb:]
	return rec, false, nil
}
