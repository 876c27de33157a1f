package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// nvmeClass is the PCI class of an NVMe controller (mass storage,
// non-volatile memory, NVM Express), the one SPDK's setup.sh binds.
const nvmeClass = "0x010802"

// userDrivers are the kernel drivers through which SPDK reaches a PCI
// device from user space.
var userDrivers = map[string]bool{"vfio-pci": true, "uio_pci_generic": true, "igb_uio": true}

// iommuInfo is what decides how SPDK can reach PCI devices.
type iommuInfo struct {
	groups  int    // entries in /sys/kernel/iommu_groups
	vfioPCI bool   // vfio-pci loaded (or built in)
	uio     bool   // uio_pci_generic loaded (or built in)
	noIOMMU string // vfio's enable_unsafe_noiommu_mode: "Y", "N" or "" (vfio not loaded)
	vfio    bool   // the vfio module is loaded
	vendor  string // /proc/cpuinfo vendor_id
	cmdline string // /proc/cmdline
}

// driver is the driver SPDK's setup.sh would pick: vfio-pci with an IOMMU
// (or vfio's no-IOMMU mode), uio_pci_generic without.
func (i iommuInfo) driver() string {
	if i.groups > 0 || i.noIOMMU == "Y" {
		return "vfio-pci"
	}
	return "uio_pci_generic"
}

func (p *probe) iommu() iommuInfo {
	exists := func(parts ...string) bool {
		_, err := os.Stat(filepath.Join(append([]string{p.h.Sys}, parts...)...))
		return err == nil
	}
	var i iommuInfo
	if ents, err := os.ReadDir(filepath.Join(p.h.Sys, "kernel", "iommu_groups")); err == nil {
		i.groups = len(ents)
	}
	i.vfioPCI = exists("module", "vfio_pci") || exists("bus", "pci", "drivers", "vfio-pci")
	i.uio = exists("module", "uio_pci_generic") || exists("bus", "pci", "drivers", "uio_pci_generic")
	i.vfio = exists("module", "vfio")
	i.noIOMMU, _ = readTrim(filepath.Join(p.h.Sys, "module", "vfio", "parameters", "enable_unsafe_noiommu_mode"))
	if ci, err := readKeyValues(filepath.Join(p.h.Proc, "cpuinfo")); err == nil {
		i.vendor = ci["vendor_id"]
	}
	i.cmdline, _ = readTrim(filepath.Join(p.h.Proc, "cmdline"))
	return i
}

// iommuArgs is the kernel command line that turns the IOMMU on for this
// CPU vendor; iommu=pt keeps devices the kernel drives at full speed.
func (i iommuInfo) iommuArgs() string {
	if i.vendor == "AuthenticAMD" || i.vendor == "HygonGenuine" {
		return "amd_iommu=on iommu=pt"
	}
	return "intel_iommu=on iommu=pt"
}

// checkIOMMU: is there an IOMMU and vfio-pci, or at least a fallback?
func (p *probe) checkIOMMU() Check {
	c := Check{Name: "iommu"}
	i := p.iommu()
	if i.groups > 0 {
		if i.vfioPCI {
			c.Status = OK
			c.Found = fmt.Sprintf("IOMMU on (%d groups), vfio-pci loaded", i.groups)
			return c
		}
		c.Status = Warn
		c.Found = fmt.Sprintf("IOMMU on (%d groups), vfio-pci not loaded", i.groups)
		c.Fix = []string{
			"modprobe vfio-pci",
			"echo vfio-pci > /etc/modules-load.d/weir-vfio.conf   # load it at every boot",
		}
		return c
	}
	var fallback string
	switch {
	case i.noIOMMU == "Y" && i.vfioPCI:
		fallback = "vfio-pci in unsafe no-IOMMU mode"
	case i.uio:
		fallback = "uio_pci_generic loaded"
	}
	c.Found = "no IOMMU groups (IOMMU off or absent)"
	if fallback != "" {
		c.Found += ", fallback: " + fallback
	} else {
		c.Found += ", no fallback driver loaded (uio_pci_generic, vfio no-IOMMU mode)"
	}
	c.Status = Warn
	if fallback == "" && p.unboundNVMe() > 0 {
		c.Status = Fail // there is a controller to hand to SPDK and no way to do it
	}
	args := i.iommuArgs()
	if strings.Contains(i.cmdline, "intel_iommu=on") || strings.Contains(i.cmdline, "amd_iommu=on") {
		c.Details = append(c.Details, "the kernel command line asks for the IOMMU but none came up: enable VT-d / AMD-Vi in the firmware setup")
	}
	c.Fix = []string{
		"# best: an IOMMU. Enable VT-d / AMD-Vi in the firmware setup, add " + args + " to the kernel command line, reboot:",
		fmt.Sprintf(`sed -i 's/^GRUB_CMDLINE_LINUX="/&%s /' /etc/default/grub && update-grub   # RHEL, Fedora: grubby --update-kernel=ALL --args="%s"`, args, args),
		"# after the reboot:",
		"modprobe vfio-pci",
	}
	if fallback == "" {
		c.Fix = append(c.Fix,
			"# without an IOMMU (no DMA protection; SPDK then needs root to find physical addresses):",
			"modprobe uio_pci_generic")
	}
	return c
}

