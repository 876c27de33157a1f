package ns

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// Every expectation in these tables was produced by running the same
// operation on the same tree against Linux 6.18 (ext4), as root or as
// the uid/gid/groups of the credential (see fixture).

var long = strings.Repeat("x", 256)

type errCase struct {
	cred Cred
	op   string
	want syscall.Errno
}

func runErrCases(t *testing.T, cases []errCase) {
	t.Helper()
	for i, tc := range cases {
		name := tc.op
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		t.Run(fmt.Sprintf("%d:%s", i, strings.ReplaceAll(name, "/", "|")), func(t *testing.T) {
			n, _ := newNS(t)
			fixture(t, n)
			got := errno(t, do(n, tc.cred, tc.op))
			if got != tc.want {
				t.Errorf("uid %d %s: got %s, want %s", tc.cred.UID, tc.op, errName(got), errName(tc.want))
			}
			if err := n.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPathRules(t *testing.T) { runErrCases(t, pathCases) }

var pathCases = []errCase{
	{root, "stat:", syscall.ENOENT},
	{root, "stat:/", 0},
	{root, "stat://", 0},
	{root, "stat:.", 0},
	{root, "stat:..", 0},
	{root, "stat:/../../..", 0},
	{root, "stat:f", 0},
	{root, "stat:/f", 0},
	{root, "stat:d//..//f", 0},
	{root, "stat:d/../../..", 0},
	{root, "stat:./d/./", 0},
	{root, "stat:f/", syscall.ENOTDIR},
	{root, "stat:f/.", syscall.ENOTDIR},
	{root, "stat:f/..", syscall.ENOTDIR},
	{root, "stat:f/x", syscall.ENOTDIR},
	{root, "stat:nx", syscall.ENOENT},
	{root, "stat:nx/", syscall.ENOENT},
	{root, "stat:nx/y", syscall.ENOENT},
	{root, "stat:a\x00b", syscall.EINVAL},
	{root, "stat:" + long, syscall.ENAMETOOLONG},
	{root, "stat:" + long[:255], syscall.ENOENT},
	{root, "stat:d/" + long + "/x", syscall.ENAMETOOLONG},
	{root, "stat:nx/" + long, syscall.ENOENT},
	{root, "stat:f/" + long, syscall.ENOTDIR},
	{root, "stat:" + strings.Repeat("/", 4094) + "f", 0},
	{root, "stat:" + strings.Repeat("/", 4095) + "f", syscall.ENAMETOOLONG},
	{root, "stat:" + strings.Repeat("./", 2047) + "f", 0},
	{root, "stat:" + strings.Repeat("./", 2048) + "f", syscall.ENAMETOOLONG},
	{root, "mkdir:" + long + ":755", syscall.ENAMETOOLONG},
	{root, "mkdir:" + long[:255] + ":755", 0},
	{root, "mkdir:nx/" + long + ":755", syscall.ENOENT},
	{root, "mkdir:f/" + long + ":755", syscall.ENOTDIR},
	{root, "open:" + long + ":0x41:644", syscall.ENAMETOOLONG},
	{root, "open:" + long + "/:0x41:644", syscall.EISDIR},
	{root, "unlink:" + long, syscall.ENAMETOOLONG},
	{root, "rename:f:" + long, syscall.ENAMETOOLONG},
	{root, "rename:" + long + ":f", syscall.ENAMETOOLONG},
	{root, "rename:f\x00:g", syscall.EINVAL},
	{root, "rename:nx:g\x00", syscall.EINVAL},
	{root, "readdir:f", syscall.ENOTDIR},
	{root, "readdir:d", 0},
	{root, "readdir:/", 0},
	{root, "trunc:\x00:-1", syscall.EINVAL},
}

func TestOpenRules(t *testing.T) { runErrCases(t, openCases) }

var openCases = []errCase{
	{root, "open:nx:0x10040:644", syscall.EINVAL}, // O_CREAT|O_DIRECTORY
	{root, "open:d:0x10040:644", syscall.EINVAL},
	{root, "open:f:0x10040:644", syscall.EINVAL},
	{root, "open:d:0x200:0", syscall.EISDIR}, // O_RDONLY|O_TRUNC on a directory
	{root, "open:d:0x10000:0", 0},
	{root, "open:f:0x10000:0", syscall.ENOTDIR},
	{root, "open:f/:0:0", syscall.ENOTDIR},
	{root, "open:d/:0:0", 0},
	{root, "open:f/:0x40:644", syscall.EISDIR},
	{root, "open:d/:0x40:644", syscall.EISDIR},
	{root, "open:nx/:0x40:644", syscall.EISDIR},
	{root, "open:nx/:0xc0:644", syscall.EISDIR},
	{root, "open:nx/y/:0x40:644", syscall.ENOENT},
	{root, "open:.:0x40:644", syscall.EISDIR},
	{root, "open:.:0xc0:644", syscall.EEXIST},
	{root, "open:/:0xc0:644", syscall.EEXIST},
	{root, "open:d/..:0xc0:644", syscall.EEXIST},
	{root, "open:d/..:0x40:644", syscall.EISDIR},
	{root, "open:d:0x40:644", syscall.EISDIR},
	{root, "open:d:0xc0:644", syscall.EEXIST},
	{root, "open:f:0xc0:644", syscall.EEXIST},
	{root, "open:f:0x40:644", 0},
	{root, "open:f:0x242:644", 0},
	{root, "open:nx:0:0", syscall.ENOENT},
	{root, "open:nx:0x41:644", 0},
	{root, "open:nx/y:0x41:644", syscall.ENOENT},
	{root, "open:f/y:0x41:644", syscall.ENOTDIR},
	{root, "open:d:1:0", syscall.EISDIR},
	{root, "open:d:2:0", syscall.EISDIR},
	{root, "open:d:3:0", syscall.EISDIR},
	{root, "open:f:3:0", 0},
	{root, "open:d/.:0x41:0", syscall.EISDIR},
	{root, "open:zero:2:0", 0}, // root overrides read and write
	{root, "readdir:zd", 0},    // and directory read and search
	{root, "stat:zd/in", 0},
	{root, "open:zd/new:0x41:0", 0},
}

func TestMkdirRmdirUnlinkRules(t *testing.T) { runErrCases(t, mkdirRmdirUnlinkCases) }

var mkdirRmdirUnlinkCases = []errCase{
	{root, "mkdir:.:755", syscall.EEXIST},
	{root, "mkdir:/:755", syscall.EEXIST},
	{root, "mkdir:d/..:755", syscall.EEXIST},
	{root, "mkdir:d/.:755", syscall.EEXIST},
	{root, "mkdir:f:755", syscall.EEXIST},
	{root, "mkdir:f/:755", syscall.EEXIST},
	{root, "mkdir:d:755", syscall.EEXIST},
	{root, "mkdir:new1/:755", 0},
	{root, "mkdir:new1//:755", 0},
	{root, "mkdir:f/x:755", syscall.ENOTDIR},
	{root, "mkdir:nx/x:755", syscall.ENOENT},
	{root, "rmdir:d", 0},
	{root, "rmdir:d/", 0},
	{root, "rmdir:d/.", syscall.EINVAL},
	{root, "rmdir:d/..", syscall.ENOTEMPTY},
	{root, "rmdir:.", syscall.EINVAL},
	{root, "rmdir:/", syscall.EBUSY},
	{root, "rmdir:f", syscall.ENOTDIR},
	{root, "rmdir:f/", syscall.ENOTDIR},
	{root, "rmdir:e", syscall.ENOTEMPTY},
	{root, "rmdir:nx", syscall.ENOENT},
	{root, "rmdir:d/../e", syscall.ENOTEMPTY},
	{root, "unlink:f", 0},
	{root, "unlink:d", syscall.EISDIR},
	{root, "unlink:d/", syscall.EISDIR},
	{root, "unlink:f/", syscall.ENOTDIR},
	{root, "unlink:nx/", syscall.ENOENT},
	{root, "unlink:d/.", syscall.EISDIR},
	{root, "unlink:.", syscall.EISDIR},
	{root, "unlink:/", syscall.EISDIR},
	{root, "unlink:nx", syscall.ENOENT},
	{root, "unlink:d/..", syscall.EISDIR},
	{root, "trunc:nx:-1", syscall.EINVAL},
	{root, "trunc:d:0", syscall.EISDIR},
	{root, "trunc:d:-1", syscall.EINVAL},
	{root, "trunc:f/:0", syscall.ENOTDIR},
	{root, "trunc:f:5", 0},
	{root, "utimes:nx:omit:omit", 0}, // Linux does not even look at the path
	{root, "utimes::omit:omit", 0},
	{root, "utimes:nx:omit:5", syscall.ENOENT},
	{root, "utimes:f:1:2", 0},
	{root, "chown:f:-2:0", 0}, // uid 4294967294 is a valid uid
	{root, "chown:f:4294967295:4294967295", 0},
}

func TestRenameMatrix(t *testing.T) { runErrCases(t, renameCases) }

var renameCases = []errCase{
	{root, "rename:a/b/g:a/b", syscall.ENOTEMPTY}, // target is an ancestor of the source
	{root, "rename:a/b/c:a/b", syscall.ENOTEMPTY},
	{root, "rename:a/b/c:a", syscall.ENOTEMPTY},
	{root, "rename:a:a/b", syscall.EINVAL}, // into its own subtree
	{root, "rename:a:a/b/c", syscall.EINVAL},
	{root, "rename:a:a/b/zz", syscall.EINVAL},
	{root, "rename:a:a/zz", syscall.EINVAL},
	{root, "rename:a:a/q/zz", syscall.ENOENT},
	{root, "rename:a/b:a/b/c/n", syscall.EINVAL},
	{root, "rename:.:x", syscall.EBUSY},
	{root, "rename:/:x", syscall.EBUSY},
	{root, "rename:d/.:x", syscall.EBUSY},
	{root, "rename:d/..:x", syscall.EBUSY},
	{root, "rename:f:.", syscall.EBUSY},
	{root, "rename:f:/", syscall.EBUSY},
	{root, "rename:f:d/..", syscall.EBUSY},
	{root, "rename:f:d/.", syscall.EBUSY},
	{root, "rename:nx:.", syscall.EBUSY},
	{root, "rename:.:nx/y", syscall.ENOENT}, // both walks come before EBUSY
	{root, "rename:e:e/x/..", syscall.EBUSY},
	{root, "rename:e/x/..:q", syscall.EBUSY},
	{root, "rename:f:f/", syscall.ENOTDIR},
	{root, "rename:f/:f", syscall.ENOTDIR},
	{root, "rename:f:nx/", syscall.ENOTDIR},
	{root, "rename:f:d/", syscall.ENOTDIR},
	{root, "rename:f/:nx", syscall.ENOTDIR},
	{root, "rename:d:f", syscall.ENOTDIR},   // directory onto file
	{root, "rename:f:d", syscall.EISDIR},    // file onto directory
	{root, "rename:d:e", syscall.ENOTEMPTY}, // onto a non-empty directory
	{root, "rename:d:ne", syscall.ENOTEMPTY},
	{root, "rename:d:ne/y", 0}, // onto an empty directory: replaces it
	{root, "rename:f:f2", 0},   // file onto file: replaces it
	{root, "rename:f:d/f", 0},
	{root, "rename:d:a/b/c/d", 0},
	{root, "rename:a/b/c:c", 0},
	{root, "rename:nx:y", syscall.ENOENT},
	{root, "rename:f:nx/y", syscall.ENOENT},
	{root, "rename:f:f2/x", syscall.ENOTDIR},
	{root, "rename:f:f", 0}, // same path: no-op
	{root, "rename:d:d", 0},
	{root, "rename:d/:d", 0},
	{root, "rename:d:d/", 0},
	{root, "rename:d//:d/", 0},
	{root, "rename:d:d/.", syscall.EBUSY},
	{root, "rename:d:newd/", 0},
	{root, "rename:nx:nx", syscall.ENOENT},
	{root, "rename:f:", syscall.ENOENT},
	{root, "rename::f", syscall.ENOENT},
	{root, "rename:e/x:x", 0},
	{root, "rename:e/x:e/x2", 0},
}

func TestPermissionRules(t *testing.T) { runErrCases(t, permissionCases) }

var permissionCases = []errCase{
	// sticky directory: only the entry's owner, the directory's owner, root
	{u1, "unlink:pub/u2f", syscall.EPERM},
	{u1, "unlink:pub/rootf", syscall.EPERM},
	{u1, "unlink:pub/u1f", 0},
	{u1, "rmdir:pub/u2sub", syscall.EPERM},
	{u1, "rename:pub/u2f:pub/zz", syscall.EPERM},
	{u1, "rename:pub/u1sub:pub/u2sub", syscall.EPERM}, // the target is protected too
	{u1, "rename:pub/rootf:pubns/x", syscall.EPERM},
	{u1, "unlink:s1/other", 0}, // u1 owns the sticky directory
	{root, "unlink:pub/u2f", 0},
	{u2, "unlink:pub/u2f", 0},
	{u1, "unlink:pubns/rootf", 0}, // not sticky
	// write permission on the directory
	{u1, "open:ro/new:0x41:644", syscall.EACCES},
	{u1, "open:ro/rof:0x41:644", syscall.EACCES},
	{u1, "open:ro/rof:0x1:644", syscall.EACCES},
	{u1, "open:ro/rof:0x0:0", 0},
	{u1, "open:ro/rof:0x40:0", 0}, // existing file: no need to write the directory
	{u1, "open:ro/rof:0x200:0", syscall.EACCES},
	{u1, "open:ro/rof2:0x241:0", 0},
	{u1, "open:ro/rof:0xc1:644", syscall.EEXIST},
	{u1, "unlink:ro/nx", syscall.ENOENT},
	{u1, "unlink:ro/rof", syscall.EACCES},
	{u1, "unlink:ro/rod", syscall.EACCES}, // EACCES comes before EISDIR
	{u1, "mkdir:ro/rod:755", syscall.EEXIST},
	{u1, "mkdir:ro/new:755", syscall.EACCES},
	{u1, "rmdir:ro/nx", syscall.ENOENT},
	{u1, "rmdir:ro/rod", syscall.EACCES},
	{u1, "rmdir:ro/rof", syscall.EACCES},
	{u1, "rename:ro/rof:ro/rof", 0},
	{u1, "rename:ro/nx:x", syscall.ENOENT},
	{u1, "rename:ro/rof:wd/x", syscall.EACCES},
	{u1, "rename:wd/rootsub:wd/dst/rs", syscall.EACCES}, // moving a directory needs write on it
	{u1, "rename:wd/rootsub:wd/rs", 0},                  // but not within one parent
	{u1, "rename:u1d/sub:pubns/sub1", 0},
	// search permission along the path
	{u1, "stat:nox/nf", syscall.EACCES},
	{u1, "stat:nox", 0},
	{u1, "stat:nox/.", syscall.EACCES},
	{u1, "stat:nox/..", syscall.EACCES},
	{u1, "stat:nox/nx", syscall.EACCES},
	{u1, "readdir:nox", 0},
	{u1, "mkdir:nox/x:755", syscall.EACCES},
	{u1, "readdir:zd", syscall.EACCES},
	// owner, group (primary and supplementary), other classes
	{u1, "open:u1d/own0:0:0", syscall.EACCES}, // the owner class applies even if group/other allow
	{u1, "open:own:0:0", syscall.EACCES},
	{u1, "open:gonly:0x2:0", 0}, // supplementary group 3000
	{u1, "open:oth:0x0:0", 0},
	{u1, "open:oth:0x1:0", syscall.EACCES},
	{u2, "open:oth2:0x0:0", syscall.EACCES}, // group 2000 has no bits: the group class applies, not other
	{Cred{UID: 1003, GID: 1003}, "open:oth2:0x0:0", 0},
	{u1, "readdir:grp", syscall.EACCES},
	{u1, "stat:grp/gf", syscall.EACCES},
	{u2, "readdir:grp", 0},
	{u2, "stat:grp/gf", 0},
	{u2, "open:grp/gf:0x2:0", 0},
	{u1, "open:zero:0:0", syscall.EACCES},
	// chmod, chown, utimes, truncate
	{u1, "chmod:ro/rof:644", syscall.EPERM},
	{u1, "chmod:u1d/u1file:2755", 0},
	{u1, "chown:ro/rof:-1:-1", 0}, // a no-op chown needs no privilege
	{u1, "chown:rootsuid:-1:-1", syscall.EPERM},
	{u1, "chown:u1d/u1file:1001:-1", 0},
	{u1, "chown:u1d/u1file:1002:-1", syscall.EPERM},
	{u1, "chown:u1d/u1file:-1:3000", 0},
	{u1, "chown:u1d/u1file:-1:1001", 0},
	{u1, "chown:u1d/u1file:-1:2000", syscall.EPERM},
	{u1, "chown:ro/rof:-1:0", syscall.EPERM},
	{u2, "chown:pub/u2f:1001:-1", syscall.EPERM},
	{root, "chown:pub/u2f:1001:5", 0},
	{u1, "utimes:ro/rof:5:6", syscall.EPERM},
	{u1, "utimes:u1d/u1file:5:6", 0},
	{u1, "utimes:ro/rof:omit:6", syscall.EPERM},
	{u1, "utimes:ro/rof:omit:omit", 0},
	{u1, "trunc:ro/rof:0", syscall.EACCES},
	{u1, "trunc:ro/rof2:0", 0},
	{u1, "trunc:u1d/own0:0", syscall.EACCES},
	{u1, "trunc:nox/nf:0", syscall.EACCES},
}

// attrCase runs ops in order and then checks the attributes of one path.
type attrCase struct {
	name  string
	steps []errCase
	path  string
	mode  uint32
	gid   uint32
	size  int64
}

var modeCases = []attrCase{
	{"chmod setgid kept in group", []errCase{{u1, "chmod:u1d/u1file:2755", 0}}, "u1d/u1file", file | 0o2755, 1001, 0},
	{"chmod setgid dropped outside group", []errCase{{u1, "chmod:u1d/g5:2755", 0}}, "u1d/g5", file | 0o755, 5000, 0},
	{"root chmod keeps setgid", []errCase{{root, "chmod:u1d/g5:2644", 0}}, "u1d/g5", file | 0o2644, 5000, 0},
	{"chgrp drops real setgid", []errCase{{u1, "chmod:u1d/u1file:2755", 0}, {u1, "chown:u1d/u1file:-1:3000", 0}}, "u1d/u1file", file | 0o755, 3000, 0},
	{"chown drops setuid", []errCase{{u1, "chown:u1d/suidf:-1:-1", 0}}, "u1d/suidf", file | 0o755, 1001, 0},
	{"chown drops setgid", []errCase{{u1, "chown:u1d/sgidf:-1:-1", 0}}, "u1d/sgidf", file | 0o755, 1001, 0},
	{"chown keeps setgid without group x", []errCase{{u1, "chown:u1d/sgidnx:-1:-1", 0}}, "u1d/sgidnx", file | 0o2645, 1001, 0},
	{"chgrp by owner changes group", []errCase{{u1, "chown:u1d/suidw:-1:3000", 0}}, "u1d/suidw", file | 0o777, 3000, 0},
	{"root chown drops setuid too", []errCase{{root, "chown:rootsuid:-1:-1", 0}}, "rootsuid", file | 0o755, 0, 0},
	{"root chown of directory keeps setgid", []errCase{{root, "chown:sg:-1:-1", 0}}, "sg", dir | 0o2777, 2000, 0},
	{"truncate drops real setgid", []errCase{{u1, "trunc:u1d/sgidw:0", 0}}, "u1d/sgidw", file | 0o777, 1001, 0},
	{"truncate drops setuid", []errCase{{u1, "trunc:u1d/tr:5", 0}}, "u1d/tr", file | 0o666, 1001, 5},
	{"root truncate keeps setuid", []errCase{{root, "trunc:rootsuid:7", 0}}, "rootsuid", file | 0o4755, 0, 7},
	{"O_TRUNC keeps mandatory-lock setgid", []errCase{{u1, "open:u1d/sgidw2:0x201:0", 0}}, "u1d/sgidw2", file | 0o2767, 1001, 0},
	{"create in setgid dir by non-member", []errCase{{u1, "open:sg/f:0x41:2755", 0}}, "sg/f", file | 0o755, 2000, 0},
	{"create in setgid dir keeps setgid without group x", []errCase{{u1, "open:sg/f:0x41:2745", 0}}, "sg/f", file | 0o2745, 2000, 0},
	{"create in setgid dir by member", []errCase{{u2, "open:sg/f:0x41:2755", 0}}, "sg/f", file | 0o2755, 2000, 0},
	{"mkdir in setgid dir inherits", []errCase{{u1, "mkdir:sg/d:755", 0}}, "sg/d", dir | 0o2755, 2000, 0},
	{"mkdir drops setuid and setgid bits", []errCase{{u1, "mkdir:u1d/m:7777", 0}}, "u1d/m", dir | 0o1777, 1001, 0},
	{"create keeps all bits", []errCase{{u1, "open:u1d/c:0x41:7777", 0}}, "u1d/c", file | 0o7777, 1001, 0},
	{"create takes the caller's group", []errCase{{u1, "open:pubns/c:0x41:640", 0}}, "pubns/c", file | 0o640, 1001, 0},
}

func TestModeAndOwnershipRules(t *testing.T) {
	for _, tc := range modeCases {
		t.Run(tc.name, func(t *testing.T) {
			n, _ := newNS(t)
			fixture(t, n)
			for _, s := range tc.steps {
				if got := errno(t, do(n, s.cred, s.op)); got != s.want {
					t.Fatalf("%s: got %s, want %s", s.op, errName(got), errName(s.want))
				}
			}
			a, err := n.Stat(root, tc.path)
			must(t, err)
			if a.Mode != tc.mode || a.GID != tc.gid || a.Size != tc.size {
				t.Errorf("%s: mode %o gid %d size %d, want mode %o gid %d size %d", tc.path, a.Mode, a.GID, a.Size, tc.mode, tc.gid, tc.size)
			}
		})
	}
}
