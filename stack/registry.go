package stack

import (
	"context"
	"slices"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/services/journal"
	"github.com/weir-storage/weir/services/metadata"
)

// Service is what every weir service is to the code that runs it.
type Service interface {
	Start() error
	Ready() <-chan struct{}
	Shutdown(ctx context.Context) error
}

// Spec is one service of a stack: the registry entry that `weir up`, the
// `weir <service>` commands, `weir status` and the in-process Stack all
// read, so that none of them keeps a list of its own.
type Spec struct {
	// Name is the service's short name: the `weir` subcommand that runs
	// it, its credentials' role, and its micro service name after "weir-".
	Name string
	// New builds the service of c on nc (an authenticated connection
	// as Role()); Start makes it serve.
	New func(c *config.Config, nc *nats.Conn, log hclog.Logger) (Service, error)
	// Halt, if set, runs after Shutdown and right before the process
	// exits (the IO service stops SPDK's thread).
	Halt func() error
	// Enabled, if set, says whether a stack of c runs the service.
	Enabled func(c *config.Config) bool
	// stopRank orders the stop: lower first.
	stopRank int
}

// runs says whether a stack of c runs the service.
func (s Spec) runs(c *config.Config) bool { return s.Enabled == nil || s.Enabled(c) }

// Role is the spec's NATS credentials role.
func (s Spec) Role() control.Role { return control.Role(s.Name) }

// NATSName is the spec's micro service name, as `weir status` lists it.
func (s Spec) NATSName() string { return control.Role(s.Name).ServiceName() }

// registry lists the services in the order they start. The metadata
// service starts first: the IO service opens its service session with it
// and is resynchronised by it before it is ready. The metadata service
// also stops first, so that it revokes its grants at a running IO service
// and records the sizes it reports.
var registry = []Spec{
	{
		Name: "metadata",
		New: func(c *config.Config, nc *nats.Conn, log hclog.Logger) (Service, error) {
			return metadata.New(MetadataOptions(c, nc, log))
		},
		stopRank: 0,
	},
	{
		Name: "io",
		New: func(c *config.Config, nc *nats.Conn, log hclog.Logger) (Service, error) {
			return NewIO(c, nc, log)
		},
		Halt:     HaltBackends,
		stopRank: 1,
	},
	{
		// The journal service checkpoints io's staging log: it starts
		// after io (it dials io's journal socket, and keeps dialing),
		// and stops first, so that its pass in flight ends before the
		// services it drives stop.
		Name: "journal",
		New: func(c *config.Config, nc *nats.Conn, log hclog.Logger) (Service, error) {
			return journal.New(JournalOptions(c, nc, log))
		},
		Enabled:  JournalEnabled,
		stopRank: -1,
	},
}

// JournalEnabled says whether a stack of c runs the journal service: it
// is enabled and there is a staging log to checkpoint.
func JournalEnabled(c *config.Config) bool { return c.Journal.Enabled && c.IO.StagingSize > 0 }

// Services returns the services a stack of c runs, in start order; nil c
// means the whole registry.
func Services(c *config.Config) []Spec {
	var s []Spec
	for _, sp := range registry {
		if c == nil || sp.runs(c) {
			s = append(s, sp)
		}
	}
	return s
}

// StopOrder returns the services of a stack of c in the order they stop.
func StopOrder(c *config.Config) []Spec {
	s := Services(c)
	slices.SortStableFunc(s, func(a, b Spec) int { return a.stopRank - b.stopRank })
	return s
}

// Lookup returns the spec of the service named name.
func Lookup(name string) (Spec, bool) {
	i := slices.IndexFunc(registry, func(s Spec) bool { return s.Name == name })
	if i < 0 {
		return Spec{}, false
	}
	return registry[i], true
}

// ServiceNames are the services of a stack of c, by their names on NATS:
// the ones `weir status` expects to find in the stack's namespace.
func ServiceNames(c *config.Config) []string {
	var names []string
	for _, s := range Services(c) {
		names = append(names, s.NATSName())
	}
	return names
}
