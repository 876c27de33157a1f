/*
 * libweir-preload.so: LD_PRELOAD=libweir-preload.so runs an unmodified
 * dynamically linked program with the paths under WEIR_MOUNT (default
 * /weir) served by weir; every other path goes to the kernel untouched.
 * docs/architecture.md, "C library and shim", has the design; what each
 * entry point does is beside it below.
 *
 * Descriptors. A weir descriptor is a real descriptor number: an O_PATH
 * descriptor of a small memfd, the description page (layout below), which
 * holds what the kernel's open file description would: the offset, the
 * status flags, the file's ticket, and for a directory its path. The
 * kernel then does for weir descriptors what it does for its own: dup and
 * fork share the page (so offsets and flags are shared, across processes
 * too), FD_CLOEXEC and O_CLOEXEC are honoured by exec, and a descriptor
 * without them survives exec (a failed exec loses nothing); numbers never
 * collide with the kernel's. A process that did not open a description
 * itself (a forked child, or a new image after exec, which finds its
 * pages in /proc/self/fd at start) gets its own handle of the file from
 * the metadata service with the page's ticket (OpInherit) at its first
 * use. A program without the shim that inherits a weir descriptor gets
 * EBADF from read and write (an O_PATH descriptor), never wrong data.
 *
 * Paths are resolved lexically ("." and ".."; weir has no symbolic
 * links) against the cwd, a weir directory descriptor, or a kernel one;
 * chdir into the mount keeps the weir cwd here (and in a page that exec
 * passes on) and moves the kernel's to /proc, so that a program the shim
 * does not serve cannot write relative paths anywhere real.
 *
 * Not caught (see the architecture document): static binaries, Go
 * binaries, raw system calls, io_uring, and glibc's internal calls
 * (scandir, nftw, glob open directories without the public entry points).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <elf.h>
#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/aio_abi.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "weir.h"

_Static_assert(sizeof(struct stat) == sizeof(struct stat64), "struct stat64 is struct stat (64-bit Linux)");
_Static_assert(sizeof(struct statfs) == sizeof(struct statfs64) && sizeof(struct statvfs) == sizeof(struct statvfs64), "the 64 forms are the same layouts (64-bit Linux)");

/*
 * The description page (one memfd of PAGE_BYTES per open file
 * description; written only by the processes that share it):
 *
 *	  0 u32 magic     "WDSC" (WPAGE_MAGIC)
 *	  4 u32 version   1
 *	  8 i32 flags     open flags; F_SETFL changes the status flags
 *	 12 u32 kind      1 file, 2 directory, 3 O_PATH
 *	 16 u64 off       the offset (a directory's: the next entry's index)
 *	 24 u64 ino       the file's inode
 *	 32 [32] ticket   the metadata service's, for OpInherit (files)
 *	 64 mutex         process-shared and robust: off and flags
 *	256 char path[]   the path inside weir, NUL-terminated (PATH_MAX)
 *
 * A page is as trustworthy as the process that maps it: it only ever
 * holds what this process or its ancestors (same uid) wrote, and the
 * services check every request made from it.
 */
#define WPAGE_MAGIC 0x43534457u /* "WDSC" */
#define PAGE_BYTES 8192
enum { K_FILE = 1, K_DIR = 2, K_PATH = 3 };
struct wpage {
	uint32_t magic, version;
	int32_t flags;
	uint32_t kind;
	uint64_t off, ino;
	uint8_t ticket[WEIR_TICKET_SIZE];
	union {
		pthread_mutex_t mu;
		char pad[192];
	};
	char path[PATH_MAX];
};
_Static_assert(sizeof(struct wpage) <= PAGE_BYTES, "the page holds the description");
_Static_assert(offsetof(struct wpage, mu) == 64 && offsetof(struct wpage, path) == 256, "layout as documented");

/* A description as this process holds it. */
struct desc {
	struct wpage *pg;
	ino_t key;       /* the page's memfd inode: dup'ed descriptors share it */
	pid_t pid;       /* the process handle is of (another: not adopted yet) */
	uint64_t handle; /* files: this process's handle */
	int refs;        /* descriptors naming it, and calls in flight; under tab_mu */
	/* Directories: the listing getdents64 serves, read when it starts
	 * from entry 0 (under pg->mu). */
	struct dirent64 *ents;
	size_t nents;
	/* Files: the cache region's mapping (reads of resident pages copy
	 * from it, no round trip), made at the third read; under cache_mu. */
	weir_cache *cache;
	int reads, nocache, nowindows, wmapped;
};

#define MAX_FDS 65536
static struct desc *tab[MAX_FDS]; /* under tab_mu */
static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fs_mu = PTHREAD_MUTEX_INITIALIZER;
static weir_fs *wfs;
static pid_t wfs_pid; /* the process that dialled wfs: a forked child must not use it */

/* vfork (and posix_spawn, and Python's subprocess) runs a child in its
 * parent's memory until it execs: the shim's table, its sessions and the
 * standard streams are the parent's there, so a child of vfork changes
 * none of them. Its close and dup2 of weir descriptors are the kernel's
 * own there (the new image finds its weir descriptors after exec), its
 * path calls dial a session of their own, and its data calls on a weir
 * descriptor use the parent's handle, as a thread of the parent would.
 * tab_pid is the process the memory is of. */
static pid_t tab_pid;
static int vforked(void) { return getpid() != tab_pid; }

/* The weir cwd: set while the cwd is inside the mount. */
static pthread_mutex_t cwd_mu = PTHREAD_MUTEX_INITIALIZER;
static int wcwd_on;           /* under cwd_mu */
static char wcwd[PATH_MAX];   /* the weir path of the cwd; under cwd_mu */
static int cwd_fd = -1;       /* an O_PATH of a "weir-cwd" memfd holding it, for exec */

