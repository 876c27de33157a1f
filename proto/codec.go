package proto

import (
	"encoding/binary"
	"syscall"
)

// Enc appends encoded fields to a byte slice.
type Enc struct{ B []byte }

// U8 appends one byte.
func (e *Enc) U8(v uint8) { e.B = append(e.B, v) }

// U32 appends a little-endian u32.
func (e *Enc) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }

// U64 appends a little-endian u64.
func (e *Enc) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }

// I64 appends a little-endian i64.
func (e *Enc) I64(v int64) { e.U64(uint64(v)) }

// Bytes appends p as it is.
func (e *Enc) Bytes(p []byte) { e.B = append(e.B, p...) }

// Str appends a length-prefixed string. A string of 64 KiB or more cannot
// be encoded; callers bound paths by MaxPath first.
func (e *Enc) Str(s string) {
	e.B = binary.LittleEndian.AppendUint16(e.B, uint16(len(s)))
	e.B = append(e.B, s...)
}

// Bool appends a u8 that is 1 for true.
func (e *Enc) Bool(v bool) {
	if v {
		e.U8(1)
	} else {
		e.U8(0)
	}
}

// Attr appends an attr (56 bytes).
func (e *Enc) Attr(a *Attr) {
	e.U64(a.Ino)
	e.U32(a.Mode)
	e.U32(a.UID)
	e.U32(a.GID)
	e.U32(a.Nlink)
	e.I64(a.Size)
	e.I64(a.Atime)
	e.I64(a.Mtime)
	e.I64(a.Ctime)
}

// Dec reads fields from an untrusted byte slice. After a failed read every
// later read returns zero values and Err reports EINVAL.
type Dec struct {
	b   []byte
	bad bool
}

// NewDec decodes b.
func NewDec(b []byte) *Dec { return &Dec{b: b} }

func (d *Dec) take(n int) []byte {
	if d.bad || n < 0 || len(d.b) < n {
		d.bad = true
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

// U8 reads one byte.
func (d *Dec) U8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

// U32 reads a little-endian u32.
func (d *Dec) U32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

// U64 reads a little-endian u64.
func (d *Dec) U64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// I64 reads a little-endian i64.
func (d *Dec) I64() int64 { return int64(d.U64()) }

// Bool reads a u8 that must be 0 or 1; anything else is a decoding error.
func (d *Dec) Bool() bool {
	switch d.U8() {
	case 0:
		return false
	case 1:
		return true
	}
	d.bad = true
	return false
}

// Bytes returns the next n bytes (aliasing the input).
func (d *Dec) Bytes(n int) []byte { return d.take(n) }

// Fixed copies the next len(dst) bytes into dst.
func (d *Dec) Fixed(dst []byte) {
	if p := d.take(len(dst)); p != nil {
		copy(dst, p)
	}
}

// Str returns a copy of the next length-prefixed string.
func (d *Dec) Str() string {
	p := d.take(2)
	if p == nil {
		return ""
	}
	return string(d.take(int(binary.LittleEndian.Uint16(p))))
}

// Attr reads an attr.
func (d *Dec) Attr() Attr {
	return Attr{
		Ino: d.U64(), Mode: d.U32(), UID: d.U32(), GID: d.U32(), Nlink: d.U32(),
		Size: d.I64(), Atime: d.I64(), Mtime: d.I64(), Ctime: d.I64(),
	}
}

// Len is the number of bytes not read yet.
func (d *Dec) Len() int { return len(d.b) }

// Err is EINVAL if any read ran past the end or read a bad value, nil
// otherwise. Bytes after the fields are not an error: a request buffer
// holds response space after the request.
func (d *Dec) Err() error {
	if d.bad {
		return syscall.EINVAL
	}
	return nil
}

// End is Err, and also EINVAL if bytes are left: a response must be
// exactly its fields.
func (d *Dec) End() error {
	if d.bad || len(d.b) != 0 {
		return syscall.EINVAL
	}
	return nil
}
