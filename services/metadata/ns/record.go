package ns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// WAL record types (format version 1). Every record describes a change by
// inode numbers and names, after all permission and errno checks passed,
// so replay needs no credentials and reaches exactly the state the live
// service had.
const (
	recCreate  uint8 = 1  // create a file or directory
	recRemove  uint8 = 2  // unlink or rmdir
	recRename  uint8 = 3  // rename, possibly replacing a target
	recSetAttr uint8 = 4  // chmod, chown, utimes, truncate, O_TRUNC, live size/mtime
	recFree    uint8 = 5  // drop an inode whose nlink is 0 and that nobody has open
	recBoot    uint8 = 6  // a start of the service: its incarnation, the stack id, the ticket key
	recDead    uint8 = 7  // a blob with no file (an orphan found in the backend) awaits deletion
	recGone    uint8 = 8  // the IO service deleted a blob that awaited deletion
	recAlloc   uint8 = 9  // the IO service was told that blob ids below a limit are allocated
	recSymlink uint8 = 10 // create a symbolic link
	recLink    uint8 = 11 // give a file one more name (a hard link)
)

// Flags of remove and rename records.
const flagFree uint8 = 1 // the unlinked (or replaced) inode is dropped at once

// Field mask of setattr records.
const (
	setMode uint8 = 1 << iota
	setUID
	setGID
	setSize
	setAtime
	setMtime
	setCtime
	setAll = setMode | setUID | setGID | setSize | setAtime | setMtime | setCtime
)

// record is one logged change.
type record interface {
	typ() uint8
	encode(dst []byte) []byte
}

type createRec struct {
	parent, ino    Ino
	mode, uid, gid uint32 // mode includes the S_IF type bits
	time           int64
	name           string
}

type removeRec struct {
	parent, ino Ino
	time        int64
	flags       uint8
	name        string
}

type renameRec struct {
	oldParent, newParent Ino
	ino                  Ino // the inode that moves
	replaced             Ino // the inode newName pointed at, or 0
	time                 int64
	flags                uint8
	oldName, newName     string
}

type setAttrRec struct {
	ino                       Ino
	mask                      uint8
	mode, uid, gid            uint32
	size, atime, mtime, ctime int64
}

// symlinkRec creates a symbolic link (mode S_IFLNK|0777) holding target.
type symlinkRec struct {
	parent, ino Ino
	uid, gid    uint32
	time        int64
	name        string
	target      string
}

// linkRec adds the name name in directory parent for the existing
// non-directory ino.
type linkRec struct {
	parent, ino Ino
	time        int64
	name        string
}

type freeRec struct{ ino Ino }

// bootRec starts an incarnation. The first one of a namespace chooses the
// stack id and the ticket key; every later one repeats them.
type bootRec struct {
	incarnation uint32
	stackID     [16]byte
	key         [32]byte
}

// deadRec and goneRec add a blob to, and remove it from, the set of blobs
// awaiting deletion (a freed file's blob joins it with its free record).
type deadRec struct{ blob uint64 }
type goneRec struct{ blob uint64 }

// allocRec records a promise to the IO service: blob ids below limit are
// allocated (io creates blobs for grants below it). The next start's
// inode numbers begin at it, so no new file meets a blob of an earlier
// life whose create record a power cut lost.
type allocRec struct{ limit Ino }

// typ implements record.
func (*createRec) typ() uint8 { return recCreate }

// typ implements record.
func (*removeRec) typ() uint8 { return recRemove }

// typ implements record.
func (*renameRec) typ() uint8 { return recRename }

// typ implements record.
func (*setAttrRec) typ() uint8 { return recSetAttr }

// typ implements record.
func (*freeRec) typ() uint8 { return recFree }

// typ implements record.
func (*symlinkRec) typ() uint8 { return recSymlink }

// typ implements record.
func (*linkRec) typ() uint8 { return recLink }

// typ implements record.
func (*bootRec) typ() uint8 { return recBoot }

