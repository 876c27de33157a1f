package config

import (
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/weir-storage/weir/internal/control"
)

// Ring limits, as enforced by ring.NewGeometry (TestRingLimitsMatch keeps
// them in step): the CQ gets 2*SQEntries slots and holds at most 65536; the
// arena is rounded up to max(BlockSize, 4 KiB) and its offsets are 32-bit.
const (
	MaxSQEntries = 1 << 15
	MinBlockSize = 64 * B
	MaxBlockSize = 1 * MiB
	MaxArenaSize = 4 * GiB // exclusive

	ringPage = 4 * KiB
	// maxSocketPath is the longest path a Unix socket address holds
	// (sun_path is 108 bytes including the NUL).
	maxSocketPath = 107
)

// Validate checks every setting and reports all problems at once as an
// *Error. Load and ApplyFlags call it; code that builds a Config by hand
// should too.
// journalMaxIntervalMs bounds journal.interval: the longest wait the
// journal's session lets io take (journalproto.MaxWaitMs).
const journalMaxIntervalMs = 1000

func (c *Config) Validate() error {
	return errorOf(c.validate(nil))
}

// validate checks c; where maps a setting's name to the range of the
// attribute that set it, if a file did.
func (c *Config) validate(where map[string]*hcl.Range) hcl.Diagnostics {
	var diags hcl.Diagnostics
	// at returns the range of the first of names that a file set.
	at := func(names ...string) *hcl.Range {
		for _, n := range names {
			if r := where[n]; r != nil {
				return r
			}
		}
		return nil
	}
	bad := func(r *hcl.Range, name, format string, args ...any) {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  name + ": " + fmt.Sprintf(format, args...),
			Subject:  r,
		})
	}
	enum := func(name, v string, allowed []string) {
		if !slices.Contains(allowed, v) {
			bad(at(name), name, "%q is not one of %s", v, strings.Join(allowed, ", "))
		}
	}
	absPath := func(r *hcl.Range, name, p string) bool {
		if !filepath.IsAbs(p) {
			bad(r, name, "%q: want an absolute path", p)
			return false
		}
		return true
	}
	socket := func(name, p string, from ...string) {
		r := at(from...)
		if absPath(r, name, p) && len(p) > maxSocketPath {
			bad(r, name, "%q is %d bytes long; a Unix socket path holds at most %d", p, len(p), maxSocketPath)
		}
	}

	absPath(at("data_dir"), "data_dir", c.DataDir)
	absPath(at("run_dir", "data_dir"), "run_dir", c.RunDir)
	enum("log_level", c.LogLevel, LogLevels)
	enum("log_format", c.LogFormat, LogFormats)

	if err := checkNATSURL(c.NATS.URL); err != nil {
		bad(at("nats.url"), "nats.url", "%v", err)
	}
	if err := checkListen(c.NATS.Listen); err != nil {
		bad(at("nats.listen"), "nats.listen", "%v", err)
	}
	if c.NATS.ConnectTimeout <= 0 {
		bad(at("nats.connect_timeout"), "nats.connect_timeout", "%v: must be positive", c.NATS.ConnectTimeout)
	}
	if c.NATS.RequestTimeout <= 0 {
		bad(at("nats.request_timeout"), "nats.request_timeout", "%v: must be positive", c.NATS.RequestTimeout)
	}
	if err := control.CheckNamespace(c.NATS.Namespace); err != nil {
		bad(at("nats.namespace"), "nats.namespace", "%v", err)
	}

	absPath(at("nats.creds_dir", "data_dir"), "nats.creds_dir", c.NATS.CredsDir)
	socket("metadata.socket", c.Metadata.Socket, "metadata.socket", "run_dir", "data_dir")
	socket("metadata.service_socket", c.Metadata.ServiceSocket, "metadata.service_socket", "run_dir", "data_dir")
	if c.Metadata.ServiceSocket == c.Metadata.Socket {
		bad(at("metadata.service_socket", "metadata.socket"), "metadata.service_socket", "%q is also metadata.socket", c.Metadata.ServiceSocket)
	}
	if within(c.RunDir, c.DataDir) {
		bad(at("run_dir", "data_dir"), "run_dir", "%q is inside data_dir %q, which only the service user may enter (0700): clients could not reach its sockets", c.RunDir, c.DataDir)
	}
	if c.Metadata.SyncInterval <= 0 {
		bad(at("metadata.sync_interval"), "metadata.sync_interval", "%v: must be positive", c.Metadata.SyncInterval)
	}
	if c.Metadata.ReclaimGrace <= 0 {
		bad(at("metadata.reclaim_grace"), "metadata.reclaim_grace", "%v: must be positive", c.Metadata.ReclaimGrace)
	}
	if c.Metadata.LeaseMinTenure < 0 || c.Metadata.LeaseMinTenure > time.Second {
		bad(at("metadata.lease_min_tenure"), "metadata.lease_min_tenure", "%v: want 0 (none) to 1s", c.Metadata.LeaseMinTenure)
	}
	switch c.Metadata.TrustGroups {
	case "uid", "process", "session":
	default:
		bad(at("metadata.trust_groups"), "metadata.trust_groups", "%q: want \"uid\", \"process\" or \"session\"", c.Metadata.TrustGroups)
	}
	inGroup := map[int]string{}
	for _, name := range slices.Sorted(maps.Keys(c.Metadata.NamedGroups)) {
		if !validToken(name) {
			bad(at("metadata.named_trust_groups"), "metadata.named_trust_groups", "group %q: a name is letters, digits, '-' and '_'", name)
		}
		for _, uid := range c.Metadata.NamedGroups[name] {
			if uid < 0 || uid > math.MaxUint32-1 {
				bad(at("metadata.named_trust_groups"), "metadata.named_trust_groups", "group %q: uid %d is not a uid", name, uid)
			} else if other, ok := inGroup[uid]; ok {
				bad(at("metadata.named_trust_groups"), "metadata.named_trust_groups", "uid %d is in groups %q and %q: a uid is in one at most", uid, other, name)
			}
			inGroup[uid] = name
		}
	}
	if c.Metadata.CheckpointEvery < 1 {
		bad(at("metadata.checkpoint_every"), "metadata.checkpoint_every", "%d: must be at least 1", c.Metadata.CheckpointEvery)
	}

	socket("io.socket", c.IO.Socket, "io.socket", "run_dir", "data_dir")
	if c.IO.Socket == c.Metadata.Socket || c.IO.Socket == c.Metadata.ServiceSocket {
		bad(at("io.socket", "metadata.socket"), "io.socket", "%q is also metadata.socket", c.IO.Socket)
	}
	enum("io.backend", c.IO.Backend, Backends)
	if c.IO.Backend == "spdk" && (c.IO.SPDKConfig == "" || c.IO.SPDKBdev == "") {
		bad(at("io.backend"), "io.backend", `"spdk" needs io.spdk_config and io.spdk_bdev`)
	}
	if cs := c.IO.SPDKClusterSize; cs != 0 && (cs < 64*KiB || !isPow2(uint64(cs))) {
		bad(at("io.spdk_cluster_size"), "io.spdk_cluster_size", "%s: want 0 or a power of two of at least 64KiB", cs)
	}
	if c.IO.CacheSize%(4*KiB) != 0 {
		bad(at("io.cache_size"), "io.cache_size", "%s: want a multiple of 4KiB (0 turns the cache off)", c.IO.CacheSize)
	}
	if ss := c.IO.StagingSize; ss != 0 && (ss%(4*KiB) != 0 || ss < MinStagingSize || ss > 1<<40) {
		bad(at("io.staging_size"), "io.staging_size", "%s: want a multiple of 4KiB from %s to 1TiB (0 turns the staging log off)", ss, Size(MinStagingSize))
	}
	socket("journal.socket", c.Journal.Socket, "journal.socket", "run_dir", "data_dir")
	if slices.Contains([]string{c.IO.Socket, c.Metadata.Socket, c.Metadata.ServiceSocket}, c.Journal.Socket) {
		bad(at("journal.socket"), "journal.socket", "%q is also another socket of the stack", c.Journal.Socket)
	}
	if c.Journal.Interval < time.Millisecond || c.Journal.Interval > time.Duration(journalMaxIntervalMs)*time.Millisecond {
		bad(at("journal.interval"), "journal.interval", "%v: want 1ms to %ds", c.Journal.Interval, journalMaxIntervalMs/1000)
	}
	if c.Journal.Foreground && (!c.Journal.Enabled || c.IO.StagingSize == 0) {
		bad(at("journal.foreground"), "journal.foreground", "needs the journal service and the staging log (journal.enabled, io.staging_size)")
	}
	if n := c.IO.Descriptors; n < 64 || n > 1<<20 {
		bad(at("io.descriptors"), "io.descriptors", "%d: want 64 to 1048576", n)
	}
	if ra := c.IO.Readahead; ra%(4*KiB) != 0 || ra > MaxReadahead {
		bad(at("io.readahead"), "io.readahead", "%s: want a multiple of 4KiB up to %s (0 turns readahead off)", ra, Size(MaxReadahead))
	}
	if c.IO.SPDKWorkers < 1 || c.IO.SPDKWorkers > 64 {
		bad(at("io.spdk_workers"), "io.spdk_workers", "%d: want 1 to 64", c.IO.SPDKWorkers)
	}
	if c.IO.SPDKMemMB < 0 {
		bad(at("io.spdk_mem_mb"), "io.spdk_mem_mb", "%d: must not be negative", c.IO.SPDKMemMB)
	}
	enum("io.direct", c.IO.Direct, DirectIO)
	enum("io.wait_mode", c.IO.WaitMode, WaitModes)

	lim := c.Limits
	for _, uid := range lim.ExemptUIDs {
		if uid < 0 || uid > math.MaxUint32-1 {
			bad(at("limits.exempt_uids"), "limits.exempt_uids", "%d is not a uid", uid)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"limits.handshakes_per_uid", lim.HandshakesPerUID}, {"limits.handshakes", lim.Handshakes},
		{"limits.sessions_per_uid", lim.SessionsPerUID}, {"limits.sessions", lim.Sessions},
	} {
		if n.v < 0 {
			bad(at(n.name), n.name, "%d: want 0 (no bound) or more", n.v)
		}
	}
	if lim.HandshakeTimeout < 100*time.Millisecond || lim.HandshakeTimeout > time.Minute {
		bad(at("limits.handshake_timeout"), "limits.handshake_timeout", "%v: want 100ms to 1m", lim.HandshakeTimeout)
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"limits.pins_share", lim.PinsShare}, {"limits.staging_share", lim.StagingShare},
		{"limits.leases_share", lim.LeasesShare}, {"limits.descriptors_share", lim.DescriptorsShare},
	} {
		if n.v < 1 || n.v > 100 {
			bad(at(n.name), n.name, "%d: want a percentage from 1 to 100", n.v)
		}
	}

	r := c.Ring
	if r.SQEntries < 2 || r.SQEntries > MaxSQEntries || !isPow2(uint64(r.SQEntries)) {
		bad(at("ring.sq_entries"), "ring.sq_entries", "%d: want a power of two from 2 to %d", r.SQEntries, MaxSQEntries)
	}
	blockOK := r.BlockSize >= MinBlockSize && r.BlockSize <= MaxBlockSize && isPow2(uint64(r.BlockSize))
	if !blockOK {
		bad(at("ring.block_size"), "ring.block_size", "%v: want a power of two from %v to %v", r.BlockSize, MinBlockSize, MaxBlockSize)
	}
	arenaAt := at("ring.arena_size", "ring.block_size")
	switch rounded := alignUp(r.ArenaSize, max(r.BlockSize, ringPage)); {
	case r.ArenaSize >= MaxArenaSize || rounded >= MaxArenaSize || rounded < r.ArenaSize:
		bad(arenaAt, "ring.arena_size", "%v: must be below %v (arena offsets are 32-bit)", r.ArenaSize, MaxArenaSize)
	case blockOK && r.ArenaSize < 2*r.BlockSize:
		// A request's buffer leaves one block for its segment table.
		bad(arenaAt, "ring.arena_size", "%v: must hold at least two blocks of %v", r.ArenaSize, r.BlockSize)
	}
	return diags
}

