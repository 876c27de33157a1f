/*
 * bench/shim's per-call probe: the time of a call, averaged over n, on a
 * kernel file and (with the shim loaded and WEIR_FILE set) on a weir one.
 * Run once without the shim and once with it: the kernel rows' difference
 * is what the shim adds to a call it passes through. Output: one line
 * per call, "name ns_per_call".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

#define TIME(name, n, body)                                          \
	do {                                                         \
		for (int i_ = 0; i_ < (n) / 10; i_++) {              \
			body;                                        \
		}                                                    \
		double t0_ = now();                                  \
		for (int i_ = 0; i_ < (n); i_++) {                   \
			body;                                        \
		}                                                    \
		printf("%s %.1f\n", name, (now() - t0_) / (n));      \
	} while (0)

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 200000;
	const char *kpath = getenv("KERNEL_FILE"), *wpath = getenv("WEIR_FILE");
	char buf[4096];
	struct stat st;
	int k = open(kpath, O_RDWR);
	if (k < 0) {
		perror(kpath);
		return 1;
	}
	TIME("kernel pread 4KiB (page cache)", n, if (pread(k, buf, sizeof buf, (i_ % 256) * 4096) != 4096) return 2);
	TIME("kernel fstat", n, fstat(k, &st));
	TIME("kernel stat (path)", n, stat(kpath, &st));
	TIME("kernel lseek", n, lseek(k, 0, SEEK_SET));
	TIME("getppid (never caught)", n, getppid());
	TIME("kernel open+close", n / 10, close(open(kpath, O_RDONLY)));
	if (wpath) {
		int w = open(wpath, O_RDWR);
		if (w < 0) {
			perror(wpath);
			return 1;
		}
		TIME("weir pread 4KiB", n / 4, if (pread(w, buf, sizeof buf, (i_ % 256) * 4096) != 4096) return 3);
		TIME("weir pwrite 4KiB", n / 4, if (pwrite(w, buf, sizeof buf, (i_ % 256) * 4096) != 4096) return 4);
		TIME("weir fstat", n / 4, fstat(w, &st));
		TIME("weir stat (path)", n / 4, stat(wpath, &st));
		TIME("weir lseek", n, lseek(w, 0, SEEK_SET));
		TIME("weir open+close", n / 100, close(open(wpath, O_RDONLY)));
	}
	return 0;
}
