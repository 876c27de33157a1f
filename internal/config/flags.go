package config

import (
	"flag"
	"io"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
)

// Flag names defined by AddFlags.
const (
	FlagData      = "data"
	FlagRunDir    = "run-dir"
	FlagLogLevel  = "log-level"
	FlagLogFormat = "log-format"
	FlagNATSURL   = "nats-url"
	FlagNATSNS    = "nats-namespace"
)

// flagValue is a string flag that remembers whether it was set, so that a
// flag given with its default value still overrides the file. It keeps
// that memory itself, not in the FlagSet, so it also works when a cobra
// command adopts the set with pflag's AddGoFlagSet.
type flagValue struct {
	v   string
	set bool
}

func (f *flagValue) String() string { return f.v }
func (f *flagValue) Set(s string) error {
	f.v, f.set = s, true
	return nil
}

// AddFlags defines the flags that override the file on fs: --data, --run-dir,
// --log-level, --log-format, --nats-url and --nats-namespace. With cobra, define them on a
// Go FlagSet and adopt it: cmd.Flags().AddGoFlagSet(gofs).
func AddFlags(fs *flag.FlagSet) {
	fs.Var(&flagValue{}, FlagData, "data directory (overrides data_dir; default "+DefaultDataDir+")")
	fs.Var(&flagValue{}, FlagRunDir, "directory of the client sockets (overrides run_dir; default "+DefaultRunDir+", or DATA.run beside another --data)")
	fs.Var(&flagValue{}, FlagLogLevel, "log level: trace, debug, info, warn or error (overrides log_level)")
	fs.Var(&flagValue{}, FlagLogFormat, "log format: text or json (overrides log_format)")
	fs.Var(&flagValue{}, FlagNATSURL, `NATS server URL; "" starts an embedded server (overrides nats.url)`)
	fs.Var(&flagValue{}, FlagNATSNS, "this stack's NATS namespace, for stacks sharing a server (overrides nats.namespace; default "+DefaultNATSNamespace+")")
}

// ApplyFlags lays every flag of fs defined by AddFlags and set on the
// command line over c (flags > file > defaults), moves the derived paths
// along with --data, and validates the result. Flags that fs does not
// define are ignored; so are AddFlags flags left unset.
func (c *Config) ApplyFlags(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	get := func(name string) (string, bool) {
		f := fs.Lookup(name)
		if f == nil {
			return "", false
		}
		if v, ok := f.Value.(*flagValue); ok {
			return v.v, v.set
		}
		return f.Value.String(), given[name] // defined by the caller
	}
	if v, ok := get(FlagData); ok {
		if v != "" {
			abs, err := filepath.Abs(v)
			if err != nil {
				return err
			}
			v = abs
		}
		c.DataDir = v
		c.derivePaths()
	}
	if v, ok := get(FlagRunDir); ok && v != "" {
		abs, err := filepath.Abs(v)
		if err != nil {
			return err
		}
		c.RunDir, c.derived.runDir = abs, false
		c.derivePaths()
	}
	if v, ok := get(FlagLogLevel); ok {
		c.LogLevel = v
	}
	if v, ok := get(FlagLogFormat); ok {
		c.LogFormat = v
	}
	if v, ok := get(FlagNATSURL); ok {
		c.NATS.URL = v
	}
	if v, ok := get(FlagNATSNS); ok {
		c.NATS.Namespace = v
	}
	return c.Validate()
}

// Logger builds the process's logger from LogLevel and LogFormat, writing
// to w (os.Stderr if nil).
func (c *Config) Logger(name string, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      hclog.LevelFromString(c.LogLevel),
		JSONFormat: c.LogFormat == "json",
		Output:     w,
		Color:      hclog.ColorOff,
	})
}
