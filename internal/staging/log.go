package staging

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// Device is what the log lives on: a preallocated file (on the file
// backend, written full of zeros at Format so that no write converts an
// unwritten extent, which costs ext4 a journal commit at fdatasync) or a
// blob. Sync makes every write that returned before it durable: one
// device flush.
type Device interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
}

// DurableWriter is a Device that can write a range and make it durable in
// one call (backend.DurableWriter): a lone append, with nothing before it
// left to flush, takes it instead of a write and a flush.
// errors.ErrUnsupported: not here (the append writes and flushes).
type DurableWriter interface {
	WriteAtDurable(p []byte, off int64) (int, error)
}

// ErrFull says the ring has no room for a record until the journal trims
// it: the caller waits (backpressure).
var ErrFull = errors.New("staging: log full")

// superblock is the state of the log that is not in its records.
//
//	 0  [8]byte magic "WSTGSB01"   8  u32 version   12  u32 block size
//	16  u64 ring blocks           24  u64 generation (the larger valid copy wins)
//	32  u64 trim lsn: every record up to it is committed elsewhere
//	40  u64 trim offset: where recovery starts, record trim lsn + 1 or the
//	    wrap marker before it
//	48  u64 epoch: the incarnation of the log that wrote this superblock
//	56  u64 trim epoch: the least epoch record trim lsn + 1 can have
//	64  u64 log identity (random at Format)
//	72  u32 crc32c of the superblock's 4096 bytes (this field 0)
type superblock struct {
	ringBlocks uint64
	gen        uint64
	trimLSN    uint64
	trimOff    uint64
	epoch      uint64
	trimEpoch  uint64
	log        uint64
}

func (s superblock) encode() []byte {
	b := make([]byte, SuperSize)
	copy(b, superMagic[:])
	le := binary.LittleEndian
	le.PutUint32(b[8:], Version)
	le.PutUint32(b[12:], BlockSize)
	le.PutUint64(b[16:], s.ringBlocks)
	le.PutUint64(b[24:], s.gen)
	le.PutUint64(b[32:], s.trimLSN)
	le.PutUint64(b[40:], s.trimOff)
	le.PutUint64(b[48:], s.epoch)
	le.PutUint64(b[56:], s.trimEpoch)
	le.PutUint64(b[64:], s.log)
	le.PutUint32(b[72:], checksum(b))
	return b
}

func decodeSuper(b []byte) (superblock, error) {
	if len(b) != SuperSize || [8]byte(b[:8]) != superMagic {
		return superblock{}, errors.New("no superblock magic")
	}
	le := binary.LittleEndian
	sum := le.Uint32(b[72:])
	c := append([]byte(nil), b...)
	le.PutUint32(c[72:], 0)
	if checksum(c) != sum {
		return superblock{}, errors.New("superblock checksum mismatch")
	}
	if v, bs := le.Uint32(b[8:]), le.Uint32(b[12:]); v != Version || bs != BlockSize {
		return superblock{}, fmt.Errorf("superblock version %d, block size %d", v, bs)
	}
	s := superblock{ringBlocks: le.Uint64(b[16:]), gen: le.Uint64(b[24:]), trimLSN: le.Uint64(b[32:]), trimOff: le.Uint64(b[40:]),
		epoch: le.Uint64(b[48:]), trimEpoch: le.Uint64(b[56:]), log: le.Uint64(b[64:])}
	if s.ringBlocks < 2 || s.ringBlocks > 1<<40 || s.trimOff%BlockSize != 0 || s.trimOff >= s.ringBlocks*BlockSize ||
		s.trimLSN >= 1<<62 || s.epoch >= 1<<62 || s.trimEpoch > s.epoch {
		return superblock{}, fmt.Errorf("superblock: %d ring blocks, trim offset %d, trim lsn %d, epochs %d and %d",
			s.ringBlocks, s.trimOff, s.trimLSN, s.epoch, s.trimEpoch)
	}
	return s, nil
}

// Format writes a new, empty log of ringBlocks blocks on dev: the whole
// ring as zeros (written blocks), then both superblocks, then a flush.
func Format(dev Device, ringBlocks uint64) error {
	if ringBlocks < 2 || ringBlocks > 1<<40 {
		return fmt.Errorf("staging: a ring of %d blocks", ringBlocks)
	}
	zero := make([]byte, 1<<20)
	for off := int64(0); off < int64(ringBlocks)*BlockSize; off += int64(len(zero)) {
		n := min(int64(len(zero)), int64(ringBlocks)*BlockSize-off)
		if _, err := dev.WriteAt(zero[:n], RingOffset+off); err != nil {
			return fmt.Errorf("staging: format: %w", err)
		}
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return fmt.Errorf("staging: format: %w", err)
	}
	for _, gen := range []uint64{2, 1} {
		sb := superblock{ringBlocks: ringBlocks, gen: gen, epoch: 1, trimEpoch: 1, log: binary.LittleEndian.Uint64(id[:])}
		if _, err := dev.WriteAt(sb.encode(), int64(gen%2)*SuperSize); err != nil {
			return fmt.Errorf("staging: format: %w", err)
		}
	}
	if err := dev.Sync(); err != nil {
		return fmt.Errorf("staging: format: sync: %w", err)
	}
	return nil
}

