package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/doctor"
)

// cmdDoctor checks what the SPDK backend needs on this host and prints the
// fix for each problem. It exits 0 when nothing failed (warnings and
// skipped checks included), 1 when a check failed, 2 on usage errors.
func cmdDoctor(args []string) int {
	fs := newFlags("doctor")
	asJSON := fs.Bool("json", false, "print JSON")
	hugemem := fs.String("hugemem", config.Size(doctor.DefaultHugeMemNeed).String(),
		"huge page memory the SPDK backend needs, e.g. 2GiB (sets the hugepage and memlock thresholds)")
	spdkConfig := fs.String("spdk-config", "", "SPDK JSON config to check (NVMe flushes); default: io.spdk_config of --config")
	cfgPath := fs.String("config", "", "weir configuration file (HCL), for io.spdk_config")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: weir doctor [--json] [--hugemem SIZE] [--spdk-config PATH | --config PATH]")
		fmt.Fprintln(fs.Output(), "\nChecks huge pages, hugetlbfs, memlock, IOMMU/vfio, NVMe bindings, SPDK libraries, privileges, and that an SPDK config flushes NVMe drives.")
		fmt.Fprintln(fs.Output(), "Exit status: 0 nothing failed, 1 a check failed, 2 usage error.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "weir doctor: unexpected arguments %q\n", fs.Args())
		return 2
	}
	need, err := config.ParseSize(*hugemem)
	if err != nil || need == 0 {
		if err == nil {
			err = errors.New("must be more than 0")
		}
		fmt.Fprintf(os.Stderr, "weir doctor: --hugemem: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	spdkPath := *spdkConfig
	if spdkPath == "" && *cfgPath != "" {
		c, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "weir doctor: %v\n", err)
			return 2
		}
		spdkPath = c.IO.SPDKConfig
	}
	r := doctor.Run(ctx, doctor.DefaultHost(), doctor.Options{HugeMemNeed: uint64(need), SPDKConfig: spdkPath})
	if err := r.Write(os.Stdout, *asJSON); err != nil {
		fmt.Fprintf(os.Stderr, "weir doctor: %v\n", err)
		return 2
	}
	if r.Failed() {
		return 1
	}
	return 0
}
