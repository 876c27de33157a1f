/* test_openat2: openat2's RESOLVE_* flags on a tree with a symbolic
 * link, printed one result a line, so that the same run against a kernel
 * directory and a weir one can be compared (ctest.TestShimOpenat2). It
 * knows nothing of weir: the shim serves it. argv[1]: the directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void try(const char *what, int dirfd, const char *path, unsigned long long resolve)
{
	struct open_how how = {.flags = O_RDONLY, .resolve = resolve};
	long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
	printf("%s: %s\n", what, fd >= 0 ? "ok" : strerror(errno));
	if (fd >= 0)
		close((int)fd);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	char p[4096];
	snprintf(p, sizeof p, "%s/d", argv[1]);
	if (mkdir(p, 0755) != 0)
		return 3;
	snprintf(p, sizeof p, "%s/d/f", argv[1]);
	int fd = open(p, O_CREAT | O_WRONLY, 0644);
	if (fd < 0)
		return 4;
	close(fd);
	snprintf(p, sizeof p, "%s/l", argv[1]);
	if (symlink("d", p) != 0)
		return 5;
	int dir = open(argv[1], O_RDONLY | O_DIRECTORY);
	if (dir < 0)
		return 6;
	try("plain through a link", dir, "l/f", 0);
	try("no symlinks, through a link", dir, "l/f", RESOLVE_NO_SYMLINKS);
	try("no symlinks, no link", dir, "d/f", RESOLVE_NO_SYMLINKS);
	try("beneath, no link", dir, "d/f", RESOLVE_BENEATH);
	try("beneath, ..", dir, "d/../../x", RESOLVE_BENEATH);
	try("beneath, absolute", dir, "/etc/passwd", RESOLVE_BENEATH);
	try("no xdev, no link", dir, "d/f", RESOLVE_NO_XDEV);
	return 0;
}
