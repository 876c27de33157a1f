// Package wal is the metadata store's write-ahead log: checksummed records
// in segment files named by their first LSN, group commit of concurrent
// writers onto one fsync, and recovery that cuts a torn tail and refuses
// corruption. The byte layout is specified in the package comment of
// services/metadata/ns; this package implements it.
//
// Recovery rules. Records must carry consecutive LSNs across all segments.
// A record that fails to decode (short, zeroed, bad length, bad checksum)
// is a torn write if nothing valid follows it in the segment: the segment
// is cut there. If a valid record follows it, or it sits in a segment that
// is not the last one, it is corruption and Recover fails naming the file
// and offset. Rotate flushes the old segment before the next one is
// created, so only the last segment can legitimately end torn.
package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/vfs"
)

// Format constants (version 1).
const (
	// Version is the segment format version written in every header.
	Version = 1
	// SegmentHeaderSize is the size of the header at the start of a segment.
	SegmentHeaderSize = 32
	// RecordHeaderSize is length, checksum, LSN and type: the bytes before
	// a record's payload.
	RecordHeaderSize = 17
	// MaxRecordLen bounds the length field (LSN + type + payload).
	MaxRecordLen = 64 << 10
	// DefaultSegmentSize is the size after which Append starts a new segment.
	DefaultSegmentSize = 64 << 20
)

var (
	segMagic   = [8]byte{'w', 'e', 'i', 'r', 'w', 'a', 'l', 0}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	// ErrClosed is returned after Close or Abandon.
	ErrClosed = errors.New("wal closed")
)

// Checksum is CRC-32C (Castagnoli), the checksum of every WAL and
// checkpoint structure.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// CorruptError reports damage that is not a torn tail.
type CorruptError struct {
	File   string // path of the damaged file
	Offset int64  // byte offset of the first bad byte found
	Reason string
}

// Error names the file, the offset and what is wrong.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("corrupt WAL segment %s at offset %d: %s", e.File, e.Offset, e.Reason)
}

// Record is one decoded log record.
type Record struct {
	LSN     uint64
	Type    uint8
	Payload []byte
}

// SegmentName is the file name of the segment whose first record has LSN first.
func SegmentName(first uint64) string { return fmt.Sprintf("wal-%020d.log", first) }

// ParseSegmentName returns the first LSN encoded in a segment file name.
func ParseSegmentName(name string) (uint64, bool) {
	if len(name) != 28 || !strings.HasPrefix(name, "wal-") || !strings.HasSuffix(name, ".log") {
		return 0, false
	}
	v, err := strconv.ParseUint(name[4:24], 10, 64)
	return v, err == nil
}

// AppendRecord appends the encoding of one record to dst.
func AppendRecord(dst []byte, lsn uint64, typ uint8, payload []byte) []byte {
	n := 9 + len(payload)
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(n))
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, lsn)
	dst = append(dst, typ)
	dst = append(dst, payload...)
	binary.LittleEndian.PutUint32(dst[start+4:], Checksum(dst[start+8:]))
	return dst
}

// segmentHeader encodes the header of the segment starting at first.
func segmentHeader(first uint64) []byte {
	b := make([]byte, SegmentHeaderSize)
	copy(b, segMagic[:])
	binary.LittleEndian.PutUint32(b[8:], Version)
	binary.LittleEndian.PutUint32(b[12:], SegmentHeaderSize)
	binary.LittleEndian.PutUint64(b[16:], first)
	binary.LittleEndian.PutUint32(b[24:], Checksum(b[:24]))
	return b
}

// decodeAt decodes the record at off. On failure it returns a reason.
func decodeAt(data []byte, off int) (Record, int, string) {
	if len(data)-off < 8 {
		return Record{}, 0, "truncated record header"
	}
	n := int(binary.LittleEndian.Uint32(data[off:]))
	if n < 9 || n > MaxRecordLen {
		return Record{}, 0, fmt.Sprintf("invalid record length %d", n)
	}
	if len(data)-off-8 < n {
		return Record{}, 0, fmt.Sprintf("truncated record (length %d, %d bytes left)", n, len(data)-off-8)
	}
	body := data[off+8 : off+8+n]
	if Checksum(body) != binary.LittleEndian.Uint32(data[off+4:]) {
		return Record{}, 0, "checksum mismatch"
	}
	return Record{
		LSN:     binary.LittleEndian.Uint64(body),
		Type:    body[8],
		Payload: body[9:],
	}, 8 + n, ""
}

