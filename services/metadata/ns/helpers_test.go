package ns

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/vfs"
)

// seedFlag replays a randomised test: go test -run TestX -ns.seed=N.
var seedFlag = flag.Uint64("ns.seed", 0, "seed for randomised tests (0: derive from the clock)")

// testSeed returns the seed to use and logs it.
func testSeed(t testing.TB) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -ns.seed=%d)", s, s)
	return s
}

var (
	root = Cred{UID: 0, GID: 0}
	u1   = Cred{UID: 1001, GID: 1001, Groups: []uint32{1001, 3000}}
	u2   = Cred{UID: 1002, GID: 1002, Groups: []uint32{2000}}
)

// fakeClock advances one microsecond per reading, so timestamps are
// deterministic and strictly increasing.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(1_700_000_000_000_000_000)
	return c
}

func (c *fakeClock) Now() time.Time { return time.Unix(0, c.ns.Add(1000)) }

// last is the time the clock returned most recently.
func (c *fakeClock) last() int64 { return c.ns.Load() }

// testOpts returns options for an in-memory test namespace.
func testOpts(clk *fakeClock) Options {
	return Options{Dir: "/data/meta", Now: clk.Now, SyncInterval: time.Hour}
}

// openMem opens a namespace on m with deterministic checkpoints and
// registers a cleanup that runs Check and Close.
func openMem(t testing.TB, m *vfs.Mem, o Options) *NS {
	t.Helper()
	n, err := open(o, config{fs: m, inlineCheckpoint: true})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { closeChecked(t, n) })
	return n
}

