// Package journalproto is the protocol of the journal service's session
// with the IO service (S4 in docs/architecture.md): a service session
// (internal/host, peer.go) on io's journal socket, which only the service
// user may open and only as role "journal". The journal service drives
// the checkpoint of the staging log; io, which owns the device, does the
// device work it asks for.
//
// One pass:
//
//	journal                          io
//	OpNext (wait ≤ 1 s)      ->      waits for a poke (an fsync waiting for
//	                                 room, a delete, a resync) or the wait,
//	                         <-      a batch: the run of live records from
//	                                 the trim point, their files
//	OpCheckpoint(blob) × n   ->      makes the file durable at home
//	                         <-      its size, mtime, data version
//	SetLiveBatch over NATS to the metadata service: every file's inode
//	fields in one synced WAL commit; it answers which files are gone
//	OpCommit(batch, gone)    ->      trims the log up to the batch's last
//	                                 record
//
// All integers are little-endian. Opcodes are service-session opcodes
// (0x60-0x7f, host.OpPeerHello is 0x60).
package journalproto

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	// OpNext asks for the next batch. Arg: how long io may wait for
	// work, in milliseconds (at most MaxWaitMs); a poke (an fsync waiting
	// for room, a delete) or a resync ends the wait. Offset: the journal's
	// failed passes in a row (0: the last one committed); while it is not
	// 0 only a resync ends the wait (the journal's backoff), and io's
	// status shows it. A run of void records only (files replay found
	// gone) io trims itself and answers 0. Buf: where io writes the
	// batch (Batch layout), at least BatchHeader bytes; its size bounds
	// the batch's files. Result: the batch's files (0: nothing to do; no
	// batch written), or -errno (EAGAIN: io's staging log is not open
	// yet).
	OpNext uint8 = 0x61
	// OpCheckpoint makes one file of the current batch durable at home.
	// Handle: its blob. Offset: the batch id. Buf: 24 bytes where io
	// writes the file's Report. Result: 1 (a report written), 0 (no
	// report: the blob is being deleted, its records are void), or
	// -errno: ENOENT (no such batch, or the blob is not in it), EIO (the
	// device failed; the pass is over).
	OpCheckpoint uint8 = 0x62
	// OpCommit ends the batch: every file of it checkpointed, and the
	// reports made durable at the metadata service. Offset: the batch id.
	// Buf: the inodes the metadata service refused as gone, 8 bytes each
	// (none: no Buf). Result: 0 (trimmed), or -errno: ENOENT (no such
	// batch), EINVAL (a file of it not checkpointed, or a bad list),
	// ESTALE (the metadata service restarted during the pass, or the log
	// was trimmed meanwhile: take another batch), EIO (the trim failed).
	OpCommit uint8 = 0x63

	// MaxWaitMs bounds OpNext's wait.
	MaxWaitMs = 1000
	// BatchHeader is the size of a batch's header, File of each file.
	BatchHeader = 32
	File        = 24
	// ReportSize is the size of a Report.
	ReportSize = 24
	// Version is the protocol's version, in every batch: a journal
	// service takes only batches of its own version.
	Version = 1
)

// Batch is what OpNext writes:
//
//	 0  u64 batch id (io's, nonzero)
//	 8  u64 trim lsn: the log's trim point when io made the batch
//	16  u64 upto lsn: OpCommit trims the log up to it
//	24  u32 files
//	28  u32 version (Version: 1)
//	32  files × { u64 blob, u64 inode, u32 flags, u32 0 }
//	    flags bit 0: a closed file with changes and no live record
//	    (written back, not fsynced)
type Batch struct {
	ID, Trim, Upto uint64
	Files          []BatchFile
}

// BatchFile is one file of a batch.
type BatchFile struct {
	Blob, Ino uint64
	Closed    bool
}

// FlagClosed is BatchFile.Closed on the wire.
const FlagClosed = 1

// Size is the encoded size of b.
func (b *Batch) Size() int { return BatchHeader + File*len(b.Files) }

// Encode writes b into dst, which must hold b.Size() bytes.
func (b *Batch) Encode(dst []byte) {
	le := binary.LittleEndian
	le.PutUint64(dst[0:], b.ID)
	le.PutUint64(dst[8:], b.Trim)
	le.PutUint64(dst[16:], b.Upto)
	le.PutUint32(dst[24:], uint32(len(b.Files)))
	le.PutUint32(dst[28:], Version)
	for i, f := range b.Files {
		e := dst[BatchHeader+File*i:]
		le.PutUint64(e[0:], f.Blob)
		le.PutUint64(e[8:], f.Ino)
		var fl uint32
		if f.Closed {
			fl = FlagClosed
		}
		le.PutUint32(e[16:], fl)
		le.PutUint32(e[20:], 0)
	}
}

