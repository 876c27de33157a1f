package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fixture is a fake host: proc/, sys/ and the hugetlbfs mount points under
// one temporary root, a fake pkg-config and a fake RLIMIT_MEMLOCK. A new
// fixture is a healthy host (root, enough 2 MiB pages, hugetlbfs mounted,
// unlimited memlock, IOMMU with vfio-pci, SPDK found, no NVMe); tests
// break one thing at a time.
type fixture struct {
	t     *testing.T
	root  string
	rl    unix.Rlimit
	rlErr error
	spdk  []string // Host.SPDKDirs
	pkgcf string   // Host.PkgConfig
	ldd   string   // Host.Ldd
}

const (
	capsAll  = "000001ffffffffff"
	capsNone = "0000000000000000"
)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, root: t.TempDir(), rl: unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}}
	f.meminfo(2048, 512, 512, 0)
	f.pool(2048, 512, 512, 0)
	f.pool(1048576, 0, 0, 0)
	f.write("proc/mounts", "sysfs /sys sysfs rw 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n")
	f.mkdir("dev/hugepages")
	f.status(0, capsAll)
	f.write("proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\n")
	f.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro\n")
	f.mkdir("sys/kernel/iommu_groups/0")
	f.mkdir("sys/kernel/iommu_groups/1")
	f.mkdir("sys/module/vfio_pci")
	f.mkdir("sys/bus/pci/devices")
	f.pciDev("0000:00:1f.2", "0x010601", "ahci", 0) // a SATA controller: not NVMe
	f.spdkInstall("opt/spdk", "26", "5", "0")
	f.pkgConfig(allModules("opt/spdk"))
	f.fakeLdd()
	return f
}

// allModules maps every module weir links to prefix.
func allModules(prefix string) map[string]string {
	m := map[string]string{}
	for _, n := range spdkModules {
		m[n] = prefix
	}
	return m
}

func (f *fixture) path(rel string) string { return filepath.Join(f.root, rel) }

