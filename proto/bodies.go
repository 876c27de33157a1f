package proto

import (
	"encoding/binary"
	"strings"
	"syscall"
)

// Attr is an inode's attributes as a client sees them. Where a file's data
// lives is not part of it: clients never learn blob ids.
type Attr struct {
	Ino                 uint64
	Mode                uint32 // syscall.S_IF* type bits | permission, setuid, setgid, sticky bits
	UID, GID            uint32
	Nlink               uint32
	Size                int64
	Atime, Mtime, Ctime int64 // Unix nanoseconds
}

// ValidMode reports whether m is a mode a service may answer: a regular
// file or a directory, and no bits beyond the type and 07777; or a
// symbolic link, S_IFLNK|0777.
func ValidMode(m uint32) bool {
	switch m & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFDIR:
		return m&^(syscall.S_IFMT|0o7777) == 0
	case syscall.S_IFLNK:
		return m == syscall.S_IFLNK|0o777
	}
	return false
}

// DecodeAttr decodes an attr response (exactly AttrSize bytes) and checks
// what a client relies on: a known mode and a size that is not negative.
func DecodeAttr(b []byte) (Attr, error) {
	d := NewDec(b)
	a := d.Attr()
	if err := d.End(); err != nil {
		return Attr{}, err
	}
	if !ValidMode(a.Mode) || a.Size < 0 {
		return Attr{}, syscall.EINVAL
	}
	return a, nil
}

// AppendAttr appends an attr response.
func AppendAttr(b []byte, a *Attr) []byte {
	e := Enc{B: b}
	e.Attr(a)
	return e.B
}

// HelloReq is OpHello's request.
type HelloReq struct {
	MinVersion, MaxVersion uint32
	Features               uint64
}

// Append encodes r.
func (r *HelloReq) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U32(r.MinVersion)
	e.U32(r.MaxVersion)
	e.U64(r.Features)
	return e.B
}

// DecodeHelloReq decodes OpHello's request.
func DecodeHelloReq(b []byte) (HelloReq, error) {
	d := NewDec(b)
	r := HelloReq{MinVersion: d.U32(), MaxVersion: d.U32(), Features: d.U64()}
	return r, d.Err()
}

// HelloRespSize is the length of OpHello's response.
const HelloRespSize = 4 + 4 + 8 + 8 + TokenSize

// HelloResp is OpHello's response.
type HelloResp struct {
	Version  uint32
	Features uint64
	Session  uint64
	Token    [TokenSize]byte
}

// Append encodes r.
func (r *HelloResp) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U32(r.Version)
	e.U32(0)
	e.U64(r.Features)
	e.U64(r.Session)
	e.Bytes(r.Token[:])
	return e.B
}

// DecodeHelloResp decodes OpHello's response.
func DecodeHelloResp(b []byte) (HelloResp, error) {
	d := NewDec(b)
	r := HelloResp{Version: d.U32()}
	if d.U32() != 0 {
		return HelloResp{}, syscall.EINVAL
	}
	r.Features = d.U64()
	r.Session = d.U64()
	d.Fixed(r.Token[:])
	return r, d.End()
}

// PathReq is the request of OpStat, OpRmdir and OpUnlink.
type PathReq struct{ Path string }

// Append encodes r.
func (r *PathReq) Append(b []byte) []byte {
	e := Enc{B: b}
	e.Str(r.Path)
	return e.B
}

// DecodePathReq decodes a single-path request.
func DecodePathReq(b []byte) (PathReq, error) {
	d := NewDec(b)
	r := PathReq{Path: d.Str()}
	return r, d.Err()
}

// ModePathReq is the request of OpOpen (Mode: permission bits of a created
// file), OpMkdir (the same for the directory) and OpChmod (the new mode).
type ModePathReq struct {
	Mode uint32
	Path string
}

// Append encodes r.
func (r *ModePathReq) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U32(r.Mode)
	e.Str(r.Path)
	return e.B
}

// DecodeModePathReq decodes a mode-and-path request.
func DecodeModePathReq(b []byte) (ModePathReq, error) {
	d := NewDec(b)
	r := ModePathReq{Mode: d.U32(), Path: d.Str()}
	return r, d.Err()
}

// RenameReq is OpRename's request; the descriptor's Handle is the old
// name's directory.
type RenameReq struct {
	NewDir   uint64
	Old, New string
}

// Append encodes r.
func (r *RenameReq) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U64(r.NewDir)
	e.Str(r.Old)
	e.Str(r.New)
	return e.B
}