// nvmeCtrl is one NVMe controller on the PCI bus.
type nvmeCtrl struct {
	BDF    string
	Driver string // "" when unbound
	NUMA   int    // -1 when unknown
	Dir    string // its sysfs directory
}

// nvmeCtrls lists the NVMe controllers, sorted by address.
func (p *probe) nvmeCtrls() ([]nvmeCtrl, error) {
	base := filepath.Join(p.h.Sys, "bus", "pci", "devices")
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	var out []nvmeCtrl
	for _, e := range ents {
		dir := filepath.Join(base, e.Name())
		class, err := readTrim(filepath.Join(dir, "class"))
		if err != nil || !strings.EqualFold(class, nvmeClass) {
			continue
		}
		c := nvmeCtrl{BDF: e.Name(), NUMA: -1, Dir: dir}
		if l, err := os.Readlink(filepath.Join(dir, "driver")); err == nil {
			c.Driver = filepath.Base(l)
		}
		if s, err := readTrim(filepath.Join(dir, "numa_node")); err == nil {
			if n, err := strconv.Atoi(s); err == nil {
				c.NUMA = n
			}
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].BDF < out[j].BDF })
	return out, nil
}

// unboundNVMe counts the controllers not yet bound to a user-space driver.
func (p *probe) unboundNVMe() int {
	cs, _ := p.nvmeCtrls()
	n := 0
	for _, c := range cs {
		if !userDrivers[c.Driver] {
			n++
		}
	}
	return n
}

// nsName matches a namespace block device: nvme0n1, or nvme0c1n1 for a
// path of a multipath namespace whose block device is nvme0n1.
var nsName = regexp.MustCompile(`^nvme(\d+)(?:c\d+)?n(\d+)$`)

// blockDev is a namespace or partition of a kernel-driven controller.
type blockDev struct {
	Name string // nvme0n1, nvme0n1p2
	Dir  string // sysfs directory
}

