package ring

import (
	"encoding/binary"
	"syscall"
)

// Segment is one scatter-gather entry: Len bytes at arena offset Off.
type Segment struct {
	Off uint32
	Len uint32
}

// Descriptor is a submission as the Go side sees it. It is the decoded form
// of one 128-byte SQ slot (minus the sequence word that the queue owns).
type Descriptor struct {
	Opcode uint8
	Flags  uint8
	NSeg   uint16
	Arg    uint32 // opcode-specific
	ReqID  uint64
	Handle uint64 // object the request is about (file, blob); opcode-specific
	Offset uint64 // byte offset in that object; opcode-specific
	Length uint64 // total payload bytes: the sum of the segment lengths
	Inline [InlineSegs]Segment
}

// Completion answers one descriptor. Result >= 0 is an opcode-specific value
// (bytes moved, a handle); Result < 0 is a negated errno.
type Completion struct {
	ReqID  uint64
	Result int64
	Aux    uint64
}

// Err returns the errno carried by a negative Result, or nil.
func (c Completion) Err() error {
	if c.Result < 0 {
		return syscall.Errno(-c.Result)
	}
	return nil
}

// errCompletion builds the answer to a request that failed with e.
func errCompletion(reqID uint64, e syscall.Errno) Completion {
	return Completion{ReqID: reqID, Result: -int64(e)}
}

// encodeDescriptor writes d into a slot's payload bytes (b is the whole slot;
// the sequence word at offset 0 is left alone).
func encodeDescriptor(b []byte, d *Descriptor) {
	_ = b[SQSlotSize-1]
	le := binary.LittleEndian
	b[sqOffOpcode] = d.Opcode
	b[sqOffFlags] = d.Flags
	le.PutUint16(b[sqOffNSeg:], d.NSeg)
	le.PutUint32(b[sqOffArg:], d.Arg)
	le.PutUint64(b[sqOffReqID:], d.ReqID)
	le.PutUint64(b[sqOffHandle:], d.Handle)
	le.PutUint64(b[sqOffOffset:], d.Offset)
	le.PutUint64(b[sqOffLength:], d.Length)
	for i, s := range d.Inline {
		le.PutUint32(b[sqOffSegs+i*SegmentSize:], s.Off)
		le.PutUint32(b[sqOffSegs+i*SegmentSize+4:], s.Len)
	}
}

// DecodeDescriptor parses a private copy of one SQ slot. It never fails:
// every field is just bytes until ValidateDescriptor has looked at it.
func DecodeDescriptor(b []byte) (d Descriptor, ok bool) {
	if len(b) < SQSlotSize {
		return d, false
	}
	le := binary.LittleEndian
	d.Opcode = b[sqOffOpcode]
	d.Flags = b[sqOffFlags]
	d.NSeg = le.Uint16(b[sqOffNSeg:])
	d.Arg = le.Uint32(b[sqOffArg:])
	d.ReqID = le.Uint64(b[sqOffReqID:])
	d.Handle = le.Uint64(b[sqOffHandle:])
	d.Offset = le.Uint64(b[sqOffOffset:])
	d.Length = le.Uint64(b[sqOffLength:])
	for i := range d.Inline {
		d.Inline[i].Off = le.Uint32(b[sqOffSegs+i*SegmentSize:])
		d.Inline[i].Len = le.Uint32(b[sqOffSegs+i*SegmentSize+4:])
	}
	return d, true
}

func encodeCompletion(b []byte, c Completion) {
	_ = b[CQSlotSize-1]
	le := binary.LittleEndian
	le.PutUint64(b[cqOffReqID:], c.ReqID)
	le.PutUint64(b[cqOffResult:], uint64(c.Result))
	le.PutUint64(b[cqOffAux:], c.Aux)
}

func decodeCompletion(b []byte) Completion {
	le := binary.LittleEndian
	return Completion{
		ReqID:  le.Uint64(b[cqOffReqID:]),
		Result: int64(le.Uint64(b[cqOffResult:])),
		Aux:    le.Uint64(b[cqOffAux:]),
	}
}

// segmentOK reports whether s lies inside an arena of arenaSize bytes, is
// aligned, and is not empty. The sum is done in 64 bits so it cannot wrap.
func segmentOK(s Segment, arenaSize uint64) bool {
	return s.Len != 0 && s.Off%SegAlign == 0 && uint64(s.Off)+uint64(s.Len) <= arenaSize
}

// ValidateDescriptor checks a decoded descriptor against the session's
// geometry and returns its scatter-gather list, appended to dst. readTable
// copies n bytes at arena offset off into private memory; it is only called
// for an indirect list, after the table's bounds have been checked. known
// reports whether an opcode is served. The errno is what the peer is told.
func ValidateDescriptor(d *Descriptor, g *Geometry, readTable func(off, n uint32) []byte,
	known func(op uint8) bool, dst []Segment) ([]Segment, syscall.Errno) {
	if d.Opcode == 0 || !known(d.Opcode) {
		return dst, syscall.ENOSYS
	}
	if d.Flags&^knownFlags != 0 {
		return dst, syscall.EINVAL
	}
	n := uint32(d.NSeg)
	if n > g.MaxSegments {
		return dst, syscall.E2BIG
	}
	start := len(dst)
	if d.Flags&FlagIndirect != 0 {
		if g.Features&FeatureIndirect == 0 {
			return dst, syscall.EINVAL
		}
		t := d.Inline[0]
		if n == 0 || uint64(t.Len) != uint64(n)*SegmentSize || !segmentOK(t, g.ArenaSize) {
			return dst, syscall.EFAULT
		}
		tb := readTable(t.Off, t.Len)
		if len(tb) != int(t.Len) {
			return dst, syscall.EFAULT
		}
		le := binary.LittleEndian
		for i := uint32(0); i < n; i++ {
			dst = append(dst, Segment{Off: le.Uint32(tb[i*SegmentSize:]), Len: le.Uint32(tb[i*SegmentSize+4:])})
		}
	} else {
		if n > InlineSegs {
			return dst, syscall.E2BIG
		}
		dst = append(dst, d.Inline[:n]...)
	}
	var total uint64
	for _, s := range dst[start:] {
		if !segmentOK(s, g.ArenaSize) {
			return dst[:start], syscall.EFAULT
		}
		total += uint64(s.Len)
	}
	if total != d.Length {
		return dst[:start], syscall.EINVAL
	}
	return dst, 0
}
