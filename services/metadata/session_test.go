package metadata

import (
	"testing"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// The wire's "leave this time alone" value is the namespace's, passed
// through unchanged.
func TestTimeOmitMatches(t *testing.T) {
	if proto.TimeOmit != ns.TimeOmit {
		t.Fatalf("proto.TimeOmit %d != ns.TimeOmit %d", int64(proto.TimeOmit), int64(ns.TimeOmit))
	}
}
