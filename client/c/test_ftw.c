/* test_ftw: nftw(3) and ftw(3), whose glibc versions walk with internal
 * calls, over argv[1], which holds a, sub/b, sub/deep/c, a link to sub/b and
 * a dangling link; each walk's lines (type, level, name, and for
 * FTW_CHDIR the cwd's last component) sorted, so that the same run on a
 * kernel directory and a weir one can be compared (ctest.TestShimFtw).
 * (Which name of a directory reached twice a walk reports depends on the
 * directory's order, which differs: the links here are to a file.) */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char lines[256][512];
static int nlines, walkflags;

static const char *tname(int t)
{
	switch (t) {
	case FTW_F: return "F";
	case FTW_D: return "D";
	case FTW_DNR: return "DNR";
	case FTW_DP: return "DP";
	case FTW_NS: return "NS";
	case FTW_SL: return "SL";
	case FTW_SLN: return "SLN";
	}
	return "?";
}

static int cb(const char *path, const struct stat *st, int type, struct FTW *f)
{
	(void)st;
	char cwd[4096] = "";
	if ((walkflags & FTW_CHDIR) && f->level > 0) {
		if (!getcwd(cwd, sizeof cwd))
			strcpy(cwd, "?");
	}
	const char *c = strrchr(cwd, '/');
	if (nlines < 256)
		snprintf(lines[nlines++], sizeof lines[0], "%s %d %s %s", tname(type), f->level, path + f->base, c ? c + 1 : "");
	if ((walkflags & FTW_ACTIONRETVAL) && strcmp(path + f->base, "deep") == 0)
		return FTW_SKIP_SUBTREE;
	return 0;
}

static int cb_old(const char *path, const struct stat *st, int type)
{
	(void)st;
	const char *b = strrchr(path, '/');
	if (nlines < 256)
		snprintf(lines[nlines++], sizeof lines[0], "%s %s", tname(type), b ? b + 1 : path);
	return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(a, b); }

static void show(const char *what, int rc)
{
	qsort(lines, (size_t)nlines, sizeof lines[0], cmp);
	printf("%s: %d\n", what, rc);
	for (int i = 0; i < nlines; i++)
		printf("  %s\n", lines[i]);
	nlines = 0;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	int sets[] = {0, FTW_PHYS, FTW_PHYS | FTW_DEPTH, FTW_PHYS | FTW_CHDIR, FTW_PHYS | FTW_ACTIONRETVAL};
	for (unsigned i = 0; i < sizeof sets / sizeof sets[0]; i++) {
		walkflags = sets[i];
		char what[32];
		snprintf(what, sizeof what, "nftw %#x", sets[i]);
		show(what, nftw(argv[1], cb, 8, sets[i]));
	}
	show("ftw", ftw(argv[1], cb_old, 8));
	if (chdir(argv[1]) == 0) {
		walkflags = FTW_PHYS | FTW_CHDIR;
		show("nftw relative, FTW_CHDIR", nftw("sub", cb, 8, walkflags));
	}
	return 0;
}
