package cache

import (
	"reflect"
	"testing"

	"github.com/weir-storage/weir/internal/cheader"
)

// ../include/weir_cache.h restates this package for C clients.
// TestCHeaderMatchesGo checks every number in it against the Go constants;
// TestCHeaderStructLayout compiles it and checks the header struct and the
// offset functions.

const cHeaderFile = "../include/weir_cache.h"

func cHeaderConsts() []cheader.Const {
	return []cheader.Const{
		cheader.Def("WEIR_CACHE_MAGIC", Magic),
		cheader.Def("WEIR_CACHE_VERSION", Version),
		cheader.Def("WEIR_CACHE_PAGE_SHIFT", PageShift),
		cheader.Def("WEIR_CACHE_PAGE_SIZE", PageSize),
		cheader.Def("WEIR_CACHE_HEADER_SIZE", HeaderSize),
		cheader.Def("WEIR_CACHE_STATE_SIZE", StateSize),
		cheader.Def("WEIR_CACHE_CHUNK_PAGES", ChunkPages),
		cheader.Def("WEIR_CACHE_CHUNK_BYTES", ChunkBytes),
		cheader.Def("WEIR_CACHE_MAX_CAPACITY", MaxCapacity),
		cheader.Def("WEIR_CACHE_FIELD_TRIES", fieldTries),

		cheader.Def("WEIR_CACHE_KIND_MASK", uint64(kindMask)),
		cheader.Def("WEIR_CACHE_KIND_ABSENT", uint64(KindAbsent)),
		cheader.Def("WEIR_CACHE_KIND_RESIDENT", uint64(KindResident)),
		cheader.Def("WEIR_CACHE_KIND_BUSY", uint64(KindBusy)),
		cheader.Def("WEIR_CACHE_DIRTY", uint64(flagDirty)),
		cheader.Def("WEIR_CACHE_RESERVED_MASK", uint64(reservedMask)),
		cheader.Def("WEIR_CACHE_PIN_SHIFT", pinShift),
		cheader.Def("WEIR_CACHE_PIN_MASK", uint64(pinMask)),
		cheader.Def("WEIR_CACHE_SEQ_SHIFT", seqShift),

		cheader.Def("WEIR_CACHE_OFF_MAGIC", offMagic),
		cheader.Def("WEIR_CACHE_OFF_VERSION", offVersion),
		cheader.Def("WEIR_CACHE_OFF_PAGE_SHIFT", offPageShift),
		cheader.Def("WEIR_CACHE_OFF_CHUNK_PAGES", offChunkPages),
		cheader.Def("WEIR_CACHE_OFF_RESERVED", offReserved),
		cheader.Def("WEIR_CACHE_OFF_INO", offIno),
		cheader.Def("WEIR_CACHE_OFF_CAPACITY", offCapacity),
		cheader.Def("WEIR_CACHE_OFF_GENERATION", offGeneration),
		cheader.Def("WEIR_CACHE_OFF_FIELDS_SEQ", offFieldsSeq),
		cheader.Def("WEIR_CACHE_OFF_SIZE", offSize),
		cheader.Def("WEIR_CACHE_OFF_MTIME", offMtime),
		cheader.Def("WEIR_CACHE_OFF_CTIME", offCtime),
		cheader.Def("WEIR_CACHE_OFF_DATA_VERSION", offDataVersion),
	}
}

func TestCHeaderMatchesGo(t *testing.T) {
	cheader.CheckDefines(t, cHeaderFile, cHeaderConsts())
}

func TestCHeaderStructLayout(t *testing.T) {
	const hdr = "struct weir_cache_header"
	u16, u32, u64, i64 := reflect.TypeFor[uint16](), reflect.TypeFor[uint32](), reflect.TypeFor[uint64](), reflect.TypeFor[int64]()
	fields := []cheader.Field{
		cheader.At(hdr, "magic", offMagic, u32),
		cheader.At(hdr, "version", offVersion, u16),
		cheader.At(hdr, "page_shift", offPageShift, u16),
		cheader.At(hdr, "chunk_pages", offChunkPages, u32),
		cheader.At(hdr, "reserved", offReserved, u32),
		cheader.At(hdr, "ino", offIno, u64),
		cheader.At(hdr, "capacity", offCapacity, u64),
		cheader.At(hdr, "generation", offGeneration, u64),
		cheader.At(hdr, "fields_seq", offFieldsSeq, u64),
		cheader.At(hdr, "size", offSize, u64),
		cheader.At(hdr, "mtime_ns", offMtime, reflect.TypeOf(Fields{}.Mtime)),
		cheader.At(hdr, "ctime_ns", offCtime, i64),
		cheader.At(hdr, "data_version", offDataVersion, u64),
	}
	sizes := map[string]uint64{
		"sizeof(" + hdr + ")":               headerFixedLen,
		"weir_cache_state_off(0)":           stateOff(0),
		"weir_cache_state_off(1025)":        stateOff(1025),
		"weir_cache_page_off(0)":            pageOff(0),
		"weir_cache_page_off(3 * 1024 + 5)": pageOff(3*1024 + 5),
	}
	cheader.CheckLayout(t, cHeaderFile, fields, sizes, cHeaderConsts())
}
