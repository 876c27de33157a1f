package doctor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// spdkModules are the pkg-config modules weir's SPDK backend links.
var spdkModules = []string{"spdk_blob", "spdk_bdev", "spdk_env_dpdk", "spdk_event"}

// checkSPDK asks pkg-config for SPDK's libraries, the way the cgo build
// with the spdk tag finds them.
func (p *probe) checkSPDK(ctx context.Context) Check {
	c := Check{Name: "spdk libraries"}
	prog, err := exec.LookPath(p.h.PkgConfig)
	if err != nil {
		c.Status = Skip
		c.Found = fmt.Sprintf("pkg-config not found (%s): cannot look for SPDK", p.h.PkgConfig)
		c.Fix = []string{"apt-get install -y pkg-config   # RHEL, Fedora: dnf install -y pkgconf-pkg-config"}
		return c
	}
	var found, missing []string
	versions := map[string]bool{}
	var firstErr string
	for _, m := range spdkModules {
		cmd := exec.CommandContext(ctx, prog, "--modversion", m)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			missing = append(missing, m)
			if firstErr == "" {
				firstErr = firstLine(stderr.String())
				if firstErr == "" {
					firstErr = err.Error()
				}
				if ctx.Err() != nil {
					firstErr = ctx.Err().Error()
				}
			}
			continue
		}
		v := firstLine(stdout.String())
		versions[v] = true
		found = append(found, m+" "+v)
	}
	if len(missing) == 0 {
		c.Found = strings.Join(found, ", ")
		c.Status = OK
		if len(versions) > 1 {
			c.Status = Warn
			c.Details = []string{"the modules come from different SPDK versions: PKG_CONFIG_PATH mixes installations"}
			c.Fix = []string{"echo $PKG_CONFIG_PATH   # keep one SPDK installation's pkgconfig directories in it"}
		}
		return c
	}
	c.Status = Fail
	c.Found = "pkg-config does not find " + strings.Join(missing, ", ")
	if len(found) > 0 {
		c.Found += " (found " + strings.Join(found, ", ") + ")"
	}
	if firstErr != "" {
		c.Details = []string{firstErr}
	}
	if dir := p.findSPDK(); dir != "" {
		pc := filepath.Join(dir, "build", "lib", "pkgconfig")
		path := pc
		if dpdk := filepath.Join(dir, "dpdk", "build", "lib", "pkgconfig"); isDir(dpdk) {
			path += ":" + dpdk
		}
		c.Details = append(c.Details, "an SPDK build is in "+dir)
		c.Fix = []string{fmt.Sprintf("export PKG_CONFIG_PATH=%s${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}", path)}
		return c
	}
	c.Fix = []string{
		"# an SPDK built from source in <spdk>: point pkg-config at it",
		"export PKG_CONFIG_PATH=<spdk>/build/lib/pkgconfig:<spdk>/dpdk/build/lib/pkgconfig",
		"# no SPDK yet: install SPDK (see README: supported releases)",
	}
	return c
}

// findSPDK returns the first of Host.SPDKDirs holding a built SPDK.
func (p *probe) findSPDK() string {
	for _, d := range p.h.SPDKDirs {
		if _, err := os.Stat(filepath.Join(d, "build", "lib", "pkgconfig", spdkModules[0]+".pc")); err == nil {
			return d
		}
	}
	return ""
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}

// checkPrivileges: binding devices and writing /sys takes root
// (CAP_SYS_ADMIN); pinning huge pages past RLIMIT_MEMLOCK takes
// CAP_IPC_LOCK; without an IOMMU, reading physical addresses from
// /proc/self/pagemap takes CAP_SYS_ADMIN too.
func (p *probe) checkPrivileges() Check {
	c := Check{Name: "privileges"}
	if !p.capKnown {
		c.Status = Warn
		c.Found = "cannot read CapEff from /proc/self/status"
		return c
	}
	who := "uid unknown"
	if p.euid >= 0 {
		who = fmt.Sprintf("uid %d", p.euid)
		if p.euid == 0 {
			who = "root"
		}
	}
	var have, lack []string
	for _, cp := range []struct {
		n    uint
		name string
	}{{capSysAdmin, "CAP_SYS_ADMIN"}, {capIPCLock, "CAP_IPC_LOCK"}} {
		if p.hasCap(cp.n) {
			have = append(have, cp.name)
		} else {
			lack = append(lack, cp.name)
		}
	}
	if len(lack) == 0 {
		c.Status = OK
		c.Found = fmt.Sprintf("%s with %s", who, strings.Join(have, " and "))
		return c
	}
	c.Status = Warn
	c.Found = fmt.Sprintf("%s without %s: cannot bind devices or lock memory beyond the limit", who, strings.Join(lack, " and "))
	if p.euid == 0 {
		c.Details = []string{"root without these capabilities: probably a container"}
		c.Fix = []string{"# run the container with --cap-add SYS_ADMIN --cap-add IPC_LOCK (or --privileged), with /dev/hugepages and /sys mounted"}
		return c
	}
	c.Fix = []string{
		"sudo weir doctor   # and run the SPDK backend as root, or:",
		"# the systemd unit that runs weir, under [Service]: AmbientCapabilities=CAP_SYS_ADMIN CAP_IPC_LOCK",
	}
	return c
}