#define REAL(ret, name, ...)                                                     \
	static ret (*real_##name)(__VA_ARGS__);                                  \
	static void init_##name(void)                                            \
	{                                                                        \
		if (!real_##name)                                                \
			real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name); \
	}

REAL(int, open, const char *, int, ...)
REAL(int, openat, int, const char *, int, ...)
REAL(int, close, int)
REAL(int, close_range, unsigned int, unsigned int, int)
REAL(ssize_t, read, int, void *, size_t)
REAL(ssize_t, write, int, const void *, size_t)
REAL(ssize_t, pread, int, void *, size_t, off_t)
REAL(ssize_t, pwrite, int, const void *, size_t, off_t)
REAL(ssize_t, readv, int, const struct iovec *, int)
REAL(ssize_t, writev, int, const struct iovec *, int)
REAL(ssize_t, preadv, int, const struct iovec *, int, off_t)
REAL(ssize_t, pwritev, int, const struct iovec *, int, off_t)
REAL(ssize_t, preadv2, int, const struct iovec *, int, off_t, int)
REAL(ssize_t, pwritev2, int, const struct iovec *, int, off_t, int)
REAL(off_t, lseek, int, off_t, int)
REAL(int, fsync, int)
REAL(int, syncfs, int)
REAL(void, sync, void)
REAL(int, fdatasync, int)
REAL(int, sync_file_range, int, off64_t, off64_t, unsigned int)
REAL(int, ftruncate, int, off_t)
REAL(int, truncate, const char *, off_t)
REAL(int, fallocate, int, int, off_t, off_t)
REAL(int, posix_fallocate, int, off_t, off_t)
REAL(int, posix_fadvise, int, off_t, off_t, int)
REAL(int, fstat, int, struct stat *)
REAL(int, fstatat, int, const char *, struct stat *, int)
REAL(int, statx, int, const char *, int, unsigned int, struct statx *)
REAL(int, statfs, const char *, struct statfs *)
REAL(int, fstatfs, int, struct statfs *)
REAL(int, statvfs, const char *, struct statvfs *)
REAL(int, fstatvfs, int, struct statvfs *)
REAL(int, unlinkat, int, const char *, int)
REAL(int, mkdirat, int, const char *, mode_t)
REAL(int, mknodat, int, const char *, mode_t, dev_t)
REAL(int, renameat2, int, const char *, int, const char *, unsigned int)
REAL(int, linkat, int, const char *, int, const char *, int)
REAL(int, symlinkat, const char *, int, const char *)
REAL(ssize_t, readlink, const char *, char *, size_t)
REAL(ssize_t, readlinkat, int, const char *, char *, size_t)
REAL(int, fchmod, int, mode_t)
REAL(int, fchmodat, int, const char *, mode_t, int)
REAL(int, fchown, int, uid_t, gid_t)
REAL(int, fchownat, int, const char *, uid_t, gid_t, int)
REAL(int, faccessat, int, const char *, int, int)
REAL(int, utimensat, int, const char *, const struct timespec *, int)
REAL(int, futimens, int, const struct timespec *)
REAL(int, chdir, const char *)
REAL(int, fchdir, int)
REAL(char *, getcwd, char *, size_t)
REAL(char *, get_current_dir_name, void)
REAL(char *, realpath, const char *, char *)
REAL(DIR *, opendir, const char *)
REAL(DIR *, fdopendir, int)
REAL(struct dirent *, readdir, DIR *)
REAL(struct dirent64 *, readdir64, DIR *)
REAL(int, closedir, DIR *)
REAL(int, scandirat, int, const char *, struct dirent ***, int (*)(const struct dirent *),
     int (*)(const struct dirent **, const struct dirent **))
REAL(int, scandirat64, int, const char *, struct dirent64 ***, int (*)(const struct dirent64 *),
     int (*)(const struct dirent64 **, const struct dirent64 **))
REAL(int, glob, const char *, int, int (*)(const char *, int), glob_t *)
REAL(int, nftw, const char *, int (*)(const char *, const struct stat *, int, struct FTW *), int, int)
REAL(int, ftw, const char *, int (*)(const char *, const struct stat *, int), int)
REAL(int, glob64, const char *, int, int (*)(const char *, int), glob64_t *)
REAL(int, dirfd, DIR *)
REAL(void, rewinddir, DIR *)
REAL(long, telldir, DIR *)
REAL(void, seekdir, DIR *, long)
REAL(ssize_t, getdents64, int, void *, size_t)
REAL(FILE *, fopen, const char *, const char *)
REAL(FILE *, fopen64, const char *, const char *)
REAL(FILE *, fdopen, int, const char *)
REAL(int, fileno, FILE *)
REAL(int, fileno_unlocked, FILE *)
REAL(ssize_t, getxattr, const char *, const char *, void *, size_t)
REAL(ssize_t, lgetxattr, const char *, const char *, void *, size_t)
REAL(ssize_t, fgetxattr, int, const char *, void *, size_t)
REAL(ssize_t, listxattr, const char *, char *, size_t)
REAL(ssize_t, llistxattr, const char *, char *, size_t)
REAL(ssize_t, flistxattr, int, char *, size_t)
REAL(int, setxattr, const char *, const char *, const void *, size_t, int)
REAL(int, lsetxattr, const char *, const char *, const void *, size_t, int)
REAL(int, fsetxattr, int, const char *, const void *, size_t, int)
REAL(int, removexattr, const char *, const char *)
REAL(int, lremovexattr, const char *, const char *)
REAL(int, fremovexattr, int, const char *)
REAL(int, ioctl, int, unsigned long, ...)
REAL(ssize_t, copy_file_range, int, off64_t *, int, off64_t *, size_t, unsigned int)
REAL(ssize_t, sendfile, int, int, off_t *, size_t)
REAL(ssize_t, splice, int, loff_t *, int, loff_t *, size_t, unsigned int)
REAL(int, isatty, int)
REAL(int, tcgetattr, int, struct termios *)
REAL(int, dup, int)
REAL(int, dup2, int, int)
REAL(int, dup3, int, int, int)
REAL(int, fcntl, int, int, ...)
REAL(int, flock, int, int)
REAL(int, mkostemps, char *, int, int)
REAL(char *, mkdtemp, char *)
REAL(void *, mmap, void *, size_t, int, int, int, off_t)
REAL(int, munmap, void *, size_t)
REAL(int, msync, void *, size_t, int)
REAL(long, syscall, long, ...)
REAL(int, execve, const char *, char *const[], char *const[])

static int fail(int err)
{
	errno = err;
	return -1;
}

/* Symbolic links. libweir follows those that stay inside weir; one that
 * leads out of it (an absolute target elsewhere, ".." above the mount)
 * ends the weir call with -WEIR_ERR_FOLLOW, and the entry point runs
 * again on the host path weir_followed() names: AGAIN(call) evaluates
 * call with ext, a copy of that path, in scope. A path may come back into
 * weir through a kernel link (relink), so re-entries are bounded per
 * thread, as a walk's links are (ELOOP). A helper that met such a link
 * answers FOLLOWED. */
#define FOLLOWED (-3)
static __thread int reentries;
#define AGAIN_OR(failed, call)                                   \
	do {                                                     \
		if (reentries >= 40) {                           \
			errno = ELOOP;                           \
			return failed;                           \
		}                                                \
		char ext[PATH_MAX];                              \
		snprintf(ext, sizeof ext, "%s", weir_followed()); \
		reentries++;                                     \
		__typeof__(call) again_rc_ = (call);             \
		reentries--;                                     \
		return again_rc_;                                \
	} while (0)
#define AGAIN(call) AGAIN_OR(-1, call)

static const char *mount_point(size_t *len)
{
	const char *m = getenv("WEIR_MOUNT");
	if (!m || m[0] != '/')
		m = "/weir";
	size_t n = strlen(m);
	while (n > 1 && m[n - 1] == '/')
		n--;
	*len = n;
	return m;
}

/* in_mount returns the path inside weir ("." for the root) of the
 * normalized absolute path norm, or NULL if it is not under the mount. */
static const char *in_mount(const char *norm)
{
	size_t m;
	const char *mount = mount_point(&m);
	if (m == 1)
		return norm[1] ? norm + 1 : "."; /* (WEIR_MOUNT=/: everything) */
	if (strncmp(norm, mount, m) != 0 || (norm[m] != '/' && norm[m] != 0))
		return NULL;
	return norm[m] == '/' ? norm + m + 1 : ".";
}

/* has_dotdot says whether a relative path has a ".." component (only
 * then can it leave the directory it starts from). */
static int has_dotdot(const char *p)
{
	for (const char *s = p; (s = strstr(s, "..")) != NULL; s += 2)
		if ((s == p || s[-1] == '/') && (s[2] == 0 || s[2] == '/'))
			return 1;
	return 0;
}

/* fs returns the process's weir sessions, dialling them at first use. */
static weir_fs *dial_env(int *err);
static weir_fs *fs(int *err)
{
	if (vforked())
		return dial_env(err); /* (never stored: the memory is the parent's; the child execs soon) */
	pthread_mutex_lock(&fs_mu);
	if (wfs && wfs_pid != getpid())
		wfs = NULL; /* a forked child: its rings are the parent's; dial anew */
	if (!wfs && (wfs = dial_env(err)) != NULL)
		wfs_pid = getpid();
	weir_fs *f = wfs;
	pthread_mutex_unlock(&fs_mu);
	return f;
}

#define FS_OR_FAIL(f)                                   \
	int fs_err_ = 0;                                \
	weir_fs *f = fs(&fs_err_);                      \
	if (!f)                                         \
		return fail(fs_err_ ? fs_err_ : EIO)

/* FS_OR_FAIL_NULL is FS_OR_FAIL for a call that answers a pointer. */
#define FS_OR_FAIL_NULL(f)                              \
	int fs_err_ = 0;                                \
	weir_fs *f = fs(&fs_err_);                      \
	if (!f) {                                       \
		errno = fs_err_ ? fs_err_ : EIO;        \
		return NULL;                            \
	}

/* host_path writes the host's path of the weir path w into out
 * (PATH_MAX bytes; "" if it does not fit: ENOENT) and returns it. */
static int weir_abs(const char *w, char *out, size_t cap);
static const char *host_path(const char *w, char *out)
{
	if (!weir_abs(w, out, PATH_MAX))
		out[0] = 0;
	return out;
}

static weir_fs *dial_env(int *err)
{
	const char *run = getenv("WEIR_RUN_DIR");
	char meta[PATH_MAX], io[PATH_MAX];
	const char *ms = getenv("WEIR_META_SOCK"), *is = getenv("WEIR_IO_SOCK");
	if (!run)
		run = "/run/weir";
	snprintf(meta, sizeof meta, "%s/metadata.sock", run);
	snprintf(io, sizeof io, "%s/io.sock", run);
	weir_fs *f = NULL;
	int e = weir_dial(ms ? ms : meta, is ? is : io, &f);
	if (e) {
		*err = -e;
		return NULL;
	}
	size_t ml;
	const char *mount = mount_point(&ml);
	char mp[PATH_MAX];
	snprintf(mp, sizeof mp, "%.*s", (int)ml, mount);
	weir_set_mount(f, mp); /* (an absolute link target under it stays in weir) */
	return f;
}

/* Page locks: robust, so that a process killed while holding one (it
 * shares the page with others) does not leave them waiting forever. */
static void lock_pg(struct wpage *p)
{
	if (pthread_mutex_lock(&p->mu) == EOWNERDEAD)
		pthread_mutex_consistent(&p->mu);
}
static void unlock_pg(struct wpage *p) { pthread_mutex_unlock(&p->mu); }

/* map_page maps the memfd behind the O_PATH descriptor fd (its inode in
 * *key), or NULL. */
static struct wpage *map_page(int fd, ino_t *key)
{
	char pp[64];
	snprintf(pp, sizeof pp, "/proc/self/fd/%d", fd);
	init_open();
	init_close();
	init_fstat();
	int m = real_open(pp, O_RDWR | O_CLOEXEC);
	if (m < 0)
		return NULL;
	struct stat st;
	void *p = MAP_FAILED;
	if (real_fstat(m, &st) == 0 && st.st_size == PAGE_BYTES)
		p = mmap(NULL, PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	real_close(m);
	if (p == MAP_FAILED)
		return NULL;
	*key = st.st_ino;
	return p;
}

/* new_page makes a description page and its descriptor (close-on-exec
 * if cloexec), and returns the descriptor, or -errno. */
static int new_page(const char *name, int cloexec, struct wpage **out, ino_t *key)
{
	init_ftruncate();
	init_open();
	init_close();
	int m = memfd_create(name, MFD_CLOEXEC);
	if (m < 0)
		return -errno;
	int e = 0, fd = -1;
	if (real_ftruncate(m, PAGE_BYTES) != 0) {
		e = errno;
	} else {
		char pp[64];
		snprintf(pp, sizeof pp, "/proc/self/fd/%d", m);
		fd = real_open(pp, O_PATH | (cloexec ? O_CLOEXEC : 0));
		if (fd < 0)
			e = errno == ENOENT ? ENOSYS : errno; /* (no /proc: weir descriptors need it) */
	}
	real_close(m);
	if (e)
		return -e;
	if (fd >= MAX_FDS) {
		real_close(fd);
		return -EMFILE;
	}
	struct wpage *p = map_page(fd, key);
	if (!p) {
		e = errno ? errno : ENOMEM;
		real_close(fd);
		return -e;
	}
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&p->mu, &a);
	pthread_mutexattr_destroy(&a);
	p->magic = WPAGE_MAGIC;
	p->version = 1;
	*out = p;
	return fd;
}

static void free_desc(struct desc *d)
{
	weir_cache_unmap(d->cache);
	free(d->ents);
	munmap(d->pg, PAGE_BYTES);
	free(d);
}

/* adopt gives d a handle of this process's session if another process
 * opened it (fork, exec). Under adopt_mu, which fork_prepare holds too. */
static void put(struct desc *d);
static pthread_mutex_t adopt_mu = PTHREAD_MUTEX_INITIALIZER;
static int adopt(struct desc *d)
{
	pthread_mutex_lock(&adopt_mu);
	int e = 0;
	if (d->pid != getpid()) {
		if (d->pg->kind == K_FILE) {
			int err = 0;
			weir_fs *f = fs(&err);
			uint64_t h = 0;
			e = f ? weir_inherit(f, d->pg->ticket, d->pg->flags, &h) : -(err ? err : EIO);
			if (!e)
				d->handle = h;
			/* A mapping of the parent's (fork) is of its session: this
			 * process maps the region anew for its own handle. */
			weir_cache_unmap(d->cache);
			d->cache = NULL;
			d->reads = d->nocache = d->nowindows = d->wmapped = 0;
		}
		if (!e)
			d->pid = getpid();
	}
	pthread_mutex_unlock(&adopt_mu);
	return e;
}

/* get returns fd's description with a reference, adopted, or NULL if fd
 * is not weir's (*err 0) or cannot be used here (*err, an errno); put
 * drops the reference. */
static struct desc *get(int fd, int *err)
{
	*err = 0;
	if (fd < 0 || fd >= MAX_FDS)
		return NULL;
	pthread_mutex_lock(&tab_mu);
	struct desc *d = tab[fd];
	if (d)
		d->refs++;
	pthread_mutex_unlock(&tab_mu);
	/* tab_pid, not getpid() (a system call, a third of a cached read's
	 * time): a child of fork (or _Fork) has it set before it runs, and
	 * a child of vfork, which runs on its parent's memory until it
	 * execs, uses its parent's handle and session as a thread of the
	 * parent would (the kernel shares the open file description with
	 * it too). */
	if (d && d->pid != __atomic_load_n(&tab_pid, __ATOMIC_RELAXED)) {
		if (vforked()) {
			put(d);
			return NULL; /* the kernel's (an O_PATH descriptor: EBADF) */
		}
		int e = adopt(d);
		if (e) {
			put(d);
			*err = -e == ESTALE ? EBADF : -e; /* (the file is gone) */
			return NULL;
		}
	}
	return d;
}

static void put(struct desc *d)
{
	pthread_mutex_lock(&tab_mu);
	int last = --d->refs == 0;
	pthread_mutex_unlock(&tab_mu);
	if (last) {
		weir_fs *f = wfs;
		if (d->handle && f && wfs_pid == getpid() && d->pid == wfs_pid) {
			weir_cache_release(f, d->cache); /* its write windows, before the handle ends */
			weir_close(f, d->handle);
		}
		free_desc(d);
	}
}

static void std_sync(int fd);

/* install makes fd name d (one more reference), dropping what fd named. */
static void install(int fd, struct desc *d)
{
	if (vforked())
		return;
	pthread_mutex_lock(&tab_mu);
	struct desc *old = tab[fd];
	tab[fd] = d;
	if (d)
		d->refs++;
	pthread_mutex_unlock(&tab_mu);
	if (old)
		put(old);
	if (fd <= 2 && (old != NULL) != (d != NULL))
		std_sync(fd);
}

/* forget drops what fd named in the table (the kernel closed it). */
static void forget(int fd)
{
	if (fd < 0 || fd >= MAX_FDS || vforked())
		return;
	pthread_mutex_lock(&tab_mu);
	struct desc *d = tab[fd];
	tab[fd] = NULL;
	pthread_mutex_unlock(&tab_mu);
	if (d)
		put(d);
	if (d && fd <= 2)
		std_sync(fd);
}

/* Macros for an entry point on a descriptor: D is its weir description,
 * or the kernel's call is made. */
#define FD_OR_KERNEL(fd, d, kernel_call)                      \
	int d##_err = 0;                                      \
	struct desc *d = get((fd), &d##_err);                 \
	if (!d) {                                             \
		if (d##_err)                                  \
			return fail(d##_err);                 \
		return (kernel_call);                         \
	}

/* copy_cwd copies the weir cwd into out; 0 if the cwd is the kernel's. */
static int copy_cwd(char *out, size_t cap)
{
	pthread_mutex_lock(&cwd_mu);
	int on = wcwd_on;
	if (on)
		snprintf(out, cap, "%s", wcwd);
	pthread_mutex_unlock(&cwd_mu);
	return on;
}

/* A resolved path: weir's (w, inside weir), or the kernel's (kpath from
 * kdir: the caller's, or an absolute one the shim made). */
struct route {
	int weir;
	char w[PATH_MAX];
	const char *kpath;
	int kdir;
	char kbuf[PATH_MAX];
};

/* route resolves path from dirfd (AT_FDCWD, a weir directory, or a
 * kernel one); 0, or an errno (a weir descriptor that is not a
 * directory: ENOTDIR). */
static int route(int dirfd, const char *path, struct route *r)
{
	const char *volatile vp = path; /* (a nonnull parameter may still be NULL) */
	r->weir = 0;
	r->kpath = path;
	r->kdir = dirfd;
	if (!vp || !*vp)
		return 0; /* the kernel answers EFAULT or ENOENT */
	char full[PATH_MAX * 2 + 2];
	int made = 0; /* the kernel's path must be the one made here */
	size_t pl = strlen(path);
	if (pl >= PATH_MAX)
		return 0; /* the kernel answers ENAMETOOLONG */
	size_t ml;
	const char *mount = mount_point(&ml);
	if (path[0] == '/') {
		memcpy(full, path, pl + 1);
	} else if (dirfd == AT_FDCWD) {
		char c[PATH_MAX];
		if (copy_cwd(c, sizeof c)) {
			snprintf(full, sizeof full, "%.*s/%s/%s", (int)ml, mount, c, path);
			made = 1;
		} else {
			init_getcwd();
			if (!real_getcwd(c, sizeof c))
				return 0;
			snprintf(full, sizeof full, "%s/%s", c, path);
		}
	} else {
		int e = 0;
		struct desc *d = get(dirfd, &e);
		if (d) {
			int k = d->pg->kind;
			if (k != K_FILE)
				snprintf(full, sizeof full, "%.*s/%s/%s", (int)ml, mount, d->pg->path, path);
			put(d);
			if (k == K_FILE)
				return ENOTDIR;
			made = 1;
		} else if (e) {
			return e;
		} else {
			/* A kernel directory: only ".." can climb from it into
			 * the mount (which no kernel directory is under). */
			if (!has_dotdot(path)) {
				char c[PATH_MAX];
				int ancestor = 0;
				/* ...or it is an ancestor of the mount ("/" and "weir/x"). */
				char pp[64];
				snprintf(pp, sizeof pp, "/proc/self/fd/%d", dirfd);
				init_readlink();
				ssize_t n = real_readlink(pp, c, sizeof c - 1);
				if (n > 0 && c[0] == '/') {
					c[n] = 0;
					ancestor = strncmp(mount, c, (size_t)n) == 0 && (n == 1 || mount[n] == '/' || (size_t)n == ml);
					if (ancestor)
						snprintf(full, sizeof full, "%s/%s", c, path);
				}
				if (!ancestor)
					return 0;
			} else {
				char c[PATH_MAX], pp[64];
				snprintf(pp, sizeof pp, "/proc/self/fd/%d", dirfd);
				init_readlink();
				ssize_t n = real_readlink(pp, c, sizeof c - 1);
				if (n <= 0 || c[0] != '/')
					return 0; /* not a directory the kernel names: its answer */
				c[n] = 0;
				snprintf(full, sizeof full, "%s/%s", c, path);
			}
		}
	}
	/* Up to the mount "." and ".." are resolved lexically; inside it they
	 * are weir's (physical, after the links before them), and a ".."
	 * above weir's root leads out again (libweir). */
	char norm[PATH_MAX * 2 + 2];
	int in = weir_route(mount, full, r->w, sizeof r->w, norm, sizeof norm);
	if (in < 0)
		return ENAMETOOLONG;
	if (in) {
		r->weir = 1;
		return 0;
	}
	/* A path that climbs out of the mount ("/weir/../etc") means, as it
	 * would with the mount a directory, where its lexical form points:
	 * the kernel has no /weir to walk through. */
	if (!made && strncmp(full, mount, ml) == 0 && (full[ml] == '/' || full[ml] == 0) && ml > 1)
		made = 1;
	if (made) {
		if (strlen(norm) >= sizeof r->kbuf)
			return ENAMETOOLONG;
		strcpy(r->kbuf, norm);
		r->kpath = r->kbuf;
		r->kdir = AT_FDCWD;
	}
	return 0;
}

/* relink: a kernel path that failed with ENOENT or ENOTDIR may lead into
 * the mount through a kernel symbolic link (/home/u/data -> /weir/data),
 * which the kernel cannot follow: the kernel has no /weir. relink walks
 * the path component by component, following the kernel's links
 * (readlink; at most 40, as Linux's ELOOP bound; the last component only
 * if follow), and reroutes r to weir if the walk enters the mount; 0 if
 * it does not (the kernel's answer stands). Only paths the kernel refused
 * pay the walk. */
static int relink(struct route *r, int follow)
{
	char path[PATH_MAX * 2 + 2];
	if (r->kpath[0] == '/') {
		snprintf(path, sizeof path, "%s", r->kpath);
	} else {
		char base[PATH_MAX];
		if (r->kdir == AT_FDCWD) {
			init_getcwd();
			if (!real_getcwd(base, sizeof base))
				return 0;
		} else {
			char pp[64];
			snprintf(pp, sizeof pp, "/proc/self/fd/%d", r->kdir);
			init_readlink();
			ssize_t n = real_readlink(pp, base, sizeof base - 1);
			if (n <= 0 || base[0] != '/')
				return 0;
			base[n] = 0;
		}
		snprintf(path, sizeof path, "%s/%s", base, r->kpath);
	}
	init_readlink();
	char done[PATH_MAX * 2 + 2] = ""; /* resolved so far (no symbolic links in it) */
	const char *rest = path;
	char buf[PATH_MAX * 2 + 2];
	for (int links = 0;;) {
		while (*rest == '/')
			rest++;
		if (!*rest)
			return 0;
		const char *e = strchrnul(rest, '/');
		size_t len = (size_t)(e - rest);
		size_t dl = strlen(done);
		if (len == 2 && rest[0] == '.' && rest[1] == '.') {
			char *slash = strrchr(done, '/');
			if (slash)
				*slash = 0;
		} else if (!(len == 1 && rest[0] == '.')) {
			if (dl + 1 + len >= sizeof done)
				return 0;
			done[dl] = '/';
			memcpy(done + dl + 1, rest, len);
			done[dl + 1 + len] = 0;
			if (in_mount(done)) {
				/* Into the mount: the remainder is weir's. */
				char full[PATH_MAX * 2 + 2], norm[PATH_MAX * 2 + 2];
				size_t ml;
				snprintf(full, sizeof full, "%s%s", done, e);
				if (weir_route(mount_point(&ml), full, r->w, sizeof r->w, norm, sizeof norm) != 1)
					return 0;
				r->weir = 1;
				return 1;
			}
			int last = *e == 0 || e[strspn(e, "/")] == 0;
			char target[PATH_MAX];
			ssize_t n = (!last || follow) ? real_readlink(done, target, sizeof target - 1) : -1;
			if (n > 0) {
				if (++links > 40)
					return 0;
				target[n] = 0;
				done[dl] = 0; /* the link's directory */
				if (target[0] == '/')
					done[0] = 0;
				snprintf(buf, sizeof buf, "%s/%s", target, e);
				memcpy(path, buf, strlen(buf) + 1);
				rest = path;
				continue;
			}
		}
		rest = e;
	}
}

/* relink_keeping_errno is relink that leaves errno as the kernel's call
 * set it when the walk finds no way into the mount (its readlinks answer
 * EINVAL for every component that is no link). */
static int relink_keeping_errno(struct route *r, int follow)
{
	int e = errno;
	int moved = relink(r, follow);
	if (!moved)
		errno = e;
	return moved;
}

/* KERNEL_OR_RELINK runs weir's call on a weir route, else the kernel's; if it failed as a path that
 * may lead into the mount through a kernel link would, and relink finds
 * that it does, it runs weir's instead. */
#define KERNEL_OR_RELINK(r, follow, kernel_call, weir_call, again)                            \
	do {                                                                                  \
		if (!(r).weir) {                                                              \
			int rc_ = (kernel_call);                                              \
			if (rc_ >= 0 || !RELINKED(r, follow))                                  \
				return rc_;                                                   \
		}                                                                             \
		int w_ = (weir_call);                                                         \
		if (w_ == FOLLOWED)                                                           \
			AGAIN(again);                                                         \
		return w_;                                                                    \
	} while (0)

/* RELINKED: after a kernel call on r failed, whether relink moved r to
 * weir (errno is the kernel's otherwise). */
#define RELINKED(r, follow) ((errno == ENOENT || errno == ENOTDIR) && relink_keeping_errno(&(r), follow))

/* ROUTE resolves (dirfd, path) into the route R, failing the call on an
 * error. */
#define ROUTE(dirfd, path, R)                        \
	struct route R;                              \
	do {                                         \
		int route_e_ = route(dirfd, path, &R); \
		if (route_e_)                        \
			return fail(route_e_);       \
	} while (0)

/* cur_umask returns the process's umask (the kernel applies it to a
 * create; weir's service takes the mode as given). */
static mode_t cur_umask(void)
{
	init_open();
	init_read();
	init_close();
	int fd = real_open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		char buf[4096];
		ssize_t n = real_read(fd, buf, sizeof buf - 1);
		real_close(fd);
		if (n > 0) {
			buf[n] = 0;
			char *p = strstr(buf, "\nUmask:");
			if (p)
				return (mode_t)strtoul(p + 7, NULL, 8) & 0777;
		}
	}
	mode_t m = umask(022); /* (not atomic: only where /proc is missing) */
	umask(m);
	return m;
}

/* waccess is access(2) from the attributes: the real uid and gid, as the
 * kernel checks (root passes but for X on a file with no x bit). */
static int may(const struct weir_attr *a, int mode)
{
	if (mode == F_OK)
		return 0;
	uid_t uid = getuid();
	if (uid == 0)
		return (mode & X_OK) && !S_ISDIR(a->mode) && !(a->mode & 0111) ? EACCES : 0;
	unsigned bits;
	if (a->uid == uid) {
		bits = a->mode >> 6 & 7;
	} else {
		int in = a->gid == getgid();
		gid_t gs[256];
		int n = getgroups(256, gs);
		for (int i = 0; !in && i < n; i++)
			in = gs[i] == a->gid;
		bits = in ? a->mode >> 3 & 7 : a->mode & 7;
	}
	unsigned want = (mode & R_OK ? 4 : 0) | (mode & W_OK ? 2 : 0) | (mode & X_OK ? 1 : 0);
	return (want & ~bits) ? EACCES : 0;
}

static int waccess(const char *w, int mode, int nofollow)
{
	FS_OR_FAIL(f);
	struct weir_attr a;
	int e = nofollow ? weir_lstat(f, w, &a) : weir_stat(f, w, &a);
	if (e == -(int)WEIR_ERR_FOLLOW)
		return FOLLOWED;
	if (e)
		return fail(-e);
	e = may(&a, mode);
	return e ? fail(e) : 0;
}

/* wopen opens the weir path w and returns its descriptor. */
static int wopen(const char *w, int flags, mode_t mode)
{
	FS_OR_FAIL(f);
	if ((flags & O_TMPFILE) == O_TMPFILE)
		return fail(EOPNOTSUPP); /* as a kernel file system without it */
	uint64_t h = 0;
	struct weir_attr a;
	uint8_t ticket[WEIR_TICKET_SIZE] = {0};
	int kind = K_FILE, e;
	char resolved[WEIR_MAX_PATH + 1];
	snprintf(resolved, sizeof resolved, "%s", w);
	if (flags & (O_PATH | O_DIRECTORY)) {
		/* No handle: the page names the path, with no link in it (a
		 * directory's is what openat and fchdir start from). */
		e = (flags & O_NOFOLLOW) ? weir_lstat(f, w, &a) : 0;
		if (!e && (flags & O_NOFOLLOW) && S_ISLNK(a.mode)) {
			/* O_PATH | O_NOFOLLOW: a descriptor of the link itself */
			if (!(flags & O_PATH))
				e = -ELOOP;
			else if (flags & O_DIRECTORY)
				e = -ENOTDIR;
		} else if (!e) {
			e = weir_resolve(f, w, resolved, &a);
		}
		if (!e && (flags & O_DIRECTORY) && !S_ISDIR(a.mode))
			e = -ENOTDIR;
		if (!e && !(flags & O_PATH) && (flags & O_ACCMODE) != O_RDONLY)
			e = -EISDIR;
		if (!e && !(flags & O_PATH))
			e = -may(&a, R_OK);
		kind = (flags & O_PATH) ? K_PATH : K_DIR;
	} else {
		if (flags & O_CREAT)
			mode &= ~cur_umask();
		e = weir_open(f, w, flags & ~O_CLOEXEC, mode & 07777, &h, &a, ticket);
		if (!e && S_ISDIR(a.mode)) {
			weir_close(f, h); /* (a directory opened O_RDONLY without O_DIRECTORY) */
			h = 0;
			kind = K_DIR;
			struct weir_attr da;
			e = weir_resolve(f, w, resolved, &da); /* (its page names it with no link in the path) */
		}
	}
	if (e == -(int)WEIR_ERR_FOLLOW)
		return FOLLOWED;
	if (e)
		return fail(-e);
	struct wpage *p;
	ino_t key;
	int fd = new_page("weir-desc", flags & O_CLOEXEC, &p, &key);
	struct desc *d = fd < 0 ? NULL : calloc(1, sizeof *d);
	if (!d) {
		if (fd >= 0) {
			munmap(p, PAGE_BYTES);
			init_close(); /* (opendir, fopen and openat2 come here unresolved) */
			real_close(fd);
		}
		if (h)
			weir_close(f, h);
		return fail(fd < 0 ? -fd : ENOMEM);
	}
	p->flags = flags & ~O_CLOEXEC;
	p->kind = (uint32_t)kind;
	p->ino = a.ino;
	memcpy(p->ticket, ticket, sizeof ticket);
	snprintf(p->path, sizeof p->path, "%s", resolved);
	d->pg = p;
	d->key = key;
	d->pid = getpid();
	d->handle = h;
	install(fd, d);
	return fd;
}

static mode_t open_mode(int flags, va_list ap)
{
	return ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) ? (mode_t)va_arg(ap, int) : 0;
}

static int do_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	ROUTE(dirfd, path, r);
	init_openat();
	KERNEL_OR_RELINK(r, !(flags & O_NOFOLLOW), real_openat(r.kdir, r.kpath, flags, mode), wopen(r.w, flags, mode),
			 do_openat(AT_FDCWD, ext, flags, mode));
}

int open(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	return do_openat(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	return do_openat(AT_FDCWD, path, flags | O_LARGEFILE, mode);
}

int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	return do_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	return do_openat(dirfd, path, flags | O_LARGEFILE, mode);
}

/* The fortify forms (_FORTIFY_SOURCE), which take no mode. */
int __open_2(const char *path, int flags) { return do_openat(AT_FDCWD, path, flags, 0); }
int __open64_2(const char *path, int flags) { return do_openat(AT_FDCWD, path, flags | O_LARGEFILE, 0); }
int __openat_2(int dirfd, const char *path, int flags) { return do_openat(dirfd, path, flags, 0); }
int __openat64_2(int dirfd, const char *path, int flags) { return do_openat(dirfd, path, flags | O_LARGEFILE, 0); }
int creat(const char *path, mode_t mode) { return do_openat(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) { return do_openat(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_LARGEFILE, mode); }

/* own says whether fd is the shim's own (a service socket, the cwd page). */
static int own(int fd) { return (wfs && wfs_pid == getpid() && weir_own_fd(wfs, fd)) || (fd >= 0 && fd == cwd_fd); }

static int any_posix_lock; /* this process set a POSIX lock: close must release them */

/* posix_unlock_all releases this process's POSIX locks on fd's file, as
 * the close of any of its descriptors does in POSIX. */
static void posix_unlock_all(int fd)
{
	if (!any_posix_lock || fd < 0 || fd >= MAX_FDS)
		return;
	/* Only a description this process uses can hold its locks (a forked
	 * child inherits none): no adoption just to close. */
	pthread_mutex_lock(&tab_mu);
	struct desc *d = tab[fd];
	if (d && (d->pid != getpid() || d->pg->kind != K_FILE))
		d = NULL;
	if (d)
		d->refs++;
	pthread_mutex_unlock(&tab_mu);
	if (!d)
		return;
	weir_lock(wfs, d->handle, 0, WEIR_LOCK_UNLOCK, WEIR_LOCK_POSIX, 0, UINT64_MAX, NULL);
	put(d);
}

int close(int fd)
{
	init_close();
	if (own(fd))
		return fail(EBADF); /* not the program's: as if it were not open */
	posix_unlock_all(fd);
	forget(fd);
	return real_close(fd);
}

/* close_range and closefrom: the kernel's, around the shim's own
 * descriptors, which the program never had. */
static int close_span(unsigned a, unsigned b, int flags)
{
	init_close_range();
	if (!real_close_range)
		return fail(ENOSYS);
	if (!(flags & CLOSE_RANGE_CLOEXEC))
		for (unsigned fd = a; fd <= b && fd < MAX_FDS; fd++) {
			posix_unlock_all((int)fd);
			forget((int)fd);
		}
	return real_close_range(a, b, flags);
}

int close_range(unsigned int first, unsigned int last, int flags)
{
	if (first > last)
		return fail(EINVAL);
	int mine[3] = {-1, -1, -1}, n = 0;
	/* The shim's descriptors in the range, in order (at most three). */
	if (wfs && wfs_pid == getpid())
		for (unsigned fd = first; fd <= last && fd < MAX_FDS && n < 2; fd++)
			if (weir_own_fd(wfs, (int)fd))
				mine[n++] = (int)fd;
	if (cwd_fd >= 0 && (unsigned)cwd_fd >= first && (unsigned)cwd_fd <= last)
		mine[n++] = cwd_fd;
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (mine[j] < mine[i]) {
				int t = mine[i];
				mine[i] = mine[j];
				mine[j] = t;
			}
	unsigned at = first;
	for (int i = 0; i < n; i++) {
		if ((unsigned)mine[i] > at && close_span(at, (unsigned)mine[i] - 1, flags) != 0)
			return -1;
		at = (unsigned)mine[i] + 1;
	}
	if (at <= last && close_span(at, last, flags) != 0)
		return -1;
	return 0;
}

void closefrom(int lowfd)
{
	if (lowfd >= 0)
		close_range((unsigned)lowfd, ~0u, 0);
}

/* DIRECT: the description's O_DIRECT, which weir honours (past its page
 * cache, with Linux's alignment of offset and length). */
#define DIRECT(d) (((d)->pg->flags & O_DIRECT) != 0)

static int readable(int flags) { return (flags & O_ACCMODE) != O_WRONLY && !(flags & O_PATH); }
static int writable(int flags) { return (flags & O_ACCMODE) != O_RDONLY && !(flags & O_PATH); }

/* A file's data calls need a file description (not a directory's). */
static int data_errno(const struct desc *d, int write)
{
	if (d->pg->kind == K_PATH)
		return EBADF;
	if (d->pg->kind == K_DIR)
		return write ? EBADF : EISDIR;
	return 0;
}

/* cached_read copies [off, off+n) from d's cache region: the count, or
 * -EAGAIN (read through the ring). A handle maps its region at its third
 * read: a file read once or twice does not pay for the mapping. */
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static weir_cache *desc_cache(struct desc *d)
{
	if (DIRECT(d))
		return NULL;
	weir_cache *c = __atomic_load_n(&d->cache, __ATOMIC_ACQUIRE);
	if (c)
		return c;
	if (d->nocache || __atomic_add_fetch(&d->reads, 1, __ATOMIC_RELAXED) < 3)
		return NULL;
	pthread_mutex_lock(&cache_mu);
	if (!d->cache && !d->nocache) {
		weir_cache *m = NULL;
		if (weir_cache_map(wfs, d->handle, &m) == 0)
			__atomic_store_n(&d->cache, m, __ATOMIC_RELEASE);
		else
			d->nocache = 1; /* (no cache at io, or a broken answer: the ring's) */
	}
	c = d->cache;
	pthread_mutex_unlock(&cache_mu);
	return c;
}

static ssize_t cached_read(struct desc *d, void *buf, size_t n, uint64_t off)
{
	if (n == 0)
		return -EAGAIN;
	weir_cache *c = desc_cache(d);
	return c ? weir_cache_read(c, buf, n, off) : -EAGAIN;
}

/* file_write writes at off: a description that reads and writes, not
 * O_DIRECT, O_SYNC or O_DSYNC, maps its region read-write at its third
 * read, seek or write, and from then on overwrites inside windows its
 * writes keep warm are copies into io's cache (weir_cache_pwrite: no
 * round trip); the rest goes through the ring. */
static ssize_t file_write(struct desc *d, const void *buf, size_t n, uint64_t off)
{
	int f = d->pg->flags;
	if (DIRECT(d) || !readable(f) || (f & (O_SYNC | O_DSYNC)) || d->nowindows)
		return weir_pwrite(wfs, d->handle, buf, n, off, DIRECT(d));
	weir_cache *c = desc_cache(d);
	if (c && !__atomic_load_n(&d->wmapped, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&cache_mu);
		if (!d->nowindows && !d->wmapped) {
			if (weir_cache_writable(wfs, c, d->handle) == 0)
				__atomic_store_n(&d->wmapped, 1, __ATOMIC_RELEASE);
			else
				d->nowindows = 1; /* (a file io cannot map: the ring's) */
		}
		pthread_mutex_unlock(&cache_mu);
	}
	return weir_cache_pwrite(wfs, d->wmapped ? c : NULL, d->handle, buf, n, off);
}

/* file_size is the size lseek's SEEK_END, SEEK_DATA and SEEK_HOLE start
 * from: the live size in d's cache region's field group, which io keeps
 * current for every writer (docs/cache-abi.md), with no round trip once
 * the region is mapped (at the handle's third read or seek, as for
 * reads); else the metadata service's fstat. (PostgreSQL seeks to the end
 * of a relation ten times per pgbench transaction.) */
static int file_size(struct desc *d, int64_t *size)
{
	/* Only a readable description maps its region (io refuses to map
	 * one that cannot read, with the EBADF of a recall). */
	weir_cache *c = readable(d->pg->flags) ? desc_cache(d) : NULL;
	if (c) {
		int64_t v = weir_cache_size(c);
		if (v >= 0) {
			*size = v;
			return 0;
		}
	}
	struct weir_attr a;
	int e = weir_fstat(wfs, d->handle, &a);
	if (!e)
		*size = (int64_t)a.size;
	return e;
}

ssize_t read(int fd, void *buf, size_t n)
{
	init_read();
	FD_OR_KERNEL(fd, d, real_read(fd, buf, n));
	ssize_t r;
	int e = data_errno(d, 0);
	if (e || !readable(d->pg->flags)) {
		r = -(e ? e : EBADF);
	} else {
		lock_pg(d->pg);
		r = cached_read(d, buf, n, d->pg->off);
		if (r == -EAGAIN)
			r = weir_pread(wfs, d->handle, buf, n, d->pg->off, DIRECT(d));
		if (r > 0)
			d->pg->off += (uint64_t)r;
		unlock_pg(d->pg);
	}
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	if (n > buflen)
		abort(); /* as glibc's __chk_fail */
	return read(fd, buf, n);
}

ssize_t write(int fd, const void *buf, size_t n)
{
	init_write();
	FD_OR_KERNEL(fd, d, real_write(fd, buf, n));
	ssize_t r;
	int e = data_errno(d, 1);
	if (e || !writable(d->pg->flags)) {
		r = -(e ? e : EBADF);
	} else {
		lock_pg(d->pg);
		if (d->pg->flags & O_APPEND) {
			uint64_t at = 0;
			r = weir_append(wfs, d->handle, buf, n, &at, DIRECT(d));
			if (r > 0)
				d->pg->off = at + (uint64_t)r;
		} else {
			r = file_write(d, buf, n, d->pg->off);
			if (r > 0)
				d->pg->off += (uint64_t)r;
		}
		unlock_pg(d->pg);
	}
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	init_pread();
	FD_OR_KERNEL(fd, d, real_pread(fd, buf, n, off));
	int e = data_errno(d, 0);
	ssize_t r = e ? -e : off < 0 ? -EINVAL : !readable(d->pg->flags) ? -EBADF : cached_read(d, buf, n, (uint64_t)off);
	if (r == -EAGAIN)
		r = weir_pread(wfs, d->handle, buf, n, (uint64_t)off, DIRECT(d));
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	init_pwrite();
	FD_OR_KERNEL(fd, d, real_pwrite(fd, buf, n, off));
	int e = data_errno(d, 1);
	/* Linux: pwrite on an O_APPEND descriptor appends (a documented bug). */
	ssize_t r = e ? -e : off < 0 ? -EINVAL : !writable(d->pg->flags) ? -EBADF
		    : (d->pg->flags & O_APPEND) ? weir_append(wfs, d->handle, buf, n, NULL, DIRECT(d))
						: file_write(d, buf, n, (uint64_t)off);
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t pread64(int fd, void *buf, size_t n, off64_t off) { return pread(fd, buf, n, (off_t)off); }
ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) { return pwrite(fd, buf, n, (off_t)off); }
ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	if (n > buflen)
		abort();
	return pread(fd, buf, n, off);
}
ssize_t __pread64_chk(int fd, void *buf, size_t n, off64_t off, size_t buflen)
{
	if (n > buflen)
		abort();
	return pread(fd, buf, n, (off_t)off);
}

/* The vector calls: one request per buffer, but for a write, which
 * gathers the vector into one (so that an O_APPEND writev stays one
 * atomic append) where it fits 1 MiB. */
static ssize_t vec_read(int fd, const struct iovec *iov, int n, off_t off, int positioned)
{
	if (n < 0 || n > IOV_MAX)
		return fail(EINVAL);
	ssize_t total = 0;
	for (int i = 0; i < n; i++) {
		ssize_t r = positioned ? pread(fd, iov[i].iov_base, iov[i].iov_len, off + total)
				       : read(fd, iov[i].iov_base, iov[i].iov_len);
		if (r < 0)
			return total ? total : r;
		total += r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return total;
}

static ssize_t vec_write(int fd, const struct iovec *iov, int n, off_t off, int positioned)
{
	if (n < 0 || n > IOV_MAX)
		return fail(EINVAL);
	size_t sum = 0;
	for (int i = 0; i < n; i++)
		sum += iov[i].iov_len;
	if (sum <= (1u << 20)) {
		char *b = malloc(sum ? sum : 1);
		if (b) {
			size_t at = 0;
			for (int i = 0; i < n; i++) {
				memcpy(b + at, iov[i].iov_base, iov[i].iov_len);
				at += iov[i].iov_len;
			}
			ssize_t r = positioned ? pwrite(fd, b, sum, off) : write(fd, b, sum);
			int e = errno;
			free(b);
			errno = e;
			return r;
		}
	}
	ssize_t total = 0;
	for (int i = 0; i < n; i++) {
		ssize_t r = positioned ? pwrite(fd, iov[i].iov_base, iov[i].iov_len, off + total)
				       : write(fd, iov[i].iov_base, iov[i].iov_len);
		if (r < 0)
			return total ? total : r;
		total += r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return total;
}

/* is_weir says whether fd is a weir descriptor (or one this process may
 * not use: its call fails); it takes no reference. */
static int is_weir(int fd)
{
	if (fd < 0 || fd >= MAX_FDS)
		return 0;
	pthread_mutex_lock(&tab_mu);
	int r = tab[fd] != NULL;
	pthread_mutex_unlock(&tab_mu);
	return r;
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
	init_readv();
	return is_weir(fd) ? vec_read(fd, iov, n, 0, 0) : real_readv(fd, iov, n);
}
ssize_t writev(int fd, const struct iovec *iov, int n)
{
	init_writev();
	return is_weir(fd) ? vec_write(fd, iov, n, 0, 0) : real_writev(fd, iov, n);
}
ssize_t preadv(int fd, const struct iovec *iov, int n, off_t off)
{
	init_preadv();
	return is_weir(fd) ? vec_read(fd, iov, n, off, 1) : real_preadv(fd, iov, n, off);
}
ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
	init_pwritev();
	return is_weir(fd) ? vec_write(fd, iov, n, off, 1) : real_pwritev(fd, iov, n, off);
}
/* preadv2 and pwritev2: offset -1 is the descriptor's; the RWF_ flags are
 * hints but RWF_APPEND (appends whatever the descriptor's flags) and the
 * sync ones (the write, then fdatasync). */
ssize_t preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
	init_preadv2();
	if (!is_weir(fd))
		return real_preadv2(fd, iov, n, off, flags);
	return off == -1 ? vec_read(fd, iov, n, 0, 0) : vec_read(fd, iov, n, off, 1);
}
ssize_t pwritev2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
	init_pwritev2();
	if (!is_weir(fd))
		return real_pwritev2(fd, iov, n, off, flags);
	ssize_t r;
	if (flags & RWF_APPEND) {
		/* An append whatever the description's flags (which stay as they
		 * are): one atomic append of the gathered vector; the offset
		 * moves only when off is -1. */
		int e = 0;
		struct desc *d = get(fd, &e);
		if (!d)
			return fail(e ? e : EBADF);
		size_t sum = 0;
		for (int i = 0; i < n && n <= IOV_MAX; i++)
			sum += iov[i].iov_len;
		char *b = n < 0 || n > IOV_MAX ? NULL : malloc(sum ? sum : 1);
		if (!b) {
			put(d);
			return fail(n < 0 || n > IOV_MAX ? EINVAL : ENOMEM);
		}
		size_t pos = 0;
		for (int i = 0; i < n; pos += iov[i].iov_len, i++)
			memcpy(b + pos, iov[i].iov_base, iov[i].iov_len);
		e = data_errno(d, 1);
		uint64_t at = 0;
		if (!e && !writable(d->pg->flags))
			e = EBADF;
		if (e) {
			r = -e;
		} else if (off == -1) {
			lock_pg(d->pg);
			r = weir_append(wfs, d->handle, b, sum, &at, DIRECT(d));
			if (r > 0)
				d->pg->off = at + (uint64_t)r;
			unlock_pg(d->pg);
		} else {
			r = weir_append(wfs, d->handle, b, sum, &at, DIRECT(d));
		}
		free(b);
		put(d);
		if (r < 0)
			return fail((int)-r);
	} else {
		r = off == -1 ? vec_write(fd, iov, n, 0, 0) : vec_write(fd, iov, n, off, 1);
	}
	if (r >= 0 && (flags & (RWF_DSYNC | RWF_SYNC)) && fdatasync(fd) != 0)
		return -1;
	return r;
}
ssize_t preadv64(int fd, const struct iovec *iov, int n, off64_t off) { return preadv(fd, iov, n, (off_t)off); }
ssize_t pwritev64(int fd, const struct iovec *iov, int n, off64_t off) { return pwritev(fd, iov, n, (off_t)off); }
ssize_t preadv64v2(int fd, const struct iovec *iov, int n, off64_t off, int fl) { return preadv2(fd, iov, n, (off_t)off, fl); }
ssize_t pwritev64v2(int fd, const struct iovec *iov, int n, off64_t off, int fl) { return pwritev2(fd, iov, n, (off_t)off, fl); }

