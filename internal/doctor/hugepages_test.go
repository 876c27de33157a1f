package doctor

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestHugepages(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(0, 0, 0)
		c := f.check("hugepages")
		wantStatus(t, c, Fail)
		wantText(t, "found", c.Found, "0B free, 1GiB needed", "2MiB pages 0 free of 0", "1GiB pages 0 free of 0")
		wantFix(t, c,
			"sysctl -w vm.nr_hugepages=512",
			"echo 'vm.nr_hugepages = 512' > /etc/sysctl.d/80-weir-hugepages.conf",
			"echo 1 > /proc/sys/vm/compact_memory",
			"hugepages=512",
			"HUGEMEM=1024")
	})
	t.Run("some", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(256, 256, 0)
		c := f.check("hugepages")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "512MiB free, 1GiB needed", "2MiB pages 256 free of 256")
		wantFix(t, c, "sysctl -w vm.nr_hugepages=512", "vm.nr_hugepages = 512")
	})
	t.Run("enough", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(1024, 1024, 0)
		c := f.check("hugepages")
		wantStatus(t, c, OK)
		if len(c.Fix) != 0 {
			t.Fatalf("fix on OK: %q", c.Fix)
		}
	})
	t.Run("more needed", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(512, 512, 0)
		c := find(t, f.run(2<<30), "hugepages")
		wantStatus(t, c, Warn)
		wantFix(t, c, "sysctl -w vm.nr_hugepages=1024", "HUGEMEM=2048")
	})
	t.Run("reserved pages are not free", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(512, 512, 100)
		c := f.check("hugepages")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "412 free of 512 (100 more reserved")
		wantFix(t, c, "sysctl -w vm.nr_hugepages=612")
	})
	t.Run("pages in use count on top", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(600, 100, 0)
		c := f.check("hugepages")
		wantStatus(t, c, Warn)
		// 100 free: 412 more are needed on top of the 600 there are.
		wantFix(t, c, "sysctl -w vm.nr_hugepages=1012")
		wantText(t, "details", strings.Join(c.Details, "\n"), "500 2MiB pages are in use", "hugepage files")
	})
	t.Run("1GiB pages count", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(0, 0, 0)
		f.pool(1048576, 1, 1, 0)
		c := f.check("hugepages")
		wantStatus(t, c, OK)
	})
	t.Run("1GiB default page size", func(t *testing.T) {
		f := newFixture(t)
		f.meminfo(1048576, 0, 0, 0)
		f.pool(1048576, 0, 0, 0)
		f.pool(2048, 0, 0, 0)
		c := find(t, f.run(2<<30), "hugepages")
		wantStatus(t, c, Fail)
		wantFix(t, c, "sysctl -w vm.nr_hugepages=2", "default_hugepagesz=1G hugepagesz=1G hugepages=2")
	})
	t.Run("meminfo only", func(t *testing.T) {
		f := newFixture(t)
		f.remove("sys/kernel/mm/hugepages")
		f.meminfo(2048, 100, 100, 0)
		c := f.check("hugepages")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "2MiB pages 100 free of 100")
		wantFix(t, c, "sysctl -w vm.nr_hugepages=512")
	})
	t.Run("no meminfo", func(t *testing.T) {
		f := newFixture(t)
		f.remove("sys/kernel/mm/hugepages")
		f.remove("proc/meminfo")
		wantStatus(t, f.check("hugepages"), Fail)
	})
}

