package proto

import "syscall"

// Protocol versions this package speaks. A change that an older peer would
// misread bumps Version; MinVersion is the oldest still served.
const (
	MinVersion uint32 = 1
	MaxVersion uint32 = 1
	Version           = MaxVersion
)

// Feature bits, negotiated in OpHello: the client asks, the service
// answers the bits both have.
const (
	// FeatureReopen: OpOpen answers a reopen ticket, and OpReopen takes
	// one, so that a client can reopen its files after the metadata
	// service restarted. A client that never reopens leaves it off and
	// saves the service a MAC per open.
	FeatureReopen uint64 = 1 << 0

	// FeatureLeases: a session keeps the read grant of a read-only open
	// after its close (a kept lease, services/metadata/leases.go), and
	// OpOpen and OpReopen answer the handle to use on the IO ring
	// (OpenResp.DataHandle): that lease's, when the session holds one of
	// the file, so that the open needs no grant.
	FeatureLeases uint64 = 1 << 1

	// FeatureCaps (with FeatureLeases): OpGrant of a read-only handle may
	// answer a read capability (CapSize bytes, result CapSize) instead of
	// granting it at io over the control plane; the client claims it at
	// io with OpClaim. A claim refused with EKEYREJECTED is asked for again
	// with OpGrant, Arg = GrantThroughIO. internal/grantcap has the format.
	FeatureCaps uint64 = 1 << 2

	// FeatureRecalls: the session may keep one OpRecallWait outstanding;
	// it completes when another trust group's grant recalled grants of
	// the session (docs/architecture.md, "Exclusive leases"), naming
	// their data handles, so that the client asks for them again before
	// its next request instead of after io's EBADF, and drops what it
	// keeps mapped under them.
	FeatureRecalls uint64 = 1 << 3

	// FeatureOpenCap (with FeatureCaps): OpOpen's answer has room for a
	// read capability (OpenResp.Cap), which the service fills where
	// OpGrant would answer one (a read-only open the session holds no
	// lease of): the client claims it at io before its first read, and
	// never sends that OpGrant. Granted is then 0.
	FeatureOpenCap uint64 = 1 << 4

	// FeatureDirOpen (with FeatureOpenCap, FeatureCaps and FeatureLeases,
	// or the service answers it off): OpDirLease answers a snapshot
	// of a directory whose entries carry open capabilities, and the
	// client opens such an entry read-only at io alone (OpClaimDir),
	// with no metadata request: a cold open wakes one service, not two
	// (docs/architecture.md, "Direct opens").
	FeatureDirOpen uint64 = 1 << 5

	// FeatureLinks: the namespace may hold symbolic links, which the
	// client follows: a path operation that meets one it must follow
	// answers -ErrFollow with the link's place in the path in Aux
	// (SplitFollowAux); the client reads the link (OpReadlink of the path
	// up to its end) and sends the rewritten path again. A session
	// without it is answered ELOOP instead: it cannot follow them.
	FeatureLinks uint64 = 1 << 6

	// FeatureMounted (with FeatureLinks): the client mounts weir inside a
	// larger tree (the C shim, at WEIR_MOUNT), so ".." of weir's root
	// leads out of weir: a path that climbs there answers -ErrFollow with
	// FollowAux's above set (the ".." is path[start:end]; the path goes on
	// at the mount's parent with path[end:]). Without it ".." of the root
	// is the root, as under chroot.
	FeatureMounted uint64 = 1 << 7

	// FeatureRecordCuts: the IO service keeps no staging log, so a
	// truncate is not durable at io before it cuts the blob; the client
	// sends OpCut here before every OpTruncate at io, and the service
	// records the new size first if it is below the one recorded. A
	// crash between the two leaves a blob larger than the size recorded
	// (the old bytes, which the next open takes), never a size the blob
	// does not hold. A service with the log answers it off.
	FeatureRecordCuts uint64 = 1 << 8

	// KnownFeatures are the bits this version defines; a service answers
	// no others.
	KnownFeatures = FeatureReopen | FeatureLeases | FeatureCaps | FeatureRecalls | FeatureOpenCap | FeatureDirOpen | FeatureLinks | FeatureMounted | FeatureRecordCuts
)

