/* test_mmap_refused: a MAP_SHARED mmap of a weir file that io refuses
 * (past the session's pin limit: ENOMEM) is the process's first mmap of a
 * weir file and it has called no munmap: the shim must give back the
 * range it reserved and fail the call, not crash (ctest.TestShimMmapRefused).
 * It knows nothing of weir: the shim serves it. argv[1]: a weir path,
 * argv[2]: the bytes to map. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "test.h"

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0, "open %s: %s", argv[1], strerror(errno));
	static char page[4096];
	memset(page, 'w', sizeof page);
	CHECK(write(fd, page, sizeof page) == (ssize_t)sizeof page, "write: %s", strerror(errno));
	size_t len = strtoull(argv[2], NULL, 10);
	void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		printf("refused: %s\n", strerror(errno));
	} else {
		printf("mapped: %c\n", ((char *)p)[0]);
		CHECK(munmap(p, len) == 0, "munmap: %s", strerror(errno));
	}
	/* What the shim reserved is free again: a mapping of the same size
	 * anywhere succeeds. */
	void *q = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(q != MAP_FAILED, "a small mapping after: %s", strerror(errno));
	printf("small: %c\n", ((char *)q)[0]);
	return 0;
}