func TestHugepagesNUMA(t *testing.T) {
	node := func(f *fixture, n string, nr, free uint64) {
		d := "sys/devices/system/node/node" + n + "/hugepages/"
		f.write(d+"hugepages-2048kB/nr_hugepages", itoa(nr))
		f.write(d+"hugepages-2048kB/free_hugepages", itoa(free))
		f.write(d+"hugepages-1048576kB/nr_hugepages", "0")
		f.write(d+"hugepages-1048576kB/free_hugepages", "0")
	}
	t.Run("one node without pages", func(t *testing.T) {
		f := newFixture(t)
		node(f, "0", 512, 512)
		node(f, "1", 0, 0)
		f.write("sys/devices/system/node/has_memory", "0-1\n")
		c := f.check("hugepages")
		wantStatus(t, c, Warn)
		wantText(t, "details", strings.Join(c.Details, "\n"),
			"node0: 2MiB 512 free of 512, 1GiB 0 free of 0", "node1: 2MiB 0 free of 0")
		wantFix(t, c, "echo 512 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages")
		wantNoFix(t, c, "node0/")
	})
	t.Run("balanced", func(t *testing.T) {
		f := newFixture(t)
		node(f, "0", 256, 256)
		node(f, "1", 256, 256)
		c := f.check("hugepages")
		wantStatus(t, c, OK)
		if len(c.Details) != 2 {
			t.Fatalf("details %q", c.Details)
		}
	})
	t.Run("node without memory", func(t *testing.T) {
		f := newFixture(t)
		node(f, "0", 512, 512)
		node(f, "1", 0, 0)
		f.write("sys/devices/system/node/has_memory", "0\n")
		c := f.check("hugepages")
		wantStatus(t, c, OK)
		wantText(t, "details", strings.Join(c.Details, "\n"), "node1: 2MiB 0 free of 0, 1GiB 0 free of 0, (no memory on this node)")
	})
	t.Run("none anywhere: sysctl spreads them", func(t *testing.T) {
		f := newFixture(t)
		f.hugepages(0, 0, 0)
		node(f, "0", 0, 0)
		node(f, "1", 0, 0)
		c := f.check("hugepages")
		wantStatus(t, c, Fail)
		wantNoFix(t, c, "/sys/devices/system/node/")
	})
	t.Run("single node: no per-node lines", func(t *testing.T) {
		f := newFixture(t)
		node(f, "0", 512, 512)
		c := f.check("hugepages")
		wantStatus(t, c, OK)
		if len(c.Details) != 0 {
			t.Fatalf("details %q", c.Details)
		}
	})
}

func TestHugepagesCgroup(t *testing.T) {
	t.Run("v2 limit", func(t *testing.T) {
		f := newFixture(t)
		f.write("proc/self/cgroup", "0::/docker/abc\n")
		f.write("sys/fs/cgroup/docker/abc/hugetlb.2MB.max", "0\n")
		c := f.check("hugepages")
		wantStatus(t, c, Warn)
		wantFix(t, c, "echo max > "+f.path("sys/fs/cgroup/docker/abc/hugetlb.2MB.max"))
	})
	t.Run("v1 limit", func(t *testing.T) {
		f := newFixture(t)
		f.write("proc/self/cgroup", "5:hugetlb:/pod\n4:memory:/pod\n")
		f.write("sys/fs/cgroup/hugetlb/pod/hugetlb.2MB.limit_in_bytes", "2097152\n")
		c := f.check("hugepages")
		wantStatus(t, c, Warn)
		wantFix(t, c, "echo -1 > "+f.path("sys/fs/cgroup/hugetlb/pod/hugetlb.2MB.limit_in_bytes"))
	})
	t.Run("unlimited", func(t *testing.T) {
		f := newFixture(t)
		f.write("proc/self/cgroup", "0::/c\n")
		f.write("sys/fs/cgroup/c/hugetlb.2MB.max", "max\n")
		wantStatus(t, f.check("hugepages"), OK)
	})
}

func TestHugetlbfs(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		f := newFixture(t)
		f.write("proc/mounts", "sysfs /sys sysfs rw 0 0\n")
		c := f.check("hugetlbfs")
		wantStatus(t, c, Fail)
		wantFix(t, c, "mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages",
			"nodev /dev/hugepages hugetlbfs defaults 0 0' >> /etc/fstab")
		wantStatus(t, f.check("hugepage files"), Skip)
	})
	t.Run("mounted", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("hugetlbfs")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "/dev/hugepages (2MiB pages)")
	})
	t.Run("default page size without option", func(t *testing.T) {
		f := newFixture(t)
		f.write("proc/mounts", "hugetlbfs /mnt/huge\\040pages hugetlbfs rw,relatime 0 0\n")
		f.mkdir("mnt/huge pages")
		c := f.check("hugetlbfs")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "/mnt/huge pages (2MiB pages)")
	})
	t.Run("1GiB pages without a 1G mount", func(t *testing.T) {
		f := newFixture(t)
		f.pool(1048576, 2, 2, 0)
		c := f.check("hugetlbfs")
		wantStatus(t, c, Warn)
		wantFix(t, c, "mount -t hugetlbfs -o pagesize=1G nodev /dev/hugepages1G")
	})
	t.Run("unreadable mount table", func(t *testing.T) {
		f := newFixture(t)
		f.remove("proc/mounts")
		wantStatus(t, f.check("hugetlbfs"), Warn)
	})
}

