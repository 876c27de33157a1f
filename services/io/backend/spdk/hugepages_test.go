//go:build spdk

package spdk

import (
	"slices"
	"testing"
)

// TestHugeMounts: a hugetlbfs without pagesize= has the default size, one
// with it has that size, and other file systems do not count: reserved
// pages with no mount of their size are pages DPDK cannot use.
func TestHugeMounts(t *testing.T) {
	const table = `sysfs /sys sysfs rw,nosuid 0 0
nodev /dev/hugepages hugetlbfs rw,relatime 0 0
nodev /mnt/huge1G hugetlbfs rw,relatime,pagesize=1G 0 0
nodev /mnt/huge2k hugetlbfs rw,pagesize=2048k 0 0
tmpfs /dev/shm tmpfs rw,pagesize=2M 0 0
`
	got := parseHugeMounts(table, 2<<20)
	want := []uint64{2 << 20, 1 << 30, 2 << 20}
	if !slices.Equal(got, want) {
		t.Fatalf("parseHugeMounts = %v, want %v", got, want)
	}
	if got := parseHugeMounts("proc /proc proc rw 0 0\n", 2<<20); len(got) != 0 {
		t.Fatalf("no hugetlbfs: got %v", got)
	}
	for in, want := range map[string]uint64{"2M": 2 << 20, "1G": 1 << 30, "64k": 64 << 10, "4096": 4096} {
		if n, ok := parsePageSize(in); !ok || n != want {
			t.Errorf("parsePageSize(%q) = %d, %v; want %d", in, n, ok, want)
		}
	}
	for _, in := range []string{"", "M", "x2M", "-1G"} {
		if n, ok := parsePageSize(in); ok {
			t.Errorf("parsePageSize(%q) = %d, want an error", in, n)
		}
	}
}
