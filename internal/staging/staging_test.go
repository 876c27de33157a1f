package staging

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
)

// op is one thing a device was asked to do: a write, or a flush (data nil).
type op struct {
	off  int64
	data []byte
}

// newLog formats a log of ring blocks on a new memDev and opens it (a new
// log recovers nothing). base is the device after Format: its ops start
// after it (Open's included), so that a test can rebuild crash images of
// what follows from base.
func newLog(t testing.TB, ring uint64) (*memDev, *Log, []byte) {
	t.Helper()
	return newLogOn(t, newMemDev(RingOffset+int64(ring)*BlockSize), ring)
}

// newLogOn is newLog on dev (a durable one's, say).
func newLogOn(t testing.TB, dev *memDev, ring uint64) (*memDev, *Log, []byte) {
	t.Helper()
	if err := Format(dev, ring); err != nil {
		t.Fatal(err)
	}
	base := bytes.Clone(dev.img)
	dev.ops = nil
	l, recs, err := Open(dev)
	if err != nil || len(recs) != 0 {
		t.Fatalf("open a new log: %d records, %v", len(recs), err)
	}
	return dev, l, base
}

// memDev is a device in memory that records every write and flush, so a
// test can rebuild what a power cut at any point would have left.
type memDev struct {
	mu       sync.Mutex
	img      []byte
	ops      []op
	syncs    int
	failNext error // the next write or flush fails with it
	// durable: WriteAtDurable is a write and a flush, in one call (else
	// ErrUnsupported, and the log writes and flushes as ever).
	durable bool
}

// WriteAtDurable is DurableWriter's: the write, then the flush, as one
// call (a power cut between them is one the cut images cover).
func (d *memDev) WriteAtDurable(p []byte, off int64) (int, error) {
	if !d.durable {
		return 0, errors.ErrUnsupported
	}
	n, err := d.WriteAt(p, off)
	if err != nil {
		return n, err
	}
	return n, d.Sync()
}

func newMemDev(size int64) *memDev { return &memDev{img: make([]byte, size)} }

func (d *memDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(d.img)) {
		return 0, fmt.Errorf("read %d@%d past the device (%d)", len(p), off, len(d.img))
	}
	return copy(p, d.img[off:]), nil
}

func (d *memDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.failNext; err != nil {
		d.failNext = nil
		return 0, err
	}
	if off < 0 || off+int64(len(p)) > int64(len(d.img)) {
		return 0, fmt.Errorf("write %d@%d past the device (%d)", len(p), off, len(d.img))
	}
	copy(d.img[off:], p)
	d.ops = append(d.ops, op{off: off, data: bytes.Clone(p)})
	return len(p), nil
}

func (d *memDev) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.failNext; err != nil {
		d.failNext = nil
		return err
	}
	d.syncs++
	d.ops = append(d.ops, op{})
	return nil
}

// flushedAfter reports whether a flush followed the write of record lsn.
func (d *memDev) flushedAfter(lsn uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	wrote := false
	for _, o := range d.ops {
		switch {
		case o.data == nil:
			if wrote {
				return true
			}
		case len(o.data) >= headerSize && [4]byte(o.data[:4]) == recordMagic && binary.LittleEndian.Uint64(o.data[8:]) == lsn &&
			binary.LittleEndian.Uint16(o.data[6:]) == TypeFile:
			wrote = true
		}
	}
	return false
}

func (d *memDev) opCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ops)
}

// cut is the device a power cut leaves after the first k ops: every write
// before the last flush among them, and of the writes after it the ones
// keep says (by index from that flush), the last of them torn after tear
// bytes when tear >= 0.
func cut(base []byte, ops []op, k int, keep func(i int) bool, tear int) *memDev {
	img := bytes.Clone(base)
	last := -1
	for i := 0; i < k; i++ {
		if ops[i].data == nil {
			last = i
		}
	}
	for i := 0; i <= last; i++ {
		if o := ops[i]; o.data != nil {
			copy(img[o.off:], o.data)
		}
	}
	lastKept := -1
	for i := last + 1; i < k; i++ {
		if keep(i - last - 1) {
			lastKept = i
		}
	}
	for i := last + 1; i < k; i++ {
		if !keep(i - last - 1) {
			continue
		}
		data := ops[i].data
		if i == lastKept && tear >= 0 && tear < len(data) {
			data = data[:tear]
		}
		copy(img[ops[i].off:], data)
	}
	return &memDev{img: img}
}

