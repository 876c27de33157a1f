/* Write windows under threads and fork (run under the shim by
 * client/c/ctest): four threads overwrite their own pages of one file
 * round after round through one descriptor, while a fifth fdatasyncs, a
 * sixth reads, and a seventh writes its own pages through a descriptor of
 * its own that it closes and opens again (a window's release beside the
 * others' stores); a forked child writes pages of its own through its own
 * session. "write" leaves every page with its writer's last round;
 * "verify" checks that, and is run again after a restart of the services. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

#define PAGES 1536 /* three windows */
#define ROUNDS 12
#define WRITERS 4
#define OWN 5      /* the thread with a descriptor of its own: pages % 8 == 5 */
#define CHILD 6    /* the forked child's: pages % 8 == 6 (and 7: untouched) */
#define MARK 24

static const char *path;
static int fd;
static volatile int done;

/* The mark of page p as its writer leaves it at round r. */
static void mark(char *b, int p, int r) { snprintf(b, MARK + 1, "page %05u round %03u ...", (unsigned)p % 100000u, (unsigned)r % 1000u); }

/* owner is the writer of page p: a thread (0-3), OWN, CHILD or -1. */
static int owner(int p)
{
	int k = p % 8;
	return k < WRITERS ? k : k == OWN || k == CHILD ? k : -1;
}

static void *writer(void *arg)
{
	int t = (int)(long)arg;
	char b[MARK + 1];
	for (int r = 0; r < ROUNDS; r++)
		for (int p = t; p < PAGES; p += 8) {
			mark(b, p, r);
			CHECK(pwrite(fd, b, MARK, (off_t)p * 4096 + 100) == MARK, "thread %d: pwrite of page %d: %m", t, p);
		}
	return NULL;
}

static void *own(void *arg)
{
	(void)arg;
	char b[MARK + 1];
	for (int r = 0; r < ROUNDS; r++) {
		int f = open(path, O_RDWR);
		CHECK(f >= 0, "open: %m");
		for (int p = OWN; p < PAGES; p += 8) {
			mark(b, p, r);
			CHECK(pwrite(f, b, MARK, (off_t)p * 4096 + 100) == MARK, "own descriptor: pwrite of page %d: %m", p);
		}
		CHECK(close(f) == 0, "close: %m");
	}
	return NULL;
}

static void *syncer(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE))
		CHECK(fdatasync(fd) == 0, "fdatasync: %m");
	return NULL;
}

static void *reader(void *arg)
{
	(void)arg;
	char b[MARK];
	unsigned x = 1;
	while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
		x = x * 1103515245 + 12345;
		int p = (int)(x >> 8) % PAGES;
		CHECK(pread(fd, b, MARK, (off_t)p * 4096 + 100) == MARK, "pread of page %d: %m", p);
		/* Zeros before its first store, a mark after; the page number
		 * is the same in every round, so a read racing a store (which
		 * may see part of each, as on Linux) still shows it whole once
		 * its ten bytes are there: any other number is a store that
		 * landed on the wrong page. */
		char want[MARK + 1];
		mark(want, p, 0);
		if (memchr(b, 0, 10) == NULL)
			CHECK(memcmp(b, want, 10) == 0 && owner(p) >= 0, "page %d reads %.24s", p, b);
	}
	return NULL;
}

static int verify(void)
{
	int f = open(path, O_RDONLY);
	CHECK(f >= 0, "open %s: %m", path);
	char got[MARK], want[MARK + 1], blank[MARK];
	memset(blank, 0, sizeof blank);
	for (int p = 0; p < PAGES; p++) {
		CHECK(pread(f, got, MARK, (off_t)p * 4096 + 100) == MARK, "pread of page %d: %m", p);
		if (owner(p) < 0) {
			CHECK(memcmp(got, blank, MARK) == 0, "page %d, written by nobody, reads %.24s", p, got);
			continue;
		}
		mark(want, p, ROUNDS - 1);
		CHECK(memcmp(got, want, MARK) == 0, "page %d reads %.24s, want %.24s", p, got, want);
	}
	close(f);
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc == 3, "usage: test_windows write|verify PATH");
	path = argv[2];
	if (strcmp(argv[1], "verify") == 0) {
		verify();
		printf("ok\n");
		return 0;
	}
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0, "create %s: %m", path);
	CHECK(ftruncate(fd, (off_t)PAGES * 4096) == 0, "ftruncate: %m");
	pid_t child = fork();
	CHECK(child >= 0, "fork: %m");
	if (child == 0) {
		/* The parent's descriptor, in a session of the child's own. */
		char b[MARK + 1];
		for (int r = 0; r < ROUNDS; r++)
			for (int p = CHILD; p < PAGES; p += 8) {
				mark(b, p, r);
				CHECK(pwrite(fd, b, MARK, (off_t)p * 4096 + 100) == MARK, "child: pwrite of page %d: %m", p);
			}
		_exit(0);
	}
	pthread_t th[WRITERS + 3];
	for (long t = 0; t < WRITERS; t++)
		CHECK(pthread_create(&th[t], NULL, writer, (void *)t) == 0, "pthread_create");
	CHECK(pthread_create(&th[WRITERS], NULL, own, NULL) == 0, "pthread_create");
	CHECK(pthread_create(&th[WRITERS + 1], NULL, syncer, NULL) == 0, "pthread_create");
	CHECK(pthread_create(&th[WRITERS + 2], NULL, reader, NULL) == 0, "pthread_create");
	for (int t = 0; t <= WRITERS; t++)
		pthread_join(th[t], NULL);
	__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
	pthread_join(th[WRITERS + 1], NULL);
	pthread_join(th[WRITERS + 2], NULL);
	int st;
	CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed: %#x", st);
	verify();
	CHECK(fsync(fd) == 0, "fsync: %m");
	CHECK(close(fd) == 0, "close: %m");
	printf("ok\n");
	return 0;
}
