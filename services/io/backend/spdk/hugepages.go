//go:build spdk

package spdk

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// HugePagesFree returns the bytes of free huge pages of the default size
// (/proc/meminfo), 0 if it cannot tell. Tests use it to run SPDK on huge
// pages where the host has them and with --no-huge where it does not.
func HugePagesFree() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var free, size uint64
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
	return free * size
}
