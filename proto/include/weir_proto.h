/*
 * weir_proto.h: the request protocol of weir's services, for C clients.
 *
 * This restates package proto (github.com/weir-storage/weir/proto, doc.go
 * has the full text); proto/cheader_test.go checks every number here
 * against the Go definitions and compiles the structs to check their
 * layout. The rings themselves (regions, queues, descriptors, the socket
 * handshake) are ring/include/weir_ring.h.
 *
 * Sessions. A client process opens one ring session with each service
 * (metadata.sock, io.sock), then:
 *
 *   1. metadata ring: WEIR_OP_HELLO {min version, max version, features}
 *        -> {version, features, session id, 32-byte token}
 *        -EPROTONOSUPPORT: no version in common; the completion's aux is
 *        the service's range (min << 32 | max)
 *   2. io ring: WEIR_OP_ATTACH {version, session id, token}
 *        EPERM if the session is not this process's (the services compare
 *        the pid and uid the kernel reports for both sockets); EAGAIN if
 *        the IO service could not reach the metadata service: try again
 *   3. metadata ring: WEIR_OP_OPEN -> handle, attr, created, granted
 *        (and a reopen ticket with WEIR_FEATURE_REOPEN, and the data
 *        handle with WEIR_FEATURE_LEASES)
 *   4. metadata ring: WEIR_OP_GRANT {handle}, unless granted was 1 (or
 *        has_cap was, WEIR_FEATURE_OPEN_CAP: claim that capability); with
 *        WEIR_FEATURE_LEASES the completion's aux is the data handle from
 *        then on (the handle, or the kept lease it uses if that is still
 *        good). With WEIR_FEATURE_CAPS and a WEIR_CAP_SIZE buffer, a
 *        read-only handle's grant may answer result WEIR_CAP_SIZE: a read
 *        capability; then io ring: WEIR_OP_CLAIM {data handle, capability}
 *        grants it at io; on -EKEYREJECTED send WEIR_OP_GRANT again with arg
 *        WEIR_GRANT_THROUGH_IO
 *   5. io ring: WEIR_OP_READ / WRITE / TRUNCATE / SYNC / GETATTR on the
 *        data handle (the handle without WEIR_FEATURE_LEASES)
 *   6. metadata ring: WEIR_OP_CLOSE {handle}
 *
 * The grant rule: the IO service serves a handle only after the metadata
 * service granted it to this session there. Open does not grant (except
 * with O_TRUNC, which answers granted = 1); send WEIR_OP_GRANT once before
 * the handle's first data request. Until then, and for any handle that is
 * not this session's, io answers -EBADF.
 *
 * Incarnations. Session ids and handles carry the metadata service's
 * incarnation in their top WEIR_INCARNATION_BITS bits. After a restart of
 * the metadata service io answers -ESTALE on a session of an earlier
 * incarnation: redial the metadata service, send WEIR_OP_HELLO, repeat
 * WEIR_OP_ATTACH on the same io ring with the new session, and reopen each
 * handle with WEIR_OP_REOPEN {ticket}, at once: a ticket is accepted once,
 * within the service's reclaim grace after its start (30 s by default),
 * only by the incarnation after the one that issued it; -ESTALE: the
 * handle is gone; -EPERM: not genuine or not this uid's; -EACCES: the
 * file (another uid's) no longer allows the access.
 *
 * Encoding. Little-endian. A "str" is a u16 length then that many bytes,
 * no NUL. Times are i64 Unix nanoseconds; WEIR_TIME_OMIT leaves one
 * unchanged, WEIR_TIME_NOW sets it to the service's clock. The response overwrites the request in the same arena
 * buffer: size the buffer for the larger of the two. A completion's
 * result is -errno, or the response length (metadata) or bytes moved
 * (read, write). Path operations take a directory handle in the
 * descriptor's handle (0: the root); relative paths resolve from it,
 * absolute ones from the root.
 *
 * Bodies (in: request, out: response):
 *   HELLO     in struct weir_hello_req; out struct weir_hello_resp
 *   STAT      in str path; out struct weir_attr
 *   OPEN      arg = O_* flags; in u32 perm, str path;
 *             out WEIR_OPEN_RESP_* layout
 *   CLOSE     handle
 *   MKDIR     in u32 perm, str path; out struct weir_attr
 *   RMDIR     in str path
 *   UNLINK    in str path
 *   RENAME    handle = old directory; in u64 new directory handle,
 *             str old, str new
 *   CHMOD     in u32 mode, str path
 *   CHOWN     in i64 uid, i64 gid, str path (-1: unchanged)
 *   CHTIMES   in i64 atime, i64 mtime, str path
 *   READDIR   in str path, str after; out u32 count, then count times
 *             {u64 ino, u32 mode type bits, str name}; aux 1: more follow
 *   FSTAT     handle; out struct weir_attr
 *   SYNC_META (no body)
 *   GRANT     handle
 *   FCHMOD    handle, arg = mode
 *   FCHOWN    handle; in i64 uid, i64 gid
 *   FCHTIMES  handle; in i64 atime, i64 mtime
 *   REOPEN    in ticket (32 bytes); out as OPEN, with a ticket
 *   ATTACH    in struct weir_attach_req
 *   READ      handle, offset, arg = WEIR_READ_DIRECT or 0; the payload
 *             receives the data
 *   WRITE     handle, offset, arg = WEIR_WRITE_APPEND, WEIR_WRITE_DIRECT,
 *             both or 0; aux = the offset written at
 *             (DIRECT: O_DIRECT, past the page cache, coherent with it;
 *             offset and length multiples of WEIR_DIRECT_ALIGN)
 *   TRUNCATE  handle, offset = new size
 *   SYNC      handle, arg = WEIR_SYNC_DATA (fdatasync) or 0 (fsync)
 *   GETATTR   handle; out WEIR_GETATTR_RESP_* layout
 */
