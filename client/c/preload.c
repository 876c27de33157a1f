/*
 * libweir-preload.so: LD_PRELOAD=libweir-preload.so runs an unmodified
 * dynamically linked program with the paths under WEIR_MOUNT (default
 * /weir) served by weir; every other path goes to the kernel untouched.
 *
 * This first part (issue 11) routes absolute paths (and relative ones
 * whose cwd-joined form lies under the mount), with "." and ".."
 * resolved lexically, and catches: open, open64, openat, openat64,
 * __open_2, __open64_2, creat, close, read, write, pread(64),
 * pwrite(64), lseek(64), fsync, fdatasync, ftruncate(64), fstat(64),
 * stat(64), lstat(64), fstatat(64), unlink, mkdir, dup, dup2, dup3,
 * fcntl(F_DUPFD, F_DUPFD_CLOEXEC, F_GETFL, F_GETFD, F_SETFD).
 *
 * A weir descriptor is a real descriptor number (a /dev/null opened
 * O_CLOEXEC holds it), so it never collides with a kernel one; dup shares
 * the open file description (offset, flags), as the kernel's does.
 * Not yet (documented in docs/architecture.md, "C library and shim"):
 * fork (a child's weir descriptors answer EBADF: its rings would be the
 * parent's), exec (weir descriptors close on exec), the readv/writev and
 * stdio families, directories (opendir), rename, mmap, locks, statx,
 * openat relative to a weir directory descriptor, and chdir into the
 * mount. Static binaries, Go binaries and raw system calls bypass any
 * LD_PRELOAD shim.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <dirent.h>
#include <grp.h>
#include <time.h>
#include <unistd.h>

#include "weir.h"

_Static_assert(sizeof(struct stat) == sizeof(struct stat64), "struct stat64 is struct stat (64-bit Linux)");

/* An open file description of weir: shared by dup'ed descriptors. */
struct desc {
	pid_t pid; /* the process whose session the handle is of */
	uint64_t handle;
	int flags; /* the open flags */
	int refs;  /* descriptors naming it; under tab_mu */
	pthread_mutex_t mu;
	uint64_t off; /* under mu */
};

#define MAX_FDS 65536
static struct desc *tab[MAX_FDS]; /* under tab_mu */
static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fs_mu = PTHREAD_MUTEX_INITIALIZER;
static weir_fs *wfs;
static pid_t wfs_pid; /* the process that dialled wfs: a forked child must not use it */

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
REAL(ssize_t, read, int, void *, size_t)
REAL(ssize_t, write, int, const void *, size_t)
REAL(ssize_t, pread, int, void *, size_t, off_t)
REAL(ssize_t, pwrite, int, const void *, size_t, off_t)
REAL(off_t, lseek, int, off_t, int)
REAL(int, fsync, int)
REAL(int, fdatasync, int)
REAL(int, ftruncate, int, off_t)
REAL(int, fstat, int, struct stat *)
REAL(int, stat, const char *, struct stat *)
REAL(int, lstat, const char *, struct stat *)
REAL(int, fstatat, int, const char *, struct stat *, int)
REAL(int, unlink, const char *)
REAL(int, unlinkat, int, const char *, int)
REAL(int, rmdir, const char *)
REAL(int, statx, int, const char *, int, unsigned int, struct statx *)
REAL(FILE *, fopen, const char *, const char *)
REAL(FILE *, fopen64, const char *, const char *)
REAL(FILE *, fdopen, int, const char *)
REAL(int, fileno, FILE *)
REAL(int, fileno_unlocked, FILE *)
REAL(int, rename, const char *, const char *)
REAL(int, renameat, int, const char *, int, const char *)
REAL(int, renameat2, int, const char *, int, const char *, unsigned int)
REAL(int, access, const char *, int)
REAL(int, euidaccess, const char *, int)
REAL(int, eaccess, const char *, int)
REAL(int, faccessat, int, const char *, int, int)
REAL(DIR *, opendir, const char *)
REAL(struct dirent *, readdir, DIR *)
REAL(struct dirent64 *, readdir64, DIR *)
REAL(int, closedir, DIR *)
REAL(int, dirfd, DIR *)
REAL(void, rewinddir, DIR *)
REAL(ssize_t, readv, int, const struct iovec *, int)
REAL(ssize_t, writev, int, const struct iovec *, int)
REAL(int, utimensat, int, const char *, const struct timespec *, int)
REAL(int, futimens, int, const struct timespec *)
REAL(ssize_t, getxattr, const char *, const char *, void *, size_t)
REAL(ssize_t, lgetxattr, const char *, const char *, void *, size_t)
REAL(ssize_t, listxattr, const char *, char *, size_t)
REAL(ssize_t, llistxattr, const char *, char *, size_t)
REAL(int, mkdir, const char *, mode_t)
REAL(int, dup, int)
REAL(int, dup2, int, int)
REAL(int, dup3, int, int, int)
REAL(int, fcntl, int, int, ...)