// Opcodes. The numbers are the ABI: they are written out, never iota, and
// TestOpcodesPinned holds them. Metadata opcodes are 0x10-0x3f, IO
// opcodes 0x40-0x5f, so that an opcode names its service.
const (
	OpHello      uint8 = 0x10
	OpStat       uint8 = 0x11
	OpOpen       uint8 = 0x12
	OpClose      uint8 = 0x13
	OpMkdir      uint8 = 0x14
	OpRmdir      uint8 = 0x15
	OpUnlink     uint8 = 0x16
	OpRename     uint8 = 0x17
	OpChmod      uint8 = 0x18
	OpChown      uint8 = 0x19
	OpChtimes    uint8 = 0x1a
	OpReadDir    uint8 = 0x1b
	OpFStat      uint8 = 0x1c
	OpSyncMeta   uint8 = 0x1d
	OpGrant      uint8 = 0x1e
	OpFChmod     uint8 = 0x1f
	OpFChown     uint8 = 0x20
	OpFChtimes   uint8 = 0x21
	OpReopen     uint8 = 0x22
	OpRecallWait uint8 = 0x23
	OpDirLease   uint8 = 0x24
	OpInherit    uint8 = 0x25
	OpLock       uint8 = 0x26
	OpReadlink   uint8 = 0x27
	OpSymlink    uint8 = 0x28
	OpLink       uint8 = 0x29
	OpCut        uint8 = 0x2a

	OpAttach    uint8 = 0x40
	OpRead      uint8 = 0x41
	OpWrite     uint8 = 0x42
	OpTruncate  uint8 = 0x43
	OpSync      uint8 = 0x44
	OpGetAttr   uint8 = 0x45
	OpCacheMap  uint8 = 0x46
	OpReadahead uint8 = 0x47
	OpClaim     uint8 = 0x48
	OpClaimDir  uint8 = 0x49
	OpRelease   uint8 = 0x4a
	OpStatFS    uint8 = 0x4b
	OpMapPin    uint8 = 0x4c
	OpMapUnpin  uint8 = 0x4d
	OpMapSync   uint8 = 0x4e
	// OpMapWritable is the writable counterpart of OpCacheMap (a data
	// memfd read-write).
	OpMapWritable uint8 = 0x4f
	// OpWriteLog, OpWritePin and OpWriteUnpin are write windows: a
	// client's stores into pinned cache pages, logged in a shared bitmap
	// (docs/cache-abi.md §7).
	OpWriteLog   uint8 = 0x50
	OpWritePin   uint8 = 0x51
	OpWriteUnpin uint8 = 0x52
	// OpSyncFS is syncfs(2) and sync(2) of the store: every file with
	// changes not yet durable is synced as by OpSync (no handle, Arg 0).
	OpSyncFS uint8 = 0x53
)

// Write windows (OpWritePin): a window is WindowPages pages at a multiple
// of WindowPages; a session's write log (OpWriteLog) holds WriteLogSlots
// slots of WriteSlotBytes each, slot i at i*WriteSlotBytes: a bit per page
// of the window pinned in it, page k of the window at bit k%64 of the
// little-endian u64 word k/64. From WriteLogLiveOff, a little-endian u64
// live word per slot (slot i's at WriteLogLiveOff + 8*i) that io sets to 1
// when it pins a window there and to 0 when the window ends (unpinned, its
// grant ended, the session ended), before its last drain; zeros after the
// live words up to WriteLogSize (docs/cache-abi.md §7).
const (
	WindowPages     = 512
	WriteLogSlots   = 256
	WriteSlotBytes  = WindowPages / 8
	WriteLogLiveOff = WriteLogSlots * WriteSlotBytes
	WriteLogSize    = WriteLogLiveOff + 4096
)

// MapPinWritable in OpMapPin's Arg marks a writable mapping's pin.
const MapPinWritable = 1 << 31

// Opcode ranges of the two services; both lie above the ring's own
// opcodes (ring.OpFirstService, checked by a test).
const (
	FirstMetadataOp uint8 = 0x10
	LastMetadataOp  uint8 = 0x3f
	FirstIOOp       uint8 = 0x40
	LastIOOp        uint8 = 0x5f
)

// Arg values.
const (
	// WriteAppend in OpWrite's Arg: write at the end of the file,
	// atomically with respect to every other write of the file.
	WriteAppend uint32 = 1
	// WriteDirect in OpWrite's Arg (with WriteAppend or alone): an
	// O_DIRECT write. It goes to the device past the page cache, whose
	// resident copies of its pages take the new bytes; offset and length
	// are multiples of DirectAlign (EINVAL otherwise, as on Linux).
	WriteDirect uint32 = 2
	// ReadDirect in OpRead's Arg: an O_DIRECT read. It reads the device
	// past the page cache, after writing home the file's dirty pages so
	// that it sees them; offset and length are multiples of DirectAlign.
	ReadDirect uint32 = 1
	// DirectAlign is the alignment of an O_DIRECT transfer's offset and
	// length (the logical block size of Linux's O_DIRECT). Unlike Linux,
	// the buffer itself need not be aligned: the client copies it.
	DirectAlign = 512
	// SyncData in OpSync's Arg: fdatasync (the size and the data, not the
	// times).
	SyncData uint32 = 1
	// PathNoFollow in the Arg of OpStat, OpChown and OpChtimes: a final
	// symbolic link is the object (lstat, lchown,
	// AT_SYMLINK_NOFOLLOW), not followed.
	PathNoFollow uint32 = 1
	// LinkFollow in OpLink's Arg: follow a final symbolic link of the old
	// path (AT_SYMLINK_FOLLOW).
	LinkFollow uint32 = 1
)

