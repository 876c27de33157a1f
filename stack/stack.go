// Package stack turns a weir configuration into running services. The weir
// command uses its builders to run each service in its own process; tests,
// the demo workload and the conformance suite use Start to run the whole
// stack (embedded NATS, metadata, IO) inside one process with the same code.
package stack

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/ring"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/file"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/services/metadata"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Version is reported by every service on NATS.
const Version = "0.1.0"

// ServiceNames are the services of a stack, by their names on NATS: the
// ones `weir status` expects to find in the stack's namespace.
func ServiceNames() []string { return []string{metadata.ServiceName, iosvc.ServiceName} }

// RingConfig is the per-session ring size the services create.
func RingConfig(c *config.Config) ring.Config {
	return ring.Config{
		SQEntries: uint32(c.Ring.SQEntries),
		CQEntries: 2 * uint32(c.Ring.SQEntries),
		ArenaSize: uint64(c.Ring.ArenaSize),
		BlockSize: uint32(c.Ring.BlockSize),
	}
}

func waitMode(c *config.Config) ring.WaitMode {
	m, err := ring.ParseWaitMode(c.IO.WaitMode)
	if err != nil { // Config.Validate already refused it
		return ring.WaitAdaptive
	}
	return m
}

// MetadataOptions builds the metadata service's options.
func MetadataOptions(c *config.Config, nc *nats.Conn, log hclog.Logger) metadata.Options {
	return metadata.Options{
		Socket: c.Metadata.Socket,
		NS: ns.Options{
			Dir:             filepath.Join(c.DataDir, "meta"),
			CheckpointEvery: c.Metadata.CheckpointEvery,
			SyncEveryOp:     c.Metadata.SyncEveryOp,
			SyncInterval:    c.Metadata.SyncInterval,
			Logger:          log.Named("ns"),
		},
		NATS:          nc,
		NATSNamespace: c.NATS.Namespace,
		Version:       Version,
		Ring:          RingConfig(c),
		WaitMode:      waitMode(c),
		Logger:        log,
	}
}

// NewMetadata builds the metadata service of c on nc (New: the namespace
// is opened and recovered; Start makes it serve).
func NewMetadata(c *config.Config, nc *nats.Conn, log hclog.Logger) (*metadata.Service, error) {
	return metadata.New(MetadataOptions(c, nc, log))
}

// NewIO opens the configured backend and builds the IO service of c on
// nc around it; the service owns the backend (Start makes it serve).
func NewIO(c *config.Config, nc *nats.Conn, log hclog.Logger) (*iosvc.Service, error) {
	be, err := Backend(c, log)
	if err != nil {
		return nil, err
	}
	s, err := iosvc.New(IOOptions(c, be, nc, log))
	if err != nil {
		be.Close()
		return nil, err
	}
	return s, nil
}

// Backend opens the configured storage backend.
func Backend(c *config.Config, log hclog.Logger) (backend.Backend, error) {
	switch c.IO.Backend {
	case "mem":
		return mem.New(), nil
	case "file":
		d := file.DirectAuto
		switch c.IO.Direct {
		case "on":
			d = file.DirectOn
		case "off":
			d = file.DirectOff
		}
		return file.New(file.Options{Dir: c.DataDir, Direct: d, Logger: log.Named("backend")})
	case "spdk":
		return spdkBackend(c)
	default:
		return nil, fmt.Errorf("unknown backend %q", c.IO.Backend)
	}
}

// IOOptions builds the IO service's options around an opened backend.
func IOOptions(c *config.Config, be backend.Backend, nc *nats.Conn, log hclog.Logger) iosvc.Options {
	return iosvc.Options{
		Socket:        c.IO.Socket,
		Backend:       be,
		NATS:          nc,
		NATSNamespace: c.NATS.Namespace,
		Version:       Version,
		Ring:          RingConfig(c),
		WaitMode:      waitMode(c),
		Logger:        log,
	}
}