static int fail(int err)
{
	errno = err;
	return -1;
}

/* abs_or_cwd says whether path resolves from the cwd (AT_FDCWD) or is
 * absolute: the only *at() forms routed to weir. A NULL path (EFAULT
 * for the kernel) is not: it goes to the kernel, which answers it. */
static int abs_or_cwd(int dirfd, const char *path)
{
	const char *volatile p = path; /* (a nonnull parameter may still be NULL) */
	return p && (dirfd == AT_FDCWD || p[0] == '/');
}

/* weir_path returns the path inside weir for path (relative to the
 * kernel's cwd), in out; 0 if path is not under the mount. */
static int weir_path(const char *path, char *out, size_t cap)
{
	const char *mount = getenv("WEIR_MOUNT");
	if (!mount || !*mount)
		mount = "/weir";
	if (!path || !*path)
		return 0;
	char full[PATH_MAX * 2];
	if (path[0] == '/') {
		if (strlen(path) >= sizeof full)
			return 0;
		strcpy(full, path);
	} else {
		char cwd[PATH_MAX];
		if (!getcwd(cwd, sizeof cwd) || (size_t)snprintf(full, sizeof full, "%s/%s", cwd, path) >= sizeof full)
			return 0;
	}
	/* Lexical resolution of ".", ".." and repeated slashes. */
	char norm[PATH_MAX * 2];
	size_t n = 0;
	for (const char *p = full; *p;) {
		while (*p == '/')
			p++;
		const char *e = p;
		while (*e && *e != '/')
			e++;
		size_t len = (size_t)(e - p);
		if (len == 0)
			break;
		if (len == 1 && p[0] == '.') {
		} else if (len == 2 && p[0] == '.' && p[1] == '.') {
			while (n > 0 && norm[n - 1] != '/')
				n--;
			if (n > 0)
				n--;
		} else {
			if (n + 1 + len >= sizeof norm)
				return 0;
			norm[n++] = '/';
			memcpy(norm + n, p, len);
			n += len;
		}
		p = e;
	}
	norm[n] = 0;
	size_t m = strlen(mount);
	while (m > 1 && mount[m - 1] == '/')
		m--;
	if (strncmp(norm, mount, m) != 0 || (norm[m] != '/' && norm[m] != 0))
		return 0;
	const char *rest = norm[m] == '/' ? norm + m + 1 : ".";
	if (strlen(rest) >= cap)
		return 0;
	strcpy(out, *rest ? rest : ".");
	return 1;
}

/* fs returns the process's weir sessions, dialling them at first use. */
static weir_fs *fs(int *err)
{
	pthread_mutex_lock(&fs_mu);
	if (wfs && wfs_pid != getpid())
		wfs = NULL; /* a forked child: its rings are the parent's; dial anew */
	if (!wfs) {
		const char *run = getenv("WEIR_RUN_DIR");
		char meta[PATH_MAX], io[PATH_MAX];
		const char *ms = getenv("WEIR_META_SOCK"), *is = getenv("WEIR_IO_SOCK");
		if (!ms || !is) {
			if (!run)
				run = "/run/weir";
			snprintf(meta, sizeof meta, "%s/metadata.sock", run);
			snprintf(io, sizeof io, "%s/io.sock", run);
			ms = ms ? ms : meta;
			is = is ? is : io;
		}
		int e = weir_dial(ms, is, &wfs);
		if (e) {
			wfs = NULL;
			*err = -e;
		} else {
			wfs_pid = getpid();
		}
	}
	weir_fs *f = wfs;
	pthread_mutex_unlock(&fs_mu);
	return f;
}

/* get returns fd's description with a reference, or NULL if fd is not
 * weir's; put drops the reference. */
static struct desc *get(int fd)
{
	if (fd < 0 || fd >= MAX_FDS)
		return NULL;
	pthread_mutex_lock(&tab_mu);
	struct desc *d = tab[fd];
	if (d && d->pid != getpid())
		d = NULL; /* inherited across fork: not yet (EBADF below) */
	if (d)
		d->refs++;
	pthread_mutex_unlock(&tab_mu);
	return d;
}