// typ implements record.
func (*deadRec) typ() uint8 { return recDead }

// typ implements record.
func (*goneRec) typ() uint8 { return recGone }

// typ implements record.
func (*allocRec) typ() uint8 { return recAlloc }

var le = binary.LittleEndian

// appendName encodes a name as u8 length and bytes.
func appendName(b []byte, name string) []byte {
	b = append(b, uint8(len(name)))
	return append(b, name...)
}

// encode implements record (layout in the package comment).
func (r *createRec) encode(b []byte) []byte {
	b = le.AppendUint64(b, uint64(r.parent))
	b = le.AppendUint64(b, uint64(r.ino))
	b = le.AppendUint32(b, r.mode)
	b = le.AppendUint32(b, r.uid)
	b = le.AppendUint32(b, r.gid)
	b = le.AppendUint64(b, uint64(r.time))
	return appendName(b, r.name)
}

// encode implements record.
func (r *removeRec) encode(b []byte) []byte {
	b = le.AppendUint64(b, uint64(r.parent))
	b = le.AppendUint64(b, uint64(r.ino))
	b = le.AppendUint64(b, uint64(r.time))
	b = append(b, r.flags)
	return appendName(b, r.name)
}

// encode implements record.
func (r *renameRec) encode(b []byte) []byte {
	b = le.AppendUint64(b, uint64(r.oldParent))
	b = le.AppendUint64(b, uint64(r.newParent))
	b = le.AppendUint64(b, uint64(r.ino))
	b = le.AppendUint64(b, uint64(r.replaced))
	b = le.AppendUint64(b, uint64(r.time))
	b = append(b, r.flags)
	b = appendName(b, r.oldName)
	return appendName(b, r.newName)
}

// encode implements record.
func (r *setAttrRec) encode(b []byte) []byte {
	b = le.AppendUint64(b, uint64(r.ino))
	b = append(b, r.mask)
	b = le.AppendUint32(b, r.mode)
	b = le.AppendUint32(b, r.uid)
	b = le.AppendUint32(b, r.gid)
	b = le.AppendUint64(b, uint64(r.size))
	b = le.AppendUint64(b, uint64(r.atime))
	b = le.AppendUint64(b, uint64(r.mtime))
	return le.AppendUint64(b, uint64(r.ctime))
}

// encode implements record.
func (r *symlinkRec) encode(b []byte) []byte {
	b = le.AppendUint64(b, uint64(r.parent))
	b = le.AppendUint64(b, uint64(r.ino))
	b = le.AppendUint32(b, r.uid)
	b = le.AppendUint32(b, r.gid)
	b = le.AppendUint64(b, uint64(r.time))
	b = appendName(b, r.name)
	return appendTarget(b, r.target)
}

// encode implements record.
func (r *linkRec) encode(b []byte) []byte {
	b = le.AppendUint64(b, uint64(r.parent))
	b = le.AppendUint64(b, uint64(r.ino))
	b = le.AppendUint64(b, uint64(r.time))
	return appendName(b, r.name)
}

// appendTarget encodes a symbolic link's target as u16 length and bytes.
func appendTarget(b []byte, t string) []byte {
	b = le.AppendUint16(b, uint16(len(t)))
	return append(b, t...)
}

// encode implements record.
func (r *freeRec) encode(b []byte) []byte { return le.AppendUint64(b, uint64(r.ino)) }

// encode implements record.
func (r *bootRec) encode(b []byte) []byte {
	b = le.AppendUint32(b, r.incarnation)
	b = append(b, r.stackID[:]...)
	return append(b, r.key[:]...)
}

// encode implements record.
func (r *deadRec) encode(b []byte) []byte { return le.AppendUint64(b, r.blob) }

// encode implements record.
func (r *goneRec) encode(b []byte) []byte { return le.AppendUint64(b, r.blob) }

// encode implements record.
func (r *allocRec) encode(b []byte) []byte { return le.AppendUint64(b, uint64(r.limit)) }

