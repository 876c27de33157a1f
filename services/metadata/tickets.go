package metadata

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"syscall"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Reopen tickets. An open with FeatureReopen returns a ticket that lets the
// same uid open the same inode again, with the same flags, after this
// service restarted, without looking the path up again: the file may have
// been renamed or unlinked since it was opened, and an open file
// descriptor keeps working through both. The ticket is not a capability a
// client could forge: it carries a MAC made with the namespace's ticket
// key, which only the service user can read.
//
//	ticket (32 bytes)
//	  0 u64 ino    8 u32 open flags   12 u32 uid   16 [16]byte MAC
//
// MAC = HMAC-SHA256(key, "weir-ticket-v1" || bytes 0..16)[:16].

const ticketDomain = "weir-ticket-v1"

// ticketFlags are the open flags a ticket keeps: what the reopened handle
// does (access mode, append, sync); creating and truncating are not
// repeated.
const ticketFlags = syscall.O_ACCMODE | syscall.O_APPEND | syscall.O_SYNC | syscall.O_DSYNC | syscall.O_DIRECTORY

func (s *Service) ticket(ino ns.Ino, flags int, uid uint32) proto.Ticket {
	var t proto.Ticket
	binary.LittleEndian.PutUint64(t[0:], uint64(ino))
	binary.LittleEndian.PutUint32(t[8:], uint32(flags)&ticketFlags)
	binary.LittleEndian.PutUint32(t[12:], uid)
	copy(t[16:], s.ticketMAC(t[:16]))
	return t
}

func (s *Service) ticketMAC(fields []byte) []byte {
	m := hmac.New(sha256.New, s.key[:])
	m.Write([]byte(ticketDomain))
	m.Write(fields)
	return m.Sum(nil)[:16]
}

// checkTicket returns what t names if it is genuine and was issued to uid.
func (s *Service) checkTicket(t proto.Ticket, uid uint32) (ino ns.Ino, flags int, ok bool) {
	if !hmac.Equal(t[16:], s.ticketMAC(t[:16])) {
		return 0, 0, false
	}
	if binary.LittleEndian.Uint32(t[12:]) != uid {
		return 0, 0, false
	}
	return ns.Ino(binary.LittleEndian.Uint64(t[0:])), int(binary.LittleEndian.Uint32(t[8:])), true
}
