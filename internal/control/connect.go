package control

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
)

// Connection defaults; a caller may override any of them with opts.
const (
	DefaultConnectTimeout = 5 * time.Second
	reconnectMin          = 100 * time.Millisecond
	reconnectMax          = 2 * time.Second
	pingInterval          = 10 * time.Second // notice a silent server within ~30s
)

// Connect connects to the NATS server(s) at url as client name. The first
// connection must succeed within the connect timeout (5s unless opts carry
// nats.Timeout), so a wrong URL is an error, not a silent retry loop;
// pass nats.RetryOnFailedConnect(true) to retry that too. Once connected,
// the connection reconnects forever, backing off from 100ms to 2s with
// jitter. Disconnects and reconnects are logged at warn and info, failed
// attempts at debug, asynchronous errors at error. opts are applied after
// these defaults.
func Connect(url, name string, log hclog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	all := []nats.Option{
		nats.Name(name),
		nats.Timeout(DefaultConnectTimeout),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.PingInterval(pingInterval),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // our own Close; ClosedHandler logs it
			}
			log.Warn("nats disconnected", "error", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ReconnectErrHandler(func(nc *nats.Conn, err error) {
			log.Debug("nats reconnect attempt failed", "error", err)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			log.Debug("nats connection closed")
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("nats error", "subject", sub.Subject, "error", err)
				return
			}
			log.Error("nats error", "error", err)
		}),
	}
	nc, err := nats.Connect(url, append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("control: connect to nats %s: %w", url, err)
	}
	log.Debug("nats connected", "url", nc.ConnectedUrlRedacted())
	return nc, nil
}

// reconnectDelay doubles from reconnectMin to reconnectMax with ±20%
// jitter, so that many processes do not reconnect in step.
func reconnectDelay(attempts int) time.Duration {
	d := reconnectMax
	if attempts < 16 {
		d = min(reconnectMin<<max(attempts-1, 0), reconnectMax)
	}
	return d + time.Duration((rand.Float64()-0.5)*0.4*float64(d))
}
