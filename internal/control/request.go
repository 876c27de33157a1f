package control

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Request sends msg as JSON on subj and decodes the JSON reply into reply.
// Control messages are small and rare; JSON keeps them readable on the wire.
func Request(nc *nats.Conn, subj string, msg, reply any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return RequestContext(ctx, nc, subj, msg, reply)
}

// RequestContext is Request bounded by ctx: a caller that learns the
// responder is gone cancels ctx and the request fails at once.
func RequestContext(ctx context.Context, nc *nats.Conn, subj string, msg, reply any) error {
	data, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	m, err := nc.RequestWithContext(ctx, subj, data)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	if err := Decode(m.Data, reply); err != nil {
		return fmt.Errorf("%s: bad reply: %w", subj, err)
	}
	return nil
}

// Respond answers a request with v as JSON. A lost reply is the
// requester's timeout.
func Respond(m *nats.Msg, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		return
	}
	_ = m.Respond(data)
}