// DecodeRenameReq decodes OpRename's request.
func DecodeRenameReq(b []byte) (RenameReq, error) {
	d := NewDec(b)
	r := RenameReq{NewDir: d.U64(), Old: d.Str(), New: d.Str()}
	return r, d.Err()
}

// SymlinkReq is OpSymlink's request: a link at Path holding Target.
type SymlinkReq struct{ Target, Path string }

// Append encodes r.
func (r *SymlinkReq) Append(b []byte) []byte {
	e := Enc{B: b}
	e.Str(r.Target)
	e.Str(r.Path)
	return e.B
}

// DecodeSymlinkReq decodes OpSymlink's request.
func DecodeSymlinkReq(b []byte) (SymlinkReq, error) {
	d := NewDec(b)
	r := SymlinkReq{Target: d.Str(), Path: d.Str()}
	return r, d.Err()
}

// OwnerReq is OpChown's request (with Path) and OpFChown's (without): -1
// leaves the uid or gid unchanged.
type OwnerReq struct {
	UID, GID int64
	Path     string
}

// Append encodes r, with its path when withPath.
func (r *OwnerReq) Append(b []byte, withPath bool) []byte {
	e := Enc{B: b}
	e.I64(r.UID)
	e.I64(r.GID)
	if withPath {
		e.Str(r.Path)
	}
	return e.B
}

// DecodeOwnerReq decodes OpChown's request (withPath) or OpFChown's.
func DecodeOwnerReq(b []byte, withPath bool) (OwnerReq, error) {
	d := NewDec(b)
	r := OwnerReq{UID: d.I64(), GID: d.I64()}
	if withPath {
		r.Path = d.Str()
	}
	return r, d.Err()
}

// TimesReq is OpChtimes's request (with Path) and OpFChtimes's (without);
// TimeOmit leaves a time unchanged.
type TimesReq struct {
	Atime, Mtime int64
	Path         string
}

// Append encodes r, with its path when withPath.
func (r *TimesReq) Append(b []byte, withPath bool) []byte {
	e := Enc{B: b}
	e.I64(r.Atime)
	e.I64(r.Mtime)
	if withPath {
		e.Str(r.Path)
	}
	return e.B
}

// DecodeTimesReq decodes OpChtimes's request (withPath) or OpFChtimes's.
func DecodeTimesReq(b []byte, withPath bool) (TimesReq, error) {
	d := NewDec(b)
	r := TimesReq{Atime: d.I64(), Mtime: d.I64()}
	if withPath {
		r.Path = d.Str()
	}
	return r, d.Err()
}

// ReadDirReq is OpReadDir's request: the entries of Path after the name
// After ("" = from the start).
type ReadDirReq struct{ Path, After string }

// Append encodes r.
func (r *ReadDirReq) Append(b []byte) []byte {
	e := Enc{B: b}
	e.Str(r.Path)
	e.Str(r.After)
	return e.B
}

// DecodeReadDirReq decodes OpReadDir's request.
func DecodeReadDirReq(b []byte) (ReadDirReq, error) {
	d := NewDec(b)
	r := ReadDirReq{Path: d.Str(), After: d.Str()}
	return r, d.Err()
}

// Dirent is one directory entry.
type Dirent struct {
	Ino  uint64
	Mode uint32 // S_IF* type bits only
	Name string
}

// DirentSize is the encoded size of an entry with a name of n bytes.
func DirentSize(n int) int { return 8 + 4 + 2 + n }

// ValidName reports whether name may be a directory entry: 1 to MaxName
// bytes, neither "." nor "..", no '/' and no NUL.
func ValidName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= MaxName &&
		!strings.ContainsAny(name, "/\x00")
}

