package proto

import (
	"math"
	"reflect"
	"testing"

	"github.com/weir-storage/weir/internal/cheader"
)

// include/weir_proto.h restates this package for C clients.
// TestCHeaderMatchesGo checks every number in it against the Go constants;
// TestCHeaderStructLayout compiles it and checks its structs and offsets.

const cHeaderFile = "include/weir_proto.h"

func cOpcodes() []cheader.Const {
	return []cheader.Const{
		cheader.Def("WEIR_OP_HELLO", uint64(OpHello)),
		cheader.Def("WEIR_OP_STAT", uint64(OpStat)),
		cheader.Def("WEIR_OP_OPEN", uint64(OpOpen)),
		cheader.Def("WEIR_OP_CLOSE", uint64(OpClose)),
		cheader.Def("WEIR_OP_MKDIR", uint64(OpMkdir)),
		cheader.Def("WEIR_OP_RMDIR", uint64(OpRmdir)),
		cheader.Def("WEIR_OP_UNLINK", uint64(OpUnlink)),
		cheader.Def("WEIR_OP_RENAME", uint64(OpRename)),
		cheader.Def("WEIR_OP_CHMOD", uint64(OpChmod)),
		cheader.Def("WEIR_OP_CHOWN", uint64(OpChown)),
		cheader.Def("WEIR_OP_CHTIMES", uint64(OpChtimes)),
		cheader.Def("WEIR_OP_READDIR", uint64(OpReadDir)),
		cheader.Def("WEIR_OP_FSTAT", uint64(OpFStat)),
		cheader.Def("WEIR_OP_SYNC_META", uint64(OpSyncMeta)),
		cheader.Def("WEIR_OP_GRANT", uint64(OpGrant)),
		cheader.Def("WEIR_OP_FCHMOD", uint64(OpFChmod)),
		cheader.Def("WEIR_OP_FCHOWN", uint64(OpFChown)),
		cheader.Def("WEIR_OP_FCHTIMES", uint64(OpFChtimes)),
		cheader.Def("WEIR_OP_REOPEN", uint64(OpReopen)),
		cheader.Def("WEIR_OP_RECALL_WAIT", uint64(OpRecallWait)),
		cheader.Def("WEIR_OP_ATTACH", uint64(OpAttach)),
		cheader.Def("WEIR_OP_READ", uint64(OpRead)),
		cheader.Def("WEIR_OP_WRITE", uint64(OpWrite)),
		cheader.Def("WEIR_OP_TRUNCATE", uint64(OpTruncate)),
		cheader.Def("WEIR_OP_SYNC", uint64(OpSync)),
		cheader.Def("WEIR_OP_GETATTR", uint64(OpGetAttr)),
		cheader.Def("WEIR_OP_CACHE_MAP", uint64(OpCacheMap)),
		cheader.Def("WEIR_OP_READAHEAD", uint64(OpReadahead)),
		cheader.Def("WEIR_OP_CLAIM", uint64(OpClaim)),
		cheader.Def("WEIR_OP_CLAIM_DIR", uint64(OpClaimDir)),
		cheader.Def("WEIR_OP_RELEASE", uint64(OpRelease)),
		cheader.Def("WEIR_OP_STATFS", uint64(OpStatFS)),
		cheader.Def("WEIR_OP_MAP_PIN", uint64(OpMapPin)),
		cheader.Def("WEIR_OP_MAP_UNPIN", uint64(OpMapUnpin)),
		cheader.Def("WEIR_OP_MAP_SYNC", uint64(OpMapSync)),
		cheader.Def("WEIR_OP_MAP_WRITABLE", uint64(OpMapWritable)),
		cheader.Def("WEIR_OP_WRITE_LOG", uint64(OpWriteLog)),
		cheader.Def("WEIR_OP_WRITE_PIN", uint64(OpWritePin)),
		cheader.Def("WEIR_OP_WRITE_UNPIN", uint64(OpWriteUnpin)),
		cheader.Def("WEIR_OP_SYNC_FS", uint64(OpSyncFS)),
		cheader.Def("WEIR_OP_DIR_LEASE", uint64(OpDirLease)),
		cheader.Def("WEIR_OP_INHERIT", uint64(OpInherit)),
		cheader.Def("WEIR_OP_LOCK", uint64(OpLock)),
		cheader.Def("WEIR_OP_READLINK", uint64(OpReadlink)),
		cheader.Def("WEIR_OP_SYMLINK", uint64(OpSymlink)),
		cheader.Def("WEIR_OP_LINK", uint64(OpLink)),
		cheader.Def("WEIR_OP_CUT", uint64(OpCut)),
	}
}

