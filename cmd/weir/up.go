package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
)

// cmdUp is `weir up`: 0 when a signal stopped it (during its start too)
// and every service it started stopped cleanly, 1 when one failed to
// start, died or did not stop cleanly, 2 for a usage error.
func cmdUp(args []string) int {
	// Before anything starts: a SIGINT or SIGTERM at any moment stops
	// what was started, in order, and never leaves a service behind.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	fs := newFlags("up")
	cfg, cfgPath, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir up: %v\n", err)
		return 2
	}
	s := &stack.Supervisor{Config: cfg, ConfigPath: cfgPath, Log: cfg.Logger("weir-up", os.Stderr), Interrupt: sigs}
	if err := s.Start(); errors.Is(err, stack.ErrInterrupted) {
		s.Log.Info("stopping what was started", "reason", err)
		if err := s.Stop(); err != nil {
			s.Log.Error("stop", "error", err)
			return 1
		}
		return 0
	} else if err != nil {
		s.Log.Error("start failed", "error", err)
		s.Stop()
		return 1
	}
	s.Announce()
	werr := s.Wait()
	if werr != nil {
		s.Log.Error("a service died; stopping the others", "error", werr)
	}
	if err := s.Stop(); err != nil {
		s.Log.Error("stop", "error", err)
		return 1
	}
	if werr != nil {
		return 1
	}
	return 0
}

func cmdStatus(args []string) int { return runStatus(os.Stdout, os.Stderr, args) }

// natsURL is where the CLI finds the stack's NATS: nats.url, or what weir
// up recorded in the run directory.
func natsURL(cfg *config.Config) (string, error) {
	if cfg.NATS.URL != "" {
		return cfg.NATS.URL, nil
	}
	b, err := os.ReadFile(filepath.Join(cfg.RunDir, stack.NATSURLFile))
	if err != nil {
		return "", fmt.Errorf("no NATS URL given and none recorded by weir up in %s: %w", cfg.RunDir, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// runStatus is `weir status`, writing to stdout and stderr: 0 when every
// service of the stack answers healthy, 1 when one is missing, hung or
// unhealthy or NATS is unreachable, 2 for a usage error.
func runStatus(stdout, stderr io.Writer, args []string) int {
	fs := newFlags("status")
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	cfg, _, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "weir status: %v\n", err)
		return 2
	}
	url, err := natsURL(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "weir status: %v\n", err)
		return 1
	}
	if err := printStatus(stdout, cfg, url, *asJSON); err != nil {
		fmt.Fprintf(stderr, "weir status: %v\n", err)
		return 1
	}
	return 0
}

// cmdNATSConfig prints the authorization block of a nats-server
// configuration that admits this stack's services and CLI, each with its
// permissions, creating the stack's credentials first if there are none.
// With several stacks on one server, concatenate their users lists.
func cmdNATSConfig(args []string) int {
	fs := newFlags("nats-config")
	cfg, _, err := loadConfig(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir nats-config: %v\n", err)
		return 2
	}
	users, err := stack.Users(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "weir nats-config: %v\n", err)
		return 1
	}
	fmt.Printf("# nats-server authorization for the weir stack in NATS namespace %q\n", cfg.NATS.Namespace)
	fmt.Printf("# (credentials in %s; nothing below is secret: nkeys are public keys)\n", cfg.NATS.CredsDir)
	fmt.Print(control.ServerConfig(users))
	return 0
}