// live is a record in the ring not trimmed yet.
type live struct {
	lsn   uint64
	off   int64 // ring offset
	epoch uint64
}

// Log is an open staging log. Append is safe from any number of
// goroutines: concurrent appends share flushes (group commit), and a lone
// one is flushed at once (no timer).
type Log struct {
	dev  Device
	ring int64 // ring bytes

	mu      sync.Mutex
	cond    *sync.Cond
	sb      superblock
	head    int64  // ring offset of the next record
	next    uint64 // next LSN
	live    []live // oldest first: they and head bound the ring's used part
	written uint64 // every LSN up to it is written (not yet durable, maybe)
	done    map[uint64]bool
	durable uint64
	flush   bool  // a flush is running
	err     error // sticky: a failed write or flush fails every later append
	// lone: an append writing its record with WriteAtDurable is under
	// way; noLone: the device has no WriteAtDurable (or refused it).
	lone, noLone bool

	// Flushes counts device flushes (Sync) of appends, lone durable
	// writes included; LoneWrites those.
	Flushes, LoneWrites atomic.Uint64
}

// Open recovers the log on dev: the live records (after the trim point)
// that are whole, in LSN order, up to the first block that does not hold
// the next one (a torn or zeroed tail, or an older lap's bytes) or that an
// earlier incarnation wrote after a later one's record (its unflushed
// write, reached again by chance). Then it starts a new incarnation: the
// next epoch, written into both superblocks (two writes and flushes), so
// that what this one writes is told from what earlier ones left. The
// records' Data have buffers of their own.
func Open(dev Device) (*Log, []Record, error) {
	l, recs, err := scan(dev)
	if err != nil {
		return nil, nil, err
	}
	// A new incarnation, in both superblocks: were the newer one damaged
	// later, the other would still hold this epoch, and no later
	// incarnation could take it again.
	if l.sb.epoch+1 >= 1<<62 {
		return nil, nil, fmt.Errorf("staging: epoch %d: out of epochs", l.sb.epoch)
	}
	next := l.sb
	next.epoch++
	for range 2 {
		next.gen++
		if err := l.writeSuper(next); err != nil {
			return nil, nil, err
		}
	}
	return l, recs, nil
}

// Inspect reads the log as Open does and writes nothing (weir check): the
// records recovery would return, and the log's state.
func Inspect(dev Device) ([]Record, Stats, error) {
	l, recs, err := scan(dev)
	if err != nil {
		return nil, Stats{}, err
	}
	return recs, l.Stats(), nil
}

// scan reads the superblocks and the live chain of records.
func scan(dev Device) (*Log, []Record, error) {
	sb, err := readSuper(dev)
	if err != nil {
		return nil, nil, err
	}
	l := &Log{dev: dev, ring: int64(sb.ringBlocks) * BlockSize, sb: sb, done: map[uint64]bool{}}
	l.cond = sync.NewCond(&l.mu)
	var recs []Record
	// The epoch floor: no record of the live chain is older than the one
	// before it, and the first no older than the trim point says.
	off, lsn, epoch := int64(sb.trimOff), sb.trimLSN+1, sb.trimEpoch
	hdr := make([]byte, BlockSize)
	for scanned := int64(0); scanned <= l.ring; {
		if off == l.ring {
			off = 0
		}
		if _, err := dev.ReadAt(hdr, RingOffset+off); err != nil {
			return nil, nil, fmt.Errorf("staging: read at %d: %w", off, err)
		}
		h, err := peek(hdr)
		if err != nil || h.lsn != lsn || h.log != sb.log || h.epoch < epoch || h.epoch > sb.epoch {
			break
		}
		size := int64(h.blocks) * BlockSize
		if h.typ == TypeWrap {
			if off == 0 {
				break // a wrap at the start would loop
			}
			if _, wrap, err := Decode(hdr); err != nil || !wrap {
				break
			}
			scanned += l.ring - off
			off, epoch = 0, h.epoch
			continue
		}
		if off+size > l.ring {
			break
		}
		b := make([]byte, size)
		copy(b, hdr)
		if size > BlockSize {
			if _, err := dev.ReadAt(b[BlockSize:], RingOffset+off+BlockSize); err != nil {
				return nil, nil, fmt.Errorf("staging: read at %d: %w", off, err)
			}
		}
		rec, _, err := Decode(b)
		if err != nil {
			break
		}
		recs = append(recs, rec)
		l.live = append(l.live, live{lsn: lsn, off: off, epoch: h.epoch})
		scanned += size
		off += size
		lsn++
		epoch = h.epoch
	}
	if off == l.ring {
		off = 0
	}
	l.head, l.next = off, lsn
	l.written, l.durable = lsn-1, lsn-1
	return l, recs, nil
}

