// Package config is the one configuration of every weir process: weir up,
// the services and the CLI read the same file, the same defaults and the same
// override flags.
//
// # Why HCL
//
// hashicorp/hcl/v2 gives file:line diagnostics for every mistake for free;
// it belongs to the same ecosystem as go-hclog, which weir logs with; it
// allows comments; and its blocks give each service its own section.
//
// # Sources and precedence
//
// Flags > file > defaults. [Default] needs no file at all; [Load] reads a
// file over the defaults; [Config.ApplyFlags] lays the flags defined by
// [AddFlags] over the result. Defaults that derive from another setting
// (run_dir from data_dir, the sockets from run_dir) follow that setting
// wherever it came from, unless they were set themselves.
//
// # Paths
//
// A relative path in a file is relative to the directory holding that file,
// so a configuration means the same thing whatever the working directory of
// the process reading it. A relative --data is relative to the working
// directory, like any command-line path. After loading every path is
// absolute and clean.
//
// # Errors
//
// Load reports every problem of a file at once, as one [*Error] whose text
// has one "file:line: message" line per problem, in file order. Unknown
// attributes and blocks are errors.
//
// See configs/weir.hcl for a commented example with every setting.
package config

import (
	"path/filepath"
	"time"

	"github.com/weir-storage/weir/internal/control"
)

// Config is the configuration of every weir process. A Config from
// [Default] or [Load] is valid; code that builds one by hand should call
// [Config.Validate].
type Config struct {
	DataDir string // data_dir: default "/var/lib/weir", created 0700; `--data DIR` overrides
	// run_dir: the sockets clients connect to, and nats.url. It cannot
	// live in the data directory, which only the service user may enter:
	// the default is "/run/weir" for the default data directory and
	// "<DataDir>.run" beside any other; `--run-dir DIR` overrides.
	RunDir    string
	LogLevel  string   // log_level: trace|debug|info|warn|error, default info
	LogFormat string   // log_format: text|json, default text
	NATS      NATS     // block "nats"
	Metadata  Metadata // block "metadata"
	IO        IO       // block "io"
	Journal   Journal  // block "journal"
	Ring      Ring     // block "ring"
	Limits    Limits   // block "limits"

	// derived records which paths still hold a default computed from
	// another setting, so that an override of that setting moves them too.
	derived derivedPaths
}

type derivedPaths struct {
	runDir, metadataSocket, metadataServiceSocket, ioSocket, credsDir, journalSocket bool
}

// NATS configures the control plane.
type NATS struct {
	URL            string        // url: "" starts an embedded server; else a nats.go URL list
	Listen         string        // listen: embedded server address, loopback only; default "127.0.0.1:-1" (random port)
	ConnectTimeout time.Duration // connect_timeout: default 5s
	// request_timeout: how long a service waits for another's answer to a
	// control request (a grant, a revocation, a size report); default 5s.
	// A service that is gone is noticed at once, without waiting for it.
	RequestTimeout time.Duration
	// namespace: starts every NATS subject and names the micro services'
	// group of this stack, so that stacks sharing a NATS server stay
	// apart; default "weir". Tokens of letters, digits, '-' and '_',
	// separated by dots; at most 64 bytes.
	Namespace string
	// creds_dir: the stack's NATS credentials (one nkey seed per role,
	// 0600, in a 0700 directory); created with the keys on first start
	// when missing. Default "<DataDir>/creds".
	CredsDir string
}

