package config

import (
	"bytes"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/weir-storage/weir/ring"
)

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefault(t *testing.T) {
	c := Default()
	want := &Config{
		DataDir:   "/var/lib/weir",
		RunDir:    "/run/weir",
		LogLevel:  "info",
		LogFormat: "text",
		NATS: NATS{URL: "", Listen: "127.0.0.1:-1", ConnectTimeout: 5 * time.Second, RequestTimeout: 5 * time.Second,
			Namespace: "weir", CredsDir: "/var/lib/weir/creds"},
		Metadata: Metadata{
			Socket: "/run/weir/metadata.sock", ServiceSocket: "/run/weir/metadata.svc.sock", SyncEveryOp: false,
			SyncInterval: 5 * time.Millisecond, CheckpointEvery: 10000, ReclaimGrace: 30 * time.Second,
			TrustGroups: "uid", LeaseMinTenure: 250 * time.Microsecond,
		},
		IO: IO{
			Socket: "/run/weir/io.sock", Backend: "file", Direct: "auto",
			WaitMode: "adaptive", SPDKWorkers: 1, CacheSize: DefaultCacheSize, Readahead: DefaultReadahead, StagingSize: DefaultStagingSize,
			Descriptors: DefaultDescriptors,
		},
		Journal: Journal{Enabled: true, Socket: "/run/weir/io.journal.sock", Interval: 200 * time.Millisecond},
		Ring:    Ring{SQEntries: 256, ArenaSize: 8 << 20, BlockSize: 4096},
		Limits: Limits{ExemptUIDs: []int{0}, HandshakesPerUID: 8, Handshakes: 64, HandshakeTimeout: 2 * time.Second,
			SessionsPerUID: 256, Sessions: 4096, PinsShare: 50, StagingShare: 50, LeasesShare: 25, DescriptorsShare: 25},
		derived: derivedPaths{runDir: true, metadataSocket: true, metadataServiceSocket: true, ioSocket: true, credsDir: true, journalSocket: true},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Default() =\n%+v\nwant\n%+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
	got, err := Load("")
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Errorf(`Load("") = %+v, %v; want Default()`, got, err)
	}
}

