/* test_dirscan: scandir(3) and glob(3), which glibc runs on its internal
 * opendir and readdir, on a directory (argv[1]) holding a.txt, b.txt,
 * c.dat and sub/x; run under the shim on weir and on the kernel, the
 * outputs must be equal (ctest.TestShimScandirGlob). */
#define _GNU_SOURCE
#include <dirent.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int nodot(const struct dirent *e) { return e->d_name[0] != '.'; }
int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	struct dirent **l;
	int n = scandir(argv[1], &l, nodot, alphasort);
	printf("scandir %d:", n);
	for (int i = 0; i < n; i++) {
		printf(" %s%s", l[i]->d_name, l[i]->d_type == DT_DIR ? "/" : "");
		free(l[i]);
	}
	printf("\n");
	char pat[4096];
	snprintf(pat, sizeof pat, "%s/*.txt", argv[1]);
	glob_t g;
	int r = glob(pat, 0, NULL, &g);
	printf("glob %d:", r);
	for (size_t i = 0; r == 0 && i < g.gl_pathc; i++)
		printf(" %s", strrchr(g.gl_pathv[i], '/') + 1);
	printf("\n");
	if (r == 0)
		globfree(&g);
	if (chdir(argv[1]) == 0 && glob("s*/*", GLOB_MARK, NULL, &g) == 0) {
		printf("relative glob:");
		for (size_t i = 0; i < g.gl_pathc; i++)
			printf(" %s", g.gl_pathv[i]);
		printf("\n");
		globfree(&g);
	}
	return 0;
}