// AppendDirents encodes a ReadDir response of as many entries of ents as
// fit in limit bytes; it returns the body and the number encoded.
func AppendDirents(b []byte, ents []Dirent, limit int) ([]byte, int) {
	e := Enc{B: b}
	start := len(b)
	e.U32(0) // count, filled in below
	n := 0
	for _, de := range ents {
		if len(e.B)-start+DirentSize(len(de.Name)) > limit {
			break
		}
		e.U64(de.Ino)
		e.U32(de.Mode)
		e.Str(de.Name)
		n++
	}
	e.B[start], e.B[start+1], e.B[start+2], e.B[start+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	return e.B, n
}

// DecodeDirents decodes a ReadDir response and checks each entry: a valid
// name, a type that is a file or a directory, names in increasing order.
func DecodeDirents(b []byte) ([]Dirent, error) {
	d := NewDec(b)
	n := d.U32()
	if d.Err() != nil || uint64(n)*uint64(DirentSize(1)) > uint64(d.Len()) {
		return nil, syscall.EINVAL
	}
	ents := make([]Dirent, 0, n)
	for range n {
		de := Dirent{Ino: d.U64(), Mode: d.U32(), Name: d.Str()}
		if d.Err() != nil || !ValidName(de.Name) ||
			(de.Mode != syscall.S_IFREG && de.Mode != syscall.S_IFDIR && de.Mode != syscall.S_IFLNK) ||
			(len(ents) > 0 && ents[len(ents)-1].Name >= de.Name) {
			return nil, syscall.EINVAL
		}
		ents = append(ents, de)
	}
	return ents, d.End()
}

// Ticket lets the session it was issued to reopen a file after a restart
// of the metadata service (FeatureReopen). It is opaque to the client.
type Ticket [TicketSize]byte

// OpenRespSize is the length of OpOpen's response in a session that
// negotiated features.
func OpenRespSize(features uint64) int {
	n := 8 + AttrSize + 2
	if features&FeatureReopen != 0 {
		n += TicketSize
	}
	if features&FeatureLeases != 0 {
		n += 8
	}
	if features&FeatureOpenCap != 0 {
		n += 1 + CapSize
	}
	return n
}

// OpenResp is the response of OpOpen and OpReopen:
//
//	0  u64 handle   8  attr (AttrSize)   8+AttrSize  u8 created   +1  u8 granted
//	then, with FeatureReopen, the ticket (TicketSize);
//	then, with FeatureLeases, u64 data handle;
//	then, with FeatureOpenCap, u8 has cap, CapSize bytes of capability
//	(zeros when has cap is 0)
type OpenResp struct {
	Handle  uint64
	Attr    Attr
	Created bool
	Granted bool
	// Ticket is present when HasTicket (FeatureReopen was negotiated).
	HasTicket bool
	Ticket    Ticket
	// DataHandle, present when HasDataHandle (FeatureLeases), is the
	// handle the file's IO requests name: Handle, or the id of the
	// session's kept lease of the file (then Granted).
	HasDataHandle bool
	DataHandle    uint64
	// CapRoom is set when the layout has the capability field
	// (FeatureOpenCap); HasCap when the service put one in it: the read
	// capability of the handle (its DataHandle), to claim at io with
	// OpClaim before the first read, as OpGrant's would be.
	CapRoom bool
	HasCap  bool
	Cap     [CapSize]byte
}

// Append encodes r.
func (r *OpenResp) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U64(r.Handle)
	e.Attr(&r.Attr)
	e.Bool(r.Created)
	e.Bool(r.Granted)
	if r.HasTicket {
		e.Bytes(r.Ticket[:])
	}
	if r.HasDataHandle {
		e.U64(r.DataHandle)
	}
	if r.CapRoom {
		e.Bool(r.HasCap)
		var c [CapSize]byte
		if r.HasCap {
			c = r.Cap
		}
		e.Bytes(c[:])
	}
	return e.B
}

// DecodeOpenResp decodes the response of OpOpen or OpReopen in a session
// that negotiated features (the ticket with FeatureReopen, the data
// handle with FeatureLeases, room for a capability with FeatureOpenCap).
func DecodeOpenResp(b []byte, features uint64) (OpenResp, error) {
	d := NewDec(b)
	r := OpenResp{Handle: d.U64(), Attr: d.Attr(), Created: d.Bool(), Granted: d.Bool(),
		HasTicket: features&FeatureReopen != 0, HasDataHandle: features&FeatureLeases != 0,
		CapRoom: features&FeatureOpenCap != 0}
	if r.HasTicket {
		d.Fixed(r.Ticket[:])
	}
	if r.HasDataHandle {
		r.DataHandle = d.U64()
	}
	if r.CapRoom {
		r.HasCap = d.Bool()
		d.Fixed(r.Cap[:])
		if !r.HasCap && r.Cap != ([CapSize]byte{}) {
			return OpenResp{}, syscall.EINVAL // padding must be zeros
		}
	}
	if err := d.End(); err != nil {
		return OpenResp{}, err
	}
	if r.Handle == 0 || !ValidMode(r.Attr.Mode) || r.Attr.Mode&syscall.S_IFMT == syscall.S_IFLNK || r.Attr.Size < 0 || (r.HasCap && r.Granted) {
		return OpenResp{}, syscall.EINVAL
	}
	return r, nil
}

// IOHandle is the handle the file's IO requests name: DataHandle when
// the response has one (FeatureLeases), Handle otherwise.
func (r *OpenResp) IOHandle() uint64 {
	if r.HasDataHandle && r.DataHandle != 0 {
		return r.DataHandle
	}
	return r.Handle
}

