package cache

import (
	"errors"
	"fmt"
)

// Region is one mapping of a cache region: its meta memfd (header and
// state words) and its data memfd (the file's pages). The service formats
// it and owns every transition; a client attaches to it and reads. Its
// methods take page numbers and check them against the mapping, so a value
// read from the header never indexes memory unchecked.
type Region struct {
	meta  []byte
	data  []byte
	pages uint64 // pages of file data this mapping covers
}

// Format writes the header of a new region into meta, which must be zeroed
// (a new memfd is); meta and data must hold Sizes(capacity) bytes: every
// page starts absent. capacity is rounded up to whole chunks.
func Format(meta, data []byte, ino, capacity uint64) (*Region, error) {
	ms, ds, err := Sizes(capacity)
	if err != nil {
		return nil, err
	}
	if uint64(len(meta)) < ms || uint64(len(data)) < ds {
		return nil, fmt.Errorf("%w: mappings of %d and %d bytes for a region of %d and %d", ErrInvalid, len(meta), len(data), ms, ds)
	}
	r := &Region{meta: meta, data: data, pages: chunksOf(capacity) * ChunkPages}
	r.store32(offMagic, Magic)
	r.store32(offVersion, Version|PageShift<<16)
	r.store32(offChunkPages, ChunkPages)
	r.store64(offIno, ino)
	r.store64(offCapacity, chunksOf(capacity)*ChunkBytes)
	return r, nil
}

// Attach checks the header of a region mapped in meta and data, as a
// client does before it reads. The mappings may cover less than the
// header's capacity (the service grew the region since they were made):
// only the chunks both cover are read.
func Attach(meta, data []byte) (*Region, error) {
	if len(meta) < HeaderSize {
		return nil, fmt.Errorf("%w: a mapping of %d bytes holds no header", ErrInvalid, len(meta))
	}
	r := &Region{meta: meta, data: data}
	switch vs := r.load32(offVersion); {
	case r.load32(offMagic) != Magic:
		return nil, fmt.Errorf("%w: magic %#x, want %#x", ErrInvalid, r.load32(offMagic), uint32(Magic))
	case vs&0xffff != Version:
		return nil, fmt.Errorf("%w: ABI version %d, want %d", ErrInvalid, vs&0xffff, Version)
	case vs>>16 != PageShift || r.load32(offChunkPages) != ChunkPages || r.load32(offReserved) != 0:
		return nil, fmt.Errorf("%w: geometry (page shift %d, %d pages a chunk) is not version %d's", ErrInvalid, vs>>16, r.load32(offChunkPages), Version)
	}
	c := r.load64(offCapacity)
	if c%ChunkBytes != 0 || c > MaxCapacity {
		return nil, fmt.Errorf("%w: capacity %d", ErrInvalid, c)
	}
	r.pages = min(c/ChunkBytes, mappedChunks(meta, data)) * ChunkPages
	return r, nil
}

// mappedChunks is the number of whole chunks both mappings cover.
func mappedChunks(meta, data []byte) uint64 {
	return min((uint64(len(meta))-HeaderSize)/PageSize, uint64(len(data))/ChunkBytes)
}

// Extend is the service's Attach of larger mappings it made of its own
// region, before it grows the region into them: the result covers the
// whole of both, so that Grow can raise the capacity to it.
func Extend(meta, data []byte) (*Region, error) {
	r, err := Attach(meta, data)
	if err != nil {
		return nil, err
	}
	r.pages = mappedChunks(meta, data) * ChunkPages
	return r, nil
}

// Ino is the file's inode number.
func (r *Region) Ino() uint64 { return r.load64(offIno) }

// Capacity is the file bytes the region covers now (the header's; the
// service may have grown it past this mapping).
func (r *Region) Capacity() uint64 { return r.load64(offCapacity) }

// Pages is the number of file pages this mapping covers.
func (r *Region) Pages() uint64 { return r.pages }

// Generation is bumped by the service whenever it drops pages wholesale.
func (r *Region) Generation() uint64 { return r.load64(offGeneration) }

// Grow raises the region's capacity to capacity (rounded up to chunks),
// which this mapping must cover: the service grows the memfd and maps it
// anew first. Clients see the new capacity and map the new chunks.
func (r *Region) Grow(capacity uint64) error {
	c := chunksOf(capacity) * ChunkBytes
	switch {
	case c > MaxCapacity || c/PageSize > r.pages:
		return fmt.Errorf("%w: capacity %d past the mapping's %d", ErrInvalid, c, r.pages*PageSize)
	case c > r.load64(offCapacity):
		r.store64(offCapacity, c)
	}
	return nil
}

// NewGeneration bumps the generation (after a truncate dropped pages).
func (r *Region) NewGeneration() { r.add64(offGeneration, 1) }

// State is page p's state word.
func (r *Region) State(p uint64) (Word, error) {
	if p >= r.pages {
		return 0, errRange
	}
	return Word(r.load32(stateOff(p))), nil
}

// ReadPage copies len(dst) bytes of page p, from byte off of the page, and
// reports whether they are the file's: the page was resident, and its
// state word was the same before and after the copy, so no transition
// (fill, update, eviction) overlapped it. On false, dst holds garbage: ask
// the service.
func (r *Region) ReadPage(p uint64, off int, dst []byte) bool {
	if p >= r.pages || off < 0 || off+len(dst) > PageSize {
		return false
	}
	so := stateOff(p)
	w := Word(r.load32(so))
	if w.Kind() != KindResident {
		return false
	}
	r.copyOut(dst, pageOff(p)+uint64(off))
	return Word(r.load32(so)) == w
}

