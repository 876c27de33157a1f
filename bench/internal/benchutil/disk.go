package benchutil

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DiskFlushes returns the flush requests the block device holding path
// has completed since boot (/proc/diskstats, field 16: Linux 5.5 and
// later), and the device's name.
func DiskFlushes(path string) (uint64, string, error) {
	st, name, err := Disk(path)
	return st.Flushes, name, err
}

// DiskCounters are a block device's counters since boot.
type DiskCounters struct {
	Flushes      uint64 // flush requests completed
	BytesWritten uint64 // sectors written × 512
}

// Disk returns the counters of the block device holding path and its name.
func Disk(path string) (DiskCounters, string, error) {
	var c DiskCounters
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return c, "", fmt.Errorf("stat %s: %w", path, err)
	}
	major, minor := unix.Major(st.Dev), unix.Minor(st.Dev)
	f, err := os.Open("/proc/diskstats")
	if err != nil {
		return c, "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Fields(sc.Text())
		if len(p) < 3 || p[0] != strconv.FormatUint(uint64(major), 10) || p[1] != strconv.FormatUint(uint64(minor), 10) {
			continue
		}
		if len(p) < 3+16 {
			return c, p[2], fmt.Errorf("/proc/diskstats: %s has no flush counter (kernel before 5.5)", p[2])
		}
		n, err := strconv.ParseUint(p[3+15], 10, 64)
		if err != nil {
			return c, p[2], fmt.Errorf("/proc/diskstats: %s: flushes: %w", p[2], err)
		}
		w, err := strconv.ParseUint(p[3+6], 10, 64)
		if err != nil {
			return c, p[2], fmt.Errorf("/proc/diskstats: %s: sectors written: %w", p[2], err)
		}
		return DiskCounters{Flushes: n, BytesWritten: w * 512}, p[2], nil
	}
	if err := sc.Err(); err != nil {
		return c, "", err
	}
	return c, "", fmt.Errorf("/proc/diskstats: no device %d:%d (the file system of %s is not on a block device)", major, minor, path)
}
