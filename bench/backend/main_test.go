package main

import (
	"flag"
	"strings"
	"testing"
)

// TestSPDKConfigFlags: -spdk-config names the bdev of the device rows and
// must be confirmed with -spdk-erase (the run formats the bdev); the
// bdev flags mean nothing without it.
func TestSPDKConfigFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // error text, "" for none
	}{
		{[]string{"-spdk-config", "nvme.json", "-spdk-bdev", "Nvme0n1", "-spdk-erase"}, ""},
		{[]string{"-spdk-config", "nvme.json", "-spdk-bdev", "Nvme0n1", "-spdk-malloc-bdev", "Malloc0", "-spdk-erase"}, ""},
		{[]string{"-spdk-config", "nvme.json", "-spdk-erase"}, "needs -spdk-bdev"},
		{[]string{"-spdk-config", "nvme.json", "-spdk-bdev", "Nvme0n1"}, "pass -spdk-erase"},
		{[]string{"-spdk-bdev", "Nvme0n1"}, "go with -spdk-config"},
		{[]string{"-spdk-erase"}, "go with -spdk-config"},
		{nil, ""},
	} {
		cfg, err := parseFlags(flag.NewFlagSet("backend", flag.ContinueOnError), c.args)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q: %v, want an error saying %q", c.args, err, c.want)
		}
		if err == nil {
			dev, weirDev := devTargets(cfg.s)
			if (cfg.s.SPDKConfig != "") != (dev == targetSPDKDev && weirDev == targetWeirSPDKDev) {
				t.Errorf("%q: device rows %s, %s", c.args, dev, weirDev)
			}
		}
	}
}
