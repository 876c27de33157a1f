package doctor

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

func TestSPDKLibraries(t *testing.T) {
	t.Run("present", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("spdk libraries")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "SPDK v26.05 in "+f.path("opt/spdk/lib"), "12 modules", "11 shared libraries load")
	})
	t.Run("another release", func(t *testing.T) {
		f := newFixture(t)
		f.spdkInstall("opt/spdk", "24", "9", "1")
		c := f.check("spdk libraries")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "SPDK v24.09.1")
		wantText(t, "details", strings.Join(c.Details, "\n"), "tested against SPDK "+TestedSPDK)
	})
	t.Run("no version.h", func(t *testing.T) {
		f := newFixture(t)
		f.remove("opt/spdk/include/spdk/version.h")
		c := f.check("spdk libraries")
		wantStatus(t, c, Warn)
		wantText(t, "details", strings.Join(c.Details, "\n"), "cannot tell the SPDK release")
	})
	t.Run("a library does not load", func(t *testing.T) {
		f := newFixture(t)
		f.write("opt/spdk/lib/libspdk_bdev_aio.so", "NEEDS libaio.so.1\n")
		c := f.check("spdk libraries")
		wantStatus(t, c, Fail)
		wantText(t, "details", strings.Join(c.Details, "\n"), "libspdk_bdev_aio.so needs libaio.so.1 => not found")
	})
	t.Run("static only", func(t *testing.T) {
		f := newFixture(t)
		for _, m := range spdkModules {
			if m != "spdk_syslibs" {
				f.remove("opt/spdk/lib/lib" + m + ".so")
				f.write("opt/spdk/lib/lib"+m+".a", "!<arch>")
			}
		}
		c := f.check("spdk libraries")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "11 static libraries")
	})
	t.Run("library missing", func(t *testing.T) {
		f := newFixture(t)
		f.remove("opt/spdk/lib/libspdk_blob.so")
		c := f.check("spdk libraries")
		wantStatus(t, c, Fail)
		wantText(t, "details", strings.Join(c.Details, "\n"), "neither libspdk_blob.so nor libspdk_blob.a")
	})
	t.Run("two installations", func(t *testing.T) {
		f := newFixture(t)
		f.spdkInstall("usr/local", "26", "5", "0")
		mods := allModules("opt/spdk")
		mods["spdk_env_dpdk"] = "usr/local"
		f.pkgConfig(mods)
		c := f.check("spdk libraries")
		wantStatus(t, c, Fail)
		wantText(t, "found", c.Found, "2 installations")
		wantText(t, "details", strings.Join(c.Details, "\n"), f.path("usr/local/lib")+": spdk_env_dpdk")
	})
	t.Run("pkg-config missing", func(t *testing.T) {
		f := newFixture(t)
		f.pkgcf = f.path("bin/no-such-pkg-config")
		c := f.check("spdk libraries")
		wantStatus(t, c, Skip)
		wantFix(t, c, "apt-get install -y pkg-config")
	})
	t.Run("absent", func(t *testing.T) {
		f := newFixture(t)
		f.pkgConfig(nil)
		r := f.run(0)
		c := find(t, r, "spdk libraries")
		wantStatus(t, c, Fail)
		wantText(t, "found", c.Found, strings.Join(spdkModules, ", "))
		wantText(t, "details", strings.Join(c.Details, "\n"), "Package spdk_blob_bdev was not found")
		wantFix(t, c, "export PKG_CONFIG_PATH=<prefix>/lib/pkgconfig", "README")
		if !r.Failed() {
			t.Fatal("Failed() = false")
		}
	})
	t.Run("some", func(t *testing.T) {
		f := newFixture(t)
		f.pkgConfig(map[string]string{"spdk_blob": "opt/spdk", "spdk_bdev": "opt/spdk"})
		c := f.check("spdk libraries")
		wantStatus(t, c, Fail)
		wantText(t, "found", c.Found, "does not find spdk_blob_bdev, spdk_env_dpdk", "(found spdk_blob, spdk_bdev)")
	})
	t.Run("absent but built nearby", func(t *testing.T) {
		f := newFixture(t)
		f.pkgConfig(nil)
		f.write("src/spdk/build/lib/pkgconfig/spdk_blob.pc", "Name: spdk_blob\n")
		f.mkdir("src/spdk/dpdk/build/lib/pkgconfig")
		f.spdk = []string{f.path("nowhere"), f.path("src/spdk")}
		c := f.check("spdk libraries")
		wantStatus(t, c, Fail)
		d := f.path("src/spdk")
		wantFix(t, c, "export PKG_CONFIG_PATH="+d+"/build/lib/pkgconfig:"+d+"/dpdk/build/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}")
		wantNoFix(t, c, "<spdk>")
	})
	t.Run("absent but installed nearby", func(t *testing.T) {
		f := newFixture(t)
		f.pkgConfig(nil)
		f.write("opt/spdk/lib/pkgconfig/spdk_blob.pc", "Name: spdk_blob\n")
		f.spdk = []string{f.path("nowhere"), f.path("opt/spdk")}
		c := f.check("spdk libraries")
		wantStatus(t, c, Fail)
		d := f.path("opt/spdk")
		wantFix(t, c, "export PKG_CONFIG_PATH="+d+"/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}", "make spdk SPDK_PREFIX="+d)
	})
	t.Run("cancelled", func(t *testing.T) {
		f := newFixture(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := Run(ctx, f.host(), Options{})
		c := find(t, r, "spdk libraries")
		wantStatus(t, c, Fail)
		wantText(t, "details", strings.Join(c.Details, "\n"), "context canceled")
	})
}

