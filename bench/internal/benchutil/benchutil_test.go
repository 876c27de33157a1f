package benchutil

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPercentile(t *testing.T) {
	var ns []int64
	for i := int64(1); i <= 1000; i++ {
		ns = append(ns, i*1000)
	}
	for _, tc := range []struct{ p, want float64 }{{0.5, 500}, {0.99, 990}, {0.999, 999}, {1, 1000}} {
		if got := PercentileUs(ns, tc.p); got != tc.want {
			t.Errorf("PercentileUs(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := PercentileUs(nil, 0.5); got != 0 {
		t.Errorf("PercentileUs of nothing = %v, want 0", got)
	}
}

func TestProc(t *testing.T) {
	if _, err := ProcCPU(os.Getpid()); err != nil {
		t.Error(err)
	}
	if kib, err := ProcPeakRSS(os.Getpid()); err != nil || kib <= 0 {
		t.Errorf("ProcPeakRSS = %d, %v", kib, err)
	}
	if _, err := ReadMachineCPU(); err != nil {
		t.Error(err)
	}
	if _, err := ProcCPU(-1); err == nil {
		t.Error("ProcCPU of no process succeeded")
	}
	if _, err := ProcPeakRSS(-1); err == nil {
		t.Error("ProcPeakRSS of no process succeeded")
	}
}

func TestHostInfo(t *testing.T) {
	h, err := HostInfo()
	if err != nil {
		t.Fatal(err)
	}
	if h.NProc <= 0 || h.GoVersion == "" || h.Kernel == "" || h.CPUModel == "" {
		t.Errorf("HostInfo = %+v", h)
	}
}

func TestDescribeFS(t *testing.T) {
	f, err := DescribeFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if f.StatType == "" || f.String() == "" {
		t.Errorf("DescribeFS = %+v", f)
	}
	for _, tc := range []struct {
		path, dir string
		want      bool
	}{{"/a/b", "/", true}, {"/a/b", "/a", true}, {"/a", "/a", true}, {"/ab", "/a", false}} {
		if got := within(tc.path, tc.dir); got != tc.want {
			t.Errorf("within(%q, %q) = %v", tc.path, tc.dir, got)
		}
	}
	if got := unescapeMount(`/mnt/a\040b`); got != "/mnt/a b" {
		t.Errorf("unescapeMount = %q", got)
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567.4, "1,234,567"}} {
		if got := Fint(tc.v); got != tc.want {
			t.Errorf("Fint(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
	for _, tc := range []struct {
		v    float64
		want string
	}{{0.812, "0.81"}, {13.26, "13.3"}, {157.2, "157"}} {
		if got := Fnum(tc.v); got != tc.want {
			t.Errorf("Fnum(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
	if Plural(1, "file") != "file" || Plural(2, "file") != "files" {
		t.Error("Plural")
	}
}

func TestWriteFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "r.md")
	if err := WriteFileAtomic(path, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "x" {
		t.Fatalf("read back %q, %v", b, err)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
}

// The flush counter of the disk under the temporary directory moves with
// an fdatasync of a written file (on a block device; skipped on tmpfs).
func TestDiskFlushes(t *testing.T) {
	dir := t.TempDir()
	before, dev, err := DiskFlushes(dir)
	if err != nil {
		t.Skipf("no flush counter for %s: %v", dir, err)
	}
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 3 {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	after, _, err := DiskFlushes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("%s: %d flushes before three fdatasyncs, %d after", dev, before, after)
	}
}
