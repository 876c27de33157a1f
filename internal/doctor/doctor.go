// Package doctor checks what weir's SPDK backend needs on a Linux host and
// says, for each problem, the exact command that fixes it (`weir doctor`).
//
// SPDK drives NVMe devices from user space through DPDK. For that the host
// needs huge pages reserved and free, a hugetlbfs mount to map them from, a
// memlock limit large enough to pin them, an IOMMU with vfio-pci (or
// uio_pci_generic as a fallback) and the controllers bound to that driver,
// SPDK's libraries where pkg-config finds them, and the privileges to bind
// devices and lock memory. Run also finds huge page files left by a DPDK
// process that was killed (they keep their pages: the usual reason for "no
// free hugepages" on a host that reserved enough). Run reads /proc and /sys, never
// changes anything, and returns a Report; Report.Write prints it as a table
// with a "To fix" section of copy-pasteable shell lines, or as JSON.
//
// Every path Run reads is under the roots in Host, so tests build a fake
// /proc and /sys in a temporary directory and point Host at it.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"
)

// Status is the outcome of one check.
type Status string

// The outcomes, from good to bad. SKIP means the check does not apply to
// this host (for example: no NVMe controller); it is not a failure.
const (
	OK   Status = "OK"
	Skip Status = "SKIP"
	Warn Status = "WARN"
	Fail Status = "FAIL"
)

// rank orders statuses by severity for worst().
func (s Status) rank() int {
	switch s {
	case OK:
		return 0
	case Skip:
		return 1
	case Warn:
		return 2
	case Fail:
		return 3
	default:
		return 3
	}
}

func worst(a, b Status) Status {
	if b.rank() > a.rank() {
		return b
	}
	return a
}

// Check is the result of one check.
type Check struct {
	Name    string   `json:"name"`
	Status  Status   `json:"status"`
	Found   string   `json:"found"`             // one line: what was found
	Details []string `json:"details,omitempty"` // further lines: per NUMA node, per namespace, ...
	// Fix holds shell lines that fix the problem, to be run as root in
	// order; lines starting with '#' are comments (warnings, alternatives).
	Fix []string `json:"fix,omitempty"`
}

// Report is everything Run found, in the order the checks ran.
type Report struct {
	Checks []Check `json:"checks"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Write prints the report: an aligned table (status, check, found) and then
// a "To fix" section with the commands of every check that has any, or the
// report as indented JSON.
func (r *Report) Write(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false) // fixes are shell lines: keep > and < readable
		return enc.Encode(r)
	}
	ws, wn := len("STATUS"), len("CHECK")
	for _, c := range r.Checks {
		ws = max(ws, len(c.Status))
		wn = max(wn, len(c.Name))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s  %-*s  %s\n", ws, "STATUS", wn, "CHECK", "FOUND")
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%-*s  %-*s  %s\n", ws, c.Status, wn, c.Name, c.Found)
		for _, d := range c.Details {
			fmt.Fprintf(&b, "%-*s  %-*s    %s\n", ws, "", wn, "", d)
		}
	}
	fixes := 0
	for _, c := range r.Checks {
		if len(c.Fix) == 0 {
			continue
		}
		if fixes == 0 {
			b.WriteString("\nTo fix (as root; lines starting with # are notes):\n")
		}
		fixes++
		fmt.Fprintf(&b, "\n# --- %s (%s)\n", c.Name, c.Status)
		for _, l := range c.Fix {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	if fixes == 0 {
		b.WriteString("\nNothing to fix.\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// DefaultHugeMemNeed is the huge page memory Run asks for when
// Options.HugeMemNeed is zero.
const DefaultHugeMemNeed = 1 << 30

// Options say what the host should provide.
type Options struct {
	// HugeMemNeed is the huge page memory weir's SPDK backend needs, in
	// bytes; 0 means DefaultHugeMemNeed. It sets the hugepage warning
	// threshold, the page count in the fix and the memlock threshold.
	HugeMemNeed uint64
	// SPDKConfig is the SPDK JSON config to check (NVMe flushes); "" skips.
	SPDKConfig string
}

// Host says where Run reads the machine from. DefaultHost is the machine
// this process runs on; tests point the roots at fixture trees.
type Host struct {
	Proc string // procfs root, "/proc"
	Sys  string // sysfs root, "/sys"
	// Root is prepended to mount points read from Proc/mounts before they
	// are read (the hugetlbfs mounts); "" or "/" on a real host.
	Root string
	// PkgConfig is the pkg-config program, a name looked up in PATH or a
	// path.
	PkgConfig string
	// Ldd is the ldd program (a name looked up in PATH or a path), which
	// lists what a shared library needs and whether it resolves.
	Ldd string
	// Getrlimit reads a resource limit; unix.Getrlimit on a real host.
	Getrlimit func(resource int, rlim *unix.Rlimit) error
	// SPDKDirs are SPDK source trees to look in when pkg-config does not
	// find SPDK, so the fix can name the right PKG_CONFIG_PATH.
	SPDKDirs []string
}

// DefaultHost is this machine.
func DefaultHost() Host {
	return Host{
		Proc:      "/proc",
		Sys:       "/sys",
		PkgConfig: "pkg-config",
		Ldd:       "ldd",
		Getrlimit: unix.Getrlimit,
		SPDKDirs:  []string{"/opt/spdk", "/usr/local/src/spdk", "/usr/src/spdk", "/root/spdk"},
	}
}

// Run checks the host and returns what it found. It only reads; it never
// fails as a whole: a check that cannot read its input says so in its own
// result. ctx bounds the external programs Run starts (pkg-config).
func Run(ctx context.Context, h Host, o Options) Report {
	d := DefaultHost()
	if h.Proc == "" {
		h.Proc = d.Proc
	}
	if h.Sys == "" {
		h.Sys = d.Sys
	}
	if h.PkgConfig == "" {
		h.PkgConfig = d.PkgConfig
	}
	if h.Ldd == "" {
		h.Ldd = d.Ldd
	}
	if h.Getrlimit == nil {
		h.Getrlimit = d.Getrlimit
	}
	if o.HugeMemNeed == 0 {
		o.HugeMemNeed = DefaultHugeMemNeed
	}
	p := newProbe(h, o)
	var r Report
	r.Checks = append(r.Checks, p.checkHugepages())
	r.Checks = append(r.Checks, p.checkHugetlbfs())
	r.Checks = append(r.Checks, p.checkLeftovers())
	r.Checks = append(r.Checks, p.checkMemlock())
	r.Checks = append(r.Checks, p.checkIOMMU())
	r.Checks = append(r.Checks, p.checkNVMe()...)
	r.Checks = append(r.Checks, p.checkSPDK(ctx))
	r.Checks = append(r.Checks, p.checkNVMeFlush())
	r.Checks = append(r.Checks, p.checkPrivileges())
	return r
}
