package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestNewGeometryDefaults(t *testing.T) {
	g, err := NewGeometry(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if g.SQEntries != 256 || g.CQEntries != 512 || g.BlockSize != 4096 || g.ArenaSize != 8<<20 {
		t.Fatalf("defaults: %+v", g)
	}
	if g.SQOffset != HeaderSize || g.CQOffset != HeaderSize+256*SQSlotSize ||
		g.ArenaOffset != g.CQOffset+512*CQSlotSize || g.TotalSize != g.ArenaOffset+g.ArenaSize {
		t.Fatalf("offsets: %+v", g)
	}
	if err := g.Validate(g.TotalSize); err != nil {
		t.Fatal(err)
	}
}

func TestNewGeometryRejects(t *testing.T) {
	for _, cfg := range []Config{
		{SQEntries: 3},
		{SQEntries: 1},
		{SQEntries: 1 << 17},
		{SQEntries: 64, CQEntries: 32},
		{BlockSize: 100},
		{BlockSize: 32},
		{ArenaSize: 1 << 32},
	} {
		if _, err := NewGeometry(cfg); err == nil {
			t.Errorf("NewGeometry(%+v) accepted", cfg)
		}
	}
}

func TestHeaderRoundTripAndRejects(t *testing.T) {
	g, _ := NewGeometry(Config{SQEntries: 8, ArenaSize: 64 << 10})
	b := make([]byte, HeaderSize)
	encodeHeader(b, g)
	got, err := DecodeHeader(b, g.TotalSize)
	if err != nil || got != g {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	mutate := []struct {
		name string
		off  int
		val  uint64
		w    int
	}{
		{"magic", offMagic, 1, 8},
		{"version", offVersion, 2, 4},
		{"header size", offHeaderSize, 8192, 4},
		{"features", offFeatures, 1 << 40, 8},
		{"sq entries", offSQEntries, 7, 4},
		{"cq entries", offCQEntries, 4, 4},
		{"sq slot", offSQSlotSize, 64, 4},
		{"cq slot", offCQSlotSize, 16, 4},
		{"block", offBlockSize, 48, 4},
		{"max segs", offMaxSegments, 0, 4},
		{"sq off", offSQOffset, 0, 8},
		{"cq off", offCQOffset, HeaderSize, 8},
		{"arena off", offArenaOffset, 1 << 62, 8},
		{"arena size", offArenaSize, 1 << 63, 8},
		{"total", offTotalSize, 12345, 8},
	}
	for _, m := range mutate {
		c := bytes.Clone(b)
		if m.w == 8 {
			binary.LittleEndian.PutUint64(c[m.off:], m.val)
		} else {
			binary.LittleEndian.PutUint32(c[m.off:], uint32(m.val))
		}
		if _, err := DecodeHeader(c, g.TotalSize); err == nil {
			t.Errorf("%s=%d accepted", m.name, m.val)
		}
	}
	if _, err := DecodeHeader(b, g.TotalSize+4096); err == nil {
		t.Error("size mismatch accepted")
	}
	if _, err := DecodeHeader(b[:20], g.TotalSize); err == nil {
		t.Error("short header accepted")
	}
}

func TestDescriptorRoundTrip(t *testing.T) {
	d := Descriptor{Opcode: 17, Flags: FlagIndirect, NSeg: 3, Arg: 0xdeadbeef, ReqID: 1<<40 | 5,
		Handle: 99, Offset: 5 << 32, Length: 12345}
	for i := range d.Inline {
		d.Inline[i] = Segment{Off: uint32(i * 8), Len: uint32(i + 1)}
	}
	b := make([]byte, SQSlotSize)
	encodeDescriptor(b, &d)
	got, ok := DecodeDescriptor(b)
	if !ok || got != d {
		t.Fatalf("round trip: %+v", got)
	}
	if _, ok := DecodeDescriptor(b[:SQSlotSize-1]); ok {
		t.Fatal("short slot decoded")
	}
	c := Completion{ReqID: 7, Result: -int64(syscall.EFAULT), Aux: 3}
	cb := make([]byte, CQSlotSize)
	encodeCompletion(cb, c)
	if decodeCompletion(cb) != c || !errors.Is(c.Err(), syscall.EFAULT) {
		t.Fatal("completion round trip")
	}
}

func TestValidateDescriptor(t *testing.T) {
	g, _ := NewGeometry(Config{SQEntries: 8, ArenaSize: 64 << 10})
	arena := make([]byte, g.ArenaSize)
	// An indirect table at offset 4096 listing three segments.
	tbl := []Segment{{0, 100}, {512, 8}, {65536 - 8, 8}}
	for i, s := range tbl {
		binary.LittleEndian.PutUint32(arena[4096+i*8:], s.Off)
		binary.LittleEndian.PutUint32(arena[4096+i*8+4:], s.Len)
	}
	read := func(off, n uint32) []byte { return bytes.Clone(arena[off : off+n]) }
	known := func(op uint8) bool { return op == OpEcho || op == 20 }
	seg := func(s ...Segment) (a [InlineSegs]Segment) { copy(a[:], s); return }
	cases := []struct {
		name string
		d    Descriptor
		want syscall.Errno
		segs int
	}{
		{"nop", Descriptor{Opcode: OpEcho}, 0, 0},
		{"opcode 0", Descriptor{Opcode: 0}, syscall.ENOSYS, 0},
		{"unknown opcode", Descriptor{Opcode: 99}, syscall.ENOSYS, 0},
		{"unknown flag", Descriptor{Opcode: 20, Flags: 0x80}, syscall.EINVAL, 0},
		{"one seg", Descriptor{Opcode: 20, NSeg: 1, Length: 4096, Inline: seg(Segment{0, 4096})}, 0, 1},
		{"length mismatch", Descriptor{Opcode: 20, NSeg: 1, Length: 4095, Inline: seg(Segment{0, 4096})}, syscall.EINVAL, 0},
		{"beyond arena", Descriptor{Opcode: 20, NSeg: 1, Length: 16, Inline: seg(Segment{65536 - 8, 16})}, syscall.EFAULT, 0},
		{"wraps", Descriptor{Opcode: 20, NSeg: 1, Length: 16, Inline: seg(Segment{0xfffffff8, 16})}, syscall.EFAULT, 0},
		{"unaligned", Descriptor{Opcode: 20, NSeg: 1, Length: 16, Inline: seg(Segment{4, 16})}, syscall.EFAULT, 0},
		{"empty seg", Descriptor{Opcode: 20, NSeg: 1, Length: 0, Inline: seg(Segment{0, 0})}, syscall.EFAULT, 0},
		{"too many inline", Descriptor{Opcode: 20, NSeg: InlineSegs + 1}, syscall.E2BIG, 0},
		{"too many", Descriptor{Opcode: 20, NSeg: MaxSegments + 1, Flags: FlagIndirect}, syscall.E2BIG, 0},
		{"indirect", Descriptor{Opcode: 20, Flags: FlagIndirect, NSeg: 3, Length: 116, Inline: seg(Segment{4096, 24})}, 0, 3},
		{"indirect bad len", Descriptor{Opcode: 20, Flags: FlagIndirect, NSeg: 3, Length: 116, Inline: seg(Segment{4096, 16})}, syscall.EFAULT, 0},
		{"indirect outside", Descriptor{Opcode: 20, Flags: FlagIndirect, NSeg: 3, Length: 116, Inline: seg(Segment{65536 - 16, 24})}, syscall.EFAULT, 0},
		{"indirect empty", Descriptor{Opcode: 20, Flags: FlagIndirect, NSeg: 0, Inline: seg(Segment{4096, 0})}, syscall.EFAULT, 0},
	}
	for _, c := range cases {
		segs, e := ValidateDescriptor(&c.d, &g, read, known, nil)
		if e != c.want || len(segs) != c.segs {
			t.Errorf("%s: errno %v segs %d, want %v %d", c.name, e, len(segs), c.want, c.segs)
		}
	}
	// An indirect table whose entries point outside the arena.
	binary.LittleEndian.PutUint32(arena[4096+8:], 1<<20)
	d := Descriptor{Opcode: 20, Flags: FlagIndirect, NSeg: 3, Length: 116, Inline: seg(Segment{4096, 24})}
	if _, e := ValidateDescriptor(&d, &g, read, known, nil); e != syscall.EFAULT {
		t.Errorf("indirect entry outside arena: %v", e)
	}
}

func TestRegionSealedAndAttach(t *testing.T) {
	r, err := Create(Config{SQEntries: 8, ArenaSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fd := int(r.File().Fd())
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if seals&want != want {
		t.Fatalf("seals %#x, want %#x", seals, want)
	}
	if err := unix.Ftruncate(fd, 4096); err == nil {
		t.Fatal("sealed memfd shrank")
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Attach(os.NewFile(uintptr(dup), "dup"))
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if r2.Geometry() != r.Geometry() {
		t.Fatal("attached geometry differs")
	}
	// A scribbled header is noticed by the creator.
	r2.mem[offArenaSize] ^= 0xff
	if r.HeaderIntact() {
		t.Fatal("header change not noticed")
	}
}

func TestAttachRejectsUnsealed(t *testing.T) {
	fd, err := unix.MemfdCreate("plain", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "plain")
	defer f.Close()
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := Attach(f); err == nil {
		t.Fatal("unsealed region attached")
	}
}

func TestHugePageRegion(t *testing.T) {
	r, err := Create(Config{SQEntries: 8, ArenaSize: 64 << 10, HugePages: true})
	if err != nil {
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSPC) {
			t.Skipf("no free 2 MiB huge pages for MFD_HUGETLB (reserve some: echo 64 > /proc/sys/vm/nr_hugepages): %v", err)
		}
		t.Fatal(err)
	}
	defer r.Close()
	if r.Geometry().Features&FeatureHugePages == 0 || r.Geometry().TotalSize%(2<<20) != 0 {
		t.Fatalf("huge page geometry %+v", r.Geometry())
	}
}

// TestValidateNoWrap: offsets near 2^64 must not wrap past the checks.
func TestValidateNoWrap(t *testing.T) {
	g, _ := NewGeometry(Config{SQEntries: 8, ArenaSize: 64 << 10})
	for _, mut := range []func(*Geometry){
		func(g *Geometry) { g.CQOffset = 1<<64 - 4096 },
		func(g *Geometry) { g.ArenaOffset = 1<<64 - 4096 },
		func(g *Geometry) { g.ArenaSize = 1<<64 - 4096 },
	} {
		b := g
		mut(&b)
		if err := b.Validate(b.TotalSize); err == nil {
			t.Errorf("wrapping geometry accepted: %+v", b)
		}
	}
}
