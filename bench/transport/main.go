// Command transport measures weir's shared-memory ring against a Unix
// domain socket and a pipe, request/response between two processes, in one
// run (issue 2).
//
// Transports: ring-busypoll and ring-adaptive (both sides in that wait
// mode; the client goroutines share one session), uds (a socket per client
// goroutine, Go's netpoller on both sides), uds-blocking (the same, with
// blocking read and write system calls as C code would do) and pipe (a pipe
// pair per client goroutine). Every transport serves the same two requests:
// a no-op, and a 4 KiB echo in which the client copies the payload in, the
// server copies it into its own memory and back, and the client copies the
// answer out into a private buffer.
//
// Each configuration (transport, payload, client goroutines) gets a warm-up
// and a measured window; then each transport's idle session is measured for
// CPU alone. The program prints a Markdown table and writes it, with a JSON
// copy, to the -out directory.
//
// The program is its own server: it re-executes itself with serverRoleArg,
// one child process per transport, and stops the child by closing its stdin.
//
// Usage:
//
//	go run ./bench/transport [-quick] [-duration 1s] [-warmup 200ms] [-out bench/results]
//	    [-transports ring-busypoll,ring-adaptive,uds,uds-blocking,pipe] [-threads 1,2,4]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// echoPayload is the payload of the echo workload.
const echoPayload = 4096

const quickWindow = 300 * time.Millisecond

// config is what the command line asks for.
type config struct {
	out        string
	transports []string
	threads    []int
	payloads   []int
	quick      bool
	s          settings
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == serverRoleArg {
		os.Exit(serverMain(os.Args[2:]))
	}
	os.Exit(clientMain())
}

func clientMain() int {
	logger := log.New(os.Stderr, "transport: ", 0)
	cfg, err := parseFlags(flag.CommandLine, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		logger.Print(err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg, logger)
	if err != nil {
		logger.Print(err)
		return 1
	}
	md := rep.markdown()
	fmt.Print(md)
	if err := rep.write(cfg.out, md); err != nil {
		logger.Print(err)
		return 1
	}
	logger.Printf("wrote %s and %s", filepath.Join(cfg.out, "transport.md"), filepath.Join(cfg.out, "transport.json"))
	return 0
}

func parseFlags(fs *flag.FlagSet, args []string) (config, error) {
	cfg := config{payloads: []int{0, echoPayload}}
	fs.StringVar(&cfg.out, "out", "bench/results", "directory for transport.md and transport.json")
	fs.DurationVar(&cfg.s.window, "duration", time.Second, "measured window per configuration")
	fs.DurationVar(&cfg.s.warmup, "warmup", 200*time.Millisecond, "warm-up before each measured window")
	fs.BoolVar(&cfg.quick, "quick", false, "measure for "+quickWindow.String()+" per configuration instead of -duration; every configuration still runs")
	fs.IntVar(&cfg.s.maxSamples, "max-samples", 2_000_000, "round-trip latencies recorded per client goroutine; later round trips are counted but not timed")
	transports := fs.String("transports", strings.Join(allTransports, ","), "comma-separated transports to measure")
	threads := fs.String("threads", "1,2,4", "comma-separated client goroutine counts")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.quick {
		cfg.s.window = quickWindow
	}
	if cfg.s.window <= 0 || cfg.s.warmup < 0 {
		return cfg, fmt.Errorf("-duration must be positive and -warmup not negative")
	}
	if cfg.s.maxSamples <= 0 {
		return cfg, fmt.Errorf("-max-samples must be positive")
	}
	for _, t := range strings.Split(*transports, ",") {
		t = strings.TrimSpace(t)
		if !slices.Contains(allTransports, t) {
			return cfg, fmt.Errorf("-transports: unknown transport %q (have %s)", t, strings.Join(allTransports, ", "))
		}
		if !slices.Contains(cfg.transports, t) {
			cfg.transports = append(cfg.transports, t)
		}
	}
	for _, s := range strings.Split(*threads, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || n > 1024 {
			return cfg, fmt.Errorf("-threads: %q is not a goroutine count in [1, 1024]", s)
		}
		if !slices.Contains(cfg.threads, n) {
			cfg.threads = append(cfg.threads, n)
		}
	}
	slices.Sort(cfg.threads)
	return cfg, nil
}

// run measures every configuration and builds the report.
func run(ctx context.Context, cfg config, logger *log.Logger) (*report, error) {
	rep, err := newReport(cfg)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "weir-transport-")
	if err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	defer os.RemoveAll(dir)
	rec := &recorder{s: cfg.s}
	for _, t := range cfg.transports {
		rows, warn, err := runTransport(ctx, cfg, t, dir, rec, logger)
		rep.Rows = append(rep.Rows, rows...)
		if warn != "" {
			rep.Warnings = append(rep.Warnings, warn)
		}
		if err != nil {
			return nil, err
		}
	}
	rep.finish()
	return rep, nil
}

// runTransport measures every configuration of one transport against a
// fresh server child. Configurations that fail are rows with an error; the
// error returned is only for an interrupted run. warn reports a server that
// did not exit cleanly.
func runTransport(ctx context.Context, cfg config, transport, dir string, rec *recorder, logger *log.Logger) (rows []Row, warn string, err error) {
	c, err := startChild(transport, dir, slices.Max(cfg.threads))
	if err != nil {
		for _, p := range cfg.payloads {
			for _, n := range cfg.threads {
				rows = append(rows, Row{Transport: transport, Workload: workloadName(p),
					PayloadBytes: p, Threads: n, Error: err.Error()})
			}
		}
		logger.Print(err)
		return rows, "", nil
	}
	defer func() {
		if serr := c.stop(); serr != nil {
			warn = serr.Error()
			logger.Print(serr)
		}
	}()
	for _, p := range cfg.payloads {
		for _, n := range cfg.threads {
			if err := ctx.Err(); err != nil {
				return rows, "", fmt.Errorf("interrupted: %w", err)
			}
			row := measureRow(ctx, c, rec, p, n)
			rows = append(rows, row)
			if row.Error != "" {
				logger.Printf("%-13s %-10s %d thr: error: %s", transport, row.Workload, n, row.Error)
				c.settle()
				continue
			}
			logger.Printf("%-13s %-10s %d thr: %9.0f ops/s  p50 %7.2f µs  p99 %8.2f µs",
				transport, row.Workload, n, row.OpsPerSec, row.P50us, row.P99us)
		}
	}
	row := measureIdleRow(ctx, c, cfg.s)
	rows = append(rows, row)
	if row.Error != "" {
		logger.Printf("%-13s idle session: error: %s", transport, row.Error)
	} else {
		logger.Printf("%-13s idle session: client %.2f + server %.2f cores", transport, row.ClientCPUCores, row.ServerCPUCores)
	}
	return rows, "", nil
}
