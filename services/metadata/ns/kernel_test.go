package ns

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The differential test: every case of the errno and attribute tables is
// also run against the kernel, on the same tree built in a temporary
// directory, by a child process with the case's uid, gid and groups. It
// needs root (to build the tree and switch credentials) and is skipped
// otherwise. Cases whose path cannot be rebased under a directory (a path
// of only slashes, over-long paths) or that Go itself rejects (NUL) run
// only against weir.

const kernelChildEnv = "WEIR_NS_KERNEL_CHILD"

func TestMain(m *testing.M) {
	if base := os.Getenv(kernelChildEnv); base != "" {
		os.Exit(kernelChild(base))
	}
	if arg := os.Getenv(killChildEnv); arg != "" {
		os.Exit(killChild(arg))
	}
	os.Exit(m.Run())
}

// kernelChild runs the ops on stdin, one a line as "base<TAB>op", and
// prints one result a line: the errno, and for "stat" also mode, gid and
// size.
func kernelChild(string) int {
	syscall.Umask(0)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		base, op, _ := strings.Cut(sc.Text(), "\t")
		f := strings.Split(op, ":")
		p := func(i int) string {
			if f[i] == "" {
				return ""
			}
			return base + "/" + f[i]
		}
		oct := func(i int) uint32 { v, _ := strconv.ParseUint(f[i], 8, 32); return uint32(v) }
		num := func(i int) int64 {
			if f[i] == "omit" {
				return (1 << 30) - 2 // UTIME_OMIT
			}
			v, _ := strconv.ParseInt(f[i], 0, 64)
			return v
		}
		var err error
		extra := ""
		switch f[0] {
		case "stat":
			var st syscall.Stat_t
			err = syscall.Stat(p(1), &st)
			extra = fmt.Sprintf(" %o %d %d", st.Mode, st.Gid, st.Size)
		case "open":
			var fd int
			fd, err = syscall.Open(p(1), int(num(2)), oct(3))
			if err == nil {
				syscall.Close(fd)
			}
		case "mkdir":
			err = syscall.Mkdir(p(1), oct(2))
		case "rmdir":
			err = syscall.Rmdir(p(1))
		case "unlink":
			err = syscall.Unlink(p(1))
		case "rename":
			err = syscall.Rename(p(1), p(2))
		case "chmod":
			err = syscall.Chmod(p(1), oct(2))
		case "chown":
			err = syscall.Chown(p(1), int(num(2)), int(num(3)))
		case "trunc":
			err = syscall.Truncate(p(1), num(2))
		case "utimes":
			err = syscall.UtimesNano(p(1), []syscall.Timespec{{Nsec: num(2)}, {Nsec: num(3)}})
		case "readdir":
			var fd int
			fd, err = syscall.Open(p(1), syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
			if err == nil {
				syscall.Close(fd)
			}
		default:
			fmt.Println("unknown")
			continue
		}
		e, _ := err.(syscall.Errno)
		fmt.Printf("%d%s\n", int(e), extra)
	}
	return 0
}

// kernelEnv is a directory every uid can search, holding a copy of the
// test binary (the build directory is private to root) and the fixtures.
type kernelEnv struct {
	dir, bin string
	n        int
}

func newKernelEnv(t *testing.T) *kernelEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "weir-ns-kernel-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	self, err := os.Executable()
	must(t, err)
	data, err := os.ReadFile(self)
	must(t, err)
	bin := filepath.Join(dir, "ns.test")
	must(t, os.WriteFile(bin, data, 0o755))
	return &kernelEnv{dir: dir, bin: bin}
}

// fixture builds fixtureTree under a new directory.
func (k *kernelEnv) fixture(t *testing.T) string {
	t.Helper()
	k.n++
	base := filepath.Join(k.dir, strconv.Itoa(k.n))
	must(t, os.Mkdir(base, 0o755))
	must(t, os.Chmod(base, 0o755))
	for _, e := range fixtureTree {
		p := filepath.Join(base, e.path)
		if e.mode&syscall.S_IFMT == syscall.S_IFDIR {
			must(t, os.Mkdir(p, 0o700))
		} else {
			must(t, os.WriteFile(p, nil, 0o600))
		}
		must(t, os.Chown(p, e.uid, e.gid))
		must(t, syscall.Chmod(p, e.mode&0o7777))
	}
	must(t, syscall.Chmod(filepath.Join(base, "nox"), 0o644))
	must(t, syscall.Chmod(filepath.Join(base, "zd"), 0))
	return base
}

