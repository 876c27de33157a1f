package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// spdkModules are the pkg-config modules weir's SPDK backend links: the
// #cgo pkg-config line of services/io/backend/spdk and SPDK_PC in the
// Makefile name the same.
var spdkModules = []string{"spdk_blob_bdev", "spdk_blob", "spdk_bdev", "spdk_env_dpdk", "spdk_init", "spdk_thread",
	"spdk_event_bdev", "spdk_bdev_malloc", "spdk_bdev_aio", "spdk_bdev_error", "spdk_bdev_nvme", "spdk_syslibs"}

// TestedSPDK is the SPDK release weir's SPDK backend is built and tested
// against (README: supported releases).
const TestedSPDK = "v26.05"

// spdkModule is what pkg-config says of one module: its own library
// directory (the first -L), its include directories and libraries.
type spdkModule struct {
	name     string
	libDir   string
	incDirs  []string
	libs     []string
	ownLib   bool // it names lib<name> (spdk_syslibs names system libraries only)
	notFound string
}

// checkSPDK checks the SPDK installation the cgo build with the spdk tag
// links, as pkg-config finds it: every module is there, all from one
// installation (one library directory), the release (spdk/version.h) is
// the one weir is tested with, and each module's shared library loads:
// ldd, with the library directory on the search path as the binary's
// rpath puts it, resolves all it needs. (pkg-config's Version fields are
// each library's own ABI version, spdk_blob 14.0, spdk_bdev 20.0, ...:
// they say nothing of the release and always differ.)
func (p *probe) checkSPDK(ctx context.Context) Check {
	c := Check{Name: "spdk libraries"}
	prog, err := exec.LookPath(p.h.PkgConfig)
	if err != nil {
		c.Status = Skip
		c.Found = fmt.Sprintf("pkg-config not found (%s): cannot look for SPDK", p.h.PkgConfig)
		c.Fix = []string{"apt-get install -y pkg-config   # RHEL, Fedora: dnf install -y pkgconf-pkg-config"}
		return c
	}
	pc := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, prog, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			if l := firstLine(stderr.String()); l != "" {
				return "", errors.New(l)
			}
			return "", err
		}
		return stdout.String(), nil
	}
	var mods []spdkModule
	var found, missing []string
	var firstErr string
	for _, name := range spdkModules {
		m := spdkModule{name: name}
		libs, err := pc("--libs-only-l", name)
		if err == nil {
			var dirs, incs string
			if dirs, err = pc("--libs-only-L", name); err == nil {
				incs, err = pc("--cflags-only-I", name)
			}
			for _, f := range strings.Fields(dirs) {
				if d, ok := strings.CutPrefix(f, "-L"); ok && m.libDir == "" {
					m.libDir = d
				}
			}
			for _, f := range strings.Fields(incs) {
				if d, ok := strings.CutPrefix(f, "-I"); ok {
					m.incDirs = append(m.incDirs, d)
				}
			}
			for _, f := range strings.Fields(libs) {
				if l, ok := strings.CutPrefix(f, "-l"); ok {
					m.libs = append(m.libs, l)
					m.ownLib = m.ownLib || l == name
				}
			}
		}
		if err != nil {
			missing = append(missing, name)
			if firstErr == "" {
				firstErr = err.Error()
			}
			continue
		}
		found = append(found, name)
		mods = append(mods, m)
	}
	if len(missing) > 0 {
		return p.spdkMissing(c, found, missing, firstErr)
	}
	// One installation: every module's own library directory the same.
	byDir := map[string][]string{}
	var dirs []string
	for _, m := range mods {
		if !m.ownLib {
			continue
		}
		if _, ok := byDir[m.libDir]; !ok {
			dirs = append(dirs, m.libDir)
		}
		byDir[m.libDir] = append(byDir[m.libDir], m.name)
	}
	if len(dirs) > 1 {
		c.Status = Fail
		c.Found = fmt.Sprintf("the modules come from %d installations", len(dirs))
		for _, d := range dirs {
			c.Details = append(c.Details, fmt.Sprintf("%s: %s", d, strings.Join(byDir[d], ", ")))
		}
		c.Fix = []string{"echo $PKG_CONFIG_PATH   # keep one SPDK installation's pkgconfig directories in it, then rebuild (make spdk)"}
		return c
	}
	libDir := ""
	if len(dirs) == 1 {
		libDir = dirs[0]
	}
	// The release, from the header the build compiles against.
	release, header, err := spdkRelease(mods)
	c.Status = OK
	switch {
	case err != nil:
		c.Status = Warn
		c.Details = append(c.Details, "cannot tell the SPDK release: "+err.Error())
	case release != TestedSPDK:
		c.Status = Warn
		c.Details = append(c.Details, fmt.Sprintf("weir's SPDK backend is built and tested against SPDK %s; this is %s (%s)", TestedSPDK, release, header))
		c.Fix = append(c.Fix, fmt.Sprintf("# install SPDK %s (README: supported releases), or run make test-spdk to try this one", TestedSPDK))
	}
	// The shared libraries load.
	kind, problems := p.spdkLoads(ctx, mods, libDir)
	if len(problems) > 0 {
		c.Status = Fail
		c.Details = append(c.Details, problems...)
		c.Fix = append(c.Fix, "# install what the libraries need (Debian: the -dev packages SPDK's scripts/pkgdep.sh lists), or rebuild SPDK")
	}
	if release == "" {
		release = "release unknown"
	}
	c.Found = fmt.Sprintf("SPDK %s in %s: %d modules, %s", release, libDir, len(mods), kind)
	return c
}

