// Package stack turns a weir configuration into running services: the
// registry of services, the builders of their options, the credentials
// and authenticated NATS connections they use, and the supervisor behind
// `weir up`. The weir command runs each service in its own process with
// these builders; tests, the demo workload and the conformance suite use
// Start to run the whole stack (embedded NATS, metadata, IO) inside one
// process with the same code.
//
// It sits above the services: what services stand on (internal/) never
// imports it.
package stack

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/ring"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/file"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/services/journal"
	"github.com/weir-storage/weir/services/metadata"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Version is reported by every service on NATS.
const Version = "0.2.0"

// ShutdownTimeout is how long a clean stop may take.
const ShutdownTimeout = 30 * time.Second

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
		Socket:        c.Metadata.Socket,
		ServiceSocket: c.Metadata.ServiceSocket,
		NS: ns.Options{
			Dir:             filepath.Join(c.DataDir, "meta"),
			CheckpointEvery: c.Metadata.CheckpointEvery,
			SyncEveryOp:     c.Metadata.SyncEveryOp,
			SyncInterval:    c.Metadata.SyncInterval,
			Logger:          log.Named("ns"),
		},
		NATS:           nc,
		NATSNamespace:  c.NATS.Namespace,
		RequestTimeout: c.NATS.RequestTimeout,
		ReclaimGrace:   c.Metadata.ReclaimGrace,
		TrustGroups:    c.Metadata.TrustGroups,
		NamedGroups:    namedGroups(c.Metadata.NamedGroups),
		MinTenure:      minTenure(c.Metadata.LeaseMinTenure),
		Limits:         Limits(c),
		LeasesShare:    c.Limits.LeasesShare,
		RecordCuts:     c.IO.StagingSize == 0,
		Version:        Version,
		Ring:           RingConfig(c),
		WaitMode:       waitMode(c),
		Logger:         log,
	}
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
	return openBackend(c, log, false)
}

// BackendReadOnly opens the configured backend of a stopped service for
// an offline check, changing nothing: the file backend opens read-only,
// the SPDK backend loads without writing (an unclean blobstore's recovery
// stays in memory).
func BackendReadOnly(c *config.Config, log hclog.Logger) (backend.Backend, error) {
	return openBackend(c, log, true)
}

// spdkMode is how spdkBackend opens the blobstore.
type spdkMode int

const (
	spdkNormal   spdkMode = iota
	spdkReadOnly          // weir check: nothing is written
	spdkFormat            // weir format: a new, empty blobstore
)

func openBackend(c *config.Config, log hclog.Logger, readOnly bool) (backend.Backend, error) {
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
		if readOnly {
			d = file.DirectOff
		}
		return file.New(file.Options{Dir: c.DataDir, Direct: d, ReadOnly: readOnly, Logger: log.Named("backend")})
	case "spdk":
		m := spdkNormal
		if readOnly {
			m = spdkReadOnly
		}
		return spdkBackend(c, m)
	default:
		return nil, fmt.Errorf("unknown backend %q", c.IO.Backend)
	}
}

// IOOptions builds the IO service's options around an opened backend.
func IOOptions(c *config.Config, be backend.Backend, nc *nats.Conn, log hclog.Logger) iosvc.Options {
	return iosvc.Options{
		Socket:               c.IO.Socket,
		MetadataSocket:       c.Metadata.ServiceSocket,
		Backend:              be,
		NATS:                 nc,
		NATSNamespace:        c.NATS.Namespace,
		RequestTimeout:       c.NATS.RequestTimeout,
		Version:              Version,
		Ring:                 RingConfig(c),
		WaitMode:             waitMode(c),
		Logger:               log,
		CacheSize:            int64(c.IO.CacheSize),
		Readahead:            int64(c.IO.Readahead),
		Descriptors:          c.IO.Descriptors,
		StagingBytes:         int64(c.IO.StagingSize),
		JournalSocket:        journalSocket(c),
		ForegroundCheckpoint: JournalEnabled(c) && c.Journal.Foreground,
		LiveTable:            filepath.Join(c.DataDir, LiveTableFile),
		Limits:               Limits(c),
		Shares: iosvc.Shares{Pins: c.Limits.PinsShare, Staging: c.Limits.StagingShare,
			Descriptors: c.Limits.DescriptorsShare},
	}
}