// ReadAt copies file bytes at off into dst from resident pages, page by
// page, and returns how many it copied: all of dst, or up to the first
// page that is not resident or changed during its copy.
func (r *Region) ReadAt(dst []byte, off uint64) int {
	n := 0
	for n < len(dst) {
		p, in := (off+uint64(n))/PageSize, int((off+uint64(n))%PageSize)
		k := min(len(dst)-n, PageSize-in)
		if !r.ReadPage(p, in, dst[n:n+k]) {
			break
		}
		n += k
	}
	return n
}

// fieldTries bounds a Fields read: a writer that leaves the sequence odd
// (a dead or hostile process) must not hang a reader.
const fieldTries = 64

// Fields reads the live inode fields, and reports false if no stable copy
// was seen in fieldTries attempts (ask the service).
func (r *Region) Fields() (Fields, bool) {
	for range fieldTries {
		s := r.load64(offFieldsSeq)
		if s&1 != 0 {
			continue
		}
		f := Fields{Size: r.load64(offSize), Mtime: int64(r.load64(offMtime)), Ctime: int64(r.load64(offCtime)),
			DataVersion: r.load64(offDataVersion)}
		if r.load64(offFieldsSeq) == s {
			return f, true
		}
	}
	return Fields{}, false
}

// SetFields publishes f (the service: one writer).
func (r *Region) SetFields(f Fields) {
	s := r.load64(offFieldsSeq) &^ 1
	r.store64(offFieldsSeq, s+1)
	r.store64(offSize, f.Size)
	r.store64(offMtime, uint64(f.Mtime))
	r.store64(offCtime, uint64(f.Ctime))
	r.store64(offDataVersion, f.DataVersion)
	r.store64(offFieldsSeq, s+2)
}

// Retire leaves the field group changing for good: the service no longer
// keeps the region (its file closed and the region dropped, or the
// service stops), and a client that still maps it must ask the service
// (docs/cache-abi.md §2), which has the file's bytes elsewhere by then.
func (r *Region) Retire() {
	r.store64(offFieldsSeq, r.load64(offFieldsSeq)|1)
}

// Begin makes page p busy for a transition by the service (a fill, an
// update, an eviction) and returns the busy word, which Publish or Drop
// take. It fails with ErrBusy while the page is busy already or pinned by
// a writer, and with ErrInvalid on a malformed word.
func (r *Region) Begin(p uint64) (Word, error) {
	b, _, err := r.BeginKind(p)
	return b, err
}

// BeginKind is Begin that also returns the page's kind before it became
// busy (absent or resident).
func (r *Region) BeginKind(p uint64) (Word, Kind, error) {
	if p >= r.pages {
		return 0, 0, errRange
	}
	so := stateOff(p)
	for {
		w := Word(r.load32(so))
		if err := w.Valid(); err != nil {
			return 0, 0, err
		}
		if w.Kind() == KindBusy || w.Pins() != 0 {
			return w, 0, fmt.Errorf("%w: page %d (%#x)", ErrBusy, p, uint32(w))
		}
		b := w.next(KindBusy, w.Dirty())
		if r.cas32(so, uint32(w), uint32(b)) {
			return b, w.Kind(), nil
		}
	}
}

// ErrBusy is Begin's error for a page in another transition or pinned.
var ErrBusy = errors.New("cache region: page is busy")

// Publish ends a transition begun with Begin: page p is resident (dirty if
// its bytes are not written home).
func (r *Region) Publish(p uint64, busy Word, dirty bool) error {
	return r.end(p, busy, busy.next(KindResident, dirty))
}

// Drop ends a transition begun with Begin: page p is absent. The service
// has zeroed (punched) the page's memory before.
func (r *Region) Drop(p uint64, busy Word) error {
	return r.end(p, busy, MakeWord(KindAbsent, false, 0, busy.Seq()+1))
}

func (r *Region) end(p uint64, busy, w Word) error {
	if p >= r.pages {
		return errRange
	}
	if !r.cas32(stateOff(p), uint32(busy), uint32(w)) {
		return fmt.Errorf("cache region: page %d changed under a transition (want %#x)", p, uint32(busy))
	}
	return nil
}

// WritePage stores src into page p at byte off (the service, between
// Begin and Publish).
func (r *Region) WritePage(p uint64, off int, src []byte) error {
	if p >= r.pages || off < 0 || off+len(src) > PageSize {
		return errRange
	}
	r.copyIn(pageOff(p)+uint64(off), src)
	return nil
}

// PageOffset is the byte offset of page p's data in the data memfd (for
// the service to fill it by reading the device into the mapping, or to
// punch it out of the memfd): its offset in the file.
func PageOffset(p uint64) uint64 { return pageOff(p) }

// Data returns the data of pages [p, p+n) as one slice of the mapping, for
// the service to fill them straight from the device.
func (r *Region) Data(p uint64, n int) ([]byte, error) {
	if n <= 0 || p >= r.pages || uint64(n) > r.pages-p {
		return nil, errRange
	}
	o := pageOff(p)
	return r.data[o : o+uint64(n)*PageSize : o+uint64(n)*PageSize], nil
}