// cHeaderConsts maps every numeric WEIR_ define of the header to the Go
// value it mirrors; a define on one side only fails the test.
func cHeaderConsts() []cheader.Const {
	return append(cOpcodes(),
		cheader.Def("WEIR_PROTO_MIN_VERSION", uint64(MinVersion)),
		cheader.Def("WEIR_PROTO_MAX_VERSION", uint64(MaxVersion)),
		cheader.Def("WEIR_FEATURE_REOPEN", FeatureReopen),
		cheader.Def("WEIR_FEATURE_LEASES", FeatureLeases),
		cheader.Def("WEIR_FEATURE_CAPS", FeatureCaps),
		cheader.Def("WEIR_FEATURE_RECALLS", FeatureRecalls),
		cheader.Def("WEIR_FEATURE_OPEN_CAP", FeatureOpenCap),
		cheader.Def("WEIR_FEATURE_DIR_OPEN", FeatureDirOpen),
		cheader.Def("WEIR_FEATURE_LINKS", FeatureLinks),
		cheader.Def("WEIR_FEATURE_MOUNTED", FeatureMounted),
		cheader.Def("WEIR_FEATURE_RECORD_CUTS", FeatureRecordCuts),
		cheader.Def("WEIR_ERR_FOLLOW", uint64(ErrFollow)),
		cheader.Def("WEIR_PATH_NOFOLLOW", uint64(PathNoFollow)),
		cheader.Def("WEIR_LINK_FOLLOW", uint64(LinkFollow)),
		cheader.Def("WEIR_KNOWN_PROTO_FEATURES", KnownFeatures),
		cheader.Def("WEIR_CLAIM_DIR_SIZE", ClaimDirSize),
		cheader.Def("WEIR_DIR_OPEN_BIT", DirOpenBit),
		cheader.Def("WEIR_FIRST_METADATA_OP", uint64(FirstMetadataOp)),
		cheader.Def("WEIR_LAST_METADATA_OP", uint64(LastMetadataOp)),
		cheader.Def("WEIR_FIRST_IO_OP", uint64(FirstIOOp)),
		cheader.Def("WEIR_LAST_IO_OP", uint64(LastIOOp)),
		cheader.Def("WEIR_MAP_PIN_WRITABLE", uint64(MapPinWritable)),
		cheader.Def("WEIR_WINDOW_PAGES", WindowPages),
		cheader.Def("WEIR_WRITE_LOG_SLOTS", WriteLogSlots),
		cheader.Def("WEIR_WRITE_SLOT_BYTES", WriteSlotBytes),
		cheader.Def("WEIR_WRITE_LOG_SIZE", WriteLogSize),
		cheader.Def("WEIR_WRITE_LOG_LIVE_OFF", WriteLogLiveOff),
		cheader.Def("WEIR_WRITE_APPEND", uint64(WriteAppend)),
		cheader.Def("WEIR_WRITE_DIRECT", uint64(WriteDirect)),
		cheader.Def("WEIR_READ_DIRECT", uint64(ReadDirect)),
		cheader.Def("WEIR_DIRECT_ALIGN", DirectAlign),
		cheader.Def("WEIR_SYNC_DATA", uint64(SyncData)),
		cheader.Def("WEIR_ATTR_SIZE", AttrSize),
		cheader.Def("WEIR_TOKEN_SIZE", TokenSize),
		cheader.Def("WEIR_TICKET_SIZE", TicketSize),
		cheader.Def("WEIR_STATFS_RESP_SIZE", StatFSRespSize),
		cheader.Def("WEIR_LOCK_POSIX", uint64(LockPOSIX)),
		cheader.Def("WEIR_LOCK_OFD", uint64(LockOFD)),
		cheader.Def("WEIR_LOCK_FLOCK", uint64(LockFlock)),
		cheader.Def("WEIR_LOCK_READ", uint64(LockRead)),
		cheader.Def("WEIR_LOCK_WRITE", uint64(LockWrite)),
		cheader.Def("WEIR_LOCK_UNLOCK", uint64(LockUnlock)),
		cheader.Def("WEIR_LOCK_REQ_SIZE", uint64(LockReqSize)),
		cheader.Def("WEIR_CAP_SIZE", CapSize),
		cheader.Def("WEIR_GRANT_THROUGH_IO", GrantThroughIO),
		cheader.Def("WEIR_TENURE_SIZE", TenureSize),
		cheader.Def("WEIR_RECALL_BATCH", RecallBatch),
		cheader.Def("WEIR_RECALL_ALL", RecallAll),
		cheader.Def("WEIR_MAX_PATH", MaxPath),
		cheader.Def("WEIR_MAX_NAME", MaxName),
		cheader.Def("WEIR_MAX_FILE_SIZE", uint64(MaxFileSize)),
		cheader.Def("WEIR_ROOT_HANDLE", RootHandle),
		cheader.Def("WEIR_INCARNATION_BITS", IncarnationBits),
		cheader.Def("WEIR_COUNTER_BITS", CounterBits),
		cheader.Def("WEIR_HELLO_RESP_SIZE", HelloRespSize),
		cheader.Def("WEIR_ATTACH_REQ_SIZE", AttachReqSize),
		cheader.Def("WEIR_OPEN_RESP_OFF_HANDLE", 0),
		cheader.Def("WEIR_OPEN_RESP_OFF_ATTR", 8),
		cheader.Def("WEIR_OPEN_RESP_OFF_CREATED", 8+AttrSize),
		cheader.Def("WEIR_OPEN_RESP_OFF_GRANTED", 8+AttrSize+1),
		cheader.Def("WEIR_OPEN_RESP_OFF_TICKET", uint64(OpenRespSize(0))),
		cheader.Def("WEIR_OPEN_RESP_SIZE", uint64(OpenRespSize(0))),
		cheader.Def("WEIR_OPEN_RESP_SIZE_TICKET", uint64(OpenRespSize(FeatureReopen))),
		cheader.Def("WEIR_OPEN_RESP_SIZE_LEASES", uint64(OpenRespSize(FeatureLeases))),
		cheader.Def("WEIR_OPEN_RESP_SIZE_TICKET_LEASES", uint64(OpenRespSize(FeatureReopen|FeatureLeases))),
		cheader.Def("WEIR_OPEN_RESP_OFF_HAS_CAP_TICKET_LEASES", uint64(OpenRespSize(FeatureReopen|FeatureLeases))),
		cheader.Def("WEIR_OPEN_RESP_OFF_CAP_TICKET_LEASES", uint64(OpenRespSize(FeatureReopen|FeatureLeases))+1),
		cheader.Def("WEIR_OPEN_RESP_SIZE_TICKET_LEASES_CAP", uint64(OpenRespSize(FeatureReopen|FeatureLeases|FeatureOpenCap))),
		cheader.Def("WEIR_GETATTR_RESP_OFF_SIZE", 0),
		cheader.Def("WEIR_GETATTR_RESP_OFF_MTIME", 8),
		cheader.Def("WEIR_GETATTR_RESP_OFF_CHANGED", 16),
		cheader.Def("WEIR_GETATTR_RESP_SIZE", GetAttrRespSize),
	)
}