// findValid returns the offset of the first record at or after from that
// decodes and carries a plausible LSN (at least minLSN), or -1.
func findValid(data []byte, from int, minLSN uint64) int {
	for o := from; o+RecordHeaderSize <= len(data); o++ {
		n := int(binary.LittleEndian.Uint32(data[o:]))
		if n < 9 || n > MaxRecordLen || len(data)-o-8 < n {
			continue
		}
		lsn := binary.LittleEndian.Uint64(data[o+8:])
		if lsn < minLSN || lsn-minLSN > 1<<32 {
			continue
		}
		if Checksum(data[o+8:o+8+n]) == binary.LittleEndian.Uint32(data[o+4:]) {
			return o
		}
	}
	return -1
}

// scanned is the result of reading one segment.
type scanned struct {
	path      string
	first     uint64
	recs      []Record
	end       int64  // length of the valid prefix
	badHeader string // non-empty: the header is short or invalid (torn if nothing follows)
	torn      string // non-empty: why the bytes after end were dropped
}

// scanSegment decodes a whole segment. It returns a *CorruptError for
// damage that a crash cannot explain.
func scanSegment(path string, data []byte, first uint64) (scanned, error) {
	s := scanned{path: path, first: first}
	h := data
	if len(h) >= SegmentHeaderSize {
		h = h[:SegmentHeaderSize]
	}
	switch {
	case len(h) < SegmentHeaderSize:
		s.badHeader = fmt.Sprintf("short header (%d bytes)", len(h))
	case [8]byte(h[:8]) != segMagic || Checksum(h[:24]) != binary.LittleEndian.Uint32(h[24:]):
		s.badHeader = "invalid header"
	case binary.LittleEndian.Uint32(h[8:]) != Version:
		return s, &CorruptError{path, 8, fmt.Sprintf("unsupported segment version %d", binary.LittleEndian.Uint32(h[8:]))}
	case binary.LittleEndian.Uint32(h[12:]) != SegmentHeaderSize:
		return s, &CorruptError{path, 12, fmt.Sprintf("unsupported header size %d", binary.LittleEndian.Uint32(h[12:]))}
	case binary.LittleEndian.Uint64(h[16:]) != first:
		return s, &CorruptError{path, 16, fmt.Sprintf("header says first LSN %d, file name says %d", binary.LittleEndian.Uint64(h[16:]), first)}
	}
	if s.badHeader != "" {
		if v := findValid(data, 1, first); v >= 0 {
			return s, &CorruptError{path, 0, fmt.Sprintf("%s, but a valid record follows at offset %d", s.badHeader, v)}
		}
		return s, nil
	}
	off, expect := SegmentHeaderSize, first
	for off < len(data) {
		rec, n, reason := decodeAt(data, off)
		if reason != "" {
			if v := findValid(data, off+1, expect); v >= 0 {
				return s, &CorruptError{path, int64(off), fmt.Sprintf("%s, but a valid record follows at offset %d", reason, v)}
			}
			s.torn = reason
			break
		}
		if rec.LSN != expect {
			return s, &CorruptError{path, int64(off), fmt.Sprintf("record has LSN %d, want %d", rec.LSN, expect)}
		}
		s.recs = append(s.recs, rec)
		off += n
		expect++
	}
	s.end = int64(off)
	return s, nil
}

// Options configures Recover.
type Options struct {
	FS          vfs.FS
	Dir         string
	SegmentSize int64        // start a new segment past this size; 0 means DefaultSegmentSize
	Logger      hclog.Logger // never nil
	// ReadOnly makes Recover change nothing on disk: a torn tail is
	// reported and skipped, not cut, and the Writer it returns refuses
	// every append and flush with ErrReadOnly (an offline check).
	ReadOnly bool
}

// ErrReadOnly is the sticky failure of a Writer recovered read-only.
var ErrReadOnly = errors.New("wal opened read-only")