// Limits are the per-uid bounds of c's limits block for a service's
// client listener; the uids exempt are the block's and this process's
// own (the service user's).
func Limits(c *config.Config) host.Limits {
	l := c.Limits
	h := host.Limits{HandshakesPerUID: l.HandshakesPerUID, Handshakes: l.Handshakes, HandshakeTimeout: l.HandshakeTimeout,
		SessionsPerUID: l.SessionsPerUID, Sessions: l.Sessions, Exempt: []uint32{uint32(os.Geteuid())}}
	for _, u := range l.ExemptUIDs {
		h.Exempt = append(h.Exempt, uint32(u))
	}
	return h
}

// LiveTableFile is the IO service's live table in the data directory
// (internal/livetab): only the service user may enter it.
const LiveTableFile = "io.live"

// journalSocket is io's journal socket, "" when the stack runs no journal
// service (io checkpoints its log itself).
func journalSocket(c *config.Config) string {
	if !JournalEnabled(c) {
		return ""
	}
	return c.Journal.Socket
}

// JournalOptions builds the journal service's options.
func JournalOptions(c *config.Config, nc *nats.Conn, log hclog.Logger) journal.Options {
	return journal.Options{
		IOSocket:       c.Journal.Socket,
		NATS:           nc,
		NATSNamespace:  c.NATS.Namespace,
		RequestTimeout: c.NATS.RequestTimeout,
		Version:        Version,
		Interval:       c.Journal.Interval,
		Logger:         log,
	}
}

// Prepare creates the data directory (0700: only the service user may
// enter it; a looser existing one is tightened, saying so), the run
// directory and the sockets' directories (reachable by clients: every
// request is checked against the credentials the kernel reports), and the
// stack's NATS credentials if there are none yet.
func Prepare(c *config.Config, log hclog.Logger) (*control.Creds, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	hint := func(d string, err error) error {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("create %s: %w (run as root for the default %s, or choose a directory with --data DIR or data_dir in the config)", d, err, config.DefaultDataDir)
		}
		return fmt.Errorf("create %s: %w", d, err)
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, hint(c.DataDir, err)
	}
	if fi, err := os.Stat(c.DataDir); err != nil {
		return nil, err
	} else if m := fi.Mode().Perm(); m&0o077 != 0 {
		if err := os.Chmod(c.DataDir, m&0o700); err != nil {
			return nil, fmt.Errorf("data directory %s is mode %#o, open to other users, and cannot be made 0700: %w", c.DataDir, m, err)
		}
		log.Warn("data directory was open to other users; made it private", "dir", c.DataDir, "was", fmt.Sprintf("%#o", m), "now", fmt.Sprintf("%#o", m&0o700))
	}
	for _, d := range []string{c.RunDir, filepath.Dir(c.Metadata.Socket), filepath.Dir(c.IO.Socket), filepath.Dir(c.Metadata.ServiceSocket), filepath.Dir(c.Journal.Socket)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, hint(d, err)
		}
	}
	creds, err := control.EnsureCreds(c.NATS.CredsDir)
	if err != nil {
		return nil, fmt.Errorf("NATS credentials: %w", err)
	}
	return creds, nil
}

// Users returns the NATS users of the stack c configures (creating its
// credentials if there are none): what a NATS server shared by several
// stacks must admit.
func Users(c *config.Config) ([]control.User, error) {
	creds, err := control.EnsureCreds(c.NATS.CredsDir)
	if err != nil {
		return nil, err
	}
	return creds.Users(c.NATS.Namespace), nil
}

// Connect connects to the NATS server at url as role of the stack c
// configures, with that role's credentials from c.NATS.CredsDir.
func Connect(c *config.Config, url string, role control.Role, log hclog.Logger) (*nats.Conn, error) {
	creds, err := control.LoadCreds(c.NATS.CredsDir, role)
	if err != nil {
		return nil, err
	}
	return ConnectWith(creds, c, url, role, log)
}

