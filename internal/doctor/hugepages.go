package doctor

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// checkHugepages: are enough huge pages reserved and free, on every NUMA
// node, and does this process's cgroup let it use them?
func (p *probe) checkHugepages() Check {
	c := Check{Name: "hugepages"}
	need := p.o.HugeMemNeed
	if p.meminfoErr != nil && len(p.pools) == 0 {
		c.Status = Fail
		c.Found = fmt.Sprintf("cannot read huge page counts: %v", p.meminfoErr)
		return c
	}
	if p.defPage == 0 && len(p.pools) == 0 {
		c.Status = Fail
		c.Found = "this kernel has no huge page support (no Hugepagesize in /proc/meminfo)"
		c.Fix = []string{"# boot a kernel built with CONFIG_HUGETLBFS=y (every distribution kernel is)"}
		return c
	}
	pgsz := p.defPage
	if pgsz == 0 {
		pgsz = p.pools[0].Size
	}
	var usable uint64
	var parts []string
	for _, pl := range p.pools {
		usable += pl.usable() * pl.Size
		s := fmt.Sprintf("%s pages %d free of %d", fmtBytes(pl.Size), pl.usable(), pl.Total)
		if pl.Reserved > 0 {
			s += fmt.Sprintf(" (%d more reserved by a mapping)", pl.Reserved)
		}
		parts = append(parts, s)
	}
	c.Found = fmt.Sprintf("%s free, %s needed: %s", fmtBytes(usable), fmtBytes(need), strings.Join(parts, ", "))
	switch {
	case usable == 0:
		c.Status = Fail
	case usable < need:
		c.Status = Warn
	default:
		c.Status = OK
	}
	if c.Status != OK {
		def := p.pool(pgsz)
		n := def.Total + ceilDiv(need-min(need, usable), pgsz)
		c.Fix = hugepageFix(n, pgsz, need)
		if def.Total > def.Free {
			c.Details = append(c.Details, fmt.Sprintf("%d %s pages are in use: if no SPDK or DPDK program is running, see \"hugepage files\" below", def.Total-def.Free, fmtBytes(pgsz)))
		}
	}
	p.checkNodes(&c, pgsz)
	p.checkHugetlbCgroup(&c, pgsz)
	return c
}

// hugepageFix is the commands that reserve n pages of the default size
// pgsz now and at every boot.
func hugepageFix(n, pgsz, need uint64) []string {
	f := []string{
		fmt.Sprintf("sysctl -w vm.nr_hugepages=%d", n),
		fmt.Sprintf("grep -E '^HugePages_(Total|Free)' /proc/meminfo   # HugePages_Total should now be %d", n),
		"# fewer? Memory is too fragmented: drop the page cache, compact, and ask again:",
		fmt.Sprintf("sync; echo 3 > /proc/sys/vm/drop_caches; echo 1 > /proc/sys/vm/compact_memory; sysctl -w vm.nr_hugepages=%d", n),
		"# keep it across reboots:",
		fmt.Sprintf("echo 'vm.nr_hugepages = %d' > /etc/sysctl.d/80-weir-hugepages.conf", n),
	}
	if pgsz >= 1<<30 {
		f = append(f, fmt.Sprintf("# %s pages can rarely be reserved after boot; reserve them on the kernel command line: default_hugepagesz=%s hugepagesz=%s hugepages=%d",
			fmtBytes(pgsz), kernelSize(pgsz), kernelSize(pgsz), n))
	} else {
		f = append(f, fmt.Sprintf("# on a busy host, reserve them at boot instead: add hugepages=%d to the kernel command line", n))
	}
	f = append(f, fmt.Sprintf("# SPDK's own script does the same: HUGEMEM=%d <spdk>/scripts/setup.sh (it reserves them on NUMA node 0 only)", max(need>>20, 1)))
	return f
}

// checkNodes adds per-NUMA-node counts when the host has more than one
// node, and warns about a node with memory but no huge pages.
func (p *probe) checkNodes(c *Check, pgsz uint64) {
	nodes, _ := filepath.Glob(filepath.Join(p.h.Sys, "devices", "system", "node", "node[0-9]*"))
	if len(nodes) < 2 {
		return
	}
	sort.Slice(nodes, func(i, j int) bool { return nodeNum(nodes[i]) < nodeNum(nodes[j]) })
	withMem, err := readList(filepath.Join(p.h.Sys, "devices", "system", "node", "has_memory"))
	if err != nil {
		withMem = nil // unknown: every node counts
	}
	var total uint64
	var empty []int
	for _, n := range nodes {
		num := nodeNum(n)
		var parts []string
		var nodeTotal uint64
		for _, pl := range p.pools {
			d := filepath.Join(n, "hugepages", fmt.Sprintf("hugepages-%dkB", pl.Size>>10))
			nr, err1 := readUint(filepath.Join(d, "nr_hugepages"))
			free, err2 := readUint(filepath.Join(d, "free_hugepages"))
			if err1 != nil || err2 != nil {
				continue
			}
			nodeTotal += nr
			parts = append(parts, fmt.Sprintf("%s %d free of %d", fmtBytes(pl.Size), free, nr))
		}
		total += nodeTotal
		mem := withMem == nil || withMem[num]
		if !mem {
			parts = append(parts, "(no memory on this node)")
		}
		c.Details = append(c.Details, fmt.Sprintf("node%d: %s", num, strings.Join(parts, ", ")))
		if nodeTotal == 0 && mem {
			empty = append(empty, num)
		}
	}
	// With no huge pages anywhere, the sysctl fix above is the whole
	// story: the kernel spreads vm.nr_hugepages over the nodes.
	if total == 0 || len(empty) == 0 {
		return
	}
	c.Status = worst(c.Status, Warn)
	per := ceilDiv(p.o.HugeMemNeed, pgsz)
	c.Fix = append(c.Fix, "# NUMA nodes without huge pages: SPDK allocates DMA memory on the node of the core or device using it")
	for _, num := range empty {
		c.Fix = append(c.Fix, fmt.Sprintf("echo %d > /sys/devices/system/node/node%d/hugepages/hugepages-%dkB/nr_hugepages", per, num, pgsz>>10))
	}
}

