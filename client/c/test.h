/* What libweir's C tests share (client/c/ctest runs them). */
#ifndef WEIR_TEST_H
#define WEIR_TEST_H

#include <stdio.h>
#include <unistd.h>

/* CHECK fails the test (exit status 1) with a message when cond is false;
 * _exit, so that a forked child never runs its parent's atexit work. */
#define CHECK(cond, ...)                                                \
	do {                                                            \
		if (!(cond)) {                                          \
			fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                   \
			fprintf(stderr, "\n");                          \
			_exit(1);                                       \
		}                                                       \
	} while (0)

#endif