// ConnectWith is Connect with credentials already loaded.
func ConnectWith(creds *control.Creds, c *config.Config, url string, role control.Role, log hclog.Logger) (*nats.Conn, error) {
	opts, err := creds.Options(c.NATS.Namespace, role)
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Timeout(c.NATS.ConnectTimeout))
	return control.Connect(url, role.ServiceName(), log.Named("nats"), opts...)
}

// CheckServerAuth refuses a NATS server that admits a connection without
// credentials: any local user (or anyone who can reach it) could then
// forge control messages. It connects once without credentials, which
// the server must refuse as an authorization violation.
func CheckServerAuth(url string, timeout time.Duration) error {
	nc, err := nats.Connect(url, nats.Timeout(timeout), nats.NoReconnect(), nats.Name("weir-auth-probe"))
	if err == nil {
		nc.Close()
		return fmt.Errorf("the NATS server at %s admits connections without credentials: any process that reaches it could forge weir's control messages; configure its authorization first (`weir nats-config` prints what it needs)", redact(url))
	}
	if errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization") {
		return nil
	}
	return fmt.Errorf("NATS server at %s: %w", redact(url), err)
}

// redact drops credentials from a URL list for messages.
func redact(url string) string {
	parts := strings.Split(url, ",")
	for i, p := range parts {
		if at := strings.LastIndexByte(p, '@'); at >= 0 {
			if s := strings.Index(p, "://"); s >= 0 && s < at {
				parts[i] = p[:s+3] + "***" + p[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// Hooks adjust an in-process stack for tests: a backend of the test's own,
// options changed before each service is built, a shared NATS server.
type Hooks struct {
	Backend  backend.Backend
	Metadata func(*metadata.Options)
	IO       func(*iosvc.Options)
	// IOService runs on the IO service after New, before Start.
	IOService func(*iosvc.Service)
	// NATS is a server the stack uses instead of the one c names or an
	// embedded one of its own; it must admit the stack's users (Users).
	NATS *control.Embedded
	// UnsafeNoCreds connects the services without credentials, to a NATS
	// server without authorization: tests that show what authentication
	// prevents. No configuration can set it.
	UnsafeNoCreds bool
}

// Stack is every service in one process.
type Stack struct {
	Config   *config.Config
	NATS     *control.Embedded // the embedded server this stack started; nil otherwise
	Creds    *control.Creds
	Metadata *metadata.Service
	IO       *iosvc.Service
	Journal  *journal.Service // nil when the stack runs none (journal.enabled false, no staging log)
	url      string
	conns    []*nats.Conn
	noCreds  bool
}

// URL is the NATS server the stack uses.
func (st *Stack) URL() string { return st.url }

// Start runs NATS (embedded unless configured), the metadata service and
// the IO service in this process, and returns when all are ready.
func Start(c *config.Config, log hclog.Logger) (*Stack, error) { return StartWith(c, log, Hooks{}) }

// StartWith is Start with test hooks.
func StartWith(c *config.Config, log hclog.Logger, h Hooks) (st *Stack, err error) {
	creds, err := Prepare(c, log)
	if err != nil {
		return nil, err
	}
	st = &Stack{Config: c, Creds: creds, noCreds: h.UnsafeNoCreds}
	defer func() {
		if err != nil {
			st.Shutdown(context.Background())
		}
	}()
	switch {
	case h.NATS != nil:
		st.url = h.NATS.URL()
		if !h.UnsafeNoCreds {
			if err := CheckServerAuth(st.url, c.NATS.ConnectTimeout); err != nil {
				return st, err
			}
		}
	case c.NATS.URL != "":
		if err := CheckServerAuth(c.NATS.URL, c.NATS.ConnectTimeout); err != nil {
			return st, err
		}
		st.url = c.NATS.URL
	default:
		st.NATS, err = control.StartEmbedded(control.EmbeddedOptions{Listen: c.NATS.Listen,
			Users: creds.Users(c.NATS.Namespace), Logger: log.Named("nats")})
		if err != nil {
			return st, err
		}
		st.url = st.NATS.URL()
	}
	for _, spec := range Services(c) {
		nc, err := st.Connect(spec.Role(), log.Named(spec.Name))
		if err != nil {
			return st, err
		}
		switch spec.Name {
		case "metadata":
			opts := MetadataOptions(c, nc, log.Named("metadata"))
			if h.Metadata != nil {
				h.Metadata(&opts)
			}
			if st.Metadata, err = metadata.New(opts); err != nil {
				return st, err
			}
			err = st.Metadata.Start()
		case "io":
			be := h.Backend
			if be == nil {
				if be, err = Backend(c, log); err != nil {
					return st, err
				}
			}
			opts := IOOptions(c, be, nc, log.Named("io"))
			if h.IO != nil {
				h.IO(&opts)
			}
			if st.IO, err = iosvc.New(opts); err != nil {
				be.Close()
				return st, err
			}
			if h.IOService != nil {
				h.IOService(st.IO)
			}
			err = st.IO.Start()
		case "journal":
			if st.Journal, err = journal.New(JournalOptions(c, nc, log.Named("journal"))); err != nil {
				return st, err
			}
			err = st.Journal.Start()
		default:
			err = fmt.Errorf("stack: no in-process builder for service %q", spec.Name)
		}
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

// Connect opens an authenticated connection to the stack's NATS server as
// role; the stack closes it at Shutdown.
func (st *Stack) Connect(role control.Role, log hclog.Logger) (*nats.Conn, error) {
	var nc *nats.Conn
	var err error
	if st.noCreds {
		nc, err = control.Connect(st.url, role.ServiceName(), log.Named("nats"))
	} else {
		nc, err = ConnectWith(st.Creds, st.Config, st.url, role, log)
	}
	if err == nil {
		st.conns = append(st.conns, nc)
	}
	return nc, err
}

// Dial connects a client to the stack.
func (st *Stack) Dial(ctx context.Context) (*client.FS, error) {
	return client.Dial(ctx, client.Options{
		MetadataSocket: st.Config.Metadata.Socket,
		IOSocket:       st.Config.IO.Socket,
		Mode:           waitMode(st.Config),
	})
}

// Shutdown stops the services in the registry's stop order (metadata
// first: it revokes its grants at the IO service and records the sizes
// reported back), then NATS.
func (st *Stack) Shutdown(ctx context.Context) error {
	var errs []error
	for _, spec := range StopOrder(st.Config) {
		switch {
		case spec.Name == "journal" && st.Journal != nil:
			errs = append(errs, st.Journal.Shutdown(ctx))
		case spec.Name == "metadata" && st.Metadata != nil:
			errs = append(errs, st.Metadata.Shutdown(ctx))
		case spec.Name == "io" && st.IO != nil:
			errs = append(errs, st.IO.Shutdown(ctx))
		}
	}
	for _, nc := range st.conns {
		nc.Close()
	}
	if st.NATS != nil {
		st.NATS.Shutdown()
	}
	return errors.Join(errs...)
}

// LocalConfig is the default configuration with its data in dataDir and,
// when runDir is not empty, its sockets in runDir (Unix socket paths are
// limited to 108 bytes, which a deep test directory can exceed).
func LocalConfig(dataDir, runDir string) (*config.Config, error) {
	c := config.Default()
	fs := flag.NewFlagSet("weir", flag.ContinueOnError)
	config.AddFlags(fs)
	args := []string{"--" + config.FlagData, dataDir}
	if runDir != "" {
		args = append(args, "--"+config.FlagRunDir, runDir)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := c.ApplyFlags(fs); err != nil {
		return nil, err
	}
	return c, c.Validate()
}

// namedGroups turns the configuration's named trust groups into the
// metadata service's uid -> group map (validated: each uid in one).
func namedGroups(g map[string][]int) map[uint32]string {
	if len(g) == 0 {
		return nil
	}
	m := map[uint32]string{}
	for name, uids := range g {
		for _, u := range uids {
			m[uint32(u)] = name
		}
	}
	return m
}

// minTenure is metadata.Options.MinTenure for lease_min_tenure (whose 0
// means none, which the option says with a negative value).
func minTenure(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