static void put(struct desc *d)
{
	pthread_mutex_lock(&tab_mu);
	int last = --d->refs == 0;
	pthread_mutex_unlock(&tab_mu);
	if (last) {
		weir_fs *f = wfs;
		if (f && wfs_pid == getpid() && d->pid == wfs_pid)
			weir_close(f, d->handle);
		pthread_mutex_destroy(&d->mu);
		free(d);
	}
}

/* inherited says whether fd was weir's in a parent before a fork. */
static int inherited(int fd)
{
	if (fd < 0 || fd >= MAX_FDS)
		return 0;
	pthread_mutex_lock(&tab_mu);
	int r = tab[fd] != NULL && tab[fd]->pid != getpid();
	pthread_mutex_unlock(&tab_mu);
	return r;
}

/* install makes fd name d (one more reference), dropping what fd named. */
static void install(int fd, struct desc *d)
{
	pthread_mutex_lock(&tab_mu);
	struct desc *old = tab[fd];
	tab[fd] = d;
	if (d)
		d->refs++;
	pthread_mutex_unlock(&tab_mu);
	if (old)
		put(old);
}

/* cur_umask returns the process's umask (the kernel applies it to a
 * create; weir's service takes the mode as given, as the Go client
 * applies it too). */
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

static int wopen(const char *wpath, int flags, mode_t mode)
{
	int err = 0;
	weir_fs *f = fs(&err);
	if (!f)
		return fail(err ? err : EIO);
	if (flags & (O_DIRECTORY | O_PATH | O_TMPFILE))
		return fail(EOPNOTSUPP); /* not yet */
	uint64_t h;
	if (flags & O_CREAT)
		mode &= ~cur_umask();
	int e = weir_open(f, wpath, flags & ~O_CLOEXEC, mode & 07777, &h);
	if (e)
		return fail(-e);
	init_open();
	/* The number, never the kernel's: an O_PATH descriptor, so that a
	 * program that gets it across exec (not yet served) fails its reads
	 * and writes with EBADF instead of reading /dev/null's nothing. */
	int fd = real_open("/dev/null", O_PATH | O_CLOEXEC);
	if (fd < 0 || fd >= MAX_FDS) {
		int se = fd < 0 ? errno : EMFILE;
		if (fd >= 0) {
			init_close();
			real_close(fd);
		}
		weir_close(f, h);
		return fail(se);
	}
	struct desc *d = calloc(1, sizeof *d);
	if (!d) {
		init_close();
		real_close(fd);
		weir_close(f, h);
		return fail(ENOMEM);
	}
	d->pid = getpid();
	d->handle = h;
	d->flags = flags;
	pthread_mutex_init(&d->mu, NULL);
	install(fd, d);
	return fd;
}

static mode_t open_mode(int flags, va_list ap)
{
	return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w))
		return wopen(w, flags, mode);
	init_open();
	return real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	return open(path, flags | O_LARGEFILE, mode);
}

int __open_2(const char *path, int flags) { return open(path, flags); }
int __open64_2(const char *path, int flags) { return open(path, flags | O_LARGEFILE); }
int creat(const char *path, mode_t mode) { return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode); }

int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	char w[PATH_MAX];
	if (abs_or_cwd(dirfd, path) && weir_path(path, w, sizeof w))
		return wopen(w, flags, mode);
	init_openat();
	return real_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	return openat(dirfd, path, flags | O_LARGEFILE, mode);
}

/* own says whether fd is the shim's own (a service socket). */
static int own(int fd) { return wfs && wfs_pid == getpid() && weir_own_fd(wfs, fd); }

int close(int fd)
{
	init_close();
	if (own(fd))
		return fail(EBADF); /* not the program's: as if it were not open */
	if (fd >= 0 && fd < MAX_FDS) {
		pthread_mutex_lock(&tab_mu);
		struct desc *d = tab[fd];
		tab[fd] = NULL;
		pthread_mutex_unlock(&tab_mu);
		if (d && d->pid == getpid())
			put(d);
	}
	return real_close(fd);
}

static int readable(int flags) { return (flags & O_ACCMODE) != O_WRONLY; }
static int writable(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }

ssize_t read(int fd, void *buf, size_t n)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_read();
		return real_read(fd, buf, n);
	}
	ssize_t r;
	if (!readable(d->flags)) {
		r = -EBADF;
	} else {
		pthread_mutex_lock(&d->mu);
		r = weir_pread(wfs, d->handle, buf, n, d->off);
		if (r > 0)
			d->off += (uint64_t)r;
		pthread_mutex_unlock(&d->mu);
	}
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t write(int fd, const void *buf, size_t n)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_write();
		return real_write(fd, buf, n);
	}
	ssize_t r;
	if (!writable(d->flags)) {
		r = -EBADF;
	} else {
		pthread_mutex_lock(&d->mu);
		if (d->flags & O_APPEND) {
			uint64_t at = 0;
			r = weir_append(wfs, d->handle, buf, n, &at);
			if (r > 0)
				d->off = at + (uint64_t)r;
		} else {
			r = weir_pwrite(wfs, d->handle, buf, n, d->off);
			if (r > 0)
				d->off += (uint64_t)r;
		}
		pthread_mutex_unlock(&d->mu);
	}
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_pread();
		return real_pread(fd, buf, n, off);
	}
	ssize_t r = off < 0 ? -EINVAL : !readable(d->flags) ? -EBADF : weir_pread(wfs, d->handle, buf, n, (uint64_t)off);
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_pwrite();
		return real_pwrite(fd, buf, n, off);
	}
	/* Linux: pwrite on an O_APPEND descriptor appends (a documented bug). */
	ssize_t r = off < 0 ? -EINVAL : !writable(d->flags) ? -EBADF
		    : (d->flags & O_APPEND)                 ? weir_append(wfs, d->handle, buf, n, NULL)
							    : weir_pwrite(wfs, d->handle, buf, n, (uint64_t)off);
	put(d);
	return r < 0 ? fail((int)-r) : r;
}

ssize_t pread64(int fd, void *buf, size_t n, off64_t off) { return pread(fd, buf, n, (off_t)off); }
ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) { return pwrite(fd, buf, n, (off_t)off); }

off_t lseek(int fd, off_t off, int whence)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_lseek();
		return real_lseek(fd, off, whence);
	}
	off_t r;
	pthread_mutex_lock(&d->mu);
	int64_t base = 0;
	int e = 0;
	switch (whence) {
	case SEEK_SET:
		break;
	case SEEK_CUR:
		base = (int64_t)d->off;
		break;
	case SEEK_END: {
		struct weir_attr a;
		e = weir_fstat(wfs, d->handle, &a);
		base = a.size;
		break;
	}
	default:
		e = -EINVAL; /* SEEK_DATA and SEEK_HOLE: not yet */
	}
	if (!e && ((off < 0 && base < -(int64_t)off) || (off > 0 && base > INT64_MAX - (int64_t)off)))
		e = -EINVAL; /* before 0, or past what an offset holds (no signed overflow) */
	if (e) {
		r = fail(-e);
	} else {
		d->off = (uint64_t)(base + off);
		r = (off_t)d->off;
	}
	pthread_mutex_unlock(&d->mu);
	put(d);
	return r;
}

off64_t lseek64(int fd, off64_t off, int whence) { return lseek(fd, (off_t)off, whence); }

#define FD_CALL(name, expr)                      \
	int name(int fd)                         \
	{                                        \
		struct desc *d = get(fd);        \
		if (!d) {                        \
			if (inherited(fd))       \
				return fail(EBADF); \
			init_##name();           \
			return real_##name(fd);  \
		}                                \
		int e = (expr);                  \
		put(d);                          \
		return e ? fail(-e) : 0;         \
	}

FD_CALL(fsync, weir_fsync(wfs, d->handle))
FD_CALL(fdatasync, weir_fsync(wfs, d->handle))

int ftruncate(int fd, off_t size)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_ftruncate();
		return real_ftruncate(fd, size);
	}
	int e = size < 0 ? -EINVAL : !writable(d->flags) ? -EINVAL : weir_ftruncate(wfs, d->handle, (uint64_t)size);
	put(d);
	return e ? fail(-e) : 0;
}

int ftruncate64(int fd, off64_t size) { return ftruncate(fd, (off_t)size); }

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
	st->st_blocks = (a->size + 511) / 512;
	st->st_atim.tv_sec = a->atime / 1000000000;
	st->st_atim.tv_nsec = a->atime % 1000000000;
	st->st_mtim.tv_sec = a->mtime / 1000000000;
	st->st_mtim.tv_nsec = a->mtime % 1000000000;
	st->st_ctim.tv_sec = a->ctime / 1000000000;
	st->st_ctim.tv_nsec = a->ctime % 1000000000;
}

