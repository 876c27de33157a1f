package config

import (
	"cmp"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Error is every problem found in a configuration. Diagnostics keeps the
// hcl form (with source ranges) for callers that want to print snippets
// with hcl.NewDiagnosticTextWriter.
type Error struct {
	Diagnostics hcl.Diagnostics
}

// Error lists one problem per line as "file:line: message"; a problem
// that has no place in a file (a flag, a default) has no prefix.
func (e *Error) Error() string {
	var b strings.Builder
	for i, d := range e.Diagnostics {
		if i > 0 {
			b.WriteByte('\n')
		}
		if d.Subject != nil {
			fmt.Fprintf(&b, "%s:%d: ", d.Subject.Filename, d.Subject.Start.Line)
		}
		b.WriteString(d.Summary)
		if d.Detail != "" {
			b.WriteString(": ")
			b.WriteString(d.Detail)
		}
	}
	return b.String()
}

// errorOf returns diags as an *Error in file order, or nil if none is an
// error.
func errorOf(diags hcl.Diagnostics) error {
	if !diags.HasErrors() {
		return nil
	}
	ds := slices.Clone(diags)
	slices.SortStableFunc(ds, func(a, b *hcl.Diagnostic) int {
		switch {
		case a.Subject == nil || b.Subject == nil:
			// Placeless problems go last, in the order found.
			return cmp.Compare(boolInt(a.Subject == nil), boolInt(b.Subject == nil))
		case a.Subject.Filename != b.Subject.Filename:
			return cmp.Compare(a.Subject.Filename, b.Subject.Filename)
		}
		return cmp.Compare(a.Subject.Start.Byte, b.Subject.Start.Byte)
	})
	return &Error{Diagnostics: ds}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The file's shape. Every attribute is optional and kept as an
// *hcl.Attribute so that its range is at hand for semantic errors.
type (
	fileConfig struct {
		DataDir   *hcl.Attribute `hcl:"data_dir,optional"`
		RunDir    *hcl.Attribute `hcl:"run_dir,optional"`
		LogLevel  *hcl.Attribute `hcl:"log_level,optional"`
		LogFormat *hcl.Attribute `hcl:"log_format,optional"`
		NATS      *natsBlock     `hcl:"nats,block"`
		Metadata  *metadataBlock `hcl:"metadata,block"`
		IO        *ioBlock       `hcl:"io,block"`
		Journal   *journalBlock  `hcl:"journal,block"`
		Ring      *ringBlock     `hcl:"ring,block"`
		Limits    *limitsBlock   `hcl:"limits,block"`
	}
	natsBlock struct {
		URL            *hcl.Attribute `hcl:"url,optional"`
		Listen         *hcl.Attribute `hcl:"listen,optional"`
		ConnectTimeout *hcl.Attribute `hcl:"connect_timeout,optional"`
		RequestTimeout *hcl.Attribute `hcl:"request_timeout,optional"`
		Namespace      *hcl.Attribute `hcl:"namespace,optional"`
		CredsDir       *hcl.Attribute `hcl:"creds_dir,optional"`
	}
	metadataBlock struct {
		Socket          *hcl.Attribute `hcl:"socket,optional"`
		ServiceSocket   *hcl.Attribute `hcl:"service_socket,optional"`
		SyncEveryOp     *hcl.Attribute `hcl:"sync_every_op,optional"`
		SyncInterval    *hcl.Attribute `hcl:"sync_interval,optional"`
		CheckpointEvery *hcl.Attribute `hcl:"checkpoint_every,optional"`
		ReclaimGrace    *hcl.Attribute `hcl:"reclaim_grace,optional"`
		TrustGroups     *hcl.Attribute `hcl:"trust_groups,optional"`
		NamedGroups     *hcl.Attribute `hcl:"named_trust_groups,optional"`
		MinTenure       *hcl.Attribute `hcl:"lease_min_tenure,optional"`
	}
	ioBlock struct {
		Socket   *hcl.Attribute `hcl:"socket,optional"`
		Backend  *hcl.Attribute `hcl:"backend,optional"`
		Direct   *hcl.Attribute `hcl:"direct,optional"`
		WaitMode *hcl.Attribute `hcl:"wait_mode,optional"`

		SPDKConfig  *hcl.Attribute `hcl:"spdk_config,optional"`
		SPDKBdev    *hcl.Attribute `hcl:"spdk_bdev,optional"`
		SPDKNoHuge  *hcl.Attribute `hcl:"spdk_no_huge,optional"`
		SPDKMemMB   *hcl.Attribute `hcl:"spdk_mem_mb,optional"`
		SPDKWorkers *hcl.Attribute `hcl:"spdk_workers,optional"`

		SPDKClusterSize *hcl.Attribute `hcl:"spdk_cluster_size,optional"`
		CacheSize       *hcl.Attribute `hcl:"cache_size,optional"`
		StagingSize     *hcl.Attribute `hcl:"staging_size,optional"`
		Readahead       *hcl.Attribute `hcl:"readahead,optional"`
		Descriptors     *hcl.Attribute `hcl:"descriptors,optional"`
	}
	journalBlock struct {
		Enabled    *hcl.Attribute `hcl:"enabled,optional"`
		Socket     *hcl.Attribute `hcl:"socket,optional"`
		Interval   *hcl.Attribute `hcl:"interval,optional"`
		Foreground *hcl.Attribute `hcl:"foreground,optional"`
	}
	limitsBlock struct {
		ExemptUIDs       *hcl.Attribute `hcl:"exempt_uids,optional"`
		HandshakesPerUID *hcl.Attribute `hcl:"handshakes_per_uid,optional"`
		Handshakes       *hcl.Attribute `hcl:"handshakes,optional"`
		HandshakeTimeout *hcl.Attribute `hcl:"handshake_timeout,optional"`
		SessionsPerUID   *hcl.Attribute `hcl:"sessions_per_uid,optional"`
		Sessions         *hcl.Attribute `hcl:"sessions,optional"`
		PinsShare        *hcl.Attribute `hcl:"pins_share,optional"`
		StagingShare     *hcl.Attribute `hcl:"staging_share,optional"`
		LeasesShare      *hcl.Attribute `hcl:"leases_share,optional"`
		DescriptorsShare *hcl.Attribute `hcl:"descriptors_share,optional"`
	}
	ringBlock struct {
		SQEntries *hcl.Attribute `hcl:"sq_entries,optional"`
		ArenaSize *hcl.Attribute `hcl:"arena_size,optional"`
		BlockSize *hcl.Attribute `hcl:"block_size,optional"`
	}
)

// Load reads the configuration file at path over the defaults and
// validates the result. An empty path means no file: Load returns
// [Default]. Problems in the file are reported together as one *Error;
// a file that cannot be read is reported as the *fs.PathError from os.
func Load(path string) (*Config, error) {
	c := Default()
	if path == "" {
		return c, nil
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, errorOf(diags)
	}
	var fc fileConfig
	diags = append(diags, gohcl.DecodeBody(f.Body, nil, &fc)...)

	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	d := &decoder{dir: dir, where: make(map[string]*hcl.Range)}
	d.apply(&fc, c)
	diags = append(diags, d.diags...)
	c.derivePaths()
	diags = append(diags, c.validate(d.where)...)
	if err := errorOf(diags); err != nil {
		return nil, err
	}
	return c, nil
}

// decoder turns attributes into Config values. A value that cannot be
// decoded is reported and the field keeps its default, so that validation
// still looks at every other field.
type decoder struct {
	dir   string                // directory of the file, for relative paths
	where map[string]*hcl.Range // setting name → attribute range, for validate
	diags hcl.Diagnostics
}

func (d *decoder) apply(fc *fileConfig, c *Config) {
	d.path("data_dir", fc.DataDir, &c.DataDir) // derived paths follow in derivePaths
	if d.path("run_dir", fc.RunDir, &c.RunDir) {
		c.derived.runDir = false
	}
	d.str("log_level", fc.LogLevel, &c.LogLevel)
	d.str("log_format", fc.LogFormat, &c.LogFormat)
	if b := fc.NATS; b != nil {
		d.str("nats.url", b.URL, &c.NATS.URL)
		d.str("nats.listen", b.Listen, &c.NATS.Listen)
		d.duration("nats.connect_timeout", b.ConnectTimeout, &c.NATS.ConnectTimeout)
		d.duration("nats.request_timeout", b.RequestTimeout, &c.NATS.RequestTimeout)
		d.str("nats.namespace", b.Namespace, &c.NATS.Namespace)
		if d.path("nats.creds_dir", b.CredsDir, &c.NATS.CredsDir) {
			c.derived.credsDir = false
		}
	}
	if b := fc.Metadata; b != nil {
		if d.path("metadata.socket", b.Socket, &c.Metadata.Socket) {
			c.derived.metadataSocket = false
		}
		if d.path("metadata.service_socket", b.ServiceSocket, &c.Metadata.ServiceSocket) {
			c.derived.metadataServiceSocket = false
		}
		d.bool("metadata.sync_every_op", b.SyncEveryOp, &c.Metadata.SyncEveryOp)
		d.duration("metadata.sync_interval", b.SyncInterval, &c.Metadata.SyncInterval)
		d.int("metadata.checkpoint_every", b.CheckpointEvery, &c.Metadata.CheckpointEvery)
		d.duration("metadata.reclaim_grace", b.ReclaimGrace, &c.Metadata.ReclaimGrace)
		d.str("metadata.trust_groups", b.TrustGroups, &c.Metadata.TrustGroups)
		d.decode("metadata.named_trust_groups", b.NamedGroups, "a map of group name to a list of uids", &c.Metadata.NamedGroups)
		d.duration("metadata.lease_min_tenure", b.MinTenure, &c.Metadata.LeaseMinTenure)
	}
	if b := fc.IO; b != nil {
		if d.path("io.socket", b.Socket, &c.IO.Socket) {
			c.derived.ioSocket = false
		}
		d.str("io.backend", b.Backend, &c.IO.Backend)
		d.str("io.direct", b.Direct, &c.IO.Direct)
		d.str("io.wait_mode", b.WaitMode, &c.IO.WaitMode)
		d.path("io.spdk_config", b.SPDKConfig, &c.IO.SPDKConfig)
		d.str("io.spdk_bdev", b.SPDKBdev, &c.IO.SPDKBdev)
		d.bool("io.spdk_no_huge", b.SPDKNoHuge, &c.IO.SPDKNoHuge)
		d.int("io.spdk_mem_mb", b.SPDKMemMB, &c.IO.SPDKMemMB)
		d.int("io.spdk_workers", b.SPDKWorkers, &c.IO.SPDKWorkers)
		d.size("io.spdk_cluster_size", b.SPDKClusterSize, &c.IO.SPDKClusterSize)
		d.size("io.cache_size", b.CacheSize, &c.IO.CacheSize)
		d.size("io.staging_size", b.StagingSize, &c.IO.StagingSize)
		d.size("io.readahead", b.Readahead, &c.IO.Readahead)
		d.int("io.descriptors", b.Descriptors, &c.IO.Descriptors)
	}
	if b := fc.Journal; b != nil {
		d.bool("journal.enabled", b.Enabled, &c.Journal.Enabled)
		if d.path("journal.socket", b.Socket, &c.Journal.Socket) {
			c.derived.journalSocket = false
		}
		d.duration("journal.interval", b.Interval, &c.Journal.Interval)
		d.bool("journal.foreground", b.Foreground, &c.Journal.Foreground)
	}
	if b := fc.Limits; b != nil {
		d.decode("limits.exempt_uids", b.ExemptUIDs, "a list of uids", &c.Limits.ExemptUIDs)
		d.int("limits.handshakes_per_uid", b.HandshakesPerUID, &c.Limits.HandshakesPerUID)
		d.int("limits.handshakes", b.Handshakes, &c.Limits.Handshakes)
		d.duration("limits.handshake_timeout", b.HandshakeTimeout, &c.Limits.HandshakeTimeout)
		d.int("limits.sessions_per_uid", b.SessionsPerUID, &c.Limits.SessionsPerUID)
		d.int("limits.sessions", b.Sessions, &c.Limits.Sessions)
		d.int("limits.pins_share", b.PinsShare, &c.Limits.PinsShare)
		d.int("limits.staging_share", b.StagingShare, &c.Limits.StagingShare)
		d.int("limits.leases_share", b.LeasesShare, &c.Limits.LeasesShare)
		d.int("limits.descriptors_share", b.DescriptorsShare, &c.Limits.DescriptorsShare)
	}
	if b := fc.Ring; b != nil {
		d.int("ring.sq_entries", b.SQEntries, &c.Ring.SQEntries)
		d.size("ring.arena_size", b.ArenaSize, &c.Ring.ArenaSize)
		d.size("ring.block_size", b.BlockSize, &c.Ring.BlockSize)
	}
}

func (d *decoder) errorf(a *hcl.Attribute, name, format string, args ...any) {
	d.diags = append(d.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  name + ": " + fmt.Sprintf(format, args...),
		Subject:  a.Range.Ptr(),
	})
}

// value evaluates a's expression (no variables or functions) and reports
// a null. ok is false if a is absent or had an error already reported.
func (d *decoder) value(name string, a *hcl.Attribute) (v cty.Value, ok bool) {
	if a == nil {
		return cty.NilVal, false
	}
	v, diags := a.Expr.Value(nil)
	d.diags = append(d.diags, diags...)
	if diags.HasErrors() {
		return cty.NilVal, false
	}
	if v.IsNull() {
		d.errorf(a, name, "must not be null")
		return cty.NilVal, false
	}
	d.where[name] = a.Range.Ptr()
	return v, true
}

// decode converts a's value into *dst (a Go string, bool or int) with
// gohcl's conversion rules.
func (d *decoder) decode(name string, a *hcl.Attribute, want string, dst any) bool {
	v, ok := d.value(name, a)
	if !ok {
		return false
	}
	if diags := gohcl.DecodeExpression(hcl.StaticExpr(v, a.Expr.Range()), nil, dst); diags.HasErrors() {
		d.errorf(a, name, "want %s, got %s", want, v.Type().FriendlyName())
		return false
	}
	return true
}

func (d *decoder) str(name string, a *hcl.Attribute, dst *string) bool {
	return d.decode(name, a, "a string", dst)
}

func (d *decoder) bool(name string, a *hcl.Attribute, dst *bool) bool {
	return d.decode(name, a, "true or false", dst)
}

func (d *decoder) int(name string, a *hcl.Attribute, dst *int) bool {
	v, ok := d.value(name, a)
	if !ok {
		return false
	}
	n, ok := wholeNumber(v)
	if !ok || n < math.MinInt32 || n > math.MaxInt32 {
		d.errorf(a, name, "want a whole number, got %s", display(v))
		return false
	}
	*dst = int(n)
	return true
}

// path decodes a path; a relative one is taken relative to the file.
func (d *decoder) path(name string, a *hcl.Attribute, dst *string) bool {
	var s string
	if !d.str(name, a, &s) {
		return false
	}
	if s == "" {
		d.errorf(a, name, "must not be empty")
		return false
	}
	if !filepath.IsAbs(s) {
		s = filepath.Join(d.dir, s)
	}
	*dst = filepath.Clean(s)
	return true
}

func (d *decoder) duration(name string, a *hcl.Attribute, dst *time.Duration) bool {
	v, ok := d.value(name, a)
	if !ok {
		return false
	}
	if v.Type() != cty.String {
		d.errorf(a, name, "want a duration string such as \"5ms\" or \"2s\", got %s", display(v))
		return false
	}
	t, err := time.ParseDuration(v.AsString())
	if err != nil {
		d.errorf(a, name, "want a duration such as \"5ms\" or \"2s\", got %q", v.AsString())
		return false
	}
	*dst = t
	return true
}

func (d *decoder) size(name string, a *hcl.Attribute, dst *Size) bool {
	v, ok := d.value(name, a)
	if !ok {
		return false
	}
	switch v.Type() {
	case cty.Number:
		n, ok := wholeNumber(v)
		if !ok || n < 0 {
			d.errorf(a, name, "want a whole number of bytes, got %s", display(v))
			return false
		}
		*dst = Size(n)
	case cty.String:
		s, err := ParseSize(v.AsString())
		if err != nil {
			d.errorf(a, name, "%v", err)
			return false
		}
		*dst = s
	default:
		d.errorf(a, name, "want a number of bytes or a string such as \"8MiB\", got %s", display(v))
		return false
	}
	return true
}

// wholeNumber returns v as an integer that fits in an int64.
func wholeNumber(v cty.Value) (int64, bool) {
	if v.Type() != cty.Number || !v.IsKnown() {
		return 0, false
	}
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		return 0, false
	}
	n, acc := bf.Int64()
	return n, acc == big.Exact
}

// display renders a value for an error message.
func display(v cty.Value) string {
	switch v.Type() {
	case cty.String:
		return fmt.Sprintf("%q", v.AsString())
	case cty.Number:
		return v.AsBigFloat().Text('g', -1)
	case cty.Bool:
		return fmt.Sprint(v.True())
	}
	return v.Type().FriendlyName()
}