func (f *fixture) mkdir(rel string) {
	f.t.Helper()
	if err := os.MkdirAll(f.path(rel), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) write(rel, content string) {
	f.t.Helper()
	f.mkdir(filepath.Dir(rel))
	if err := os.WriteFile(f.path(rel), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) remove(rel string) {
	f.t.Helper()
	if err := os.RemoveAll(f.path(rel)); err != nil {
		f.t.Fatal(err)
	}
}

// link makes rel a symlink to target (taken as is).
func (f *fixture) link(rel, target string) {
	f.t.Helper()
	f.mkdir(filepath.Dir(rel))
	if err := os.Symlink(target, f.path(rel)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) meminfo(pageKB, total, free, rsvd uint64) {
	f.write("proc/meminfo", fmt.Sprintf(`MemTotal:       16384000 kB
MemFree:         8000000 kB
AnonHugePages:         0 kB
HugePages_Total:    %d
HugePages_Free:     %d
HugePages_Rsvd:     %d
HugePages_Surp:        0
Hugepagesize:       %d kB
Hugetlb:               0 kB
`, total, free, rsvd, pageKB))
}

func (f *fixture) pool(pageKB, total, free, resv uint64) {
	d := fmt.Sprintf("sys/kernel/mm/hugepages/hugepages-%dkB/", pageKB)
	f.write(d+"nr_hugepages", fmt.Sprintf("%d\n", total))
	f.write(d+"free_hugepages", fmt.Sprintf("%d\n", free))
	f.write(d+"resv_hugepages", fmt.Sprintf("%d\n", resv))
}

// hugepages sets the default 2 MiB pool in both /proc/meminfo and sysfs.
func (f *fixture) hugepages(total, free, resv uint64) {
	f.meminfo(2048, total, free, resv)
	f.pool(2048, total, free, resv)
}

func (f *fixture) status(euid int, capEff string) {
	f.write("proc/self/status", fmt.Sprintf("Name:\tweir\nUid:\t%d\t%d\t%d\t%d\nCapInh:\t0000000000000000\nCapEff:\t%s\n", euid, euid, euid, euid, capEff))
}

func (f *fixture) pciDev(bdf, class, driver string, numa int) {
	d := "sys/bus/pci/devices/" + bdf + "/"
	f.write(d+"class", class+"\n")
	f.write(d+"numa_node", fmt.Sprintf("%d\n", numa))
	if driver != "" {
		f.mkdir("sys/bus/pci/drivers/" + driver)
		f.link(d+"driver", "../../../bus/pci/drivers/"+driver)
	}
}

// pkgConfig installs a fake pkg-config that knows the given modules, each
// installed in a prefix under the root (as spdkInstall makes one): it
// answers --libs-only-l, --libs-only-L and --cflags-only-I as SPDK's .pc
// files make pkg-config answer (each module's own library first, then
// what it requires; spdk_syslibs names system libraries only).
func (f *fixture) pkgConfig(prefixes map[string]string) {
	var b strings.Builder
	b.WriteString("#!/bin/sh\nm=\"$2\"\ncase \"$m\" in\n")
	for m, p := range prefixes {
		fmt.Fprintf(&b, "%s) p=%s ;;\n", m, f.path(p))
	}
	b.WriteString("*) echo \"Package $m was not found in the pkg-config search path.\" >&2; exit 1 ;;\nesac\n")
	b.WriteString("case \"$1\" in\n")
	b.WriteString("--libs-only-l) if [ \"$m\" = spdk_syslibs ]; then echo \"-luuid -lnuma\"; else echo \"-l$m -lspdk_log\"; fi ;;\n")
	b.WriteString("--libs-only-L) echo \"-L$p/lib \" ;;\n")
	b.WriteString("--cflags-only-I) [ \"$m\" = spdk_syslibs ] || echo \"-I$p/include \" ;;\n")
	b.WriteString("*) exit 2 ;;\nesac\n")
	f.write("bin/pkg-config", b.String())
	if err := os.Chmod(f.path("bin/pkg-config"), 0o755); err != nil {
		f.t.Fatal(err)
	}
	f.pkgcf = f.path("bin/pkg-config")
}

// spdkInstall makes an SPDK installation in prefix (under the root): the
// release's spdk/version.h, as SPDK writes it, and a shared library per
// module.
func (f *fixture) spdkInstall(prefix, major, minor, patch string) {
	f.write(prefix+"/include/spdk/version.h", fmt.Sprintf(`#ifndef SPDK_VERSION_H
#define SPDK_VERSION_H
#define SPDK_VERSION_MAJOR	%s
#define SPDK_VERSION_MINOR	%s
#define SPDK_VERSION_PATCH	%s
#define SPDK_VERSION_SUFFIX	""
#define SPDK_VERSION_NUM(major, minor, patch) \\
	(((major) * 100 + (minor)) * 100 + (patch))
#endif
`, major, minor, patch))
	for _, m := range spdkModules {
		if m != "spdk_syslibs" {
			f.write(prefix+"/lib/lib"+m+".so", "ELF")
		}
	}
}

// fakeLdd installs an ldd that resolves everything but what a library's
// contents name after "NEEDS ".
func (f *fixture) fakeLdd() {
	f.write("bin/ldd", `#!/bin/sh
echo "	linux-vdso.so.1 (0x00007ffc00000000)"
echo "	libspdk_log.so.9.0 => $LD_LIBRARY_PATH/libspdk_log.so.9.0 (0x00007f0000000000)"
sed -n 's/^NEEDS \(.*\)/	\1 => not found/p' "$1"
`)
	if err := os.Chmod(f.path("bin/ldd"), 0o755); err != nil {
		f.t.Fatal(err)
	}
	f.ldd = f.path("bin/ldd")
}

func (f *fixture) host() Host {
	return Host{
		Proc:      f.path("proc"),
		Sys:       f.path("sys"),
		Root:      f.root,
		PkgConfig: f.pkgcf,
		Ldd:       f.ldd,
		Getrlimit: func(resource int, rl *unix.Rlimit) error {
			if resource != unix.RLIMIT_MEMLOCK {
				f.t.Errorf("Getrlimit(%d), want RLIMIT_MEMLOCK", resource)
			}
			*rl = f.rl
			return f.rlErr
		},
		SPDKDirs: f.spdk,
	}
}

func (f *fixture) run(need uint64) Report {
	f.t.Helper()
	return Run(context.Background(), f.host(), Options{HugeMemNeed: need})
}

// check runs the doctor and returns the check called name.
func (f *fixture) check(name string) Check {
	f.t.Helper()
	return find(f.t, f.run(0), name)
}

func find(t *testing.T, r Report, name string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return Check{}
}

func wantStatus(t *testing.T, c Check, s Status) {
	t.Helper()
	if c.Status != s {
		t.Fatalf("%s: status %s, want %s\nfound: %s\ndetails: %q\nfix: %q", c.Name, c.Status, s, c.Found, c.Details, c.Fix)
	}
}

// wantFix asserts that some fix line contains each of subs.
func wantFix(t *testing.T, c Check, subs ...string) {
	t.Helper()
	all := strings.Join(c.Fix, "\n")
	for _, s := range subs {
		if !strings.Contains(all, s) {
			t.Errorf("%s: fix lacks %q:\n%s", c.Name, s, all)
		}
	}
}

func wantNoFix(t *testing.T, c Check, subs ...string) {
	t.Helper()
	all := strings.Join(c.Fix, "\n")
	for _, s := range subs {
		if strings.Contains(all, s) {
			t.Errorf("%s: fix has %q:\n%s", c.Name, s, all)
		}
	}
}

func wantText(t *testing.T, what, text string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(text, s) {
			t.Errorf("%s lacks %q:\n%s", what, s, text)
		}
	}
}

func TestHealthyHost(t *testing.T) {
	f := newFixture(t)
	r := f.run(0)
	for _, c := range r.Checks {
		want := OK
		if c.Name == "nvme" || c.Name == "SPDK NVMe flushes" { // no NVMe; no SPDK config given
			want = Skip
		}
		wantStatus(t, c, want)
		if c.Status == OK && len(c.Fix) > 0 {
			t.Errorf("%s: OK with a fix: %q", c.Name, c.Fix)
		}
	}
	if r.Failed() {
		t.Fatal("Failed() on a healthy host")
	}
	var b bytes.Buffer
	if err := r.Write(&b, false); err != nil {
		t.Fatal(err)
	}
	wantText(t, "report", b.String(), "Nothing to fix.")
}

func TestWriteText(t *testing.T) {
	r := Report{Checks: []Check{
		{Name: "a", Status: OK, Found: "fine"},
		{Name: "longer name", Status: Fail, Found: "broken", Details: []string{"why"}, Fix: []string{"# note", "do it"}},
		{Name: "c", Status: Warn, Found: "meh", Fix: []string{"tweak"}},
	}}
	var b bytes.Buffer
	if err := r.Write(&b, false); err != nil {
		t.Fatal(err)
	}
	want := `STATUS  CHECK        FOUND
OK      a            fine
FAIL    longer name  broken
                       why
WARN    c            meh

To fix (as root; lines starting with # are notes):

# --- longer name (FAIL)
# note
do it

# --- c (WARN)
tweak
`
	if b.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	if !r.Failed() {
		t.Fatal("Failed() = false with a FAIL")
	}
}

func TestWriteJSON(t *testing.T) {
	f := newFixture(t)
	f.hugepages(0, 0, 0)
	r := f.run(0)
	var b bytes.Buffer
	if err := r.Write(&b, true); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if len(back.Checks) != len(r.Checks) || !back.Failed() {
		t.Fatalf("round trip: %+v", back)
	}
	hp := find(t, back, "hugepages")
	wantStatus(t, hp, Fail)
	wantFix(t, hp, "sysctl -w vm.nr_hugepages=512")
	wantText(t, "json", b.String(), `"status": "FAIL"`, `"name": "hugepages"`)
}

// TestRealHost runs against this machine's /proc and /sys. It asserts
// nothing about the machine, only that every check comes back whole.
func TestRealHost(t *testing.T) {
	r := Run(context.Background(), DefaultHost(), Options{})
	if len(r.Checks) < 8 {
		t.Fatalf("only %d checks", len(r.Checks))
	}
	for _, c := range r.Checks {
		switch c.Status {
		case OK, Warn, Fail, Skip:
		default:
			t.Errorf("check %q: status %q", c.Name, c.Status)
		}
		if c.Name == "" || c.Found == "" {
			t.Errorf("incomplete check %+v", c)
		}
	}
	for _, asJSON := range []bool{false, true} {
		if err := r.Write(&bytes.Buffer{}, asJSON); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFmtBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0B", 512: "512B", 2 << 20: "2MiB", 1 << 30: "1GiB", 8036 << 20: "8036MiB",
		1<<30 + 1<<29: "1536MiB", 1<<30 + 1: "1.0GiB", 3 << 40: "3TiB",
	} {
		if got := fmtBytes(n); got != want {
			t.Errorf("fmtBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