// Metadata configures the metadata service.
type Metadata struct {
	Socket string // socket: default "<RunDir>/metadata.sock"
	// service_socket: where the stack's other services open their
	// sessions with the metadata service (0600, the service user only);
	// default "<RunDir>/metadata.svc.sock".
	ServiceSocket   string
	SyncEveryOp     bool          // sync_every_op: fsync the WAL before every reply; default false (group commit)
	SyncInterval    time.Duration // sync_interval: group-commit interval; default 5ms
	CheckpointEvery int           // checkpoint_every: WAL records between checkpoints; default 10000
	// reclaim_grace: after a start, how long files that were unlinked
	// while open stay for their holders to reopen; default 30s.
	ReclaimGrace time.Duration
	// trust_groups: which sessions share leases without checks: "uid"
	// (default: the processes of one user), "process" (strict) or
	// "session" (every client session alone).
	TrustGroups string
	// named_trust_groups: group name -> uids whose processes form that
	// one trust group, whatever trust_groups says.
	NamedGroups map[string][]int
	// lease_min_tenure: how long a protected grant (its holder's last
	// one was recalled before it served a request) is safe from another
	// trust group's recall, so that two groups cannot take a file from
	// each other forever with nothing served; 0 for none; default 250µs,
	// at most 1s.
	LeaseMinTenure time.Duration
}

// IO configures the IO service.
type IO struct {
	Socket  string // socket: default "<RunDir>/io.sock"
	Backend string // backend: file|mem, default file
	Direct  string // direct: O_DIRECT for the file backend, auto|on|off; default auto
	// SPDK backend (backend = "spdk", in a weir built with the spdk tag):
	SPDKConfig string // spdk_config: SPDK JSON configuration that creates the bdev; required for spdk
	SPDKBdev   string // spdk_bdev: the bdev that holds the blobstore; required for spdk
	SPDKNoHuge bool   // spdk_no_huge: run SPDK without huge pages (tests; no DMA to real devices)
	SPDKMemMB  int    // spdk_mem_mb: SPDK memory in MiB; 0 = SPDK's default
	// spdk_workers: I/O workers, each a polling OS thread with its own
	// SPDK thread and I/O channel (1 to 64). One keeps many I/Os in flight.
	SPDKWorkers int
	// spdk_cluster_size: blob allocation unit of a new blobstore (a power
	// of two, at least 64KiB); 0 = SPDK's default (1MiB). An existing
	// blobstore keeps the size it was made with.
	SPDKClusterSize Size
	WaitMode        string // wait_mode: adaptive|busy-poll, default adaptive
	// cache_size: the page cache in shared memory (docs/cache-abi.md):
	// the most file pages io keeps resident across all open files; 0
	// turns the cache off (every read and write goes to the device).
	// Default 1GiB.
	CacheSize Size
	// readahead: the largest window a sequential reader's misses fill
	// ahead of what it asked; 0 turns readahead off. Default 512KiB.
	Readahead Size
	// descriptors: the descriptors io keeps for files nobody has open
	// (idle cache regions, two each, and idle blob files), given back
	// least recently used first; at most a quarter of io's RLIMIT_NOFILE.
	// Default 1536.
	Descriptors int
	// staging_size: the ring of the staging log fsync writes to (Split
	// Journaling, docs/journal-format.md), made at the first start of a
	// store (an existing log keeps its size); 0 turns it off: fsync then
	// syncs the file, the store and the metadata WAL in the foreground.
	// Default 64MiB.
	StagingSize Size
}

// Journal configures the journal service, which checkpoints the staging
// log (Split Journaling).
type Journal struct {
	// enabled: run the journal service (weir up starts it); false makes
	// the IO service checkpoint its staging log itself. Default true.
	Enabled bool
	// socket: the IO service's service socket the journal service opens
	// its session on (0600, the service user only); default
	// "<RunDir>/io.journal.sock".
	Socket string
	// interval: how long the journal service waits between passes when
	// nothing asks for one (an fsync waiting for room asks at once);
	// default 200ms.
	Interval time.Duration
	// foreground: every fsync waits until its record is checkpointed
	// (the benchmark's ablation "no background journaling"); default
	// false.
	Foreground bool
}

