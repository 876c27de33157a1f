package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/services/metadata"
	"github.com/weir-storage/weir/stack"
)

func cmdLease(args []string) int { return runLease(os.Stdout, os.Stderr, args) }

const leaseUsage = `usage: weir lease ls [--file PATH] [--json] [config flags]
       weir lease revoke [config flags] LEASE-ID|PATH`

// runLease is `weir lease`: ls lists the leases the metadata service
// holds (services/metadata/leases.go: kept shared leases, and exclusive
// ones, groups.go), revoke ends one (by id) or every lease of a file (by
// path). 0 when done, 1 when the services could not
// be asked, 2 for a usage error.
func runLease(stdout, stderr io.Writer, args []string) int {
	if len(args) == 0 || (args[0] != "ls" && args[0] != "revoke") {
		fmt.Fprintln(stderr, leaseUsage)
		return 2
	}
	sub := args[0]
	fs := newFlags("lease " + sub)
	fs.SetOutput(stderr)
	var file *string
	var asJSON *bool
	if sub == "ls" {
		file = fs.String("file", "", "only the leases of this file (a path in the weir namespace)")
		asJSON = fs.Bool("json", false, "print JSON")
	}
	cfg, _, err := loadConfig(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "weir lease %s: %v\n", sub, err)
		return 2
	}
	if sub == "revoke" && fs.NArg() != 1 || sub == "ls" && fs.NArg() != 0 {
		fmt.Fprintln(stderr, leaseUsage)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "weir lease %s: %v\n", sub, err)
		return 1
	}
	url, err := natsURL(cfg)
	if err != nil {
		return fail(err)
	}
	nc, err := stack.Connect(cfg, url, control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	var body []byte
	endpoint := control.LeasesEndpoint
	var ino uint64
	switch {
	case sub == "ls" && *file != "":
		if ino, err = inoOf(ctx, cfg, *file); err != nil {
			return fail(err)
		}
	case sub == "revoke":
		endpoint = control.LeaseRevokeEndpoint
		q := control.LeaseRevokeRequest{}
		if id, err := strconv.ParseUint(fs.Arg(0), 10, 64); err == nil {
			q.Lease = id
		} else if q.Ino, err = inoOf(ctx, cfg, fs.Arg(0)); err != nil {
			return fail(err)
		}
		body, _ = json.Marshal(q)
	}
	out, err := control.CallWith(ctx, nc, cfg.NATS.Namespace, metadata.ServiceName, endpoint, body)
	if err != nil {
		return fail(err)
	}
	for _, v := range out { // one metadata service
		b, _ := json.Marshal(v)
		if sub == "revoke" {
			var r control.LeaseRevokeReply
			if err := json.Unmarshal(b, &r); err != nil {
				return fail(fmt.Errorf("bad reply: %w", err))
			}
			fmt.Fprintf(stdout, "%d ended, %d in use (each ends at its last close)", r.Ended, r.Doomed)
			if r.Exclusive > 0 {
				fmt.Fprintf(stdout, ", %d exclusive (held by open writers: each ends at its close, or when another trust group's grant recalls it)", r.Exclusive)
			}
			fmt.Fprintln(stdout)
			continue
		}
		var ls []control.LeaseInfo
		if err := json.Unmarshal(b, &ls); err != nil {
			return fail(fmt.Errorf("bad reply: %w", err))
		}
		if ino != 0 {
			keep := ls[:0]
			for _, l := range ls {
				if l.Ino == ino {
					keep = append(keep, l)
				}
			}
			ls = keep
		}
		if *asJSON {
			if ls == nil {
				ls = []control.LeaseInfo{}
			}
			b, _ := json.MarshalIndent(ls, "", "  ")
			fmt.Fprintln(stdout, string(b))
			continue
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "LEASE\tINO\tMODE\tGROUP\tSESSION\tPID\tUID\tHANDLES\tSTATE")
		for _, l := range ls {
			state := "idle"
			switch {
			case l.Mode == "exclusive":
				state = fmt.Sprintf("open for writing, tenure %d", l.Tenure)
			case l.Doomed:
				state = "ends at last close"
			case l.Handles > 0:
				state = "in use"
			}
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", l.Lease, l.Ino, l.Mode, l.Group, l.Session, l.PID, l.UID, l.Handles, state)
		}
		w.Flush()
	}
	return 0
}

// inoOf is the inode number of path in the weir namespace, asked as a
// client of the stack of cfg.
func inoOf(ctx context.Context, cfg *config.Config, path string) (uint64, error) {
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		return 0, fmt.Errorf("connect to weir to look up %s: %w", path, err)
	}
	defer fsys.Close()
	fi, err := fsys.Stat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("%s: no inode number", path)
	}
	return st.Ino, nil
}