func testRecord(rng *rand.Rand, pages int) Record {
	r := Record{Blob: rng.Uint64N(100) + 1, Ino: rng.Uint64N(1000) + 1, Size: int64(rng.IntN(1 << 30)),
		MtimeNs: rng.Int64(), DataVersion: rng.Uint64(), Flags: rng.Uint64N(2)}
	first := uint64(rng.IntN(10))
	for left := pages; left > 0; {
		n := 1 + rng.IntN(left)
		r.Extents = append(r.Extents, Extent{First: first, Pages: uint32(n)})
		first += uint64(n) + uint64(rng.IntN(3))
		left -= n
	}
	r.Data = make([]byte, pages*PageSize)
	for i := range r.Data {
		r.Data[i] = byte(rng.Uint32())
	}
	return r
}

// same reports whether got is want as the log stored it (LSN, epoch and
// log identity are the log's).
func same(got, want Record) bool {
	got.LSN, got.Epoch, got.Log, want.LSN, want.Epoch, want.Log = 0, 0, 0, 0, 0, 0
	if len(got.Data) == 0 && len(want.Data) == 0 {
		got.Data, want.Data = nil, nil
	}
	return reflect.DeepEqual(got, want)
}

func TestRecordRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, pages := range []int{0, 1, 3, 40} {
		r := testRecord(rng, pages)
		r.LSN, r.Epoch, r.Log = 7, 3, 99
		b, err := r.Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(b)%BlockSize != 0 {
			t.Fatalf("%d bytes: not whole blocks", len(b))
		}
		got, wrap, err := Decode(b)
		if err != nil || wrap || !reflect.DeepEqual(got.Extents, r.Extents) || got.LSN != 7 || got.Epoch != 3 || got.Log != 99 || !same(got, r) {
			t.Fatalf("%d pages: decode %+v, %v, %v", pages, got.Extents, wrap, err)
		}
		// Every flipped byte is caught.
		for range 50 {
			c := bytes.Clone(b)
			c[rng.IntN(len(c))] ^= byte(1 + rng.IntN(255))
			if _, _, err := Decode(c); !errors.Is(err, ErrBadRecord) {
				t.Fatalf("a flipped byte decodes: %v", err)
			}
		}
		// A torn record (any sector-aligned prefix, the rest zeros or old
		// bytes) is caught.
		for cutAt := 512; cutAt < len(b); cutAt += 512 {
			c := bytes.Clone(b)
			clear(c[cutAt:])
			if _, _, err := Decode(c); !errors.Is(err, ErrBadRecord) && !bytes.Equal(c, b) {
				t.Fatalf("torn at %d decodes: %v", cutAt, err)
			}
		}
	}
	w, wrap, err := Decode(encodeWrap(9, 2, 77))
	if err != nil || !wrap || w.LSN != 9 || w.Epoch != 2 || w.Log != 77 {
		t.Fatalf("wrap marker: %+v %v %v", w, wrap, err)
	}
}

func TestRecordRefusesBadExtents(t *testing.T) {
	for _, ext := range [][]Extent{
		{{First: 0, Pages: 0}},
		{{First: 5, Pages: 2}, {First: 6, Pages: 1}}, // overlapping
		{{First: 5, Pages: 1}, {First: 2, Pages: 1}}, // out of order
		{{First: 1 << 62, Pages: 1}},                 // past the largest file
	} {
		r := Record{LSN: 1, Extents: ext}
		if _, err := r.Encode(nil); err == nil {
			t.Errorf("extents %v encode", ext)
		}
	}
}