// Limits bound what the clients of one uid may take of the services, so
// that no local user can take the stack from the others
// (docs/architecture.md, "Limits per uid"). Counts of 0 are no bound; a
// share is a percentage (100: no bound but the service's own).
type Limits struct {
	// exempt_uids: uids no limit applies to; the services' own uid always
	// is. Default [0]: root can stop the services anyway.
	ExemptUIDs []int
	// handshakes_per_uid, handshakes: handshakes in progress (accepted,
	// not yet acked) of one uid and of all, per service socket; past
	// either a connection is refused with EAGAIN. Defaults 8 and 64.
	HandshakesPerUID, Handshakes int
	// handshake_timeout: a connection that has not completed the ring's
	// handshake by then is dropped. Default 2s; 100ms to 1m.
	HandshakeTimeout time.Duration
	// sessions_per_uid, sessions: ring sessions (one per client process
	// and service) of one uid and of all, per service; past either a
	// connection is refused with EUSERS. Defaults 256 and 4096.
	SessionsPerUID, Sessions int
	// pins_share: the part of io's pinned pages (MAP_SHARED mappings
	// and write windows: half the cache, windows a quarter) one uid's
	// sessions may hold. Default 50.
	PinsShare int
	// staging_share: the part of the staging log one uid's fsyncs may
	// hold in live records; past it its fsyncs write the file home
	// instead. Default 50.
	StagingShare int
	// leases_share: the part of the metadata service's kept read leases
	// (4096) one uid's sessions may keep; past it its own least recently
	// used go. Default 25.
	LeasesShare int
	// descriptors_share: the part of io's descriptors (RLIMIT_NOFILE, at
	// three per open file) the grants of one uid's sessions may hold;
	// past it a grant is refused with EMFILE. Default 25.
	DescriptorsShare int
}

// Ring sizes the shared-memory rings a service creates for each session.
type Ring struct {
	SQEntries int  // sq_entries: power of two in [2, 32768]; default 256 (the CQ gets twice as many)
	ArenaSize Size // arena_size: default 8MiB; at least two blocks, below 4 GiB
	BlockSize Size // block_size: power of two in [64 B, 1 MiB]; default 4KiB
}

// Default values. Paths derived from DataDir are not listed: see [Default].
const (
	DefaultDataDir         = "/var/lib/weir"
	DefaultLogLevel        = "info"
	DefaultLogFormat       = "text"
	DefaultNATSListen      = "127.0.0.1:-1"
	DefaultConnectTimeout  = 5 * time.Second
	DefaultRequestTimeout  = 5 * time.Second
	DefaultNATSNamespace   = control.DefaultNamespace
	DefaultSyncInterval    = 5 * time.Millisecond
	DefaultCheckpointEvery = 10000
	DefaultReclaimGrace    = 30 * time.Second
	DefaultLeaseMinTenure  = 250 * time.Microsecond
	DefaultBackend         = "file"
	DefaultDirect          = "auto"
	DefaultWaitMode        = "adaptive"
	DefaultSQEntries       = 256
	DefaultArenaSize       = 8 * MiB
	DefaultBlockSize       = 4 * KiB
	DefaultCacheSize       = 1 * GiB
	DefaultReadahead       = 512 * KiB
	// DefaultDescriptors is io.descriptors' default (iosvc's too).
	DefaultDescriptors = 1536
	DefaultStagingSize = 64 * MiB
	// DefaultJournalInterval is journal.interval's default.
	DefaultJournalInterval = 200 * time.Millisecond
	// MinStagingSize is the smallest staging ring (io.staging_size).
	MinStagingSize = 1 * MiB
	// MaxReadahead bounds io.readahead.
	MaxReadahead = 64 * MiB

	// The limits block's defaults.
	DefaultHandshakesPerUID = 8
	DefaultHandshakes       = 64
	DefaultHandshakeTimeout = 2 * time.Second
	DefaultSessionsPerUID   = 256
	DefaultSessions         = 4096
	DefaultPinsShare        = 50
	DefaultStagingShare     = 50
	DefaultLeasesShare      = 25
	DefaultDescriptorsShare = 25
)