// usedLocked is the ring bytes from the trim offset, where recovery
// starts (the oldest live record, or a wrap marker before it), to head.
func (l *Log) usedLocked() int64 {
	if d := (l.head - int64(l.sb.trimOff) + l.ring) % l.ring; d != 0 || len(l.live) == 0 {
		return d
	}
	return l.ring // head came round to the trim offset: full
}

// writeSuper writes sb into the superblock slot its generation picks (the
// other one keeps the last state until this one is durable), flushes, and
// makes it the log's.
func (l *Log) writeSuper(sb superblock) error {
	if _, err := l.dev.WriteAt(sb.encode(), int64(sb.gen%2)*SuperSize); err != nil {
		return fmt.Errorf("staging: write superblock: %w", err)
	}
	if err := l.dev.Sync(); err != nil {
		return fmt.Errorf("staging: flush superblock: %w", err)
	}
	l.sb = sb
	return nil
}

func readSuper(dev Device) (superblock, error) {
	var best superblock
	var errs []error
	found := false
	for i := range 2 {
		b := make([]byte, SuperSize)
		if _, err := dev.ReadAt(b, int64(i)*SuperSize); err != nil {
			errs = append(errs, err)
			continue
		}
		s, err := decodeSuper(b)
		if err != nil {
			errs = append(errs, fmt.Errorf("superblock %c: %w", 'A'+i, err))
			continue
		}
		if !found || s.gen > best.gen {
			best, found = s, true
		}
	}
	if !found {
		return superblock{}, fmt.Errorf("staging: no valid superblock: %w", errors.Join(errs...))
	}
	return best, nil
}

// Append writes r (its LSN is the log's to give: r.LSN is ignored) and
// returns once it is durable, with its LSN. ErrFull: no room until a trim.
// A failed write or flush is sticky: this and every later append fail.
func (l *Log) Append(r *Record) (uint64, error) {
	blocks, err := r.Blocks()
	if err != nil {
		return 0, err
	}
	if pages, _ := pagesOf(r.Extents); uint64(len(r.Data)) != pages*PageSize || r.Size < 0 {
		return 0, fmt.Errorf("staging: %d data bytes for %d pages, size %d", len(r.Data), pages, r.Size)
	}
	size := int64(blocks) * BlockSize
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return 0, l.err
	}
	head := l.head
	off, err := l.reserveLocked(size)
	if err != nil {
		l.mu.Unlock()
		return 0, err
	}
	lsn, epoch, logID := l.next, l.sb.epoch, l.sb.log
	l.next++
	l.live = append(l.live, live{lsn: lsn, off: off, epoch: epoch})
	// Alone: every record before it durable, no flush or lone write
	// under way, and no wrap marker written for it (a buffered write its
	// own flush would not cover). Its one durable write is then its
	// flush too: recovery finds every record before it, and it.
	dw, _ := l.dev.(DurableWriter)
	lone := dw != nil && !l.noLone && !l.flush && !l.lone && l.durable == lsn-1 && l.written == lsn-1 && off == head
	if lone {
		l.lone = true
	}
	l.mu.Unlock()

	rec := *r
	rec.LSN, rec.Epoch, rec.Log = lsn, epoch, logID
	bp := getRecordBuf(size)
	defer putRecordBuf(bp)
	buf, err := rec.Encode((*bp)[:0])
	if err == nil && lone {
		_, err = dw.WriteAtDurable(buf, RingOffset+off)
		if errors.Is(err, errors.ErrUnsupported) {
			lone = false
			l.mu.Lock()
			l.lone, l.noLone = false, true
			l.mu.Unlock()
			err = nil
		}
		if lone {
			return l.loneDone(lsn, err)
		}
	}
	if err == nil {
		_, err = l.dev.WriteAt(buf, RingOffset+off)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failLocked(fmt.Errorf("staging: write record %d: %w", lsn, err))
		return 0, l.err
	}
	l.writtenLocked(lsn)
	l.cond.Broadcast()
	for l.durable < lsn {
		switch {
		case l.err != nil:
			return 0, l.err
		case !l.flush && l.written >= lsn:
			// Lead a flush of everything written so far: the appends
			// waiting meanwhile share it.
			l.flush = true
			target := l.written
			l.mu.Unlock()
			err := l.dev.Sync()
			l.mu.Lock()
			l.flush = false
			l.Flushes.Add(1)
			if err != nil {
				l.failLocked(fmt.Errorf("staging: flush: %w", err))
				return 0, l.err
			}
			l.durable = max(l.durable, target)
			l.cond.Broadcast()
		default:
			l.cond.Wait()
		}
	}
	return lsn, nil
}