// Recover reads the log in o.Dir, passes every record with an LSN above
// after to apply, in order, cuts a torn tail, makes what remains durable and
// returns a Writer that appends after the last valid record. The log must
// reach back to LSN after+1: the segment holding it must exist.
func Recover(o Options, after uint64, apply func(Record) error) (*Writer, error) {
	if o.SegmentSize <= 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	names, err := o.FS.List(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", o.Dir, err)
	}
	var firsts []uint64
	for _, n := range names {
		if v, ok := ParseSegmentName(n); ok {
			firsts = append(firsts, v)
		}
	}
	sort.Slice(firsts, func(i, j int) bool { return firsts[i] < firsts[j] })
	w := &Writer{o: o, segs: firsts}
	w.cond.L = &w.mu
	if len(firsts) == 0 {
		return nil, fmt.Errorf("WAL in %s is missing: the checkpoint covers LSN %d but no segment exists", o.Dir, after)
	}
	s := -1
	for i, f := range firsts {
		if f <= after+1 {
			s = i
		}
	}
	if s < 0 {
		return nil, fmt.Errorf("WAL in %s starts at LSN %d, but the checkpoint covers only up to %d: records are missing", o.Dir, firsts[0], after)
	}
	expect := firsts[s]
	var last scanned
	for i := s; i < len(firsts); i++ {
		path := filepath.Join(o.Dir, SegmentName(firsts[i]))
		if firsts[i] != expect {
			return nil, &CorruptError{path, 0, fmt.Sprintf("segment starts at LSN %d but the previous one ends at %d: records are missing", firsts[i], expect-1)}
		}
		data, err := o.FS.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		sc, err := scanSegment(path, data, firsts[i])
		if err != nil {
			return nil, err
		}
		if (sc.badHeader != "" || sc.torn != "") && i != len(firsts)-1 {
			return nil, &CorruptError{path, sc.end, fmt.Sprintf("%s%s in a segment that is not the last one", sc.badHeader, sc.torn)}
		}
		for _, r := range sc.recs {
			if r.LSN > after {
				if err := apply(r); err != nil {
					return nil, fmt.Errorf("replay LSN %d (type %d) from %s: %w", r.LSN, r.Type, path, err)
				}
			}
		}
		expect += uint64(len(sc.recs))
		last = sc
	}
	if expect < after+1 {
		return nil, fmt.Errorf("WAL in %s ends at LSN %d, but the checkpoint covers up to %d: segment %s is missing", o.Dir, expect-1, after, SegmentName(after+1))
	}
	if o.ReadOnly {
		if last.badHeader != "" || last.torn != "" {
			o.Logger.Info("read-only: the WAL ends torn; the tail is skipped, not cut", "file", last.path,
				"offset", last.end, "reason", last.badHeader+last.torn)
		}
		w.next, w.synced, w.closed = expect, expect-1, true
		w.err = ErrReadOnly
		return w, nil
	}
	if last.badHeader != "" {
		o.Logger.Warn("removing WAL segment with a torn header", "file", last.path, "reason", last.badHeader)
		if err := o.FS.Remove(last.path); err != nil {
			return nil, err
		}
		w.segs = w.segs[:len(w.segs)-1]
		return w, w.start(expect)
	}
	f, err := o.FS.OpenAppend(last.path)
	if err != nil {
		return nil, err
	}
	if last.torn != "" {
		o.Logger.Warn("truncating torn WAL tail", "file", last.path, "offset", last.end, "reason", last.torn)
		if err := f.Truncate(last.end); err != nil {
			f.Close()
			return nil, fmt.Errorf("truncate %s: %w", last.path, err)
		}
	}
	// The replayed records may sit only in the page cache after a SIGKILL:
	// flush them before anything new is acknowledged after them.
	if err := vfs.Sync(f); err != nil {
		f.Close()
		return nil, err
	}
	w.f, w.size, w.next, w.synced = f, last.end, expect, expect-1
	return w, nil
}

// Create starts a new log in an empty o.Dir whose first record will have
// LSN first.
func Create(o Options, first uint64) (*Writer, error) {
	if o.SegmentSize <= 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	w := &Writer{o: o}
	w.cond.L = &w.mu
	if err := w.start(first); err != nil {
		return nil, err
	}
	return w, nil
}

// OnlyEmptyFirstSegment reports whether the log in o.Dir is exactly one
// segment starting at LSN 1 that holds no record: what a crash during
// Create followed by nothing leaves.
func OnlyEmptyFirstSegment(o Options) (bool, error) {
	names, err := o.FS.List(o.Dir)
	if err != nil {
		return false, err
	}
	var segs []string
	for _, n := range names {
		if _, ok := ParseSegmentName(n); ok {
			segs = append(segs, n)
		}
	}
	if len(segs) != 1 || segs[0] != SegmentName(1) {
		return false, nil
	}
	path := filepath.Join(o.Dir, segs[0])
	data, err := o.FS.ReadFile(path)
	if err != nil {
		return false, err
	}
	sc, err := scanSegment(path, data, 1)
	return err == nil && len(sc.recs) == 0, nil
}