int fstat(int fd, struct stat *st)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_fstat();
		return real_fstat(fd, st);
	}
	struct weir_attr a;
	int e = weir_fstat(wfs, d->handle, &a);
	put(d);
	if (e)
		return fail(-e);
	fill_stat(&a, st);
	return 0;
}

/* (On 64-bit Linux struct stat64 and struct stat are one layout.) */
int fstat64(int fd, struct stat64 *st) { return fstat(fd, (struct stat *)st); }

static int wstat(const char *w, struct stat *st)
{
	int err = 0;
	weir_fs *f = fs(&err);
	if (!f)
		return fail(err ? err : EIO);
	struct weir_attr a;
	int e = weir_stat(f, w, &a);
	if (e)
		return fail(-e);
	fill_stat(&a, st);
	return 0;
}

int stat(const char *path, struct stat *st)
{
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w))
		return wstat(w, st);
	init_stat();
	return real_stat(path, st);
}

int lstat(const char *path, struct stat *st)
{
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w))
		return wstat(w, st); /* weir has no symbolic links */
	init_lstat();
	return real_lstat(path, st);
}

int stat64(const char *path, struct stat64 *st) { return stat(path, (struct stat *)st); }
int lstat64(const char *path, struct stat64 *st) { return lstat(path, (struct stat *)st); }

int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	char w[PATH_MAX];
	const char *volatile vp = path;
	if (vp && !*vp && (flags & AT_EMPTY_PATH))
		return fstat(dirfd, st);
	if (abs_or_cwd(dirfd, path) && weir_path(path, w, sizeof w))
		return wstat(w, st);
	init_fstatat();
	return real_fstatat(dirfd, path, st, flags);
}

int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) { return fstatat(dirfd, path, (struct stat *)st, flags); }

int unlink(const char *path)
{
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w)) {
		int err = 0;
		weir_fs *f = fs(&err);
		if (!f)
			return fail(err ? err : EIO);
		int e = weir_unlink(f, w);
		return e ? fail(-e) : 0;
	}
	init_unlink();
	return real_unlink(path);
}

int mkdir(const char *path, mode_t mode)
{
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w)) {
		int err = 0;
		weir_fs *f = fs(&err);
		if (!f)
			return fail(err ? err : EIO);
		int e = weir_mkdir(f, w, mode & 07777 & ~cur_umask());
		return e ? fail(-e) : 0;
	}
	init_mkdir();
	return real_mkdir(path, mode);
}

/* dup_to makes newfd (a real descriptor the kernel just made a copy of
 * oldfd's) share oldfd's weir description, if it has one. */
static int dup_to(int oldfd, int newfd)
{
	if (newfd < 0)
		return newfd;
	struct desc *d = get(oldfd);
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
	if (inherited(fd) || own(fd))
		return fail(EBADF);
	init_dup();
	return dup_to(fd, real_dup(fd));
}

int dup2(int oldfd, int newfd)
{
	if (inherited(oldfd) || own(oldfd))
		return fail(EBADF);
	if (own(newfd))
		return fail(EBUSY); /* the shim's socket sits there (not yet moved away) */
	init_dup2();
	if (oldfd == newfd)
		return real_dup2(oldfd, newfd);
	return dup_to(oldfd, real_dup2(oldfd, newfd));
}

int dup3(int oldfd, int newfd, int flags)
{
	if (inherited(oldfd) || own(oldfd))
		return fail(EBADF);
	if (own(newfd))
		return fail(EBUSY);
	init_dup3();
	return dup_to(oldfd, real_dup3(oldfd, newfd, flags));
}

int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	init_fcntl();
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		return real_fcntl(fd, cmd, arg);
	}
	int r;
	switch (cmd) {
	case F_DUPFD:
	case F_DUPFD_CLOEXEC:
		r = dup_to(fd, real_fcntl(fd, cmd, arg));
		break;
	case F_GETFL:
		r = d->flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC | O_CLOEXEC);
		break;
	case F_GETFD:
	case F_SETFD:
		r = real_fcntl(fd, cmd, arg); /* the descriptor's own flag */
		break;
	default:
		r = fail(EINVAL); /* F_SETFL, locks: not yet */
	}
	put(d);
	return r;
}

