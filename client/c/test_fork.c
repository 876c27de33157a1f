/*
 * Run under libweir-preload.so (client/c/ctest): weir descriptors behave
 * as the kernel's across fork and exec. A forked child shares its
 * parent's open file descriptions (offset and flags), an unlinked file's
 * too; a descriptor without FD_CLOEXEC survives exec, one with it does
 * not, and a failed exec loses nothing; a child of vfork changes none of
 * the parent's; a cwd inside weir survives exec.
 * Exit 0 and "ok" on success.
 *
 *	test_fork            the parent's part
 *	test_fork exec FD    the part run after exec, with FD inherited
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static void wait_ok(pid_t pid, const char *what)
{
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed (status %#x)", what, st);
}

/* after_exec: FD is "parentchild" with the offset at its end; the
 * close-on-exec descriptor 100 is gone; the cwd is /weir/cwd. */
static int after_exec(int fd)
{
	CHECK(lseek(fd, 0, SEEK_CUR) == 11, "offset after exec: %ld", (long)lseek(fd, 0, SEEK_CUR));
	CHECK(write(fd, "+exec", 5) == 5, "write after exec: %s", strerror(errno));
	char b[32] = {0};
	CHECK(pread(fd, b, sizeof b, 0) == 16 && memcmp(b, "parentchild+exec", 16) == 0, "read after exec: %s", b);
	errno = 0;
	CHECK(fcntl(100, F_GETFD) == -1 && errno == EBADF, "the O_CLOEXEC descriptor survived exec");
	char cwd[256];
	CHECK(getcwd(cwd, sizeof cwd) && strcmp(cwd, "/weir/cwd") == 0, "cwd after exec: %s", cwd);
	int r = open("rel", O_RDONLY);
	CHECK(r >= 0 && read(r, b, 3) == 3 && memcmp(b, "rel", 3) == 0, "relative open after exec: %s", strerror(errno));
	close(r);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "exec") == 0)
		return after_exec(atoi(argv[2]));

	int fd = open("/weir/fork-parent", O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0, "open: %s", strerror(errno));
	CHECK(write(fd, "parent", 6) == 6, "write: %s", strerror(errno));
	int gone = open("/weir/fork-gone", O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(gone >= 0 && write(gone, "held", 4) == 4 && unlink("/weir/fork-gone") == 0, "unlinked file: %s", strerror(errno));
	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		/* The shared offset is at 6: the child's write goes on from there. */
		char b[8] = {0};
		CHECK(read(fd, b, sizeof b) == 0, "child's read at the shared offset");
		CHECK(write(fd, "child", 5) == 5, "child's write: %s", strerror(errno));
		CHECK(pread(gone, b, 4, 0) == 4 && memcmp(b, "held", 4) == 0, "child's read of the unlinked file: %s", strerror(errno));
		int d = dup(fd);
		CHECK(d >= 0 && lseek(d, 0, SEEK_CUR) == 11, "child's dup shares the offset");
		int c = open("/weir/fork-child", O_RDWR | O_CREAT | O_TRUNC, 0644);
		CHECK(c >= 0 && write(c, "own", 3) == 3, "child's own open: %s", strerror(errno));
		_exit(0);
	}
	wait_ok(pid, "child");
	CHECK(lseek(fd, 0, SEEK_CUR) == 11, "the parent's offset after the child's write: %ld", (long)lseek(fd, 0, SEEK_CUR));
	char b[32] = {0};
	CHECK(pread(fd, b, 11, 0) == 11 && memcmp(b, "parentchild", 11) == 0, "the parent reads %s", b);

	/* A child of vfork shares the parent's memory until it execs: its
	 * close of a weir descriptor is its own (the parent keeps it). */
	pid_t vp = vfork();
	CHECK(vp >= 0, "vfork: %s", strerror(errno));
	if (vp == 0) {
		close(fd);
		close(gone);
		execl("/bin/true", "true", (char *)NULL);
		_exit(1);
	}
	wait_ok(vp, "vfork child");
	CHECK(pread(fd, b, 6, 0) == 6 && memcmp(b, "parent", 6) == 0, "read after a vfork child closed it: %s", strerror(errno));

	/* A failed exec loses nothing. */
	errno = 0;
	char *none[] = {"/weir-none/x", NULL};
	CHECK(execv(none[0], none) == -1 && errno == ENOENT, "exec of a missing program");
	CHECK(pread(fd, b, 6, 0) == 6, "read after a failed exec: %s", strerror(errno));

	/* Exec: fd survives, a close-on-exec one does not, the cwd does. */
	int ce = open("/weir/fork-parent", O_RDONLY | O_CLOEXEC);
	CHECK(ce >= 0 && dup3(ce, 100, O_CLOEXEC) == 100, "close-on-exec descriptor: %s", strerror(errno));
	CHECK(mkdir("/weir/cwd", 0755) == 0 && chdir("/weir/cwd") == 0, "chdir: %s", strerror(errno));
	int r = open("rel", O_WRONLY | O_CREAT, 0644);
	CHECK(r >= 0 && write(r, "rel", 3) == 3 && close(r) == 0, "relative create: %s", strerror(errno));
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		char n[16];
		snprintf(n, sizeof n, "%d", fd);
		char *args[] = {argv[0][0] == '/' ? argv[0] : "/proc/self/exe", "exec", n, NULL};
		execv("/proc/self/exe", args);
		fprintf(stderr, "exec: %s\n", strerror(errno));
		_exit(1);
	}
	wait_ok(pid, "exec'd child");
	CHECK(lseek(fd, 0, SEEK_CUR) == 16, "offset after the exec'd child wrote");
	CHECK(close(fd) == 0 && close(gone) == 0 && close(ce) == 0 && close(100) == 0, "close");
	int c = open("/weir/fork-child", O_RDONLY);
	CHECK(c >= 0 && read(c, b, 3) == 3 && memcmp(b, "own", 3) == 0, "the child's file from the parent");
	close(c);

	/* stdout onto a weir file: what stdio held for the old descriptor is
	 * written there first; fclose(stdout) closes the weir file once. */
	printf("before\n");
	int o = open("/weir/stdout", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int saved = dup(1);
	CHECK(o >= 0 && saved >= 0 && dup2(o, 1) == 1 && close(o) == 0, "stdout onto a weir file: %s", strerror(errno));
	printf("into weir\n");
	CHECK(fclose(stdout) == 0, "fclose(stdout): %s", strerror(errno));
	char sb[32] = {0};
	c = open("/weir/stdout", O_RDONLY);
	CHECK(c >= 0 && read(c, sb, sizeof sb) == 10 && strcmp(sb, "into weir\n") == 0, "the weir stdout holds %s", sb);
	close(c);
	CHECK(write(saved, "ok\n", 3) == 3, "write");
	return 0;
}