static int attr_of(struct desc *d, struct weir_attr *a)
{
	if (d->pg->kind == K_FILE)
		return weir_fstat(wfs, d->handle, a);
	if (d->pg->flags & O_NOFOLLOW)
		return weir_lstat(wfs, d->pg->path, a); /* (O_PATH of a link: the link) */
	return weir_stat(wfs, d->pg->path, a); /* (a directory's page names its path) */
}

off_t lseek(int fd, off_t off, int whence)
{
	init_lseek();
	FD_OR_KERNEL(fd, d, real_lseek(fd, off, whence));
	off_t r;
	int e = d->pg->kind == K_PATH ? -EBADF : 0;
	lock_pg(d->pg);
	int64_t base = 0, size = 0;
	if (!e) {
		switch (whence) {
		case SEEK_SET:
			break;
		case SEEK_CUR:
			base = (int64_t)d->pg->off;
			break;
		case SEEK_END:
		case SEEK_DATA:
		case SEEK_HOLE:
			if (d->pg->kind == K_DIR) {
				e = -EINVAL;
				break;
			}
			e = file_size(d, &size);
			if (e || whence == SEEK_END) {
				base = size;
				break;
			}
			/* No holes are reported: data everywhere, one hole at the end. */
			if (off < 0 || off >= size)
				e = -ENXIO;
			else if (whence == SEEK_HOLE)
				off = (off_t)size;
			break;
		default:
			e = -EINVAL;
		}
	}
	if (!e && ((off < 0 && base < -(int64_t)off) || (off > 0 && base > INT64_MAX - (int64_t)off)))
		e = -EINVAL; /* before 0, or past what an offset holds (no signed overflow) */
	else if (!e && d->pg->kind == K_FILE && base + (int64_t)off > (int64_t)WEIR_MAX_FILE_SIZE)
		e = -EINVAL; /* past weir's largest file, as Linux past s_maxbytes */
	if (e) {
		r = fail(-e);
	} else {
		d->pg->off = (uint64_t)(base + off);
		if (d->pg->kind == K_DIR && d->pg->off == 0) {
			free(d->ents); /* rewound: list afresh */
			d->ents = NULL;
		}
		r = (off_t)d->pg->off;
	}
	unlock_pg(d->pg);
	put(d);
	return r;
}

off64_t lseek64(int fd, off64_t off, int whence) { return lseek(fd, (off_t)off, whence); }

static int sync_maps(uint8_t *lo, uint8_t *hi, uint64_t ino, uint64_t **handles, size_t *nhandles, size_t *maxh);
static size_t nwritable; /* writable MAP_SHARED mappings of weir files (struct wmap), read without a lock */

/* file_sync is fsync of a file: what this process stored through its
 * writable mappings of it first (sync_maps), as the kernel's fsync
 * writes a file's dirty mapped pages. */
static int file_sync(struct desc *d)
{
	if (__atomic_load_n(&nwritable, __ATOMIC_ACQUIRE) != 0) {
		struct weir_attr at;
		int e = weir_fstat(wfs, d->handle, &at);
		if (!e)
			e = sync_maps(NULL, NULL, at.ino, NULL, NULL, 0);
		if (e)
			return e;
	}
	return weir_fsync(wfs, d->handle);
}

/* fsync of a directory: weir's namespace is durable when a call returns. */
static int do_sync(struct desc *d) { return d->pg->kind == K_FILE ? file_sync(d) : d->pg->kind == K_PATH ? -EBADF : 0; }

int fsync(int fd)
{
	init_fsync();
	FD_OR_KERNEL(fd, d, real_fsync(fd));
	int e = do_sync(d);
	put(d);
	return e ? fail(-e) : 0;
}

int fdatasync(int fd)
{
	init_fdatasync();
	FD_OR_KERNEL(fd, d, real_fdatasync(fd));
	int e = do_sync(d);
	put(d);
	return e ? fail(-e) : 0;
}

/* syncfs of a weir descriptor syncs the whole store (WEIR_OP_SYNC_FS),
 * after what this process stored through its writable mappings. */
static int weir_sync_all(weir_fs *f)
{
	int e = __atomic_load_n(&nwritable, __ATOMIC_ACQUIRE) ? sync_maps(NULL, NULL, 0, NULL, NULL, 0) : 0;
	int e2 = weir_syncfs(f);
	return e ? e : e2;
}

int syncfs(int fd)
{
	init_syncfs();
	FD_OR_KERNEL(fd, d, real_syncfs(fd));
	put(d);
	FS_OR_FAIL(f);
	int e = weir_sync_all(f);
	return e ? fail(-e) : 0;
}

/* sync is the kernel's, then weir's store's when this process reaches the
 * services (sync(2) cannot fail: weir's error is dropped, as the
 * kernel's are). */
void sync(void)
{
	init_sync();
	real_sync();
	int err = 0, saved = errno;
	weir_fs *f = fs(&err);
	if (f)
		weir_sync_all(f);
	errno = saved;
}

/* sync_file_range: weir writes the whole file durably (more than asked). */
int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags)
{
	init_sync_file_range();
	FD_OR_KERNEL(fd, d, real_sync_file_range(fd, off, n, flags));
	int e = off < 0 || n < 0 || (flags & ~7u) ? -EINVAL : d->pg->kind != K_FILE ? -ESPIPE : 0;
	if (!e && (flags & SYNC_FILE_RANGE_WRITE))
		e = file_sync(d);
	put(d);
	return e ? fail(-e) : 0;
}

int ftruncate(int fd, off_t size)
{
	init_ftruncate();
	FD_OR_KERNEL(fd, d, real_ftruncate(fd, size));
	int e = d->pg->kind != K_FILE ? -EINVAL : size < 0 ? -EINVAL : !writable(d->pg->flags) ? -EINVAL
										      : weir_ftruncate(wfs, d->handle, (uint64_t)size);
	put(d);
	return e ? fail(-e) : 0;
}

int ftruncate64(int fd, off64_t size) { return ftruncate(fd, (off_t)size); }

int truncate(const char *path, off_t size)
{
	ROUTE(AT_FDCWD, path, r);
	if (!r.weir) {
		init_truncate();
		int rc = real_truncate(r.kpath, size);
		if (rc == 0 || !RELINKED(r, 1))
			return rc;
	}
	if (size < 0)
		return fail(EINVAL);
	FS_OR_FAIL(f);
	uint64_t h;
	struct weir_attr a;
	int e = weir_open(f, r.w, O_WRONLY, 0, &h, &a, NULL);
	if (e == -(int)WEIR_ERR_FOLLOW)
		AGAIN(truncate(ext, size));
	if (e)
		return fail(-e == EISDIR ? EISDIR : -e);
	e = weir_ftruncate(f, h, (uint64_t)size);
	weir_close(f, h);
	return e ? fail(-e) : 0;
}

int truncate64(const char *path, off64_t size) { return truncate(path, (off_t)size); }

/* fallocate: weir allocates as it writes; mode 0 makes the file at least
 * off+len long, FALLOC_FL_KEEP_SIZE changes nothing, the others (holes,
 * ranges) are not supported. */
static int wfallocate(int fd, int mode, off_t off, off_t len)
{
	int e = 0;
	struct desc *d = get(fd, &e);
	if (!d)
		return e ? e : EBADF; /* (a weir descriptor this process may not use: a vfork child's) */
	if (d->pg->kind != K_FILE)
		e = d->pg->kind == K_DIR ? EISDIR : EBADF;
	else if (off < 0 || len <= 0)
		e = EINVAL;
	else if (!writable(d->pg->flags))
		e = EBADF;
	else if (mode & ~FALLOC_FL_KEEP_SIZE)
		e = EOPNOTSUPP;
	else if (off > INT64_MAX - len)
		e = EFBIG;
	else if (!(mode & FALLOC_FL_KEEP_SIZE)) {
		struct weir_attr a;
		e = -weir_fstat(wfs, d->handle, &a);
		if (!e && a.size < off + len)
			e = -weir_ftruncate(wfs, d->handle, (uint64_t)(off + len));
	}
	put(d);
	return e;
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
	init_fallocate();
	if (!is_weir(fd))
		return real_fallocate(fd, mode, off, len);
	int e = wfallocate(fd, mode, off, len);
	return e ? fail(e) : 0;
}
int fallocate64(int fd, int mode, off64_t off, off64_t len) { return fallocate(fd, mode, (off_t)off, (off_t)len); }

/* posix_fallocate returns the errno (glibc's calls the system call
 * itself, which the shim would not see). */
int posix_fallocate(int fd, off_t off, off_t len)
{
	init_posix_fallocate();
	if (!is_weir(fd))
		return real_posix_fallocate(fd, off, len);
	return wfallocate(fd, 0, off, len);
}
int posix_fallocate64(int fd, off64_t off, off64_t len) { return posix_fallocate(fd, (off_t)off, (off_t)len); }

/* posix_fadvise: advice only (readahead is the IO service's). */
int posix_fadvise(int fd, off_t off, off_t len, int advice)
{
	init_posix_fadvise();
	int e = 0;
	struct desc *d = get(fd, &e);
	if (!d)
		return e ? e : real_posix_fadvise(fd, off, len, advice);
	e = d->pg->kind == K_PATH ? EBADF : (advice < 0 || advice > 5 || len < 0) ? EINVAL : 0;
	put(d);
	return e;
}
int posix_fadvise64(int fd, off64_t off, off64_t len, int advice) { return posix_fadvise(fd, (off_t)off, (off_t)len, advice); }

/* blocks is a size in 512-byte units as weir stores it: whole 4 KiB
 * pages (as ext4 and XFS count a file without holes). */
/* blocks is st_blocks (512-byte units) of a file of mode and size: 4 KiB
 * blocks, and none for a symbolic link, whose target lives in its inode
 * (as ext4's "fast" links up to 59 bytes; weir keeps every target so). */
static int64_t blocks(uint32_t mode, int64_t size)
{
	return size <= 0 || S_ISLNK(mode) ? 0 : (size + 4095) / 4096 * 8;
}

static void fill_stat(const struct weir_attr *a, struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_dev = makedev(0, 0x77);
	st->st_ino = a->ino;
	st->st_mode = a->mode;
	st->st_nlink = a->nlink;
	st->st_uid = a->uid;
	st->st_gid = a->gid;
	st->st_size = a->size;
	st->st_blksize = 4096;
	st->st_blocks = blocks(a->mode, a->size);
	st->st_atim.tv_sec = a->atime / 1000000000;
	st->st_atim.tv_nsec = a->atime % 1000000000;
	st->st_mtim.tv_sec = a->mtime / 1000000000;
	st->st_mtim.tv_nsec = a->mtime % 1000000000;
	st->st_ctim.tv_sec = a->ctime / 1000000000;
	st->st_ctim.tv_nsec = a->ctime % 1000000000;
}

int fstat(int fd, struct stat *st)
{
	init_fstat();
	FD_OR_KERNEL(fd, d, real_fstat(fd, st));
	struct weir_attr a;
	int e = attr_of(d, &a);
	put(d);
	if (e)
		return fail(-e);
	fill_stat(&a, st);
	return 0;
}

/* (On 64-bit Linux struct stat64 and struct stat are one layout.) */
int fstat64(int fd, struct stat64 *st) { return fstat(fd, (struct stat *)st); }

static int wstat(const char *w, struct stat *st, int nofollow)
{
	FS_OR_FAIL(f);
	struct weir_attr a;
	int e = nofollow ? weir_lstat(f, w, &a) : weir_stat(f, w, &a);
	if (e == -(int)WEIR_ERR_FOLLOW)
		return FOLLOWED;
	if (e)
		return fail(-e);
	fill_stat(&a, st);
	return 0;
}

int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	const char *volatile vp = path;
	if (vp && !*vp && (flags & AT_EMPTY_PATH))
		return fstat(dirfd, st);
	ROUTE(dirfd, path, r);
	init_fstatat();
	int nofollow = (flags & AT_SYMLINK_NOFOLLOW) != 0;
	KERNEL_OR_RELINK(r, !nofollow, real_fstatat(r.kdir, r.kpath, st, flags), wstat(r.w, st, nofollow),
			 fstatat(AT_FDCWD, ext, st, flags));
}

int stat(const char *path, struct stat *st) { return fstatat(AT_FDCWD, path, st, 0); }
int lstat(const char *path, struct stat *st) { return fstatat(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW); }
int stat64(const char *path, struct stat64 *st) { return stat(path, (struct stat *)st); }
int lstat64(const char *path, struct stat64 *st) { return lstat(path, (struct stat *)st); }
int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) { return fstatat(dirfd, path, (struct stat *)st, flags); }

/* The stat forms of binaries built before glibc 2.33 (version argument
 * _STAT_VER, 1 on x86-64: struct stat as today). */
int __xstat(int ver, const char *path, struct stat *st) { return ver == 1 ? stat(path, st) : fail(EINVAL); }
int __lxstat(int ver, const char *path, struct stat *st) { return ver == 1 ? lstat(path, st) : fail(EINVAL); }
int __fxstat(int ver, int fd, struct stat *st) { return ver == 1 ? fstat(fd, st) : fail(EINVAL); }
int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
	return ver == 1 ? fstatat(dirfd, path, st, flags) : fail(EINVAL);
}
int __xstat64(int ver, const char *path, struct stat64 *st) { return __xstat(ver, path, (struct stat *)st); }
int __lxstat64(int ver, const char *path, struct stat64 *st) { return __lxstat(ver, path, (struct stat *)st); }
int __fxstat64(int ver, int fd, struct stat64 *st) { return __fxstat(ver, fd, (struct stat *)st); }
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags)
{
	return __fxstatat(ver, dirfd, path, (struct stat *)st, flags);
}

static void fill_statx(const struct weir_attr *a, struct statx *sx)
{
	memset(sx, 0, sizeof *sx);
	sx->stx_mask = STATX_BASIC_STATS;
	sx->stx_blksize = 4096;
	sx->stx_nlink = a->nlink;
	sx->stx_uid = a->uid;
	sx->stx_gid = a->gid;
	sx->stx_mode = (uint16_t)a->mode;
	sx->stx_ino = a->ino;
	sx->stx_size = (uint64_t)a->size;
	sx->stx_blocks = (uint64_t)blocks(a->mode, a->size);
	sx->stx_atime.tv_sec = a->atime / 1000000000;
	sx->stx_atime.tv_nsec = (uint32_t)(a->atime % 1000000000);
	sx->stx_mtime.tv_sec = a->mtime / 1000000000;
	sx->stx_mtime.tv_nsec = (uint32_t)(a->mtime % 1000000000);
	sx->stx_ctime.tv_sec = a->ctime / 1000000000;
	sx->stx_ctime.tv_nsec = (uint32_t)(a->ctime % 1000000000);
	sx->stx_dev_major = 0;
	sx->stx_dev_minor = 0x77;
}

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *sx)
{
	struct weir_attr a;
	int e;
	const char *volatile vp = path;
	init_statx();
	if (vp && !*vp && (flags & AT_EMPTY_PATH)) {
		FD_OR_KERNEL(dirfd, d, real_statx(dirfd, path, flags, mask, sx));
		e = attr_of(d, &a);
		put(d);
	} else {
		ROUTE(dirfd, path, r);
		if (!r.weir) {
			int rc = real_statx(r.kdir, r.kpath, flags, mask, sx);
			if (rc >= 0 || !RELINKED(r, !(flags & AT_SYMLINK_NOFOLLOW)))
				return rc;
		}
		FS_OR_FAIL(f);
		e = (flags & AT_SYMLINK_NOFOLLOW) ? weir_lstat(f, r.w, &a) : weir_stat(f, r.w, &a);
		if (e == -(int)WEIR_ERR_FOLLOW)
			AGAIN(statx(AT_FDCWD, ext, flags, mask, sx));
	}
	if (e)
		return fail(-e);
	fill_statx(&a, sx);
	return 0;
}