// FuzzDecode: no input panics Decode, and what decodes encodes back to
// the same bytes.
func FuzzDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, pages := range []int{0, 1, 2} {
		r := testRecord(rng, pages)
		r.LSN = 1
		b, _ := r.Encode(nil)
		f.Add(b)
	}
	f.Add(encodeWrap(3, 1, 5))
	f.Add(make([]byte, BlockSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, wrap, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error not ErrBadRecord: %v", err)
			}
			return
		}
		if wrap {
			if !bytes.Equal(encodeWrap(rec.LSN, rec.Epoch, rec.Log), b) {
				t.Fatal("a wrap marker does not encode back")
			}
			return
		}
		again, err := rec.Encode(nil)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded record does not encode back: %v", err)
		}
	})
}

// FuzzOpen: no device content panics or hangs Open, and whatever it
// recovers it can append after and recover again.
func FuzzOpen(f *testing.F) {
	f.Add([]byte{1}, uint8(3))
	f.Add([]byte{0x07, 0x00, 7}, uint8(9))    // a superblock byte
	f.Add([]byte{0x06, 0x80, 0xff}, uint8(5)) // a record's header
	f.Fuzz(func(t *testing.T, noise []byte, appends uint8) {
		dev, l, _ := newLog(t, 8)
		rng := rand.New(rand.NewPCG(uint64(len(noise)), uint64(appends)))
		appended := map[uint64]Record{}
		for range int(appends % 12) {
			r := testRecord(rng, rng.IntN(3))
			if lsn, err := l.Append(&r); errors.Is(err, ErrFull) {
				_ = l.Trim(l.Stats().DurableLSN)
			} else if err != nil {
				t.Fatal(err)
			} else {
				appended[lsn] = r
			}
		}
		// Scribble over the ring and the superblocks: (offset high, offset
		// low, byte) triples.
		for i := 0; i+2 < len(noise); i += 3 {
			dev.img[(int(noise[i])<<8|int(noise[i+1]))*5%len(dev.img)] = noise[i+2]
		}
		l2, recs, err := Open(dev)
		if err != nil {
			return // both superblocks damaged: refused, not a panic
		}
		for _, got := range recs {
			if want, ok := appended[got.LSN]; !ok || !same(got, want) {
				t.Fatalf("recovered record %d was not appended with those contents", got.LSN)
			}
		}
		r := testRecord(rng, 1)
		lsn, err := l2.Append(&r)
		if errors.Is(err, ErrFull) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		_, again, err := Open(dev)
		if err != nil || len(again) == 0 || again[len(again)-1].LSN != lsn || !same(again[len(again)-1], r) {
			t.Fatalf("the append after recovering a scribbled log was not recovered: %v", err)
		}
	})
}

