/*
 * libweir: weir's client library in plain C (no Go runtime in the
 * process), for the LD_PRELOAD shim and for C programs (issue 11).
 *
 * This first part speaks the ring ABI (ring/include/weir_ring.h,
 * docs/ring-abi.md) and the protocol (proto/include/weir_proto.h,
 * proto/doc.go) with one optional feature, reopen tickets (for
 * weir_inherit): a session with each service, then open, read, write,
 * fsync, close, stat, unlink, mkdir, rename, chmod, chown, readdir,
 * symbolic and hard links. Not yet: recall notices, recovery after a
 * service restart.
 * A process that forks dials sessions of its own in the child (the
 * rings are shared memory); the shim does that.
 *
 * Every call returns 0 (or a byte count) on success and a negated errno
 * on failure, as the services answer. A weir_fs is safe for concurrent use
 * by threads: each ring serves one request at a time, under its lock.
 * No call is async-signal-safe (they take a pthread mutex).
 */
#ifndef WEIR_CLIENT_H
#define WEIR_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "weir_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weir_fs weir_fs;

/* weir_dial opens a session with the metadata service at meta_sock and
 * the IO service at io_sock (their Unix socket paths). */
int weir_dial(const char *meta_sock, const char *io_sock, weir_fs **out);

/* weir_own_fd says whether fd is one of fs's own descriptors (the
 * services' sockets, kept at the top of the descriptor range): closing
 * it would end the sessions. */
int weir_own_fd(const weir_fs *fs, int fd);

/* weir_fs_close ends both sessions and frees fs; its handles end too. */
void weir_fs_close(weir_fs *fs);

/* weir_open opens path (relative to the root) with Linux open flags and
 * mode, and stores the handle, the file's attributes (attr may be NULL)
 * and its ticket (WEIR_TICKET_SIZE bytes; may be NULL). A directory
 * opens too (O_DIRECTORY or not): its handle is for fstat, fchmod and
 * the like. */
int weir_open(weir_fs *fs, const char *path, int flags, uint32_t mode, uint64_t *handle, struct weir_attr *attr,
	      uint8_t *ticket);

/* weir_inherit opens, in fs's session, the file a ticket from weir_open
 * (of any session of this uid, since the metadata service started) names,
 * with the same flags (flags: the open's, as the caller knows them; the
 * ticket's are the service's): for a process that shares an open file
 * description with the one that opened it (fork, exec). -ESTALE: the
 * file is gone; -EPERM: not a ticket of this service's incarnation and
 * uid. */
int weir_inherit(weir_fs *fs, const uint8_t *ticket, int flags, uint64_t *handle);

/* weir_pread and weir_pwrite move up to n bytes at off; they return the
 * count (short only at the end of the file, for reads). direct: as
 * O_DIRECT, past the IO service's page cache (offset and length multiples
 * of 4096, or -EINVAL, as Linux's). */
ssize_t weir_pread(weir_fs *fs, uint64_t handle, void *buf, size_t n, uint64_t off, int direct);
ssize_t weir_pwrite(weir_fs *fs, uint64_t handle, const void *buf, size_t n, uint64_t off, int direct);

/* weir_append writes n bytes at the end of the file, atomically with
 * every other write of it (O_APPEND), and stores where they went. */
ssize_t weir_append(weir_fs *fs, uint64_t handle, const void *buf, size_t n, uint64_t *at, int direct);

int weir_fsync(weir_fs *fs, uint64_t handle);
/* weir_syncfs makes every file of the store with changes not yet durable
 * durable, whoever wrote them, then the namespace (syncfs(2), sync(2)):
 * the first error, after trying them all. */
int weir_syncfs(weir_fs *fs);
int weir_fstat(weir_fs *fs, uint64_t handle, struct weir_attr *attr);
int weir_ftruncate(weir_fs *fs, uint64_t handle, uint64_t size);
int weir_close(weir_fs *fs, uint64_t handle);

/* Paths and symbolic links. Every path is weir's, relative to its root.
 * The calls follow the symbolic links they meet as Linux does (every
 * intermediate one; the last one where the call follows it), at most 40
 * (then -ELOOP). A link whose target leads out of weir (an absolute one
 * outside the mount weir_set_mount names, or ".." above weir's root)
 * ends the call with -WEIR_ERR_FOLLOW: weir_followed() then holds the
 * host path to go on with (the calling thread's, until its next call),
 * and *second, where a call takes two paths, which of them it replaces.
 * Without a mount every absolute target leads out. */
