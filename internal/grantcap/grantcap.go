// Package grantcap makes and checks read-grant capabilities: what lets a
// client claim a read grant at the IO service itself (proto.OpClaim), with
// no control-plane message between the services.
//
// The metadata service decides the grant as before (the open's permission
// check, the session's kept lease) and, instead of asking io over NATS,
// mints a capability for it with the key io gave it in the last resync
// (control.ResyncReply.CapKey): io makes a new random key at every resync,
// so a capability of an earlier io epoch fails its MAC and is worth
// nothing. The client cannot forge one (it never sees the key: NATS is
// the services' only) and cannot use another session's: io checks the
// session it names against the one its ring is attached to.
//
// Capability (CapSize = 64 bytes, little-endian), opaque to the client:
//
//	 0  u64 session    the metadata session it was minted for
//	 8  u64 handle     the handle id io will know the grant by (a kept lease's id)
//	16  u64 blob       the file's blob (= inode number)
//	24  u64 ver        the file's version of this grant (control.Grant.Ver)
//	32  u32 access     1 = read (handle: the grant's), 2 = direct open
//	                   (handle 0, ver: the directory generation; the
//	                   entry of an OpDirLease snapshot, claimed with
//	                   OpClaimDir)
//	36  u32 zero
//	40  [24]byte MAC   HMAC-SHA256(key, "weir-cap-v1" || bytes 0..40)[:24]
package grantcap

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"sync"
)

// Size is a capability's length in bytes (proto.CapSize).
const Size = 64

// KeySize is the length of a capability key.
const KeySize = 32

// Accesses a capability grants: AccessRead a read grant metadata made,
// AccessDirOpen a read-only open io makes itself, good while the
// directory generation it names is io's (proto.FeatureDirOpen).
const (
	AccessRead    = 1
	AccessDirOpen = 2
)

const domain = "weir-cap-v1"

// Cap is what a capability says.
type Cap struct {
	Session, Handle, Blob, Ver uint64
	Access                     uint32
}

// Key mints and checks capabilities with one key. Safe for concurrent use.
type Key struct {
	key  []byte
	macs sync.Pool // keyed HMAC states: making one costs most of a microsecond
}

// NewKey returns a Key for k, which must be KeySize bytes.
func NewKey(k []byte) (*Key, error) {
	if len(k) != KeySize {
		return nil, errors.New("grantcap: key is not 32 bytes")
	}
	return &Key{key: append([]byte(nil), k...)}, nil
}

func (k *Key) mac(b *[Size]byte) [24]byte {
	m, _ := k.macs.Get().(hash.Hash)
	if m == nil {
		m = hmac.New(sha256.New, k.key)
	}
	m.Reset()
	m.Write([]byte(domain))
	m.Write(b[:40])
	var sum [sha256.Size]byte
	m.Sum(sum[:0])
	k.macs.Put(m)
	return [24]byte(sum[:24])
}

// Mint returns the capability for c.
func (k *Key) Mint(c Cap) [Size]byte {
	var b [Size]byte
	le := binary.LittleEndian
	le.PutUint64(b[0:], c.Session)
	le.PutUint64(b[8:], c.Handle)
	le.PutUint64(b[16:], c.Blob)
	le.PutUint64(b[24:], c.Ver)
	le.PutUint32(b[32:], c.Access)
	mac := k.mac(&b)
	copy(b[40:], mac[:])
	return b
}

// ErrForged: the bytes are not a capability made with this key (another
// io epoch's, or made up).
var ErrForged = errors.New("grantcap: not a capability of this key")

// Check returns what b says if it was minted with this key.
func (k *Key) Check(b []byte) (Cap, error) {
	if len(b) != Size {
		return Cap{}, ErrForged
	}
	a := [Size]byte(b)
	want := k.mac(&a)
	if !hmac.Equal(a[40:], want[:]) {
		return Cap{}, ErrForged
	}
	le := binary.LittleEndian
	c := Cap{Session: le.Uint64(a[0:]), Handle: le.Uint64(a[8:]), Blob: le.Uint64(a[16:]), Ver: le.Uint64(a[24:]), Access: le.Uint32(a[32:])}
	if (c.Access != AccessRead && c.Access != AccessDirOpen) || le.Uint32(a[36:]) != 0 {
		return Cap{}, ErrForged // never minted: a MAC collision or a bug
	}
	return c, nil
}