// TestSPDKLibrariesInstalled runs the check against the SPDK installed on
// this host, as pkg-config finds it (PKG_CONFIG_PATH, or /opt/spdk as the
// Makefile's SPDK_PREFIX): the real .pc files (whose Version fields are
// per-library ABI versions), the real spdk/version.h and the real ldd.
func TestSPDKLibrariesInstalled(t *testing.T) {
	if _, err := exec.LookPath("pkg-config"); err != nil {
		t.Skip("pkg-config is not installed: cannot look for SPDK")
	}
	if os.Getenv("PKG_CONFIG_PATH") == "" && isDir("/opt/spdk/lib/pkgconfig") {
		t.Setenv("PKG_CONFIG_PATH", "/opt/spdk/lib/pkgconfig")
	}
	if err := exec.Command("pkg-config", "--exists", "spdk_blob").Run(); err != nil {
		t.Skip("SPDK is not installed: pkg-config finds no spdk_blob (install SPDK into /opt/spdk or set PKG_CONFIG_PATH)")
	}
	c := newProbe(DefaultHost(), Options{}).checkSPDK(context.Background())
	t.Logf("%s: %s %s %q", c.Name, c.Status, c.Found, c.Details)
	if c.Status == Fail {
		t.Fatalf("the installed SPDK fails the check: %s; %q", c.Found, c.Details)
	}
	// The release weir is tested with passes without a warning (the old
	// check warned on every real install).
	if strings.HasPrefix(c.Found, "SPDK "+TestedSPDK+" ") && c.Status != OK {
		t.Errorf("SPDK %s, the tested release, gets %s: %q", TestedSPDK, c.Status, c.Details)
	}
	if !regexp.MustCompile(`^SPDK v\d+\.\d\d`).MatchString(c.Found) {
		t.Errorf("found %q names no release", c.Found)
	}
	if strings.Contains(c.Found, "release unknown") {
		t.Errorf("found %q: the release was not read from spdk/version.h", c.Found)
	}
}

func TestPrivileges(t *testing.T) {
	t.Run("root", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("privileges")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "root with CAP_SYS_ADMIN and CAP_IPC_LOCK")
	})
	t.Run("user with capabilities", func(t *testing.T) {
		f := newFixture(t)
		f.status(1000, "0000000000204000") // bits 14 and 21
		c := f.check("privileges")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "uid 1000 with CAP_SYS_ADMIN and CAP_IPC_LOCK")
	})
	t.Run("user", func(t *testing.T) {
		f := newFixture(t)
		f.status(1000, capsNone)
		c := f.check("privileges")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "uid 1000 without CAP_SYS_ADMIN and CAP_IPC_LOCK")
		wantFix(t, c, "sudo weir doctor", "AmbientCapabilities=CAP_SYS_ADMIN CAP_IPC_LOCK")
	})
	t.Run("only IPC_LOCK", func(t *testing.T) {
		f := newFixture(t)
		f.status(1000, "0000000000004000")
		c := f.check("privileges")
		wantStatus(t, c, Warn)
		wantText(t, "found", c.Found, "without CAP_SYS_ADMIN:")
	})
	t.Run("root in a container without capabilities", func(t *testing.T) {
		f := newFixture(t)
		f.status(0, "00000000a80425fb") // docker's default set: no SYS_ADMIN, no IPC_LOCK
		c := f.check("privileges")
		wantStatus(t, c, Warn)
		wantFix(t, c, "--cap-add SYS_ADMIN --cap-add IPC_LOCK")
	})
	t.Run("unreadable", func(t *testing.T) {
		f := newFixture(t)
		f.remove("proc/self/status")
		wantStatus(t, f.check("privileges"), Warn)
	})
}
