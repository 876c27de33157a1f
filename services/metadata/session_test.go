package metadata

import (
	"testing"

	"github.com/weir-storage/weir/internal/wire"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// The wire's "leave this time alone" value is the namespace's, passed
// through unchanged.
func TestTimeOmitMatches(t *testing.T) {
	if wire.TimeOmit != ns.TimeOmit {
		t.Fatalf("wire.TimeOmit %d != ns.TimeOmit %d", int64(wire.TimeOmit), int64(ns.TimeOmit))
	}
}
