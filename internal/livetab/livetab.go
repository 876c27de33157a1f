// Package livetab is the IO service's table of live file sizes, in
// shared memory that the metadata service maps read-only: a stat of a
// file some session holds open for writing reads the size and mtime io
// serves from it, with no control-plane round trip (issue 13's stat row).
//
// The table is a file in the data directory (which only the service user
// may enter) that io makes anew at every start, with a random id it
// sends in every resync reply (control.ResyncReply.LiveTable); metadata
// maps the file of that id and uses it only while that io epoch lasts
// (the frozen table of an io that died is read only until metadata
// notices the death).
//
// Layout (little-endian; all fields naturally aligned):
//
//	header, HeaderSize (64) bytes:
//	 0  u64 magic "WEIRLIVE"    8  u32 version (1)   12  u32 slots
//	16  u64 id                 24..63 zero
//	slot i at HeaderSize + i*SlotSize, SlotSize (32) bytes:
//	 0  u32 seq (odd while io writes the slot)   4  u32 flags (bit 0: wrote)
//	 8  u64 blob (0: free)   16  i64 size   24  i64 mtime (ns)
//
// A blob's slot is blob % slots (direct-mapped): an open blob whose slot
// another open blob holds has none, and its stat asks io over the control
// plane as before. io publishes a slot after every change of its blob
// (before the change's request completes), so a reader that sees the blob
// in its slot reads a size at least as new as every write that returned.
// Writers of one slot take turns on seq (a seqlock); readers retry a torn
// read a bounded number of times, then give up (the caller asks io).
package livetab

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	HeaderSize = 64
	SlotSize   = 32
	Version    = 1
	// DefaultSlots: 64 Ki slots, 2 MiB of table.
	DefaultSlots = 1 << 16
	// MaxSlots bounds what a header may claim.
	MaxSlots = 1 << 22

	flagWrote = 1
	// readTries bounds a reader's retries of a torn slot.
	readTries = 64
)

var magic = [8]byte{'W', 'E', 'I', 'R', 'L', 'I', 'V', 'E'}

// Table is a mapped live table.
type Table struct {
	mem   []byte
	slots uint32
	id    uint64

	mu     sync.Mutex
	owners map[uint32]uint64 // io's side: the blob holding each taken slot; protected by mu
}

// Create makes the table file at path anew (any old one is replaced: its
// readers keep the old inode) with slots slots and a random id, mapped
// read-write.
func Create(path string, slots uint32) (*Table, error) {
	if slots == 0 || slots > MaxSlots {
		return nil, fmt.Errorf("live table: %d slots (1 to %d)", slots, MaxSlots)
	}
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, fmt.Errorf("live table id: %w", err)
	}
	id := binary.LittleEndian.Uint64(idb[:]) | 1 // never 0: 0 means no table
	tmp := path + ".new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("live table: %w", err)
	}
	defer f.Close()
	size := HeaderSize + int64(slots)*SlotSize
	if err := f.Truncate(size); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("live table: %w", err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("live table: map %s: %w", tmp, err)
	}
	copy(mem[0:8], magic[:])
	binary.LittleEndian.PutUint32(mem[8:], Version)
	binary.LittleEndian.PutUint32(mem[12:], slots)
	binary.LittleEndian.PutUint64(mem[16:], id)
	if err := os.Rename(tmp, path); err != nil {
		_ = unix.Munmap(mem)
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("live table: %w", err)
	}
	return &Table{mem: mem, slots: slots, id: id, owners: map[uint32]uint64{}}, nil
}

// Open maps the table file at path read-only, if it is the table of id.
func Open(path string, id uint64) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("live table: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("live table: %w", err)
	}
	if st.Size() < HeaderSize || st.Size() > HeaderSize+MaxSlots*SlotSize {
		return nil, fmt.Errorf("live table %s: %d bytes: %w", path, st.Size(), errNotTable)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("live table: map %s: %w", path, err)
	}
	slots := binary.LittleEndian.Uint32(mem[12:])
	switch {
	case [8]byte(mem[0:8]) != magic || binary.LittleEndian.Uint32(mem[8:]) != Version:
		err = errNotTable
	case slots == 0 || int64(slots) > (st.Size()-HeaderSize)/SlotSize:
		err = errNotTable
	case binary.LittleEndian.Uint64(mem[16:]) != id:
		err = ErrOtherTable
	}
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("live table %s: %w", path, err)
	}
	return &Table{mem: mem, slots: slots, id: id}, nil
}

var errNotTable = errors.New("not a live table of this version")

// ErrOtherTable: the file is another table than the one asked for (io
// restarted since).
var ErrOtherTable = errors.New("the file is another IO service's table")

// ID returns the table's id.
func (t *Table) ID() uint64 { return t.id }

// Close unmaps the table. No call may run on it meanwhile or after.
func (t *Table) Close() error { return unix.Munmap(t.mem) }

// Take gives blob its slot and publishes its first values; false if
// another blob holds the slot. io calls it when it opens the blob.
func (t *Table) Take(blob uint64, size, mtime int64, wrote bool) (slot uint32, ok bool) {
	if blob == 0 {
		return 0, false
	}
	slot = uint32(blob % uint64(t.slots))
	t.mu.Lock()
	if _, taken := t.owners[slot]; taken {
		t.mu.Unlock()
		return 0, false
	}
	t.owners[slot] = blob
	t.mu.Unlock()
	t.Publish(slot, blob, size, mtime, wrote)
	return slot, true
}

// Release frees blob's slot (io closed the blob).
func (t *Table) Release(slot uint32, blob uint64) {
	t.mu.Lock()
	if t.owners[slot] != blob {
		t.mu.Unlock()
		return
	}
	delete(t.owners, slot)
	t.mu.Unlock()
	t.write(slot, 0, func() (int64, int64, uint32) { return 0, 0, 0 })
}

// Publish records blob's live size and mtime in its slot.
func (t *Table) Publish(slot uint32, blob uint64, size, mtime int64, wrote bool) {
	t.PublishFrom(slot, blob, func() (int64, int64, bool) { return size, mtime, wrote })
}

// PublishFrom records in blob's slot the live size, mtime and wrote
// that live returns, called with the slot's seqlock held: concurrent
// publishers of one blob that each call it after their change leave the
// newest values in the slot, whatever order they take the lock in.
func (t *Table) PublishFrom(slot uint32, blob uint64, live func() (size, mtime int64, wrote bool)) {
	t.write(slot, blob, func() (int64, int64, uint32) {
		size, mtime, wrote := live()
		var flags uint32
		if wrote {
			flags = flagWrote
		}
		return size, mtime, flags
	})
}

// Read returns blob's live size and mtime and whether it was written
// since io opened it; ok false if the blob has no slot (not open at io,
// or its slot taken by another) or the slot stayed torn.
func (t *Table) Read(blob uint64) (size, mtime int64, wrote, ok bool) {
	if blob == 0 {
		return 0, 0, false, false
	}
	slot := uint32(blob % uint64(t.slots))
	for range readTries {
		s1, b, flags, sz, mt, s2 := t.read(slot)
		if s1&1 != 0 || s1 != s2 {
			continue
		}
		if b != blob || sz < 0 {
			return 0, 0, false, false
		}
		return sz, mt, flags&flagWrote != 0, true
	}
	return 0, 0, false, false
}
