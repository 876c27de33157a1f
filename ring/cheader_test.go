package ring

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The C header for non-Go peers (include/weir_ring.h) restates the ABI.
// TestCHeaderMatchesGo checks its numbers against the Go constants on every
// run; TestCHeaderStructLayout compiles it and checks its structs when a C
// compiler is available.

const cHeaderFile = "include/weir_ring.h"

// cHeaderConsts maps every numeric WEIR_ define of the header to the Go value
// it mirrors. A define missing from the header, or one in the header that is
// not listed here, fails the test: the two lists move together.
func cHeaderConsts() []struct {
	name string
	want uint64
} {
	return []struct {
		name string
		want uint64
	}{
		{"WEIR_RING_MAGIC", Magic},
		{"WEIR_RING_ABI_VERSION", uint64(ABIVersion)},

		{"WEIR_RING_HEADER_SIZE", HeaderSize},
		{"WEIR_PAGE_SIZE", pageSize},
		{"WEIR_SQ_SLOT_SIZE", SQSlotSize},
		{"WEIR_CQ_SLOT_SIZE", CQSlotSize},
		{"WEIR_SEG_SIZE", SegmentSize},
		{"WEIR_INLINE_SEGS", InlineSegs},
		{"WEIR_MAX_SEGMENTS", MaxSegments},
		{"WEIR_SEG_ALIGN", SegAlign},
		{"WEIR_MAX_QUEUE_ENTRIES", 1 << maxQueueLog2},
		{"WEIR_MAX_ARENA_SIZE", MaxArenaSize},

		{"WEIR_FEATURE_INDIRECT", FeatureIndirect},
		{"WEIR_FEATURE_HUGE_PAGES", FeatureHugePages},
		{"WEIR_KNOWN_FEATURES", knownFeatures},
		{"WEIR_FLAG_INDIRECT", uint64(FlagIndirect)},
		{"WEIR_KNOWN_FLAGS", uint64(knownFlags)},

		{"WEIR_STATE_INIT", uint64(StateInit)},
		{"WEIR_STATE_RUNNING", uint64(StateRunning)},
		{"WEIR_STATE_CLOSED", uint64(StateClosed)},

		{"WEIR_OP_NOP", uint64(OpNop)},
		{"WEIR_OP_ECHO", uint64(OpEcho)},
		{"WEIR_OP_FIRST_SERVICE", uint64(OpFirstService)},

		{"WEIR_HELLO_MAGIC", helloMagic},
		{"WEIR_ACK_MAGIC", ackMagic},
		{"WEIR_HELLO_LEN", helloLen},
		{"WEIR_HANDSHAKE_TIMEOUT_MS", uint64(HandshakeTimeout.Milliseconds())},
		{"WEIR_MAX_SLEEP_NS", uint64(maxSleep.Nanoseconds())},

		{"WEIR_HDR_OFF_MAGIC", offMagic},
		{"WEIR_HDR_OFF_VERSION", offVersion},
		{"WEIR_HDR_OFF_HEADER_SIZE", offHeaderSize},
		{"WEIR_HDR_OFF_FEATURES", offFeatures},
		{"WEIR_HDR_OFF_SQ_ENTRIES", offSQEntries},
		{"WEIR_HDR_OFF_CQ_ENTRIES", offCQEntries},
		{"WEIR_HDR_OFF_SQ_SLOT_SIZE", offSQSlotSize},
		{"WEIR_HDR_OFF_CQ_SLOT_SIZE", offCQSlotSize},
		{"WEIR_HDR_OFF_BLOCK_SIZE", offBlockSize},
		{"WEIR_HDR_OFF_MAX_SEGMENTS", offMaxSegments},
		{"WEIR_HDR_OFF_SQ_OFFSET", offSQOffset},
		{"WEIR_HDR_OFF_CQ_OFFSET", offCQOffset},
		{"WEIR_HDR_OFF_ARENA_OFFSET", offArenaOffset},
		{"WEIR_HDR_OFF_ARENA_SIZE", offArenaSize},
		{"WEIR_HDR_OFF_TOTAL_SIZE", offTotalSize},
		{"WEIR_HDR_FIXED_LEN", headerFixedLen},
		{"WEIR_HDR_OFF_SQ_BELL", offSQBell},
		{"WEIR_HDR_OFF_SQ_WAITERS", offSQWaiters},
		{"WEIR_HDR_OFF_CQ_BELL", offCQBell},
		{"WEIR_HDR_OFF_CQ_WAITERS", offCQWaiters},
		{"WEIR_HDR_OFF_SERVER_STATE", offServerState},
		{"WEIR_HDR_OFF_CLIENT_STATE", offClientState},

		{"WEIR_SQE_OFF_SEQ", sqOffSeq},
		{"WEIR_SQE_OFF_OPCODE", sqOffOpcode},
		{"WEIR_SQE_OFF_FLAGS", sqOffFlags},
		{"WEIR_SQE_OFF_NSEG", sqOffNSeg},
		{"WEIR_SQE_OFF_ARG", sqOffArg},
		{"WEIR_SQE_OFF_REQ_ID", sqOffReqID},
		{"WEIR_SQE_OFF_HANDLE", sqOffHandle},
		{"WEIR_SQE_OFF_OFFSET", sqOffOffset},
		{"WEIR_SQE_OFF_LENGTH", sqOffLength},
		{"WEIR_SQE_OFF_SEGS", sqOffSegs},

		{"WEIR_CQE_OFF_SEQ", cqOffSeq},
		{"WEIR_CQE_OFF_REQ_ID", cqOffReqID},
		{"WEIR_CQE_OFF_RESULT", cqOffResult},
		{"WEIR_CQE_OFF_AUX", cqOffAux},
	}
}