/* statfs and statvfs: the store's room, from the IO service (OpStatFS);
 * f_type is weir's own magic ("weir"), 4 KiB blocks. Inode counts are
 * not kept (f_files and f_ffree 0, as on file systems that allocate
 * inodes as they go). ENOSYS where the backend cannot say. */
#define WEIR_FS_MAGIC 0x72696577 /* "weir" */

static int wspace(struct weir_space *sp)
{
	FS_OR_FAIL(f);
	int e = weir_statfs(f, sp);
	return e ? fail(-e == EOPNOTSUPP ? ENOSYS : -e) : 0;
}

static int fill_statfs(struct statfs *b)
{
	struct weir_space sp;
	if (wspace(&sp) != 0)
		return -1;
	memset(b, 0, sizeof *b);
	b->f_type = WEIR_FS_MAGIC;
	b->f_bsize = b->f_frsize = 4096;
	b->f_blocks = sp.total / 4096;
	b->f_bfree = sp.free / 4096;
	b->f_bavail = sp.avail / 4096;
	b->f_namelen = WEIR_MAX_NAME;
	b->f_fsid.__val[1] = 0x77;
	return 0;
}

static int fill_statvfs(struct statvfs *b)
{
	struct statfs s;
	if (fill_statfs(&s) != 0)
		return -1;
	memset(b, 0, sizeof *b);
	b->f_bsize = b->f_frsize = 4096;
	b->f_blocks = s.f_blocks;
	b->f_bfree = s.f_bfree;
	b->f_bavail = s.f_bavail;
	b->f_fsid = 0x77;
	b->f_namemax = WEIR_MAX_NAME;
	return 0;
}

int statfs(const char *path, struct statfs *b)
{
	ROUTE(AT_FDCWD, path, r);
	if (r.weir) {
		struct stat st;
		int rc = wstat(r.w, &st, 0);
		if (rc == FOLLOWED)
			AGAIN(statfs(ext, b));
		return rc != 0 ? -1 : fill_statfs(b);
	}
	init_statfs();
	return real_statfs(r.kpath, b);
}
int fstatfs(int fd, struct statfs *b)
{
	init_fstatfs();
	FD_OR_KERNEL(fd, d, real_fstatfs(fd, b));
	put(d);
	return fill_statfs(b);
}
int statvfs(const char *path, struct statvfs *b)
{
	ROUTE(AT_FDCWD, path, r);
	if (r.weir) {
		struct stat st;
		int rc = wstat(r.w, &st, 0);
		if (rc == FOLLOWED)
			AGAIN(statvfs(ext, b));
		return rc != 0 ? -1 : fill_statvfs(b);
	}
	init_statvfs();
	return real_statvfs(r.kpath, b);
}
int fstatvfs(int fd, struct statvfs *b)
{
	init_fstatvfs();
	FD_OR_KERNEL(fd, d, real_fstatvfs(fd, b));
	put(d);
	return fill_statvfs(b);
}
int statfs64(const char *path, struct statfs64 *b) { return statfs(path, (struct statfs *)b); }
int fstatfs64(int fd, struct statfs64 *b) { return fstatfs(fd, (struct statfs *)b); }
int statvfs64(const char *path, struct statvfs64 *b) { return statvfs(path, (struct statvfs *)b); }
int fstatvfs64(int fd, struct statvfs64 *b) { return fstatvfs(fd, (struct statvfs *)b); }

/* A namespace call on a weir path: W is its path inside weir. */
#define WEIR_CALL(expr, again)                     \
	do {                                       \
		FS_OR_FAIL(f);                     \
		int e_ = (expr);                   \
		if (e_ == -(int)WEIR_ERR_FOLLOW)   \
			AGAIN(again);              \
		return e_ ? fail(-e_) : 0;         \
	} while (0)

int unlinkat(int dirfd, const char *path, int flags)
{
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_unlinkat();
		int rc = real_unlinkat(r.kdir, r.kpath, flags);
		if (rc == 0 || !RELINKED(r, 0))
			return rc;
	}
	if (flags & ~AT_REMOVEDIR)
		return fail(EINVAL);
	WEIR_CALL((flags & AT_REMOVEDIR) ? weir_rmdir(f, r.w) : weir_unlink(f, r.w), unlinkat(AT_FDCWD, ext, flags));
}
int unlink(const char *path) { return unlinkat(AT_FDCWD, path, 0); }
int rmdir(const char *path) { return unlinkat(AT_FDCWD, path, AT_REMOVEDIR); }

int mkdirat(int dirfd, const char *path, mode_t mode)
{
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_mkdirat();
		int rc = real_mkdirat(r.kdir, r.kpath, mode);
		if (rc == 0 || !RELINKED(r, 0))
			return rc;
	}
	WEIR_CALL(weir_mkdir(f, r.w, mode & 07777 & ~cur_umask()), mkdirat(AT_FDCWD, ext, mode));
}
int mkdir(const char *path, mode_t mode) { return mkdirat(AT_FDCWD, path, mode); }

/* mknodat: weir keeps regular files, directories and symbolic links. A
 * regular file (S_IFREG or no type) is an exclusive create; a FIFO, a
 * socket or a device node is EPERM, as on a Linux file system without
 * special files (vfat), once the checks Linux makes first have passed:
 * the type (EPERM for S_IFDIR, EINVAL for none of the six), then the name
 * (EEXIST, or the parent's ENOENT/ENOTDIR). docs/posix-differences.md. */
static int weir_mknodat(int dirfd, const char *path, mode_t mode)
{
	switch (mode & S_IFMT) {
	case 0:
	case S_IFREG: {
		int fd = openat(dirfd, path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 07777);
		if (fd < 0)
			return -1;
		close(fd);
		return 0;
	}
	case S_IFDIR:
		return fail(EPERM);
	case S_IFIFO:
	case S_IFSOCK:
	case S_IFCHR:
	case S_IFBLK:
		break;
	default:
		return fail(EINVAL);
	}
	struct stat st;
	if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return fail(EEXIST);
	if (errno != ENOENT)
		return -1;
	char parent[PATH_MAX];
	size_t n = strnlen(path, PATH_MAX);
	if (n >= PATH_MAX)
		return fail(ENAMETOOLONG);
	memcpy(parent, path, n + 1);
	while (n > 1 && parent[n - 1] == '/')
		parent[--n] = 0;
	char *slash = strrchr(parent, '/');
	if (!slash)
		strcpy(parent, ".");
	else if (slash == parent)
		parent[1] = 0;
	else
		*slash = 0;
	if (fstatat(dirfd, parent, &st, 0) != 0)
		return -1;
	if (!S_ISDIR(st.st_mode))
		return fail(ENOTDIR);
	return fail(EPERM);
}

int mknodat(int dirfd, const char *path, mode_t mode, dev_t dev)
{
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_mknodat();
		int rc = real_mknodat(r.kdir, r.kpath, mode, dev);
		if (rc == 0 || !RELINKED(r, 0))
			return rc;
	}
	return weir_mknodat(dirfd, path, mode);
}
int mknod(const char *path, mode_t mode, dev_t dev) { return mknodat(AT_FDCWD, path, mode, dev); }
int mkfifoat(int dirfd, const char *path, mode_t mode) { return mknodat(dirfd, path, (mode & 07777) | S_IFIFO, 0); }
int mkfifo(const char *path, mode_t mode) { return mknodat(AT_FDCWD, path, (mode & 07777) | S_IFIFO, 0); }
/* glibc before 2.33 called these (binaries built then still do). */
int __xmknodat(int ver, int dirfd, const char *path, mode_t mode, dev_t *dev)
{
	(void)ver;
	return mknodat(dirfd, path, mode, dev ? *dev : 0);
}
int __xmknod(int ver, const char *path, mode_t mode, dev_t *dev) { return __xmknodat(ver, AT_FDCWD, path, mode, dev); }

/* relink2: after the kernel's rename or link of two kernel paths failed,
 * whether a kernel link led either of them into the mount (relink; the
 * last component is not followed): then the call is weir's, or EXDEV
 * between weir and the kernel. errno stays the kernel's otherwise. */
static int relink2(struct route *a, struct route *b)
{
	if (errno != ENOENT && errno != ENOTDIR)
		return 0;
	int e = errno;
	int moved = relink(a, 0);
	moved |= relink(b, 0);
	if (!moved)
		errno = e;
	return moved;
}

int renameat2(int olddir, const char *oldpath, int newdir, const char *newpath, unsigned int flags)
{
	ROUTE(olddir, oldpath, a);
	ROUTE(newdir, newpath, b);
	if (!a.weir && !b.weir) {
		init_renameat2();
		int rc = real_renameat2(a.kdir, a.kpath, b.kdir, b.kpath, flags);
		if (rc == 0 || !relink2(&a, &b))
			return rc;
	}
	if (a.weir != b.weir)
		return fail(EXDEV); /* between weir and the kernel: another file system */
	if (a.weir) {
		if (flags & RENAME_NOREPLACE) {
			/* (checked, then renamed: not atomic against another
			 * process creating the name in between) */
			struct stat st;
			if (wstat(b.w, &st, 1) == 0)
				return fail(EEXIST);
			flags &= ~RENAME_NOREPLACE;
		}
		if (flags)
			return fail(EINVAL); /* RENAME_EXCHANGE, RENAME_WHITEOUT: not supported */
		int second = 0;
		char other[PATH_MAX];
		WEIR_CALL(weir_rename(f, a.w, b.w, &second),
			  second ? renameat2(AT_FDCWD, host_path(a.w, other), AT_FDCWD, ext, flags)
				 : renameat2(AT_FDCWD, ext, AT_FDCWD, host_path(b.w, other), flags));
	}
	return fail(EXDEV); /* (not reached: neither is weir's only when the kernel answered) */
}
int renameat(int olddir, const char *oldpath, int newdir, const char *newpath) { return renameat2(olddir, oldpath, newdir, newpath, 0); }
int rename(const char *oldpath, const char *newpath) { return renameat2(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0); }

/* Links: weir's namespace holds hard and symbolic links (the metadata
 * service keeps them; libweir follows them). */
int linkat(int olddir, const char *oldpath, int newdir, const char *newpath, int flags)
{
	const char *volatile vp = oldpath;
	if (vp && !*vp && (flags & AT_EMPTY_PATH) && is_weir(olddir))
		return fail(ENOENT); /* (linkat of a weir descriptor: weir has no O_TMPFILE to name) */
	ROUTE(olddir, oldpath, a);
	ROUTE(newdir, newpath, b);
	if (!a.weir && !b.weir) {
		init_linkat();
		int rc = real_linkat(a.kdir, a.kpath, b.kdir, b.kpath, flags);
		if (rc == 0 || !relink2(&a, &b))
			return rc;
	}
	if (a.weir != b.weir)
		return fail(EXDEV);
	if (a.weir) {
		if (flags & ~(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH))
			return fail(EINVAL);
		int second = 0;
		char other[PATH_MAX];
		WEIR_CALL(weir_link(f, a.w, b.w, (flags & AT_SYMLINK_FOLLOW) != 0, &second),
			  second ? linkat(AT_FDCWD, host_path(a.w, other), AT_FDCWD, ext, flags)
				 : linkat(AT_FDCWD, ext, AT_FDCWD, host_path(b.w, other), flags));
	}
	return fail(EXDEV); /* (not reached) */
}
int link(const char *oldpath, const char *newpath) { return linkat(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0); }

int symlinkat(const char *target, int dirfd, const char *path)
{
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_symlinkat();
		int rc = real_symlinkat(target, r.kdir, r.kpath);
		if (rc == 0 || !RELINKED(r, 0))
			return rc;
	}
	const char *volatile vt = target;
	if (!vt)
		return fail(EFAULT);
	WEIR_CALL(weir_symlink(f, target, r.w), symlinkat(target, AT_FDCWD, ext));
}
int symlink(const char *target, const char *path) { return symlinkat(target, AT_FDCWD, path); }

ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t n)
{
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_readlinkat();
		ssize_t rc = real_readlinkat(r.kdir, r.kpath, buf, n);
		if (rc >= 0 || !RELINKED(r, 0))
			return rc;
	}
	if (n == 0)
		return fail(EINVAL); /* (as Linux's readlinkat) */
	FS_OR_FAIL(f);
	int e = weir_readlink(f, r.w, buf, n);
	if (e == -(int)WEIR_ERR_FOLLOW)
		AGAIN(readlinkat(AT_FDCWD, ext, buf, n));
	return e < 0 ? fail(-e) : e;
}
ssize_t readlink(const char *path, char *buf, size_t n) { return readlinkat(AT_FDCWD, path, buf, n); }
ssize_t __readlink_chk(const char *path, char *buf, size_t n, size_t buflen)
{
	if (n > buflen)
		abort();
	return readlink(path, buf, n);
}

int fchmodat(int dirfd, const char *path, mode_t mode, int flags)
{
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_fchmodat();
		int rc = real_fchmodat(r.kdir, r.kpath, mode, flags);
		if (rc == 0 || !RELINKED(r, !(flags & AT_SYMLINK_NOFOLLOW)))
			return rc;
	}
	if (flags & ~AT_SYMLINK_NOFOLLOW)
		return fail(EINVAL);
	if (flags & AT_SYMLINK_NOFOLLOW) {
		struct stat st;
		int rc = wstat(r.w, &st, 1);
		if (rc == FOLLOWED)
			AGAIN(fchmodat(AT_FDCWD, ext, mode, flags));
		if (rc != 0)
			return rc;
		if (S_ISLNK(st.st_mode))
			return fail(EOPNOTSUPP); /* a link's mode cannot change */
	}
	WEIR_CALL(weir_chmod(f, r.w, mode & 07777), fchmodat(AT_FDCWD, ext, mode, flags));
}
int chmod(const char *path, mode_t mode) { return fchmodat(AT_FDCWD, path, mode, 0); }

int fchmod(int fd, mode_t mode)
{
	init_fchmod();
	FD_OR_KERNEL(fd, d, real_fchmod(fd, mode));
	int e = d->pg->kind == K_FILE ? weir_fchmod(wfs, d->handle, mode & 07777)
	      : d->pg->kind == K_DIR  ? weir_chmod(wfs, d->pg->path, mode & 07777)
				      : -EBADF;
	put(d);
	return e ? fail(-e) : 0;
}

static int64_t id_arg(unsigned v) { return v == (unsigned)-1 ? -1 : (int64_t)v; }

int fchownat(int dirfd, const char *path, uid_t uid, gid_t gid, int flags)
{
	const char *volatile vp = path;
	if (vp && !*vp && (flags & AT_EMPTY_PATH))
		return fchown(dirfd, uid, gid);
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_fchownat();
		int rc = real_fchownat(r.kdir, r.kpath, uid, gid, flags);
		if (rc == 0 || !RELINKED(r, !(flags & AT_SYMLINK_NOFOLLOW)))
			return rc;
	}
	WEIR_CALL(weir_chown(f, r.w, id_arg(uid), id_arg(gid), (flags & AT_SYMLINK_NOFOLLOW) != 0),
		  fchownat(AT_FDCWD, ext, uid, gid, flags));
}
int chown(const char *path, uid_t uid, gid_t gid) { return fchownat(AT_FDCWD, path, uid, gid, 0); }
int lchown(const char *path, uid_t uid, gid_t gid) { return fchownat(AT_FDCWD, path, uid, gid, AT_SYMLINK_NOFOLLOW); }

int fchown(int fd, uid_t uid, gid_t gid)
{
	init_fchown();
	FD_OR_KERNEL(fd, d, real_fchown(fd, uid, gid));
	int e = d->pg->kind == K_FILE ? weir_fchown(wfs, d->handle, id_arg(uid), id_arg(gid))
	      : d->pg->kind == K_DIR  ? weir_chown(wfs, d->pg->path, id_arg(uid), id_arg(gid), 0)
				      : -EBADF;
	put(d);
	return e ? fail(-e) : 0;
}

int faccessat(int dirfd, const char *path, int mode, int flags)
{
	ROUTE(dirfd, path, r);
	init_faccessat();
	/* (AT_EACCESS: the effective ids are the real ones here) */
	int nofollow = (flags & AT_SYMLINK_NOFOLLOW) != 0;
	KERNEL_OR_RELINK(r, !nofollow, real_faccessat(r.kdir, r.kpath, mode, flags), waccess(r.w, mode, nofollow),
			 faccessat(AT_FDCWD, ext, mode, flags));
}
int access(const char *path, int mode) { return faccessat(AT_FDCWD, path, mode, 0); }
int euidaccess(const char *path, int mode) { return faccessat(AT_FDCWD, path, mode, AT_EACCESS); }
int eaccess(const char *path, int mode) { return faccessat(AT_FDCWD, path, mode, AT_EACCESS); }

/* ns converts a utimensat time (UTIME_NOW, UTIME_OMIT) to weir's. */
static int64_t ns(const struct timespec *ts, int i)
{
	if (!ts || ts[i].tv_nsec == UTIME_NOW) {
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	}
	if (ts[i].tv_nsec == UTIME_OMIT)
		return WEIR_TIME_OMIT;
	return (int64_t)ts[i].tv_sec * 1000000000 + ts[i].tv_nsec;
}

static int bad_times(const struct timespec *ts)
{
	for (int i = 0; ts && i < 2; i++)
		if (ts[i].tv_nsec != UTIME_NOW && ts[i].tv_nsec != UTIME_OMIT && (ts[i].tv_nsec < 0 || ts[i].tv_nsec >= 1000000000))
			return 1;
	return 0;
}

int futimens(int fd, const struct timespec times[2])
{
	init_futimens();
	FD_OR_KERNEL(fd, d, real_futimens(fd, times));
	int e = bad_times(times)	   ? -EINVAL
	      : d->pg->kind == K_FILE ? weir_futimens(wfs, d->handle, ns(times, 0), ns(times, 1))
				      : weir_utimens(wfs, d->pg->path, ns(times, 0), ns(times, 1), 0);
	put(d);
	return e ? fail(-e) : 0;
}

int utimensat(int dirfd, const char *path, const struct timespec times[2], int flags)
{
	const char *volatile vp = path;
	if (!vp && is_weir(dirfd))
		return futimens(dirfd, times); /* Linux's futimens form */
	ROUTE(dirfd, path, r);
	if (!r.weir) {
		init_utimensat();
		int rc = real_utimensat(r.kdir, r.kpath, times, flags);
		if (rc == 0 || !RELINKED(r, !(flags & AT_SYMLINK_NOFOLLOW)))
			return rc;
	}
	if (bad_times(times))
		return fail(EINVAL);
	WEIR_CALL(weir_utimens(f, r.w, ns(times, 0), ns(times, 1), (flags & AT_SYMLINK_NOFOLLOW) != 0),
		  utimensat(AT_FDCWD, ext, times, flags));
}

int utimes(const char *path, const struct timeval tv[2])
{
	if (!tv)
		return utimensat(AT_FDCWD, path, NULL, 0);
	if (tv[0].tv_usec < 0 || tv[0].tv_usec >= 1000000 || tv[1].tv_usec < 0 || tv[1].tv_usec >= 1000000)
		return fail(EINVAL);
	struct timespec ts[2] = {{tv[0].tv_sec, tv[0].tv_usec * 1000}, {tv[1].tv_sec, tv[1].tv_usec * 1000}};
	return utimensat(AT_FDCWD, path, ts, 0);
}

struct wutimbuf {
	time_t actime, modtime;
};
int utime(const char *path, const void *buf)
{
	const struct wutimbuf *u = buf;
	if (!u)
		return utimensat(AT_FDCWD, path, NULL, 0);
	struct timespec ts[2] = {{u->actime, 0}, {u->modtime, 0}};
	return utimensat(AT_FDCWD, path, ts, 0);
}

/* The cwd. Inside the mount it is kept here (wcwd), and in the memfd
 * behind cwd_fd, a descriptor without FD_CLOEXEC, which a new image after
 * exec finds (shim_init); the kernel's cwd moves to /proc, where a
 * program the shim does not serve can create nothing. */
static void set_wcwd(const char *w)
{
	if (vforked())
		return; /* (the parent's memory: see tab_pid) */
	pthread_mutex_lock(&cwd_mu);
	snprintf(wcwd, sizeof wcwd, "%s", w);
	wcwd_on = 1;
	/* A new page every time: the one behind cwd_fd may be shared with
	 * the processes this one forked, or that forked it, and a cwd is not
	 * shared (each has its own after fork). The new page takes cwd_fd's
	 * number, where an exec'd image looks for it. */
	struct wpage *p;
	ino_t key;
	int fd = new_page("weir-cwd", 0, &p, &key);
	if (fd >= 0) {
		p->kind = K_DIR;
		snprintf(p->path, sizeof p->path, "%s", w);
		munmap(p, PAGE_BYTES);
		init_fcntl();
		init_close();
		init_dup2();
		int to = cwd_fd >= 0 ? real_dup2(fd, cwd_fd) : real_fcntl(fd, F_DUPFD, 900); /* (kept high, out of the program's way) */
		if (to >= 0 && to < MAX_FDS) {
			real_close(fd);
			cwd_fd = to;
		} else {
			if (to >= 0)
				real_close(to);
			if (cwd_fd >= 0)
				real_close(cwd_fd); /* (the old page would name another cwd) */
			cwd_fd = fd;
		}
	} else if (cwd_fd >= 0 && (p = map_page(cwd_fd, &key)) != NULL) {
		snprintf(p->path, sizeof p->path, "%s", w); /* (no new page: the old one, as good as it gets) */
		munmap(p, PAGE_BYTES);
	}
	pthread_mutex_unlock(&cwd_mu);
}

static void clear_wcwd(void)
{
	if (vforked())
		return;
	pthread_mutex_lock(&cwd_mu);
	wcwd_on = 0;
	if (cwd_fd >= 0) {
		init_close();
		real_close(cwd_fd);
		cwd_fd = -1;
	}
	pthread_mutex_unlock(&cwd_mu);
}

static int wchdir(const char *path)
{
	FS_OR_FAIL(f);
	struct weir_attr a;
	char w[WEIR_MAX_PATH + 1];
	int e = weir_resolve(f, path, w, &a); /* (the cwd names no link: getcwd is physical) */
	if (e == -(int)WEIR_ERR_FOLLOW)
		return FOLLOWED;
	if (!e && !S_ISDIR(a.mode))
		e = -ENOTDIR;
	if (!e)
		e = -may(&a, X_OK);
	if (e)
		return fail(-e);
	init_chdir();
	real_chdir("/proc");
	set_wcwd(w);
	return 0;
}

int chdir(const char *path)
{
	ROUTE(AT_FDCWD, path, r);
	if (!r.weir) {
		init_chdir();
		int rc = real_chdir(r.kpath);
		if (rc == 0)
			clear_wcwd();
		if (rc == 0 || !RELINKED(r, 1))
			return rc;
	}
	int rc = wchdir(r.w);
	if (rc == FOLLOWED)
		AGAIN(chdir(ext));
	return rc;
}

int fchdir(int fd)
{
	init_fchdir();
	int e = 0;
	struct desc *d = get(fd, &e);
	if (!d) {
		if (e)
			return fail(e);
		int rc = real_fchdir(fd);
		if (rc == 0)
			clear_wcwd();
		return rc;
	}
	char w[PATH_MAX];
	snprintf(w, sizeof w, "%s", d->pg->path);
	int k = d->pg->kind;
	put(d);
	if (k == K_FILE)
		return fail(ENOTDIR);
	int rc = wchdir(w);
	return rc == FOLLOWED ? fail(ENOENT) : rc; /* (a directory's page names a path with no link) */
}

