package doctor

import (
	"strings"
	"testing"
)

// noIOMMU removes the IOMMU groups and vfio-pci from the fixture.
func noIOMMU(f *fixture) {
	f.remove("sys/kernel/iommu_groups")
	f.mkdir("sys/kernel/iommu_groups")
	f.remove("sys/module/vfio_pci")
}

func TestIOMMU(t *testing.T) {
	t.Run("vfio ready", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("iommu")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "IOMMU on (2 groups), vfio-pci loaded")
	})
	t.Run("vfio-pci built in", func(t *testing.T) {
		f := newFixture(t)
		f.remove("sys/module/vfio_pci")
		f.mkdir("sys/bus/pci/drivers/vfio-pci")
		wantStatus(t, f.check("iommu"), OK)
	})
	t.Run("vfio-pci not loaded", func(t *testing.T) {
		f := newFixture(t)
		f.remove("sys/module/vfio_pci")
		c := f.check("iommu")
		wantStatus(t, c, Warn)
		wantFix(t, c, "modprobe vfio-pci", "/etc/modules-load.d/")
	})
	t.Run("no IOMMU, nothing loaded, nothing to bind", func(t *testing.T) {
		f := newFixture(t)
		noIOMMU(f)
		c := f.check("iommu")
		wantStatus(t, c, Warn)
		wantFix(t, c, "intel_iommu=on iommu=pt", "update-grub", "modprobe vfio-pci", "modprobe uio_pci_generic")
		wantNoFix(t, c, "amd_iommu")
	})
	t.Run("AMD", func(t *testing.T) {
		f := newFixture(t)
		noIOMMU(f)
		f.write("proc/cpuinfo", "vendor_id\t: AuthenticAMD\n")
		c := f.check("iommu")
		wantFix(t, c, "amd_iommu=on iommu=pt")
		wantNoFix(t, c, "intel_iommu")
	})
	t.Run("asked for on the command line but absent", func(t *testing.T) {
		f := newFixture(t)
		noIOMMU(f)
		f.write("proc/cmdline", "ro intel_iommu=on iommu=pt\n")
		c := f.check("iommu")
		wantText(t, "details", strings.Join(c.Details, "\n"), "firmware")
	})
	t.Run("no IOMMU, uio fallback", func(t *testing.T) {
		f := newFixture(t)
		noIOMMU(f)
		f.mkdir("sys/module/uio_pci_generic")
		f.pciDev("0000:01:00.0", "0x010802", "nvme", 0)
		c := f.check("iommu")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "fallback: uio_pci_generic loaded")
		wantNoFix(t, c, "modprobe uio_pci_generic")
	})
	t.Run("no IOMMU, vfio no-IOMMU mode", func(t *testing.T) {
		f := newFixture(t)
		noIOMMU(f)
		f.mkdir("sys/module/vfio_pci")
		f.write("sys/module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n")
		c := f.check("iommu")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "unsafe no-IOMMU mode")
	})
	t.Run("no IOMMU, no driver, a controller to bind", func(t *testing.T) {
		f := newFixture(t)
		noIOMMU(f)
		f.pciDev("0000:01:00.0", "0x010802", "nvme", 0)
		wantStatus(t, f.check("iommu"), Fail)
	})
}

// kernelNVMe adds a controller bound to the kernel's nvme driver with
// namespace nvme0n1 (259:0) and partitions nvme0n1p1 (259:1), nvme0n1p2 (259:2).
func kernelNVMe(f *fixture, bdf string) {
	f.pciDev(bdf, "0x010802", "nvme", 1)
	ns := "sys/bus/pci/devices/" + bdf + "/nvme/nvme0/nvme0n1/"
	f.write(ns+"dev", "259:0\n")
	f.mkdir(ns + "holders")
	f.write(ns+"nvme0n1p1/dev", "259:1\n")
	f.mkdir(ns + "nvme0n1p1/holders")
	f.write(ns+"nvme0n1p2/dev", "259:2\n")
	f.write("sys/bus/pci/devices/"+bdf+"/nvme/nvme0/dev", "245:0\n") // not a namespace
}

