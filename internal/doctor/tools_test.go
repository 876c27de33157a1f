package doctor

import (
	"context"
	"strings"
	"testing"
)

func TestSPDKLibraries(t *testing.T) {
	t.Run("present", func(t *testing.T) {
		f := newFixture(t)
		c := f.check("spdk libraries")
		wantStatus(t, c, OK)
		wantText(t, "found", c.Found, "spdk_blob 24.09", "spdk_event 24.09")
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
		wantText(t, "found", c.Found, "spdk_blob, spdk_bdev, spdk_env_dpdk, spdk_event")
		wantText(t, "details", strings.Join(c.Details, "\n"), "Package spdk_blob was not found")
		wantFix(t, c, "export PKG_CONFIG_PATH=<spdk>/build/lib/pkgconfig:<spdk>/dpdk/build/lib/pkgconfig", "README")
		if !r.Failed() {
			t.Fatal("Failed() = false")
		}
	})
	t.Run("some", func(t *testing.T) {
		f := newFixture(t)
		f.pkgConfig(map[string]string{"spdk_blob": "24.09", "spdk_bdev": "24.09"})
		c := f.check("spdk libraries")
		wantStatus(t, c, Fail)
		wantText(t, "found", c.Found, "does not find spdk_env_dpdk, spdk_event (found spdk_blob 24.09, spdk_bdev 24.09)")
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
	t.Run("mixed versions", func(t *testing.T) {
		f := newFixture(t)
		f.pkgConfig(map[string]string{"spdk_blob": "24.09", "spdk_bdev": "24.09", "spdk_env_dpdk": "23.01", "spdk_event": "24.09"})
		wantStatus(t, f.check("spdk libraries"), Warn)
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