// namespaces lists the block devices (namespaces and their partitions) of
// a controller bound to the kernel's nvme driver.
func (p *probe) namespaces(c nvmeCtrl) []blockDev {
	ctrls, _ := filepath.Glob(filepath.Join(c.Dir, "nvme", "nvme*"))
	seen := map[string]bool{}
	var out []blockDev
	for _, ctrl := range ctrls {
		ents, _ := os.ReadDir(ctrl)
		for _, e := range ents {
			m := nsName.FindStringSubmatch(e.Name())
			if m == nil {
				continue
			}
			name, dir := e.Name(), filepath.Join(ctrl, e.Name())
			if head := "nvme" + m[1] + "n" + m[2]; head != name {
				// A multipath path: the block device is the head,
				// reached through /sys/block.
				hd := filepath.Join(p.h.Sys, "block", head)
				if _, err := os.Stat(hd); err != nil {
					continue
				}
				name, dir = head, hd
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			out = append(out, blockDev{Name: name, Dir: dir})
			parts, _ := os.ReadDir(dir)
			for _, pe := range parts {
				if strings.HasPrefix(pe.Name(), name+"p") && pe.IsDir() {
					out = append(out, blockDev{Name: pe.Name(), Dir: filepath.Join(dir, pe.Name())})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// uses says how the kernel uses a block device: mounted file systems
// (matched by device name and by device number), swap, and holders
// (device mapper, md RAID, ...). Empty when unused.
func (p *probe) uses(b blockDev) []string {
	var out []string
	dev, _ := readTrim(filepath.Join(b.Dir, "dev"))
	points := map[string]bool{}
	for _, m := range p.mounts {
		if m.Source == "/dev/"+b.Name {
			points[m.Point] = true
		}
	}
	if dev != "" {
		for _, mi := range p.mountinfo() {
			if mi.dev == dev {
				points[mi.point] = true
			}
		}
	}
	var ps []string
	for pt := range points {
		ps = append(ps, pt)
	}
	sort.Strings(ps)
	for _, pt := range ps {
		out = append(out, fmt.Sprintf("%s mounted on %s", b.Name, pt))
	}
	if sw, err := os.ReadFile(filepath.Join(p.h.Proc, "swaps")); err == nil {
		for _, l := range strings.Split(string(sw), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == "/dev/"+b.Name {
				out = append(out, b.Name+" is swap")
			}
		}
	}
	if hs, err := os.ReadDir(filepath.Join(b.Dir, "holders")); err == nil {
		for _, h := range hs {
			out = append(out, fmt.Sprintf("%s held by %s", b.Name, h.Name()))
		}
	}
	return out
}

type mountinfoEntry struct{ dev, point string }

// mountinfo reads Proc/self/mountinfo: field 3 is the device number of a
// mount, which catches mounts whose source is not /dev/<name>.
func (p *probe) mountinfo() []mountinfoEntry {
	b, err := os.ReadFile(filepath.Join(p.h.Proc, "self", "mountinfo"))
	if err != nil {
		return nil
	}
	var out []mountinfoEntry
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		out = append(out, mountinfoEntry{dev: f[2], point: unescapeMount(f[4])})
	}
	return out
}

// checkNVMe reports each NVMe controller: ready for SPDK when bound to a
// user-space driver, otherwise the commands that rebind it.
func (p *probe) checkNVMe() []Check {
	cs, err := p.nvmeCtrls()
	if err != nil || len(cs) == 0 {
		c := Check{Name: "nvme", Status: Skip,
			Found: "no NVMe controller (PCI class 0x010802) on this host; weir's SPDK backend can still run on an aio, uring or malloc bdev for tests"}
		if err != nil {
			c.Details = []string{fmt.Sprintf("cannot list PCI devices: %v", err)}
		}
		return []Check{c}
	}
	iom := p.iommu()
	var out []Check
	for _, ctrl := range cs {
		out = append(out, p.checkCtrl(ctrl, iom))
	}
	return out
}

func (p *probe) checkCtrl(ctrl nvmeCtrl, iom iommuInfo) Check {
	c := Check{Name: "nvme " + ctrl.BDF}
	numa := "NUMA node unknown"
	if ctrl.NUMA >= 0 {
		numa = fmt.Sprintf("NUMA node %d", ctrl.NUMA)
	}
	if userDrivers[ctrl.Driver] {
		c.Status = OK
		c.Found = fmt.Sprintf("bound to %s, ready for SPDK; %s", ctrl.Driver, numa)
		return c
	}
	c.Status = Warn
	drv := iom.driver()
	dev := "/sys/bus/pci/devices/" + ctrl.BDF
	var inUse []string
	switch ctrl.Driver {
	case "":
		c.Found = fmt.Sprintf("not bound to any driver; %s", numa)
	case "nvme":
		ns := p.namespaces(ctrl)
		var names []string
		for _, b := range ns {
			names = append(names, b.Name)
			inUse = append(inUse, p.uses(b)...)
		}
		c.Found = fmt.Sprintf("bound to the kernel's nvme driver (in use by the kernel); %s", numa)
		if len(names) > 0 {
			c.Details = append(c.Details, "block devices: "+strings.Join(names, " "))
		}
		c.Details = append(c.Details, inUse...)
		c.Fix = append(c.Fix, fmt.Sprintf("# WARNING: this takes %s away from the kernel: its block devices disappear and what is on them is reachable only through SPDK until it is given back", ctrl.BDF))
	default:
		c.Found = fmt.Sprintf("bound to %s; %s", ctrl.Driver, numa)
	}
	cmds := []string{"modprobe " + drv}
	if ctrl.Driver != "" {
		cmds = append(cmds, fmt.Sprintf("echo %s > %s/driver/unbind", ctrl.BDF, dev))
	}
	cmds = append(cmds,
		fmt.Sprintf("echo %s > %s/driver_override", drv, dev),
		fmt.Sprintf("echo %s > /sys/bus/pci/drivers_probe", ctrl.BDF))
	if len(inUse) > 0 {
		// Pasting the whole "To fix" block must not pull a mounted file
		// system from under the kernel: leave the commands commented out.
		c.Fix = append(c.Fix,
			"# WARNING: it is in use ("+strings.Join(inUse, "; ")+"). Unmount it and stop its users first, or choose another",
			"# controller (SPDK's setup.sh skips it too). Then run these lines without the leading '# ':")
		for _, l := range cmds {
			c.Fix = append(c.Fix, "# "+l)
		}
	} else {
		c.Fix = append(c.Fix, cmds...)
	}
	c.Fix = append(c.Fix,
		fmt.Sprintf("# or with SPDK's script: PCI_ALLOWED=%s <spdk>/scripts/setup.sh", ctrl.BDF),
		fmt.Sprintf("# to give it back to the kernel later: echo %s > %s/driver/unbind; echo > %s/driver_override; echo %s > /sys/bus/pci/drivers_probe",
			ctrl.BDF, dev, dev, ctrl.BDF))
	return c
}
