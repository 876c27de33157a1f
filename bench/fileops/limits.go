package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// The cache rows have floors that no user-space cache can go below on the
// machine: a warm 4 KiB read copies 4 KiB from a random place of the
// file's pages, and a cold one stores the page it filled into the cache's
// memory. limits measures those costs in the same run, timed as the rows
// time their ops (one time.Now pair per op), so that the report says what
// limits each row.

// Limit is one such measurement.
type Limit struct {
	What   string  `json:"what"`
	Ops    int     `json:"ops"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	NA     string  `json:"na,omitempty"`
	Detail string  `json:"detail,omitempty"`
	// WarmRead: a floor of the warm 4 KiB read (the report divides that
	// row's p50 by this one's).
	WarmRead bool `json:"warm_read,omitempty"`
}

// limitOps is the number of timed ops of each limit.
const limitOps = 200_000

// measureLimits measures the floors of the cache rows for a file of size
// bytes.
func measureLimits(size int64) []Limit {
	return []Limit{
		copyLimit("memcpy of 4 KiB from a random page of a shared memfd mapping of the file's size (4 KiB pages, all resident): the floor of a warm read from weir's region", size, 0),
		copyLimit("the same from a hugetlbfs memfd (2 MiB pages: no TLB miss)", size, unix.MFD_HUGETLB),
		storeLimit("pwrite of 4 KiB into a new page at a random offset of a memfd of the file's size: what a cold read's fill stores into weir's region", size),
	}
}

func copyLimit(what string, size int64, flags int) Limit {
	l := Limit{What: what, WarmRead: true}
	if flags&unix.MFD_HUGETLB != 0 {
		if free := hugeFree(); free < size {
			l.NA = fmt.Sprintf("needs %d MiB of free huge pages, the host has %d MiB", size>>20, free>>20)
			return l
		}
	}
	fd, err := unix.MemfdCreate("weir-bench-limit", flags)
	if err != nil {
		l.NA = "memfd_create: " + err.Error()
		return l
	}
	defer unix.Close(fd)
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		l.NA = "fallocate: " + err.Error()
		return l
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		l.NA = "mmap: " + err.Error()
		return l
	}
	defer unix.Munmap(mem)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = byte(i >> 12) // fault every page in
	}
	buf := make([]byte, 4096)
	rng := rand.New(rand.NewPCG(seed, 2))
	pages := int(size / 4096)
	var h benchutil.Histogram
	var sum byte
	for range limitOps {
		off := rng.IntN(pages) * 4096
		t := time.Now()
		copy(buf, mem[off:off+4096])
		h.Record(int64(time.Since(t)))
		sum += buf[0]
	}
	return finish(l, &h, fmt.Sprintf("checksum %d", sum))
}

func storeLimit(what string, size int64) Limit {
	l := Limit{What: what}
	fd, err := unix.MemfdCreate("weir-bench-limit", 0)
	if err != nil {
		l.NA = "memfd_create: " + err.Error()
		return l
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		l.NA = "ftruncate: " + err.Error()
		return l
	}
	page := make([]byte, 4096)
	rng := rand.New(rand.NewPCG(seed, 3))
	pages := int(size / 4096)
	n := min(limitOps/8, pages/4) // a quarter of the pages at most: each is new
	var h benchutil.Histogram
	for range n {
		off := int64(rng.IntN(pages)) * 4096
		t := time.Now()
		_, err := unix.Pwrite(fd, page, off)
		h.Record(int64(time.Since(t)))
		if err != nil {
			l.NA = "pwrite: " + err.Error()
			return l
		}
	}
	return finish(l, &h, "")
}

func finish(l Limit, h *benchutil.Histogram, detail string) Limit {
	l.Ops = int(h.Count())
	l.P50us, l.P99us = h.QuantileUs(0.50), h.QuantileUs(0.99)
	l.Detail = detail
	return l
}

// hugeFree is the free memory of the default huge page pool, in bytes.
func hugeFree() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var free, size int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "HugePages_Free:":
			free = v
		case "Hugepagesize:":
			size = v << 10
		}
	}
	return free * size
}