// loneDone ends a lone append (Append) whose durable write returned err:
// written and durable at once, or the log failed.
func (l *Log) loneDone(lsn uint64, err error) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lone = false
	l.Flushes.Add(1)
	l.LoneWrites.Add(1)
	if err != nil {
		l.failLocked(fmt.Errorf("staging: write record %d durably: %w", lsn, err))
		return 0, l.err
	}
	l.writtenLocked(lsn)
	l.durable = max(l.durable, lsn)
	l.cond.Broadcast()
	return lsn, nil
}

// writtenLocked records that lsn's record is written, and moves written
// past every record written without a gap.
func (l *Log) writtenLocked(lsn uint64) {
	l.done[lsn] = true
	for l.done[l.written+1] {
		delete(l.done, l.written+1)
		l.written++
	}
}

// recordBufs holds record buffers up to recordBufSize, so that an append
// allocates nothing in the common case (the GC of one buffer an fsync
// showed in io's profile).
const recordBufSize = 256 << 10

var recordBufs = sync.Pool{New: func() any { b := make([]byte, recordBufSize); return &b }}

func getRecordBuf(size int64) *[]byte {
	if size > recordBufSize {
		b := make([]byte, size)
		return &b
	}
	return recordBufs.Get().(*[]byte)
}

func putRecordBuf(b *[]byte) {
	if cap(*b) == recordBufSize {
		recordBufs.Put(b)
	}
}

func (l *Log) failLocked(err error) {
	if l.err == nil {
		l.err = err
	}
	l.cond.Broadcast()
}

// reserveLocked finds room for size bytes at head, writing a wrap marker
// first when the record does not fit before the ring's end, and returns
// the record's ring offset.
func (l *Log) reserveLocked(size int64) (int64, error) {
	if size > l.ring-BlockSize {
		return 0, fmt.Errorf("staging: a record of %d bytes in a ring of %d", size, l.ring)
	}
	off, waste := l.head, int64(0)
	if off+size > l.ring {
		waste, off = l.ring-off, 0
	}
	if l.usedLocked()+waste+size > l.ring {
		if len(l.live) > 0 {
			return 0, ErrFull // the journal's trims make room
		}
		// Nothing is live, but what recovery reads from the trim offset
		// leaves no room this large: start the ring over at 0.
		sb := l.sb
		sb.gen++
		sb.trimOff, sb.trimEpoch = 0, sb.epoch
		if err := l.writeSuper(sb); err != nil {
			l.failLocked(err)
			return 0, l.err
		}
		l.head, off, waste = 0, 0, 0
	}
	if waste > 0 {
		// The marker carries the LSN of the record that follows it, at
		// the ring's start.
		if _, err := l.dev.WriteAt(encodeWrap(l.next, l.sb.epoch, l.sb.log), RingOffset+l.head); err != nil {
			l.failLocked(fmt.Errorf("staging: write wrap marker: %w", err))
			return 0, l.err
		}
	}
	l.head = off + size
	if l.head == l.ring {
		l.head = 0
	}
	return off, nil
}

// Trim drops the records up to lsn, which the journal has committed: their
// room is free again. It writes the other superblock and flushes. Only
// durable records can be trimmed.
func (l *Log) Trim(lsn uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if lsn > l.durable {
		return fmt.Errorf("staging: trim to %d past the durable %d", lsn, l.durable)
	}
	if lsn <= l.sb.trimLSN {
		return nil
	}
	i := 0
	for i < len(l.live) && l.live[i].lsn <= lsn {
		i++
	}
	sb := l.sb
	sb.gen++
	sb.trimLSN = lsn
	sb.trimOff, sb.trimEpoch = uint64(l.head), sb.epoch
	if i < len(l.live) {
		sb.trimOff, sb.trimEpoch = uint64(l.live[i].off), l.live[i].epoch
	}
	if err := l.writeSuper(sb); err != nil {
		l.failLocked(err)
		return l.err
	}
	l.live = l.live[i:]
	return nil
}

// Stats is what the log holds.
type Stats struct {
	NextLSN, DurableLSN, TrimLSN uint64
	Live                         int // records not trimmed
	UsedBytes, RingBytes         int64
	Err                          error
}

// Stats returns the log's state now.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{NextLSN: l.next, DurableLSN: l.durable, TrimLSN: l.sb.trimLSN, Live: len(l.live), UsedBytes: l.usedLocked(), RingBytes: l.ring, Err: l.err}
}
