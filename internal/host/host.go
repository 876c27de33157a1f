// Package host is the skeleton every weir service runs on, so that a
// service adds only what is its own. A Host gives a service:
//
//   - its control handlers on the stack's authenticated NATS connection,
//     either one subscription per subject (delivered concurrently) or one
//     ordered subscription for a wildcard (delivered in publish order);
//   - refusal accounting for control messages: every refused message is
//     answered with an error, counted by kind in stats, and logged once
//     per kind;
//   - registration as a NATS micro service with "health" (the host's own
//     checks, then the service's) and "stats" (the service's counters and
//     the host's);
//   - ring listeners: for clients (a socket open to every local user) and
//     for the stack's other services (a socket and a peer uid check that
//     admit only the service user), with the peer hello of service
//     sessions and up/down notice of each peer (Peers);
//   - readiness (Ready), and an ordered shutdown: the health and stats
//     endpoints go first, so `weir status` stops seeing the service, then
//     every ring session ends, then the control subscriptions.
//
// The NATS connection is the caller's: the builders in package stack open
// it with the service's credentials.
package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/weir-storage/weir/internal/control"
)

// Options describe the service a Host runs.
type Options struct {
	Name        string // micro service name: "weir-<short>"
	Description string
	Version     string     // reported on NATS; "" = "0.0.0-dev"
	Namespace   string     // the stack's NATS namespace; "" = control.DefaultNamespace
	NATS        *nats.Conn // the service's authenticated connection; not owned
	Logger      hclog.Logger
	// RequestTimeout bounds each control request the service sends; 0 = 5s.
	RequestTimeout time.Duration
	// Endpoints are the service's own endpoints besides health and stats
	// (control.ServiceInfo.Endpoints).
	Endpoints map[string]func(req []byte) (any, error)
}

// DefaultRequestTimeout bounds a control request when Options leave it 0.
const DefaultRequestTimeout = 5 * time.Second

type handler struct {
	subject string
	ordered map[string]nats.MsgHandler // by subject, for an ordered wildcard
	fn      nats.MsgHandler
}

// Host runs one service's shared machinery. Configure it (Handle,
// HandleOrdered, Serve) before Start; everything else is safe from any
// goroutine.
type Host struct {
	opts Options
	log  hclog.Logger
	subj control.Subjects // immutable after New

	handlers  []handler   // set before Start
	listeners []*Listener // set before Start

	mu     sync.Mutex
	subs   []*nats.Subscription // protected by mu
	ctl    micro.Service        // protected by mu
	ready  chan struct{}
	closed atomic.Bool

	refused refusals
}