func TestNVMe(t *testing.T) {
	const bdf = "0000:01:00.0"
	t.Run("none", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("nvme")
		wantStatus(t, c, Skip)
		wantText(t, "found", c.Found, "no NVMe controller", "aio", "uring", "malloc")
	})
	t.Run("bound to vfio-pci", func(t *testing.T) {
		f := newFixture(t)
		f.pciDev(bdf, "0x010802", "vfio-pci", 0)
		c := f.check("nvme " + bdf)
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "bound to vfio-pci", "NUMA node 0")
	})
	t.Run("bound to uio_pci_generic, NUMA unknown", func(t *testing.T) {
		f := newFixture(t)
		f.pciDev(bdf, "0x010802", "uio_pci_generic", -1)
		c := f.check("nvme " + bdf)
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "NUMA node unknown")
	})
	t.Run("bound to nvme, unused", func(t *testing.T) {
		f := newFixture(t)
		kernelNVMe(f, bdf)
		c := f.check("nvme " + bdf)
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "bound to the kernel's nvme driver", "NUMA node 1")
		wantText(t, "details", strings.Join(c.Details, "\n"), "block devices: nvme0n1 nvme0n1p1 nvme0n1p2")
		dev := "/sys/bus/pci/devices/" + bdf
		want := []string{
			"modprobe vfio-pci",
			"echo " + bdf + " > " + dev + "/driver/unbind",
			"echo vfio-pci > " + dev + "/driver_override",
			"echo " + bdf + " > /sys/bus/pci/drivers_probe",
		}
		i := 0
		for _, l := range c.Fix {
			if i < len(want) && l == want[i] {
				i++
			}
		}
		if i != len(want) {
			t.Fatalf("fix lacks, in order, %q:\n%s", want, strings.Join(c.Fix, "\n"))
		}
		wantFix(t, c, "# WARNING: this takes "+bdf+" away from the kernel", "PCI_ALLOWED="+bdf)
	})
	t.Run("bound to nvme, mounted", func(t *testing.T) {
		f := newFixture(t)
		kernelNVMe(f, bdf)
		f.write("proc/mounts", "hugetlbfs /dev/hugepages hugetlbfs rw,pagesize=2M 0 0\n/dev/nvme0n1p1 /data ext4 rw 0 0\n")
		c := f.check("nvme " + bdf)
		wantStatus(t, c, Warn)
		wantText(t, "details", strings.Join(c.Details, "\n"), "nvme0n1p1 mounted on /data")
		wantFix(t, c, "in use (nvme0n1p1 mounted on /data)", "Unmount")
		// Nothing that rebinds runs when the block is pasted.
		for _, l := range c.Fix {
			if !strings.HasPrefix(l, "#") {
				t.Errorf("live command for a mounted controller: %q", l)
			}
		}
		wantFix(t, c, "# echo "+bdf+" > /sys/bus/pci/devices/"+bdf+"/driver/unbind")
	})
	t.Run("bound to nvme, mounted by device number, swap, holder", func(t *testing.T) {
		f := newFixture(t)
		kernelNVMe(f, bdf)
		f.write("proc/self/mountinfo", "22 1 259:1 / /srv rw,relatime - xfs /dev/disk/by-label/srv rw\n")
		f.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n1p2\tpartition\t1024\t0\t-2\n")
		f.mkdir("sys/bus/pci/devices/" + bdf + "/nvme/nvme0/nvme0n1/holders/dm-0")
		c := f.check("nvme " + bdf)
		d := strings.Join(c.Details, "\n")
		wantText(t, "details", d, "nvme0n1p1 mounted on /srv", "nvme0n1p2 is swap", "nvme0n1 held by dm-0")
	})
	t.Run("multipath path resolves to the head", func(t *testing.T) {
		f := newFixture(t)
		f.pciDev(bdf, "0x010802", "nvme", 0)
		f.mkdir("sys/bus/pci/devices/" + bdf + "/nvme/nvme3/nvme2c3n1")
		f.write("sys/block/nvme2n1/dev", "259:7\n")
		f.write("proc/mounts", "/dev/nvme2n1 /mnt ext4 rw 0 0\n")
		c := f.check("nvme " + bdf)
		wantText(t, "details", strings.Join(c.Details, "\n"), "block devices: nvme2n1", "nvme2n1 mounted on /mnt")
	})
	t.Run("unbound, no IOMMU: uio_pci_generic", func(t *testing.T) {
		f := newFixture(t)
		noIOMMU(f)
		f.pciDev(bdf, "0x010802", "", 0)
		c := f.check("nvme " + bdf)
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "not bound to any driver")
		wantFix(t, c, "modprobe uio_pci_generic", "echo uio_pci_generic > /sys/bus/pci/devices/"+bdf+"/driver_override")
		wantNoFix(t, c, "/driver/unbind\n", "WARNING")
	})
	t.Run("several, sorted", func(t *testing.T) {
		f := newFixture(t)
		f.pciDev("0000:82:00.0", "0x010802", "vfio-pci", 1)
		f.pciDev("0000:03:00.0", "0x010802", "pci-stub", 0)
		r := f.run(0)
		var names []string
		for _, c := range r.Checks {
			if strings.HasPrefix(c.Name, "nvme") {
				names = append(names, c.Name)
			}
		}
		if strings.Join(names, ",") != "nvme 0000:03:00.0,nvme 0000:82:00.0" {
			t.Fatalf("nvme checks %q", names)
		}
		c := find(t, r, "nvme 0000:03:00.0")
		wantStatus(t, c, Warn)
		wantFix(t, c, "echo 0000:03:00.0 > /sys/bus/pci/devices/0000:03:00.0/driver/unbind")
	})
}