#ifndef WEIR_PROTO_H
#define WEIR_PROTO_H

#include <stdint.h>

#define WEIR_PROTO_MIN_VERSION 1u
#define WEIR_PROTO_MAX_VERSION 1u

#define WEIR_FEATURE_REOPEN 0x1ull
#define WEIR_FEATURE_LEASES 0x2ull
#define WEIR_FEATURE_CAPS 0x4ull
#define WEIR_FEATURE_RECALLS 0x8ull /* one WEIR_OP_RECALL_WAIT may stay outstanding */
#define WEIR_FEATURE_OPEN_CAP 0x10ull /* OPEN may answer a read capability */
#define WEIR_FEATURE_DIR_OPEN 0x20ull /* DIR_LEASE snapshots; CLAIM_DIR opens at io alone */
#define WEIR_FEATURE_LINKS 0x40ull /* symbolic links: a path that meets one to follow answers -WEIR_ERR_FOLLOW */
#define WEIR_FEATURE_MOUNTED 0x80ull /* weir is mounted in a larger tree: ".." of its root leads out (-WEIR_ERR_FOLLOW, aux bit 33) */
#define WEIR_FEATURE_RECORD_CUTS 0x100ull /* no staging log at io: send CUT before every TRUNCATE */
#define WEIR_KNOWN_PROTO_FEATURES 0x1ffull

/* -WEIR_ERR_FOLLOW: the path met a symbolic link the call follows; aux =
 * start | end << 16 | second << 32 | above << 33: the link is
 * path[start:end] of the request's first path (or its second: RENAME's
 * and LINK's new path); above (WEIR_FEATURE_MOUNTED): it is a ".." of
 * weir's root, and the path goes on at the mount's parent with path[end:].
 * READLINK of path[:end] gives the target; resolve path[:start] + target +
 * path[end:] (an absolute target replaces path[:start]), at most 40 times
 * (then ELOOP). */
#define WEIR_ERR_FOLLOW 4096u
#define WEIR_PATH_NOFOLLOW 1u /* STAT, CHOWN, CHTIMES arg: a final link is the object (lstat, lchown) */
#define WEIR_LINK_FOLLOW 1u /* LINK arg: AT_SYMLINK_FOLLOW */