// Sizes of fixed parts.
const (
	AttrSize   = 56
	TokenSize  = 32
	TicketSize = 32
	// CapSize is the length of a read capability (FeatureCaps).
	CapSize = 64
	// GrantThroughIO, OpGrant's Arg: do not answer a capability (a claim
	// of one was refused): grant at io.
	GrantThroughIO = 1
	// TenureSize is the reply of an OpGrant of a handle open for writing
	// that gives a reply buffer at least this long: the u64 lease epoch
	// of the file's current tenure (changed by every recall between
	// trust groups; docs/architecture.md, "Leases").
	TenureSize = 8
	// RecallBatch is the most data handles one OpRecallWait completion
	// names (its reply buffer holds RecallBatch u64s).
	RecallBatch = 64
	// RecallAll, OpRecallWait's Aux: more grants were recalled than the
	// reply names; treat every grant of the session as recalled.
	RecallAll = 1
	// ClaimDirSize is OpClaimDir's payload: an entry's capability and
	// the u64 handle of an earlier direct open to release (0: none).
	ClaimDirSize = CapSize + 8
	// DirOpenBit is set in the handles io makes for direct opens
	// (OpClaimDir), and in no handle the metadata service makes (its
	// incarnations stay below MaxIncarnation).
	DirOpenBit uint64 = 1 << 63
	// MaxPath is the longest path a request may carry (PATH_MAX - 1).
	MaxPath = 4095
	// MaxName is the longest name of one component (NAME_MAX).
	MaxName = 255
	// MaxFileSize is the largest file weir stores (64 TiB, the IO
	// service's largest blob), its s_maxbytes: a write or truncate past
	// it is EFBIG at io, a seek past it EINVAL at the client, as Linux
	// answers past a file system's largest file. A backend may stop
	// sooner (the file backend where its file system does: ext4 with 4
	// KiB blocks at 16 TiB - 4 KiB), with EFBIG.
	MaxFileSize int64 = 1 << 46
	// RootHandle in a path operation's Handle means the root directory.
	RootHandle uint64 = 0
)

// TimeOmit in a time field leaves that time unchanged (UTIME_OMIT).
const TimeOmit int64 = -1 << 63

// TimeNow in a time field sets that time to the metadata service's clock
// (UTIME_NOW, or utimensat's NULL times). Only explicit times need the
// caller to own the file (else EPERM); times set to now need the owner,
// root or write permission (else EACCES), as Linux's touch rule.
const TimeNow int64 = -1<<63 + 1

// Identifiers: session ids and handles carry the metadata service's
// incarnation in their top IncarnationBits bits and a counter below.
const (
	IncarnationBits = 24
	CounterBits     = 64 - IncarnationBits
	// MaxIncarnation is the largest incarnation an id can carry: the top
	// bit of an id is DirOpenBit, never an incarnation's.
	MaxIncarnation = 1<<(IncarnationBits-1) - 1
)

// MakeID returns the id with counter n in incarnation inc.
func MakeID(inc uint32, n uint64) uint64 {
	return uint64(inc)<<CounterBits | n&(1<<CounterBits-1)
}

// IncarnationOf returns the incarnation an id was issued in.
func IncarnationOf(id uint64) uint32 { return uint32(id >> CounterBits) }

// Errors a client sees that say something about the protocol itself.
const (
	// ErrVersion: no protocol version in common (Aux carries the
	// service's range).
	ErrVersion = syscall.EPROTONOSUPPORT
	// ErrStale: the session or handle belongs to an earlier incarnation
	// of the metadata service; re-establish it.
	ErrStale = syscall.ESTALE
	// ErrFollow (FeatureLinks): the path met a symbolic link the
	// operation follows; Aux says where (FollowAux). It is above every
	// errno (Linux's end at 4095), so no client takes it for one.
	ErrFollow syscall.Errno = 4096
)

// FollowAux packs where a path met a symbolic link into a completion's
// Aux: the link is path[start:end] of the request's first path, or of its
// second (OpRename's and OpLink's new path) when second is set; above: it
// is a ".." of weir's root (FeatureMounted), no link.
//
//	bits  0-15 start   16-31 end   32 second   33 above   34-63 zero
func FollowAux(start, end int, second, above bool) uint64 {
	a := uint64(start)&0xffff | (uint64(end)&0xffff)<<16
	if second {
		a |= 1 << 32
	}
	if above {
		a |= 1 << 33
	}
	return a
}

// SplitFollowAux unpacks FollowAux; ok is false for a value FollowAux
// cannot give for a path of n bytes (the client treats it as EIO).
func SplitFollowAux(aux uint64, n int) (start, end int, second, above, ok bool) {
	start, end, second, above = int(aux&0xffff), int(aux>>16&0xffff), aux>>32&1 == 1, aux>>33&1 == 1
	return start, end, second, above, aux>>34 == 0 && start < end && end <= n
}

// VersionRange packs a version range into a completion's Aux.
func VersionRange(lo, hi uint32) uint64 { return uint64(lo)<<32 | uint64(hi) }

// SplitVersionRange unpacks it.
func SplitVersionRange(aux uint64) (lo, hi uint32) { return uint32(aux >> 32), uint32(aux) }

// Negotiate picks the version a service speaking [MinVersion, MaxVersion]
// uses with a client speaking [lo, hi]; ok is false without one in common.
func Negotiate(lo, hi uint32) (v uint32, ok bool) {
	v = min(hi, MaxVersion)
	if v < max(lo, MinVersion) {
		return 0, false
	}
	return v, true
}
