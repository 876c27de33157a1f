package metadata

import (
	"testing"

	"github.com/weir-storage/weir/services/metadata/ns"
)

// leaseService is a Service with what the lease table touches: the open
// files, and an io link in epoch (no NATS: nothing here sends to io).
func leaseService(epoch uint64) *Service {
	s := &Service{files: map[ns.Ino]*openFile{}, closedDV: map[ns.Ino]closedDV{}, leases: newLeaseTable()}
	s.io.epoch, s.io.conn = epoch, true
	return s
}

// TestLeaseReplacesAVoidOne: after an io restart (a new epoch), the grant
// that replaces a session's void lease of a file is the session's lease
// of it, in the table, counted once, and reused by the next open; its end
// at the session's end leaves nothing behind (review finding: it went
// into a map the drop of the void one had taken out of the table).
func TestLeaseReplacesAVoidOne(t *testing.T) {
	s := leaseService(1)
	se := &session{svc: s, id: 7}
	h := &handle{ino: 5, blob: 5, grantEpoch: 1}
	se.keepLease(100, h)
	se.closeLeased(h) // idle, of epoch 1
	if n := s.leases.count(); n != 1 {
		t.Fatalf("%d leases after the first, want 1", n)
	}
	s.io.epoch = 2 // io restarted: the lease is void
	if l := s.useLease(se.id, 5); l != nil {
		t.Fatalf("a void lease was used: %+v", l)
	}
	if n := s.leases.count(); n != 0 {
		t.Fatalf("%d leases once the void one is found, want 0", n)
	}
	// The same, through keepLease: the void one is still there when the
	// new grant is kept.
	se.keepLease(100, h)
	se.closeLeased(h)
	s.io.epoch = 3
	h2 := &handle{ino: 5, blob: 5, grantEpoch: 3}
	se.keepLease(200, h2)
	if h2.lease == nil || s.leases.byIno[5][se.id] != h2.lease || s.leases.count() != 1 {
		t.Fatalf("the new lease: handle's %+v, table %+v, count %d", h2.lease, s.leases.byIno[5], s.leases.count())
	}
	se.closeLeased(h2)
	if l := s.useLease(se.id, 5); l == nil || l.id != 200 {
		t.Fatalf("the next open used %+v, want lease 200", l)
	}
	h3 := &handle{ino: 5, lease: s.leases.byIno[5][se.id]}
	se.closeLeased(h3)
	s.io.epoch = 0 // io down: ending sends nothing
	s.endLeasesOf(se.id)
	if n := s.leases.count(); n != 0 || len(s.leases.byIno) != 0 || len(s.files) != 0 {
		t.Fatalf("after the session's end: %d leases, table %v, %d open files", n, s.leases.byIno, len(s.files))
	}
}