var cDefineRE = regexp.MustCompile(`^\s*#\s*define\s+(WEIR_[A-Za-z0-9_]*)(.*)$`)

// parseCDefines returns the value text of every object-like WEIR_ define in
// src that has a value (the include guard has none; function-like macros are
// not constants).
func parseCDefines(src string) (map[string]string, error) {
	src = strings.ReplaceAll(src, "\\\n", " ")
	defs := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		m := cDefineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		name, rest := m[1], m[2]
		if strings.HasPrefix(rest, "(") {
			continue // function-like
		}
		if i := strings.Index(rest, "/*"); i >= 0 {
			rest = rest[:i]
		}
		if i := strings.Index(rest, "//"); i >= 0 {
			rest = rest[:i]
		}
		rest = strings.TrimSpace(rest)
		if rest == "" {
			continue
		}
		if _, dup := defs[name]; dup {
			return nil, fmt.Errorf("%s defined twice", name)
		}
		defs[name] = rest
	}
	return defs, sc.Err()
}

// parseCNumber reads a C integer literal such as 4096u, 0x1ull or (128u).
func parseCNumber(s string) (uint64, error) {
	for strings.HasPrefix(s, "(") && strings.HasSuffix(s, ")") {
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	return strconv.ParseUint(strings.TrimRight(s, "uUlL"), 0, 64)
}

func TestCHeaderMatchesGo(t *testing.T) {
	src, err := os.ReadFile(cHeaderFile)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := parseCDefines(string(src))
	if err != nil {
		t.Fatalf("%s: %v", cHeaderFile, err)
	}
	mirrored := make(map[string]bool)
	for _, c := range cHeaderConsts() {
		mirrored[c.name] = true
		text, ok := defs[c.name]
		if !ok {
			t.Errorf("%s: #define %s missing (Go value %d = %#x)", cHeaderFile, c.name, c.want, c.want)
			continue
		}
		got, err := parseCNumber(text)
		if err != nil {
			t.Errorf("%s: %s: value %q is not an integer literal: %v", cHeaderFile, c.name, text, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s: %s = %d (%#x), Go says %d (%#x)", cHeaderFile, c.name, got, got, c.want, c.want)
		}
	}
	for name := range defs {
		if !mirrored[name] {
			t.Errorf("%s: #define %s mirrors no Go constant; add it to cHeaderConsts", cHeaderFile, name)
		}
	}
}

// cField is one struct field whose place and type the C compiler must agree
// on with the Go side.
type cField struct {
	typ, field string
	off        uint64
	goType     reflect.Type // the Go type the field is read and written as
}

func goFieldType(v any, name string) reflect.Type {
	f, ok := reflect.TypeOf(v).FieldByName(name)
	if !ok {
		panic("no field " + name)
	}
	return f.Type
}

func cLayout() (fields []cField, sizes map[string]uint64) {
	const hdr, sqe, cqe, seg = "struct weir_ring_header", "struct weir_sqe", "struct weir_cqe", "struct weir_seg"
	var (
		g     Geometry
		u32   = reflect.TypeFor[uint32]() // PutUint32 / load32 words
		u64   = reflect.TypeFor[uint64]() // PutUint64 / load64 words
		desc  Descriptor
		comp  Completion
		sgmnt Segment
	)
	fields = []cField{
		{hdr, "magic", offMagic, reflect.TypeOf(Magic)},
		{hdr, "version", offVersion, reflect.TypeOf(ABIVersion)},
		{hdr, "header_size", offHeaderSize, u32},
		{hdr, "features", offFeatures, goFieldType(g, "Features")},
		{hdr, "sq_entries", offSQEntries, goFieldType(g, "SQEntries")},
		{hdr, "cq_entries", offCQEntries, goFieldType(g, "CQEntries")},
		{hdr, "sq_slot_size", offSQSlotSize, u32},
		{hdr, "cq_slot_size", offCQSlotSize, u32},
		{hdr, "block_size", offBlockSize, goFieldType(g, "BlockSize")},
		{hdr, "max_segments", offMaxSegments, goFieldType(g, "MaxSegments")},
		{hdr, "sq_offset", offSQOffset, goFieldType(g, "SQOffset")},
		{hdr, "cq_offset", offCQOffset, goFieldType(g, "CQOffset")},
		{hdr, "arena_offset", offArenaOffset, goFieldType(g, "ArenaOffset")},
		{hdr, "arena_size", offArenaSize, goFieldType(g, "ArenaSize")},
		{hdr, "total_size", offTotalSize, goFieldType(g, "TotalSize")},
		{hdr, "sq_bell", offSQBell, u32},
		{hdr, "sq_waiters", offSQWaiters, u32},
		{hdr, "cq_bell", offCQBell, u32},
		{hdr, "cq_waiters", offCQWaiters, u32},
		{hdr, "server_state", offServerState, reflect.TypeOf(StateRunning)},
		{hdr, "client_state", offClientState, reflect.TypeOf(StateRunning)},

		{sqe, "seq", sqOffSeq, u64},
		{sqe, "opcode", sqOffOpcode, goFieldType(desc, "Opcode")},
		{sqe, "flags", sqOffFlags, goFieldType(desc, "Flags")},
		{sqe, "nseg", sqOffNSeg, goFieldType(desc, "NSeg")},
		{sqe, "arg", sqOffArg, goFieldType(desc, "Arg")},
		{sqe, "req_id", sqOffReqID, goFieldType(desc, "ReqID")},
		{sqe, "handle", sqOffHandle, goFieldType(desc, "Handle")},
		{sqe, "offset", sqOffOffset, goFieldType(desc, "Offset")},
		{sqe, "length", sqOffLength, goFieldType(desc, "Length")},

		{cqe, "seq", cqOffSeq, u64},
		{cqe, "req_id", cqOffReqID, goFieldType(comp, "ReqID")},
		{cqe, "result", cqOffResult, goFieldType(comp, "Result")},
		{cqe, "aux", cqOffAux, goFieldType(comp, "Aux")},

		{seg, "off", 0, goFieldType(sgmnt, "Off")},
		{seg, "len", 4, goFieldType(sgmnt, "Len")},
	}
	sizes = map[string]uint64{
		"sizeof(" + hdr + ")":               HeaderSize,
		"sizeof(" + sqe + ")":               SQSlotSize,
		"sizeof(" + cqe + ")":               CQSlotSize,
		"sizeof(" + seg + ")":               SegmentSize,
		"offsetof(" + hdr + ", _pad0)":      headerFixedLen,
		"offsetof(" + sqe + ", segs)":       sqOffSegs,
		"sizeof(CFIELD(" + sqe + ", segs))": InlineSegs * SegmentSize,
		"_Generic(CFIELD(" + sqe + ", segs[0]), " + seg + ": 1, default: 0)": 1,
	}
	return fields, sizes
}

// cTypeName is the <stdint.h> type a Go integer type is spelled as.
func cTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Uint8:
		return "uint8_t"
	case reflect.Uint16:
		return "uint16_t"
	case reflect.Uint32:
		return "uint32_t"
	case reflect.Uint64:
		return "uint64_t"
	case reflect.Int64:
		return "int64_t"
	}
	panic("no C type for " + t.String())
}

const cNoCompiler = "no C compiler (cc or gcc) on PATH: install gcc to check the C header's struct layout"

func TestCHeaderStructLayout(t *testing.T) {
	var cc string
	for _, name := range []string{"cc", "gcc"} {
		if p, err := exec.LookPath(name); err == nil {
			cc = p
			break
		}
	}
	if cc == "" {
		t.Skip(cNoCompiler)
	}
	inc, err := filepath.Abs(filepath.Dir(cHeaderFile))
	if err != nil {
		t.Fatal(err)
	}

	want := make(map[string]uint64)
	var prog strings.Builder
	prog.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n#include \"weir_ring.h\"\n")
	prog.WriteString("#define CFIELD(t, f) (((t *)0)->f)\n")
	prog.WriteString("#define P(k, v) printf(\"%s\\t%llu\\n\", k, (unsigned long long)(v))\n")
	prog.WriteString("int main(void) {\n")
	add := func(key string) {
		fmt.Fprintf(&prog, "\tP(%q, %s);\n", key, key)
	}
	fields, sizes := cLayout()
	for _, f := range fields {
		off := fmt.Sprintf("offsetof(%s, %s)", f.typ, f.field)
		size := fmt.Sprintf("sizeof(CFIELD(%s, %s))", f.typ, f.field)
		ctype := cTypeName(f.goType)
		typ := fmt.Sprintf("_Generic(CFIELD(%s, %s), %s: 1, default: 0)", f.typ, f.field, ctype)
		want[off], want[size], want[typ] = f.off, uint64(f.goType.Size()), 1
		add(off)
		add(size)
		add(typ)
	}
	for key, v := range sizes {
		want[key] = v
		add(key)
	}
	// The compiler's reading of each define, against the Go value: this
	// also checks the test's own parser.
	for _, c := range cHeaderConsts() {
		want[c.name] = c.want
		fmt.Fprintf(&prog, "\tP(%q, %s);\n", c.name, c.name)
	}
	prog.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	src, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(src, []byte(prog.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), cc, "-std=c11", "-Wall", "-Wextra", "-Werror",
		"-I", inc, "-o", bin, src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s failed to compile a program including %s: %v\n%s", cc, cHeaderFile, err, out)
	}
	out, err := exec.CommandContext(t.Context(), bin).Output()
	if err != nil {
		t.Fatalf("layout program: %v", err)
	}
	seen := make(map[string]bool)
	for line := range strings.Lines(string(out)) {
		key, val, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
		if !ok {
			t.Fatalf("layout program printed %q", line)
		}
		got, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			t.Fatalf("layout program printed %q: %v", line, err)
		}
		seen[key] = true
		if w, ok := want[key]; !ok {
			t.Errorf("layout program printed unexpected %q", key)
		} else if got != w {
			t.Errorf("C says %s = %d, Go says %d", key, got, w)
		}
	}
	for key := range want {
		if !seen[key] {
			t.Errorf("layout program did not print %s", key)
		}
	}
}