// DecodeTicket decodes OpReopen's request.
func DecodeTicket(b []byte) (Ticket, error) {
	var t Ticket
	d := NewDec(b)
	d.Fixed(t[:])
	return t, d.Err()
}

// AttachReq is OpAttach's request.
type AttachReq struct {
	Version uint32
	Session uint64
	Token   [TokenSize]byte
}

// AttachReqSize is its length.
const AttachReqSize = 4 + 4 + 8 + TokenSize

// Append encodes r.
func (r *AttachReq) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U32(r.Version)
	e.U32(0)
	e.U64(r.Session)
	e.Bytes(r.Token[:])
	return e.B
}

// DecodeAttachReq decodes OpAttach's request.
func DecodeAttachReq(b []byte) (AttachReq, error) {
	d := NewDec(b)
	r := AttachReq{Version: d.U32()}
	if d.U32() != 0 {
		return AttachReq{}, syscall.EINVAL
	}
	r.Session = d.U64()
	d.Fixed(r.Token[:])
	return r, d.Err()
}

// GetAttrRespSize is the length of OpGetAttr's response.
const GetAttrRespSize = 8 + 8 + 1

// GetAttrResp is OpGetAttr's response: the live size and mtime of an open
// file at the IO service; Mtime means something only when Changed (the
// file changed since the IO service opened it).
type GetAttrResp struct {
	Size, Mtime int64
	Changed     bool
}

// Append encodes r.
func (r *GetAttrResp) Append(b []byte) []byte {
	e := Enc{B: b}
	e.I64(r.Size)
	e.I64(r.Mtime)
	e.Bool(r.Changed)
	return e.B
}

// DecodeGetAttrResp decodes OpGetAttr's response.
func DecodeGetAttrResp(b []byte) (GetAttrResp, error) {
	d := NewDec(b)
	r := GetAttrResp{Size: d.I64(), Mtime: d.I64(), Changed: d.Bool()}
	if err := d.End(); err != nil {
		return GetAttrResp{}, err
	}
	if r.Size < 0 {
		return GetAttrResp{}, syscall.EINVAL
	}
	return r, nil
}

// SnapEntry is one entry of OpDirLease's answer: a regular file of the
// directory that the session may open for reading, with the capability
// that opens it at io (OpClaimDir). Encoded (little-endian):
//
//	0  u64 ino
//	8  u32 mode      (S_IFREG | permission bits)
//	12 [64]byte cap  (opaque to the client; internal/grantcap)
//	76 u16 name length, name bytes
type SnapEntry struct {
	Ino  uint64
	Mode uint32
	Cap  [CapSize]byte
	Name string
}

// SnapEntrySize is the encoded size of an entry with a name of n bytes.
func SnapEntrySize(n int) int { return 8 + 4 + CapSize + 2 + n }