func TestLeftovers(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("hugepage files")
		wantStatus(t, c, OK)
	})
	t.Run("stale and in use", func(t *testing.T) {
		f := newFixture(t)
		f.write("dev/hugepages/spdk_pid42map_0", strings.Repeat("x", 2<<20))
		f.write("dev/hugepages/spdk_pid42map_1", strings.Repeat("x", 2<<20))
		f.write("dev/hugepages/rtemap_0", "")
		f.write("dev/hugepages/weir0map_0", "")
		f.write("dev/hugepages/qemu-guest", "x")
		// A running DPDK process holds a lock on its files.
		held, err := os.Open(f.path("dev/hugepages/weir0map_0"))
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		if err := unix.Flock(int(held.Fd()), unix.LOCK_SH); err != nil {
			t.Fatal(err)
		}
		c := f.check("hugepage files")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "3 stale DPDK huge page files hold 4MiB")
		wantFix(t, c, "rm -f /dev/hugepages/spdk_pid42map_*", "rm -f /dev/hugepages/rtemap_*")
		wantNoFix(t, c, "weir0", "qemu")
		wantText(t, "details", strings.Join(c.Details, "\n"),
			"/dev/hugepages/spdk_pid42map_*: 2 files, 4MiB", "1 DPDK files in use", "1 other files")
	})
	t.Run("odd mount point is quoted", func(t *testing.T) {
		f := newFixture(t)
		f.write("proc/mounts", "nodev /mnt/my\\040huge hugetlbfs rw,pagesize=2M 0 0\n")
		f.write("mnt/my huge/spdk0map_3", "")
		c := f.check("hugepage files")
		wantStatus(t, c, Warn)
		wantFix(t, c, "rm -f '/mnt/my huge/spdk0'map_*")
	})
}

func TestMemlock(t *testing.T) {
	t.Run("low", func(t *testing.T) {
		f := newFixture(t)
		f.rl = unix.Rlimit{Cur: 8 << 20, Max: 64 << 20}
		c := f.check("memlock")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "soft limit 8MiB, hard 64MiB; need 1GiB")
		wantFix(t, c, "ulimit -l unlimited", "LimitMEMLOCK=infinity", "/etc/security/limits.d/", "memlock unlimited")
		wantText(t, "details", strings.Join(c.Details, "\n"), "CAP_IPC_LOCK")
	})
	t.Run("low without CAP_IPC_LOCK", func(t *testing.T) {
		f := newFixture(t)
		f.status(1000, capsNone)
		f.rl = unix.Rlimit{Cur: 64 << 10, Max: 64 << 10}
		c := f.check("memlock")
		wantStatus(t, c, Warn)
		if len(c.Details) != 0 {
			t.Fatalf("details %q", c.Details)
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("memlock")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "soft limit unlimited, hard unlimited")
	})
	t.Run("enough", func(t *testing.T) {
		f := newFixture(t)
		f.rl = unix.Rlimit{Cur: 4 << 30, Max: 4 << 30}
		wantStatus(t, f.check("memlock"), OK)
		c := find(t, f.run(8<<30), "memlock")
		wantStatus(t, c, Warn)
	})
	t.Run("error", func(t *testing.T) {
		f := newFixture(t)
		f.rlErr = errors.New("boom")
		wantStatus(t, f.check("memlock"), Warn)
	})
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) + "\n" }
