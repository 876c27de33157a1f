// Package ns is the metadata service's namespace: directories, names and
// inodes with POSIX semantics, Linux's permission rules, and crash-safe
// persistence in a write-ahead log (WAL) with checkpoints.
//
// # Semantics
//
// Paths are resolved as Linux resolves them (fs/namei.c), check by check,
// so that every failure gives the errno the kernel gives: a NUL byte is
// EINVAL (as Go's syscall package reports it), an empty path ENOENT, a
// path of 4096 bytes or more ENAMETOOLONG; slashes collapse and a leading
// one changes nothing (paths are relative to the root); "." and ".."
// resolve physically and ".." of the root is the root; each directory on
// the way, including the one holding the last component, must be
// searchable (EACCES), each intermediate component must exist (ENOENT),
// have at most 255 bytes (ENAMETOOLONG) and be a directory (ENOTDIR); a
// trailing slash demands a directory. Permissions follow
// generic_permission without ACLs; root overrides read, write and
// directory search, and execute only where some execute bit is set. In a
// sticky directory only root, the entry's owner and the directory's owner
// may remove or rename an entry (EPERM otherwise). rename follows
// do_renameat2 and vfs_rename; rmdir, unlink, mkdir, open, chmod, chown,
// utimensat and truncate follow their kernel counterparts, including the
// clearing of setuid and setgid bits. Every errno rule was checked against
// Linux 6.18 on ext4, and when the tests run as root a differential test
// replays the whole errno table against the kernel. Known differences:
// directory sizes are 0 (ext4: 4096 and up); fs.protected_regular (EACCES
// for O_CREAT of another user's file in a sticky world-writable
// directory) is not emulated, as if the sysctl were 0; truncate accepts
// any non-negative size (no EFBIG); writes reported through SetLive do
// not clear setuid/setgid (SetLive carries no credentials).
//
// Every path operation has an At form (StatAt, OpenAt, MkdirAt, ...) that
// resolves a relative path from a directory inode, as the *at() system
// calls resolve from a directory file descriptor; an absolute path starts
// at the root either way, and ".." climbs out of the directory. A removed
// directory that is still open is a valid start: nothing is found in it
// and creating in it is ENOENT. FChmod, FChown and FChtimes change an open
// inode by number.
//
// Timestamps: creating, removing and renaming entries set the parent
// directories' mtime and ctime; attribute changes and unlinks set the
// inode's ctime. atime is never updated by reads (noatime); it changes
// only through Chtimes. Special files (devices, FIFOs, sockets) do not
// exist. Directory sizes are 0.
//
// Links. Symlink creates a symbolic link and Link a hard link (a file's
// or a symbolic link's further name; EPERM for a directory, EMLINK past
// LinkMax names, and fs.protected_hardlinks as Debian sets it: a caller
// that neither owns the source nor is root needs read and write
// permission on it, and it must be a regular file that is not setuid or
// setgid-executable). The namespace follows no symbolic link itself: a
// target may lead anywhere on the host, and only the client can go there.
// A resolution that must follow one (an intermediate component, or the
// last one where the operation follows it: Stat, Open without O_NOFOLLOW,
// Chmod, Truncate, ReadDir, Link with follow; never Lstat, Readlink,
// Unlink, Rmdir, Rename, Mkdir or an exclusive create) answers a
// *FollowError naming the link's place in the path and its target, and
// the client resolves the rewritten path again (at most MaxLinks times,
// then ELOOP). fs.protected_symlinks is emulated as Debian sets it: a
// link in a sticky world-writable directory is followed only by its
// owner or when the directory's owner owns it (EACCES otherwise, for
// root too). Open with O_NOFOLLOW of a link is ELOOP; O_CREAT through a
// dangling link creates its target, as on Linux.
//
// All namespace errors are bare syscall.Errno values. Failures to read or
// write the persistent state are *IOError (reported as EIO); a failed
// flush is sticky: every later mutation and Sync fails. Reads keep working.
//
// # Durability
//
// A mutation runs under the namespace lock: all checks, then its record
// is written to the WAL (reaching the kernel, so it survives a SIGKILL),
// then it is applied in memory, then the lock is released. With
// Options.SyncEveryOp the mutation returns only after an fsync covering its
// record; concurrent mutations share one fsync (group commit). Otherwise a
// background flush runs every Options.SyncInterval and Sync flushes on
// demand. Readers may observe a change before it is durable; any mutation
// that depends on it is logged after it, so its acknowledgement implies
// the earlier change is durable too.
//
// Every Options.CheckpointEvery records (or a quarter of the inodes the
// last checkpoint held, if that is more: a snapshot costs in proportion to
// the namespace, so a million creates took 94 µs of CPU each with a
// snapshot every 10,000) a checkpoint (a full snapshot) is
// taken: under a read lock the state is encoded and the WAL moves to a new
// segment (the old one is flushed first); then the snapshot is written to
// ckpt-<LSN>.tmp, flushed, renamed to ckpt-<LSN>.ckpt and the directory
// flushed. Then checkpoints older than the previous one are removed, and
// WAL segments whose records the previous checkpoint covers. So the newest
// two checkpoints and the WAL after the older of them stay on disk, and
// recovery can fall back to the older one if the newer is ever found
// damaged. Close writes a final checkpoint. A LOCK file in the directory
// is flock(2)ed by the one NS that has it open.
//
// Recovery (Open): remove ckpt-*.tmp; load the newest checkpoint that
// verifies (a damaged one is logged, skipped and renamed to *.corrupt once
// recovery succeeds; with none valid Open fails); replay the WAL records
// with larger LSNs; cut a torn tail; hold the inodes that have no name
// (they were unlinked while open: opens do not survive a restart, but
// their holders may come back with Reopen) and report their blobs through
// Orphans, until ReleaseHeld frees those nobody reopened; log and flush a
// boot record that starts the next incarnation; run Check. WAL damage
// that a crash cannot explain fails Open with an error naming the file and
// offset: a bad record followed by a valid one, a bad record in a segment
// that is not the last, a gap in the LSNs, a record that does not apply.
// With Options.ReadOnly nothing on disk changes: no file is removed or
// renamed, a torn tail is skipped in memory, no incarnation starts.
//
// Incarnations. Every Open (but a read-only one) starts an incarnation, one
// more than the last: the metadata service puts it in every session id and
// handle, so none is reused across restarts. The first boot record also
// chooses the stack id (16 random bytes, the namespace's identity) and
// the ticket key (32 random bytes, which the service signs reopen tickets
// with); later ones repeat both.
//
// Blobs awaiting deletion. Freeing a file's inode puts its blob in a set
// that is persisted with the namespace (in checkpoints, and implied by the
// free records in between); BlobGone removes it once the IO service
// deleted the blob, MarkDead adds an orphan found in the backend. A delete
// lost in a crash is therefore retried after the restart.
//
// Inode numbers are never reused: the next one is a counter, persisted in
// checkpoints and advanced by create records and by orphans at or past
// it. They end at MaxIno (2^48-1); a create after that is ENOSPC, and a
// blob number past it is refused (it is no inode's).
//
// # Why a WAL with checkpoints, not an embedded store such as bbolt
//
// The namespace lives in memory (a few hundred bytes per inode), so the
// store only has to make mutations durable and rebuild memory at start.
// A log does exactly that: one sequential append per mutation and one fsync
// per group of them. bbolt is a copy-on-write B+tree: every committed
// transaction rewrites the leaf-to-root page path and the meta page and
// needs two fsyncs (data, then meta), so a single create costs several
// random 4 KiB writes; batching (bolt.DB.Batch) amortises the fsyncs but
// not the page writes, and the tree would duplicate the in-memory maps we
// need anyway for path resolution and permission checks. The log also
// gives what the journal service (Oxbow's split journaling) will build on:
// ordered records with LSNs that another log can refer to, and a replay
// that can be fuzzed and torn at every byte (persist_test.go,
// fuzz_test.go). The cost is the code here: checkpoints, segment trimming
// and recovery, about 1,000 lines, tested by crashing (kill_test.go).
//
// # On-disk formats (version 1)
//
// All integers are little-endian; checksums are CRC-32C (Castagnoli).
// File names carry an LSN as 20 decimal digits.
//
// WAL segment wal-<first LSN>.log: a 32-byte header, then records.
//
//	header  0  [8]byte magic "weirwal\x00"
//	        8  u32 format version (1)
//	       12  u32 header size (32)
//	       16  u64 LSN of the first record (equals the file name)
//	       24  u32 CRC-32C of bytes 0..24
//	       28  u32 reserved, 0
//
//	record  0  u32 length n: bytes after this 8-byte prefix (9 + payload)
//	        4  u32 CRC-32C of the n bytes from offset 8
//	        8  u64 LSN (consecutive across segments, the first one is 1)
//	       16  u8  type
//	       17  payload (n - 9 bytes, at most 65527)
//
// A name in a payload is u8 length (1..255) followed by its bytes. Times are
// i64 Unix nanoseconds. Payloads by type:
//
//	1 create   u64 parent, u64 ino, u32 mode (with S_IF type), u32 uid,
//	           u32 gid, i64 time, name
//	2 remove   u64 parent, u64 ino, i64 time, u8 flags, name
//	3 rename   u64 old parent, u64 new parent, u64 ino, u64 replaced ino
//	           (0 = none), i64 time, u8 flags, old name, new name
//	4 setattr  u64 ino, u8 mask, u32 mode, u32 uid, u32 gid, i64 size,
//	           i64 atime, i64 mtime, i64 ctime
//	           (mask bits 1 mode, 2 uid, 4 gid, 8 size, 16 atime,
//	           32 mtime, 64 ctime: only those fields are applied)
//	5 free     u64 ino
//	6 boot     u32 incarnation, [16]byte stack id, [32]byte ticket key
//	7 dead     u64 blob (an orphan blob now awaits deletion)
//	8 gone     u64 blob (deleted; it no longer awaits deletion)
//	9 alloc    u64 limit (the IO service is told blob ids below it are
//	           allocated; synced before it is told)
//	10 symlink u64 parent, u64 ino, u32 uid, u32 gid, i64 time, name,
//	           u16 target length (1..4095), target (mode S_IFLNK|0777,
//	           size the target's length; the next inode number, as create)
//	11 link    u64 parent, u64 ino, i64 time, name (one more name of a
//	           file or symbolic link that has a name)
//
// flags bit 0 of remove and rename: the removed (or replaced) inode is
// dropped at once; otherwise it lives on without a name (still open) until
// a free record. Inode numbers are allocated consecutively and never
// reused: a create carries exactly the next number. A boot record must
// carry a larger incarnation than the last, and the first one's stack id
// and key; a gone record must name a blob awaiting deletion, a dead record
// one that no inode owns. A boot record moves the next inode number up to
// the highest alloc limit: a blob io created in an earlier life, whose
// create record a power cut lost, is then never met by a new file.
//
// Checkpoint ckpt-<LSN>.ckpt: a 64-byte header, then the body.
//
//	header  0  [8]byte magic "weirckpt"
//	        8  u32 format version (4; versions 1 to 3 are read too)
//	       12  u32 header size (64)
//	       16  u64 LSN: the state after every WAL record up to this one
//	       24  u64 next inode number
//	       32  u64 inode count
//	       40  u64 body length in bytes
//	       48  u32 CRC-32C of the body
//	       52  u64 alloc limit (version 3; 0 before)
//	       60  u32 CRC-32C of bytes 0..60
//
//	body    versions 2 and 3 start with the boot fields and the blobs awaiting
//	        deletion (version 1 has neither):
//	        0  u32 incarnation (0: none yet)    4 [16]byte stack id
//	       20  [32]byte ticket key             52 u64 count n
//	       60  n x u64 blob, strictly ascending
//	        then one record per inode, ascending by inode number:
//	        0  u64 ino       8 u32 mode     12 u32 uid      16 u32 gid
//	       20  u32 nlink    24 i64 size     32 i64 atime    40 i64 mtime
//	       48  i64 ctime    56 u64 blob     64 u32 entry count
//	       68  entries, ascending by name: name, u64 ino
//	        then, for a symbolic link (version 4): u16 target length, target
//
// A checkpoint verifies when both checksums match, the header fields are
// as above, the body decodes exactly and the state passes Check (unnamed
// inodes allowed).
package ns