func TestLoadFull(t *testing.T) {
	p := writeFile(t, "full.hcl", `
data_dir   = "data"          # relative: next to this file
run_dir    = "/run/weir"
log_level  = "debug"
log_format = "json"
nats {
  url             = "nats://10.0.0.5:4222, nats://10.0.0.6:4222"
  listen          = "[::1]:0"
  connect_timeout = "1m30s"
  request_timeout = "750ms"
  namespace       = "prod.stack-b"
  creds_dir       = "/etc/weir/creds"
}
metadata {
  socket           = "/run/weir/m.sock"
  service_socket   = "svc.sock"
  sync_every_op    = true
  sync_interval    = "250us"
  checkpoint_every = 500
  reclaim_grace    = "2m"
  lease_min_tenure = "2ms"
  trust_groups     = "process"
  named_trust_groups = { builders = [1000, 1001], web = [33] }
}
io {
  socket    = "io.sock"
  backend   = "mem"
  direct    = "off"
  wait_mode = "busy-poll"
  cache_size = "64MiB"
  readahead  = 0
  descriptors = 300
  staging_size = "8MiB"
}
journal {
  enabled    = true
  socket     = "j.sock"
  interval   = "50ms"
  foreground = true
}
ring {
  sq_entries = 1024
  arena_size = 67108864
  block_size = "64KiB"
}
limits {
  exempt_uids        = [0, 33]
  handshakes_per_uid = 2
  handshakes         = 0
  handshake_timeout  = "500ms"
  sessions_per_uid   = 16
  sessions           = 100
  pins_share         = 10
  staging_share      = 20
  leases_share       = 30
  descriptors_share  = 100
}
`)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(p)
	want := &Config{
		DataDir:   filepath.Join(dir, "data"),
		RunDir:    "/run/weir",
		LogLevel:  "debug",
		LogFormat: "json",
		NATS: NATS{
			URL: "nats://10.0.0.5:4222, nats://10.0.0.6:4222", Listen: "[::1]:0",
			ConnectTimeout: 90 * time.Second, RequestTimeout: 750 * time.Millisecond, Namespace: "prod.stack-b", CredsDir: "/etc/weir/creds",
		},
		Metadata: Metadata{
			Socket: "/run/weir/m.sock", ServiceSocket: filepath.Join(dir, "svc.sock"), SyncEveryOp: true,
			SyncInterval: 250 * time.Microsecond, CheckpointEvery: 500, ReclaimGrace: 2 * time.Minute,
			TrustGroups: "process", NamedGroups: map[string][]int{"builders": {1000, 1001}, "web": {33}},
			LeaseMinTenure: 2 * time.Millisecond,
		},
		IO: IO{
			Socket: filepath.Join(dir, "io.sock"), Backend: "mem", Direct: "off",
			WaitMode: "busy-poll", SPDKWorkers: 1, CacheSize: 64 * MiB, StagingSize: 8 * MiB, Descriptors: 300,
		},
		Journal: Journal{Enabled: true, Socket: filepath.Join(dir, "j.sock"), Interval: 50 * time.Millisecond, Foreground: true},
		Ring:    Ring{SQEntries: 1024, ArenaSize: 64 * MiB, BlockSize: 64 * KiB},
		Limits: Limits{ExemptUIDs: []int{0, 33}, HandshakesPerUID: 2, Handshakes: 0, HandshakeTimeout: 500 * time.Millisecond,
			SessionsPerUID: 16, Sessions: 100, PinsShare: 10, StagingShare: 20, LeasesShare: 30, DescriptorsShare: 100},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load =\n%+v\nwant\n%+v", c, want)
	}
}

func TestLoadDerivedPaths(t *testing.T) {
	p := writeFile(t, "d.hcl", "data_dir = \"/srv/weir\"\nio {\n  socket = \"/tmp/io.sock\"\n}\n")
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.RunDir != "/srv/weir.run" || c.Metadata.Socket != "/srv/weir.run/metadata.sock" || c.IO.Socket != "/tmp/io.sock" ||
		c.Metadata.ServiceSocket != "/srv/weir.run/metadata.svc.sock" || c.NATS.CredsDir != "/srv/weir/creds" {
		t.Errorf("derived paths: run %q, metadata %q (%q), io %q, creds %q", c.RunDir, c.Metadata.Socket,
			c.Metadata.ServiceSocket, c.IO.Socket, c.NATS.CredsDir)
	}
	// The run directory may not be inside the data directory, which is
	// 0700: clients could not reach their sockets.
	p = writeFile(t, "in.hcl", "data_dir = \"/srv/weir\"\nrun_dir = \"/srv/weir/run\"\n")
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "inside data_dir") {
		t.Errorf("run_dir inside data_dir: %v", err)
	}
}

