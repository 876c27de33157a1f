package metadata

import (
	"os"
	"syscall"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// Cuts recorded before io makes them (proto.FeatureRecordCuts).
//
// Without a staging log (io.staging_size = 0) io cuts a blob at an
// OpTruncate and tells this service the size only at the file's next
// fsync or close, or when the two resynchronise; the staging log is
// what otherwise makes a cut durable before it is made. A crash of
// this service, and then io's, in between left the namespace with the
// size before the cut over a blob that no longer holds it: stat said
// the old size, reads gave the new one, and fsck called the cut bytes
// lost. So a session granted the feature sends OpCut with the size
// before every OpTruncate, and a size below the one recorded is
// recorded first, durably (a WAL sync: a truncate without the log costs
// one, as an fsync does). A crash between the two then leaves a blob
// larger than the size recorded: its old bytes, which the next open
// takes (the blob is the truth for size, files.go grant), as a file
// system after a crash gives the file before the truncate or after it.
// A size at or above the one recorded needs nothing: the blob holds at
// least that much whenever the cut is made or not.
//
// The client sends it after the file's grant (whose answer records the
// blob's size as it is) and again before each try of the truncate; a
// grant of the file to another session between the two may still record
// the size before the cut. A client could only lower the size recorded
// for a file it has open for writing, which it may truncate anyway; io's
// own reports replace it at the file's next fsync, close or grant.

// cut serves OpCut: q.Handle a handle open for writing, q.Offset the size.
func (se *session) cut(q *ring.Request) (int64, uint64) {
	s := se.svc
	h := se.handles[q.Handle]
	if h == nil {
		return se.errno(syscall.EBADF)
	}
	if h.dir || h.flags&(os.O_WRONLY|os.O_RDWR) == 0 || int64(q.Offset) < 0 {
		return se.errno(syscall.EINVAL) // as ftruncate of such a descriptor
	}
	if se.features&proto.FeatureRecordCuts == 0 {
		return 0, 0 // io's staging log makes the cut durable
	}
	size := int64(q.Offset)
	a, err := s.ns.GetAttr(h.ino)
	if err != nil {
		return se.errno(err)
	}
	if size >= a.Size {
		return 0, 0
	}
	if err := s.ns.SetLive(h.ino, size, time.Now().UnixNano()); err != nil {
		return se.errno(err)
	}
	if err := s.ns.Sync(); err != nil {
		return se.errno(err)
	}
	s.Stats.CutsRecorded.Add(1)
	return 0, 0
}