/* weir_abs writes the absolute path of the weir path w into out. */
static int weir_abs(const char *w, char *out, size_t cap)
{
	size_t ml;
	const char *m = mount_point(&ml);
	int n;
	if (strcmp(w, ".") == 0)
		n = snprintf(out, cap, "%.*s", (int)ml, m);
	else
		n = snprintf(out, cap, "%.*s/%s", ml == 1 ? 0 : (int)ml, m, w);
	return n >= 0 && (size_t)n < cap;
}

char *getcwd(char *buf, size_t size)
{
	char w[PATH_MAX], abs[PATH_MAX];
	if (!copy_cwd(w, sizeof w)) {
		init_getcwd();
		return real_getcwd(buf, size);
	}
	if (!weir_abs(w, abs, sizeof abs)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	size_t n = strlen(abs) + 1;
	if (!buf) {
		buf = malloc(size > n ? size : n);
		if (!buf) {
			errno = ENOMEM;
			return NULL;
		}
		size = size > n ? size : n;
	}
	if (size == 0) {
		errno = EINVAL;
		return NULL;
	}
	if (size < n) {
		errno = ERANGE;
		return NULL;
	}
	memcpy(buf, abs, n);
	return buf;
}

char *__getcwd_chk(char *buf, size_t size, size_t buflen)
{
	if (size > buflen)
		abort();
	return getcwd(buf, size);
}

char *get_current_dir_name(void)
{
	char w[PATH_MAX];
	if (!copy_cwd(w, sizeof w)) {
		init_get_current_dir_name();
		return real_get_current_dir_name();
	}
	return getcwd(NULL, 0);
}

char *realpath(const char *path, char *resolved)
{
	const char *volatile vp = path;
	if (!vp) {
		errno = EINVAL;
		return NULL;
	}
	struct route r;
	int e = route(AT_FDCWD, path, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	if (!r.weir) {
		init_realpath();
		char *k = real_realpath(r.kpath, resolved);
		if (k || !RELINKED(r, 1))
			return k;
	}
	FS_OR_FAIL_NULL(f);
	struct weir_attr a;
	char w[WEIR_MAX_PATH + 1];
	e = weir_resolve(f, r.w, w, &a);
	if (e == -(int)WEIR_ERR_FOLLOW)
		AGAIN_OR(NULL, realpath(ext, resolved));
	if (e) {
		errno = -e;
		return NULL;
	}
	char abs[PATH_MAX];
	if (!weir_abs(w, abs, sizeof abs)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	if (!resolved)
		return strdup(abs);
	return strcpy(resolved, abs);
}

char *canonicalize_file_name(const char *path) { return realpath(path, NULL); }
char *__realpath_chk(const char *path, char *resolved, size_t n)
{
	if (resolved && n < PATH_MAX)
		abort();
	return realpath(path, resolved);
}

/* dup_to makes newfd (a real descriptor the kernel just made a copy of
 * oldfd's) share oldfd's weir description, if it has one. */
static int dup_to(int oldfd, int newfd)
{
	if (newfd < 0)
		return newfd;
	int e = 0;
	struct desc *d = get(oldfd, &e);
	if (newfd >= MAX_FDS) {
		if (d) {
			put(d);
			init_close();
			real_close(newfd);
			return fail(EMFILE);
		}
		return newfd;
	}
	install(newfd, d); /* (NULL: newfd is the kernel's now) */
	if (d)
		put(d);
	return newfd;
}

int dup(int fd)
{
	if (own(fd))
		return fail(EBADF);
	init_dup();
	return dup_to(fd, real_dup(fd));
}

/* before_replace runs before the kernel makes newfd name another file:
 * the standard stream over it writes out what it holds while its
 * descriptor is still the old file, and the process's POSIX locks of the
 * file go as a close of it would drop them. */
static void before_replace(int newfd)
{
	if (newfd >= 0 && newfd <= 2 && !vforked())
		fflush(newfd == 0 ? stdin : newfd == 1 ? stdout : stderr);
	posix_unlock_all(newfd);
}

int dup2(int oldfd, int newfd)
{
	if (own(oldfd))
		return fail(EBADF);
	if (own(newfd))
		return fail(EBUSY); /* the shim's own descriptor sits there */
	init_dup2();
	if (oldfd == newfd)
		return real_dup2(oldfd, newfd);
	before_replace(newfd);
	return dup_to(oldfd, real_dup2(oldfd, newfd));
}

int dup3(int oldfd, int newfd, int flags)
{
	if (own(oldfd))
		return fail(EBADF);
	if (own(newfd))
		return fail(EBUSY);
	init_dup3();
	if (oldfd != newfd)
		before_replace(newfd);
	return dup_to(oldfd, real_dup3(oldfd, newfd, flags));
}

/* The status flags F_SETFL may change (O_DIRECT and O_NOATIME are kept
 * as given: weir has no atime updates to skip, and its IO is its own). */
#define SETFL_MASK (O_APPEND | O_NONBLOCK | O_ASYNC | O_DIRECT | O_NOATIME)

/* Advisory locks are the metadata service's (OpLock): POSIX record locks
 * are this process's session's, OFD and flock locks the description's
 * (shared across fork and exec). Waiting (F_SETLKW, flock without
 * LOCK_NB, lockf F_LOCK) retries every few milliseconds; a signal ends
 * the wait with EINTR only where it interrupts the sleep (as a handler
 * without SA_RESTART would). There is no deadlock detection. */

static int lock_wait(struct desc *d, uint8_t type, uint8_t cls, uint64_t start, uint64_t end, int wait)
{
	struct timespec nap = {0, 1000000};
	for (;;) {
		int e = weir_lock(wfs, d->handle, 0, type, cls, start, end, NULL);
		if (e != -EAGAIN || !wait)
			return e;
		if (nanosleep(&nap, NULL) != 0 && errno == EINTR)
			return -EINTR;
		if (nap.tv_nsec < 32000000)
			nap.tv_nsec *= 2;
	}
}

/* record_lock serves the fcntl lock commands on a weir file. */
static int record_lock(struct desc *d, int cmd, struct flock *fl)
{
	if (!fl)
		return -EFAULT;
	if (d->pg->kind != K_FILE)
		return d->pg->kind == K_PATH ? -EBADF : -EINVAL;
	int ofd = cmd == F_OFD_GETLK || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW;
	if (ofd && fl->l_pid != 0)
		return -EINVAL;
	uint8_t type;
	switch (fl->l_type) {
	case F_RDLCK:
		type = WEIR_LOCK_READ;
		break;
	case F_WRLCK:
		type = WEIR_LOCK_WRITE;
		break;
	case F_UNLCK:
		if (cmd == F_GETLK || cmd == F_OFD_GETLK)
			return -EINVAL;
		type = WEIR_LOCK_UNLOCK;
		break;
	default:
		return -EINVAL;
	}
	int64_t base = 0;
	switch (fl->l_whence) {
	case SEEK_SET:
		break;
	case SEEK_CUR:
		lock_pg(d->pg);
		base = (int64_t)d->pg->off;
		unlock_pg(d->pg);
		break;
	case SEEK_END: {
		struct weir_attr a;
		int e = weir_fstat(wfs, d->handle, &a);
		if (e)
			return e;
		base = a.size;
		break;
	}
	default:
		return -EINVAL;
	}
	int64_t start, end;
	if (__builtin_add_overflow(base, (int64_t)fl->l_start, &start))
		return -EOVERFLOW;
	if (fl->l_len > 0) {
		if (__builtin_add_overflow(start, (int64_t)fl->l_len, &end))
			return -EOVERFLOW;
	} else if (fl->l_len == 0) {
		end = -1; /* to the end of the file */
	} else {
		end = start;
		start += (int64_t)fl->l_len;
	}
	if (start < 0)
		return -EINVAL;
	uint64_t uend = end == -1 ? UINT64_MAX : (uint64_t)end;
	uint8_t cls = ofd ? WEIR_LOCK_OFD : WEIR_LOCK_POSIX;
	if (cmd == F_GETLK || cmd == F_OFD_GETLK) {
		struct weir_lock_info h;
		int e = weir_lock(wfs, d->handle, 1, type, cls, (uint64_t)start, uend, &h);
		if (e)
			return e;
		if (h.type == WEIR_LOCK_UNLOCK) {
			fl->l_type = F_UNLCK;
			return 0;
		}
		fl->l_type = h.type == WEIR_LOCK_WRITE ? F_WRLCK : F_RDLCK;
		fl->l_whence = SEEK_SET;
		fl->l_start = (off_t)h.start;
		fl->l_len = h.end == UINT64_MAX ? 0 : (off_t)(h.end - h.start);
		fl->l_pid = h.pid;
		return 0;
	}
	if (type != WEIR_LOCK_UNLOCK && !ofd)
		any_posix_lock = 1;
	int e = lock_wait(d, type, cls, (uint64_t)start, uend, cmd == F_SETLKW || cmd == F_OFD_SETLKW);
	return e == -EAGAIN ? -EAGAIN : e; /* (Linux: EAGAIN or EACCES; EAGAIN here) */
}

int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	init_fcntl();
	if (own(fd))
		return fail(EBADF);
	FD_OR_KERNEL(fd, d, real_fcntl(fd, cmd, arg));
	int r;
	switch (cmd) {
	case F_DUPFD:
	case F_DUPFD_CLOEXEC:
		r = dup_to(fd, real_fcntl(fd, cmd, arg));
		break;
	case F_GETFL:
		lock_pg(d->pg);
		r = d->pg->flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC | O_CLOEXEC | O_DIRECTORY | O_NOFOLLOW);
		unlock_pg(d->pg);
		break;
	case F_SETFL:
		if (d->pg->kind == K_PATH) {
			r = fail(EBADF);
			break;
		}
		lock_pg(d->pg);
		d->pg->flags = (d->pg->flags & ~SETFL_MASK) | ((int)arg & SETFL_MASK);
		unlock_pg(d->pg);
		r = 0;
		break;
	case F_GETFD:
	case F_SETFD:
		r = real_fcntl(fd, cmd, arg); /* the descriptor's own flag */
		break;
	case F_GETLK:
	case F_SETLK:
	case F_SETLKW:
	case F_OFD_GETLK:
	case F_OFD_SETLK:
	case F_OFD_SETLKW: {
		int e = record_lock(d, cmd, (struct flock *)arg);
		r = e ? fail(-e) : 0;
		break;
	}
	default:
		r = fail(EINVAL);
	}
	put(d);
	return r;
}
int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	return fcntl(fd, cmd, arg);
}

int flock(int fd, int op)
{
	init_flock();
	FD_OR_KERNEL(fd, d, real_flock(fd, op));
	int e;
	int how = op & ~LOCK_NB;
	if (d->pg->kind != K_FILE)
		e = d->pg->kind == K_PATH ? -EBADF : -ENOLCK; /* (a directory's: not yet) */
	else if (how != LOCK_SH && how != LOCK_EX && how != LOCK_UN)
		e = -EINVAL;
	else
		e = lock_wait(d, how == LOCK_SH ? WEIR_LOCK_READ : how == LOCK_EX ? WEIR_LOCK_WRITE : WEIR_LOCK_UNLOCK,
			      WEIR_LOCK_FLOCK, 0, UINT64_MAX, !(op & LOCK_NB));
	put(d);
	return e ? fail(-e == EAGAIN ? EWOULDBLOCK : -e) : 0;
}

/* lockf: POSIX locks from the offset on (glibc's calls its internal
 * fcntl, which the shim would not see). */
int lockf(int fd, int cmd, off_t len)
{
	struct flock fl = {.l_whence = SEEK_CUR, .l_start = 0, .l_len = len};
	switch (cmd) {
	case F_TEST:
		fl.l_type = F_RDLCK;
		if (fcntl(fd, F_GETLK, &fl) != 0)
			return -1;
		if (fl.l_type == F_UNLCK || fl.l_pid == getpid())
			return 0;
		return fail(EACCES);
	case F_ULOCK:
		fl.l_type = F_UNLCK;
		return fcntl(fd, F_SETLK, &fl);
	case F_LOCK:
		fl.l_type = F_WRLCK;
		return fcntl(fd, F_SETLKW, &fl);
	case F_TLOCK:
		fl.l_type = F_WRLCK;
		return fcntl(fd, F_SETLK, &fl);
	}
	return fail(EINVAL);
}
int lockf64(int fd, int cmd, off64_t len) { return lockf(fd, cmd, (off_t)len); }

/* MAP_SHARED mappings of weir files: the pages of io's cache region (its
 * data memfd) mapped in place (weir_map), which io keeps resident while
 * they are mapped (its pins), so that loads see every write to the file
 * at once, as with the kernel's page cache. With PROT_WRITE (a descriptor
 * open for writing) the data memfd is mapped read-write: stores are in
 * io's cache at once, seen by every read and every other mapping, and io
 * makes the pages dirty (so that write-back and fsync take them) at
 * msync, before an fsync or fdatasync of the file in this process, at
 * munmap, and at the session's end (a process that dies): as the kernel,
 * a store reaches the device without msync, by the next write-back. A
 * mapping holds a handle of its own (the description's, through its
 * ticket), so that it outlives the descriptor's close, as a kernel mapping
 * does, and a forked child pins them again in its own session. munmap
 * ends them. Not built: PROT_EXEC; mprotect(PROT_WRITE) of a mapping made
 * without it (EACCES: the pages are mapped from a read-only description);
 * mremap of one keeps its pins until the process ends. */
struct wmap {
	uint8_t *base;
	size_t len, left; /* bytes mapped; bytes not yet unmapped */
	uint64_t handle, off;
	uint64_t ino; /* writable ones: the file's (fsync syncs them first) */
	int flags;    /* the description's open flags */
	int write;    /* mapped read-write (a writable pin) */
	uint8_t ticket[WEIR_TICKET_SIZE];
	uint64_t *live; /* bit per page: still mapped (a munmap of part clears its bits) */
};

static int live_get(const struct wmap *m, size_t i) { return (m->live[i / 64] >> (i % 64)) & 1; }
static pthread_mutex_t wmap_mu = PTHREAD_MUTEX_INITIALIZER;
static struct wmap *wmaps;
static size_t nwmaps, capwmaps; /* (nwmaps read without the lock: munmap's fast path) */

static void *shared_map(struct desc *d, void *addr, size_t len, int prot, int flags, off_t off, int *err)
{
	int w = (prot & PROT_WRITE) != 0;
	if (w && !writable(d->pg->flags)) {
		*err = EACCES; /* as Linux: a shared writable mapping needs a descriptor open for writing */
		return NULL;
	}
	if (prot & ~(PROT_READ | PROT_WRITE)) {
		*err = ENODEV; /* PROT_EXEC of a weir file */
		return NULL;
	}
	size_t plen = (len + 4095) & ~(size_t)4095;
	if (plen < len) {
		*err = ENOMEM;
		return NULL;
	}
	uint64_t h = 0;
	int e = weir_inherit(wfs, d->pg->ticket, d->pg->flags, &h);
	uint8_t *base = MAP_FAILED;
	if (!e) {
		base = real_mmap(addr, plen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)), -1, 0);
		e = base == MAP_FAILED ? -errno : 0;
	}
	struct weir_attr at = {0};
	if (!e && w)
		e = weir_fstat(wfs, h, &at);
	if (!e)
		e = weir_map(wfs, h, base, plen, (uint64_t)off, w);
	if (!e && prot == PROT_NONE && mprotect(base, plen, PROT_NONE) != 0) {
		e = -errno;
		weir_unmap_pins(wfs, h, plen, (uint64_t)off, w);
	}
	if (!e) {
		pthread_mutex_lock(&wmap_mu);
		if (nwmaps == capwmaps) {
			size_t cap = capwmaps ? capwmaps * 2 : 16;
			struct wmap *n = realloc(wmaps, cap * sizeof *n);
			if (n) {
				wmaps = n;
				capwmaps = cap;
			}
		}
		size_t pages = plen / 4096;
		uint64_t *live = nwmaps < capwmaps ? malloc((pages + 63) / 64 * 8) : NULL;
		if (live) {
			memset(live, 0xff, (pages + 63) / 64 * 8);
			struct wmap *m = &wmaps[nwmaps];
			*m = (struct wmap){.base = base, .len = plen, .left = plen, .handle = h, .off = (uint64_t)off, .ino = at.ino,
					   .flags = d->pg->flags, .write = w, .live = live};
			if (w)
				__atomic_add_fetch(&nwritable, 1, __ATOMIC_RELEASE);
			memcpy(m->ticket, d->pg->ticket, WEIR_TICKET_SIZE);
			__atomic_store_n(&nwmaps, nwmaps + 1, __ATOMIC_RELEASE);
		} else {
			e = -ENOMEM;
			weir_unmap_pins(wfs, h, plen, (uint64_t)off, w);
		}
		pthread_mutex_unlock(&wmap_mu);
	}
	if (e) {
		if (base != MAP_FAILED && !(flags & MAP_FIXED)) {
			init_munmap(); /* (the process's first munmap may be this one) */
			real_munmap(base, plen);
		}
		if (h)
			weir_close(wfs, h);
		*err = e == -EOPNOTSUPP ? ENODEV : -e;
		return NULL;
	}
	return base;
}

int munmap(void *addr, size_t len)
{
	init_munmap();
	if (__atomic_load_n(&nwmaps, __ATOMIC_ACQUIRE) == 0)
		return real_munmap(addr, len);
	int rc = real_munmap(addr, len);
	if (rc != 0)
		return rc;
	uint8_t *lo = addr, *hi = lo + ((len + 4095) & ~(size_t)4095);
	pthread_mutex_lock(&wmap_mu);
	for (size_t i = 0; i < nwmaps;) {
		struct wmap *m = &wmaps[i];
		uint8_t *a = m->base > lo ? m->base : lo, *b = m->base + m->len < hi ? m->base + m->len : hi;
		if (a < b) {
			/* Only pages still ours count: a second munmap of them, or of
			 * another mapping made in their place, is not this one's. */
			for (size_t pg = (size_t)(a - m->base) / 4096; pg < (size_t)(b - m->base) / 4096; pg++)
				if (live_get(m, pg)) {
					m->live[pg / 64] &= ~((uint64_t)1 << (pg % 64));
					m->left -= 4096;
				}
			if (m->left == 0) {
				if (wfs && !vforked()) {
					weir_unmap_pins(wfs, m->handle, m->len, m->off, m->write);
					weir_close(wfs, m->handle);
				}
				if (m->write)
					__atomic_sub_fetch(&nwritable, 1, __ATOMIC_RELEASE);
				free(m->live);
				*m = wmaps[nwmaps - 1];
				__atomic_store_n(&nwmaps, nwmaps - 1, __ATOMIC_RELEASE);
				continue;
			}
		}
		i++;
	}
	pthread_mutex_unlock(&wmap_mu);
	return 0;
}

/* sync_maps makes io take what this process stored through its writable
 * mappings that overlap [lo, hi) (all of them: lo = hi = NULL), or those
 * of the file ino (non-zero): their pages become dirty (WEIR_OP_MAP_SYNC).
 * With handles non-NULL, the first such mapping's handle is stored there
 * (msync's fsync goes through it). */
static int sync_maps(uint8_t *lo, uint8_t *hi, uint64_t ino, uint64_t **handles, size_t *nhandles, size_t *maxh)
{
	int e = 0;
	pthread_mutex_lock(&wmap_mu);
	for (size_t i = 0; i < nwmaps; i++) {
		struct wmap *m = &wmaps[i];
		if (!m->write || (ino && m->ino != ino))
			continue;
		uint8_t *a = m->base, *b = m->base + m->len;
		if (lo || hi) {
			a = a > lo ? a : lo;
			b = b < hi ? b : hi;
			if (a >= b)
				continue;
		}
		size_t p0 = (size_t)(a - m->base) / 4096, p1 = ((size_t)(b - m->base) + 4095) / 4096;
		int r = weir_map_sync(wfs, m->handle, (p1 - p0) * 4096, m->off + p0 * 4096);
		if (r && !e)
			e = r;
		/* The files touched, one handle each (msync with MS_SYNC syncs
		 * every one of them, as Linux's does). */
		if (handles) {
			size_t k = 0;
			while (k < *nhandles && (*handles)[k] != m->ino)
				k += 2;
			if (k >= *nhandles) {
				if (*nhandles + 2 > *maxh) {
					size_t cap = *maxh ? *maxh * 2 : 16;
					uint64_t *n = realloc(*handles, cap * sizeof *n);
					if (!n) {
						if (!e)
							e = -ENOMEM;
						continue;
					}
					*handles = n;
					*maxh = cap;
				}
				(*handles)[*nhandles] = m->ino;
				(*handles)[*nhandles + 1] = m->handle;
				*nhandles += 2;
			}
		}
	}
	pthread_mutex_unlock(&wmap_mu);
	return e;
}

/* msync of a writable weir mapping: its pages become dirty in io; with
 * MS_SYNC the file is synced too (weir_fsync: durable when it returns).
 * MS_ASYNC: the next write-back takes them. The kernel's own msync runs
 * first (its errors: EINVAL, ENOMEM for a range not mapped). */
int msync(void *addr, size_t len, int flags)
{
	init_msync();
	int rc = real_msync(addr, len, flags);
	if (rc != 0 || __atomic_load_n(&nwritable, __ATOMIC_ACQUIRE) == 0 || !wfs || vforked())
		return rc;
	uint8_t *lo = addr, *hi = lo + len;
	uint64_t *hs = NULL; /* (ino, handle) of each file the range maps */
	size_t nh = 0, cap = 0;
	int e = sync_maps(lo, hi, 0, &hs, &nh, &cap);
	for (size_t i = 0; !e && i < nh && (flags & MS_SYNC); i += 2)
		e = weir_fsync(wfs, hs[i + 1]);
	free(hs);
	return e ? fail(-e) : 0;
}

/* repin_after_fork gives a forked child's inherited mappings pins of its
 * own session (its parent's end with its parent). */
static void repin_after_fork(void)
{
	if (__atomic_load_n(&nwmaps, __ATOMIC_ACQUIRE) == 0)
		return;
	int err = 0;
	weir_fs *f = fs(&err);
	pthread_mutex_lock(&wmap_mu);
	for (size_t i = 0; i < nwmaps; i++) {
		struct wmap *m = &wmaps[i];
		uint64_t h = 0;
		int e = f ? weir_inherit(f, m->ticket, m->flags, &h) : -err;
		/* Pinned whole (the pins are the range's), mapped again only
		 * where the parent's mapping still is. */
		if (!e)
			e = weir_map_pins(f, h, m->len, m->off, m->write);
		for (size_t pg = 0; !e && pg < m->len / 4096;) {
			size_t run = 0;
			while (pg + run < m->len / 4096 && live_get(m, pg + run))
				run++;
			if (run)
				e = weir_map_at(f, h, m->base + pg * 4096, run * 4096, m->off + pg * 4096, m->write);
			pg += run ? run : 1;
		}
		if (!e) {
			m->handle = h;
			continue;
		}
		if (h)
			weir_close(f, h);
		/* Its pages stay mapped, held only by the parent's pins: say so. */
		char msg[160];
		int n = snprintf(msg, sizeof msg, "weir: a forked child could not pin its MAP_SHARED mapping of a weir file again (%s): "
						  "it may read zeros once its parent unmaps it\n", strerror(-e));
		init_write();
		if (n > 0)
			real_write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
	}
	pthread_mutex_unlock(&wmap_mu);
}

