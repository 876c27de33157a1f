// Package control is weir's control plane over NATS: an embedded server
// for `weir up`, connections that survive server restarts, the health and
// stats micro services every weir service registers, and the discovery
// behind `weir status`.
//
// NATS carries control messages only (health, stats, leases, verification
// jobs). File data and metadata requests never travel on it: they go over
// the rings (docs/architecture.md, invariant 3).
//
// # Subjects
//
// A service named "weir-<short>" (e.g. "weir-metadata") registers as a NATS
// micro service under that name, so `nats micro ls` and $SRV.PING/INFO/STATS
// find it. Its endpoints "health" and "stats" live in group
// "<namespace>.<short>", where namespace is the NATS namespace of its stack
// ("weir" unless nats.namespace says otherwise), and are addressed per
// instance:
//
//	<namespace>.<short>.<instance id>.health   → {"status":"ok"} or {"status":"error","error":"..."}
//	<namespace>.<short>.<instance id>.stats    → the JSON of the service's counters
//
// The instance id in the subject makes every instance of a service
// answerable on its own (a shared, queue-grouped subject would reach one
// random instance); [Status] learns the subjects from $SRV.INFO. Every
// micro service on the server answers $SRV.INFO, whatever its stack, so
// each weir service also carries its namespace in its metadata
// (NamespaceKey) and Status keeps only the services of the namespace it is
// asked about.
package control

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds how long StartEmbedded waits for the server to accept
// connections.
const readyTimeout = 10 * time.Second

// Embedded is a nats-server running inside this process.
type Embedded struct {
	srv *server.Server // immutable after StartEmbedded
}

// EmbeddedOptions configure StartEmbedded.
type EmbeddedOptions struct {
	// Listen is "host:port" on a loopback address (127.0.0.1, ::1 or
	// localhost); port -1 or 0 picks a free port.
	Listen string
	// Users are the only connections the server admits, each with its
	// permissions (Creds.Users); there must be at least one.
	Users []User
	// UnsafeNoAuth admits every connection with every permission, as a
	// NATS server without authorization does. Only tests set it, to show
	// what authentication prevents; no configuration file can.
	UnsafeNoAuth bool
	Logger       hclog.Logger
}

// StartEmbedded runs a nats-server in this process and returns once it
// accepts connections. It listens on loopback only and admits only
// o.Users, authenticated by nkey, each with its permissions. The server
// has no JetStream, no monitoring port and no signal handlers; it logs
// through o.Logger.
func StartEmbedded(o EmbeddedOptions) (*Embedded, error) {
	listen, log := o.Listen, o.Logger
	host, port, err := parseListen(listen)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if len(o.Users) == 0 && !o.UnsafeNoAuth {
		return nil, errors.New("embedded nats: no users: refusing to run a server that any local process could use")
	}
	opts := &server.Options{
		ServerName:      "weir-embedded",
		Host:            host,
		Port:            port,
		NoSigs:          true,  // weir up handles SIGINT/SIGTERM itself
		JetStream:       false, // control messages only: nothing durable on NATS
		HTTPPort:        0,     // no monitoring endpoint
		NoSystemAccount: true,
	}
	if !o.UnsafeNoAuth {
		for _, u := range o.Users {
			opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.Nkey, Permissions: serverPermissions(u.Permissions)})
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	sl := &serverLogger{log: log, fatal: make(chan string, 1)}
	srv.SetLoggerV2(sl, log.IsDebug(), log.IsTrace(), false)
	go srv.Start()

	// The server reports a failed listen through Fatalf, not an error:
	// watch for it instead of waiting out readyTimeout.
	deadline := time.Now().Add(readyTimeout)
	for !srv.ReadyForConnections(25 * time.Millisecond) {
		select {
		case msg := <-sl.fatal:
			srv.Shutdown()
			return nil, fmt.Errorf("embedded nats on %s: %s", listen, msg)
		default:
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			return nil, fmt.Errorf("embedded nats on %s: not ready after %v", listen, readyTimeout)
		}
	}
	log.Info("embedded nats ready", "url", srv.ClientURL())
	return &Embedded{srv: srv}, nil
}

// serverPermissions is p in the server's terms; allow_responses as the
// configuration file sets it.
func serverPermissions(p Permissions) *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: slices.Clone(p.Publish)},
		Subscribe: &server.SubjectPermission{Allow: slices.Clone(p.Subscribe)},
	}
	if len(p.Publish) == 0 {
		sp.Publish = &server.SubjectPermission{Deny: []string{">"}}
	}
	if len(p.Subscribe) == 0 {
		sp.Subscribe = &server.SubjectPermission{Deny: []string{">"}}
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return sp
}

// URL is where clients connect, e.g. "nats://127.0.0.1:40123".
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits until it has stopped. Connected
// clients see a disconnect and start reconnecting.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// parseListen splits a loopback "host:port"; port 0 means random, as it
// does for net.Listen (nats-server would read it as 4222).
func parseListen(listen string) (string, int, error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("embedded nats: listen %q: want host:port", listen)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", 0, fmt.Errorf("embedded nats: listen %q: loopback addresses only", listen)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("embedded nats: listen %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// serverLogger adapts an hclog.Logger to server.Logger.
type serverLogger struct {
	log   hclog.Logger
	fatal chan string // first fatal message, for StartEmbedded
}

var _ server.Logger = (*serverLogger)(nil)

func (l *serverLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.log.Trace(fmt.Sprintf(format, v...)) }

// Fatalf logs at error level and does not exit: the server stops the
// failed part itself, and an embedding process decides what a dead control
// plane means for it.
func (l *serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg, "fatal", true)
	select {
	case l.fatal <- msg:
	default:
	}
}