// Allowed values of the enumerated settings, in the order error messages
// list them.
var (
	LogLevels  = []string{"trace", "debug", "info", "warn", "error"}
	LogFormats = []string{"text", "json"}
	Backends   = []string{"file", "mem", "spdk"}
	DirectIO   = []string{"auto", "on", "off"}
	WaitModes  = []string{"adaptive", "busy-poll"}
)

// Default returns the configuration used when there is no file: data in
// /var/lib/weir, sockets in /var/lib/weir/run, an embedded NATS server on a
// random loopback port.
func Default() *Config {
	c := &Config{
		DataDir:   DefaultDataDir,
		LogLevel:  DefaultLogLevel,
		LogFormat: DefaultLogFormat,
		NATS: NATS{
			Listen:         DefaultNATSListen,
			ConnectTimeout: DefaultConnectTimeout,
			RequestTimeout: DefaultRequestTimeout,
			Namespace:      DefaultNATSNamespace,
		},
		Metadata: Metadata{
			SyncInterval:    DefaultSyncInterval,
			CheckpointEvery: DefaultCheckpointEvery,
			ReclaimGrace:    DefaultReclaimGrace,
			TrustGroups:     "uid",
			LeaseMinTenure:  DefaultLeaseMinTenure,
		},
		IO: IO{
			Backend:     DefaultBackend,
			Direct:      DefaultDirect,
			WaitMode:    DefaultWaitMode,
			SPDKWorkers: 1,
			CacheSize:   DefaultCacheSize,
			StagingSize: DefaultStagingSize,
			Readahead:   DefaultReadahead,
			Descriptors: DefaultDescriptors,
		},
		Journal: Journal{Enabled: true, Interval: DefaultJournalInterval},
		Limits: Limits{
			ExemptUIDs:       []int{0},
			HandshakesPerUID: DefaultHandshakesPerUID,
			Handshakes:       DefaultHandshakes,
			HandshakeTimeout: DefaultHandshakeTimeout,
			SessionsPerUID:   DefaultSessionsPerUID,
			Sessions:         DefaultSessions,
			PinsShare:        DefaultPinsShare,
			StagingShare:     DefaultStagingShare,
			LeasesShare:      DefaultLeasesShare,
			DescriptorsShare: DefaultDescriptorsShare,
		},
		Ring: Ring{
			SQEntries: DefaultSQEntries,
			ArenaSize: DefaultArenaSize,
			BlockSize: DefaultBlockSize,
		},
		derived: derivedPaths{runDir: true, metadataSocket: true, metadataServiceSocket: true, ioSocket: true, credsDir: true, journalSocket: true},
	}
	c.derivePaths()
	return c
}

// DefaultRunDir is the run directory of the default data directory.
const DefaultRunDir = "/run/weir"

// RunDirFor is the run directory derived from a data directory:
// DefaultRunDir for DefaultDataDir, "<dataDir>.run" for any other. It lies
// outside the data directory, which is 0700.
func RunDirFor(dataDir string) string {
	if filepath.Clean(dataDir) == DefaultDataDir {
		return DefaultRunDir
	}
	return filepath.Clean(dataDir) + ".run"
}

// derivePaths recomputes every path that still holds a derived default.
func (c *Config) derivePaths() {
	if c.derived.runDir {
		c.RunDir = RunDirFor(c.DataDir)
	}
	if c.derived.metadataSocket {
		c.Metadata.Socket = filepath.Join(c.RunDir, "metadata.sock")
	}
	if c.derived.metadataServiceSocket {
		c.Metadata.ServiceSocket = filepath.Join(c.RunDir, "metadata.svc.sock")
	}
	if c.derived.credsDir {
		c.NATS.CredsDir = filepath.Join(c.DataDir, "creds")
	}
	if c.derived.ioSocket {
		c.IO.Socket = filepath.Join(c.RunDir, "io.sock")
	}
	if c.derived.journalSocket {
		c.Journal.Socket = filepath.Join(c.RunDir, "io.journal.sock")
	}
}