// New checks opts and returns a Host.
func New(opts Options) (*Host, error) {
	if opts.NATS == nil {
		return nil, errors.New("host: a NATS connection is required")
	}
	if opts.Namespace == "" {
		opts.Namespace = control.DefaultNamespace
	}
	if err := control.CheckNamespace(opts.Namespace); err != nil {
		return nil, fmt.Errorf("host: %s: nats namespace: %w", opts.Name, err)
	}
	if !strings.HasPrefix(opts.Name, control.ServicePrefix) {
		return nil, fmt.Errorf("host: service name %q must start with %q", opts.Name, control.ServicePrefix)
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	h := &Host{opts: opts, log: opts.Logger, subj: control.SubjectsIn(opts.Namespace), ready: make(chan struct{})}
	h.refused.log = opts.Logger
	return h, nil
}

// Subjects are the control subjects of the host's stack.
func (h *Host) Subjects() control.Subjects { return h.subj }

// NATS is the service's connection.
func (h *Host) NATS() *nats.Conn { return h.opts.NATS }

// Log is the service's logger.
func (h *Host) Log() hclog.Logger { return h.log }

// Handle subscribes fn to subject at Start; messages of one subscription
// are handled one at a time, different subscriptions concurrently.
func (h *Host) Handle(subject string, fn nats.MsgHandler) {
	h.handlers = append(h.handlers, handler{subject: subject, fn: fn})
}

// HandleOrdered takes every subject matching wildcard on one subscription
// at Start and hands each message, in the order the server delivered
// them, to the function for its exact subject; a message on any other
// subject is refused as "unknown subject". NATS delivers the messages one
// connection published in the order it published them, so a handler that
// returns before the next message is taken sees them in that order.
func (h *Host) HandleOrdered(wildcard string, fns map[string]nats.MsgHandler) {
	h.handlers = append(h.handlers, handler{subject: wildcard, ordered: maps.Clone(fns)})
}

// Serve adds a ring listener that Start starts and Shutdown stops.
func (h *Host) Serve(l *Listener) {
	if l.Log == nil {
		l.Log = h.log
	}
	h.listeners = append(h.listeners, l)
}

// Start subscribes the control handlers, starts the ring listeners and
// registers the micro service with its health and stats endpoints: health
// answers the host's checks (Health), then health(); stats answers stats()
// with the host's counters added. Either function may be nil; both run on
// NATS delivery goroutines, concurrently with the service. On error
// nothing stays started.
func (h *Host) Start(health func() error, stats func() map[string]any) error {
	if err := h.start(health, stats); err != nil {
		h.stop(context.Background())
		return fmt.Errorf("%s: %w", h.opts.Name, err)
	}
	close(h.ready)
	return nil
}

func (h *Host) start(health func() error, stats func() map[string]any) error {
	nc := h.opts.NATS
	for _, hd := range h.handlers {
		fn := hd.fn
		if hd.ordered != nil {
			fns := hd.ordered
			fn = func(m *nats.Msg) {
				if f := fns[m.Subject]; f != nil {
					f(m)
					return
				}
				h.Refuse(m, "unknown_subject", control.Ack{}, "no handler for "+m.Subject)
			}
		}
		sub, err := nc.Subscribe(hd.subject, fn)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", hd.subject, err)
		}
		h.mu.Lock()
		h.subs = append(h.subs, sub)
		h.mu.Unlock()
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("flush subscriptions: %w", err)
	}
	for _, l := range h.listeners {
		if err := l.Start(); err != nil {
			return err
		}
	}
	ctl, err := control.Register(nc, control.ServiceInfo{
		Name: h.opts.Name, Version: h.opts.Version, Namespace: h.opts.Namespace, Description: h.opts.Description,
		Endpoints: h.opts.Endpoints,
	}, func() error {
		if err := h.Health(); err != nil {
			return err
		}
		if health != nil {
			return health()
		}
		return nil
	}, func() any {
		m := map[string]any{}
		if stats != nil {
			m = stats()
		}
		maps.Copy(m, h.Counters())
		return m
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.ctl = ctl
	h.mu.Unlock()
	return nil
}

// Ready is closed once Start succeeded.
func (h *Host) Ready() <-chan struct{} { return h.ready }

// Health is the host's part of the service's health: nil once started and
// while every listener accepts; otherwise why not.
func (h *Host) Health() error {
	select {
	case <-h.ready:
	default:
		return errors.New("not started")
	}
	if h.closed.Load() {
		return errors.New("shut down")
	}
	for _, l := range h.listeners {
		if err := l.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Closed reports whether Shutdown has begun.
func (h *Host) Closed() bool { return h.closed.Load() }

// Shutdown withdraws the health and stats endpoints (so that status no
// longer finds the service), stops every listener and waits until every
// ring session has ended or ctx expires, then drops the control
// subscriptions. The service closes what is its own after it returns.
// Later calls return nil.
func (h *Host) Shutdown(ctx context.Context) error {
	if !h.closed.CompareAndSwap(false, true) {
		return nil
	}
	return h.stop(ctx)
}

func (h *Host) stop(ctx context.Context) error {
	h.mu.Lock()
	ctl := h.ctl
	h.ctl = nil
	h.mu.Unlock()
	if ctl != nil {
		control.Deregister(h.opts.NATS, ctl)
	}
	var errs []error
	for _, l := range h.listeners {
		if err := l.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	h.mu.Lock()
	subs := h.subs
	h.subs = nil
	h.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Unsubscribe()
	}
	return errors.Join(errs...)
}

// Request sends a control request and decodes the reply; a refusal in the
// reply becomes an error (a *control.Refusal). ctx and the host's request
// timeout bound it.
func (h *Host) Request(ctx context.Context, subj string, msg any, reply interface{ Err() error }) error {
	ctx, cancel := context.WithTimeout(ctx, h.opts.RequestTimeout)
	defer cancel()
	if err := control.RequestContext(ctx, h.opts.NATS, subj, msg, reply); err != nil {
		return err
	}
	if err := reply.Err(); err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	return nil
}

// Refuse answers a control message that the service will not act on:
// reply (an Ack, SessionInfo, BlobsReply, ResyncReply or
// SetLiveBatchReply, whose Error field it sets to
// "<kind>: <detail>") goes back to the sender, the refusal is counted
// under kind in stats, and the first refusal of each kind is logged as a
// warning (later ones at debug level). Nothing else changes.
func (h *Host) Refuse(m *nats.Msg, kind string, reply any, detail string) {
	h.refused.add(kind, m.Subject, detail)
	msg := kind + ": " + detail
	switch r := reply.(type) {
	case control.Ack:
		r.Error = msg
		reply = r
	case control.SessionInfo:
		r.Error = msg
		reply = r
	case control.BlobsReply:
		r.Error = msg
		reply = r
	case control.ResyncReply:
		r.Error = msg
		reply = r
	case control.SetLiveBatchReply:
		r.Error = msg
		reply = r
	default:
		// Every reply type has an "error" field: a refusal of a type
		// not listed above still goes back as one, never as a success.
		h.log.Error("refusal of a reply type Refuse does not know; sent as a bare error", "type", fmt.Sprintf("%T", reply))
		reply = map[string]string{"error": msg}
	}
	control.Respond(m, reply)
}

// Counters are the host's counters for stats: refused control messages,
// in all and by kind, peers a service listener turned away, accepts that
// failed (a listener retries them), connections a client listener's
// Limits refused, handshakes that failed or timed out, and the
// handshakes, ring sessions (pending or served) and stalled sessions (a
// client that takes no completions) now.
func (h *Host) Counters() map[string]any {
	m := h.refused.snapshot()
	var peers, accepts, refHS, refSess, timedOut, failed uint64
	var pending, sessions, stalled int
	for _, l := range h.listeners {
		peers += l.Refused.Load()
		accepts += l.AcceptErrors.Load()
		refHS += l.RefusedHandshakes.Load()
		refSess += l.RefusedSessions.Load()
		timedOut += l.HandshakeTimeouts.Load()
		failed += l.HandshakeFailures.Load()
		p, n := l.Pending()
		pending += p
		sessions += n
		stalled += l.Stalled()
	}
	m["service_peers_refused"] = peers
	m["accept_errors"] = accepts
	m["limits_refused_handshakes"] = refHS
	m["limits_refused_sessions"] = refSess
	m["handshakes_timed_out"] = timedOut
	m["handshakes_failed"] = failed
	m["handshakes_pending"] = pending
	m["ring_sessions"] = sessions
	m["ring_sessions_stalled"] = stalled
	return m
}

// refusals counts refused control messages by kind.
type refusals struct {
	log    hclog.Logger
	mu     sync.Mutex
	byKind map[string]uint64 // protected by mu
}

func (r *refusals) add(kind, subject, detail string) {
	r.mu.Lock()
	if r.byKind == nil {
		r.byKind = map[string]uint64{}
	}
	r.byKind[kind]++
	first := r.byKind[kind] == 1
	r.mu.Unlock()
	lvl := hclog.Debug
	if first {
		lvl = hclog.Warn
	}
	r.log.Log(lvl, "control message refused (later refusals of this kind are logged at debug level; all are counted in control_refused)",
		"kind", kind, "subject", subject, "detail", detail)
}

func (r *refusals) snapshot() map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var total uint64
	m := map[string]any{}
	for k, n := range r.byKind {
		m["control_refused_"+k] = n
		total += n
	}
	m["control_refused"] = total
	return m
}