// within reports whether path is dir or inside it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && (rel == "." || !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && rel != "..")
}

func isPow2(v uint64) bool { return v != 0 && v&(v-1) == 0 }

func alignUp(v, a Size) Size {
	if !isPow2(uint64(a)) {
		return v
	}
	return (v + a - 1) &^ (a - 1)
}

// checkNATSURL accepts "" or a comma-separated list of nats.go server URLs.
func checkNATSURL(s string) error {
	if s == "" {
		return nil
	}
	for u := range strings.SplitSeq(s, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			return fmt.Errorf("%q: empty entry in the URL list", s)
		}
		if !strings.Contains(u, "://") {
			u = "nats://" + u // nats.go's own default
		}
		p, err := url.Parse(u)
		if err != nil {
			return fmt.Errorf("%q: %v", s, err)
		}
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("%q: scheme %q is not nats, tls, ws or wss", s, p.Scheme)
		}
		if p.Host == "" {
			return fmt.Errorf("%q: no host", s)
		}
	}
	return nil
}

// checkListen accepts a loopback "host:port" with port -1 or 0 (random)
// up to 65535. The same rule is in control.StartEmbedded.
func checkListen(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q: want host:port", s)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%q: the embedded server listens on loopback only (127.0.0.1, ::1 or localhost); use nats.url for anything else", s)
	}
	if p, err := strconv.Atoi(port); err != nil || p < -1 || p > 65535 {
		return fmt.Errorf("%q: port must be -1 or 0 (random) up to 65535", s)
	}
	return nil
}

// validToken reports whether s is a non-empty run of letters, digits, '-'
// and '_'.
func validToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}