// decoder reads little-endian fields; the first short read sets err and
// every later read returns zero.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

// take returns the next n bytes, or nil after a short read.
func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = errShort
		d.b = nil
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// u8 reads one byte.
func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

// u32 reads a little-endian uint32.
func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return le.Uint32(v)
	}
	return 0
}

// u64 reads a little-endian uint64.
func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return le.Uint64(v)
	}
	return 0
}

// i64 reads a little-endian int64.
func (d *decoder) i64() int64 { return int64(d.u64()) }

// ino reads an inode number.
func (d *decoder) ino() Ino { return Ino(d.u64()) }

// u16 reads a little-endian uint16.
func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return le.Uint16(v)
	}
	return 0
}

// target reads a u16 length and that many bytes.
func (d *decoder) target() string {
	n := int(d.u16())
	return string(d.take(n))
}

// name reads a u8 length and that many bytes.
func (d *decoder) name() string {
	n := int(d.u8())
	return string(d.take(n))
}

// finish reports a short read or trailing bytes.
func (d *decoder) finish() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%d trailing bytes", len(d.b))
	}
	return nil
}

// decodeRecord decodes the payload of a record of type typ.
func decodeRecord(typ uint8, p []byte) (record, error) {
	d := &decoder{b: p}
	var r record
	switch typ {
	case recCreate:
		r = &createRec{parent: d.ino(), ino: d.ino(), mode: d.u32(), uid: d.u32(), gid: d.u32(), time: d.i64(), name: d.name()}
	case recRemove:
		r = &removeRec{parent: d.ino(), ino: d.ino(), time: d.i64(), flags: d.u8(), name: d.name()}
	case recRename:
		r = &renameRec{oldParent: d.ino(), newParent: d.ino(), ino: d.ino(), replaced: d.ino(), time: d.i64(), flags: d.u8(), oldName: d.name(), newName: d.name()}
	case recSetAttr:
		r = &setAttrRec{ino: d.ino(), mask: d.u8(), mode: d.u32(), uid: d.u32(), gid: d.u32(), size: d.i64(), atime: d.i64(), mtime: d.i64(), ctime: d.i64()}
	case recFree:
		r = &freeRec{ino: d.ino()}
	case recBoot:
		br := &bootRec{incarnation: d.u32()}
		copy(br.stackID[:], d.take(16))
		copy(br.key[:], d.take(32))
		r = br
	case recDead:
		r = &deadRec{blob: d.u64()}
	case recGone:
		r = &goneRec{blob: d.u64()}
	case recAlloc:
		r = &allocRec{limit: d.ino()}
	case recSymlink:
		r = &symlinkRec{parent: d.ino(), ino: d.ino(), uid: d.u32(), gid: d.u32(), time: d.i64(), name: d.name(), target: d.target()}
	case recLink:
		r = &linkRec{parent: d.ino(), ino: d.ino(), time: d.i64(), name: d.name()}
	default:
		return nil, fmt.Errorf("unknown record type %d", typ)
	}
	if err := d.finish(); err != nil {
		return nil, fmt.Errorf("record type %d: %w", typ, err)
	}
	return r, nil
}

// validName reports whether name may be a directory entry.
func validName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > nameMax {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return false
		}
	}
	return true
}

// validTarget reports whether t may be a symbolic link's target: 1 to
// PATH_MAX-1 bytes, no NUL.
func validTarget(t string) bool {
	return t != "" && len(t) < pathMax && strings.IndexByte(t, 0) < 0
}

// modeValid reports whether mode has a supported type and no unknown bits
// (a symbolic link's mode is always S_IFLNK|0777).
func modeValid(mode uint32) bool {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR, syscall.S_IFREG:
		return mode&^(syscall.S_IFMT|0o7777) == 0
	case syscall.S_IFLNK:
		return mode == syscall.S_IFLNK|0o777
	}
	return false
}