/* Metadata ring opcodes: 0x10-0x3f. */
#define WEIR_FIRST_METADATA_OP 0x10u
#define WEIR_LAST_METADATA_OP 0x3fu
#define WEIR_OP_HELLO 0x10u
#define WEIR_OP_STAT 0x11u
#define WEIR_OP_OPEN 0x12u
#define WEIR_OP_CLOSE 0x13u
#define WEIR_OP_MKDIR 0x14u
#define WEIR_OP_RMDIR 0x15u
#define WEIR_OP_UNLINK 0x16u
#define WEIR_OP_RENAME 0x17u
#define WEIR_OP_CHMOD 0x18u
#define WEIR_OP_CHOWN 0x19u
#define WEIR_OP_CHTIMES 0x1au
#define WEIR_OP_READDIR 0x1bu
#define WEIR_OP_FSTAT 0x1cu
#define WEIR_OP_SYNC_META 0x1du
#define WEIR_OP_GRANT 0x1eu
#define WEIR_OP_FCHMOD 0x1fu
#define WEIR_OP_FCHOWN 0x20u
#define WEIR_OP_FCHTIMES 0x21u
#define WEIR_OP_REOPEN 0x22u
#define WEIR_OP_DIR_LEASE 0x24u /* in: path, after (as READDIR); out: u32 count, then per entry u64 ino, u32 mode, WEIR_CAP_SIZE cap, u16 name length, name; aux 1: more */
#define WEIR_OP_INHERIT 0x25u /* in: ticket of this incarnation (WEIR_FEATURE_REOPEN); out: as OPEN: the same file, flags and uid, for a process that inherited the open file description */
#define WEIR_OP_LOCK 0x26u /* handle; in: lock request (24 bytes, below); set: 0 or -EAGAIN (in the way); get: out the lock answer (24 bytes) */
#define WEIR_OP_READLINK 0x27u /* in: path; out: the link's target (result = its length); -EINVAL: no link */
#define WEIR_OP_SYMLINK 0x28u /* in: str target, str path; out: attr */
#define WEIR_OP_LINK 0x29u /* handle = old directory; arg = WEIR_LINK_FOLLOW or 0; in: u64 new directory handle, str old, str new (as RENAME); out: attr */
#define WEIR_OP_CUT 0x2au /* handle open for writing, offset = the size a TRUNCATE at io is about to set (WEIR_FEATURE_RECORD_CUTS): recorded first if below the size recorded */
#define WEIR_OP_RECALL_WAIT 0x23u /* out: u64 data handles another trust group recalled (at most WEIR_RECALL_BATCH); aux WEIR_RECALL_ALL: all may be */