int rmdir(const char *path)
{
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w)) {
		int err = 0;
		weir_fs *f = fs(&err);
		if (!f)
			return fail(err ? err : EIO);
		int e = weir_rmdir(f, w);
		return e ? fail(-e) : 0;
	}
	init_rmdir();
	return real_rmdir(path);
}

int unlinkat(int dirfd, const char *path, int flags)
{
	char w[PATH_MAX];
	if (abs_or_cwd(dirfd, path) && weir_path(path, w, sizeof w))
		return (flags & AT_REMOVEDIR) ? rmdir(path) : unlink(path);
	init_unlinkat();
	return real_unlinkat(dirfd, path, flags);
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
	sx->stx_blocks = ((uint64_t)a->size + 511) / 512;
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
	char w[PATH_MAX];
	struct weir_attr a;
	int e = 1; /* not weir's */
	const char *volatile vp = path;
	if (vp && !*vp && (flags & AT_EMPTY_PATH)) {
		struct desc *d = get(dirfd);
		if (d) {
			e = weir_fstat(wfs, d->handle, &a);
			put(d);
		} else if (inherited(dirfd)) {
			return fail(EBADF);
		}
	} else if (abs_or_cwd(dirfd, path) && weir_path(path, w, sizeof w)) {
		int err = 0;
		weir_fs *f = fs(&err);
		if (!f)
			return fail(err ? err : EIO);
		e = weir_stat(f, w, &a);
	}
	if (e == 1) {
		init_statx();
		return real_statx(dirfd, path, flags, mask, sx);
	}
	if (e)
		return fail(-e);
	fill_statx(&a, sx);
	return 0;
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

static FILE *wfopen(const char *path, const char *mode)
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
	int fd = open(path, flags, 0666);
	if (fd < 0)
		return NULL;
	cookie_io_functions_t io = {.read = ck_read, .write = ck_write, .seek = ck_seek, .close = ck_close};
	FILE *f = track(fopencookie((void *)(intptr_t)fd, mode, io), fd);
	if (!f) {
		int e = errno;
		close(fd);
		errno = e;
	}
	return f;
}

FILE *fopen(const char *path, const char *mode)
{
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w))
		return wfopen(path, mode);
	init_fopen();
	return real_fopen(path, mode);
}

FILE *fopen64(const char *path, const char *mode)
{
	char w[PATH_MAX];
	if (weir_path(path, w, sizeof w))
		return wfopen(path, mode);
	init_fopen64();
	return real_fopen64(path, mode);
}

/* Extended attributes: weir has none (ENOTSUP, which ls and cp take as
 * "no ACL, no label"). */
#define NO_XATTR(name, ...)                                   \
	ssize_t name(const char *path, __VA_ARGS__)           \
	{                                                     \
		char w[PATH_MAX];                             \
		if (weir_path(path, w, sizeof w))             \
			return fail(ENOTSUP);                 \
		init_##name();                                \
		return real_##name(path, XATTR_ARGS_##name);  \
	}
#define XATTR_ARGS_getxattr n, v, s
#define XATTR_ARGS_lgetxattr n, v, s
#define XATTR_ARGS_listxattr l, s
#define XATTR_ARGS_llistxattr l, s
NO_XATTR(getxattr, const char *n, void *v, size_t s)
NO_XATTR(lgetxattr, const char *n, void *v, size_t s)
NO_XATTR(listxattr, char *l, size_t s)
NO_XATTR(llistxattr, char *l, size_t s)

static int get_is_weir(int fd)
{
	struct desc *d = get(fd);
	if (d)
		put(d);
	return d != NULL;
}

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
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_futimens();
		return real_futimens(fd, times);
	}
	int e = bad_times(times) ? -EINVAL : weir_futimens(wfs, d->handle, ns(times, 0), ns(times, 1));
	put(d);
	return e ? fail(-e) : 0;
}

int utimensat(int dirfd, const char *path, const struct timespec times[2], int flags)
{
	char w[PATH_MAX];
	const char *volatile vp = path;
	if (!vp && get_is_weir(dirfd))
		return futimens(dirfd, times); /* Linux's futimens form */
	if (abs_or_cwd(dirfd, path) && weir_path(path, w, sizeof w)) {
		if (bad_times(times))
			return fail(EINVAL);
		int err = 0;
		weir_fs *f = fs(&err);
		if (!f)
			return fail(err ? err : EIO);
		int e = weir_utimens(f, w, ns(times, 0), ns(times, 1));
		return e ? fail(-e) : 0;
	}
	init_utimensat();
	return real_utimensat(dirfd, path, times, flags);
}

