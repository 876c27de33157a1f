/*
 * libweir's first C test (driven by client/c/ctest): a session, files
 * written and read back across the chunk size, fsync, stat, unlink (and
 * fstat and fsync of a handle open across it), errors as negated errnos,
 * and threads sharing one weir_fs.
 * Sockets from WEIR_META_SOCK and WEIR_IO_SOCK. Exit 0 and "ok" on success.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "weir.h"

#include "test.h"

static weir_fs *fs;

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 31 + seed + (i >> 12));
}

/* roundtrip writes n bytes to name, reads them back and checks them. */
static void roundtrip(const char *name, size_t n, unsigned seed)
{
	unsigned char *w = malloc(n), *r = malloc(n + 16);
	CHECK(w && r, "malloc");
	fill(w, n, seed);
	uint64_t h;
	int err = weir_open(fs, name, O_RDWR | O_CREAT | O_TRUNC, 0644, &h, NULL, NULL);
	CHECK(err == 0, "open %s: %s", name, strerror(-err));
	ssize_t got = weir_pwrite(fs, h, w, n, 0, 0);
	CHECK(got == (ssize_t)n, "pwrite %s: %zd of %zu", name, got, n);
	err = weir_fsync(fs, h);
	CHECK(err == 0, "fsync %s: %s", name, strerror(-err));
	err = weir_close(fs, h);
	CHECK(err == 0, "close %s: %s", name, strerror(-err));
	struct weir_attr a;
	err = weir_stat(fs, name, &a);
	CHECK(err == 0 && a.size == (int64_t)n && (a.mode & S_IFMT) == S_IFREG && (a.mode & 07777) == 0644,
	      "stat %s: %d, size %lld mode %o", name, err, (long long)a.size, a.mode);
	err = weir_open(fs, name, O_RDONLY, 0, &h, NULL, NULL);
	CHECK(err == 0, "open %s read-only: %s", name, strerror(-err));
	got = weir_pread(fs, h, r, n + 16, 0, 0);
	CHECK(got == (ssize_t)n, "pread %s: %zd, want %zu (short at the end)", name, got, n);
	CHECK(memcmp(w, r, n) == 0, "%s: the bytes read differ from those written", name);
	got = weir_pread(fs, h, r, 16, n, 0);
	CHECK(got == 0, "pread at the end of %s: %zd, want 0", name, got);
	got = weir_pwrite(fs, h, w, 16, 0, 0);
	CHECK(got == -EBADF, "pwrite on a read-only handle: %zd, want -EBADF", got);
	weir_close(fs, h);
	free(w);
	free(r);
}

static void *worker(void *arg)
{
	char name[64];
	long i = (long)arg;
	snprintf(name, sizeof name, "c/thread-%ld", i);
	for (int k = 0; k < 5; k++)
		roundtrip(name, 64 * 1024 + (size_t)k * 4099, (unsigned)(i * 10 + k));
	return NULL;
}

int main(void)
{
	const char *meta = getenv("WEIR_META_SOCK"), *io = getenv("WEIR_IO_SOCK");
	CHECK(meta && io, "WEIR_META_SOCK and WEIR_IO_SOCK must name the services' sockets");
	/* A dial that fails closes nothing of the program's (fd 0 included). */
	CHECK(fcntl(0, F_GETFD) >= 0, "fd 0 is not open to begin with");
	weir_fs *none;
	int err = weir_dial("/nonexistent/metadata.sock", io, &none);
	CHECK(err == -ENOENT, "dial of a missing socket: %d, want -ENOENT", err);
	err = weir_dial(meta, "/nonexistent/io.sock", &none);
	CHECK(err == -ENOENT, "dial of a missing io socket: %d, want -ENOENT", err);
	CHECK(fcntl(0, F_GETFD) >= 0, "a failed dial closed fd 0");
	err = weir_dial(meta, io, &fs);
	CHECK(err == 0, "dial: %s", strerror(-err));
	err = weir_mkdir(fs, "c", 0755);
	CHECK(err == 0, "mkdir: %s", strerror(-err));
	err = weir_mkdir(fs, "c", 0755);
	CHECK(err == -EEXIST, "mkdir again: %d, want -EEXIST", err);
	roundtrip("c/small", 5, 1);
	roundtrip("c/big", 3 * (1u << 20) + 12345, 2); /* past one request's chunk */
	uint64_t h;
	err = weir_open(fs, "c/none", O_RDONLY, 0, &h, NULL, NULL);
	CHECK(err == -ENOENT, "open of a missing file: %d, want -ENOENT", err);
	err = weir_unlink(fs, "c/small");
	CHECK(err == 0, "unlink: %s", strerror(-err));
	struct weir_attr a;
	err = weir_stat(fs, "c/small", &a);
	CHECK(err == -ENOENT, "stat after unlink: %d, want -ENOENT", err);
	/* A read-only descriptor outlives its name, as on Linux: fstat gives
	 * the size, fsync succeeds. */
	roundtrip("c/gone", 4099, 3);
	err = weir_open(fs, "c/gone", O_RDONLY, 0, &h, NULL, NULL);
	CHECK(err == 0, "open c/gone read-only: %s", strerror(-err));
	err = weir_unlink(fs, "c/gone");
	CHECK(err == 0, "unlink c/gone: %s", strerror(-err));
	err = weir_fstat(fs, h, &a);
	CHECK(err == 0 && a.size == 4099, "fstat after unlink: %d, size %lld", err, (long long)a.size);
	err = weir_fsync(fs, h);
	CHECK(err == 0, "fsync of a read-only handle after unlink: %s", strerror(-err));
	weir_close(fs, h);
	pthread_t t[4];
	for (long i = 0; i < 4; i++)
		CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0, "pthread_create");
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	weir_fs_close(fs);
	printf("ok\n");
	return 0;
}
