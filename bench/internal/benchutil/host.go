package benchutil

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Host describes the machine a run was on.
type Host struct {
	NProc      int    `json:"nproc"`
	CPUModel   string `json:"cpu_model"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	GOMAXPROCS int    `json:"gomaxprocs"`
}

// HostInfo describes this machine and this process's Go runtime.
func HostInfo() (Host, error) {
	h := Host{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return h, fmt.Errorf("uname: %w", err)
	}
	h.Kernel = fmt.Sprintf("%s %s %s", unix.ByteSliceToString(u.Sysname[:]),
		unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Machine[:]))
	model, err := CPUModel()
	if err != nil {
		return h, err
	}
	h.CPUModel = model
	return h, nil
}

// CPUModel is the first "model name" in /proc/cpuinfo, or "unknown" on
// machines that have none.
func CPUModel() (string, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "", fmt.Errorf("CPU model: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read /proc/cpuinfo: %w", err)
	}
	return "unknown", nil
}