int rename(const char *oldpath, const char *newpath)
{
	char a[PATH_MAX], b[PATH_MAX];
	int wa = weir_path(oldpath, a, sizeof a), wb = weir_path(newpath, b, sizeof b);
	if (wa != wb)
		return fail(EXDEV); /* between weir and the kernel: another file system */
	if (wa) {
		int err = 0;
		weir_fs *f = fs(&err);
		if (!f)
			return fail(err ? err : EIO);
		int e = weir_rename(f, a, b);
		return e ? fail(-e) : 0;
	}
	init_rename();
	return real_rename(oldpath, newpath);
}

static int at_weir(int dirfd, const char *path)
{
	char w[PATH_MAX];
	return abs_or_cwd(dirfd, path) && weir_path(path, w, sizeof w);
}

int renameat2(int olddir, const char *oldpath, int newdir, const char *newpath, unsigned int flags)
{
	int wa = at_weir(olddir, oldpath), wb = at_weir(newdir, newpath);
	if (wa || wb) {
		if (flags)
			return fail(EINVAL); /* RENAME_NOREPLACE, RENAME_EXCHANGE: not yet */
		return rename(oldpath, newpath);
	}
	init_renameat2();
	return real_renameat2(olddir, oldpath, newdir, newpath, flags);
}

int renameat(int olddir, const char *oldpath, int newdir, const char *newpath)
{
	if (at_weir(olddir, oldpath) || at_weir(newdir, newpath))
		return renameat2(olddir, oldpath, newdir, newpath, 0);
	init_renameat();
	return real_renameat(olddir, oldpath, newdir, newpath);
}

/* waccess is access(2) from the attributes: the real uid and gid, as the
 * kernel checks (root passes but for X on a file with no x bit). */
static int waccess(const char *w, int mode)
{
	int err = 0;
	weir_fs *f = fs(&err);
	if (!f)
		return fail(err ? err : EIO);
	struct weir_attr a;
	int e = weir_stat(f, w, &a);
	if (e)
		return fail(-e);
	if (mode == F_OK)
		return 0;
	uid_t uid = getuid();
	if (uid == 0)
		return (mode & X_OK) && !S_ISDIR(a.mode) && !(a.mode & 0111) ? fail(EACCES) : 0;
	unsigned bits;
	if (a.uid == uid) {
		bits = a.mode >> 6 & 7;
	} else {
		int in = a.gid == getgid();
		gid_t gs[256];
		int n = getgroups(256, gs);
		for (int i = 0; !in && i < n; i++)
			in = gs[i] == a.gid;
		bits = in ? a.mode >> 3 & 7 : a.mode & 7;
	}
	unsigned want = (mode & R_OK ? 4 : 0) | (mode & W_OK ? 2 : 0) | (mode & X_OK ? 1 : 0);
	return (want & ~bits) ? fail(EACCES) : 0;
}

/* access, euidaccess and eaccess: one check for a weir path (the real
 * ids are the effective ones here), the kernel's otherwise. */
#define ACCESS(name)                                   \
	int name(const char *path, int mode)           \
	{                                              \
		char w[PATH_MAX];                      \
		if (weir_path(path, w, sizeof w))      \
			return waccess(w, mode);       \
		init_##name();                         \
		return real_##name(path, mode);        \
	}
ACCESS(access)
ACCESS(euidaccess)
ACCESS(eaccess)

int faccessat(int dirfd, const char *path, int mode, int flags)
{
	char w[PATH_MAX];
	if (abs_or_cwd(dirfd, path) && weir_path(path, w, sizeof w))
		return waccess(w, mode); /* (AT_EACCESS: the effective ids are the real ones here) */
	init_faccessat();
	return real_faccessat(dirfd, path, mode, flags);
}

/* A weir directory stream: the whole listing, read at opendir (a
 * snapshot, as getdents of a directory that changes may give). Told
 * from glibc's own streams by its magic word. */
#define WDIR_MAGIC 0x52494457u /* "WDIR" */
struct wdir {
	uint32_t magic;
	int err; /* a listing that could not be kept whole */
	size_t n, next, cap;
	struct dirent64 *ents;
	struct dirent de; /* the last one readdir returned */
};

