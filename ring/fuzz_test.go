package ring

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"syscall"
	"testing"
	"time"
)

// FuzzDecodeHeader: any bytes, any mapping size. A header that decodes must
// describe a layout that fits the mapping without overlaps.
func FuzzDecodeHeader(f *testing.F) {
	g, _ := NewGeometry(DefaultConfig())
	b := make([]byte, headerFixedLen)
	encodeHeader(b, g)
	f.Add(b, g.TotalSize)
	g2, _ := NewGeometry(Config{SQEntries: 2, CQEntries: 4, ArenaSize: 4096, BlockSize: 64})
	b2 := make([]byte, headerFixedLen)
	encodeHeader(b2, g2)
	f.Add(b2, g2.TotalSize)
	f.Add([]byte{}, uint64(0))
	f.Fuzz(func(t *testing.T, hdr []byte, mapped uint64) {
		g, err := DecodeHeader(hdr, mapped)
		if err != nil {
			return
		}
		if g.TotalSize != mapped {
			t.Fatalf("decoded size %d for mapping %d", g.TotalSize, mapped)
		}
		end := func(off, n uint64) uint64 {
			e, carry := bits.Add64(off, n, 0)
			if carry != 0 {
				t.Fatalf("accepted a layout whose end wraps: %+v", g)
			}
			return e
		}
		sqEnd := end(g.SQOffset, uint64(g.SQEntries)*SQSlotSize)
		cqEnd := end(g.CQOffset, uint64(g.CQEntries)*CQSlotSize)
		arenaEnd := end(g.ArenaOffset, g.ArenaSize)
		if g.SQOffset < HeaderSize || sqEnd > g.CQOffset || cqEnd > g.ArenaOffset ||
			arenaEnd > mapped || g.ArenaSize >= MaxArenaSize {
			t.Fatalf("accepted overlapping or oversized layout %+v", g)
		}
	})
}

// FuzzValidateDescriptor: any slot bytes and any arena contents (which hold
// an indirect table). A descriptor that validates must yield segments inside
// the arena, aligned, non-empty, at most MaxSegments, summing to Length.
func FuzzValidateDescriptor(f *testing.F) {
	g, _ := NewGeometry(Config{SQEntries: 8, ArenaSize: 64 << 10, BlockSize: 4096})
	slot := make([]byte, SQSlotSize)
	d := Descriptor{Opcode: OpEcho, NSeg: 2, Length: 8192, ReqID: 1}
	d.Inline[0] = Segment{0, 4096}
	d.Inline[1] = Segment{8192, 4096}
	encodeDescriptor(slot, &d)
	f.Add(slot, []byte{})
	ind := Descriptor{Opcode: OpEcho, Flags: FlagIndirect, NSeg: 2, Length: 24}
	ind.Inline[0] = Segment{0, 16}
	encodeDescriptor(slot, &ind)
	tbl := make([]byte, 16)
	binary.LittleEndian.PutUint32(tbl[0:], 4096)
	binary.LittleEndian.PutUint32(tbl[4:], 16)
	binary.LittleEndian.PutUint32(tbl[8:], 8192)
	binary.LittleEndian.PutUint32(tbl[12:], 8)
	f.Add(slot, tbl)
	f.Fuzz(func(t *testing.T, slot []byte, arenaPrefix []byte) {
		d, ok := DecodeDescriptor(slot)
		if !ok {
			return
		}
		arena := make([]byte, g.ArenaSize)
		copy(arena, arenaPrefix)
		read := func(off, n uint32) []byte {
			if uint64(off)+uint64(n) > uint64(len(arena)) {
				t.Fatalf("readTable(%d, %d) outside the arena", off, n)
			}
			return arena[off : off+n]
		}
		known := func(op uint8) bool { return op == OpNop || op == OpEcho }
		segs, e := ValidateDescriptor(&d, &g, read, known, nil)
		if e != 0 {
			switch e {
			case syscall.ENOSYS, syscall.EINVAL, syscall.E2BIG, syscall.EFAULT:
			default:
				t.Fatalf("unexpected errno %v", e)
			}
			return
		}
		if len(segs) != int(d.NSeg) || len(segs) > MaxSegments {
			t.Fatalf("%d segments for NSeg %d", len(segs), d.NSeg)
		}
		var total uint64
		for _, s := range segs {
			if s.Len == 0 || s.Off%SegAlign != 0 || uint64(s.Off)+uint64(s.Len) > g.ArenaSize {
				t.Fatalf("bad segment accepted: %+v", s)
			}
			total += uint64(s.Len)
		}
		if total != d.Length {
			t.Fatalf("segments sum to %d, Length %d", total, d.Length)
		}
	})
}

// FuzzServerSlot feeds arbitrary bytes to a live server session as the next
// submission (its sequence word forged ready). The session must answer with
// a completion for that request id, or declare the session damaged; it must
// never panic.
func FuzzServerSlot(f *testing.F) {
	slot := make([]byte, SQSlotSize)
	d := Descriptor{Opcode: OpEcho, NSeg: 1, Length: 100, ReqID: 9}
	d.Inline[0] = Segment{4096, 100}
	encodeDescriptor(slot, &d)
	f.Add(slot)
	f.Add(make([]byte, SQSlotSize))
	r, err := Create(Config{SQEntries: 4, ArenaSize: 64 << 10, BlockSize: 4096})
	if err != nil {
		f.Fatal(err)
	}
	s := NewServerSession(r, newTestHandler(), WaitBusyPoll)
	f.Cleanup(s.Close)
	clientCQ := newCQ(r)
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > SQSlotSize {
			body = body[:SQSlotSize]
		}
		pos := s.sq.pos.Load()
		off := r.sqSlot(pos)
		clear(r.mem[off+8 : off+SQSlotSize])
		copy(r.mem[off+8:off+SQSlotSize], body[min(len(body), 8):])
		// The test opcodes that block or sleep are not for fuzzing.
		if op := r.mem[off+sqOffOpcode]; op == opBlock || op == opSleep || op == opAsyncPark {
			r.mem[off+sqOffOpcode] = OpNop
		}
		want, _ := DecodeDescriptor(r.mem[off : off+SQSlotSize])
		r.store64(off, pos+1)
		n, err := s.Poll(1)
		if err != nil {
			if !errors.Is(err, ErrDamaged) {
				t.Fatalf("Poll: %v", err)
			}
			return
		}
		if n != 1 {
			t.Fatalf("Poll took %d requests", n)
		}
		// An async request (opAsyncXor) completes on its own goroutine.
		for s.inflight.Load() != 0 {
			time.Sleep(10 * time.Microsecond)
		}
		cpos, coff, ok, err := clientCQ.claimConsume()
		if !ok || err != nil {
			t.Fatalf("no completion: %v", err)
		}
		c := decodeCompletion(r.mem[coff : coff+CQSlotSize])
		clientCQ.recycle(cpos, coff)
		if c.ReqID != want.ReqID {
			t.Fatalf("completion for %d, want %d", c.ReqID, want.ReqID)
		}
	})
}