func TestCHeaderMatchesGo(t *testing.T) {
	// WEIR_TIME_OMIT is INT64_MIN, which only the compiler evaluates.
	cheader.CheckDefines(t, cHeaderFile, cHeaderConsts(), "WEIR_TIME_OMIT", "WEIR_TIME_NOW")
}

func TestCHeaderStructLayout(t *testing.T) {
	const attr, hreq, hresp, areq = "struct weir_attr", "struct weir_hello_req", "struct weir_hello_resp", "struct weir_attach_req"
	var (
		a   Attr
		hq  HelloReq
		hr  HelloResp
		aq  AttachReq
		u32 = reflect.TypeFor[uint32]()
	)
	fields := []cheader.Field{
		cheader.At(attr, "ino", 0, cheader.GoFieldType(a, "Ino")),
		cheader.At(attr, "mode", 8, cheader.GoFieldType(a, "Mode")),
		cheader.At(attr, "uid", 12, cheader.GoFieldType(a, "UID")),
		cheader.At(attr, "gid", 16, cheader.GoFieldType(a, "GID")),
		cheader.At(attr, "nlink", 20, cheader.GoFieldType(a, "Nlink")),
		cheader.At(attr, "size", 24, cheader.GoFieldType(a, "Size")),
		cheader.At(attr, "atime", 32, cheader.GoFieldType(a, "Atime")),
		cheader.At(attr, "mtime", 40, cheader.GoFieldType(a, "Mtime")),
		cheader.At(attr, "ctime", 48, cheader.GoFieldType(a, "Ctime")),

		cheader.At(hreq, "min_version", 0, cheader.GoFieldType(hq, "MinVersion")),
		cheader.At(hreq, "max_version", 4, cheader.GoFieldType(hq, "MaxVersion")),
		cheader.At(hreq, "features", 8, cheader.GoFieldType(hq, "Features")),

		cheader.At(hresp, "version", 0, cheader.GoFieldType(hr, "Version")),
		cheader.At(hresp, "reserved", 4, u32),
		cheader.At(hresp, "features", 8, cheader.GoFieldType(hr, "Features")),
		cheader.At(hresp, "session", 16, cheader.GoFieldType(hr, "Session")),
		cheader.At(hresp, "token", 24, cheader.GoFieldType(hr, "Token")),

		cheader.At(areq, "version", 0, cheader.GoFieldType(aq, "Version")),
		cheader.At(areq, "reserved", 4, u32),
		cheader.At(areq, "session", 8, cheader.GoFieldType(aq, "Session")),
		cheader.At(areq, "token", 16, cheader.GoFieldType(aq, "Token")),
	}
	sizes := map[string]uint64{
		"sizeof(" + attr + ")":  AttrSize,
		"sizeof(" + hreq + ")":  uint64(len((&HelloReq{}).Append(nil))),
		"sizeof(" + hresp + ")": HelloRespSize,
		"sizeof(" + areq + ")":  AttachReqSize,
		// The encoders write exactly these layouts.
		"WEIR_ATTR_SIZE + 0*sizeof(" + attr + ")":    uint64(len(AppendAttr(nil, &Attr{}))),
		"(uint64_t)WEIR_TIME_OMIT":                   1 << 63,
		"(uint64_t)WEIR_TIME_NOW":                    1<<63 + 1,
		"WEIR_INCARNATION_OF(0xfedcba9876543210ull)": uint64(IncarnationOf(0xfedcba9876543210)),
	}
	if TimeNow != math.MinInt64+1 {
		t.Fatalf("TimeNow = %d, want INT64_MIN + 1", TimeNow)
	}
	if TimeOmit != math.MinInt64 {
		t.Fatalf("TimeOmit = %d, want INT64_MIN", TimeOmit)
	}
	cheader.CheckLayout(t, cHeaderFile, fields, sizes, cHeaderConsts())
}