// Writer appends records to the log. Append and Rotate must not run
// concurrently with each other (the namespace lock orders them); Append may
// run concurrently with WaitDurable, and WaitDurable with itself: that is
// the group commit.
type Writer struct {
	o Options // immutable after Recover

	// syncMu is held while the current segment is being flushed or
	// replaced, so a flush never sees a file that is being closed.
	syncMu sync.Mutex

	mu      sync.Mutex
	cond    sync.Cond // signalled on changes of synced, syncing, err; L is &mu
	f       vfs.File  // current segment; protected by mu, replaced only with syncMu held too
	size    int64     // bytes in the current segment; protected by mu
	segs    []uint64  // first LSNs of the segments on disk, ascending; protected by mu
	next    uint64    // LSN of the next record; protected by mu
	synced  uint64    // every record up to this LSN is durable; protected by mu
	syncing bool      // a WaitDurable leader is flushing; protected by mu
	err     error     // sticky failure; protected by mu
	buf     []byte    // encoding buffer; protected by mu
	closed  bool      // protected by mu
	// room is the end of the current segment's reserved room (roomAhead);
	// noRotate is the size of the current segment at which Rotate last
	// found no room for a new one: it is not tried again before the
	// segment has grown by a tenth of SegmentSize. Both protected by mu.
	room     int64
	noRotate int64
}

// The room kept reserved ahead of the current segment's end (vfs.Allocator):
// when the store fills up, the records that free room (an unlink, a
// truncate) still find some. Topped up to roomAhead once less than roomLow
// is left.
const (
	roomAhead = 1 << 20
	roomLow   = 256 << 10
)

// errSegmentNoRoom marks a new segment that could not be created or
// written for want of room (no flush had failed): Rotate keeps the current
// segment.
var errSegmentNoRoom = errors.New("no room for a new segment")

// isNoSpace reports whether err is the store out of room (ENOSPC, EDQUOT).
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// reserveLocked tops up the current segment's reserved room. mu is held.
func (w *Writer) reserveLocked() {
	if w.room-w.size >= roomLow {
		return
	}
	if a, ok := w.f.(vfs.Allocator); ok && a.Allocate(w.size, roomAhead) == nil {
		w.room = w.size + roomAhead
	}
}

// start creates the first segment of a writer.
func (w *Writer) start(first uint64) error {
	f, err := w.createSegment(first)
	if err != nil {
		return err
	}
	w.f, w.size, w.next, w.synced = f, SegmentHeaderSize, first, first-1
	w.room, w.noRotate = 0, 0
	w.reserveLocked()
	w.segs = append(w.segs, first)
	return nil
}

