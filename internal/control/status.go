package control

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// Discovery and request bounds; ctx may shorten all of them.
const (
	// discoverMax bounds the wait for $SRV.INFO replies; discoverQuiet
	// ends it early once replies stop coming and every expected service
	// has answered.
	discoverMax   = 2 * time.Second
	discoverQuiet = 250 * time.Millisecond
	// requestTimeout bounds each health or stats request.
	requestTimeout = 2 * time.Second
)

// ServiceStatus is what Status learned about one service instance, or
// about an expected service that no instance answered for (ID empty).
type ServiceStatus struct {
	Name    string         `json:"name"`
	ID      string         `json:"id"`
	Version string         `json:"version"`
	Healthy bool           `json:"healthy"`
	Error   string         `json:"error,omitempty"` // why it is unhealthy or missing, or why its stats are missing
	Stats   map[string]any `json:"stats"`           // numbers are json.Number
}

// Status discovers every weir micro service instance of the stack whose
// NATS namespace is namespace ("" means DefaultNamespace) reachable on
// nc (by $SRV.INFO, keeping names that start with "weir-" and that
// namespace in their metadata), asks each instance for its health and
// stats, and returns them sorted by name, then id. An instance that does
// not answer is listed as unhealthy. Each service named in expect that no
// instance answered for within discoverMax (2s) is listed too, unhealthy,
// with the error "no reply within 2s": a service that is down, hung or in
// another namespace. With no weir services and none expected the result
// is empty, not an error.
func Status(ctx context.Context, nc *nats.Conn, namespace string, expect ...string) ([]ServiceStatus, error) {
	missing := fmt.Sprintf("no reply within %v", discoverMax)
	infos, err := discover(ctx, nc, cmp.Or(namespace, DefaultNamespace), expect)
	if errors.Is(err, errNoServices) {
		infos, missing = nil, "no reply: no micro service at all on this NATS server"
	} else if err != nil {
		return nil, err
	}
	st := make([]ServiceStatus, len(infos))
	var wg sync.WaitGroup
	for i, info := range infos {
		wg.Go(func() { st[i] = query(ctx, nc, info) })
	}
	wg.Wait()
	for _, name := range expect {
		if !slices.ContainsFunc(st, func(s ServiceStatus) bool { return s.Name == name }) {
			st = append(st, ServiceStatus{Name: name, Error: missing})
		}
	}
	slices.SortFunc(st, func(a, b ServiceStatus) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
	return st, nil
}

// Unhealthy returns the entries of st that are not healthy, missing
// services included.
func Unhealthy(st []ServiceStatus) []ServiceStatus {
	var bad []ServiceStatus
	for _, s := range st {
		if !s.Healthy {
			bad = append(bad, s)
		}
	}
	return bad
}

// errNoServices is discover's answer when no micro service at all is
// subscribed to $SRV.INFO.
var errNoServices = errors.New("no micro service on the server")

// discover gathers $SRV.INFO replies from the weir services of namespace
// until replies stop coming and every service in expect has answered,
// discoverMax passes, or ctx ends.
func discover(ctx context.Context, nc *nats.Conn, namespace string, expect []string) ([]micro.Info, error) {
	subject, err := micro.ControlSubject(micro.InfoVerb, "", "")
	if err != nil {
		return nil, err
	}
	inbox := nc.NewRespInbox()
	msgs := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return nil, fmt.Errorf("control: discover: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, fmt.Errorf("control: discover: %w", err)
	}

	limit := time.NewTimer(discoverMax)
	defer limit.Stop()
	var quiet <-chan time.Time // armed by each reply
	missing := map[string]bool{}
	for _, name := range expect {
		missing[name] = true
	}
	seen := map[string]bool{}
	var infos []micro.Info
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-limit.C:
			return infos, nil
		case <-quiet:
			if len(missing) == 0 {
				return infos, nil
			}
			quiet = nil // wait for the missing ones until limit
		case m := <-msgs:
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				return nil, errNoServices // no responders
			}
			quiet = time.After(discoverQuiet)
			var info micro.Info
			if json.Unmarshal(m.Data, &info) != nil || !strings.HasPrefix(info.Name, ServicePrefix) ||
				info.Metadata[NamespaceKey] != namespace || seen[info.ID] {
				continue
			}
			seen[info.ID] = true
			delete(missing, info.Name)
			infos = append(infos, info)
		}
	}
}

