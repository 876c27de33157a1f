/*
 * Run under libweir-preload.so (client/c/ctest): a child of fork has
 * sessions of its own; the weir descriptors it inherited answer EBADF
 * (sharing them with the parent is not built yet), and the parent's
 * keep working after the child used weir. Exit 0 and "ok" on success.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

int main(void)
{
	int fd = open("/weir/fork-parent", O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0, "open: %s", strerror(errno));
	CHECK(write(fd, "parent", 6) == 6, "write: %s", strerror(errno));
	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		char b[8];
		errno = 0;
		CHECK(pread(fd, b, sizeof b, 0) == -1 && errno == EBADF, "child's read of an inherited weir fd: errno %d, want EBADF", errno);
		int c = open("/weir/fork-child", O_RDWR | O_CREAT | O_TRUNC, 0644);
		CHECK(c >= 0, "child's open: %s", strerror(errno));
		CHECK(write(c, "child", 5) == 5, "child's write: %s", strerror(errno));
		CHECK(pread(c, b, 5, 0) == 5 && memcmp(b, "child", 5) == 0, "child's read back");
		/* With sessions of its own now, still not the parent's descriptor. */
		errno = 0;
		CHECK(write(fd, "x", 1) == -1 && errno == EBADF, "child's write to an inherited weir fd: errno %d, want EBADF", errno);
		CHECK(close(c) == 0, "child's close");
		CHECK(close(fd) == 0, "child's close of the inherited fd");
		_exit(0);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
	char b[8] = {0};
	CHECK(pread(fd, b, 6, 0) == 6 && memcmp(b, "parent", 6) == 0, "parent's read after the child: %s", strerror(errno));
	CHECK(write(fd, "+", 1) == 1, "parent's write after the child: %s", strerror(errno));
	CHECK(close(fd) == 0, "close");
	int c = open("/weir/fork-child", O_RDONLY);
	CHECK(c >= 0 && read(c, b, 5) == 5 && memcmp(b, "child", 5) == 0, "the child's file from the parent");
	close(c);
	printf("ok\n");
	return 0;
}
