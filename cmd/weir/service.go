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
	"github.com/weir-storage/weir/internal/control"
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

// service is what cmdService runs: one of the two services.
type service interface {
	Start() error
	Ready() <-chan struct{}
	Shutdown(ctx context.Context) error
}

// cmdService runs one service in this process until SIGINT or SIGTERM.
func cmdService(kind string, args []string) int {
	fs := newFlags(kind)
	readyFD := fs.Int("ready-fd", 0, "write \"ready\\n\" to this file descriptor once serving (used by weir up)")
	cfg, _, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir %s: %v\n", kind, err)
		return 2
	}
	log := cfg.Logger("weir-"+kind, os.Stderr)
	if err := serve(kind, cfg, log, *readyFD); err != nil {
		log.Error("service failed", "error", err)
		return 1
	}
	return 0
}

func serve(kind string, cfg *config.Config, log hclog.Logger, readyFD int) error {
	if cfg.NATS.URL == "" {
		return errors.New("no NATS URL: run the services under `weir up`, or set nats.url / --nats-url")
	}
	if err := stack.Prepare(cfg); err != nil {
		return err
	}
	name := "weir-" + kind
	nc, err := control.Connect(cfg.NATS.URL, name, log.Named("nats"))
	if err != nil {
		return err
	}
	defer nc.Close()
	var svc service
	switch kind {
	case "metadata":
		m, err := stack.NewMetadata(cfg, nc, log)
		if err != nil {
			return err
		}
		svc = m
	case "io":
		s, err := stack.NewIO(cfg, nc, log)
		if err != nil {
			return err
		}
		svc = s
	default:
		return fmt.Errorf("unknown service %q", kind)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	// Start registers the service's health and stats endpoints too.
	if err := svc.Start(); err != nil {
		return err
	}
	<-svc.Ready()
	if readyFD > 0 {
		f := os.NewFile(uintptr(readyFD), "ready")
		_, _ = f.WriteString("ready\n")
		f.Close()
	}
	sig := <-sigs
	log.Info("stopping", "signal", sig.String())
	ctx, cancel := context.WithTimeout(context.Background(), stack.ShutdownTimeout)
	defer cancel()
	if err := svc.Shutdown(ctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if kind == "io" {
		// The backend is closed: stop SPDK's polling thread before the
		// process exits (C exit handlers may tear SPDK's memory down).
		if err := stack.HaltBackends(); err != nil {
			return err
		}
	}
	log.Info("stopped")
	return nil
}
