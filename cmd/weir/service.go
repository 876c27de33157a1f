package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// loadConfig defines --config and the override flags on fs, parses args and
// returns the resulting configuration.
func loadConfig(fs *flag.FlagSet, args []string) (*config.Config, string, error) {
	cfgPath := fs.String("config", "", "configuration file (HCL); defaults apply without one")
	config.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, "", err
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return nil, "", err
	}
	if err := cfg.ApplyFlags(fs); err != nil {
		return nil, "", err
	}
	return cfg, *cfgPath, nil
}

// cmdService runs one service of the registry in this process until
// SIGINT or SIGTERM.
func cmdService(spec stack.Spec, args []string) int {
	fs := newFlags(spec.Name)
	readyFD := fs.Int("ready-fd", 0, "write \"ready\\n\" to this file descriptor once serving (used by weir up)")
	cfg, _, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir %s: %v\n", spec.Name, err)
		return 2
	}
	log := cfg.Logger(spec.NATSName(), os.Stderr)
	if err := serve(spec, cfg, log, *readyFD); err != nil {
		log.Error("service failed", "error", err)
		return 1
	}
	return 0
}

func serve(spec stack.Spec, cfg *config.Config, log hclog.Logger, readyFD int) error {
	// From the first moment: a SIGTERM while the service starts (weir up
	// stopping a start) stops it as one after its start would.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if cfg.NATS.URL == "" {
		return errors.New("no NATS URL: run the services under `weir up`, or set nats.url / --nats-url")
	}
	if _, err := stack.Prepare(cfg, log); err != nil {
		return err
	}
	// weir up (readyFD) checked its server already; a service started on
	// its own checks that its server refuses connections without
	// credentials.
	if readyFD == 0 {
		if err := stack.CheckServerAuth(cfg.NATS.URL, cfg.NATS.ConnectTimeout); err != nil {
			return err
		}
	}
	nc, err := stack.Connect(cfg, cfg.NATS.URL, spec.Role(), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	svc, err := spec.New(cfg, nc, log)
	if err != nil {
		return err
	}
	// Start registers the service's health and stats endpoints too.
	if err := svc.Start(); err != nil {
		return err
	}
	var sig os.Signal
	select {
	case sig = <-sigs:
		log.Info("stopping before the service was ready", "signal", sig.String())
	case <-svc.Ready():
		if readyFD > 0 {
			f := os.NewFile(uintptr(readyFD), "ready")
			_, _ = f.WriteString("ready\n")
			f.Close()
		}
		sig = <-sigs
		log.Info("stopping", "signal", sig.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), stack.ShutdownTimeout)
	defer cancel()
	if err := svc.Shutdown(ctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if spec.Halt != nil {
		if err := spec.Halt(); err != nil {
			return err
		}
	}
	log.Info("stopped")
	return nil
}
