package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/control"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/stack"
)

func cmdDropCaches(args []string) int { return runDropCaches(os.Stdout, os.Stderr, args) }

// runDropCaches is `weir drop-caches`: the IO service evicts every clean
// page of its page cache, as `echo 3 > /proc/sys/vm/drop_caches` does the
// kernel's (for cold-read measurements). 0 when it did, 1 when the service
// could not be asked, 2 for a usage error.
func runDropCaches(stdout, stderr io.Writer, args []string) int {
	fs := newFlags("drop-caches")
	fs.SetOutput(stderr)
	cfg, _, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "weir drop-caches: %v\n", err)
		return 2
	}
	url, err := natsURL(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "weir drop-caches: %v\n", err)
		return 1
	}
	nc, err := stack.Connect(cfg, url, control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		fmt.Fprintf(stderr, "weir drop-caches: %v\n", err)
		return 1
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := control.Call(ctx, nc, cfg.NATS.Namespace, iosvc.ServiceName, control.DropCacheEndpoint)
	if err != nil {
		fmt.Fprintf(stderr, "weir drop-caches: %v\n", err)
		return 1
	}
	for id, v := range out {
		b, _ := json.Marshal(v)
		fmt.Fprintf(stdout, "%s %s: %s\n", iosvc.ServiceName, id, b)
	}
	return 0
}