/* mmap of a weir file. MAP_PRIVATE is a private copy of the file's bytes
 * made at the call (anonymous memory, read in with pread): POSIX leaves
 * unspecified whether such a mapping sees the file's later changes, and
 * this one does not, where Linux's shows them in pages not yet written.
 * Bytes past the end of the file read as zeros (Linux: SIGBUS past the
 * last page). MAP_SHARED: shared_map, above. */
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	init_mmap();
	if ((flags & MAP_ANONYMOUS) || !is_weir(fd))
		return real_mmap(addr, len, prot, flags, fd, off);
	int e = 0;
	struct desc *d = get(fd, &e);
	if (!d) {
		errno = e ? e : EBADF;
		return MAP_FAILED;
	}
	int type = flags & MAP_TYPE;
	if ((type != MAP_PRIVATE && type != MAP_SHARED && type != MAP_SHARED_VALIDATE) || d->pg->kind != K_FILE)
		e = d->pg->kind != K_FILE ? (d->pg->kind == K_DIR ? ENODEV : EBADF) : EINVAL;
	else if (!readable(d->pg->flags))
		e = EACCES;
	else if (len == 0 || off < 0 || off % 4096)
		e = EINVAL;
	if (!e && type != MAP_PRIVATE) {
		void *p = shared_map(d, addr, len, prot, flags, off, &e);
		put(d);
		if (!p)
			errno = e;
		return p ? p : MAP_FAILED;
	}
	void *p = MAP_FAILED;
	if (!e) {
		p = real_mmap(addr, len, prot | PROT_READ | PROT_WRITE, (flags & ~MAP_TYPE) | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			e = errno;
	}
	if (!e) {
		size_t done = 0;
		while (done < len) {
			size_t want = len - done < (1u << 20) ? len - done : (1u << 20);
			ssize_t r = cached_read(d, (char *)p + done, want, (uint64_t)off + done);
			if (r == -EAGAIN)
				r = weir_pread(wfs, d->handle, (char *)p + done, want, (uint64_t)off + done, 0);
			if (r < 0) {
				e = (int)-r;
				break;
			}
			if (r == 0)
				break; /* the end of the file: zeros from here */
			done += (size_t)r;
		}
		if (!e && !(prot & PROT_WRITE) && mprotect(p, len, prot) != 0)
			e = errno;
		if (e)
			munmap(p, len);
	}
	put(d);
	if (e) {
		errno = e;
		return MAP_FAILED;
	}
	return p;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off) { return mmap(addr, len, prot, flags, fd, (off_t)off); }

/* Directory listings: a weir directory's entries, "." and ".." first,
 * read whole at the start (as getdents of a directory that changes may
 * give); a weir directory stream (opendir, fdopendir) is one over a weir
 * directory descriptor, told from glibc's by its magic word. */
struct listing {
	int err;
	size_t n, cap;
	struct dirent64 *ents;
};

static int list_add(void *arg, const char *name, uint64_t ino, uint32_t type)
{
	struct listing *l = arg;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct dirent64 *e = realloc(l->ents, cap * sizeof *e);
		if (!e) {
			l->err = ENOMEM;
			return 1;
		}
		l->ents = e;
		l->cap = cap;
	}
	struct dirent64 *e = &l->ents[l->n++];
	memset(e, 0, sizeof *e);
	e->d_ino = ino;
	e->d_off = (off64_t)l->n;
	e->d_reclen = sizeof *e;
	e->d_type = S_ISDIR(type) ? DT_DIR : S_ISLNK(type) ? DT_LNK : DT_REG;
	snprintf(e->d_name, sizeof e->d_name, "%s", name);
	return 0;
}

/* list reads directory w whole; 0 or -errno. */
static int list(const char *w, struct dirent64 **ents, size_t *n)
{
	int err = 0;
	weir_fs *f = fs(&err);
	if (!f)
		return -(err ? err : EIO);
	struct listing l = {0};
	struct weir_attr a;
	int e = weir_stat(f, w, &a);
	list_add(&l, ".", a.ino, S_IFDIR);
	list_add(&l, "..", 0, S_IFDIR);
	if (!e)
		e = weir_readdir(f, w, list_add, &l);
	if (e == -(int)WEIR_ERR_FOLLOW)
		e = -ENOENT; /* (a directory's page names a path with no link: it changed) */
	if (!e && l.err)
		e = -l.err; /* never a listing with entries missing */
	if (e) {
		free(l.ents);
		return e;
	}
	*ents = l.ents;
	*n = l.n;
	return 0;
}

#define WDIR_MAGIC 0x52494457u /* "WDIR" */
struct wdir {
	uint32_t magic;
	int fd; /* its weir directory descriptor */
	size_t n, next;
	struct dirent64 *ents;
	struct dirent de; /* the last one readdir returned */
};

static struct wdir *as_wdir(DIR *d) { return d && ((struct wdir *)(void *)d)->magic == WDIR_MAGIC ? (struct wdir *)(void *)d : NULL; }

DIR *fdopendir(int fd)
{
	init_fdopendir();
	int e = 0;
	struct desc *d = get(fd, &e);
	if (!d) {
		if (e) {
			errno = e;
			return NULL;
		}
		return real_fdopendir(fd);
	}
	if (d->pg->kind != K_DIR) {
		int k = d->pg->kind;
		put(d);
		errno = k == K_PATH ? EBADF : ENOTDIR;
		return NULL;
	}
	struct wdir *w = calloc(1, sizeof *w);
	if (!w) {
		put(d);
		errno = ENOMEM;
		return NULL;
	}
	e = list(d->pg->path, &w->ents, &w->n);
	put(d);
	if (e) {
		free(w);
		errno = -e;
		return NULL;
	}
	w->magic = WDIR_MAGIC;
	w->fd = fd; /* the stream owns fd from here: closedir closes it */
	return (DIR *)(void *)w;
}

DIR *opendir(const char *path)
{
	struct route r;
	int e = route(AT_FDCWD, path, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	if (!r.weir) {
		init_opendir();
		DIR *k = real_opendir(r.kpath);
		if (k || !RELINKED(r, 1))
			return k;
	}
	int fd = wopen(r.w, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (fd == FOLLOWED)
		AGAIN_OR(NULL, opendir(ext));
	if (fd < 0)
		return NULL;
	DIR *d = fdopendir(fd);
	if (!d) {
		int se = errno;
		close(fd);
		errno = se;
	}
	return d;
}

struct dirent64 *readdir64(DIR *dir)
{
	struct wdir *d = as_wdir(dir);
	if (!d) {
		init_readdir64();
		return real_readdir64(dir);
	}
	return d->next < d->n ? &d->ents[d->next++] : NULL;
}

struct dirent *readdir(DIR *dir)
{
	struct wdir *d = as_wdir(dir);
	if (!d) {
		init_readdir();
		return real_readdir(dir);
	}
	if (d->next >= d->n)
		return NULL;
	struct dirent64 *e = &d->ents[d->next++];
	memset(&d->de, 0, sizeof d->de);
	d->de.d_ino = (ino_t)e->d_ino;
	d->de.d_off = (off_t)e->d_off;
	d->de.d_reclen = sizeof d->de;
	d->de.d_type = e->d_type;
	snprintf(d->de.d_name, sizeof d->de.d_name, "%s", e->d_name);
	return &d->de;
}

int closedir(DIR *dir)
{
	struct wdir *d = as_wdir(dir);
	if (!d) {
		init_closedir();
		return real_closedir(dir);
	}
	d->magic = 0;
	int fd = d->fd;
	free(d->ents);
	free(d);
	return close(fd);
}

/* scandir and glob: glibc's run on its own internal opendir and readdir,
 * which the shim cannot see, so on weir paths they are the shim's:
 * scandir reads a weir directory through the shim's streams (and the
 * kernel's through glibc's), and glob gets the shim's directory and stat
 * calls through GLOB_ALTDIRFUNC, which serve weir's paths and pass the
 * kernel's on (a weir cwd makes every relative pattern weir's). */
#define SCANDIR_BODY(DIRENT, READDIR)                                                         \
	DIR *dir = dirfd == AT_FDCWD ? opendir(path) : NULL;                                  \
	if (dirfd != AT_FDCWD) {                                                              \
		int fd = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);             \
		if (fd >= 0 && !(dir = fdopendir(fd)))                                        \
			close(fd);                                                            \
	}                                                                                     \
	if (!dir)                                                                             \
		return -1;                                                                    \
	struct DIRENT **list = NULL, *e;                                                      \
	size_t n = 0, cap = 0;                                                                \
	int err = 0;                                                                          \
	while ((e = READDIR(dir)) != NULL) {                                                  \
		if (filter && !filter(e))                                                     \
			continue;                                                             \
		if (n == cap) {                                                               \
			size_t nc = cap ? cap * 2 : 32;                                       \
			struct DIRENT **nl = realloc(list, nc * sizeof *nl);                  \
			if (!nl) {                                                            \
				err = ENOMEM;                                                 \
				break;                                                        \
			}                                                                     \
			list = nl;                                                            \
			cap = nc;                                                             \
		}                                                                             \
		if (!(list[n] = malloc(sizeof *e))) {                                         \
			err = ENOMEM;                                                         \
			break;                                                                \
		}                                                                             \
		memcpy(list[n++], e, sizeof *e);                                              \
	}                                                                                     \
	closedir(dir);                                                                        \
	if (err || n > INT_MAX) {                                                             \
		while (n > 0)                                                                 \
			free(list[--n]);                                                      \
		free(list);                                                                   \
		return fail(err ? err : EOVERFLOW);                                           \
	}                                                                                     \
	if (compar)                                                                           \
		qsort(list, n, sizeof *list, (int (*)(const void *, const void *))compar);    \
	*out = list;                                                                          \
	return (int)n

static int wscandirat(int dirfd, const char *path, struct dirent ***out, int (*filter)(const struct dirent *),
		      int (*compar)(const struct dirent **, const struct dirent **))
{
	SCANDIR_BODY(dirent, readdir);
}

static int wscandirat64(int dirfd, const char *path, struct dirent64 ***out, int (*filter)(const struct dirent64 *),
			int (*compar)(const struct dirent64 **, const struct dirent64 **))
{
	SCANDIR_BODY(dirent64, readdir64);
}

int scandirat(int dirfd, const char *path, struct dirent ***out, int (*filter)(const struct dirent *),
	      int (*compar)(const struct dirent **, const struct dirent **))
{
	ROUTE(dirfd, path, r);
	if (r.weir)
		return wscandirat(dirfd, path, out, filter, compar);
	init_scandirat();
	return real_scandirat(r.kdir, r.kpath, out, filter, compar);
}

int scandirat64(int dirfd, const char *path, struct dirent64 ***out, int (*filter)(const struct dirent64 *),
		int (*compar)(const struct dirent64 **, const struct dirent64 **))
{
	ROUTE(dirfd, path, r);
	if (r.weir)
		return wscandirat64(dirfd, path, out, filter, compar);
	init_scandirat64();
	return real_scandirat64(r.kdir, r.kpath, out, filter, compar);
}

int scandir(const char *path, struct dirent ***out, int (*filter)(const struct dirent *),
	    int (*compar)(const struct dirent **, const struct dirent **))
{
	return scandirat(AT_FDCWD, path, out, filter, compar);
}

int scandir64(const char *path, struct dirent64 ***out, int (*filter)(const struct dirent64 *),
	      int (*compar)(const struct dirent64 **, const struct dirent64 **))
{
	return scandirat64(AT_FDCWD, path, out, filter, compar);
}

/* glob_weir says whether a pattern can name weir's paths. */
static int glob_weir(const char *pattern)
{
	if (!pattern || pattern[0] != '/') {
		pthread_mutex_lock(&cwd_mu);
		int on = wcwd_on;
		pthread_mutex_unlock(&cwd_mu);
		return on;
	}
	size_t ml;
	const char *m = mount_point(&ml);
	return ml <= 1 || strncmp(pattern, m, ml) == 0 || has_dotdot(pattern);
}

static void *glob_opendir(const char *p) { return opendir(p); }
static void *glob_readdir(void *d) { return readdir(d); }
static void *glob_readdir64(void *d) { return readdir64(d); }
static void glob_closedir(void *d) { closedir(d); }

int glob(const char *pattern, int flags, int (*errfunc)(const char *, int), glob_t *g)
{
	init_glob();
	if (!(flags & GLOB_ALTDIRFUNC) && glob_weir(pattern)) {
		g->gl_opendir = glob_opendir;
		g->gl_readdir = (struct dirent * (*)(void *)) glob_readdir;
		g->gl_closedir = glob_closedir;
		g->gl_stat = (int (*)(const char *, struct stat *))stat;
		g->gl_lstat = (int (*)(const char *, struct stat *))lstat;
		flags |= GLOB_ALTDIRFUNC;
	}
	return real_glob(pattern, flags, errfunc, g);
}

int glob64(const char *pattern, int flags, int (*errfunc)(const char *, int), glob64_t *g)
{
	init_glob64();
	if (!(flags & GLOB_ALTDIRFUNC) && glob_weir(pattern)) {
		g->gl_opendir = glob_opendir;
		g->gl_readdir = (struct dirent64 * (*)(void *)) glob_readdir64;
		g->gl_closedir = glob_closedir;
		g->gl_stat = (int (*)(const char *, struct stat64 *))stat64;
		g->gl_lstat = (int (*)(const char *, struct stat64 *))lstat64;
		flags |= GLOB_ALTDIRFUNC;
	}
	return real_glob64(pattern, flags, errfunc, g);
}

/* nftw and ftw on weir paths: glibc's walk uses internal calls, so the
 * shim walks itself, with its own stat, lstat, opendir and readdir, in
 * glibc's order of calls: FTW_PHYS, FTW_DEPTH, FTW_CHDIR (the cwd is the
 * entry's directory while fn runs) and FTW_ACTIONRETVAL as glibc has
 * them; FTW_MOUNT changes nothing (weir is one file system). */
struct fwalk {
	int (*nfn)(const char *, const struct stat *, int, struct FTW *);
	int (*fn)(const char *, const struct stat *, int);
	int flags;
	char path[PATH_MAX];
	char pre[PATH_MAX]; /* with FTW_CHDIR and a relative path: the cwd it is relative to */
	char buf[2 * PATH_MAX];
	/* Directories walked, without FTW_PHYS: one reached again (through a
	 * link) is passed over, as glibc's walk does. */
	struct {
		dev_t dev;
		ino_t ino;
	} *seen;
	size_t nseen, capseen;
};

/* fwalk_at is the path of w->path the walk's own calls use: absolute
 * while FTW_CHDIR moves the cwd. */
static const char *fwalk_at(struct fwalk *w)
{
	if (!w->pre[0])
		return w->path;
	snprintf(w->buf, sizeof w->buf, "%s/%s", w->pre, w->path);
	return w->buf;
}

static int fwalk_call(struct fwalk *w, const struct stat *st, int type, int base, int level)
{
	if (w->flags & FTW_CHDIR) {
		char dir[PATH_MAX];
		const char *at = fwalk_at(w);
		int b = base + (int)(at != w->path ? strlen(w->pre) + 1 : 0); /* (the name's offset in at) */
		snprintf(dir, sizeof dir, "%.*s", b > 1 ? b - 1 : 1, at);
		if (b > 0 && chdir(dir) != 0)
			return -1;
	}
	if (w->nfn) {
		struct FTW f = {.base = base, .level = level};
		return w->nfn(w->path, st, type, &f);
	}
	return w->fn(w->path, st, type == FTW_SLN ? FTW_NS : type);
}

/* fwalk_entry walks w->path (len bytes, its name from base) at level. */
static int fwalk_entry(struct fwalk *w, size_t len, int base, int level)
{
	struct stat st;
	int phys = (w->flags & FTW_PHYS) != 0, type;
	if ((phys ? lstat(fwalk_at(w), &st) : stat(fwalk_at(w), &st)) != 0) {
		if (!phys && lstat(fwalk_at(w), &st) == 0 && S_ISLNK(st.st_mode))
			type = FTW_SLN;
		else if (errno == EACCES || errno == ENOENT || errno == ELOOP || errno == ENOTDIR)
			type = FTW_NS;
		else
			return -1;
	} else if (S_ISLNK(st.st_mode)) {
		type = FTW_SL;
	} else if (!S_ISDIR(st.st_mode)) {
		type = FTW_F;
	} else {
		if (!phys) {
			for (size_t i = 0; i < w->nseen; i++)
				if (w->seen[i].dev == st.st_dev && w->seen[i].ino == st.st_ino)
					return 0;
			if (w->nseen == w->capseen) {
				size_t cap = w->capseen ? w->capseen * 2 : 16;
				void *n = realloc(w->seen, cap * sizeof *w->seen);
				if (!n)
					return fail(ENOMEM);
				w->seen = n;
				w->capseen = cap;
			}
			w->seen[w->nseen].dev = st.st_dev;
			w->seen[w->nseen++].ino = st.st_ino;
		}
		DIR *d = opendir(fwalk_at(w));
		if (!d)
			return fwalk_call(w, &st, FTW_DNR, base, level);
		int rc = 0;
		if (!(w->flags & FTW_DEPTH)) {
			rc = fwalk_call(w, &st, FTW_D, base, level);
			if ((w->flags & FTW_ACTIONRETVAL) && rc == FTW_SKIP_SUBTREE) {
				closedir(d);
				return 0;
			}
			if (rc != 0) {
				closedir(d);
				return rc;
			}
		}
		struct dirent64 *e;
		while ((e = readdir64(d)) != NULL) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			size_t nl = strlen(e->d_name);
			if (len + 1 + nl >= sizeof w->path) {
				closedir(d);
				return fail(ENAMETOOLONG);
			}
			size_t at = len;
			if (len == 0 || w->path[len - 1] != '/')
				w->path[at++] = '/';
			memcpy(w->path + at, e->d_name, nl + 1);
			rc = fwalk_entry(w, at + nl, (int)at, level + 1);
			w->path[len] = 0;
			if ((w->flags & FTW_ACTIONRETVAL) && rc == FTW_SKIP_SIBLINGS) {
				rc = 0;
				break;
			}
			if (rc != 0) {
				closedir(d);
				return rc;
			}
		}
		closedir(d);
		return (w->flags & FTW_DEPTH) ? fwalk_call(w, &st, FTW_DP, base, level) : 0;
	}
	int rc = fwalk_call(w, &st, type, base, level);
	return ((w->flags & FTW_ACTIONRETVAL) && (rc == FTW_SKIP_SUBTREE || rc == FTW_SKIP_SIBLINGS)) ? 0 : rc;
}

static int fwalk(struct fwalk *w, const char *dir)
{
	size_t len = strlen(dir);
	if (len == 0)
		return fail(ENOENT);
	if (len >= sizeof w->path)
		return fail(ENAMETOOLONG);
	memcpy(w->path, dir, len + 1);
	int base = (int)len;
	while (base > 0 && w->path[base - 1] == '/')
		base--;
	while (base > 0 && w->path[base - 1] != '/')
		base--;
	char cwd[PATH_MAX];
	int back = (w->flags & FTW_CHDIR) && getcwd(cwd, sizeof cwd);
	if (back && dir[0] != '/')
		snprintf(w->pre, sizeof w->pre, "%s", cwd);
	int rc = fwalk_entry(w, len, base, 0);
	if (back) {
		int e = errno;
		if (chdir(cwd) != 0 && rc == 0)
			rc = -1;
		errno = e;
	}
	return rc;
}

int nftw(const char *dir, int (*fn)(const char *, const struct stat *, int, struct FTW *), int nopenfd, int flags)
{
	ROUTE(AT_FDCWD, dir, r);
	if (!r.weir) {
		init_nftw();
		return real_nftw(dir, fn, nopenfd, flags);
	}
	struct fwalk *w = calloc(1, sizeof *w);
	if (!w)
		return fail(ENOMEM);
	w->nfn = fn;
	w->flags = flags;
	int rc = fwalk(w, dir);
	free(w->seen);
	free(w);
	return rc;
}

int ftw(const char *dir, int (*fn)(const char *, const struct stat *, int), int nopenfd)
{
	ROUTE(AT_FDCWD, dir, r);
	if (!r.weir) {
		init_ftw();
		return real_ftw(dir, fn, nopenfd);
	}
	struct fwalk *w = calloc(1, sizeof *w);
	if (!w)
		return fail(ENOMEM);
	w->fn = fn;
	int rc = fwalk(w, dir);
	free(w->seen);
	free(w);
	return rc;
}

void rewinddir(DIR *dir)
{
	struct wdir *d = as_wdir(dir);
	if (!d) {
		init_rewinddir();
		real_rewinddir(dir);
		return;
	}
	int fd = d->fd;
	int e = 0;
	struct desc *ds = get(fd, &e);
	if (ds) {
		struct dirent64 *ents;
		size_t n;
		if (list(ds->pg->path, &ents, &n) == 0) {
			free(d->ents);
			d->ents = ents;
			d->n = n;
		}
		put(ds);
	}
	d->next = 0;
}

long telldir(DIR *dir)
{
	struct wdir *d = as_wdir(dir);
	if (!d) {
		init_telldir();
		return real_telldir(dir);
	}
	return (long)d->next;
}

void seekdir(DIR *dir, long pos)
{
	struct wdir *d = as_wdir(dir);
	if (!d) {
		init_seekdir();
		real_seekdir(dir, pos);
		return;
	}
	if (pos >= 0 && (size_t)pos <= d->n)
		d->next = (size_t)pos;
}

int dirfd(DIR *dir)
{
	struct wdir *d = as_wdir(dir);
	if (d)
		return d->fd;
	init_dirfd();
	return real_dirfd(dir);
}

/* getdents64 on a weir directory descriptor: linux_dirent64 records
 * {u64 ino, i64 off, u16 reclen, u8 type, name, NUL}, 8-byte aligned;
 * the page's offset is the next entry's index (lseek to 0 rewinds). */