// Prepare creates the data and run directories.
func Prepare(c *config.Config) error {
	for _, d := range []string{c.DataDir, c.RunDir, filepath.Dir(c.Metadata.Socket), filepath.Dir(c.IO.Socket)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			if errors.Is(err, fs.ErrPermission) {
				return fmt.Errorf("create %s: %w (run as root for the default %s, or choose a directory with --data DIR or data_dir in the config)", d, err, config.DefaultDataDir)
			}
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	return nil
}

// Stack is every service in one process.
type Stack struct {
	Config   *config.Config
	NATS     *control.Embedded // nil when the config names an external server
	Metadata *metadata.Service
	IO       *iosvc.Service
	conns    []*nats.Conn
}

// Start runs NATS (embedded unless configured), the metadata service and
// the IO service in this process, and returns when all are ready.
func Start(c *config.Config, log hclog.Logger) (st *Stack, err error) {
	if err := Prepare(c); err != nil {
		return nil, err
	}
	st = &Stack{Config: c}
	defer func() {
		if err != nil {
			st.Shutdown(context.Background())
		}
	}()
	url := c.NATS.URL
	if url == "" {
		st.NATS, err = control.StartEmbedded(c.NATS.Listen, log.Named("nats"))
		if err != nil {
			return st, err
		}
		url = st.NATS.URL()
	}
	connect := func(name string) (*nats.Conn, error) {
		nc, err := control.Connect(url, name, log.Named(name))
		if err == nil {
			st.conns = append(st.conns, nc)
		}
		return nc, err
	}
	mnc, err := connect("weir-metadata")
	if err != nil {
		return st, err
	}
	if st.Metadata, err = NewMetadata(c, mnc, log.Named("metadata")); err != nil {
		return st, err
	}
	if err := st.Metadata.Start(); err != nil {
		return st, err
	}
	inc, err := connect("weir-io")
	if err != nil {
		return st, err
	}
	if st.IO, err = NewIO(c, inc, log.Named("io")); err != nil {
		return st, err
	}
	if err := st.IO.Start(); err != nil {
		return st, err
	}
	return st, nil
}

// Dial connects a client to the stack.
func (st *Stack) Dial(ctx context.Context) (*client.FS, error) {
	return client.Dial(ctx, client.Options{
		MetadataSocket: st.Config.Metadata.Socket,
		IOSocket:       st.Config.IO.Socket,
		Mode:           waitMode(st.Config),
	})
}

// Shutdown stops the services: metadata first (it revokes its grants at the
// IO service and records the sizes reported back), then IO, then NATS.
func (st *Stack) Shutdown(ctx context.Context) error {
	var errs []error
	if st.Metadata != nil {
		errs = append(errs, st.Metadata.Shutdown(ctx))
	}
	if st.IO != nil {
		errs = append(errs, st.IO.Shutdown(ctx))
	}
	for _, nc := range st.conns {
		nc.Close()
	}
	if st.NATS != nil {
		st.NATS.Shutdown()
	}
	return errors.Join(errs...)
}

// ShutdownTimeout is how long a clean stop may take.
const ShutdownTimeout = 30 * time.Second

// LocalConfig is the default configuration with its data in dataDir and,
// when runDir is not empty, its sockets in runDir (Unix socket paths are
// limited to 108 bytes, which a deep test directory can exceed).
func LocalConfig(dataDir, runDir string) (*config.Config, error) {
	c := config.Default()
	fs := flag.NewFlagSet("weir", flag.ContinueOnError)
	config.AddFlags(fs)
	if err := fs.Parse([]string{"--" + config.FlagData, dataDir}); err != nil {
		return nil, err
	}
	if err := c.ApplyFlags(fs); err != nil {
		return nil, err
	}
	if runDir != "" {
		c.RunDir = runDir
		c.Metadata.Socket = filepath.Join(runDir, "metadata.sock")
		c.IO.Socket = filepath.Join(runDir, "io.sock")
	}
	return c, c.Validate()
}
