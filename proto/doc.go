// Package proto is the request protocol weir's clients speak to its
// services over the rings of package ring: opcodes, the bodies that travel
// in a request's arena buffer, the session handshake and the grant rule.
// It is the contract a client in any language implements; the C header
// include/weir_proto.h restates it and TestCHeaderMatchesGo holds the two
// together. It imports nothing of weir's; the services' control messages
// among themselves are not part of it (they travel on NATS, which clients
// never reach).
//
// # Versions and features
//
// The protocol has a version (Version, a single increasing number) and
// feature bits. A client sends the range of versions it speaks and the
// features it wants in OpHello; the metadata service picks the highest
// version both speak and answers the features both have. With no common
// version the service answers -EPROTONOSUPPORT with its own range in the
// completion's Aux (MinVersion<<32 | MaxVersion), so both sides can say
// exactly what the other speaks. The IO session repeats the chosen version
// in OpAttach and is refused the same way.
//
// # Sessions
//
// A client process opens one session with each service: a ring handshake
// on the service's Unix socket (package ring; the service learns the
// peer's uid, gid and pid from SO_PEERCRED, never from the peer), then:
//
//  1. metadata ring: OpHello -> version, features, session id, token
//  2. io ring:       OpAttach{version, session id, token}
//     io asks metadata who owns the session; the pid and
//     uid must be this ring's peer, or EPERM; EAGAIN when
//     io could not reach metadata (try again)
//  3. metadata ring: OpOpen ... -> handle (and a reopen ticket)
//  4. metadata ring: OpGrant{handle}, unless the open said "granted"
//     (or, with FeatureOpenCap, answered a capability: OpClaim it at io)
//  5. io ring:       OpRead / OpWrite / OpTruncate / OpSync on the handle
//  6. metadata ring: OpClose{handle}; io stops accepting it first
//
// The grant rule: a data request on the io ring names a handle that the
// metadata service granted to this session at the IO service. Open does not
// grant (except with O_TRUNC, which empties the file at once and answers
// granted = 1); the client sends OpGrant once before the handle's first
// data request. Until then io answers EBADF, as it does for a handle of
// another session, a closed handle, a made-up number or a grant another
// trust group's recalled (ask OpGrant again, then the request again).
//
// Session ids and handles carry the metadata service's incarnation (a
// number that grows at every start of the service) in their top 24 bits,
// so no id is ever reused across restarts. When the metadata service
// restarts, the IO service drops every grant of an earlier incarnation and
// answers ESTALE to a session attached to one: the client dials the
// metadata service again, says OpHello, repeats OpAttach on the same io
// ring with the new session, and reopens its handles with OpReopen and
// the tickets OpOpen gave it (FeatureReopen), as soon as its session
// ends. A ticket is accepted only by the incarnation after the one that
// issued it, within its reclaim grace after its start
// (metadata.reclaim_grace, 30 s by default), once (again only after the
// session that reopened it ended), and, for a file that has a name and
// another owner, only while its mode still allows the access; otherwise
// OpReopen answers ESTALE (too late, too old or used: the handle is
// gone), EPERM (not genuine, another uid's, or of the current
// incarnation) or EACCES.
//
// # Descriptor fields
//
// A request's fixed arguments travel in the ring descriptor: Opcode,
// Arg (u32), Handle (u64), Offset (u64). Variable ones (paths, names)
// travel in the request's arena buffer. The service writes its response
// body over the request body in the same buffer, so a client sizes the
// buffer for the larger of the two; bytes after a request's fields are
// response space and are ignored. The completion's Result is the response
// length or bytes moved (>= 0) or -errno, and Aux an opcode-specific value.
//
// Path operations take a directory handle in Handle, as the *at() system
// calls take a directory file descriptor: a relative path resolves from
// that directory, an absolute one from the root; Handle 0 is the root.
//
// Symbolic links (FeatureLinks) are followed by the client, never by the
// service, since a target may lead out of weir: a path operation that
// meets a link it follows (any intermediate component; the last one for
// OpStat, OpOpen without O_NOFOLLOW, OpChmod, OpChown and OpChtimes
// without PathNoFollow, OpReadDir, OpDirLease, OpLink with LinkFollow)
// answers -ErrFollow, Aux = FollowAux(start, end, second): the link is
// path[start:end]. The client asks OpReadlink of path[:end] and sends
// path[:start] + target + path[end:] again (an absolute target: target +
// path[end:], resolved by the client, inside weir or not), at most 40
// links for one call (then ELOOP, as Linux). A session without
// FeatureLinks is answered ELOOP.
//
// # Encoding
//
// All integers are little-endian. A str is a u16 length then that many
// bytes, no terminator (paths are at most MaxPath bytes). Times are i64
// Unix nanoseconds; TimeOmit leaves a time unchanged (UTIME_OMIT), TimeNow
// sets it to the service's clock (UTIME_NOW).
//
//	attr (56 bytes)
//	  0 u64 ino      8 u32 mode    12 u32 uid     16 u32 gid
//	 20 u32 nlink   24 i64 size    32 i64 atime   40 i64 mtime
//	 48 i64 ctime
//
//	ticket (32 bytes): opaque to the client; the metadata service's MAC
//	over the handle it was issued with, the inode, the open flags and the
//	uid it was issued to
//
// Bodies, by opcode (in: request; out: response; "-" none):
//
//	OpHello     in:  u32 min_version, u32 max_version, u64 features
//	            out: u32 version, u32 0, u64 features, u64 session,
//	                 [32]byte token
//	OpStat      Arg = PathNoFollow (lstat) or 0
//	            in:  str path                       out: attr
//	OpOpen      Arg = open flags (O_* of Linux x86-64 and arm64)
//	            in:  u32 perm, str path
//	            out: u64 handle, attr, u8 created, u8 granted,
//	                 [ticket when FeatureReopen was negotiated]
//	                 [u64 data handle when FeatureLeases was]
//	                 [u8 has cap, CapSize capability when FeatureOpenCap
//	                 was: a read capability of the data handle (granted
//	                 0), claimed with OpClaim instead of an OpGrant]
//	OpClose     Handle                              -
//	OpMkdir     in:  u32 perm, str path             out: attr
//	OpRmdir     in:  str path                       -
//	OpUnlink    in:  str path                       -
//	OpRename    Handle = old directory
//	            in:  u64 new directory handle, str old, str new
//	OpChmod     in:  u32 mode, str path             -
//	OpChown     Arg = PathNoFollow (lchown) or 0
//	            in:  i64 uid, i64 gid, str path     -   (-1: unchanged)
//	OpChtimes   Arg = PathNoFollow or 0
//	            in:  i64 atime, i64 mtime, str path -
//	OpReadDir   in:  str path, str after            out: u32 count, count x
//	            {u64 ino, u32 mode type bits, str name}; Aux = 1 if more
//	            follow (ask again with after = the last name)
//	OpFStat     Handle                              out: attr
//	OpSyncMeta  -  (every namespace change so far durable)
//	OpGrant     Handle, Arg = GrantThroughIO or 0   -, or with FeatureCaps
//	            and a buffer of CapSize, out: a read capability (Result =
//	            CapSize) to claim at io with OpClaim; a handle open for
//	            writing, with a buffer of TenureSize: out u64 lease epoch
//	            (Result = TenureSize). Aux = the data handle. After io
//	            answered EBADF on a granted handle (another trust group's
//	            grant recalled it), OpGrant again grants it anew; a
//	            read-only handle asks with GrantThroughIO
//	OpFChmod    Handle, Arg = mode                  -
//	OpFChown    Handle; in: i64 uid, i64 gid        -
//	OpFChtimes  Handle; in: i64 atime, i64 mtime    -
//	OpReopen    in:  ticket                         out: as OpOpen, with a
//	            ticket
//	OpInherit   (FeatureReopen) in: a ticket this incarnation issued to
//	            this uid; out: as OpOpen: a handle of the same file with
//	            the same flags, for a process that shares the open file
//	            description across fork or exec (the C shim). EPERM: not
//	            genuine, another uid's, or of another incarnation (use
//	            OpReopen); ESTALE: the file is gone; EACCES: another uid's
//	            file that no longer allows the access
//	OpReadlink  (FeatureLinks) in: str path; out: the target of the
//	            symbolic link path (Result = its length, 1..MaxPath; the
//	            buffer must hold MaxPath bytes, or ERANGE); EINVAL: no link
//	OpSymlink   (FeatureLinks) in: str target, str path; out: attr of the
//	            new link (mode S_IFLNK|0777)
//	OpLink      (FeatureLinks) Handle = the old path's directory, Arg =
//	            LinkFollow or 0; in: u64 new directory handle, str old,
//	            str new (as OpRename); out: attr of the file, one more
//	            name. EPERM: a directory, or fs.protected_hardlinks
//	OpCut       (FeatureRecordCuts) Handle (open for writing), Offset =
//	            the size an OpTruncate at io is about to set: recorded
//	            first, durably, if below the size recorded (else nothing).
//	            EINVAL: not open for writing, or a negative size
//	OpLock      Handle (a regular file's); in: LockReq; out: for a
//	            test (Get), LockResp. Advisory locks held by this
//	            service: EAGAIN when another owner's lock is in the way
//	            (the client retries for F_SETLKW and blocking flock);
//	            EBADF: a read lock on a handle not open for reading, a
//	            write lock on one not open for writing (not for flock)
//	OpRecallWait (FeatureRecalls) a long poll; out: u64 data handles whose
//	            grants another trust group's grant recalled (Result =
//	            8 × their count, at most RecallBatch); Aux = RecallAll: more
//	            were, treat every grant as recalled. EBUSY: one is
//	            outstanding already; ECANCELED: the session is ending
//	OpDirLease  (FeatureDirOpen) Handle = a directory handle or
//	            RootHandle; in: as OpReadDir; out: u32 count, count x
//	            SnapEntry {u64 ino, u32 mode, [CapSize]byte capability,
//	            str name}: the regular files the session may open for
//	            reading there (a page of them, by name); Aux = 1 if more
//	            follow. EAGAIN: changes raced the read, or io has no key
//	            yet; open through OpOpen
//
//	OpAttach    in:  u32 version, u32 0, u64 session, [32]byte token
//	OpRead      Handle, Offset, Arg = ReadDirect (O_DIRECT) or 0; the
//	            payload receives the data
//	            Result = bytes read, short only at the end of the file
//	OpWrite     Handle, Offset, Arg = WriteAppend, WriteDirect (O_DIRECT),
//	            both or 0; payload = data
//	            Result = bytes written; Aux = the offset written at
//	OpTruncate  Handle, Offset = new size           -
//	OpSync      Handle, Arg = SyncData (fdatasync) or 0 (fsync)
//	OpClaim     Handle = the data handle; in: capability (CapSize)
//	            -   EKEYREJECTED: not a capability of this io epoch, or
//	            revoked: ask again with OpGrant, Arg = GrantThroughIO
//	OpStatFS    (an attached session) out: StatFSResp, the store's room
//	            in bytes (statfs); EOPNOTSUPP: the backend cannot say
//	OpClaimDir  (FeatureDirOpen) in: an OpDirLease entry's capability,
//	            u64 direct handle to release first (0: none), ClaimDirSize
//	            bytes in all; Result 0, Aux = the new direct handle
//	            (DirOpenBit set), a read-only open of the file. EKEYREJECTED:
//	            not of this io epoch or directory generation (the namespace
//	            changed); EBUSY: a writer holds the file; EMFILE: too many;
//	            on any of them open through OpOpen
//	OpRelease   Handle = a direct handle: its end (one the session does not
//	            hold is no error; EINVAL: not a direct handle)
//	OpGetAttr   Handle; out: i64 size, i64 mtime, u8 changed
//	OpCacheMap  Handle (a readable one); result 0, Aux = tag: the file's
//	            cache region (docs/cache-abi.md), read-only descriptions of
//	            its meta memfd (with tag) and its data memfd (with tag+1),
//	            come on the session socket (ring.Client.ReceiveFile)
//	OpMapPin    Handle (a readable one), Offset (page aligned), Arg = pages
//	            (at most 2^20), with MapPinWritable (bit 31) for a writable
//	            mapping's (the handle must write: EBADF): the service grows
//	            the file's cache region to cover them, fills those inside
//	            the file and keeps them all resident (a client maps them:
//	            the shim's MAP_SHARED) until OpMapUnpin of the same range
//	            or the session's end; a write into a pinned page stores its
//	            bytes in the region. ENOMEM: past the pins a session (a
//	            quarter of the cache) or all (half) may hold, or more than
//	            1 GiB past the file's end; EOPNOTSUPP: no cache
//	OpMapUnpin  Handle (of the same file), Offset, Arg: as an OpMapPin's;
//	            a writable pin's pages become dirty first (OpMapSync);
//	            EINVAL: the session pinned no such range
//	OpMapSync   Handle (one that writes), Offset, Arg = pages inside one
//	            writable pin of the session's (EINVAL: none): the resident
//	            pages inside the file become dirty and the file modified,
//	            for what the client stored through its mapping (msync)
//	OpMapWritable Handle (one that writes: EBADF); result 0, Aux = tag: a
//	            read-write description of the region's data memfd comes on
//	            the session socket (a writable MAP_SHARED mapping)
//	OpWriteLog  result 0, Aux = tag: a read-write description of the
//	            session's write log (WriteLogSize bytes, sealed against
//	            resizing) comes on the session socket; the same log every
//	            time (docs/cache-abi.md §7)
//	OpWritePin  Handle (one that reads and writes, not direct: EBADF),
//	            Offset = a multiple of WindowPages pages, Arg = a slot of
//	            the log (EINVAL: out of range; EBUSY: in use): the window's
//	            pages are filled and pinned as by OpMapPin (ENOMEM alike),
//	            the slot cleared; a bit the client sets in the slot makes
//	            its page dirty at the next drain (the file's fsync, the
//	            flusher's pass, an O_DIRECT access, OpWriteUnpin, the
//	            session's end)
//	OpWriteUnpin Arg = a slot in use (EINVAL: not): drained, unpinned, free
//	OpSyncFS    no handle, Arg 0 (EINVAL otherwise): every file with changes
//	            not yet durable is synced as by OpSync (syncfs(2), sync(2));
//	            the first error, after trying them all
//	OpReadahead Handle (a readable one), Offset, Arg = bytes (at most 8 MiB):
//	            the service starts filling them into the cache and answers 0
//	            at once
//
// Every decoder here reads untrusted bytes: it never reads past its input
// and reports a short body as EINVAL. Services validate every decoded
// value before use; the client validates every completion (a result larger
// than its buffer, a body that does not decode) and turns a bad one into
// EIO.
package proto