// createSegment creates the segment file for first, writes and flushes its
// header and flushes the directory, so the segment exists after a crash.
func (w *Writer) createSegment(first uint64) (vfs.File, error) {
	path := filepath.Join(w.o.Dir, SegmentName(first))
	f, err := w.o.FS.Create(path)
	if err != nil {
		if isNoSpace(err) {
			err = fmt.Errorf("%w: %w", errSegmentNoRoom, err)
		}
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := f.Write(segmentHeader(first)); err != nil {
		f.Close()
		if isNoSpace(err) {
			err = fmt.Errorf("%w: %w", errSegmentNoRoom, err)
		}
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if err := vfs.Sync(f); err != nil {
		f.Close()
		return nil, err
	}
	if err := w.o.FS.SyncDir(w.o.Dir); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// failLocked records a sticky failure.
func (w *Writer) failLocked(err error) {
	if w.err == nil {
		w.err = err
	}
	w.cond.Broadcast()
}

// Fail makes err the writer's sticky failure (first one wins), for failures
// found outside the log that must stop all further writes.
func (w *Writer) Fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failLocked(err)
}

// Err returns the sticky failure, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Append writes one record to the current segment (not yet durable) and
// returns its LSN. A failure is sticky (a partly written record can only
// be followed by a recovery), but for a store out of room: the record's
// bytes are cut off again and Append fails alone with ENOSPC, so that the
// log goes on once room is freed.
func (w *Writer) Append(typ uint8, payload []byte) (uint64, error) {
	if 9+len(payload) > MaxRecordLen {
		return 0, fmt.Errorf("record of %d bytes exceeds the maximum", len(payload))
	}
	w.mu.Lock()
	full := w.size >= w.o.SegmentSize && w.size >= w.noRotate+w.o.SegmentSize/10
	w.mu.Unlock()
	if full {
		if err := w.Rotate(); err != nil {
			return 0, err
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	lsn := w.next
	w.buf = AppendRecord(w.buf[:0], lsn, typ, payload)
	n, err := w.f.Write(w.buf)
	if err == nil && n != len(w.buf) {
		err = errors.New("short write")
	}
	if err != nil {
		if isNoSpace(err) && (n == 0 || w.f.Truncate(w.size) == nil) {
			return 0, fmt.Errorf("write %s: %w", w.f.Name(), err)
		}
		w.failLocked(fmt.Errorf("write %s: %w", w.f.Name(), err))
		return 0, w.err
	}
	w.next++
	w.size += int64(n)
	w.reserveLocked()
	return lsn, nil
}

// LastLSN is the LSN of the last record appended (or recovered).
func (w *Writer) LastLSN() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next - 1
}

// Pending reports whether records are waiting for a flush.
func (w *Writer) Pending() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced < w.next-1 && w.err == nil
}

// WaitDurable returns once the record with LSN lsn is durable. Concurrent
// callers share flushes: the first becomes the leader and flushes
// everything appended so far; the others wait, and one of those still
// uncovered leads the next flush.
func (w *Writer) WaitDurable(lsn uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if w.synced >= lsn {
			return nil
		}
		if w.err != nil {
			return w.err
		}
		if w.syncing {
			w.cond.Wait()
			continue
		}
		w.syncing = true
		w.mu.Unlock()
		w.syncMu.Lock()
		w.mu.Lock()
		target, f := w.next-1, w.f
		w.mu.Unlock()
		var err error
		if f == nil {
			err = ErrClosed
		} else {
			err = vfs.Sync(f)
		}
		w.syncMu.Unlock()
		w.mu.Lock()
		w.syncing = false
		if err != nil {
			w.failLocked(err)
		} else if target > w.synced {
			w.synced = target
		}
		w.cond.Broadcast()
	}
}

// SyncAll makes every record appended so far durable.
func (w *Writer) SyncAll() error { return w.WaitDurable(w.LastLSN()) }

// Rotate flushes the current segment and starts a new one at the next LSN,
// so that older segments can later be removed whole. It does nothing if
// the current segment holds no record.
func (w *Writer) Rotate() error {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	w.mu.Lock()
	if w.err != nil {
		defer w.mu.Unlock()
		return w.err
	}
	if w.segs[len(w.segs)-1] == w.next {
		w.mu.Unlock()
		return nil
	}
	old, target, next := w.f, w.next-1, w.next
	w.mu.Unlock()
	err := vfs.Sync(old)
	var nf vfs.File
	if err == nil {
		nf, err = w.createSegment(next)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if errors.Is(err, errSegmentNoRoom) {
		// No room for a new segment: the current one goes on (its old
		// records were flushed above), and a new one is tried later.
		_ = w.o.FS.Remove(filepath.Join(w.o.Dir, SegmentName(next)))
		w.noRotate = w.size
		if target > w.synced {
			w.synced = target
		}
		w.cond.Broadcast()
		return nil
	}
	if err != nil {
		w.failLocked(err)
		return w.err
	}
	w.f, w.size, w.room, w.noRotate = nf, SegmentHeaderSize, 0, 0
	w.reserveLocked()
	w.segs = append(w.segs, next)
	if target > w.synced {
		w.synced = target
	}
	w.cond.Broadcast()
	old.Close()
	return nil
}

// RemoveObsolete deletes the segments whose records all have LSNs at most
// upTo. The current segment is never removed.
func (w *Writer) RemoveObsolete(upTo uint64) error {
	w.mu.Lock()
	var victims []uint64
	for len(w.segs) > 1 && w.segs[1] <= upTo+1 {
		victims = append(victims, w.segs[0])
		w.segs = w.segs[1:]
	}
	w.mu.Unlock()
	var errs []error
	for _, v := range victims {
		if err := w.o.FS.Remove(filepath.Join(w.o.Dir, SegmentName(v))); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Segments returns the first LSNs of the segments on disk, ascending.
func (w *Writer) Segments() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]uint64(nil), w.segs...)
}

// Close flushes the log and closes it. It returns the sticky failure if
// there is one.
func (w *Writer) Close() error {
	err := w.SyncAll()
	w.shut()
	if errors.Is(err, ErrClosed) {
		return nil
	}
	return err
}

// Abandon closes the log without flushing it, as a crash would.
func (w *Writer) Abandon() { w.shut() }

// shut closes the current segment and makes every later call fail.
func (w *Writer) shut() {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	w.failLocked(ErrClosed)
}