func TestAppendRecoverAcrossLaps(t *testing.T) {
	const ring = 32
	dev, l, _ := newLog(t, ring)
	rng := rand.New(rand.NewPCG(3, 3))
	var appended []Record // live ones, oldest first
	full := 0
	for i := range 400 {
		r := testRecord(rng, rng.IntN(6))
		lsn, err := l.Append(&r)
		if errors.Is(err, ErrFull) {
			full++
			// The journal committed the oldest half.
			k := len(appended) / 2
			if err := l.Trim(appended[k].LSN); err != nil {
				t.Fatal(err)
			}
			appended = appended[k+1:]
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		r.LSN = lsn
		appended = append(appended, r)
		if i%37 == 0 { // a restart
			l2, recs, err := Open(dev)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != len(appended) {
				t.Fatalf("append %d: recovered %d records, want %d", i, len(recs), len(appended))
			}
			for j := range recs {
				if recs[j].LSN != appended[j].LSN || !same(recs[j], appended[j]) {
					t.Fatalf("append %d: record %d differs", i, j)
				}
			}
			l = l2
		}
	}
	if full == 0 {
		t.Fatal("the ring never filled: no lap was tested")
	}
}

// Concurrent appends share flushes, and each returns only once durable.
func TestGroupCommit(t *testing.T) {
	dev, l, _ := newLog(t, 4096)
	base := dev.syncs
	const writers, each = 16, 40
	concurrentAppends(t, dev, l, writers, each, 9)
	flushes := dev.syncs - base
	t.Logf("%d appends, %d flushes", writers*each, flushes)
	if flushes >= writers*each || int(l.Flushes.Load()) != flushes {
		t.Fatalf("%d flushes for %d concurrent appends (counter %d): no group commit", flushes, writers*each, l.Flushes.Load())
	}
	// A lone append is flushed at once.
	before := dev.syncs
	r := testRecord(rand.New(rand.NewPCG(1, 2)), 1)
	if _, err := l.Append(&r); err != nil || dev.syncs != before+1 {
		t.Fatalf("a lone append: %v, %d flushes", err, dev.syncs-before)
	}
	if l.LoneWrites.Load() != 0 {
		t.Fatalf("%d lone durable writes on a device without them", l.LoneWrites.Load())
	}
}

// TestLoneAppendIsOneDurableWrite: on a DurableWriter, an append with
// nothing before it left to flush is its record's durable write (one
// call, no separate flush); appends that overlap share flushes as ever,
// and every append returns only once its record is durable.
func TestLoneAppendIsOneDurableWrite(t *testing.T) {
	dev := newMemDev(RingOffset + 4096*BlockSize)
	dev.durable = true
	dev, l, _ := newLogOn(t, dev, 4096)
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 5 {
		before := len(dev.ops)
		r := testRecord(rng, 2)
		lsn, err := l.Append(&r)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(dev.ops) - before; got != 2 || !dev.flushedAfter(lsn) {
			t.Fatalf("lone append %d: %d device ops, want its write and its flush", i, got)
		}
	}
	if l.LoneWrites.Load() != 5 {
		t.Fatalf("%d lone durable writes for 5 lone appends", l.LoneWrites.Load())
	}
	const writers, each = 8, 30
	concurrentAppends(t, dev, l, writers, each, 7)
	_, recs, err := Open(dev)
	if err != nil || len(recs) != 5+writers*each {
		t.Fatalf("recovered %d records, want %d: %v", len(recs), 5+writers*each, err)
	}
}

// A failed write or flush fails that append and every later one.
func TestErrorsAreSticky(t *testing.T) {
	for _, which := range []string{"write", "flush"} {
		dev, l, _ := newLog(t, 64)
		rng := rand.New(rand.NewPCG(4, 4))
		r := testRecord(rng, 1)
		if _, err := l.Append(&r); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("EIO from the device")
		if which == "write" {
			dev.failNext = boom
		} else {
			// The write goes; the flush after it fails.
			l.dev = failSyncDev{dev, boom}
		}
		if _, err := l.Append(&r); !errors.Is(err, boom) {
			t.Fatalf("%s fails: append returned %v", which, err)
		}
		l.dev = dev
		for range 3 {
			if _, err := l.Append(&r); !errors.Is(err, boom) {
				t.Fatalf("after a failed %s: append returned %v, want the sticky error", which, err)
			}
		}
		if err := l.Stats().Err; !errors.Is(err, boom) {
			t.Fatalf("stats error %v", err)
		}
	}
}

type failSyncDev struct {
	*memDev
	err error
}

func (d failSyncDev) Sync() error { return d.err }

// step is one thing a power-cut workload does.
type step struct {
	pages int    // append a record of this many pages
	trim  string // or trim: "all", "all but last"
	open  bool   // or restart: Open the device again
}

// Every cut point of small workloads (appends, wraps, trims of all or all
// but the last record, restarts, trims after restarts), each with the
// writes since the last flush dropped, all kept, all but one kept, or kept
// up to the last torn at a sector: recovery returns every acknowledged
// record not trimmed, exactly, and nothing that was not appended; and the
// recovered log's next append is what it recovers next.
func TestPowerCutAtEveryWrite(t *testing.T) {
	a, tr, tb, re := func(p int) step { return step{pages: p} }, step{trim: "all"}, step{trim: "all but last"}, step{open: true}
	for name, steps := range map[string][]step{
		"laps": {a(1), a(2), a(3), tb, a(1), a(3), tb, a(2), re, a(1), a(3), tb, a(2), a(1), tb, a(3), a(2)},
		// A trim to empty leaves the trim offset where the next record's
		// wrap marker goes (the marker must then stay).
		"trim to empty": {a(3), a(3), tr, a(4), a(4), a(1), tr, re, a(2), a(3), a(3), tr, a(8), re, a(2)},
		// Trims after restarts: the trim point's epoch.
		"trim after restart": {a(1), a(1), re, a(1), tr, a(1), re, a(2), a(1), tb, re, a(1), tr, a(2)},
		// Nothing live and a record that fits only from the ring's start:
		// the ring starts over at 0.
		"start over": {a(5), tr, a(8), re, a(1), tr, a(4), a(5), tr, re, a(10), a(1)},
	} {
		t.Run(name, func(t *testing.T) { powerCuts(t, steps, false) })
		// Lone appends as one durable write (DurableWriter).
		t.Run(name+"/durable", func(t *testing.T) { powerCuts(t, steps, true) })
	}
}

// acked is a record an Append returned for, and the device ops done by
// then; trimmed is a Trim, and the ops before it and when it returned.
type (
	acked struct {
		rec Record
		at  int
	}
	trimmed struct {
		lsn           uint64
		issued, ended int
	}
)

// runSteps runs a workload on the log l of dev, whose live records are
// live, and returns what it appended and trimmed.
func runSteps(t *testing.T, dev *memDev, l *Log, live []uint64, steps []step, rng *rand.Rand) (all []acked, trims []trimmed) {
	t.Helper()
	trim := func(lsn uint64) {
		issued := dev.opCount()
		if err := l.Trim(lsn); err != nil {
			t.Fatal(err)
		}
		trims = append(trims, trimmed{lsn, issued, dev.opCount()})
	}
	for i, st := range steps {
		switch {
		case st.open:
			var err error
			if l, _, err = Open(dev); err != nil {
				t.Fatal(err)
			}
		case st.trim != "":
			k := len(live)
			if st.trim == "all but last" {
				k--
			}
			if k > 0 {
				trim(live[k-1])
				live = live[k:]
			}
		default:
			r := testRecord(rng, st.pages)
			lsn, err := l.Append(&r)
			if errors.Is(err, ErrFull) && len(live) > 0 {
				trim(live[len(live)-1]) // the journal catches up: it commits everything
				live = live[:0]
				lsn, err = l.Append(&r)
			}
			if err != nil {
				t.Fatalf("step %d: append of %d pages: %v", i, st.pages, err)
			}
			r.LSN = lsn
			all = append(all, acked{r, dev.opCount()})
			live = append(live, lsn)
		}
	}
	return all, trims
}

// cutImages calls fn with every crash image of ops on base: cut after
// every op, with the writes since the last flush dropped, all kept, each
// one dropped alone, or the last torn at each sector. dropsOnly limits it
// to the images that drop writes (those that can leave stale records).
func cutImages(base []byte, ops []op, dropsOnly bool, fn func(k, tear int, img *memDev)) int {
	type variant struct {
		keep func(int) bool
		tear int
	}
	n := 0
	for k := 0; k <= len(ops); k++ {
		unflushed := 0 // writes since the last flush among the first k ops
		for i := k - 1; i >= 0 && ops[i].data != nil; i-- {
			unflushed++
		}
		variants := []variant{{func(int) bool { return false }, -1}}
		if !dropsOnly {
			variants = append(variants, variant{func(int) bool { return true }, -1})
		}
		for j := 0; j < unflushed && unflushed > 1; j++ {
			variants = append(variants, variant{func(i int) bool { return i != j }, -1})
		}
		if unflushed > 0 && !dropsOnly {
			for tear := 0; tear < len(ops[k-1].data); tear += 512 {
				variants = append(variants, variant{func(int) bool { return true }, tear})
			}
		}
		for _, v := range variants {
			n++
			fn(k, v.tear, cut(base, ops, k, v.keep, v.tear))
		}
	}
	return n
}

// checkImage checks a recovered image after a cut after k ops: the trim
// point lies between the last durable trim and the last issued, every
// record recovered is one of known (appended, or recovered before) with
// those contents, and every one of must (acknowledged by then) past the
// trim point is recovered; baseTrim is the image's trim point before the
// ops. It returns the recovered log and records.
func checkImage(t *testing.T, k, tear int, img *memDev, known map[uint64]Record, must []acked, baseTrim uint64, trims []trimmed) (*Log, []Record) {
	t.Helper()
	l, recs, err := Open(img)
	if err != nil {
		t.Fatalf("cut after %d ops (tear %d): open: %v", k, tear, err)
	}
	trim := l.sb.trimLSN
	durableTrim, issuedTrim := baseTrim, baseTrim
	for _, tr := range trims {
		if tr.ended <= k {
			durableTrim = max(durableTrim, tr.lsn)
		}
		if tr.issued < k {
			issuedTrim = max(issuedTrim, tr.lsn)
		}
	}
	if trim < durableTrim || (trim > issuedTrim && trim > durableTrim) {
		t.Fatalf("cut after %d ops (tear %d): recovered trim point %d, want %d (durable) to %d (issued)", k, tear, trim, durableTrim, issuedTrim)
	}
	byLSN := map[uint64]Record{}
	for _, r := range recs {
		want, ok := known[r.LSN]
		if !ok || !same(r, want) {
			t.Fatalf("cut after %d ops (tear %d): recovered record %d, never appended with those contents", k, tear, r.LSN)
		}
		byLSN[r.LSN] = r
	}
	for _, a := range must {
		if _, ok := byLSN[a.rec.LSN]; !ok && a.at <= k && a.rec.LSN > trim {
			t.Fatalf("cut after %d ops (tear %d): acknowledged record %d lost (trim %d, recovered %d)", k, tear, a.rec.LSN, trim, len(recs))
		}
	}
	return l, recs
}

func powerCuts(t *testing.T, steps []step, durable bool) {
	const ring = 12
	dev := newMemDev(RingOffset + ring*BlockSize)
	dev.durable = durable
	dev, l, base := newLogOn(t, dev, ring)
	rng := rand.New(rand.NewPCG(5, 5))
	all, trims := runSteps(t, dev, l, nil, steps, rng)
	known := map[uint64]Record{}
	for _, a := range all {
		known[a.rec.LSN] = a.rec
	}
	cases := cutImages(base, dev.ops, false, func(k, tear int, img *memDev) {
		l2, _ := checkImage(t, k, tear, img, known, all, 0, trims)
		// The recovered log takes appends, and keeps them.
		nr := testRecord(rng, 1)
		lsn, err := l2.Append(&nr)
		if errors.Is(err, ErrFull) {
			return
		}
		if err != nil {
			t.Fatalf("cut after %d ops: append after recovery: %v", k, err)
		}
		_, again, err := Open(img)
		if err != nil || len(again) == 0 || again[len(again)-1].LSN != lsn || !same(again[len(again)-1], nr) {
			t.Fatalf("cut after %d ops: the append after recovery was not recovered (%v)", k, err)
		}
	})
	t.Logf("%d device ops, %d records, %d crash images checked", len(dev.ops), len(all), cases)
}

// Two crashes: every image of the first workload that dropped writes (and
// so may hold an earlier incarnation's leftovers) is recovered, a second
// workload runs on it, and every image of that is checked: what comes back
// is what the first recovery returned or the second workload appended,
// never a leftover of the first.
func TestPowerCutTwice(t *testing.T) {
	a, tr, re := func(p int) step { return step{pages: p} }, step{trim: "all"}, step{open: true}
	first := []step{a(1), a(2), a(3), a(1), tr, a(2), a(1), a(4), re, a(1), a(2)}
	second := []step{a(1), a(2), a(1), tr, a(3), a(1)}
	const ring = 12
	dev, l, base := newLog(t, ring)
	rng := rand.New(rand.NewPCG(11, 11))
	all, trims := runSteps(t, dev, l, nil, first, rng)
	known := map[uint64]Record{}
	for _, a := range all {
		known[a.rec.LSN] = a.rec
	}
	images, seconds := 0, 0
	cutImages(base, dev.ops, true, func(k, tear int, img *memDev) {
		images++
		base2 := bytes.Clone(img.img)
		l1, recs := checkImage(t, k, tear, &memDev{img: bytes.Clone(base2)}, known, all, 0, trims)
		dev2 := &memDev{img: bytes.Clone(base2)}
		l2, recs2, err := Open(dev2)
		if err != nil {
			t.Fatal(err)
		}
		var live []uint64
		for _, r := range recs2 {
			live = append(live, r.LSN)
		}
		all2, trims2 := runSteps(t, dev2, l2, live, second, rand.New(rand.NewPCG(uint64(k), 12)))
		known2 := map[uint64]Record{}
		var must []acked
		for _, r := range recs {
			known2[r.LSN] = r
			must = append(must, acked{r, 0}) // durable before the second run
		}
		for _, a := range all2 {
			known2[a.rec.LSN] = a.rec
		}
		must = append(must, all2...)
		seconds += cutImages(base2, dev2.ops, false, func(k2, tear2 int, img2 *memDev) {
			checkImage(t, k2, tear2, img2, known2, must, l1.sb.trimLSN, trims2)
		})
	})
	t.Logf("%d first images, %d second images checked", images, seconds)
}

// The cases an independent review found: after a trim to empty the trim
// offset is where the next record's wrap marker goes, and no later record
// may overwrite that marker; a record that fits only from the ring's start
// when nothing is live does not wait forever; the first record after a
// trim point can be an earlier incarnation's leftover.
func TestTrimToEmptyKeepsTheWrapMarker(t *testing.T) {
	dev, l, _ := newLog(t, 12)
	rng := rand.New(rand.NewPCG(8, 8))
	app := func(pages int) (Record, error) {
		r := testRecord(rng, pages)
		lsn, err := l.Append(&r)
		r.LSN = lsn
		return r, err
	}
	for range 2 { // blocks 0-4, 4-8
		if _, err := app(3); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Trim(2); err != nil { // trim offset 8, nothing live
		t.Fatal(err)
	}
	r3, err := app(4) // wraps: marker at 8, the record at 0-5
	if err != nil {
		t.Fatal(err)
	}
	r4, err := app(4) // 5 blocks at 5-10 would overwrite the marker
	if err == nil {
		t.Fatalf("record 4 (%d) fitted over the wrap marker recovery needs", r4.LSN)
	}
	if !errors.Is(err, ErrFull) {
		t.Fatal(err)
	}
	_, recs, err := Open(dev)
	if err != nil || len(recs) != 1 || !same(recs[0], r3) {
		t.Fatalf("recovered %d records, %v; want record 3", len(recs), err)
	}
}

func TestLargeRecordInAnEmptyRing(t *testing.T) {
	dev, l, _ := newLog(t, 12)
	rng := rand.New(rand.NewPCG(9, 9))
	r := testRecord(rng, 5) // blocks 0-6
	if _, err := l.Append(&r); err != nil {
		t.Fatal(err)
	}
	if err := l.Trim(1); err != nil { // nothing live, head at 6
		t.Fatal(err)
	}
	big := testRecord(rng, 8) // 9 blocks: fits only from 0
	lsn, err := l.Append(&big)
	if err != nil {
		t.Fatalf("a 9-block record in an empty 12-block ring: %v", err)
	}
	_, recs, err := Open(dev)
	if err != nil || len(recs) != 1 || recs[0].LSN != lsn || !same(recs[0], big) {
		t.Fatalf("recovered %d records, %v", len(recs), err)
	}
}

func TestStaleFirstRecordAfterATrim(t *testing.T) {
	dev, l, _ := newLog(t, 64)
	rng := rand.New(rand.NewPCG(10, 10))
	a := testRecord(rng, 1)
	if _, err := l.Append(&a); err != nil { // blocks 0-2
		t.Fatal(err)
	}
	// Incarnation A's crash: record 2 (blocks 2-4) lost, record 3 (4-6) kept.
	stale := testRecord(rng, 1)
	stale.LSN, stale.Epoch, stale.Log = 3, l.sb.epoch, l.sb.log
	b, _ := stale.Encode(nil)
	if _, err := dev.WriteAt(b, RingOffset+4*BlockSize); err != nil {
		t.Fatal(err)
	}
	l, _, err := Open(dev) // incarnation B
	if err != nil {
		t.Fatal(err)
	}
	c := testRecord(rng, 1)
	if _, err := l.Append(&c); err != nil { // B's record 2 at blocks 2-4
		t.Fatal(err)
	}
	if err := l.Trim(2); err != nil { // trim offset 4: A's record 3 is first
		t.Fatal(err)
	}
	_, recs, err := Open(dev)
	if err != nil || len(recs) != 0 {
		t.Fatalf("recovered %d records after a trim of everything, %v (an earlier incarnation's record 3?)", len(recs), err)
	}
}

// On a real file: Format writes the whole ring (no unwritten extents),
// and the log recovers after a reopen of the file.
func TestFileDevice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "staging")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Format(f, 256); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.Stat(); st.Size() != RingOffset+256*BlockSize {
		t.Fatalf("size %d after format", st.Size())
	}
	l, _, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(6, 6))
	want := testRecord(rng, 2)
	if _, err := l.Append(&want); err != nil {
		t.Fatal(err)
	}
	g, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	_, recs, err := Open(g)
	if err != nil || len(recs) != 1 || !same(recs[0], want) {
		t.Fatalf("reopen: %d records, %v", len(recs), err)
	}
}

