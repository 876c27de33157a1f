package ring

import (
	"reflect"
	"testing"

	"github.com/weir-storage/weir/internal/cheader"
)

// The C header for non-Go peers (include/weir_ring.h) restates the ABI.
// TestCHeaderMatchesGo checks its numbers against the Go constants on every
// run; TestCHeaderStructLayout compiles it and checks its structs when a C
// compiler is available.

const cHeaderFile = "include/weir_ring.h"

// cHeaderConsts maps every numeric WEIR_ define of the header to the Go value
// it mirrors. A define missing from the header, or one in the header that is
// not listed here, fails the test: the two lists move together.
func cHeaderConsts() []cheader.Const {
	return []cheader.Const{
		cheader.Def("WEIR_RING_MAGIC", Magic),
		cheader.Def("WEIR_RING_ABI_VERSION", uint64(ABIVersion)),

		cheader.Def("WEIR_RING_HEADER_SIZE", HeaderSize),
		cheader.Def("WEIR_PAGE_SIZE", pageSize),
		cheader.Def("WEIR_SQ_SLOT_SIZE", SQSlotSize),
		cheader.Def("WEIR_CQ_SLOT_SIZE", CQSlotSize),
		cheader.Def("WEIR_SEG_SIZE", SegmentSize),
		cheader.Def("WEIR_INLINE_SEGS", InlineSegs),
		cheader.Def("WEIR_MAX_SEGMENTS", MaxSegments),
		cheader.Def("WEIR_SEG_ALIGN", SegAlign),
		cheader.Def("WEIR_MAX_QUEUE_ENTRIES", 1<<maxQueueLog2),
		cheader.Def("WEIR_MAX_ARENA_SIZE", MaxArenaSize),

		cheader.Def("WEIR_FEATURE_INDIRECT", FeatureIndirect),
		cheader.Def("WEIR_FEATURE_HUGE_PAGES", FeatureHugePages),
		cheader.Def("WEIR_KNOWN_FEATURES", knownFeatures),
		cheader.Def("WEIR_FLAG_INDIRECT", uint64(FlagIndirect)),
		cheader.Def("WEIR_KNOWN_FLAGS", uint64(knownFlags)),

		cheader.Def("WEIR_STATE_INIT", uint64(StateInit)),
		cheader.Def("WEIR_STATE_RUNNING", uint64(StateRunning)),
		cheader.Def("WEIR_STATE_CLOSED", uint64(StateClosed)),
		cheader.Def("WEIR_HINT_NO_SPIN", uint64(HintNoSpin)),

		cheader.Def("WEIR_OP_NOP", uint64(OpNop)),
		cheader.Def("WEIR_OP_ECHO", uint64(OpEcho)),
		cheader.Def("WEIR_OP_FIRST_SERVICE", uint64(OpFirstService)),

		cheader.Def("WEIR_HELLO_MAGIC", helloMagic),
		cheader.Def("WEIR_ACK_MAGIC", ackMagic),
		cheader.Def("WEIR_REFUSE_MAGIC", refuseMagic),
		cheader.Def("WEIR_HELLO_LEN", helloLen),
		cheader.Def("WEIR_HANDSHAKE_TIMEOUT_MS", uint64(HandshakeTimeout.Milliseconds())),
		cheader.Def("WEIR_MAX_SLEEP_NS", uint64(maxSleep.Nanoseconds())),

		cheader.Def("WEIR_HDR_OFF_MAGIC", offMagic),
		cheader.Def("WEIR_HDR_OFF_VERSION", offVersion),
		cheader.Def("WEIR_HDR_OFF_HEADER_SIZE", offHeaderSize),
		cheader.Def("WEIR_HDR_OFF_FEATURES", offFeatures),
		cheader.Def("WEIR_HDR_OFF_SQ_ENTRIES", offSQEntries),
		cheader.Def("WEIR_HDR_OFF_CQ_ENTRIES", offCQEntries),
		cheader.Def("WEIR_HDR_OFF_SQ_SLOT_SIZE", offSQSlotSize),
		cheader.Def("WEIR_HDR_OFF_CQ_SLOT_SIZE", offCQSlotSize),
		cheader.Def("WEIR_HDR_OFF_BLOCK_SIZE", offBlockSize),
		cheader.Def("WEIR_HDR_OFF_MAX_SEGMENTS", offMaxSegments),
		cheader.Def("WEIR_HDR_OFF_SQ_OFFSET", offSQOffset),
		cheader.Def("WEIR_HDR_OFF_CQ_OFFSET", offCQOffset),
		cheader.Def("WEIR_HDR_OFF_ARENA_OFFSET", offArenaOffset),
		cheader.Def("WEIR_HDR_OFF_ARENA_SIZE", offArenaSize),
		cheader.Def("WEIR_HDR_OFF_TOTAL_SIZE", offTotalSize),
		cheader.Def("WEIR_HDR_FIXED_LEN", headerFixedLen),
		cheader.Def("WEIR_HDR_OFF_SQ_BELL", offSQBell),
		cheader.Def("WEIR_HDR_OFF_SQ_WAITERS", offSQWaiters),
		cheader.Def("WEIR_HDR_OFF_CQ_BELL", offCQBell),
		cheader.Def("WEIR_HDR_OFF_CQ_WAITERS", offCQWaiters),
		cheader.Def("WEIR_HDR_OFF_SERVER_STATE", offServerState),
		cheader.Def("WEIR_HDR_OFF_SERVER_HINTS", offServerHints),
		cheader.Def("WEIR_HDR_OFF_CLIENT_STATE", offClientState),

		cheader.Def("WEIR_SQE_OFF_SEQ", sqOffSeq),
		cheader.Def("WEIR_SQE_OFF_OPCODE", sqOffOpcode),
		cheader.Def("WEIR_SQE_OFF_FLAGS", sqOffFlags),
		cheader.Def("WEIR_SQE_OFF_NSEG", sqOffNSeg),
		cheader.Def("WEIR_SQE_OFF_ARG", sqOffArg),
		cheader.Def("WEIR_SQE_OFF_REQ_ID", sqOffReqID),
		cheader.Def("WEIR_SQE_OFF_HANDLE", sqOffHandle),
		cheader.Def("WEIR_SQE_OFF_OFFSET", sqOffOffset),
		cheader.Def("WEIR_SQE_OFF_LENGTH", sqOffLength),
		cheader.Def("WEIR_SQE_OFF_SEGS", sqOffSegs),

		cheader.Def("WEIR_CQE_OFF_SEQ", cqOffSeq),
		cheader.Def("WEIR_CQE_OFF_REQ_ID", cqOffReqID),
		cheader.Def("WEIR_CQE_OFF_RESULT", cqOffResult),
		cheader.Def("WEIR_CQE_OFF_AUX", cqOffAux),
	}
}