// AppendSnapEntries encodes an OpDirLease answer of as many entries of
// ents as fit in limit bytes (a u32 count, then the entries); it returns
// the body and the number encoded.
func AppendSnapEntries(b []byte, ents []SnapEntry, limit int) ([]byte, int) {
	e := Enc{B: b}
	start := len(b)
	e.U32(0)
	n := 0
	for i := range ents {
		se := &ents[i]
		if len(e.B)-start+SnapEntrySize(len(se.Name)) > limit {
			break
		}
		e.U64(se.Ino)
		e.U32(se.Mode)
		e.Bytes(se.Cap[:])
		e.Str(se.Name)
		n++
	}
	e.B[start], e.B[start+1], e.B[start+2], e.B[start+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	return e.B, n
}

// DecodeSnapEntries decodes an OpDirLease answer and checks each entry:
// a valid name, a regular file, names in increasing order.
func DecodeSnapEntries(b []byte) ([]SnapEntry, error) {
	d := NewDec(b)
	n := d.U32()
	if d.Err() != nil || uint64(n)*uint64(SnapEntrySize(1)) > uint64(d.Len()) {
		return nil, syscall.EINVAL
	}
	ents := make([]SnapEntry, n)
	for i := range ents {
		se := &ents[i]
		se.Ino, se.Mode = d.U64(), d.U32()
		d.Fixed(se.Cap[:])
		se.Name = d.Str()
		if d.Err() != nil || !ValidName(se.Name) || se.Mode&syscall.S_IFMT != syscall.S_IFREG ||
			(i > 0 && ents[i-1].Name >= se.Name) {
			return nil, syscall.EINVAL
		}
	}
	return ents, d.End()
}

// Lock classes (LockReq.Class): whose a lock is, as Linux keeps them.
// POSIX record locks (fcntl F_SETLK) are the session's, released when it
// closes any handle of the file or ends; OFD locks (F_OFD_SETLK) and
// flock locks are the open file description's, released when no handle
// of it is left (a description shared across fork or exec has a handle
// in each process: OpInherit). POSIX and OFD locks conflict with each
// other; flock locks only with flock locks.
const (
	LockPOSIX uint8 = 0
	LockOFD   uint8 = 1
	LockFlock uint8 = 2
)

// Lock types (LockReq.Type, LockResp.Type).
const (
	LockRead   uint8 = 0
	LockWrite  uint8 = 1
	LockUnlock uint8 = 2
)

// LockEOF as a lock's End: to the end of the file, however it grows.
const LockEOF = ^uint64(0)

// LockReqSize is the size of OpLock's request and answer.
const LockReqSize = 24

// LockReq is OpLock's request: set (Get false) or test (Get true) a lock
// of Type on the bytes [Start, End) of the handle's file.
//
//	lock request (24 bytes)
//	  0 u8  get      1: F_GETLK (test), 0: set
//	  1 u8  type     LockRead, LockWrite, LockUnlock (not with get)
//	  2 u8  class    LockPOSIX, LockOFD, LockFlock
//	  3 [5] zero
//	  8 u64 start
//	 16 u64 end      exclusive; LockEOF: to the end of the file
type LockReq struct {
	Get         bool
	Type, Class uint8
	Start, End  uint64
}

// Append encodes r.
func (r *LockReq) Append(b []byte) []byte {
	e := Enc{B: b}
	g := uint8(0)
	if r.Get {
		g = 1
	}
	e.U8(g)
	e.U8(r.Type)
	e.U8(r.Class)
	e.Bytes(make([]byte, 5))
	e.U64(r.Start)
	e.U64(r.End)
	return e.B
}

// DecodeLockReq decodes and checks OpLock's request.
func DecodeLockReq(b []byte) (LockReq, error) {
	if len(b) != LockReqSize {
		return LockReq{}, syscall.EINVAL
	}
	r := LockReq{Get: b[0] == 1, Type: b[1], Class: b[2],
		Start: binary.LittleEndian.Uint64(b[8:]), End: binary.LittleEndian.Uint64(b[16:])}
	for _, z := range b[3:8] {
		if z != 0 {
			return LockReq{}, syscall.EINVAL
		}
	}
	if b[0] > 1 || r.Type > LockUnlock || r.Class > LockFlock || (r.Get && r.Type == LockUnlock) || r.Start >= r.End {
		return LockReq{}, syscall.EINVAL
	}
	return r, nil
}

// LockResp is OpLock's answer to a test: the first lock in the way, or
// Type LockUnlock if none is.
//
//	lock answer (24 bytes)
//	  0 u8  type     LockRead, LockWrite, LockUnlock (none in the way)
//	  1 u8  class    the holder's
//	  2 [2] zero
//	  4 i32 pid      the holding process (POSIX), -1 (OFD, flock)
//	  8 u64 start
//	 16 u64 end
type LockResp struct {
	Type, Class uint8
	PID         int32
	Start, End  uint64
}

// Append encodes r.
func (r *LockResp) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U8(r.Type)
	e.U8(r.Class)
	e.Bytes([]byte{0, 0})
	e.U32(uint32(r.PID))
	e.U64(r.Start)
	e.U64(r.End)
	return e.B
}

// DecodeLockResp decodes OpLock's answer to a test.
func DecodeLockResp(b []byte) (LockResp, error) {
	if len(b) != LockReqSize || b[0] > LockUnlock || b[1] > LockFlock {
		return LockResp{}, syscall.EPROTO
	}
	return LockResp{Type: b[0], Class: b[1], PID: int32(binary.LittleEndian.Uint32(b[4:])),
		Start: binary.LittleEndian.Uint64(b[8:]), End: binary.LittleEndian.Uint64(b[16:])}, nil
}

// StatFSRespSize is the size of OpStatFS's answer.
const StatFSRespSize = 24

// StatFSResp is OpStatFS's answer: the store's room in bytes.
//
//	statfs answer (24 bytes)
//	  0 u64 total
//	  8 u64 free     to the superuser
//	 16 u64 avail    to anyone
type StatFSResp struct{ Total, Free, Avail uint64 }

// Append encodes r.
func (r *StatFSResp) Append(b []byte) []byte {
	e := Enc{B: b}
	e.U64(r.Total)
	e.U64(r.Free)
	e.U64(r.Avail)
	return e.B
}