// TestLoadReportsEveryError: four different kinds of mistake, each on its
// own line, come back as one error with one file:line entry per mistake.
func TestLoadReportsEveryError(t *testing.T) {
	p := writeFile(t, "bad.hcl", `# line 1
log_level = "verbose"
nats {
  connect_timeout = "5 seconds"
}
io {
  backend = "file"
  compress = true
}
ring {
  sq_entries = 100
}
`)
	_, err := Load(p)
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("Load = %v, want *Error", err)
	}
	lines := strings.Split(err.Error(), "\n")
	want := []struct{ line, text string }{
		{"2", `log_level: "verbose" is not one of trace, debug, info, warn, error`},
		{"4", `nats.connect_timeout: want a duration`},
		{"8", `Unsupported argument`},
		{"11", `ring.sq_entries: 100: want a power of two`},
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		prefix := p + ":" + w.line + ": "
		if !strings.HasPrefix(lines[i], prefix) || !strings.Contains(lines[i], w.text) {
			t.Errorf("problem %d = %q\nwant prefix %q and %q", i, lines[i], prefix, w.text)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"syntax", "log_level = \n", "bad.hcl:1:"},
		{"unknown block", "disk {\n}\n", `bad.hcl:1: Unsupported block type`},
		{"duplicate block", "io {\n}\nio {\n}\n", `bad.hcl:3: Duplicate io block`},
		{"wrong type", "metadata {\n  checkpoint_every = \"many\"\n}\n", `bad.hcl:2: metadata.checkpoint_every: want a whole number, got "many"`},
		{"fraction", "metadata {\n  checkpoint_every = 1.5\n}\n", `bad.hcl:2: metadata.checkpoint_every: want a whole number, got 1.5`},
		{"zero checkpoint_every", "metadata {\n  checkpoint_every = 0\n}\n", `bad.hcl:2: metadata.checkpoint_every: 0: must be at least 1`},
		{"bool", "metadata {\n  sync_every_op = \"maybe\"\n}\n", `bad.hcl:2: metadata.sync_every_op: want true or false`},
		{"duration number", "metadata {\n  sync_interval = 5\n}\n", `bad.hcl:2: metadata.sync_interval: want a duration string`},
		{"negative duration", "metadata {\n  sync_interval = \"-1ms\"\n}\n", `bad.hcl:2: metadata.sync_interval: -1ms: must be positive`},
		{"trust groups", "metadata {\n  trust_groups = \"user\"\n}\n", `bad.hcl:2: metadata.trust_groups: "user": want "uid", "process" or "session"`},
		{"lease min tenure", "metadata {\n  lease_min_tenure = \"2s\"\n}\n", `bad.hcl:2: metadata.lease_min_tenure: 2s: want 0 (none) to 1s`},
		{"uid in two groups", "metadata {\n  named_trust_groups = { a = [7], b = [7] }\n}\n", `bad.hcl:2: metadata.named_trust_groups: uid 7 is in groups "a" and "b"`},
		{"negative uid", "metadata {\n  named_trust_groups = { a = [-1] }\n}\n", `bad.hcl:2: metadata.named_trust_groups: group "a": uid -1 is not a uid`},
		{"group name", "metadata {\n  named_trust_groups = { \"a b\" = [1] }\n}\n", `bad.hcl:2: metadata.named_trust_groups: group "a b": a name is`},
		{"listen not loopback", "nats {\n  listen = \"0.0.0.0:4222\"\n}\n", `bad.hcl:2: nats.listen: "0.0.0.0:4222": the embedded server listens on loopback only`},
		{"bad url", "nats {\n  url = \"http://x\"\n}\n", `bad.hcl:2: nats.url: "http://x": scheme "http"`},
		{"empty namespace", "nats {\n  namespace = \"\"\n}\n", `bad.hcl:2: nats.namespace: must not be empty`},
		{"namespace space", "nats {\n  namespace = \"a b\"\n}\n", `bad.hcl:2: nats.namespace: "a b": ' ' is not allowed`},
		{"namespace star", "nats {\n  url = \"nats://h:4222\"\n  namespace = \"prod.*\"\n}\n", `bad.hcl:3: nats.namespace: "prod.*": '*' is not allowed`},
		{"namespace gt", "nats {\n  namespace = \">\"\n}\n", `bad.hcl:2: nats.namespace: ">": '>' is not allowed`},
		{"namespace dots", "nats {\n  namespace = \"a..b\"\n}\n", `bad.hcl:2: nats.namespace: "a..b" has an empty token`},
		{"namespace long", "nats {\n  namespace = \"" + strings.Repeat("n", 65) + "\"\n}\n", `bad.hcl:2: nats.namespace: "nnn`},
		{"block size", "ring {\n  block_size = \"2MiB\"\n}\n", `bad.hcl:2: ring.block_size: 2MiB: want a power of two from 64B to 1MiB`},
		{"spdk workers", "io {\n  spdk_workers = 0\n}\n", `bad.hcl:2: io.spdk_workers: 0: want 1 to 64`},
		{"arena too big", "ring {\n  arena_size = \"4GiB\"\n}\n", `bad.hcl:2: ring.arena_size: 4GiB: must be below 4GiB`},
		{"arena one block", "ring {\n  block_size = \"1MiB\"\n  arena_size = \"1MiB\"\n}\n", `bad.hcl:3: ring.arena_size: 1MiB: must hold at least two blocks of 1MiB`},
		{"arena unit", "ring {\n  arena_size = \"8MB\"\n}\n", `bad.hcl:2: ring.arena_size: size "8MB": unknown unit "MB"`},
		{"cache unaligned", "io {\n  cache_size = 5000\n}\n", `bad.hcl:2: io.cache_size: 5000B: want a multiple of 4KiB (0 turns the cache off)`},
		{"descriptors too few", "io {\n  descriptors = 10\n}\n", `bad.hcl:2: io.descriptors: 10: want 64 to 1048576`},
		{"readahead too big", "io {\n  readahead = \"1GiB\"\n}\n", `bad.hcl:2: io.readahead: 1GiB: want a multiple of 4KiB up to 64MiB (0 turns readahead off)`},
		{"exempt uid", "limits {\n  exempt_uids = [-2]\n}\n", `bad.hcl:2: limits.exempt_uids: -2 is not a uid`},
		{"exempt not a list", "limits {\n  exempt_uids = \"root\"\n}\n", `bad.hcl:2: limits.exempt_uids: want a list of uids`},
		{"negative sessions", "limits {\n  sessions_per_uid = -1\n}\n", `bad.hcl:2: limits.sessions_per_uid: -1: want 0 (no bound) or more`},
		{"handshake timeout", "limits {\n  handshake_timeout = \"10ms\"\n}\n", `bad.hcl:2: limits.handshake_timeout: 10ms: want 100ms to 1m`},
		{"share zero", "limits {\n  pins_share = 0\n}\n", `bad.hcl:2: limits.pins_share: 0: want a percentage from 1 to 100`},
		{"share past all", "limits {\n  staging_share = 101\n}\n", `bad.hcl:2: limits.staging_share: 101: want a percentage from 1 to 100`},
		{"null", "log_format = null\n", `bad.hcl:1: log_format: must not be null`},
		{"empty path", "data_dir = \"\"\n", `bad.hcl:1: data_dir: must not be empty`},
		{"same sockets", "io {\n  socket = \"/s\"\n}\nmetadata {\n  socket = \"/s\"\n}\n", `bad.hcl:2: io.socket: "/s" is also metadata.socket`},
		{"long socket", "data_dir = \"/" + strings.Repeat("d", 100) + "\"\n", `bad.hcl:1: metadata.socket: "/ddd`},
		{"variables", "log_level = var.x\n", `bad.hcl:1: Variables not allowed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "bad.hcl", tc.text)
			_, err := Load(p)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			got := strings.ReplaceAll(err.Error(), filepath.Dir(p)+string(filepath.Separator), "")
			if !strings.Contains(got, tc.want) {
				t.Errorf("Load error\n%s\nwant it to contain\n%s", got, tc.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.hcl"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing file = %v, want fs.ErrNotExist", err)
	}
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Size
		err  bool
	}{
		{"4096", 4096, false},
		{"0", 0, false},
		{"100B", 100, false},
		{"64KiB", 64 << 10, false},
		{"8MiB", 8 << 20, false},
		{" 8 MiB ", 8 << 20, false},
		{"1GiB", 1 << 30, false},
		{"2TiB", 2 << 40, false},
		{"", 0, true},
		{"MiB", 0, true},
		{"8MB", 0, true},
		{"8mib", 0, true},
		{"1.5MiB", 0, true},
		{"-1", 0, true},
		{"99999999999999999999", 0, true},
		{"16777216TiB", 0, true}, // 2^64
	} {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err == nil {
			if back, err := ParseSize(got.String()); err != nil || back != got {
				t.Errorf("ParseSize(%q.String() = %q) = %d, %v", tc.in, got.String(), back, err)
			}
		}
	}
	if got := (1536 * KiB).String(); got != "1536KiB" {
		t.Errorf("String = %q", got)
	}
	if got := (1 * GiB).String(); got != "1GiB" {
		t.Errorf("String = %q", got)
	}

	// The same sizes and some durations, through a file: number or string.
	p := writeFile(t, "s.hcl", `
metadata {
  sync_interval = "1.5ms"
}
nats {
  connect_timeout = "2m"
}
ring {
  arena_size = 1048576
  block_size = "512 B"
}
`)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Ring.ArenaSize != MiB || c.Ring.BlockSize != 512 {
		t.Errorf("sizes = %v, %v", c.Ring.ArenaSize, c.Ring.BlockSize)
	}
	if c.Metadata.SyncInterval != 1500*time.Microsecond || c.NATS.ConnectTimeout != 2*time.Minute {
		t.Errorf("durations = %v, %v", c.Metadata.SyncInterval, c.NATS.ConnectTimeout)
	}
}

func TestFlagPrecedence(t *testing.T) {
	p := writeFile(t, "f.hcl", `
data_dir  = "/from/file"
log_level = "debug"
log_format = "json"
nats {
  url = "nats://file:4222"
  namespace = "file.ns"
}
io {
  socket = "/fixed/io.sock"
}
`)
	parse := func(args ...string) *Config {
		t.Helper()
		c, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		fs := flag.NewFlagSet("weir", flag.ContinueOnError)
		AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := c.ApplyFlags(fs); err != nil {
			t.Fatal(err)
		}
		return c
	}

	// No flags: the file wins over the defaults.
	c := parse()
	if c.DataDir != "/from/file" || c.LogLevel != "debug" || c.LogFormat != "json" || c.NATS.URL != "nats://file:4222" || c.NATS.Namespace != "file.ns" {
		t.Errorf("no flags: %+v", c)
	}

	// Flags win over the file, even when a flag repeats a default value;
	// derived paths follow --data, paths set in the file stay.
	c = parse("--data", "/from/flag", "--log-level", "info", "--log-format=text", "--nats-url", "", "--nats-namespace", "weir")
	if c.DataDir != "/from/flag" || c.LogLevel != "info" || c.LogFormat != "text" || c.NATS.URL != "" || c.NATS.Namespace != "weir" {
		t.Errorf("flags: %+v", c)
	}
	if c.RunDir != "/from/flag.run" || c.Metadata.Socket != "/from/flag.run/metadata.sock" || c.IO.Socket != "/fixed/io.sock" {
		t.Errorf("paths after --data: run %q, metadata %q, io %q", c.RunDir, c.Metadata.Socket, c.IO.Socket)
	}
	c = parse("--data", "/from/flag", "--run-dir", "/sockets")
	if c.RunDir != "/sockets" || c.Metadata.Socket != "/sockets/metadata.sock" || c.Metadata.ServiceSocket != "/sockets/metadata.svc.sock" {
		t.Errorf("paths after --run-dir: run %q, metadata %q, %q", c.RunDir, c.Metadata.Socket, c.Metadata.ServiceSocket)
	}

	// A relative --data is relative to the working directory.
	c = parse("--data", "rel")
	if wd, _ := os.Getwd(); c.DataDir != filepath.Join(wd, "rel") {
		t.Errorf("--data rel: %q", c.DataDir)
	}

	// Flags are validated like the file.
	c, _ = Load(p)
	fs := flag.NewFlagSet("weir", flag.ContinueOnError)
	AddFlags(fs)
	_ = fs.Parse([]string{"--log-level", "loud"})
	if err := c.ApplyFlags(fs); err == nil || !strings.Contains(err.Error(), `log_level: "loud" is not one of`) {
		t.Errorf("ApplyFlags with a bad level = %v", err)
	}

	// An invalid namespace from the command line is refused as from a file.
	c, _ = Load(p)
	fs = flag.NewFlagSet("weir", flag.ContinueOnError)
	AddFlags(fs)
	_ = fs.Parse([]string{"--nats-namespace", "two words"})
	if err := c.ApplyFlags(fs); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("--nats-namespace \"two words\": %v", err)
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	c := Default()
	c.LogLevel, c.LogFormat = "warn", "json"
	log := c.Logger("weir-test", &buf)
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, `"@message":"shown"`) || !strings.Contains(out, `"@module":"weir-test"`) {
		t.Errorf("json logger wrote %q", out)
	}
	buf.Reset()
	c.LogLevel, c.LogFormat = "debug", "text"
	c.Logger("weir-test", &buf).Debug("plain")
	if out := buf.String(); !strings.Contains(out, "[DEBUG] weir-test: plain") {
		t.Errorf("text logger wrote %q", out)
	}
}

// TestExampleFile: configs/weir.hcl documents the defaults. It equals
// Default() except for nats.listen, which it sets to a fixed port on
// purpose so that other shells can find the embedded server.
func TestExampleFile(t *testing.T) {
	c, err := Load("../../configs/weir.hcl")
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.NATS.Listen = "127.0.0.1:4222"
	if !reflect.DeepEqual(c, want) {
		t.Errorf("configs/weir.hcl =\n%+v\nwant Default() with nats.listen changed:\n%+v", c, want)
	}
}

// TestRingLimitsMatch: what Validate accepts, ring.NewGeometry accepts, at
// the defaults and at every edge.
func TestRingLimitsMatch(t *testing.T) {
	for _, r := range []Ring{
		Default().Ring,
		{SQEntries: 2, ArenaSize: 128, BlockSize: MinBlockSize},
		{SQEntries: MaxSQEntries, ArenaSize: 2 * MaxBlockSize, BlockSize: MaxBlockSize},
		{SQEntries: 256, ArenaSize: MaxArenaSize - MaxBlockSize, BlockSize: MaxBlockSize},
		{SQEntries: 256, ArenaSize: MaxArenaSize - ringPage, BlockSize: 64},
	} {
		c := Default()
		c.Ring = r
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: Validate = %v", r, err)
			continue
		}
		_, err := ring.NewGeometry(ring.Config{
			SQEntries: uint32(r.SQEntries), ArenaSize: uint64(r.ArenaSize), BlockSize: uint32(r.BlockSize),
		})
		if err != nil {
			t.Errorf("%+v: valid config, but ring.NewGeometry = %v", r, err)
		}
	}
	for _, r := range []Ring{
		{SQEntries: 2 * MaxSQEntries, ArenaSize: 8 * MiB, BlockSize: 4 * KiB},
		{SQEntries: 256, ArenaSize: MaxArenaSize - 64, BlockSize: 64}, // rounds up to 4 GiB
		{SQEntries: 256, ArenaSize: 8 * MiB, BlockSize: 2 * MaxBlockSize},
		{SQEntries: 256, ArenaSize: 8 * MiB, BlockSize: 32},
	} {
		c := Default()
		c.Ring = r
		if c.Validate() == nil {
			t.Errorf("%+v: Validate accepted it", r)
		}
		_, err := ring.NewGeometry(ring.Config{
			SQEntries: uint32(r.SQEntries), ArenaSize: uint64(r.ArenaSize), BlockSize: uint32(r.BlockSize),
		})
		if err == nil {
			t.Errorf("%+v: ring.NewGeometry accepted what Validate refuses", r)
		}
	}
}
