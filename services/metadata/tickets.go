package metadata

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"syscall"
	"time"

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
//	  0 u64 handle   the handle it was issued with (its incarnation in the top 24 bits)
//	  8 u64 ino      bits 0-47; bits 48-63: the open flags it keeps (ticketBits)
//	 16 u32 uid
//	 20 [12]byte MAC = HMAC-SHA256(key, "weir-ticket-v2" || bytes 0..20)[:12]
//
// A ticket outlives the handle it was issued for, so it is accepted only
// where it stands in for a handle a restart took away (checkTicket): it
// must come from the incarnation just before this one, within
// ReclaimGrace of this start, from the uid it was issued to, and once per
// handle (again only if the session that reopened it ended, as when the
// reply was lost with it); and a file that still has a name must still
// allow the access to a uid that is not its owner (ns.Reopen). What is
// left: a process that closed the handle shortly before a restart can
// reopen the file during the grace, if its mode still lets it (a path
// lookup might not, through a directory it can no longer search). The
// client reopens as soon as its session ends, well within the grace.

const ticketDomain = "weir-ticket-v2"

// ticketFlags are the open flags a ticket keeps (what the reopened handle
// does: access mode, append, sync; creating and truncating are not
// repeated); ticketBits gives each its bit in the ticket.
const ticketFlags = syscall.O_ACCMODE | syscall.O_APPEND | syscall.O_SYNC | syscall.O_DSYNC | syscall.O_DIRECTORY

var ticketBits = []struct {
	flag int
	bit  uint64
}{
	{syscall.O_WRONLY, 1 << 48},
	{syscall.O_RDWR, 1 << 49},
	{syscall.O_APPEND, 1 << 50},
	{syscall.O_SYNC, 1 << 51},
	{syscall.O_DSYNC, 1 << 52},
	{syscall.O_DIRECTORY, 1 << 53},
}

func (s *Service) ticket(handle uint64, ino ns.Ino, flags int, uid uint32) proto.Ticket {
	v := uint64(ino)
	for _, b := range ticketBits {
		if flags&b.flag == b.flag {
			v |= b.bit
		}
	}
	var t proto.Ticket
	binary.LittleEndian.PutUint64(t[0:], handle)
	binary.LittleEndian.PutUint64(t[8:], v)
	binary.LittleEndian.PutUint32(t[16:], uid)
	s.ticketMAC(&t)
	return t
}

// ticketMAC writes the MAC of a ticket's fields (its first 20 bytes) into
// its last 12. The keyed HMAC states are pooled: making one per open cost
// most of a microsecond.
func (s *Service) ticketMAC(t *proto.Ticket) {
	m, _ := s.macs.Get().(*ticketHMAC)
	if m == nil {
		m = &ticketHMAC{h: hmac.New(sha256.New, s.key[:])}
	}
	m.h.Reset()
	m.h.Write(ticketDomainBytes)
	m.h.Write(t[:20])
	copy(t[20:], m.h.Sum(m.sum[:0]))
	s.macs.Put(m)
}

// ticketHMAC is a pooled keyed HMAC state and room for its sum (which
// would otherwise escape to the heap at every open).
type ticketHMAC struct {
	h   hash.Hash
	sum [sha256.Size]byte
}

var ticketDomainBytes = []byte(ticketDomain)

// ticketRefusal says why a ticket is not accepted.
type ticketRefusal int

const (
	ticketOK      ticketRefusal = iota
	ticketForged                // not made with this namespace's key, or another uid's: EPERM
	ticketCurrent               // issued by this incarnation: the handle is still open, EPERM
	ticketLate                  // after the grace, or used already: ESTALE (the handle is gone)
)

// checkTicket returns what t names if session sid may reopen a file
// with it for uid now, and reserves the ticket for sid (releaseTicket
// gives it back if the reopen fails).
func (s *Service) checkTicket(t proto.Ticket, uid uint32, sid uint64) (handle uint64, ino ns.Ino, flags int, why ticketRefusal) {
	want := t
	s.ticketMAC(&want)
	if !hmac.Equal(t[20:], want[20:]) || binary.LittleEndian.Uint32(t[16:]) != uid {
		return 0, 0, 0, ticketForged
	}
	handle = binary.LittleEndian.Uint64(t[0:])
	switch inc := proto.IncarnationOf(handle); {
	case inc >= s.inc:
		return 0, 0, 0, ticketCurrent
	case inc != s.inc-1:
		return 0, 0, 0, ticketLate // of an incarnation before the last: its handles are long gone
	}
	s.mu.Lock()
	by, used := s.reopened[handle]
	late := (used && s.sessions[by] != nil) || s.reopened == nil || time.Since(s.started) > s.opts.ReclaimGrace
	if !late {
		s.reopened[handle] = sid
	}
	s.mu.Unlock()
	if late {
		return 0, 0, 0, ticketLate
	}
	ino, flags = ticketFields(binary.LittleEndian.Uint64(t[8:]))
	return handle, ino, flags, ticketOK
}

// checkInheritTicket returns what t names if uid may inherit it
// (OpInherit): genuine, issued to uid, by this incarnation.
func (s *Service) checkInheritTicket(t proto.Ticket, uid uint32) (ino ns.Ino, flags int, ok bool) {
	want := t
	s.ticketMAC(&want)
	if !hmac.Equal(t[20:], want[20:]) || binary.LittleEndian.Uint32(t[16:]) != uid ||
		proto.IncarnationOf(binary.LittleEndian.Uint64(t[0:])) != s.inc {
		return 0, 0, false
	}
	ino, flags = ticketFields(binary.LittleEndian.Uint64(t[8:]))
	return ino, flags, true
}

// ticketFields decodes a ticket's second word.
func ticketFields(v uint64) (ino ns.Ino, flags int) {
	for _, b := range ticketBits {
		if v&b.bit != 0 {
			flags |= b.flag
		}
	}
	return ns.Ino(v & (1<<48 - 1)), flags
}

// releaseTicket gives back the ticket of handle that checkTicket reserved
// for a reopen that failed.
func (s *Service) releaseTicket(handle uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reopened != nil {
		delete(s.reopened, handle)
	}
}
