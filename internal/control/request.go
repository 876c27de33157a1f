package control

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Request sends msg as JSON on subj and decodes the JSON reply into reply.
// Control messages are small and rare; JSON keeps them readable on the wire.
func Request(nc *nats.Conn, subj string, msg, reply any, timeout time.Duration) error {
	data, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	m, err := nc.Request(subj, data, timeout)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	if err := json.Unmarshal(m.Data, reply); err != nil {
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