func nodeNum(path string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(path), "node"))
	if err != nil {
		return -1
	}
	return n
}

func readList(path string) (map[int]bool, error) {
	s, err := readTrim(path)
	if err != nil {
		return nil, err
	}
	return parseCPUList(s)
}

// checkHugetlbCgroup warns when the hugetlb cgroup of this process caps
// its huge pages below the need (a container started without a hugetlb
// limit gives SIGBUS at the first touch, the classic "works on the host,
// dies in docker").
func (p *probe) checkHugetlbCgroup(c *Check, pgsz uint64) {
	kv, err := os.ReadFile(filepath.Join(p.h.Proc, "self", "cgroup"))
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(kv), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		var file, unlimited string
		switch {
		case f[0] == "0" && f[1] == "":
			file = filepath.Join(p.h.Sys, "fs", "cgroup", f[2], "hugetlb."+cgroupSize(pgsz)+".max")
			unlimited = "max"
		case hasController(f[1], "hugetlb"):
			file = filepath.Join(p.h.Sys, "fs", "cgroup", "hugetlb", f[2], "hugetlb."+cgroupSize(pgsz)+".limit_in_bytes")
			unlimited = "-1"
		default:
			continue
		}
		s, err := readTrim(file)
		if err != nil || s == "max" {
			continue
		}
		limit, err := strconv.ParseUint(s, 10, 64)
		if err != nil || limit >= p.o.HugeMemNeed {
			continue
		}
		c.Status = worst(c.Status, Warn)
		c.Details = append(c.Details, fmt.Sprintf("the hugetlb cgroup of this process allows only %s of %s pages (%s)", fmtBytes(limit), fmtBytes(pgsz), file))
		c.Fix = append(c.Fix,
			"# lift the hugetlb cgroup limit (in a container: in the runtime's resource settings instead)",
			fmt.Sprintf("echo %s > %s", unlimited, file))
	}
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// checkHugetlbfs: DPDK maps huge pages from files on a hugetlbfs mount,
// one mount per page size it uses.
func (p *probe) checkHugetlbfs() Check {
	c := Check{Name: "hugetlbfs"}
	if p.mountsErr != nil {
		c.Status = Warn
		c.Found = fmt.Sprintf("cannot read the mount table: %v", p.mountsErr)
		return c
	}
	ms := p.hugetlbfsMounts()
	if len(ms) == 0 {
		c.Status = Fail
		c.Found = "no hugetlbfs mount"
		c.Fix = []string{
			"mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages",
			"# keep it across reboots (systemd distributions mount it already: systemctl start dev-hugepages.mount):",
			"echo 'nodev /dev/hugepages hugetlbfs defaults 0 0' >> /etc/fstab",
		}
		return c
	}
	var parts []string
	bySize := map[uint64]bool{}
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s (%s pages)", m.Point, fmtBytes(m.PageSize)))
		bySize[m.PageSize] = true
	}
	c.Status = OK
	c.Found = strings.Join(parts, ", ")
	for _, pl := range p.pools {
		if pl.Total == 0 || bySize[pl.Size] {
			continue
		}
		c.Status = Warn
		dir := "/dev/hugepages" + kernelSize(pl.Size)
		c.Details = append(c.Details, fmt.Sprintf("%d %s pages are reserved but no hugetlbfs is mounted with pagesize=%s: DPDK cannot use them",
			pl.Total, fmtBytes(pl.Size), kernelSize(pl.Size)))
		c.Fix = append(c.Fix,
			fmt.Sprintf("mkdir -p %s && mount -t hugetlbfs -o pagesize=%s nodev %s", dir, kernelSize(pl.Size), dir),
			fmt.Sprintf("echo 'nodev %s hugetlbfs pagesize=%s 0 0' >> /etc/fstab", dir, kernelSize(pl.Size)))
	}
	return c
}

