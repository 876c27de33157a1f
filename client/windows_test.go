package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
)

// TestWriteWindows: a client's stores into a write window (OpWritePin)
// reach the file only through the bits it sets in its write log: io turns
// them into dirty pages at the file's next O_DIRECT read (and fsync,
// write-back pass, unpin, session end), so an O_DIRECT read of another
// session sees a logged store and not an unlogged one. The log is
// hostile memory: bits of slots with no window, or past the file's end,
// are ignored, the log cannot be resized or sealed, and every misuse of
// the operations is an errno.
func TestWriteWindows(t *testing.T) {
	const wbytes = proto.WindowPages * 4096
	fsys, st := newFS(t)
	size := wbytes + wbytes/2 // the second window half past the end
	f, _ := mappedFile(t, fsys, "win", size)
	ro, err := fsys.OpenFile("win", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	errno := func(name string, f *client.File, op uint8, arg uint32, off uint64, want syscall.Errno) {
		t.Helper()
		if res, _, err := client.IOCall(f, op, arg, off, false); err != nil || res != -int64(want) {
			t.Fatalf("%s: %d, %v, want %v", name, res, err, want)
		}
	}
	errno("OpWritePin before OpWriteLog", f, proto.OpWritePin, 0, 0, syscall.EINVAL)
	_, lf, err := client.IOCall(f, proto.OpWriteLog, 0, 0, true)
	if err != nil || lf == nil {
		t.Fatalf("OpWriteLog: %v", err)
	}
	defer lf.Close()
	if fi, err := lf.Stat(); err != nil || fi.Size() != proto.WriteLogSize {
		t.Fatalf("the write log's size: %v, %v", fi, err)
	}
	if err := lf.Truncate(0); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("shrinking the write log: %v, want EPERM", err)
	}
	if err := lf.Truncate(1 << 20); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("growing the write log: %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(lf.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("sealing the write log: %v, want EPERM", err)
	}
	log, err := unix.Mmap(int(lf.Fd()), 0, proto.WriteLogSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(log)

	errno("OpWritePin of a read-only handle", ro, proto.OpWritePin, 0, 0, syscall.EBADF)
	errno("OpWritePin of slot 256", f, proto.OpWritePin, proto.WriteLogSlots, 0, syscall.EINVAL)
	errno("OpWritePin of an unaligned window", f, proto.OpWritePin, 0, 4096, syscall.EINVAL)
	errno("OpWritePin past the largest file", f, proto.OpWritePin, 0, 1<<62, syscall.EINVAL)
	errno("OpWriteUnpin of a free slot", f, proto.OpWriteUnpin, 3, 0, syscall.EINVAL)
	errno("OpWriteUnpin of slot 1000", f, proto.OpWriteUnpin, 1000, 0, syscall.EINVAL)
	for slot, off := range []uint64{0, wbytes} {
		errno("OpWritePin", f, proto.OpWritePin, uint32(slot), off, 0)
	}
	errno("OpWritePin of a slot in use", f, proto.OpWritePin, 0, 2*wbytes, syscall.EBUSY)

	_, rw, err := client.IOCall(f, proto.OpMapWritable, 0, 0, true)
	if err != nil || rw == nil {
		t.Fatalf("OpMapWritable: %v", err)
	}
	defer rw.Close()
	data, err := unix.Mmap(int(rw.Fd()), 0, 2*wbytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(data)
	// Another session's O_DIRECT reads read the device after a drain; the
	// first, of the whole file, writes its dirty pages home, so that what
	// is dirty after is what a drain made dirty.
	other, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	dir, err := other.OpenFile("win", os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	page := func(at int64) []byte {
		t.Helper()
		b := make([]byte, 4096)
		if _, err := dir.ReadAt(b, at); err != nil {
			t.Fatalf("O_DIRECT read at %d: %v", at, err)
		}
		return b
	}
	if _, err := dir.ReadAt(make([]byte, size), 0); err != nil {
		t.Fatal(err)
	}
	setBit := func(slot, page int) {
		w := log[slot*proto.WriteSlotBytes+page/64*8:]
		binary.LittleEndian.PutUint64(w, binary.LittleEndian.Uint64(w)|1<<(page%64))
	}
	// Page 3: stored and logged. Page 9: stored, not logged. Page 10 of
	// the second window (inside the file): logged in slot 1.
	copy(data[3*4096+100:], "LOGGED")
	setBit(0, 3)
	copy(data[9*4096+100:], "UNLOGGED")
	copy(data[wbytes+10*4096:], "SECOND")
	setBit(1, 10)
	// Hostile bits: a slot with no window, and every page of slot 1's
	// window past the file's end.
	for i := range proto.WriteSlotBytes {
		log[7*proto.WriteSlotBytes+i] = 0xff
	}
	for p := proto.WindowPages / 2; p < proto.WindowPages; p++ {
		setBit(1, p)
	}
	orig := bytes.Repeat([]byte("weir"), 1024)
	if got := page(3 * 4096); string(got[100:106]) != "LOGGED" {
		t.Fatalf("O_DIRECT read of a logged store: %q", got[100:106])
	}
	if got := page(9 * 4096); !bytes.Equal(got, orig) {
		t.Fatalf("O_DIRECT read of an unlogged store: %q, want the file's old bytes", got[100:108])
	}
	if got := page(wbytes + 10*4096); string(got[:6]) != "SECOND" {
		t.Fatalf("O_DIRECT read of slot 1's store: %q", got[:6])
	}
	for i := range proto.WriteSlotBytes {
		if log[i] != 0 || log[proto.WriteSlotBytes+i] != 0 {
			t.Fatalf("the drained slots hold bits still: byte %d", i)
		}
		if log[7*proto.WriteSlotBytes+i] != 0xff {
			t.Fatal("io touched the bits of a slot with no window")
		}
	}
	if fi, err := ro.Stat(); err != nil || fi.Size() != int64(size) {
		t.Fatalf("bits past the end changed the size: %v, %v", fi, err)
	}

	// The unpin drains: a store logged before it reaches the device.
	copy(data[20*4096:], "UNPINNED")
	setBit(0, 20)
	errno("OpWriteUnpin", f, proto.OpWriteUnpin, 0, 0, 0)
	errno("OpWriteUnpin again", f, proto.OpWriteUnpin, 0, 0, syscall.EINVAL)
	if got := page(20 * 4096); string(got[:8]) != "UNPINNED" {
		t.Fatalf("O_DIRECT read after the unpin: %q", got[:8])
	}
	// A freed slot takes a new window; the bits from before the pin are
	// cleared (they were no store into it).
	setBit(0, 30)
	errno("OpWritePin of the freed slot", f, proto.OpWritePin, 0, 0, 0)
	if binary.LittleEndian.Uint64(log) != 0 {
		t.Fatal("a new window's slot kept the bits from before its pin")
	}
	// The session's end drains: slot 1's store made just before.
	copy(data[wbytes+11*4096:], "SESSIONEND")
	setBit(1, 11)
	if err := fsys.Close(); err != nil {
		t.Fatal(err)
	}
	for range 200 {
		if got := page(wbytes + 11*4096); string(got[:10]) == "SESSIONEND" {
			return
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil) // the session's end is the service's, after the close
	}
	t.Fatal("a store logged before the session's end never reached the device")
}

// TestWindowsEndWithTheirGrant: a write window and a writable pin belong
// to the grant they were made through. When another trust group's write
// recalls it, io drains the window a last time (the store logged before
// the recall is in the file, under the recalled grant's blob), clears the
// slot's live word, frees the slot and stops draining it (a bit set
// after that is not taken: the client writes through the ring instead);
// the writable pin's pages become dirty and the pin read-only, until an
// OpMapSync of the writer's new grant takes it back.
func TestWindowsEndWithTheirGrant(t *testing.T) {
	const wbytes = proto.WindowPages * 4096
	st := groupStack(t, "session")
	a, b := dialStack(t, st), dialStack(t, st)
	f, _ := mappedFile(t, a, "win", wbytes)
	_, lf, err := client.IOCall(f, proto.OpWriteLog, 0, 0, true)
	if err != nil || lf == nil {
		t.Fatalf("OpWriteLog: %v", err)
	}
	defer lf.Close()
	log, err := unix.Mmap(int(lf.Fd()), 0, proto.WriteLogSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(log)
	live := func(slot int) uint64 {
		return binary.LittleEndian.Uint64(log[proto.WriteLogLiveOff+8*slot:])
	}
	if live(2) != 0 {
		t.Fatal("a free slot's live word is set")
	}
	if res, _, err := client.IOCall(f, proto.OpWritePin, 2, 0, false); err != nil || res != 0 {
		t.Fatalf("OpWritePin: %d, %v", res, err)
	}
	if live(2) != 1 {
		t.Fatalf("live word %d after the pin, want 1", live(2))
	}
	if res, _, err := client.IOCall(f, proto.OpMapPin, 16|proto.MapPinWritable, 64*4096, false); err != nil || res != 0 {
		t.Fatalf("writable OpMapPin: %d, %v", res, err)
	}
	_, rw, err := client.IOCall(f, proto.OpMapWritable, 0, 0, true)
	if err != nil || rw == nil {
		t.Fatalf("OpMapWritable: %v", err)
	}
	defer rw.Close()
	data, err := unix.Mmap(int(rw.Fd()), 0, wbytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(data)
	setBit := func(slot, page int) {
		w := log[slot*proto.WriteSlotBytes+page/64*8:]
		binary.LittleEndian.PutUint64(w, binary.LittleEndian.Uint64(w)|1<<(page%64))
	}
	copy(data[5*4096:], "BEFORE")
	setBit(2, 5)
	copy(data[64*4096:], "MAPPED")

	// Another trust group writes the file: a's grant is recalled.
	fb, err := b.OpenFile("win", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if _, err := fb.WriteAt([]byte("b"), wbytes-1); err != nil {
		t.Fatal(err)
	}
	if live(2) != 0 {
		t.Fatal("the window's live word is still set after its grant was recalled")
	}
	snap := st.IO.Snapshot()
	if snap["windows_ended"].(uint64) != 1 || snap["maps_demoted"].(uint64) != 1 {
		t.Fatalf("windows_ended %v, maps_demoted %v after the recall, want 1 and 1", snap["windows_ended"], snap["maps_demoted"])
	}
	// A bit set now is no longer drained (the slot is free: a new pin
	// clears it), and the slot takes a new window of a's new grant.
	copy(data[6*4096:], "AFTER!")
	setBit(2, 6)
	if err := fb.Sync(); err != nil {
		t.Fatal(err)
	}
	if w := binary.LittleEndian.Uint64(log[2*proto.WriteSlotBytes:]); w&(1<<6) == 0 {
		t.Fatal("io drained a bit of a window that ended")
	}
	// Both a's stores were made dirty (the window's by its last drain,
	// the mapping's by the pin's last dirtying): b's O_DIRECT reads, which
	// write the file's dirty pages home and then read the device, see
	// them (a store left in a clean page would not be on the device).
	dir, err := b.OpenFile("win", os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	direct := func(off int64) string {
		t.Helper()
		pg := make([]byte, 4096)
		if _, err := dir.ReadAt(pg, off); err != nil {
			t.Fatalf("O_DIRECT read at %d: %v", off, err)
		}
		return string(pg[:6])
	}
	for _, c := range []struct {
		off  int64
		want string
	}{{5 * 4096, "BEFORE"}, {64 * 4096, "MAPPED"}} {
		if got := direct(c.off); got != c.want {
			t.Fatalf("b's O_DIRECT read at %d: %q, want %q", c.off, got, c.want)
		}
	}
	// a's writable pin is read-only now: OpMapUnpin of a writable pin
	// takes it back once a's next grant writes; before that, OpMapSync of
	// the new grant promotes it.
	copy(data[65*4096:], "LATER!")
	if _, err := f.WriteAt([]byte("a"), 0); err != nil { // a's client takes a new grant (recalling b's)
		t.Fatal(err)
	}
	if res, _, err := client.IOCall(f, proto.OpMapSync, 1, 65*4096, false); err != nil || res != 0 {
		t.Fatalf("OpMapSync after the recall: %d, %v", res, err)
	}
	if res, _, err := client.IOCall(f, proto.OpMapUnpin, 16|proto.MapPinWritable, 64*4096, false); err != nil || res != 0 {
		t.Fatalf("OpMapUnpin of the promoted pin: %d, %v", res, err)
	}
	if got := direct(65 * 4096); got != "LATER!" {
		t.Fatalf("b's O_DIRECT read after a's msync: %q, want LATER!", got)
	}
	if _, err := f.WriteAt([]byte("a"), 0); err != nil { // (b's read recalled a's grant)
		t.Fatal(err)
	}
	if res, _, err := client.IOCall(f, proto.OpWritePin, 2, 0, false); err != nil || res != 0 {
		t.Fatalf("OpWritePin of the slot the recall freed: %d, %v", res, err)
	}
	if live(2) != 1 || binary.LittleEndian.Uint64(log[2*proto.WriteSlotBytes:]) != 0 {
		t.Fatal("the slot's new window: live word not set, or old bits kept")
	}
}

// TestDemotedMappingKeepsStores: stores a client makes through its
// writable mapping after another trust group recalled its grant (it
// cannot know) reach the file at the mapping's end, here its session's:
// the demoted pin keeps the blob and dirties its pages then.
func TestDemotedMappingKeepsStores(t *testing.T) {
	st := groupStack(t, "session")
	a, b := dialStack(t, st), dialStack(t, st)
	f, _ := mappedFile(t, a, "m", 64<<10)
	data := writableMapping(t, f, 16)
	fb, err := b.OpenFile("m", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if _, err := fb.WriteAt([]byte("b"), 0); err != nil { // recalls a's grant
		t.Fatal(err)
	}
	copy(data[3*4096:], "AFTER!")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	dir, err := b.OpenFile("m", os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	pg := make([]byte, 4096)
	for range 200 {
		if _, err := dir.ReadAt(pg, 3*4096); err != nil {
			t.Fatal(err)
		}
		if string(pg[:6]) == "AFTER!" {
			return
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil) // the session's end is the service's, after the close
	}
	t.Fatalf("a store through a demoted mapping never reached the device: %q", pg[:6])
}

// TestExtensionCoversPinnedPages: pages a writable mapping pins past the
// file's end become the file's, as zero pages, when a truncate extends
// the file over them, so that a store into them after the extension is
// made dirty by msync (OpMapSync) and reaches the device.
func TestExtensionCoversPinnedPages(t *testing.T) {
	fsys, st := newFS(t)
	f, err := fsys.Create("ext")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("head"), 0); err != nil {
		t.Fatal(err)
	}
	data := writableMapping(t, f, 4)
	if err := f.Truncate(4 * 4096); err != nil {
		t.Fatal(err)
	}
	copy(data[2*4096+10:], "EXTENDED")
	if res, _, err := client.IOCall(f, proto.OpMapSync, 4, 0, false); err != nil || res != 0 {
		t.Fatalf("OpMapSync: %d, %v", res, err)
	}
	other, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	dir, err := other.OpenFile("ext", os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	pg := make([]byte, 4096)
	if _, err := dir.ReadAt(pg, 2*4096); err != nil {
		t.Fatal(err)
	}
	if string(pg[10:18]) != "EXTENDED" || !allZeros(pg[:10]) || !allZeros(pg[18:]) {
		t.Fatalf("O_DIRECT read of a page the extension brought in: %q", bytes.Trim(pg, "\x00"))
	}
}