/* IO ring opcodes: 0x40-0x5f. */
#define WEIR_FIRST_IO_OP 0x40u
#define WEIR_LAST_IO_OP 0x5fu
#define WEIR_OP_ATTACH 0x40u
#define WEIR_OP_READ 0x41u
#define WEIR_OP_WRITE 0x42u
#define WEIR_OP_TRUNCATE 0x43u
#define WEIR_OP_SYNC 0x44u
#define WEIR_OP_GETATTR 0x45u
#define WEIR_OP_CACHE_MAP 0x46u /* result 0, aux = tag: the region's read-only meta memfd arrives on the session socket with tag, its data memfd with tag + 1 */
#define WEIR_OP_READAHEAD 0x47u /* offset, arg = bytes: fill them into the cache in the background; answers 0 at once */
#define WEIR_OP_CLAIM_DIR 0x49u /* in: an entry's cap, u64 direct handle to release (0: none); aux = the new direct handle (WEIR_DIR_OPEN_BIT set); on error open through metadata */
#define WEIR_OP_STATFS 0x4bu /* out: u64 total, u64 free, u64 avail bytes of the store (WEIR_STATFS_RESP_SIZE); -EOPNOTSUPP: the backend cannot say */
#define WEIR_OP_MAP_PIN 0x4cu /* handle (readable), offset (page aligned), arg = pages: fill them and keep them resident while mapped */
#define WEIR_OP_MAP_UNPIN 0x4du /* the same handle's file, offset and arg as a MAP_PIN: its pins end (a writable pin's pages become dirty first) */
#define WEIR_OP_MAP_SYNC 0x4eu /* handle (writes), offset, arg = pages inside a writable pin: the resident ones become dirty (msync) */
#define WEIR_OP_MAP_WRITABLE 0x4fu /* handle (writes): result 0, aux = tag: a read-write description of the data memfd on the session socket */
#define WEIR_OP_WRITE_LOG 0x50u /* result 0, aux = tag: the session's write log (a read-write memfd of WEIR_WRITE_LOG_SIZE) on the session socket */
#define WEIR_OP_WRITE_PIN 0x51u /* handle (reads and writes), offset = a window's start, arg = a free slot: pin the window's pages, their stores logged in the slot */
#define WEIR_OP_WRITE_UNPIN 0x52u /* arg = a slot: its logged pages become dirty, its window's pins end */
#define WEIR_OP_SYNC_FS 0x53u /* no handle, arg 0: every file with changes not yet durable is synced as by SYNC (syncfs, sync) */
#define WEIR_WINDOW_PAGES 512u        /* a write window: this many pages at a multiple of it */
#define WEIR_WRITE_LOG_SLOTS 256u     /* slots of the write log */
#define WEIR_WRITE_SLOT_BYTES 64u     /* a slot: bit k%64 of u64 word k/64 = page k of its window stored into */
#define WEIR_WRITE_LOG_LIVE_OFF 16384u /* then a u64 live word per slot: 1 while io drains the slot's window, 0 once it ended */
#define WEIR_WRITE_LOG_SIZE 20480u
#define WEIR_MAP_PIN_WRITABLE 0x80000000u /* in a MAP_PIN's arg: a writable mapping's pin (the handle must write) */
#define WEIR_OP_RELEASE 0x4au /* handle = a direct handle: its end */
#define WEIR_OP_CLAIM 0x48u /* handle = data handle, in: the capability WEIR_OP_GRANT answered; -EKEYREJECTED: grant again with WEIR_GRANT_THROUGH_IO */

#define WEIR_WRITE_APPEND 1u
#define WEIR_WRITE_DIRECT 2u
#define WEIR_READ_DIRECT 1u
#define WEIR_DIRECT_ALIGN 512u
#define WEIR_SYNC_DATA 1u

#define WEIR_ATTR_SIZE 56u
#define WEIR_TOKEN_SIZE 32u
#define WEIR_TICKET_SIZE 32u
#define WEIR_STATFS_RESP_SIZE 24u

/* WEIR_OP_LOCK (proto/bodies.go, LockReq and LockResp):
 *   request  u8 get (1: test), u8 type, u8 class, 5 zero bytes, u64 start, u64 end (exclusive; ~0: to EOF)
 *   answer   u8 type (UNLOCK: none in the way), u8 class, 2 zero bytes, i32 pid (-1: OFD, flock), u64 start, u64 end
 * POSIX locks are the session's (released when it closes any handle of
 * the file); OFD and flock locks the open file description's (released
 * with its last handle in any session). */
#define WEIR_LOCK_POSIX 0u
#define WEIR_LOCK_OFD 1u
#define WEIR_LOCK_FLOCK 2u
#define WEIR_LOCK_READ 0u
#define WEIR_LOCK_WRITE 1u
#define WEIR_LOCK_UNLOCK 2u
#define WEIR_LOCK_REQ_SIZE 24u
#define WEIR_CAP_SIZE 64u
#define WEIR_CLAIM_DIR_SIZE 72u
#define WEIR_DIR_OPEN_BIT 0x8000000000000000ull /* set in direct handles only */
#define WEIR_GRANT_THROUGH_IO 1u
#define WEIR_TENURE_SIZE 8u /* WEIR_OP_GRANT of a writable handle with this buffer: out u64 lease epoch */
#define WEIR_RECALL_BATCH 64u
#define WEIR_RECALL_ALL 1u
#define WEIR_MAX_PATH 4095u
#define WEIR_MAX_NAME 255u
#define WEIR_MAX_FILE_SIZE 0x400000000000ull /* 64 TiB: s_maxbytes; a seek past it is EINVAL, a write or truncate EFBIG */
#define WEIR_ROOT_HANDLE 0u
#define WEIR_TIME_OMIT INT64_MIN
#define WEIR_TIME_NOW (INT64_MIN + 1) /* the service's clock: UTIME_NOW, the touch rule (write permission) */