// spdkMissing is the check's result when pkg-config misses modules.
func (p *probe) spdkMissing(c Check, found, missing []string, firstErr string) Check {
	c.Status = Fail
	c.Found = "pkg-config does not find " + strings.Join(missing, ", ")
	if len(found) > 0 {
		c.Found += " (found " + strings.Join(found, ", ") + ")"
	}
	if firstErr != "" {
		c.Details = []string{firstErr}
	}
	if dir, path := p.findSPDK(); dir != "" {
		c.Details = append(c.Details, "an SPDK is in "+dir)
		c.Fix = []string{fmt.Sprintf("export PKG_CONFIG_PATH=%s${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}", path)}
		if filepath.Dir(path) == filepath.Join(dir, "lib") {
			c.Fix = append(c.Fix, fmt.Sprintf("# or build weir with make spdk SPDK_PREFIX=%s", dir))
		}
		return c
	}
	c.Fix = []string{
		"# an SPDK installed in <prefix> (make install) or built in <spdk>: point pkg-config at it",
		"export PKG_CONFIG_PATH=<prefix>/lib/pkgconfig   # or <spdk>/build/lib/pkgconfig:<spdk>/dpdk/build/lib/pkgconfig",
		"# no SPDK yet: install SPDK (see README: supported releases)",
	}
	return c
}

// spdkRelease reads SPDK_VERSION_MAJOR, _MINOR, _PATCH and _SUFFIX from
// spdk/version.h in the modules' include directories, and formats them as
// SPDK does: v26.05, v24.09.1, v25.01-pre.
func spdkRelease(mods []spdkModule) (release, header string, err error) {
	for _, m := range mods {
		for _, d := range m.incDirs {
			h := filepath.Join(d, "spdk", "version.h")
			b, err := os.ReadFile(h)
			if err != nil {
				continue
			}
			v := map[string]string{}
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				if len(f) >= 3 && f[0] == "#define" && strings.HasPrefix(f[1], "SPDK_VERSION_") {
					v[strings.TrimPrefix(f[1], "SPDK_VERSION_")] = strings.Join(f[2:], " ")
				}
			}
			major, e1 := strconv.Atoi(v["MAJOR"])
			minor, e2 := strconv.Atoi(v["MINOR"])
			patch, e3 := strconv.Atoi(v["PATCH"])
			if e1 != nil || e2 != nil || e3 != nil {
				return "", h, fmt.Errorf("%s defines no numeric SPDK_VERSION_MAJOR, _MINOR and _PATCH", h)
			}
			release = fmt.Sprintf("v%d.%02d", major, minor)
			if patch != 0 {
				release += fmt.Sprintf(".%d", patch)
			}
			release += strings.Trim(v["SUFFIX"], `"`)
			return release, h, nil
		}
	}
	return "", "", errors.New("no spdk/version.h in the include directories pkg-config names")
}

// spdkLoads runs ldd on each module's shared library in libDir, with
// libDir on LD_LIBRARY_PATH (what the binary's rpath gives it), and lists
// what does not resolve. A static-only installation (.a, no .so) links
// into the binary and has nothing to load.
func (p *probe) spdkLoads(ctx context.Context, mods []spdkModule, libDir string) (kind string, problems []string) {
	ldd, err := exec.LookPath(p.h.Ldd)
	shared, static := 0, 0
	for _, m := range mods {
		if !m.ownLib {
			continue
		}
		so := filepath.Join(libDir, "lib"+m.name+".so")
		if _, err := os.Stat(so); err != nil {
			if _, err := os.Stat(filepath.Join(libDir, "lib"+m.name+".a")); err == nil {
				static++
				continue
			}
			problems = append(problems, fmt.Sprintf("pkg-config names %s, but %s has neither lib%s.so nor lib%s.a", m.name, libDir, m.name, m.name))
			continue
		}
		shared++
		if err != nil {
			continue
		}
		cmd := exec.CommandContext(ctx, ldd, so)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libDir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			problems = append(problems, fmt.Sprintf("ldd %s: %v: %s", so, err, firstLine(string(out))))
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "not found") {
				problems = append(problems, fmt.Sprintf("%s needs %s", filepath.Base(so), strings.TrimSpace(line)))
			}
		}
	}
	switch {
	case err != nil && shared > 0:
		kind = fmt.Sprintf("%d shared libraries (not loaded: ldd not found)", shared)
	case shared > 0:
		kind = fmt.Sprintf("%d shared libraries load", shared)
	default:
		kind = fmt.Sprintf("%d static libraries", static)
	}
	return kind, problems
}

// findSPDK returns the first of Host.SPDKDirs holding an SPDK, installed
// (make install: <dir>/lib/pkgconfig) or built in its source tree
// (<dir>/build/lib/pkgconfig, DPDK's in <dir>/dpdk/build/lib/pkgconfig),
// and the PKG_CONFIG_PATH that finds it.
func (p *probe) findSPDK() (dir, path string) {
	for _, d := range p.h.SPDKDirs {
		if pc := filepath.Join(d, "lib", "pkgconfig"); isFile(filepath.Join(pc, "spdk_blob.pc")) {
			return d, pc
		}
		if pc := filepath.Join(d, "build", "lib", "pkgconfig"); isFile(filepath.Join(pc, "spdk_blob.pc")) {
			if dpdk := filepath.Join(d, "dpdk", "build", "lib", "pkgconfig"); isDir(dpdk) {
				pc += ":" + dpdk
			}
			return d, pc
		}
	}
	return "", ""
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
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