// closeChecked runs Check and Close unless n is already closed.
func closeChecked(t testing.TB, n *NS) {
	t.Helper()
	n.mu.RLock()
	closed := n.closed
	n.mu.RUnlock()
	if closed {
		return
	}
	if err := n.Check(); err != nil {
		t.Errorf("Check: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// newNS returns an empty in-memory namespace.
func newNS(t testing.TB) (*NS, *fakeClock) {
	clk := newClock()
	return openMem(t, vfs.NewMem(), testOpts(clk)), clk
}

// crash stops n as a SIGKILL would: no flush, no checkpoint.
func (n *NS) crash() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	n.mu.Unlock()
	close(n.stop)
	n.wg.Wait()
	n.w.Abandon()
	n.lock.Close()
}

// errno returns err as a syscall.Errno (0 for nil) and fails if it is
// anything else: namespace errors must be bare Errno values.
func errno(t testing.TB, err error) syscall.Errno {
	t.Helper()
	if err == nil {
		return 0
	}
	e, ok := err.(syscall.Errno)
	if !ok {
		t.Fatalf("error %v (%T) is not a bare syscall.Errno", err, err)
	}
	return e
}

func errName(e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	return fmt.Sprintf("%d(%v)", int(e), e)
}

// must fails the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// do runs one operation written as in the kernel experiments that set the
// expectations: "op:arg:arg...", e.g. "open:d/x:0x41:644" (flags in hex,
// modes in octal), "rename:a:b", "utimes:p:omit:5". A successful open is
// released at once.
func do(n *NS, c Cred, op string) error {
	f := strings.Split(op, ":")
	oct := func(i int) uint32 { v, _ := strconv.ParseUint(f[i], 8, 32); return uint32(v) }
	num := func(i int) int64 {
		if f[i] == "omit" {
			return TimeOmit
		}
		v, _ := strconv.ParseInt(f[i], 0, 64)
		return v
	}
	switch f[0] {
	case "stat":
		_, err := n.Stat(c, f[1])
		return err
	case "open":
		a, _, err := n.Open(c, f[1], int(num(2)), oct(3))
		if err == nil {
			_, err = n.Release(a.Ino)
		}
		return err
	case "mkdir":
		_, err := n.Mkdir(c, f[1], oct(2))
		return err
	case "rmdir":
		return n.Rmdir(c, f[1])
	case "unlink":
		_, err := n.Unlink(c, f[1])
		return err
	case "rename":
		_, err := n.Rename(c, f[1], f[2])
		return err
	case "chmod":
		return n.Chmod(c, f[1], oct(2))
	case "chown":
		return n.Chown(c, f[1], int(num(2)), int(num(3)))
	case "trunc":
		_, err := n.Truncate(c, f[1], num(2))
		return err
	case "utimes":
		return n.Chtimes(c, f[1], num(2), num(3))
	case "readdir":
		_, err := n.ReadDir(c, f[1])
		return err
	}
	panic("unknown op " + op)
}

// mk creates path as root with the given mode (S_IFDIR or S_IFREG |
// bits), owner and group; a parent must exist.
func mk(t testing.TB, n *NS, path string, mode uint32, uid, gid int) {
	t.Helper()
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		_, err := n.Mkdir(root, path, 0o700)
		must(t, err)
	} else {
		a, _, err := n.Open(root, path, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o600)
		must(t, err)
		_, err = n.Release(a.Ino)
		must(t, err)
	}
	must(t, n.Chown(root, path, uid, gid))
	must(t, n.Chmod(root, path, mode&0o7777))
}

const (
	dir  = syscall.S_IFDIR
	file = syscall.S_IFREG
)

// fixtureEntry is one file or directory of the test tree.
type fixtureEntry struct {
	path     string
	mode     uint32
	uid, gid int
}

// fixtureTree is the tree the table tests run on, created in order (as
// root), then "nox" is made 0644 and "zd" 0. The kernel differential test
// builds the same tree on a real file system.
var fixtureTree = []fixtureEntry{
	{"f", file | 0o644, 0, 0}, {"f2", file | 0o644, 0, 0}, {"d", dir | 0o755, 0, 0},
	{"e", dir | 0o755, 0, 0}, {"e/x", dir | 0o755, 0, 0},
	{"a", dir | 0o755, 0, 0}, {"a/b", dir | 0o755, 0, 0}, {"a/b/c", dir | 0o755, 0, 0}, {"a/b/g", file | 0o644, 0, 0},
	{"ne", dir | 0o755, 0, 0}, {"ne/y", dir | 0o755, 0, 0},
	{"pub", dir | 0o1777, 0, 0}, {"pub/u1f", file | 0o644, 1001, 1001}, {"pub/rootf", file | 0o644, 0, 0},
	{"pub/u2f", file | 0o644, 1002, 1002}, {"pub/u1sub", dir | 0o755, 1001, 0}, {"pub/u2sub", dir | 0o755, 1002, 0},
	{"pubns", dir | 0o777, 0, 0}, {"pubns/rootf", file | 0o644, 0, 0},
	{"ro", dir | 0o755, 0, 0}, {"ro/rof", file | 0o644, 0, 0}, {"ro/rof2", file | 0o666, 0, 0}, {"ro/rod", dir | 0o755, 0, 0},
	{"nox", dir | 0o755, 0, 0}, {"nox/nf", file | 0o644, 0, 0},
	{"u1d", dir | 0o755, 1001, 1001}, {"u1d/u1file", file | 0o644, 1001, 1001},
	{"u1d/suidf", file | 0o4755, 1001, 1001}, {"u1d/sgidf", file | 0o2755, 1001, 1001},
	{"u1d/sgidnx", file | 0o2645, 1001, 1001}, {"u1d/own0", file | 0o077, 1001, 1001},
	{"u1d/sub", dir | 0o755, 1001, 1001}, {"u1d/g5", file | 0o644, 1001, 5000},
	{"u1d/suidw", file | 0o4777, 1001, 1001}, {"u1d/sgidw", file | 0o2777, 1001, 1001},
	{"u1d/sgidw2", file | 0o2767, 1001, 1001}, {"u1d/tr", file | 0o4666, 1001, 1001},
	{"grp", dir | 0o770, 0, 2000}, {"grp/gf", file | 0o660, 0, 2000},
	{"sg", dir | 0o2777, 0, 2000},
	{"wd", dir | 0o777, 0, 0}, {"wd/rootsub", dir | 0o755, 0, 0}, {"wd/dst", dir | 0o777, 0, 0},
	{"rootsuid", file | 0o4755, 0, 0},
	{"s1", dir | 0o1777, 1001, 0}, {"s1/other", file | 0o644, 1002, 0},
	{"gonly", file | 0o060, 1002, 3000}, {"oth", file | 0o604, 1002, 2000}, {"oth2", file | 0o604, 1001, 2000},
	{"own", file | 0o066, 1001, 3000},
	{"zero", file | 0, 0, 0}, {"zd", dir | 0o755, 0, 0}, {"zd/in", file | 0o644, 0, 0},
}

// fixture builds fixtureTree in n.
func fixture(t testing.TB, n *NS) {
	t.Helper()
	for _, e := range fixtureTree {
		mk(t, n, e.path, e.mode, e.uid, e.gid)
	}
	must(t, n.Chmod(root, "nox", 0o644)) // after its file was created
	must(t, n.Chmod(root, "zd", 0))
}

// dump renders the named tree and the allocation counter: everything
// persistent that a client can observe, plus the inode numbers.
func dump(n *NS) string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var b strings.Builder
	fmt.Fprintf(&b, "next=%d\n", n.st.nextIno)
	var walk func(path string, nd *inode)
	walk = func(path string, nd *inode) {
		a := nd.attr
		fmt.Fprintf(&b, "%s ino=%d mode=%o uid=%d gid=%d nlink=%d size=%d a=%d m=%d c=%d blob=%d target=%q\n",
			path, a.Ino, a.Mode, a.UID, a.GID, a.Nlink, a.Size, a.Atime, a.Mtime, a.Ctime, a.Blob, nd.target)
		names := make([]string, 0, len(nd.entries))
		for name := range nd.entries {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			walk(path+"/"+name, n.st.inodes[nd.entries[name]])
		}
	}
	walk("", n.st.root())
	dead := make([]uint64, 0, len(n.st.dead))
	for blob := range n.st.dead {
		dead = append(dead, blob)
	}
	slices.Sort(dead)
	fmt.Fprintf(&b, "awaiting deletion: %v\n", dead)
	return b.String()
}

// unnamedBlobs returns the blobs of the files that have no name left,
// sorted: what Orphans reports after a crash at this point.
func unnamedBlobs(n *NS) []uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []uint64
	for _, nd := range n.st.inodes {
		if nd.attr.Nlink == 0 && nd.attr.Blob != 0 {
			out = append(out, nd.attr.Blob)
		}
	}
	slices.Sort(out)
	return out
}

// copyDir copies the regular files of src into a new directory.
func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	must(t, err)
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dst, e.Name()), data, 0o600))
	}
	return dst
}

// walFiles returns the WAL segment paths in dir, ascending.
func walFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "wal-*.log"))
	must(t, err)
	slices.Sort(m)
	return m
}

// recordOffsets returns the start offset of every record in a segment and
// the end of the last one.
func recordOffsets(t testing.TB, data []byte) ([]int, int) {
	t.Helper()
	var offs []int
	off := 32
	for off+8 <= len(data) {
		n := int(le.Uint32(data[off:]))
		if n < 9 || off+8+n > len(data) {
			break
		}
		offs = append(offs, off)
		off += 8 + n
	}
	return offs, off
}

var _ = io.EOF