int weir_set_mount(weir_fs *fs, const char *mount);
const char *weir_followed(void);
/* weir_no_links(err), on the calling thread until weir_no_links(0):
 * a call that meets a symbolic link fails with err instead of following
 * it (openat2's RESOLVE_NO_SYMLINKS: ELOOP; RESOLVE_BENEATH: EXDEV). */
void weir_no_links(int err);

/* weir_normalize resolves ".", ".." and repeated slashes of the absolute
 * path in lexically, into out (cap bytes); 0 if it does not fit. */
int weir_normalize(const char *in, char *out, size_t cap);

/* weir_route splits the absolute host path in at mount (no trailing
 * slash; "/" holds every path): "." and ".." are resolved lexically only
 * until the path reaches the mount; if it does, the rest, as it is, is
 * weir's: stored in w ("." for the root) and 1 is returned (the metadata
 * service resolves its "." and ".." physically, after the links before
 * them, as Linux does, and a ".." above weir's root leads out again).
 * Otherwise the path, normalized, is stored in host and 0 is returned;
 * -1: it does not fit. The mount session asks WEIR_FEATURE_MOUNTED. */
int weir_route(const char *mount, const char *in, char *w, size_t wcap, char *host, size_t hcap);

int weir_stat(weir_fs *fs, const char *path, struct weir_attr *attr);
int weir_lstat(weir_fs *fs, const char *path, struct weir_attr *attr); /* a final link itself */
/* weir_resolve is weir_stat that also stores the path it reached, with
 * no link in it, in out (WEIR_MAX_PATH + 1 bytes): realpath's answer. */
int weir_resolve(weir_fs *fs, const char *path, char *out, struct weir_attr *attr);
/* weir_readlink copies up to n bytes of the link's target into buf (no
 * terminator) and returns their count; -EINVAL: path is no link. */
int weir_readlink(weir_fs *fs, const char *path, char *buf, size_t n);
int weir_symlink(weir_fs *fs, const char *target, const char *path);
/* weir_link gives oldpath the further name newpath (follow: a final link
 * of oldpath is followed, AT_SYMLINK_FOLLOW). */
int weir_link(weir_fs *fs, const char *oldpath, const char *newpath, int follow, int *second);
int weir_unlink(weir_fs *fs, const char *path);
int weir_mkdir(weir_fs *fs, const char *path, uint32_t mode);
int weir_rmdir(weir_fs *fs, const char *path);

int weir_rename(weir_fs *fs, const char *oldpath, const char *newpath, int *second);

/* Owner ids of -1 leave one unchanged, as chown(2)'s; nofollow changes a
 * final link itself (lchown). */
int weir_chmod(weir_fs *fs, const char *path, uint32_t mode);
int weir_fchmod(weir_fs *fs, uint64_t handle, uint32_t mode);
int weir_chown(weir_fs *fs, const char *path, int64_t uid, int64_t gid, int nofollow);
int weir_fchown(weir_fs *fs, uint64_t handle, int64_t uid, int64_t gid);

/* weir_readdir lists directory path: calls fn for each entry (name, inode,
 * S_IF* type bits) in name order; a non-zero return from fn stops it. */
int weir_readdir(weir_fs *fs, const char *path, int (*fn)(void *arg, const char *name, uint64_t ino, uint32_t type),
		 void *arg);

/* weir_lock sets (get 0) or tests (get 1) an advisory lock of type
 * WEIR_LOCK_READ, _WRITE or _UNLOCK and class WEIR_LOCK_POSIX, _OFD or
 * _FLOCK on the bytes [start, end) (end ~0: to the end of the file) of
 * the handle's file; -EAGAIN: another owner's lock is in the way (the
 * caller retries to wait). A test stores the first lock in the way in
 * held (type WEIR_LOCK_UNLOCK: none). */
struct weir_lock_info {
	uint8_t type, cls;
	int32_t pid;
	uint64_t start, end;
};
int weir_lock(weir_fs *fs, uint64_t handle, int get, uint8_t type, uint8_t cls, uint64_t start, uint64_t end,
	      struct weir_lock_info *held);