#define WEIR_INCARNATION_BITS 24u
#define WEIR_COUNTER_BITS 40u
#define WEIR_INCARNATION_OF(id) ((uint32_t)((uint64_t)(id) >> WEIR_COUNTER_BITS))

/* struct weir_attr: an inode's attributes (56 bytes). */
struct weir_attr {
	uint64_t ino;
	uint32_t mode; /* S_IFREG or S_IFDIR | 07777 bits, or S_IFLNK | 0777 */
	uint32_t uid;
	uint32_t gid;
	uint32_t nlink;
	int64_t size;
	int64_t atime;
	int64_t mtime;
	int64_t ctime;
};

struct weir_hello_req {
	uint32_t min_version;
	uint32_t max_version;
	uint64_t features;
};

#define WEIR_HELLO_RESP_SIZE 56u
struct weir_hello_resp {
	uint32_t version;
	uint32_t reserved; /* 0 */
	uint64_t features;
	uint64_t session;
	uint8_t token[WEIR_TOKEN_SIZE];
};

#define WEIR_ATTACH_REQ_SIZE 48u
struct weir_attach_req {
	uint32_t version;
	uint32_t reserved; /* 0 */
	uint64_t session;
	uint8_t token[WEIR_TOKEN_SIZE];
};

/* OPEN and REOPEN response: u64 handle, attr, u8 created, u8 granted,
 * then the ticket when WEIR_FEATURE_REOPEN was negotiated, then the u64
 * data handle when WEIR_FEATURE_LEASES was (the handle of the session's
 * kept lease of the file, granted = 1, or the handle itself), then with
 * WEIR_FEATURE_OPEN_CAP u8 has_cap and WEIR_CAP_SIZE bytes: when has_cap
 * is 1 (granted is then 0), the read capability to claim at io
 * (WEIR_OP_CLAIM on the data handle) before the first read, in place of
 * step 4's WEIR_OP_GRANT. Not a struct: the ticket sits at an offset C
 * would pad. */
#define WEIR_OPEN_RESP_OFF_HANDLE 0u
#define WEIR_OPEN_RESP_OFF_ATTR 8u
#define WEIR_OPEN_RESP_OFF_CREATED 64u
#define WEIR_OPEN_RESP_OFF_GRANTED 65u
#define WEIR_OPEN_RESP_OFF_TICKET 66u
#define WEIR_OPEN_RESP_SIZE 66u
#define WEIR_OPEN_RESP_SIZE_TICKET 98u
#define WEIR_OPEN_RESP_SIZE_LEASES 74u
#define WEIR_OPEN_RESP_SIZE_TICKET_LEASES 106u
#define WEIR_OPEN_RESP_OFF_HAS_CAP_TICKET_LEASES 106u
#define WEIR_OPEN_RESP_OFF_CAP_TICKET_LEASES 107u
#define WEIR_OPEN_RESP_SIZE_TICKET_LEASES_CAP 171u

/* GETATTR response: i64 size, i64 mtime, u8 changed. */
#define WEIR_GETATTR_RESP_OFF_SIZE 0u
#define WEIR_GETATTR_RESP_OFF_MTIME 8u
#define WEIR_GETATTR_RESP_OFF_CHANGED 16u
#define WEIR_GETATTR_RESP_SIZE 17u

#endif /* WEIR_PROTO_H */
