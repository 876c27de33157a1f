package doctor

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// probe holds what more than one check needs, read once per Run.
type probe struct {
	h Host
	o Options

	meminfo    map[string]uint64 // /proc/meminfo values; kB fields in kB
	meminfoErr error
	defPage    uint64     // default huge page size, bytes; 0 if unknown
	pools      []pagePool // one per huge page size, smallest first
	mounts     []mount    // Proc/mounts
	mountsErr  error
	status     map[string]string // Proc/self/status
	euid       int               // -1 if unknown
	capEff     uint64
	capKnown   bool
}

// pagePool is the kernel's pool of one huge page size.
type pagePool struct {
	Size        uint64 // bytes per page
	Total       uint64 // nr_hugepages
	Free        uint64 // free_hugepages
	Reserved    uint64 // resv_hugepages: promised to a mapping, not yet faulted in
	fromMeminfo bool
}

// usable is the pages a new process can still get.
func (p pagePool) usable() uint64 {
	if p.Free > p.Reserved {
		return p.Free - p.Reserved
	}
	return 0
}

// mount is one line of /proc/mounts.
type mount struct {
	Source, Point, Type string
	Options             []string
}

func newProbe(h Host, o Options) *probe {
	p := &probe{h: h, o: o, euid: -1}
	p.meminfo, p.meminfoErr = readMeminfo(filepath.Join(h.Proc, "meminfo"))
	if kb, ok := p.meminfo["Hugepagesize"]; ok {
		p.defPage = kb << 10
	}
	p.pools = p.readPools()
	p.mounts, p.mountsErr = readMounts(filepath.Join(h.Proc, "mounts"))
	p.status, _ = readKeyValues(filepath.Join(h.Proc, "self", "status"))
	if f := strings.Fields(p.status["Uid"]); len(f) >= 2 {
		if v, err := strconv.Atoi(f[1]); err == nil {
			p.euid = v
		}
	}
	if v, err := strconv.ParseUint(strings.TrimSpace(p.status["CapEff"]), 16, 64); err == nil {
		p.capEff, p.capKnown = v, true
	}
	return p
}

// readPools reads /sys/kernel/mm/hugepages/hugepages-*kB, falling back to
// the default size's counts in /proc/meminfo.
func (p *probe) readPools() []pagePool {
	var pools []pagePool
	dirs, _ := filepath.Glob(filepath.Join(p.h.Sys, "kernel", "mm", "hugepages", "hugepages-*kB"))
	for _, d := range dirs {
		size, ok := pageSizeFromDir(filepath.Base(d))
		if !ok {
			continue
		}
		pl := pagePool{Size: size}
		pl.Total, _ = readUint(filepath.Join(d, "nr_hugepages"))
		pl.Free, _ = readUint(filepath.Join(d, "free_hugepages"))
		pl.Reserved, _ = readUint(filepath.Join(d, "resv_hugepages"))
		if size == p.defPage {
			// /proc/meminfo is what people quote; when sysfs lacks a
			// file, prefer its numbers for the default size.
			if _, err := os.Stat(filepath.Join(d, "free_hugepages")); err != nil {
				pl.Free = p.meminfo["HugePages_Free"]
				pl.Reserved = p.meminfo["HugePages_Rsvd"]
			}
		}
		pools = append(pools, pl)
	}
	have := false
	for _, pl := range pools {
		have = have || pl.Size == p.defPage
	}
	if !have && p.defPage != 0 && p.meminfoErr == nil {
		pools = append(pools, pagePool{
			Size:        p.defPage,
			Total:       p.meminfo["HugePages_Total"],
			Free:        p.meminfo["HugePages_Free"],
			Reserved:    p.meminfo["HugePages_Rsvd"],
			fromMeminfo: true,
		})
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Size < pools[j].Size })
	return pools
}

func (p *probe) pool(size uint64) pagePool {
	for _, pl := range p.pools {
		if pl.Size == size {
			return pl
		}
	}
	return pagePool{Size: size}
}

