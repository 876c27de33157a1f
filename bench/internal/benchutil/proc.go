package benchutil

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// Linux fixes it at 100 for user space whatever the kernel's HZ.
const ClockTicks = 100

// ProcCPU returns the CPU time (user + system) process pid has used, at
// 1/ClockTicks resolution.
func ProcCPU(pid int) (time.Duration, error) {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read CPU time: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses itself; fields after the last ')' start at field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(string(b[i+1:]))
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		return 0, fmt.Errorf("%s: %d fields after the command name", path, len(f))
	}
	var ticks uint64
	for _, s := range []string{f[utime], f[stime]} {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / ClockTicks, nil
}

// ProcPeakRSS returns the peak resident set size (VmHWM) of process pid in
// KiB.
func ProcPeakRSS(pid int) (int64, error) {
	m, err := procStatus(pid, "VmHWM")
	return m["VmHWM"], err
}

// ProcMem returns a process's resident set now and the part of it that is
// shared memory it mapped (memfd and tmpfs pages: RssShmem), in KiB.
func ProcMem(pid int) (rssKiB, shmemKiB int64, err error) {
	m, err := procStatus(pid, "VmRSS", "RssShmem")
	return m["VmRSS"], m["RssShmem"], err
}

// procStatus reads the named kB fields of /proc/pid/status; every one must
// be there.
func procStatus(pid int, names ...string) (map[string]int64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	m := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		num, _ := strings.CutSuffix(strings.TrimSpace(rest), " kB")
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, name, err)
		}
		m[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	for _, n := range names {
		if _, ok := m[n]; !ok {
			return nil, fmt.Errorf("%s: no %s line", path, n)
		}
	}
	return m, nil
}

// MachineCPU is the whole machine's CPU time from /proc/stat: Busy is user,
// nice, system, irq and softirq time of every CPU; Steal is time the
// hypervisor gave to someone else. Both are tick-sampled.
type MachineCPU struct{ Busy, Steal time.Duration }

// ReadMachineCPU reads the first line of /proc/stat.
func ReadMachineCPU() (MachineCPU, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return MachineCPU{}, fmt.Errorf("read machine CPU time: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return MachineCPU{}, fmt.Errorf("read /proc/stat: %w", err)
		}
		return MachineCPU{}, errors.New("/proc/stat is empty")
	}
	fields := strings.Fields(sc.Text())
	// cpu user nice system idle iowait irq softirq steal ...
	if len(fields) < 9 || fields[0] != "cpu" {
		return MachineCPU{}, fmt.Errorf("/proc/stat: unexpected first line %q", sc.Text())
	}
	var v [8]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(fields[i+1], 10, 64); err != nil {
			return MachineCPU{}, fmt.Errorf("/proc/stat: %w", err)
		}
	}
	const user, nice, system, irq, softirq, steal = 0, 1, 2, 5, 6, 7
	tick := time.Second / ClockTicks
	return MachineCPU{
		Busy:  time.Duration(v[user]+v[nice]+v[system]+v[irq]+v[softirq]) * tick,
		Steal: time.Duration(v[steal]) * tick,
	}, nil
}