/* The cache region (docs/cache-abi.md): weir_cache_map maps a readable,
 * not O_DIRECT, handle's region of io's page cache read-only (one round
 * trip and one file on the session socket); weir_cache_read then copies
 * resident pages with no round trip, coherent with every write through
 * the service, and answers -EAGAIN where a page is absent or changing, or
 * the field group is: read through the ring (weir_pread), which fills
 * it. A mapping outlives its handle (as the region does its file's
 * close): weir_cache_unmap ends it. */
typedef struct weir_cache weir_cache;
int weir_cache_map(weir_fs *fs, uint64_t handle, weir_cache **out);
ssize_t weir_cache_read(const weir_cache *c, void *buf, size_t n, uint64_t off);
/* weir_cache_size is the file's live size from the region's field group
 * (every writer's completed writes and truncates included), or -EAGAIN
 * while it changes: ask the metadata service (weir_fstat). */
int64_t weir_cache_size(const weir_cache *c);
void weir_cache_unmap(weir_cache *c);
/* Write windows (docs/cache-abi.md §7): weir_cache_writable maps the
 * region's data memfd read-write too (the handle reads and writes);
 * weir_cache_pwrite then writes as weir_pwrite does (not O_DIRECT), but
 * an overwrite inside a window of the file that the handle's writes keep
 * warm is a copy into io's cache with no round trip, seen at once by
 * every reader and in the file's next fsync by anyone. -EAGAIN never.
 * weir_cache_release unpins the handle's windows: call it before
 * weir_close of the handle, from the process that mapped c (a child of
 * fork unmaps its parent's mappings with weir_cache_unmap alone). */
int weir_cache_writable(weir_fs *fs, weir_cache *c, uint64_t handle);
ssize_t weir_cache_pwrite(weir_fs *fs, weir_cache *c, uint64_t handle, const void *buf, size_t n, uint64_t off);
void weir_cache_release(weir_fs *fs, weir_cache *c);

/* weir_map maps bytes [off, off + len) of the handle's file (off page
 * aligned) over the reserved range at addr (len rounded up to pages;
 * MAP_FIXED): the pages of io's cache region (its data memfd, read-only,
 * or with writable read-write: the handle must write), which io fills and
 * keeps resident (WEIR_OP_MAP_PIN) until weir_unmap_pins of the same
 * handle, off and len, or the session's end. Loads see every write to the
 * file, as a kernel MAP_SHARED mapping's do, and stores are seen at once
 * by every read; past the file's end they read zeros (Linux: SIGBUS).
 * Stores reach the device after weir_map_sync of their range (msync),
 * weir_unmap_pins, or the session's end, by the next write-back or fsync.
 * -ENOMEM: io keeps no more pages pinned (a quarter of its cache per
 * session); -EOPNOTSUPP: io runs without a cache; -EBADF: writable on a
 * handle that does not write. */
int weir_map(weir_fs *fs, uint64_t handle, void *addr, size_t len, uint64_t off, int writable);
/* writable: the pin was weir_map's with writable (io takes back that
 * kind, a writable one's pages made dirty first). */
int weir_unmap_pins(weir_fs *fs, uint64_t handle, size_t len, uint64_t off, int writable);
int weir_map_sync(weir_fs *fs, uint64_t handle, size_t len, uint64_t off);
/* weir_map's two halves: the pins of the range, and its pages mapped at
 * addr (which needs the range pinned, by this handle or another). */
int weir_map_pins(weir_fs *fs, uint64_t handle, size_t len, uint64_t off, int writable);
int weir_map_at(weir_fs *fs, uint64_t handle, void *addr, size_t len, uint64_t off, int writable);

/* weir_statfs stores the store's room in bytes (free: to the superuser;
 * avail: to anyone); -EOPNOTSUPP where the backend cannot say. */
struct weir_space {
	uint64_t total, free, avail;
};
int weir_statfs(weir_fs *fs, struct weir_space *sp);

/* Times in Unix nanoseconds; WEIR_TIME_OMIT leaves one unchanged. */
int weir_utimens(weir_fs *fs, const char *path, int64_t atime, int64_t mtime, int nofollow);
int weir_futimens(weir_fs *fs, uint64_t handle, int64_t atime, int64_t mtime);

#ifdef __cplusplus
}
#endif

#endif