ssize_t getdents64(int fd, void *buf, size_t n)
{
	init_getdents64();
	FD_OR_KERNEL(fd, d, real_getdents64(fd, buf, n));
	ssize_t r = 0;
	if (d->pg->kind != K_DIR) {
		r = -ENOTDIR;
		goto out;
	}
	lock_pg(d->pg);
	if (!d->ents || d->pg->off == 0) {
		free(d->ents);
		d->ents = NULL;
		int e = list(d->pg->path, &d->ents, &d->nents);
		if (e) {
			unlock_pg(d->pg);
			r = e;
			goto out;
		}
	}
	size_t at = 0;
	while (d->pg->off < d->nents) {
		const struct dirent64 *e = &d->ents[d->pg->off];
		size_t nl = strlen(e->d_name);
		size_t rl = (19 + nl + 1 + 7) & ~(size_t)7;
		if (at + rl > n)
			break;
		uint8_t *p = (uint8_t *)buf + at;
		memset(p, 0, rl);
		uint64_t ino = e->d_ino, off = d->pg->off + 1;
		uint16_t rl16 = (uint16_t)rl;
		memcpy(p, &ino, 8);
		memcpy(p + 8, &off, 8);
		memcpy(p + 16, &rl16, 2);
		p[18] = e->d_type;
		memcpy(p + 19, e->d_name, nl);
		at += rl;
		d->pg->off++;
	}
	unlock_pg(d->pg);
	r = (at == 0 && d->pg->off < d->nents) ? -EINVAL : (ssize_t)at; /* (a buffer too small for one entry) */
out:
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

/* stdio: a FILE of a weir path is a fopencookie stream over the
 * descriptor calls above; fileno of it is its descriptor (streams[]). */
#define MAX_STREAMS 256
static struct {
	FILE *f;
	int fd;
} streams[MAX_STREAMS]; /* under tab_mu */

static FILE *track(FILE *f, int fd)
{
	pthread_mutex_lock(&tab_mu);
	for (int i = 0; f && i < MAX_STREAMS; i++)
		if (!streams[i].f) {
			streams[i].f = f;
			streams[i].fd = fd;
			break;
		}
	pthread_mutex_unlock(&tab_mu);
	return f;
}

static void untrack(int fd)
{
	pthread_mutex_lock(&tab_mu);
	for (int i = 0; i < MAX_STREAMS; i++)
		if (streams[i].f && streams[i].fd == fd)
			streams[i].f = NULL;
	pthread_mutex_unlock(&tab_mu);
}

static int stream_fd(FILE *f)
{
	int fd = -2;
	pthread_mutex_lock(&tab_mu);
	for (int i = 0; i < MAX_STREAMS; i++)
		if (streams[i].f == f)
			fd = streams[i].fd;
	pthread_mutex_unlock(&tab_mu);
	return fd;
}

int fileno(FILE *f)
{
	int fd = stream_fd(f);
	if (fd != -2)
		return fd;
	init_fileno();
	return real_fileno(f);
}

int fileno_unlocked(FILE *f)
{
	int fd = stream_fd(f);
	if (fd != -2)
		return fd;
	init_fileno_unlocked();
	return real_fileno_unlocked(f);
}

static ssize_t ck_read(void *c, char *buf, size_t n) { return read((int)(intptr_t)c, buf, n); }
static ssize_t ck_write(void *c, const char *buf, size_t n)
{
	/* glibc marks a cookie stream in error on a short count: write it all. */
	size_t done = 0;
	while (done < n) {
		ssize_t r = write((int)(intptr_t)c, buf + done, n - done);
		if (r <= 0)
			return done ? (ssize_t)done : -1;
		done += (size_t)r;
	}
	return (ssize_t)done;
}
static int ck_seek(void *c, off64_t *off, int whence)
{
	off_t r = lseek((int)(intptr_t)c, (off_t)*off, whence);
	if (r < 0)
		return -1;
	*off = r;
	return 0;
}
static int ck_close(void *c)
{
	untrack((int)(intptr_t)c);
	return close((int)(intptr_t)c);
}

/* The standard streams. glibc's stdin, stdout and stderr read and write
 * their descriptors with its internal calls, which the shim does not see:
 * while descriptor 0, 1 or 2 is weir's (a shell's redirection, or one
 * inherited across exec), its stream is a cookie stream over the
 * shim's calls in glibc's place, which comes back (flushed first) when
 * the descriptor is the kernel's again. (stdin, stdout and stderr are
 * variables a program may assign, as glibc documents.) */
static FILE *std_orig[3];
static int std_retiring;
static pthread_mutex_t std_mu = PTHREAD_MUTEX_INITIALIZER;

static int ck_std_close(void *c)
{
	int fd = (int)(intptr_t)c;
	untrack(fd);
	if (std_retiring)
		return 0;
	/* fclose(stdout) by the program: the stream is gone (glibc frees it
	 * after this), so std_sync must not retire it again when the close
	 * below forgets the descriptor; the slot keeps the closed FILE, as
	 * glibc's own fclose(stdout) leaves it. */
	__atomic_store_n(&std_orig[fd], NULL, __ATOMIC_RELEASE); /* (no std_mu: glibc holds the stream's lock here, std_sync takes them the other way round) */
	return close(fd);
}

static void std_sync(int fd)
{
	if (fd < 0 || fd > 2)
		return;
	FILE **slot = fd == 0 ? &stdin : fd == 1 ? &stdout : &stderr;
	pthread_mutex_lock(&std_mu);
	int w = is_weir(fd), ours = std_orig[fd] != NULL;
	if (w && !ours) {
		cookie_io_functions_t io = {.read = ck_read, .write = ck_write, .seek = ck_seek, .close = ck_std_close};
		FILE *f = fopencookie((void *)(intptr_t)fd, fd == 0 ? "r" : "w", io);
		if (f) {
			fflush(*slot);
			if (fd == 2)
				setvbuf(f, NULL, _IONBF, 0);
			std_orig[fd] = *slot;
			*slot = f;
			track(f, fd);
		}
	} else if (!w && ours) {
		FILE *f = *slot;
		*slot = std_orig[fd];
		std_orig[fd] = NULL;
		std_retiring = 1;
		fclose(f); /* (flushes what it holds to the weir file, whose descriptor is gone: lost, as the kernel's stdio would lose it) */
		std_retiring = 0;
	}
	pthread_mutex_unlock(&std_mu);
}

static FILE *cookie_stream(int fd, const char *mode)
{
	cookie_io_functions_t io = {.read = ck_read, .write = ck_write, .seek = ck_seek, .close = ck_close};
	return track(fopencookie((void *)(intptr_t)fd, mode, io), fd);
}

static FILE *wfopen(const char *w, const char *mode)
{
	int flags;
	switch (mode[0]) {
	case 'r':
		flags = strchr(mode, '+') ? O_RDWR : O_RDONLY;
		break;
	case 'w':
		flags = (strchr(mode, '+') ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC;
		break;
	case 'a':
		flags = (strchr(mode, '+') ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND;
		break;
	default:
		errno = EINVAL;
		return NULL;
	}
	if (strchr(mode, 'x'))
		flags |= O_EXCL;
	if (strchr(mode, 'e'))
		flags |= O_CLOEXEC;
	int fd = wopen(w, flags, 0666);
	if (fd == FOLLOWED)
		AGAIN_OR(NULL, fopen(ext, mode));
	if (fd < 0)
		return NULL;
	FILE *f = cookie_stream(fd, mode);
	if (!f) {
		int e = errno;
		close(fd);
		errno = e;
	}
	return f;
}

static FILE *route_fopen(const char *path, const char *mode, FILE *(*kernel)(const char *, const char *))
{
	struct route r;
	int e = route(AT_FDCWD, path, &r);
	if (e) {
		errno = e;
		return NULL;
	}
	if (r.weir)
		return wfopen(r.w, mode);
	FILE *k = kernel(r.kpath, mode);
	if (k || !RELINKED(r, 1))
		return k;
	return wfopen(r.w, mode);
}

FILE *fopen(const char *path, const char *mode)
{
	init_fopen();
	return route_fopen(path, mode, real_fopen);
}

FILE *fopen64(const char *path, const char *mode)
{
	init_fopen64();
	return route_fopen(path, mode, real_fopen64);
}

FILE *fdopen(int fd, const char *mode)
{
	init_fdopen();
	if (!is_weir(fd))
		return real_fdopen(fd, mode);
	int e = 0;
	struct desc *d = get(fd, &e);
	if (!d) {
		errno = e ? e : EBADF;
		return NULL;
	}
	put(d);
	/* The stream owns fd from here: its fclose closes it. */
	return cookie_stream(fd, mode);
}

/* Extended attributes: weir has none (ENOTSUP, which ls and cp take as
 * "no ACL, no label"). */
#define NO_XATTR(name, ...)                                   \
	ssize_t name(const char *path, __VA_ARGS__)           \
	{                                                     \
		struct route r;                               \
		if (route(AT_FDCWD, path, &r) == 0 && r.weir) \
			return fail(ENOTSUP);                 \
		init_##name();                                \
		return real_##name(r.kpath, XATTR_ARGS_##name); \
	}
#define XATTR_ARGS_setxattr n, v, s, fl
#define XATTR_ARGS_lsetxattr n, v, s, fl
#define XATTR_ARGS_removexattr n
#define XATTR_ARGS_lremovexattr n
#define XATTR_ARGS_getxattr n, v, s
#define XATTR_ARGS_lgetxattr n, v, s
#define XATTR_ARGS_listxattr l, s
#define XATTR_ARGS_llistxattr l, s
NO_XATTR(getxattr, const char *n, void *v, size_t s)
NO_XATTR(lgetxattr, const char *n, void *v, size_t s)
NO_XATTR(listxattr, char *l, size_t s)
NO_XATTR(llistxattr, char *l, size_t s)
#define NO_XATTR_INT(name, ...)                               \
	int name(const char *path, __VA_ARGS__)               \
	{                                                     \
		struct route r;                               \
		if (route(AT_FDCWD, path, &r) == 0 && r.weir) \
			return fail(ENOTSUP);                 \
		init_##name();                                \
		return real_##name(r.kpath, XATTR_ARGS_##name); \
	}
NO_XATTR_INT(setxattr, const char *n, const void *v, size_t s, int fl)
NO_XATTR_INT(lsetxattr, const char *n, const void *v, size_t s, int fl)
NO_XATTR_INT(removexattr, const char *n)
NO_XATTR_INT(lremovexattr, const char *n)

int fsetxattr(int fd, const char *n, const void *v, size_t s, int fl)
{
	init_fsetxattr();
	FD_OR_KERNEL(fd, d, real_fsetxattr(fd, n, v, s, fl));
	put(d);
	return fail(ENOTSUP);
}

int fremovexattr(int fd, const char *n)
{
	init_fremovexattr();
	FD_OR_KERNEL(fd, d, real_fremovexattr(fd, n));
	put(d);
	return fail(ENOTSUP);
}

/* A weir file is no terminal (ENOTTY, where the kernel's O_PATH
 * descriptor would answer EBADF); FIOCLEX and FIONCLEX set the
 * descriptor's flag. */
/* Copies between descriptors: copy_file_range, sendfile and splice with a
 * weir descriptor at either end. The kernel cannot see a weir file's bytes
 * (its descriptor is an O_PATH placeholder: the kernel's call says EBADF),
 * so the shim copies through a buffer with its own read/pread and
 * write/pwrite, after the checks Linux makes (below, per call). Linux's
 * answer to a copy between two file systems, EXDEV, stays for
 * copy_file_range between weir and the kernel (callers fall back to read
 * and write, as they must on Linux). */
#define XFER_CHUNK (256u * 1024)

/* xfer copies up to n bytes from the file in to out: from *inoff (then
 * advanced) or in's offset, to *outoff (then advanced) or out's offset.
 * The input moves only by what was written. It stops at the input's end
 * and at a short write, and answers the bytes copied, or -1 with errno if
 * none were. (Out of a pipe: splice_from_pipe.) */
static ssize_t xfer(int in, off64_t *inoff, int out, off64_t *outoff, size_t n)
{
	size_t cap = n < XFER_CHUNK ? n : XFER_CHUNK;
	char *buf = cap ? malloc(cap) : NULL;
	if (cap && !buf)
		return fail(ENOMEM);
	off64_t ipos = inoff ? *inoff : lseek(in, 0, SEEK_CUR);
	if (ipos < 0) {
		free(buf);
		return -1;
	}
	size_t done = 0;
	int err = 0;
	while (done < n) {
		size_t want = n - done < cap ? n - done : cap;
		ssize_t got = pread(in, buf, want, ipos);
		if (got <= 0) {
			if (got < 0)
				err = errno;
			break;
		}
		ssize_t w = outoff ? pwrite(out, buf, (size_t)got, *outoff) : write(out, buf, (size_t)got);
		if (w <= 0) {
			err = w < 0 ? errno : EIO;
			break;
		}
		if (outoff)
			*outoff += w;
		done += (size_t)w;
		ipos += w;
		if (w < got)
			break; /* a short write: read again from where it ended next call */
	}
	free(buf);
	if (inoff)
		*inoff = ipos;
	else if (done)
		lseek(in, ipos, SEEK_SET);
	if (done == 0 && err)
		return fail(err);
	return (ssize_t)done;
}

/* xfer_modes checks that in reads and out writes (EBADF otherwise, and
 * for an O_APPEND out with append_err 0). */
static int xfer_modes(int in, int out, int append_err)
{
	int fi = fcntl(in, F_GETFL), fo = fcntl(out, F_GETFL);
	if (fi < 0 || fo < 0 || (fi & O_ACCMODE) == O_WRONLY || (fo & O_ACCMODE) == O_RDONLY || (fi & O_PATH) ||
	    (fo & O_PATH))
		return fail(EBADF);
	if (fo & O_APPEND)
		return fail(append_err ? append_err : EBADF);
	return 0;
}

ssize_t copy_file_range(int in, off64_t *inoff, int out, off64_t *outoff, size_t n, unsigned int flags)
{
	int wi = is_weir(in), wo = is_weir(out);
	if (!wi && !wo) {
		init_copy_file_range();
		return real_copy_file_range(in, inoff, out, outoff, n, flags);
	}
	if (xfer_modes(in, out, 0))
		return -1;
	if (flags)
		return fail(EINVAL);
	struct stat si, so;
	if (fstat(in, &si) || fstat(out, &so))
		return -1;
	if (S_ISDIR(si.st_mode) || S_ISDIR(so.st_mode))
		return fail(EISDIR);
	if (!S_ISREG(si.st_mode) || !S_ISREG(so.st_mode))
		return fail(EINVAL);
	if (wi != wo)
		return fail(EXDEV); /* two file systems (Linux 5.19 on) */
	off64_t ip = inoff ? *inoff : lseek(in, 0, SEEK_CUR), op = outoff ? *outoff : lseek(out, 0, SEEK_CUR);
	if (ip < 0 || op < 0)
		return fail(EINVAL);
	if (n > (size_t)(INT64_MAX - (ip > op ? ip : op)))
		return fail(EOVERFLOW);
	/* Linux shortens the copy to the input's end before it looks for an
	 * overlap. */
	n = ip >= si.st_size ? 0 : (size_t)(si.st_size - ip) < n ? (size_t)(si.st_size - ip) : n;
	if (si.st_ino == so.st_ino && si.st_dev == so.st_dev && ip < op + (off64_t)n && op < ip + (off64_t)n)
		return fail(EINVAL); /* overlapping ranges of one file */
	if (n == 0)
		return 0;
	if (outoff)
		return xfer(in, inoff, out, outoff, n);
	ssize_t r = xfer(in, inoff, out, &op, n);
	if (r > 0)
		lseek(out, op, SEEK_SET);
	return r;
}

ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
	if (!is_weir(in) && !is_weir(out)) {
		init_sendfile();
		return real_sendfile(out, in, off, n);
	}
	if (xfer_modes(in, out, EINVAL))
		return -1;
	struct stat si;
	if (fstat(in, &si))
		return -1;
	if (!S_ISREG(si.st_mode))
		return fail(EINVAL); /* Linux reads only what it can map */
	if (off && *off < 0)
		return fail(EINVAL);
	if (n > 0x7ffff000)
		n = 0x7ffff000; /* Linux's bound on one transfer */
	off64_t o = off ? *off : 0;
	ssize_t r = xfer(in, off ? &o : NULL, out, NULL, n);
	if (off)
		*off = (off_t)o;
	return r;
}
ssize_t sendfile64(int out, int in, off64_t *off, size_t n) { return sendfile(out, in, (off_t *)off, n); }

/* is_pipe: a kernel descriptor of a pipe or FIFO. */
static int is_pipe(int fd)
{
	struct stat st;
	return !is_weir(fd) && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

/* splice_from_pipe moves up to n bytes of the pipe in into weir's out (at
 * *outoff, then advanced, or its offset) and consumes from the pipe only
 * what was written, as Linux does: tee(2) copies the bytes into a pipe of
 * the shim's without consuming them, they are written, then that many are
 * read off in. An empty pipe waits for a writer unless nonblock (EAGAIN);
 * one with no writer left answers 0. */
static ssize_t splice_from_pipe(int in, int out, off64_t *outoff, size_t n, int nonblock)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		return -1;
	ssize_t t = tee(in, p[1], n, nonblock ? SPLICE_F_NONBLOCK : 0);
	close(p[1]);
	if (t <= 0) {
		int e = errno;
		close(p[0]);
		errno = e;
		return t;
	}
	char *buf = malloc((size_t)t);
	if (!buf) {
		close(p[0]);
		return fail(ENOMEM);
	}
	size_t got = 0;
	int rerr = 0;
	while (got < (size_t)t) {
		ssize_t r = read(p[0], buf + got, (size_t)t - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rerr = r < 0 ? errno : EIO;
			break;
		}
		got += (size_t)r;
	}
	close(p[0]);
	if (got == 0) {
		free(buf);
		return fail(rerr ? rerr : EIO); /* nothing consumed: not the end of the pipe */
	}
	size_t done = 0;
	int err = 0;
	while (done < got) {
		ssize_t w = outoff ? pwrite(out, buf + done, got - done, *outoff) : write(out, buf + done, got - done);
		if (w <= 0) {
			err = w < 0 ? errno : EIO;
			break;
		}
		done += (size_t)w;
		if (outoff)
			*outoff += w;
	}
	/* Consume what was written (the bytes tee saw are in the pipe: this
	 * read does not wait). */
	size_t gone = 0;
	while (gone < done) {
		ssize_t r = read(in, buf, done - gone);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break; /* (another reader took them: the pipe had more than one) */
		gone += (size_t)r;
	}
	free(buf);
	if (done == 0 && err)
		return fail(err);
	return (ssize_t)done;
}

ssize_t splice(int in, loff_t *inoff, int out, loff_t *outoff, size_t n, unsigned int flags)
{
	int wi = is_weir(in), wo = is_weir(out);
	if (!wi && !wo) {
		init_splice();
		return real_splice(in, inoff, out, outoff, n, flags);
	}
	/* One end is a pipe, and the other weir's. */
	if (flags & ~(unsigned)(SPLICE_F_MOVE | SPLICE_F_NONBLOCK | SPLICE_F_MORE | SPLICE_F_GIFT))
		return fail(EINVAL);
	int pin = is_pipe(in), pout = is_pipe(out);
	if (!pin && !pout)
		return fail(EINVAL);
	if ((pin && inoff) || (pout && outoff))
		return fail(ESPIPE);
	if (xfer_modes(in, out, EINVAL))
		return -1;
	if ((inoff && *inoff < 0) || (outoff && *outoff < 0))
		return fail(EINVAL);
	if (n == 0)
		return 0;
	if (pin)
		return splice_from_pipe(in, out, outoff, n, flags & SPLICE_F_NONBLOCK);
	/* Into a pipe: what fits in it now, or PIPE_BUF bytes when it is full
	 * (that write waits for room, as splice does), so that a program that
	 * drains the pipe itself after the call never waits on its own. Room
	 * is counted as Linux fills a pipe from a file: in whole pages, the
	 * first from the offset's place in its page. */
	int sz = fcntl(out, F_GETPIPE_SZ), queued = 0;
	off64_t at = inoff ? *inoff : lseek(in, 0, SEEK_CUR);
	if (sz > 0 && at >= 0 && ioctl(out, FIONREAD, &queued) == 0) {
		int64_t room = (int64_t)sz - (((int64_t)queued + 4095) & ~(int64_t)4095) - (at & 4095);
		if (room <= 0 && (flags & SPLICE_F_NONBLOCK))
			return fail(EAGAIN); /* full, and the caller will not wait */
		if (room <= 0)
			room = PIPE_BUF;
		if (n > (size_t)room)
			n = (size_t)room;
	}
	return xfer(in, inoff, out, NULL, n);
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	init_ioctl();
	if (!is_weir(fd))
		return real_ioctl(fd, req, arg);
	init_fcntl();
	if (req == FIOCLEX || req == FIONCLEX)
		return real_fcntl(fd, F_SETFD, req == FIOCLEX ? FD_CLOEXEC : 0);
	return fail(ENOTTY);
}

int tcgetattr(int fd, struct termios *t)
{
	init_tcgetattr();
	return is_weir(fd) ? fail(ENOTTY) : real_tcgetattr(fd, t);
}

int isatty(int fd)
{
	init_isatty();
	if (is_weir(fd)) {
		errno = ENOTTY;
		return 0;
	}
	return real_isatty(fd);
}

ssize_t fgetxattr(int fd, const char *n, void *v, size_t s)
{
	init_fgetxattr();
	FD_OR_KERNEL(fd, d, real_fgetxattr(fd, n, v, s));
	put(d);
	return fail(ENOTSUP);
}

ssize_t flistxattr(int fd, char *l, size_t s)
{
	init_flistxattr();
	FD_OR_KERNEL(fd, d, real_flistxattr(fd, l, s));
	put(d);
	return fail(ENOTSUP);
}

/* The mkstemp family and mkdtemp: glibc's create the file with its
 * internal open, which the shim would not see; under the mount the names
 * are made here and created with O_EXCL, as glibc does. */
static int fill_template(char *t, int suffix, int dir, int flags)
{
	static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	size_t n = strlen(t);
	if (suffix < 0 || n < 6 + (size_t)suffix || memcmp(t + n - suffix - 6, "XXXXXX", 6) != 0)
		return fail(EINVAL);
	char *x = t + n - suffix - 6;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
	for (int tries = 0; tries < 1000; tries++) {
		v = v * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t r = v >> 16;
		for (int i = 0; i < 6; i++, r /= 62)
			x[i] = chars[r % 62];
		int rc = dir ? mkdir(t, 0700) : open(t, (flags & ~O_ACCMODE) | O_RDWR | O_CREAT | O_EXCL, 0600);
		if (rc >= 0 || errno != EEXIST)
			return rc;
	}
	return fail(EEXIST);
}

static int tmpl_weir(const char *t)
{
	struct route r;
	return t && route(AT_FDCWD, t, &r) == 0 && r.weir;
}

int mkostemps(char *t, int suffix, int flags)
{
	init_mkostemps();
	return tmpl_weir(t) ? fill_template(t, suffix, 0, flags) : real_mkostemps(t, suffix, flags);
}
int mkstemp(char *t) { return mkostemps(t, 0, 0); }
int mkostemp(char *t, int flags) { return mkostemps(t, 0, flags); }
int mkstemps(char *t, int suffix) { return mkostemps(t, suffix, 0); }
int mkstemp64(char *t) { return mkostemps(t, 0, O_LARGEFILE); }
int mkostemp64(char *t, int flags) { return mkostemps(t, 0, flags | O_LARGEFILE); }
int mkstemps64(char *t, int suffix) { return mkostemps(t, suffix, O_LARGEFILE); }
int mkostemps64(char *t, int suffix, int flags) { return mkostemps(t, suffix, flags | O_LARGEFILE); }

char *mkdtemp(char *t)
{
	init_mkdtemp();
	if (!tmpl_weir(t))
		return real_mkdtemp(t);
	return fill_template(t, 0, 1, 0) == 0 ? t : NULL;
}

/* openat2 has no glibc wrapper: programs call it through syscall(3),
 * which the shim catches for it (and close_range), passing every other
 * number through. For a weir path RESOLVE_NO_SYMLINKS, NO_MAGICLINKS and
 * NO_XDEV hold anyway; RESOLVE_BENEATH and RESOLVE_IN_ROOT refuse (EXDEV)
 * an absolute path or one with "..", which is stricter than Linux (it
 * allows a ".." that stays beneath). */
struct wopen_how {
	uint64_t flags, mode, resolve;
};
#define W_RESOLVE_KNOWN 0x3fu /* NO_XDEV, NO_MAGICLINKS, NO_SYMLINKS, BENEATH, IN_ROOT, CACHED */

static long wopenat2(int dirfd, const char *path, const struct wopen_how *how, size_t size)
{
	if (size < sizeof *how)
		return fail(EINVAL);
	if (how->resolve & ~(uint64_t)W_RESOLVE_KNOWN || how->flags >> 32 || how->mode & ~(uint64_t)07777 ||
	    (how->mode && !(how->flags & O_CREAT) && (how->flags & O_TMPFILE) != O_TMPFILE))
		return fail(EINVAL);
	ROUTE(dirfd, path, r);
	if (!r.weir)
		return -2; /* the kernel's */
	if ((how->resolve & 0x18) && (path[0] == '/' || has_dotdot(path)))
		return fail(EXDEV);
	/* RESOLVE_NO_SYMLINKS refuses every link (ELOOP); RESOLVE_BENEATH and
	 * RESOLVE_IN_ROOT every link too (EXDEV), stricter than Linux, which
	 * follows one that stays beneath. */
	int strict = (how->resolve & 0x04) ? ELOOP : (how->resolve & 0x18) ? EXDEV : 0;
	weir_no_links(strict);
	long fd = wopen(r.w, (int)how->flags, (mode_t)how->mode);
	weir_no_links(0);
	if (fd != FOLLOWED)
		return fd;
	/* A link led out of weir. */
	if (how->resolve & 0x1d) /* RESOLVE_NO_XDEV, _NO_SYMLINKS, _BENEATH, _IN_ROOT */
		return fail((how->resolve & 0x04) ? ELOOP : EXDEV);
	AGAIN(syscall(SYS_openat2, AT_FDCWD, ext, how, size));
}

long syscall(long nr, ...)
{
	va_list ap;
	va_start(ap, nr);
	long a[6];
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	init_syscall();
	switch (nr) {
	case SYS_openat2: {
		long r = wopenat2((int)a[0], (const char *)a[1], (const struct wopen_how *)a[2], (size_t)a[3]);
		if (r != -2)
			return r;
		break;
	}
	case SYS_close_range:
		return close_range((unsigned)a[0], (unsigned)a[1], (int)a[2]);
	case SYS_close:
		return close((int)a[0]);
	/* Calls programs make through syscall(2) (gnulib's renameat2 does):
	 * the shim's entry points, which pass what is not weir's on.
	 * (Only where the C library has the function the shim passes the
	 * kernel's calls to: older ones have not.) */
	case SYS_renameat2:
		init_renameat2();
		if (real_renameat2)
			return renameat2((int)a[0], (const char *)a[1], (int)a[2], (const char *)a[3], (unsigned)a[4]);
		break;
	case SYS_statx:
		init_statx();
		if (real_statx)
			return statx((int)a[0], (const char *)a[1], (int)a[2], (unsigned)a[3], (struct statx *)a[4]);
		break;
	case SYS_copy_file_range:
		init_copy_file_range();
		if (real_copy_file_range)
			return copy_file_range((int)a[0], (off64_t *)a[1], (int)a[2], (off64_t *)a[3], (size_t)a[4], (unsigned)a[5]);
		break;
	case SYS_getdents64:
		init_getdents64();
		if (real_getdents64)
			return getdents64((int)a[0], (void *)a[1], (size_t)a[2]);
		break;
	}
	return real_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* exec. A program on weir is run from a memfd copy of it (the kernel
 * cannot read weir's files): fexecve, close-on-exec unless it is a
 * script, whose interpreter opens it by /proc/self/fd. exec of a static
 * binary, which no LD_PRELOAD shim can serve, while weir descriptors or a
 * weir cwd would pass to it, is reported on stderr (it goes ahead: the
 * descriptors fail with EBADF in it, and its cwd is /proc).
 *
 * glibc's execv, execvp, execl... call its internal execve, so each is
 * caught here and comes to execve. */
/* elf_kind judges the program in fd: 1 statically linked, 2 a Go program
 * (its PT_NOTE holds Go's build id note, name "Go", type 4: it makes its system
 * calls itself, linked statically or not), 0 anything else (a dynamic C
 * program, a script, not a 64-bit ELF). */
static int elf_kind(int fd)
{
	Elf64_Ehdr h;
	init_pread();
	if (real_pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.e_ident, ELFMAG, SELFMAG) != 0 ||
	    h.e_ident[EI_CLASS] != ELFCLASS64 || h.e_phentsize != sizeof(Elf64_Phdr) || h.e_phnum > 256)
		return 0; /* not a 64-bit ELF (a script, or another class): not judged */
	int interp = 0;
	for (int i = 0; i < h.e_phnum; i++) {
		Elf64_Phdr ph;
		if (real_pread(fd, &ph, sizeof ph, (off_t)(h.e_phoff + (uint64_t)i * sizeof ph)) != (ssize_t)sizeof ph)
			return 0;
		if (ph.p_type == PT_INTERP)
			interp = 1;
		if (ph.p_type != PT_NOTE || ph.p_filesz > 4096)
			continue;
		uint8_t note[4096];
		if (real_pread(fd, note, ph.p_filesz, (off_t)ph.p_offset) != (ssize_t)ph.p_filesz)
			continue;
		for (size_t at = 0; at + 12 <= ph.p_filesz;) {
			uint32_t namesz, descsz, type;
			memcpy(&namesz, note + at, 4);
			memcpy(&descsz, note + at + 4, 4);
			memcpy(&type, note + at + 8, 4);
			/* (Go's linker names it "Go\0\0": namesz 4) */
			if ((namesz == 3 || namesz == 4) && type == 4 && at + 15 <= ph.p_filesz && memcmp(note + at + 12, "Go", 3) == 0)
				return 2;
			uint64_t next = at + 12 + ((namesz + 3ull) & ~3ull) + ((descsz + 3ull) & ~3ull);
			if (next <= at || next > ph.p_filesz)
				break;
			at = (size_t)next;
		}
	}
	return interp ? 0 : 1;
}

/* names_weir says whether an argument names a path under the mount. */
static int names_weir(char *const argv[])
{
	size_t ml;
	const char *m = mount_point(&ml);
	for (int i = 1; argv && argv[i] && ml > 1; i++)
		if (strncmp(argv[i], m, ml) == 0 && (argv[i][ml] == '/' || argv[i][ml] == 0))
			return 1;
	return 0;
}

static int weir_state(void)
{
	if (wcwd_on)
		return 1;
	pthread_mutex_lock(&tab_mu);
	int any = 0;
	for (int i = 0; i < MAX_FDS && !any; i++)
		any = tab[i] != NULL;
	pthread_mutex_unlock(&tab_mu);
	return any;
}

/* warn_uncaught reports, on stderr, a program the shim cannot serve
 * (statically linked, or Go) that gets weir state: descriptors or a cwd
 * it inherits, or an argument naming a weir path. */
static void warn_uncaught_fd(int fd, const char *path, char *const argv[])
{
	int state = weir_state();
	if (!state && !names_weir(argv))
		return;
	int kind = elf_kind(fd);
	if (!kind)
		return;
	char msg[PATH_MAX + 300];
	int n = snprintf(msg, sizeof msg, "weir: %s %s, so it cannot use %s (%s)\n", path,
			 kind == 2 ? "is a Go program: it makes its system calls itself, past LD_PRELOAD"
				   : "is statically linked: LD_PRELOAD cannot serve it",
			 state ? "the weir descriptors or the weir cwd it inherits" : "the weir paths in its arguments",
			 state ? "they answer EBADF; its cwd is /proc" : "the kernel has no such paths; a Go program can use weir's Go client");
	init_write();
	if (n > 0)
		real_write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
}

static void warn_uncaught(const char *path, char *const argv[])
{
	if (!weir_state() && !names_weir(argv))
		return;
	init_open();
	init_close();
	int fd = real_open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		warn_uncaught_fd(fd, path, argv);
		real_close(fd);
	}
}

static int wexecve(const char *w, char *const argv[], char *const envp[])
{
	FS_OR_FAIL(f);
	struct weir_attr a;
	uint64_t h;
	int e = weir_stat(f, w, &a);
	if (e == -(int)WEIR_ERR_FOLLOW)
		return FOLLOWED;
	if (!e && !S_ISREG(a.mode))
		e = -EACCES;
	if (!e)
		e = -may(&a, X_OK);
	if (!e)
		e = weir_open(f, w, O_RDONLY, 0, &h, &a, NULL);
	if (e)
		return fail(-e);
	char head[2] = {0};
	weir_pread(f, h, head, 2, 0, 0);
	int script = head[0] == '#' && head[1] == '!';
	int m = memfd_create("weir-exec", script ? 0 : MFD_CLOEXEC);
	if (m < 0) {
		e = errno;
		weir_close(f, h);
		return fail(e);
	}
	char *buf = malloc(1 << 20);
	uint64_t off = 0;
	ssize_t r = 0;
	init_pwrite();
	while (buf && (r = weir_pread(f, h, buf, 1 << 20, off, 0)) > 0) {
		if (real_pwrite(m, buf, (size_t)r, (off_t)off) != r) {
			r = -(errno ? errno : EIO);
			break;
		}
		off += (uint64_t)r;
	}
	free(buf);
	weir_close(f, h);
	if (!buf || r < 0) {
		init_close();
		real_close(m);
		return fail(!buf ? ENOMEM : (int)-r);
	}
	warn_uncaught_fd(m, w, argv);
	syscall(SYS_execveat, m, "", argv, envp, AT_EMPTY_PATH);
	e = errno;
	init_close();
	real_close(m);
	return fail(e);
}

int execve(const char *path, char *const argv[], char *const envp[])
{
	ROUTE(AT_FDCWD, path, r);
	if (!r.weir) {
		warn_uncaught(r.kpath, argv);
		init_execve();
	}
	KERNEL_OR_RELINK(r, 1, real_execve(r.kpath, argv, envp), wexecve(r.w, argv, envp), execve(ext, argv, envp));
}

int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }

/* exec_sh runs path with /bin/sh, as glibc's execvp does a file the
 * kernel answers ENOEXEC for. */
static void exec_sh(const char *path, char *const argv[], char *const envp[])
{
	int argc = 0;
	while (argv[argc])
		argc++;
	char **sh = malloc((size_t)(argc + 2) * sizeof *sh);
	if (!sh) {
		errno = ENOMEM;
		return;
	}
	sh[0] = "/bin/sh";
	sh[1] = (char *)path;
	for (int i = 1; i <= argc; i++)
		sh[i + 1] = argv[i];
	execve("/bin/sh", sh, envp);
	int e = errno;
	free(sh);
	errno = e;
}

/* execvpe: PATH's search, as glibc's (for a file without '/'), over
 * weir's directories too. */
int execvpe(const char *file, char *const argv[], char *const envp[])
{
	const char *volatile vf = file;
	if (!vf || !*vf)
		return fail(ENOENT);
	if (strchr(file, '/')) {
		execve(file, argv, envp);
		if (errno == ENOEXEC)
			exec_sh(file, argv, envp);
		return -1;
	}
	const char *p = getenv("PATH");
	if (!p)
		p = "/bin:/usr/bin";
	int eacces = 0;
	for (const char *s = p;; s++) {
		const char *e = strchrnul(s, ':');
		char full[PATH_MAX];
		int n = e == s ? snprintf(full, sizeof full, "%s", file) : snprintf(full, sizeof full, "%.*s/%s", (int)(e - s), s, file);
		if (n > 0 && (size_t)n < sizeof full) {
			execve(full, argv, envp);
			switch (errno) {
			case ENOEXEC:
				exec_sh(full, argv, envp);
				return -1;
			case EACCES:
				eacces = 1;
				break;
			case ENOENT:
			case ENOTDIR:
			case ESTALE:
			case ENODEV:
			case ETIMEDOUT:
				break;
			default:
				return -1;
			}
		}
		if (!*e)
			break;
		s = e;
	}
	return fail(eacces ? EACCES : ENOENT);
}

int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

/* execl, execlp, execle: their lists as a vector. */
#define LIST_ARGV(first, ap, argv)                                  \
	va_list ap;                                                 \
	size_t argc_ = 1;                                           \
	va_start(ap, first);                                        \
	while (va_arg(ap, char *))                                  \
		argc_++;                                            \
	va_end(ap);                                                 \
	char **argv = alloca((argc_ + 1) * sizeof(char *));         \
	argv[0] = (char *)(first);                                  \
	va_start(ap, first);                                        \
	for (size_t i_ = 1; i_ <= argc_; i_++)                      \
		argv[i_] = va_arg(ap, char *);

int execl(const char *path, const char *arg, ...)
{
	LIST_ARGV(arg, ap, argv);
	va_end(ap);
	return execve(path, argv, environ);
}

int execlp(const char *file, const char *arg, ...)
{
	LIST_ARGV(arg, ap, argv);
	va_end(ap);
	return execvpe(file, argv, environ);
}

int execle(const char *path, const char *arg, ...)
{
	LIST_ARGV(arg, ap, argv);
	char *const *envp = va_arg(ap, char *const *);
	va_end(ap);
	return execve(path, argv, envp);
}

/* Linux native AIO through libaio (io_submit, io_getevents): an iocb on
 * a weir descriptor is served at once, synchronously, and its event is
 * queued here for the next io_getevents of its context; the others go to
 * the kernel as they came. libaio's calls answer -errno, not errno.
 * io_uring, which has no library entry point per request, is not caught. */
struct aio_q {
	aio_context_t ctx;
	int kernel; /* the kernel's requests in flight */
	size_t n, cap;
	struct io_event *ev;
};
#define MAX_AIO_CTX 64
static struct aio_q aioq[MAX_AIO_CTX]; /* under aio_mu */
static pthread_mutex_t aio_mu = PTHREAD_MUTEX_INITIALIZER;
static int (*real_io_submit)(aio_context_t, long, struct iocb **);
static int (*real_io_getevents)(aio_context_t, long, long, struct io_event *, struct timespec *);
static int (*real_io_destroy)(aio_context_t);
static int (*real_io_cancel)(aio_context_t, struct iocb *, struct io_event *);

static struct aio_q *aio_of(aio_context_t ctx, int make)
{
	struct aio_q *free_q = NULL;
	for (int i = 0; i < MAX_AIO_CTX; i++) {
		if (aioq[i].ctx == ctx && ctx)
			return &aioq[i];
		if (!aioq[i].ctx && !free_q)
			free_q = &aioq[i];
	}
	if (make && free_q) {
		memset(free_q, 0, sizeof *free_q);
		free_q->ctx = ctx;
		return free_q;
	}
	return NULL;
}

static int64_t aio_one(struct iocb *cb)
{
	int fd = (int)cb->aio_fildes;
	void *buf = (void *)(uintptr_t)cb->aio_buf;
	ssize_t r;
	switch (cb->aio_lio_opcode) {
	case IOCB_CMD_PREAD:
		r = pread(fd, buf, cb->aio_nbytes, cb->aio_offset);
		break;
	case IOCB_CMD_PWRITE:
		r = pwrite(fd, buf, cb->aio_nbytes, cb->aio_offset);
		break;
	case IOCB_CMD_PREADV:
		r = preadv(fd, buf, (int)cb->aio_nbytes, cb->aio_offset);
		break;
	case IOCB_CMD_PWRITEV:
		r = pwritev(fd, buf, (int)cb->aio_nbytes, cb->aio_offset);
		break;
	case IOCB_CMD_FSYNC:
	case IOCB_CMD_FDSYNC:
		r = fsync(fd);
		break;
	case IOCB_CMD_NOOP:
		r = 0;
		break;
	default:
		return -EINVAL;
	}
	return r < 0 ? -errno : r;
}

int io_submit(aio_context_t ctx, long nr, struct iocb **cbs)
{
	if (!real_io_submit)
		real_io_submit = (int (*)(aio_context_t, long, struct iocb **))dlsym(RTLD_NEXT, "io_submit");
	if (nr < 0)
		return -EINVAL;
	long done = 0;
	while (done < nr) {
		long run = 0; /* the kernel's run from done on */
		while (done + run < nr && !is_weir((int)cbs[done + run]->aio_fildes))
			run++;
		if (run) {
			if (!real_io_submit)
				return done ? (int)done : -ENOSYS;
			int r = real_io_submit(ctx, run, cbs + done);
			if (r > 0) {
				pthread_mutex_lock(&aio_mu);
				struct aio_q *q = aio_of(ctx, 1);
				if (q)
					q->kernel += r;
				pthread_mutex_unlock(&aio_mu);
				done += r;
			}
			if (r < run)
				return done ? (int)done : r;
			continue;
		}
		struct iocb *cb = cbs[done];
		if (cb->aio_reqprio || (cb->aio_flags & IOCB_FLAG_RESFD))
			return done ? (int)done : -EINVAL; /* (no priorities, no eventfd notices for weir's) */
		int64_t res = aio_one(cb);
		pthread_mutex_lock(&aio_mu);
		struct aio_q *q = aio_of(ctx, 1);
		int ok = q != NULL;
		if (q && q->n == q->cap) {
			size_t cap = q->cap ? q->cap * 2 : 64;
			struct io_event *ev = realloc(q->ev, cap * sizeof *ev);
			if (ev) {
				q->ev = ev;
				q->cap = cap;
			} else {
				ok = 0;
			}
		}
		if (ok)
			q->ev[q->n++] = (struct io_event){.data = cb->aio_data, .obj = (uint64_t)(uintptr_t)cb, .res = res};
		pthread_mutex_unlock(&aio_mu);
		if (!ok)
			return done ? (int)done : -EAGAIN;
		done++;
	}
	return (int)done;
}

int io_getevents(aio_context_t ctx, long min_nr, long nr, struct io_event *events, struct timespec *timeout)
{
	if (!real_io_getevents)
		real_io_getevents = (int (*)(aio_context_t, long, long, struct io_event *, struct timespec *))dlsym(RTLD_NEXT, "io_getevents");
	if (min_nr < 0 || nr < min_nr)
		return -EINVAL;
	pthread_mutex_lock(&aio_mu);
	struct aio_q *q = aio_of(ctx, 0);
	long n = 0;
	int kernel = 0;
	if (q) {
		n = (long)q->n < nr ? (long)q->n : nr;
		memcpy(events, q->ev, (size_t)n * sizeof *events);
		memmove(q->ev, q->ev + n, (q->n - (size_t)n) * sizeof *events);
		q->n -= (size_t)n;
		kernel = q->kernel;
	}
	pthread_mutex_unlock(&aio_mu);
	if (!q)
		return real_io_getevents ? real_io_getevents(ctx, min_nr, nr, events, timeout) : -EINVAL;
	if (!kernel || n == nr || !real_io_getevents)
		return (int)n;
	struct timespec zero = {0, 0};
	int r = real_io_getevents(ctx, n >= min_nr ? 0 : min_nr - n, nr - n, events + n, n >= min_nr ? &zero : timeout);
	if (r > 0) {
		pthread_mutex_lock(&aio_mu);
		q = aio_of(ctx, 0);
		if (q)
			q->kernel -= r;
		pthread_mutex_unlock(&aio_mu);
		return (int)n + r;
	}
	return n ? (int)n : r;
}

int io_cancel(aio_context_t ctx, struct iocb *cb, struct io_event *ev)
{
	if (!real_io_cancel)
		real_io_cancel = (int (*)(aio_context_t, struct iocb *, struct io_event *))dlsym(RTLD_NEXT, "io_cancel");
	if (cb && is_weir((int)cb->aio_fildes))
		return -EAGAIN; /* served already: its event is queued */
	return real_io_cancel ? real_io_cancel(ctx, cb, ev) : -EINVAL;
}

int io_destroy(aio_context_t ctx)
{
	if (!real_io_destroy)
		real_io_destroy = (int (*)(aio_context_t))dlsym(RTLD_NEXT, "io_destroy");
	pthread_mutex_lock(&aio_mu);
	struct aio_q *q = aio_of(ctx, 0);
	if (q) {
		free(q->ev);
		memset(q, 0, sizeof *q);
	}
	pthread_mutex_unlock(&aio_mu);
	return real_io_destroy ? real_io_destroy(ctx) : -EINVAL;
}

/* fork: the child must not use its parent's sessions (their rings are
 * shared memory; a request of the child's would be the parent's), and no
 * lock of the shim may be left held by a thread the child does not have.
 * The child shares its parent's descriptions (the pages are shared
 * memory) and gets handles of its own for them at their first use. */
static void fork_prepare(void)
{
	/* (in the order the shim nests them: std_sync flushes through write,
	 * which may adopt; nothing takes std_mu under another) */
	pthread_mutex_lock(&std_mu);
	pthread_mutex_lock(&adopt_mu);
	pthread_mutex_lock(&fs_mu);
	pthread_mutex_lock(&tab_mu);
	pthread_mutex_lock(&cwd_mu);
	pthread_mutex_lock(&cache_mu);
	pthread_mutex_lock(&aio_mu);
	pthread_mutex_lock(&wmap_mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&wmap_mu);
	pthread_mutex_unlock(&aio_mu);
	pthread_mutex_unlock(&cache_mu);
	pthread_mutex_unlock(&cwd_mu);
	pthread_mutex_unlock(&tab_mu);
	pthread_mutex_unlock(&fs_mu);
	pthread_mutex_unlock(&adopt_mu);
	pthread_mutex_unlock(&std_mu);
}

static void fork_child(void)
{
	tab_pid = getpid();
	wfs = NULL; /* (its mappings and sockets stay, unused, until exec or exit) */
	fork_parent();
	repin_after_fork();
}

/* _Fork (glibc 2.34) forks without the atfork handlers: its child is
 * told it is not its parent all the same. (Its child may only make
 * async-signal-safe calls; the shim's are not, so a weir call there is
 * as undefined as a malloc.) */
REAL(pid_t, _Fork, void)
pid_t _Fork(void)
{
	init__Fork();
	if (!real__Fork) {
		errno = ENOSYS;
		return -1;
	}
	pid_t p = real__Fork();
	if (p == 0) {
		tab_pid = getpid();
		wfs = NULL;
	}
	return p;
}

/* adopt_inherited registers the weir descriptors a new image got across
 * exec: the pages behind them, which /proc/self/fd names. */
static void adopt_inherited(void)
{
	init_opendir();
	init_readdir64();
	init_closedir();
	init_readlink();
	init_fstat();
	DIR *dir = real_opendir("/proc/self/fd");
	if (!dir)
		return;
	struct dirent64 *e;
	while ((e = real_readdir64(dir)) != NULL) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end || fd < 0 || fd >= MAX_FDS)
			continue;
		char pp[64], link[128];
		snprintf(pp, sizeof pp, "/proc/self/fd/%ld", fd);
		ssize_t n = real_readlink(pp, link, sizeof link - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		int isdesc = strncmp(link, "/memfd:weir-desc ", 17) == 0, iscwd = strncmp(link, "/memfd:weir-cwd ", 16) == 0;
		if (!isdesc && !iscwd)
			continue;
		ino_t key;
		struct wpage *p = map_page((int)fd, &key);
		if (!p)
			continue;
		if (p->magic != WPAGE_MAGIC || p->version != 1 || memchr(p->path, 0, sizeof p->path) == NULL ||
		    (p->kind != K_FILE && p->kind != K_DIR && p->kind != K_PATH)) {
			munmap(p, PAGE_BYTES);
			continue;
		}
		if (iscwd) {
			snprintf(wcwd, sizeof wcwd, "%s", p->path);
			wcwd_on = 1;
			cwd_fd = (int)fd;
			munmap(p, PAGE_BYTES);
			continue;
		}
		/* dup'ed descriptors share one description (one memfd). */
		struct desc *d = NULL;
		for (int i = 0; i < MAX_FDS && !d; i++)
			if (tab[i] && tab[i]->key == key)
				d = tab[i];
		if (d) {
			munmap(p, PAGE_BYTES);
		} else {
			d = calloc(1, sizeof *d);
			if (!d) {
				munmap(p, PAGE_BYTES);
				continue;
			}
			d->pg = p;
			d->key = key;
			d->pid = 0; /* not adopted: a handle of this process's at first use */
		}
		install((int)fd, d);
	}
	real_closedir(dir);
}

__attribute__((constructor)) static void shim_init(void)
{
	/* What syscall(3) may route (a forked child of a threaded program,
	 * CPython's subprocess, calls getdents64 so: no dlsym there). */
	init_syscall();
	init_renameat2();
	init_statx();
	init_copy_file_range();
	init_getdents64();
	tab_pid = getpid();
	adopt_inherited();
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}
