// Command weir runs and operates a weir storage host.
//
//	weir up       [--config FILE] [--data DIR] ...  start NATS and every service; stop on SIGINT/SIGTERM
//	weir demo     [--data DIR] [--files N]          weir up, a real workload, a restart check, stop
//	weir status   [--json] [--config FILE] [--data DIR] [--nats-url URL] [--nats-namespace NS]
//	                                                 every service's health and counters, over NATS;
//	                                                 exit 1 if one is missing, hung or unhealthy
//	weir doctor   [--json] [--hugemem SIZE]          what the SPDK backend needs on this host, and the fixes
//	weir check    [--json] [--repair] [--data DIR]   fsck of a stopped data directory (read-only unless --repair)
//	weir format   --yes [--config FILE] [--data DIR]  erase a stopped stack: namespace and store (SPDK: a new blobstore)
//	weir nats-config [--config FILE] [--data DIR]    the nats-server authorization an external server needs
//	weir drop-caches [--config FILE] [--data DIR]    empty the IO service's page cache (cold-read measurements)
//	weir lease ls [--file PATH] [--json]             shared and exclusive leases (services/metadata)
//	weir lease revoke LEASE-ID|PATH                  end a lease, or every lease of a file
//	weir metadata [--config FILE] --nats-url URL    run the metadata service (what weir up starts)
//	weir io       [--config FILE] --nats-url URL    run the IO service (what weir up starts)
//
// This package only parses flags and configuration, builds the logger and
// calls the services' Options/New/Start/Ready/Shutdown (package stack holds
// the builders).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/weir-storage/weir/stack"
)

type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{
	"up":          {"start embedded NATS and the services, stop them on SIGINT or SIGTERM", cmdUp},
	"demo":        {"bring weir up, run a workload, restart, check the data, stop", cmdDemo},
	"status":      {"print every service's health and counters; exit 1 if one is missing or unhealthy", cmdStatus},
	"check":       {"check a stopped data directory (read-only; --repair fixes what it can)", cmdCheck},
	"format":      {"erase a stopped stack: its namespace and its store (every file is lost; needs --yes)", cmdFormat},
	"doctor":      {"check what the SPDK backend needs on this host and print the fix for each problem", cmdDoctor},
	"nats-config": {"print the authorization block an external nats-server needs for this stack", cmdNATSConfig},
	"drop-caches": {"evict every clean page of the IO service's page cache (as drop_caches does the kernel's)", cmdDropCaches},
	"lease":       {"ls: list the shared and exclusive leases of the metadata service; revoke ID|PATH: end them", cmdLease},
}

// Every service of the registry is a command that runs it in this
// process (what weir up starts as a child).
func init() {
	for _, spec := range stack.Services(nil) {
		commands[spec.Name] = command{"run the " + spec.Name + " service in this process",
			func(a []string) int { return cmdService(spec, a) }}
	}
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(os.Stdout)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "weir: unknown command %q\n\n", args[0])
		usage(os.Stderr)
		return 2
	}
	return c.run(args[1:])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: weir <command> [flags]   (weir <command> -h for its flags)")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
}

// newFlags makes a command's flag set; parse errors return exit code 2.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("weir "+name, flag.ContinueOnError)
	return fs
}
