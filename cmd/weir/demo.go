package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
)

// cmdDemo is the README's "run weir" command: it brings the services up as
// processes (embedded NATS, file backend), runs a real workload through the
// Go client, stops everything, brings it up again on the same data and
// checks every byte, then cleans up and stops.
func cmdDemo(args []string) int {
	fs := newFlags("demo")
	files := fs.Int("files", 500, "files in the workload")
	keep := fs.Bool("keep", false, "keep the data directory (default: a temporary one is removed)")
	cfg, cfgPath, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir demo: %v\n", err)
		return 2
	}
	if f := fs.Lookup(config.FlagData); f == nil || f.Value.String() == "" {
		dir, err := os.MkdirTemp("", "weir-demo-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "weir demo: %v\n", err)
			return 1
		}
		if !*keep {
			defer os.RemoveAll(dir)
		}
		if err := fs.Set(config.FlagData, dir); err != nil {
			return 2
		}
		if err := cfg.ApplyFlags(fs); err != nil {
			fmt.Fprintf(os.Stderr, "weir demo: %v\n", err)
			return 2
		}
	}
	log := cfg.Logger("weir-demo", os.Stderr)
	d := &demo{cfg: cfg, n: *files, sums: map[string][32]byte{}}
	for round, step := range []func(*client.FS) error{d.workload, d.verifyAndClean} {
		s := &stack.Supervisor{Config: cfg, ConfigPath: cfgPath, Log: log}
		if err := s.Start(); err != nil {
			log.Error("start failed", "error", err)
			s.Stop()
			return 1
		}
		if round == 0 {
			s.Announce()
		} else {
			fmt.Println("\nrestarted the services on the same data directory")
		}
		err := d.withClient(step)
		if err == nil && round == 1 {
			err = printStatus(os.Stdout, cfg, s.URL(), false)
		}
		s.Stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "weir demo: %v\n", err)
			return 1
		}
	}
	fmt.Println("\ndemo passed: every byte written before the restart read back after it")
	return 0
}

type demo struct {
	cfg  *config.Config
	n    int
	sums map[string][32]byte // path -> sha256 of its content
	big  [32]byte
}

