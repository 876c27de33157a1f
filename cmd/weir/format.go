package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/weir-storage/weir/stack"
)

// cmdFormat erases a stopped stack: its namespace and its store (weir
// makes a new SPDK blobstore by itself only on a provably empty device).
// It exits 0 when done, 1 when the erase failed, 2 on usage errors or
// without --yes.
func cmdFormat(args []string) int {
	fs := newFlags("format")
	yes := fs.Bool("yes", false, "erase: every file and its data is lost")
	cfg, _, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir format: %v\n", err)
		return 2
	}
	plan, err := stack.FormatPlan(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir format: %v\n", err)
		return 2
	}
	if !*yes {
		fmt.Fprintf(os.Stderr, "weir format erases %s: every file and its data is lost.\nStop weir, then run it again with --yes to erase.\n", plan)
		return 2
	}
	log := cfg.Logger("weir-format", os.Stderr)
	err = stack.Format(cfg, log)
	if herr := stack.HaltBackends(); err == nil {
		err = herr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir format: %v\n", err)
		return 1
	}
	fmt.Printf("erased %s; the next start makes a new namespace, which the store then belongs to\n", plan)
	return 0
}