// query asks one instance for health and stats, concurrently.
func query(ctx context.Context, nc *nats.Conn, info micro.Info) ServiceStatus {
	s := ServiceStatus{Name: info.Name, ID: info.ID, Version: info.Version}
	var healthSubj, statsSubj string
	for _, e := range info.Endpoints {
		switch e.Name {
		case HealthEndpoint:
			healthSubj = e.Subject
		case StatsEndpoint:
			statsSubj = e.Subject
		}
	}
	var (
		wg        sync.WaitGroup
		healthErr error
		statsErr  error
	)
	wg.Go(func() {
		var h Health
		if healthErr = request(ctx, nc, healthSubj, &h); healthErr == nil {
			s.Healthy = h.Status == "ok"
			if !s.Healthy {
				healthErr = errors.New(cmp.Or(h.Error, fmt.Sprintf("status %q", h.Status)))
			}
		}
	})
	wg.Go(func() {
		var raw any
		if statsErr = request(ctx, nc, statsSubj, &raw); statsErr == nil {
			if m, ok := raw.(map[string]any); ok {
				s.Stats = m
			} else {
				s.Stats = map[string]any{"value": raw}
			}
		}
	})
	wg.Wait()
	var errs []string
	if healthErr != nil {
		errs = append(errs, healthErr.Error())
	}
	if statsErr != nil {
		errs = append(errs, "stats: "+statsErr.Error())
	}
	s.Error = strings.Join(errs, "; ")
	return s
}

// request sends an empty request to subject and decodes the JSON reply
// into v, numbers as json.Number.
func request(ctx context.Context, nc *nats.Conn, subject string, v any) error {
	return requestWith(ctx, nc, subject, nil, v)
}

// requestWith is request with a body.
func requestWith(ctx context.Context, nc *nats.Conn, subject string, body []byte, v any) error {
	if subject == "" {
		return errors.New("endpoint not registered")
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, subject, body)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		return fmt.Errorf("no reply within %v", requestTimeout)
	}
	if err != nil {
		return err
	}
	if desc := m.Header.Get(micro.ErrorHeader); desc != "" {
		return errors.New(desc)
	}
	d := json.NewDecoder(bytes.NewReader(m.Data))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("bad reply: %w", err)
	}
	return nil
}

// FormatStatus writes st as a table, one instance a line, with the
// service's counters as key=value; or, with asJSON, as a JSON array.
func FormatStatus(w io.Writer, st []ServiceStatus, asJSON bool) error {
	if asJSON {
		if st == nil {
			st = []ServiceStatus{}
		}
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(st)
	}
	if len(st) == 0 {
		_, err := fmt.Fprintln(w, "no weir services found")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tID\tVERSION\tHEALTH\tSTATS")
	for _, s := range st {
		health := "ok"
		if !s.Healthy {
			health = "error"
		}
		if s.Error != "" {
			health += ": " + s.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, cmp.Or(s.ID, "-"), cmp.Or(s.Version, "-"), health, counters(s.Stats))
	}
	return tw.Flush()
}

// counters renders stats as sorted key=value pairs; nested objects become
// dotted keys, arrays their JSON.
func counters(stats map[string]any) string {
	var parts []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			switch v := m[k].(type) {
			case map[string]any:
				walk(prefix+k+".", v)
			case string:
				if strings.ContainsAny(v, " \t=\"") || v == "" {
					v = fmt.Sprintf("%q", v)
				}
				parts = append(parts, prefix+k+"="+v)
			case nil:
				parts = append(parts, prefix+k+"=null")
			case []any:
				b, _ := json.Marshal(v)
				parts = append(parts, prefix+k+"="+string(b))
			default:
				parts = append(parts, fmt.Sprintf("%s%s=%v", prefix, k, v))
			}
		}
	}
	walk("", stats)
	return strings.Join(parts, " ")
}

// Call discovers the instances of service (a "weir-" name) in namespace
// and sends each an empty request on its endpoint, returning the replies
// by instance id. No instance within discoverMax is an error.
func Call(ctx context.Context, nc *nats.Conn, namespace, service, endpoint string) (map[string]any, error) {
	return CallWith(ctx, nc, namespace, service, endpoint, nil)
}

// CallWith is Call with a request body.
func CallWith(ctx context.Context, nc *nats.Conn, namespace, service, endpoint string, body []byte) (map[string]any, error) {
	infos, err := discover(ctx, nc, cmp.Or(namespace, DefaultNamespace), []string{service})
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, info := range infos {
		if info.Name != service {
			continue
		}
		subj := ""
		for _, e := range info.Endpoints {
			if e.Name == endpoint {
				subj = e.Subject
			}
		}
		var v any
		if err := requestWith(ctx, nc, subj, body, &v); err != nil {
			return out, fmt.Errorf("%s %s: %w", service, info.ID, err)
		}
		out[info.ID] = v
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no instance answered within %v", service, discoverMax)
	}
	return out, nil
}
