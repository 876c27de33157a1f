package control

import (
	"cmp"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ServicePrefix starts the micro service name of every weir service.
const ServicePrefix = "weir-"

// Endpoint names every weir service registers.
const (
	HealthEndpoint = "health"
	StatsEndpoint  = "stats"
	// DropCacheEndpoint (the IO service's) evicts every clean page of its
	// page cache, as `echo 3 > /proc/sys/vm/drop_caches` does the
	// kernel's: `weir drop-caches`, and benchmarks of cold reads.
	DropCacheEndpoint = "drop-cache"
	// LeasesEndpoint (the metadata service's) lists the kept leases
	// (`weir lease ls`); LeaseRevokeEndpoint ends them, by lease id or
	// inode (a LeaseRevokeRequest: `weir lease revoke`).
	LeasesEndpoint      = "leases"
	LeaseRevokeEndpoint = "lease-revoke"
)

// ServiceInfo names a service. Name is "weir-<short>" with short made of
// letters, digits, '-' and '_'; Version is a semantic version ("" means
// "0.0.0-dev"); Namespace is the NATS namespace of the service's stack
// (CheckNamespace; "" means DefaultNamespace).
type ServiceInfo struct {
	Name, Version, Description string
	Namespace                  string
	// Endpoints are more endpoints of the service's group, by name: each
	// replies the JSON of what its function returns for the request's
	// body (untrusted: any role the endpoint's subject admits may send
	// any bytes), or the error.
	Endpoints map[string]func(req []byte) (any, error)
}

// NamespaceKey is the micro service metadata key that holds the NATS
// namespace of the service's stack; Status keeps the services of one
// namespace by it.
const NamespaceKey = "weir.namespace"

// Health is the reply of a health endpoint.
type Health struct {
	Status string `json:"status"`          // "ok" or "error"
	Error  string `json:"error,omitempty"` // why, when Status is "error"
}

var shortName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Register registers the micro service info.Name on nc with the endpoints
// "health" and "stats" in group "<namespace>.<short>" (see the package
// comment for the subjects), and the namespace in its metadata. health replies {"status":"ok"} when healthFn returns nil
// and {"status":"error","error":...} otherwise; stats replies the JSON of
// statsFn(), which should be a struct or map. Either function may be nil.
// They run on NATS's delivery goroutines, concurrently with the service,
// and must be safe for that. Stop the returned service before closing nc.
func Register(nc *nats.Conn, info ServiceInfo, healthFn func() error, statsFn func() any) (micro.Service, error) {
	short, ok := strings.CutPrefix(info.Name, ServicePrefix)
	if !ok || !shortName.MatchString(short) {
		return nil, fmt.Errorf("control: service name %q: want %q followed by letters, digits, '-' or '_'", info.Name, ServicePrefix)
	}
	version := info.Version
	if version == "" {
		version = "0.0.0-dev"
	}
	namespace := cmp.Or(info.Namespace, DefaultNamespace)
	if err := CheckNamespace(namespace); err != nil {
		return nil, fmt.Errorf("control: service %s: nats namespace: %w", info.Name, err)
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        info.Name,
		Version:     version,
		Description: info.Description,
		Metadata:    map[string]string{NamespaceKey: namespace},
	})
	if err != nil {
		return nil, fmt.Errorf("control: register %s: %w", info.Name, err)
	}
	id := svc.Info().ID
	g := svc.AddGroup(namespace + "." + short)
	err = g.AddEndpoint(HealthEndpoint, micro.HandlerFunc(func(req micro.Request) {
		h := Health{Status: "ok"}
		if healthFn != nil {
			if err := healthFn(); err != nil {
				h = Health{Status: "error", Error: err.Error()}
			}
		}
		_ = req.RespondJSON(h) // a lost reply is the requester's timeout
	}), micro.WithEndpointSubject(id+"."+HealthEndpoint))
	if err == nil {
		err = g.AddEndpoint(StatsEndpoint, micro.HandlerFunc(func(req micro.Request) {
			var v any = struct{}{}
			if statsFn != nil {
				v = statsFn()
			}
			b, err := json.Marshal(v)
			if err != nil {
				_ = req.Error("500", "stats: "+err.Error(), nil)
				return
			}
			_ = req.Respond(b)
		}), micro.WithEndpointSubject(id+"."+StatsEndpoint))
	}
	for name, fn := range info.Endpoints {
		if err != nil {
			break
		}
		err = g.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
			v, err := fn(req.Data())
			if err != nil {
				_ = req.Error("500", name+": "+err.Error(), nil)
				return
			}
			_ = req.RespondJSON(v)
		}), micro.WithEndpointSubject(id+"."+name))
	}
	if err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("control: register %s: %w", info.Name, err)
	}
	// The server must have the service's subscriptions before Register
	// returns, or a status request from another connection can miss it.
	if err := nc.Flush(); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("control: register %s: flush: %w", info.Name, err)
	}
	return svc, nil
}

// Deregister stops svc's endpoints and waits until the server has dropped
// their subscriptions, so that a status request sent from another
// connection after Deregister returns no longer finds the service (rather
// than finding it half gone: discovered, endpoints unregistered).
func Deregister(nc *nats.Conn, svc micro.Service) {
	_ = svc.Stop() // fails only if already stopped
	_ = nc.Flush() // a closed connection has no subscriptions left anyway
}