// ErrMalformed is a batch or report that no honest io writes.
var ErrMalformed = errors.New("journalproto: malformed")

// DecodeBatch reads a batch of files files from src (the count is
// OpNext's Result, which must match the header's).
func DecodeBatch(src []byte, files int) (*Batch, error) {
	if len(src) < BatchHeader {
		return nil, fmt.Errorf("%w: batch of %d bytes", ErrMalformed, len(src))
	}
	le := binary.LittleEndian
	b := &Batch{ID: le.Uint64(src[0:]), Trim: le.Uint64(src[8:]), Upto: le.Uint64(src[16:])}
	n := le.Uint32(src[24:])
	switch {
	case b.ID == 0:
		return nil, fmt.Errorf("%w: batch id 0", ErrMalformed)
	case b.Upto < b.Trim:
		return nil, fmt.Errorf("%w: batch up to lsn %d, below its trim point %d", ErrMalformed, b.Upto, b.Trim)
	case int64(n) != int64(files) || files < 0:
		return nil, fmt.Errorf("%w: batch says %d files, the completion %d", ErrMalformed, n, files)
	case le.Uint32(src[28:]) != Version:
		return nil, fmt.Errorf("%w: batch of protocol version %d; this journal speaks %d", ErrMalformed, le.Uint32(src[28:]), Version)
	case (len(src)-BatchHeader)/File < files:
		return nil, fmt.Errorf("%w: %d files do not fit in %d bytes", ErrMalformed, files, len(src))
	}
	seen := make(map[uint64]bool, files)
	for i := range files {
		e := src[BatchHeader+File*i:]
		f := BatchFile{Blob: le.Uint64(e[0:]), Ino: le.Uint64(e[8:])}
		fl := le.Uint32(e[16:])
		if f.Blob == 0 || f.Ino == 0 || fl&^FlagClosed != 0 || le.Uint32(e[20:]) != 0 || seen[f.Blob] {
			return nil, fmt.Errorf("%w: batch file %d: blob %d, inode %d, flags %#x", ErrMalformed, i, f.Blob, f.Ino, fl)
		}
		seen[f.Blob] = true
		f.Closed = fl&FlagClosed != 0
		b.Files = append(b.Files, f)
	}
	return b, nil
}

// Report is what OpCheckpoint writes of a file made durable at home:
//
//	0  i64 size   8  i64 mtime ns (0: no write known to io; keep the
//	                 recorded one)   16  u64 data version (nonzero)
type Report struct {
	Size, Mtime int64
	DV          uint64
}

// Encode writes r into dst (ReportSize bytes).
func (r Report) Encode(dst []byte) {
	le := binary.LittleEndian
	le.PutUint64(dst[0:], uint64(r.Size))
	le.PutUint64(dst[8:], uint64(r.Mtime))
	le.PutUint64(dst[16:], r.DV)
}

// DecodeReport reads a report.
func DecodeReport(src []byte) (Report, error) {
	if len(src) < ReportSize {
		return Report{}, fmt.Errorf("%w: report of %d bytes", ErrMalformed, len(src))
	}
	le := binary.LittleEndian
	r := Report{Size: int64(le.Uint64(src[0:])), Mtime: int64(le.Uint64(src[8:])), DV: le.Uint64(src[16:])}
	if r.Size < 0 || r.Mtime < 0 || r.DV == 0 {
		return Report{}, fmt.Errorf("%w: report size %d, mtime %d, data version %d", ErrMalformed, r.Size, r.Mtime, r.DV)
	}
	return r, nil
}

// EncodeInodes writes inos, 8 bytes each (OpCommit's list).
func EncodeInodes(inos []uint64) []byte {
	b := make([]byte, 8*len(inos))
	for i, v := range inos {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return b
}

// DecodeInodes reads OpCommit's list.
func DecodeInodes(src []byte) ([]uint64, error) {
	if len(src)%8 != 0 {
		return nil, fmt.Errorf("%w: inode list of %d bytes", ErrMalformed, len(src))
	}
	inos := make([]uint64, len(src)/8)
	for i := range inos {
		inos[i] = binary.LittleEndian.Uint64(src[8*i:])
	}
	return inos, nil
}