// run runs each batch of ops as c, every batch on its own fresh fixture,
// in one child process, and returns one result line per op.
func (k *kernelEnv) run(t *testing.T, c Cred, batches [][]string) [][]string {
	t.Helper()
	var in strings.Builder
	total := 0
	for _, ops := range batches {
		base := k.fixture(t)
		for _, op := range ops {
			fmt.Fprintf(&in, "%s\t%s\n", base, op)
			total++
		}
	}
	cmd := exec.Command(k.bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), kernelChildEnv+"=1")
	cmd.Stdin = strings.NewReader(in.String())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: c.Groups}}
	must(t, cmd.Run())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != total {
		t.Fatalf("child printed %d lines for %d ops: %q", len(lines), total, out.String())
	}
	res := make([][]string, len(batches))
	for i, ops := range batches {
		res[i], lines = lines[:len(ops)], lines[len(ops):]
	}
	return res
}

// kernelComparable reports whether op means the same under a base directory.
func kernelComparable(op string) bool {
	if strings.IndexByte(op, 0) >= 0 || len(op) > 1000 {
		return false
	}
	for _, p := range strings.Split(op, ":")[1:] {
		if p != "" && strings.Trim(p, "/") == "" {
			return false
		}
	}
	return true
}

func requireRoot(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the kernel differential test needs root")
	}
	if testing.Short() {
		t.Skip("short mode")
	}
}

func TestKernelAgreesWithErrnoTables(t *testing.T) {
	requireRoot(t)
	var all []errCase
	for _, cs := range [][]errCase{pathCases, openCases, mkdirRmdirUnlinkCases, renameCases, permissionCases} {
		all = append(all, cs...)
	}
	k := newKernelEnv(t)
	byCred := map[uint32][]errCase{}
	creds := map[uint32]Cred{}
	for _, tc := range all {
		if kernelComparable(tc.op) {
			byCred[tc.cred.UID] = append(byCred[tc.cred.UID], tc)
			creds[tc.cred.UID] = tc.cred
		}
	}
	for uid, cases := range byCred {
		batches := make([][]string, len(cases))
		for i, tc := range cases {
			batches[i] = []string{tc.op}
		}
		for i, res := range k.run(t, creds[uid], batches) {
			got := strings.Fields(res[0])[0]
			if tc := cases[i]; got != strconv.Itoa(int(tc.want)) {
				t.Errorf("kernel, uid %d, %q: errno %s, table says %d", uid, tc.op, got, int(tc.want))
			}
		}
	}
}

func TestKernelAgreesWithModeTable(t *testing.T) {
	requireRoot(t)
	k := newKernelEnv(t)
	byCred := map[uint32][]attrCase{}
	creds := map[uint32]Cred{}
	for _, tc := range modeCases {
		// All steps of a case run as one credential in this table.
		c := tc.steps[0].cred
		byCred[c.UID] = append(byCred[c.UID], tc)
		creds[c.UID] = c
	}
	for uid, cases := range byCred {
		batches := make([][]string, len(cases))
		for i, tc := range cases {
			for _, s := range tc.steps {
				batches[i] = append(batches[i], s.op)
			}
			batches[i] = append(batches[i], "stat:"+tc.path)
		}
		for i, res := range k.run(t, creds[uid], batches) {
			tc := cases[i]
			for j, s := range tc.steps {
				if res[j] != strconv.Itoa(int(s.want)) {
					t.Errorf("%s: kernel step %q: errno %s, want %d", tc.name, s.op, res[j], int(s.want))
				}
			}
			want := fmt.Sprintf("0 %o %d %d", tc.mode, tc.gid, tc.size)
			got := res[len(res)-1]
			if tc.mode&syscall.S_IFMT == syscall.S_IFDIR {
				// Directory sizes are file-system specific (ext4: 4096); weir's are 0.
				f := strings.Fields(got)
				got = strings.Join(append(f[:3], "0"), " ")
			}
			if got != want {
				t.Errorf("%s: kernel stat: %q, table says %q", tc.name, got, want)
			}
		}
	}
}
