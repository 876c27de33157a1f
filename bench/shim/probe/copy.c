/*
 * copy.c: what a buffered 4 KiB write costs the memory, apart from any
 * file system: 4 KiB copies into random pages of a MiB-sized memfd
 * mapping (argument 1, default 256), each followed by a locked OR as a
 * write window's store is (client/c/weir.c, window_store), with memcpy,
 * non-temporal stores and rep movsb, three rounds each.
 *
 *   cc -O2 -o copy bench/shim/probe/copy.c && ./copy 256 && ./copy 16
 *
 * docs/benchmarks.md, "The shim", 2026-12-06 04:55Z, has what it showed.
 */
#define _GNU_SOURCE
#include <emmintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void copy_nt(void *d, const void *s, size_t n)
{
	__m128i *dp = d;
	const __m128i *sp = s;
	for (size_t i = 0; i < n / 16; i += 4) {
		__m128i a = _mm_loadu_si128(sp + i), b = _mm_loadu_si128(sp + i + 1);
		__m128i c = _mm_loadu_si128(sp + i + 2), e = _mm_loadu_si128(sp + i + 3);
		_mm_stream_si128(dp + i, a);
		_mm_stream_si128(dp + i + 1, b);
		_mm_stream_si128(dp + i + 2, c);
		_mm_stream_si128(dp + i + 3, e);
	}
	_mm_sfence();
}

static void copy_movsb(void *d, const void *s, size_t n) { __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n)::"memory"); }

int main(int argc, char **argv)
{
	size_t size = (size_t)(argc > 1 ? atoi(argv[1]) : 256) << 20;
	int iters = 500000;
	int fd = memfd_create("copy", 0);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
		perror("memfd");
		return 1;
	}
	uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (m == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(m, 1, size);
	static uint8_t buf[4096] __attribute__((aligned(64)));
	memset(buf, 7, sizeof buf);
	static uint64_t word;
	size_t pages = size / 4096;
	uint32_t *at = malloc(sizeof *at * (size_t)iters);
	srand(1);
	for (int i = 0; i < iters; i++)
		at[i] = (uint32_t)((size_t)rand() % pages);
	const char *names[] = {"memcpy", "non-temporal", "rep movsb"};
	for (int round = 0; round < 3; round++)
		for (int mode = 0; mode < 3; mode++) {
			uint64_t t0 = now_ns();
			for (int i = 0; i < iters; i++) {
				uint8_t *dst = m + (size_t)at[i] * 4096;
				buf[0] = (uint8_t)i;
				if (mode == 0)
					memcpy(dst, buf, 4096);
				else if (mode == 1)
					copy_nt(dst, buf, 4096);
				else
					copy_movsb(dst, buf, 4096);
				__atomic_fetch_or(&word, 1ull << (i & 63), __ATOMIC_SEQ_CST);
			}
			printf("%zu MiB %s: %.0f ns per 4 KiB copy\n", size >> 20, names[mode], (double)(now_ns() - t0) / iters);
		}
	return 0;
}