func (d *demo) withClient(f func(*client.FS) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mode, _ := ring.ParseWaitMode(d.cfg.IO.WaitMode)
	c, err := client.Dial(ctx, client.Options{
		MetadataSocket: d.cfg.Metadata.Socket, IOSocket: d.cfg.IO.Socket, Mode: mode})
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

func phase(name string, ops int, start time.Time) {
	el := time.Since(start)
	fmt.Printf("  %-34s %7d ops  %8.1f ms  %9.0f ops/s\n", name, ops, float64(el.Microseconds())/1000,
		float64(ops)/el.Seconds())
}

const bigSize = 16 << 20

func (d *demo) workload(c *client.FS) error {
	fmt.Printf("\nworkload (%d files):\n", d.n)
	rng := rand.New(rand.NewPCG(1, 2))
	t := time.Now()
	for i := range 10 {
		if err := c.MkdirAll(fmt.Sprintf("demo/d%d", i), 0o755); err != nil {
			return err
		}
	}
	phase("mkdir", 10, t)

	t = time.Now()
	written := 0
	for i := range d.n {
		name := fmt.Sprintf("demo/d%d/f%04d", i%10, i)
		data := make([]byte, 1+rng.IntN(64<<10))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		f, err := c.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.Write(data); err != nil {
			return err
		}
		if i%50 == 0 {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		if err := f.Close(); err != nil {
			return err
		}
		d.sums[name] = sha256.Sum256(data)
		written += len(data)
	}
	phase(fmt.Sprintf("create+write (%d MiB)", written>>20), d.n, t)

	t = time.Now()
	if err := d.check(c); err != nil {
		return err
	}
	phase("read back and verify", d.n, t)

	t = time.Now()
	renamed := 0
	for name, sum := range d.sums {
		if renamed*3 >= d.n {
			break
		}
		to := name + ".moved"
		if err := c.Rename(name, to); err != nil {
			return err
		}
		delete(d.sums, name)
		d.sums[to] = sum
		renamed++
	}
	phase("rename", renamed, t)

	t = time.Now()
	total := 0
	for i := range 10 {
		ents, err := c.ReadDir(fmt.Sprintf("demo/d%d", i))
		if err != nil {
			return err
		}
		total += len(ents)
	}
	if total != len(d.sums) {
		return fmt.Errorf("readdir found %d entries, want %d", total, len(d.sums))
	}
	phase("readdir", 10, t)

	// Random 4 KiB I/O on one file, with latency percentiles.
	f, err := c.OpenFile("demo/big", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	model := make([]byte, bigSize)
	if _, err := f.WriteAt(model, 0); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	var lat []time.Duration
	t = time.Now()
	for i := range 4000 {
		off := int64(rng.IntN(bigSize/4096)) * 4096
		s := time.Now()
		if i%2 == 0 {
			for j := range buf {
				buf[j] = byte(rng.Uint32())
			}
			if _, err := f.WriteAt(buf, off); err != nil {
				return err
			}
			copy(model[off:], buf)
		} else {
			if _, err := f.ReadAt(buf, off); err != nil {
				return err
			}
			if !bytes.Equal(buf, model[off:off+4096]) {
				return fmt.Errorf("big file: read at %d differs from what was written", off)
			}
		}
		lat = append(lat, time.Since(s))
	}
	phase("random 4 KiB read/write", len(lat), t)
	slices.Sort(lat)
	fmt.Printf("  %-34s p50 %v  p99 %v\n", "  latency", lat[len(lat)/2], lat[len(lat)*99/100])
	if err := f.Sync(); err != nil {
		return err
	}
	d.big = sha256.Sum256(model)
	return f.Close()
}

func (d *demo) check(c *client.FS) error {
	for name, sum := range d.sums {
		got, err := c.ReadFile(name)
		if err != nil {
			return err
		}
		if sha256.Sum256(got) != sum {
			return fmt.Errorf("%s: content differs from what was written", name)
		}
	}
	return nil
}

func (d *demo) verifyAndClean(c *client.FS) error {
	t := time.Now()
	if err := d.check(c); err != nil {
		return err
	}
	got, err := c.ReadFile("demo/big")
	if err != nil {
		return err
	}
	if len(got) != bigSize || sha256.Sum256(got) != d.big {
		return fmt.Errorf("demo/big: %d bytes, content differs from what was written", len(got))
	}
	phase("verify after restart", len(d.sums)+1, t)
	t = time.Now()
	if err := c.RemoveAll("demo"); err != nil {
		return err
	}
	if _, err := c.Stat("demo"); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("demo still there after RemoveAll: %v", err)
	}
	phase("remove all", len(d.sums)+11, t)
	return nil
}

// printStatus writes to w the health and counters of the services of the
// stack c configures, those it expects (stack.ServiceNames) included,
// asking the NATS server at url with the stack's cli credentials. It fails
// when the credentials cannot be read (saying to run as the service user),
// NATS is unreachable or a service is missing, hung or unhealthy, after
// writing what it found.
func printStatus(w io.Writer, c *config.Config, url string, asJSON bool) error {
	namespace := c.NATS.Namespace
	nc, err := stack.Connect(c, url, control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := control.Status(ctx, nc, namespace, stack.ServiceNames(c)...)
	if err != nil {
		return err
	}
	if !asJSON {
		fmt.Fprintln(w)
	}
	if err := control.FormatStatus(w, st, asJSON); err != nil {
		return err
	}
	var bad []string
	for _, s := range control.Unhealthy(st) {
		bad = append(bad, s.Name+": "+cmp.Or(s.Error, "unhealthy"))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d of %d services not healthy (namespace %s): %s", len(bad), len(st), namespace, strings.Join(bad, "; "))
	}
	return nil
}
