//go:build spdk

package spdk

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// HugePagesFree returns the bytes of free huge pages of the default size
// that DPDK can use: free in /proc/meminfo and with a hugetlbfs mounted for
// that size (DPDK maps its pages from files there; reserved pages without a
// mount are no use to it). 0 if there are none or it cannot tell. Tests use
// it to run SPDK on huge pages where the host has them and with --no-huge
// where it does not.
func HugePagesFree() uint64 {
	free, size := meminfoHuge()
	if free == 0 || !hugetlbfsMounted(size) {
		return 0
	}
	return free * size
}

// meminfoHuge reads HugePages_Free and Hugepagesize (bytes) from
// /proc/meminfo; zeros if it cannot.
func meminfoHuge() (free, size uint64) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.Fields(v + " 0")[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "HugePages_Free":
			free = n
		case "Hugepagesize":
			size = n << 10 // kB
		}
	}
	return free, size
}

// hugetlbfsMounts lists the page sizes of the hugetlbfs mounts this
// process sees (/proc/self/mounts); a mount without pagesize= has the
// default size def.
func hugetlbfsMounts(def uint64) []uint64 {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	return parseHugeMounts(string(b), def)
}

// parseHugeMounts reads the hugetlbfs lines of a mount table.
func parseHugeMounts(table string, def uint64) []uint64 {
	var out []uint64
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[2] != "hugetlbfs" {
			continue
		}
		size := def
		for _, o := range strings.Split(f[3], ",") {
			if v, ok := strings.CutPrefix(o, "pagesize="); ok {
				if n, ok := parsePageSize(v); ok {
					size = n
				}
			}
		}
		out = append(out, size)
	}
	return out
}

func hugetlbfsMounted(size uint64) bool {
	for _, s := range hugetlbfsMounts(size) {
		if s == size {
			return true
		}
	}
	return false
}

// parsePageSize reads the kernel's spelling of a page size in mount
// options: "2M", "1G", "2048k".
func parsePageSize(v string) (uint64, bool) {
	if v == "" {
		return 0, false
	}
	mult := uint64(1)
	switch v[len(v)-1] {
	case 'k', 'K':
		mult = 1 << 10
	case 'm', 'M':
		mult = 1 << 20
	case 'g', 'G':
		mult = 1 << 30
	}
	if mult != 1 {
		v = v[:len(v)-1]
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false
	}
	return n * mult, true
}

// hugePagesProblem says why SPDK cannot start on huge pages here, nil if
// it may: DPDK's own message for this ("no mounted hugetlbfs found") goes
// to its log, and its init fails with a bare EIO.
func hugePagesProblem() error {
	_, size := meminfoHuge()
	if len(hugetlbfsMounts(size)) > 0 {
		return nil
	}
	return fmt.Errorf("spdk: no hugetlbfs is mounted, and DPDK maps its huge pages from one "+
		"(mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; weir doctor checks it), "+
		"or run without huge pages (io.spdk_no_huge = true, tests only: no DMA to real devices): %w", syscall.ENOENT)
}