static int wdir_add(void *arg, const char *name, uint64_t ino, uint32_t type)
{
	struct wdir *d = arg;
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 64;
		struct dirent64 *e = realloc(d->ents, cap * sizeof *e);
		if (!e) {
			d->err = ENOMEM;
			return 1;
		}
		d->ents = e;
		d->cap = cap;
	}
	struct dirent64 *e = &d->ents[d->n++];
	memset(e, 0, sizeof *e);
	e->d_ino = ino;
	e->d_off = (off64_t)d->n;
	e->d_reclen = sizeof *e;
	e->d_type = S_ISDIR(type) ? DT_DIR : DT_REG;
	snprintf(e->d_name, sizeof e->d_name, "%s", name);
	return 0;
}

static struct wdir *as_wdir(DIR *d) { return d && ((struct wdir *)(void *)d)->magic == WDIR_MAGIC ? (struct wdir *)(void *)d : NULL; }

DIR *opendir(const char *path)
{
	char w[PATH_MAX];
	if (!weir_path(path, w, sizeof w)) {
		init_opendir();
		return real_opendir(path);
	}
	int err = 0;
	weir_fs *f = fs(&err);
	if (!f) {
		errno = err ? err : EIO;
		return NULL;
	}
	struct wdir *d = calloc(1, sizeof *d);
	if (!d) {
		errno = ENOMEM;
		return NULL;
	}
	d->magic = WDIR_MAGIC;
	/* "." and "..", as getdents gives them (weir lists neither). */
	wdir_add(d, ".", 0, S_IFDIR);
	wdir_add(d, "..", 0, S_IFDIR);
	int e = weir_readdir(f, w, wdir_add, d);
	if (!e && d->err)
		e = -d->err; /* never a listing with entries missing */
	if (e) {
		free(d->ents);
		free(d);
		errno = -e;
		return NULL;
	}
	return (DIR *)(void *)d;
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
	free(d->ents);
	free(d);
	return 0;
}

void rewinddir(DIR *dir)
{
	struct wdir *d = as_wdir(dir);
	if (!d) {
		init_rewinddir();
		real_rewinddir(dir);
		return;
	}
	d->next = 0;
}

int dirfd(DIR *dir)
{
	if (as_wdir(dir))
		return fail(ENOTSUP); /* no descriptor behind a weir stream (not yet) */
	init_dirfd();
	return real_dirfd(dir);
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_readv();
		return real_readv(fd, iov, n);
	}
	put(d);
	ssize_t total = 0;
	for (int i = 0; i < n; i++) {
		ssize_t r = read(fd, iov[i].iov_base, iov[i].iov_len);
		if (r < 0)
			return total ? total : r;
		total += r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return total;
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd))
			return fail(EBADF);
		init_writev();
		return real_writev(fd, iov, n);
	}
	put(d);
	/* One write of the whole vector where it fits one request, so that an
	 * O_APPEND writev stays one atomic append. */
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
			ssize_t r = write(fd, b, sum);
			int e = errno;
			free(b);
			errno = e;
			return r;
		}
	}
	ssize_t total = 0;
	for (int i = 0; i < n; i++) {
		ssize_t r = write(fd, iov[i].iov_base, iov[i].iov_len);
		if (r < 0)
			return total ? total : r;
		total += r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return total;
}

FILE *fdopen(int fd, const char *mode)
{
	struct desc *d = get(fd);
	if (!d) {
		if (inherited(fd)) {
			errno = EBADF;
			return NULL;
		}
		init_fdopen();
		return real_fdopen(fd, mode);
	}
	put(d);
	/* The stream owns fd from here: its fclose closes it. */
	cookie_io_functions_t io = {.read = ck_read, .write = ck_write, .seek = ck_seek, .close = ck_close};
	return track(fopencookie((void *)(intptr_t)fd, mode, io), fd);
}

/* fork: the child must not use its parent's sessions (their rings are
 * shared memory; a request of the child's would be the parent's), and no
 * lock of the shim may be left held by a thread the child does not have.
 * The child keeps its parent's weir descriptors as numbers that answer
 * EBADF (not yet shared: issue 11) and dials sessions of its own at its
 * first weir call. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&fs_mu);
	pthread_mutex_lock(&tab_mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&tab_mu);
	pthread_mutex_unlock(&fs_mu);
}

static void fork_child(void)
{
	wfs = NULL; /* (its mappings and sockets stay, unused, until exec or exit) */
	pthread_mutex_unlock(&tab_mu);
	pthread_mutex_unlock(&fs_mu);
}

__attribute__((constructor)) static void shim_init(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}
