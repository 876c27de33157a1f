// Package ring is weir's data path: lock-free shared-memory scatter-gather
// rings between a client process and a service, with no socket on the way.
//
// A session's shared memory is one memfd, created by the service, sealed
// against shrinking and growing, and passed to the client once over a Unix
// socket (SCM_RIGHTS) after the kernel has told the service who the client
// is (SO_PEERCRED). The socket then only tells each side when the other
// has gone. Layout, ABI version 1. All integers are little-endian: the
// fields encoded byte by byte explicitly, and the sequence, doorbell and
// state words because weir runs only on little-endian hosts (amd64, arm64),
// where they are accessed natively with atomics.
//
//	offset 0          +---------------------------------------------+
//	                  | header, 4096 bytes                          |
//	                  |   0 magic "WEIRRING"  8 abi version          |
//	                  |  12 header size      16 feature bits         |
//	                  |  24 SQ entries       28 CQ entries           |
//	                  |  32 SQ slot size     36 CQ slot size         |
//	                  |  40 block size       44 max segments         |
//	                  |  48 SQ off  56 CQ off  64 arena off          |
//	                  |  72 arena size       80 total size           |
//	                  | 128 SQ bell/waiters  192 CQ bell/waiters     |
//	                  | 256 server state     320 client state        |
//	SQ offset (4096)  +---------------------------------------------+
//	                  | SQ: SQEntries x 128-byte descriptors         |
//	                  |   0 seq  8 op  9 flags  10 nseg  12 arg      |
//	                  |  16 req id  24 handle  32 offset  40 length  |
//	                  |  48 10 x {u32 off, u32 len} segments         |
//	CQ offset         +---------------------------------------------+
//	                  | CQ: CQEntries x 32-byte completions          |
//	                  |   0 seq  8 req id  16 result  24 aux         |
//	arena offset      +---------------------------------------------+
//	                  | arena: payload blocks of BlockSize bytes     |
//	total size        +---------------------------------------------+
//
// Both queues are Vyukov bounded MPMC queues; each side keeps its own queue
// position in private memory, so shared memory holds only sequence words,
// descriptors, completions and payload. Payload never passes through a
// queue: a descriptor names arena segments (inline, or an indirect table in
// the arena for more than ten). Completions need not come in submission
// order: a service may serve many requests of a session at once
// (AsyncHandler), and the client matches each completion to its request by
// id.
//
// The peer is hostile. Every descriptor is copied out of its slot once,
// then validated (opcode known, flags known, segments aligned, non-empty and
// inside the arena, lengths summing to Length); a bad one gets an errno
// completion. A sequence word no honest peer writes, or a change to the
// immutable header, marks the session damaged and ends it alone. Waiting
// never outlives the peer: socket EOF or the peer's pidfd wakes every
// waiter with ErrPeerGone, and no futex sleep lasts longer than 50 ms
// before the waiter looks again.
//
// docs/ring-abi.md is the full contract, including the memory ordering, and
// include/weir_ring.h is the same layout for C.
package ring