// A write of an earlier incarnation that its crash left in the ring after
// a lost one (the device reordered them) can line up with the chain again
// once the next incarnation reuses the lost one's place with a record of
// the same length: recovery must not take it (it would replay an older,
// never acknowledged state of a file over an acknowledged one).
func TestStaleRecordOfAnEarlierIncarnation(t *testing.T) {
	dev, l, _ := newLog(t, 64)
	rng := rand.New(rand.NewPCG(7, 7))
	a := testRecord(rng, 1) // 2 blocks at ring offset 0
	if _, err := l.Append(&a); err != nil {
		t.Fatal(err)
	}
	// The crash: record 2 (2 blocks at offset 8 KiB) lost, record 3 (at
	// 16 KiB) on the device, neither flushed nor acknowledged.
	stale := testRecord(rng, 1)
	stale.LSN, stale.Epoch, stale.Log = 3, l.sb.epoch, l.sb.log
	b, err := stale.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dev.WriteAt(b, RingOffset+4*BlockSize); err != nil {
		t.Fatal(err)
	}
	l, recs, err := Open(dev)
	if err != nil || len(recs) != 1 {
		t.Fatalf("after the crash: %d records, %v; want record 1", len(recs), err)
	}
	// The next incarnation's record 2 fills the lost one's place exactly.
	c := testRecord(rng, 1)
	if lsn, err := l.Append(&c); err != nil || lsn != 2 {
		t.Fatalf("append: lsn %d, %v", lsn, err)
	}
	_, recs, err = Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || !same(recs[1], c) {
		t.Fatalf("recovered %d records (want 1 and the new 2, not the earlier incarnation's 3)", len(recs))
	}
}

// concurrentAppends has writers goroutines append each one-page records
// to l on dev at once, and fails unless every append returns only once
// its record is durable: the log says so, and a flush of the device
// followed its write.
func concurrentAppends(t *testing.T, dev *memDev, l *Log, writers, each int, seed uint64) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for range each {
				r := testRecord(rng, 1)
				lsn, err := l.Append(&r)
				switch {
				case err != nil:
				case l.Stats().DurableLSN < lsn:
					err = fmt.Errorf("append %d returned with durable %d", lsn, l.Stats().DurableLSN)
				case !dev.flushedAfter(lsn):
					err = fmt.Errorf("append %d returned before the device flushed its write", lsn)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
