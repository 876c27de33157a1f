package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/fsck"
)

// cmdCheck is the fsck: run on a stopped data directory. It changes
// nothing unless --repair. It exits 0 when consistent (notes of deletes
// the next start finishes allowed), 1 when problems were found, 2 on
// usage or open errors.
func cmdCheck(args []string) int {
	fs := newFlags("check")
	asJSON := fs.Bool("json", false, "print JSON")
	repair := fs.Bool("repair", false, "fix what can be fixed: delete orphan blobs and the blobs awaiting deletion, free files unlinked while open, record each file's blob size")
	cfg, _, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir check: %v\n", err)
		return 2
	}
	log := cfg.Logger("weir-check", os.Stderr)
	var be backend.Backend
	if *repair {
		be, err = stack.Backend(cfg, log)
	} else {
		be, err = stack.BackendReadOnly(cfg, log)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir check: open backend (are the services still running?): %v\n", err)
		return 2
	}
	r, err := fsck.Check(cfg, be, fsck.Options{Repair: *repair, Logger: log})
	if herr := stack.HaltBackends(); herr != nil && err == nil {
		err = herr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir check: %v\n", err)
		return 2
	}
	if err := r.Write(os.Stdout, *asJSON); err != nil {
		return 2
	}
	if !r.OK() {
		return 1
	}
	return 0
}