// checkLeftovers looks for DPDK huge page files that no process holds:
// a DPDK process that exits normally removes them; one killed with
// SIGKILL or crashed leaves them, and they keep their pages, so the next
// start finds "no free hugepages" although HugePages_Total looks right.
// A running DPDK process holds a lock on each of its files; like SPDK's
// setup.sh, a file whose exclusive lock can be taken is stale.
func (p *probe) checkLeftovers() Check {
	c := Check{Name: "hugepage files"}
	ms := p.hugetlbfsMounts()
	if len(ms) == 0 {
		c.Status = Skip
		c.Found = "no hugetlbfs mount to look in"
		return c
	}
	type group struct {
		dir, prefix  string
		files, bytes uint64
	}
	groups := map[string]*group{}
	var inUse, other, otherBytes, staleFiles, staleBytes uint64
	var unreadable []string
	for _, m := range ms {
		dir := p.hostPath(m.Point)
		ents, err := os.ReadDir(dir)
		if err != nil {
			unreadable = append(unreadable, fmt.Sprintf("%s: %v", m.Point, err))
			continue
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue
			}
			i := strings.Index(e.Name(), "map_")
			if i < 0 {
				other++
				otherBytes += uint64(info.Size())
				continue
			}
			if !stale(filepath.Join(dir, e.Name())) {
				inUse++
				continue
			}
			key := m.Point + "\x00" + e.Name()[:i]
			g := groups[key]
			if g == nil {
				g = &group{dir: m.Point, prefix: e.Name()[:i]}
				groups[key] = g
			}
			g.files++
			g.bytes += uint64(info.Size())
			staleFiles++
			staleBytes += uint64(info.Size())
		}
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	switch {
	case staleFiles > 0:
		c.Status = Warn
		c.Found = fmt.Sprintf("%d stale DPDK huge page files hold %s (no process has them locked)", staleFiles, fmtBytes(staleBytes))
		c.Fix = append(c.Fix, "# left by an SPDK/DPDK process that was killed or crashed; with no SPDK program starting right now:")
		for _, k := range keys {
			g := groups[k]
			c.Details = append(c.Details, fmt.Sprintf("%s/%smap_*: %d files, %s", g.dir, g.prefix, g.files, fmtBytes(g.bytes)))
			c.Fix = append(c.Fix, fmt.Sprintf("rm -f %smap_*", shellQuote(filepath.Join(g.dir, g.prefix))))
		}
	case len(unreadable) > 0 && len(unreadable) == len(ms):
		c.Status = Warn
		c.Found = "cannot list the hugetlbfs mounts (run as root to check)"
	default:
		c.Status = OK
		c.Found = "no stale DPDK huge page files"
	}
	if inUse > 0 {
		c.Details = append(c.Details, fmt.Sprintf("%d DPDK files in use by running processes", inUse))
	}
	if other > 0 {
		c.Details = append(c.Details, fmt.Sprintf("%d other files (not DPDK's) hold %s", other, fmtBytes(otherBytes)))
	}
	for _, u := range unreadable {
		c.Details = append(c.Details, "cannot list "+u)
	}
	return c
}

// stale reports whether nobody holds a lock on the file at path. It takes
// an exclusive lock without waiting and drops it at once; a file it cannot
// open or lock for any other reason counts as in use.
func stale(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return true
}

// shellQuote quotes s for sh when it holds anything but safe characters;
// the result is followed directly by an unquoted glob.
func shellQuote(s string) string {
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:=@%", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// checkMemlock: with vfio, the kernel pins every page DPDK maps for DMA
// against RLIMIT_MEMLOCK, so the limit must cover the huge page memory.
func (p *probe) checkMemlock() Check {
	c := Check{Name: "memlock"}
	var rl unix.Rlimit
	if err := p.h.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		c.Status = Warn
		c.Found = fmt.Sprintf("cannot read RLIMIT_MEMLOCK: %v", err)
		return c
	}
	need := p.o.HugeMemNeed
	c.Found = fmt.Sprintf("soft limit %s, hard %s; need %s", limitString(rl.Cur), limitString(rl.Max), fmtBytes(need))
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur >= need {
		c.Status = OK
		return c
	}
	c.Status = Warn
	if p.hasCap(capIPCLock) {
		c.Details = append(c.Details, "this process has CAP_IPC_LOCK, which lifts the limit for it; a weir service started without it is held to the limit")
	}
	who := "*"
	if p.euid == 0 {
		who = "root"
	} else if p.euid > 0 {
		if u, err := user.LookupId(strconv.Itoa(p.euid)); err == nil {
			who = u.Username
		}
	}
	c.Fix = []string{
		"ulimit -l unlimited   # this shell and what it starts (as root, or up to the hard limit)",
		"# the systemd unit that runs weir (use your unit's name if it is not weir.service):",
		`mkdir -p /etc/systemd/system/weir.service.d && printf '[Service]\nLimitMEMLOCK=infinity\n' > /etc/systemd/system/weir.service.d/memlock.conf && systemctl daemon-reload`,
		"# users who log in and run weir (takes effect at the next login):",
		fmt.Sprintf("echo '%s - memlock unlimited' > /etc/security/limits.d/80-weir-memlock.conf", who),
	}
	return c
}

func limitString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return fmtBytes(v)
}