// hugetlbfsMounts are the hugetlbfs mounts and the page size of each.
func (p *probe) hugetlbfsMounts() []hugeMount {
	var out []hugeMount
	for _, m := range p.mounts {
		if m.Type != "hugetlbfs" {
			continue
		}
		hm := hugeMount{Point: m.Point, PageSize: p.defPage}
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "pagesize="); ok {
				if n, ok := parseKernelSize(v); ok {
					hm.PageSize = n
				}
			}
		}
		out = append(out, hm)
	}
	return out
}

type hugeMount struct {
	Point    string
	PageSize uint64
}

// hostPath maps a path as the host sees it (a mount point) into Host.Root.
func (p *probe) hostPath(path string) string {
	if p.h.Root == "" || p.h.Root == "/" {
		return path
	}
	return filepath.Join(p.h.Root, path)
}

// hasCap reports whether the effective capability set has capability n;
// false if unknown.
func (p *probe) hasCap(n uint) bool { return p.capKnown && p.capEff&(1<<n) != 0 }

// Capability numbers from linux/capability.h.
const (
	capIPCLock  = 14
	capSysAdmin = 21
)

// ---- file helpers ----

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return string(bytes.TrimSpace(b)), nil
}

func readUint(path string) (uint64, error) {
	s, err := readTrim(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// readMeminfo parses /proc/meminfo: "Name:   value [kB]".
func readMeminfo(path string) (map[string]uint64, error) {
	kv, err := readKeyValues(path)
	if err != nil {
		return map[string]uint64{}, err
	}
	out := make(map[string]uint64, len(kv))
	for k, v := range kv {
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// readKeyValues parses "Key:\tvalue" lines (/proc/meminfo, /proc/self/status).
func readKeyValues(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return map[string]string{}, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out, sc.Err()
}

// readMounts parses /proc/mounts, undoing the octal escapes of spaces etc.
func readMounts(path string) ([]mount, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []mount
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		out = append(out, mount{
			Source:  unescapeMount(f[0]),
			Point:   unescapeMount(f[1]),
			Type:    f[2],
			Options: strings.Split(f[3], ","),
		})
	}
	return out, nil
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// pageSizeFromDir parses "hugepages-2048kB".
func pageSizeFromDir(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, "hugepages-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "kB")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	return n << 10, true
}

// parseKernelSize parses a kernel size option such as "2M", "1G", "1024M".
func parseKernelSize(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	mult := uint64(1)
	switch s[len(s)-1] {
	case 'k', 'K':
		mult = 1 << 10
	case 'm', 'M':
		mult = 1 << 20
	case 'g', 'G':
		mult = 1 << 30
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return n * mult, true
}

// parseCPUList parses a kernel list such as "0-3,8" (node/has_memory).
func parseCPUList(s string) (map[int]bool, error) {
	out := map[int]bool{}
	s = strings.TrimSpace(s)
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("list %q: %w", s, err)
			}
		}
		for i := a; i <= b && i-a < 1<<16; i++ {
			out[i] = true
		}
	}
	return out, nil
}

// fmtBytes formats n in the largest binary unit that divides it exactly,
// or with one decimal in the largest unit below it: "2MiB", "1GiB", "7.8GiB".
func fmtBytes(n uint64) string {
	units := []struct {
		name string
		size uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatUint(n/u.size, 10) + u.name
		}
	}
	for _, u := range units {
		if n >= u.size {
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64) + u.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// kernelSize formats a page size the way mount -o pagesize= and the kernel
// command line take it: "2M", "1G".
func kernelSize(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatUint(n>>30, 10) + "G"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatUint(n>>20, 10) + "M"
	default:
		return strconv.FormatUint(n>>10, 10) + "K"
	}
}

// cgroupSize formats a page size as the hugetlb cgroup file names do:
// "hugetlb.2MB.max", "hugetlb.1GB.limit_in_bytes".
func cgroupSize(n uint64) string {
	switch {
	case n >= 1<<30:
		return strconv.FormatUint(n>>30, 10) + "GB"
	case n >= 1<<20:
		return strconv.FormatUint(n>>20, 10) + "MB"
	default:
		return strconv.FormatUint(n>>10, 10) + "KB"
	}
}

func ceilDiv(a, b uint64) uint64 {
	if b == 0 {
		return 0
	}
	return (a + b - 1) / b
}