func TestCHeaderMatchesGo(t *testing.T) {
	cheader.CheckDefines(t, cHeaderFile, cHeaderConsts())
}

func cLayout() (fields []cheader.Field, sizes map[string]uint64) {
	const hdr, sqe, cqe, seg = "struct weir_ring_header", "struct weir_sqe", "struct weir_cqe", "struct weir_seg"
	var (
		g     Geometry
		u32   = reflect.TypeFor[uint32]() // PutUint32 / load32 words
		u64   = reflect.TypeFor[uint64]() // PutUint64 / load64 words
		desc  Descriptor
		comp  Completion
		sgmnt Segment
	)
	fields = []cheader.Field{
		cheader.At(hdr, "magic", offMagic, reflect.TypeOf(Magic)),
		cheader.At(hdr, "version", offVersion, reflect.TypeOf(ABIVersion)),
		cheader.At(hdr, "header_size", offHeaderSize, u32),
		cheader.At(hdr, "features", offFeatures, cheader.GoFieldType(g, "Features")),
		cheader.At(hdr, "sq_entries", offSQEntries, cheader.GoFieldType(g, "SQEntries")),
		cheader.At(hdr, "cq_entries", offCQEntries, cheader.GoFieldType(g, "CQEntries")),
		cheader.At(hdr, "sq_slot_size", offSQSlotSize, u32),
		cheader.At(hdr, "cq_slot_size", offCQSlotSize, u32),
		cheader.At(hdr, "block_size", offBlockSize, cheader.GoFieldType(g, "BlockSize")),
		cheader.At(hdr, "max_segments", offMaxSegments, cheader.GoFieldType(g, "MaxSegments")),
		cheader.At(hdr, "sq_offset", offSQOffset, cheader.GoFieldType(g, "SQOffset")),
		cheader.At(hdr, "cq_offset", offCQOffset, cheader.GoFieldType(g, "CQOffset")),
		cheader.At(hdr, "arena_offset", offArenaOffset, cheader.GoFieldType(g, "ArenaOffset")),
		cheader.At(hdr, "arena_size", offArenaSize, cheader.GoFieldType(g, "ArenaSize")),
		cheader.At(hdr, "total_size", offTotalSize, cheader.GoFieldType(g, "TotalSize")),
		cheader.At(hdr, "sq_bell", offSQBell, u32),
		cheader.At(hdr, "sq_waiters", offSQWaiters, u32),
		cheader.At(hdr, "cq_bell", offCQBell, u32),
		cheader.At(hdr, "cq_waiters", offCQWaiters, u32),
		cheader.At(hdr, "server_state", offServerState, reflect.TypeOf(StateRunning)),
		cheader.At(hdr, "server_hints", offServerHints, reflect.TypeOf(HintNoSpin)),
		cheader.At(hdr, "client_state", offClientState, reflect.TypeOf(StateRunning)),

		cheader.At(sqe, "seq", sqOffSeq, u64),
		cheader.At(sqe, "opcode", sqOffOpcode, cheader.GoFieldType(desc, "Opcode")),
		cheader.At(sqe, "flags", sqOffFlags, cheader.GoFieldType(desc, "Flags")),
		cheader.At(sqe, "nseg", sqOffNSeg, cheader.GoFieldType(desc, "NSeg")),
		cheader.At(sqe, "arg", sqOffArg, cheader.GoFieldType(desc, "Arg")),
		cheader.At(sqe, "req_id", sqOffReqID, cheader.GoFieldType(desc, "ReqID")),
		cheader.At(sqe, "handle", sqOffHandle, cheader.GoFieldType(desc, "Handle")),
		cheader.At(sqe, "offset", sqOffOffset, cheader.GoFieldType(desc, "Offset")),
		cheader.At(sqe, "length", sqOffLength, cheader.GoFieldType(desc, "Length")),

		cheader.At(cqe, "seq", cqOffSeq, u64),
		cheader.At(cqe, "req_id", cqOffReqID, cheader.GoFieldType(comp, "ReqID")),
		cheader.At(cqe, "result", cqOffResult, cheader.GoFieldType(comp, "Result")),
		cheader.At(cqe, "aux", cqOffAux, cheader.GoFieldType(comp, "Aux")),

		cheader.At(seg, "off", 0, cheader.GoFieldType(sgmnt, "Off")),
		cheader.At(seg, "len", 4, cheader.GoFieldType(sgmnt, "Len")),
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

func TestCHeaderStructLayout(t *testing.T) {
	fields, sizes := cLayout()
	cheader.CheckLayout(t, cHeaderFile, fields, sizes, cHeaderConsts())
}
