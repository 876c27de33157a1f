/*
 * weir_cache.h: the cache region ABI (version 2), for C clients.
 *
 * This restates package proto/cache (github.com/weir-storage/weir/proto/cache);
 * docs/cache-abi.md is the full contract, and proto/cache/cheader_test.go
 * checks every number here against the Go definitions and compiles the
 * header struct to check its layout.
 *
 * A region is two memfds per open file, made by the IO service. The meta
 * memfd holds a header page, then one page of 1024 state words (u32) for
 * each chunk of 1024 file pages; the data memfd holds the file's pages at
 * their file offsets. Only the service writes the meta memfd; a writer of
 * the file may be given the data memfd read-write (WEIR_OP_MAP_WRITABLE).
 *
 *   meta offset 0               header (struct weir_cache_header)
 *   meta offset 4096 + p * 4    state word of file page p
 *   data offset p * 4096        file page p
 *
 * Reading page p (the seqlock): load its state word w (acquire); unless
 * w's kind is RESIDENT, ask the service. Copy the bytes out of the data
 * page; then load the state word again (acquire, and on weakly ordered
 * hosts after loads of the copy that cannot pass it: 8-byte atomic loads).
 * If it is not exactly w, a transition overlapped the copy: discard it and
 * retry or ask the service.
 *
 * Reading the field group: load fields_seq; if odd, retry; load the four
 * fields; load fields_seq again; equal means stable. Give up after a
 * bounded number of tries (WEIR_CACHE_FIELD_TRIES): a writer that died
 * with the sequence odd must not hang a reader.
 *
 * Little-endian hosts only, as the ring ABI.
 */
#ifndef WEIR_CACHE_H
#define WEIR_CACHE_H

#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the weir cache ABI is defined for little-endian hosts only"
#endif

#define WEIR_CACHE_MAGIC 0x32524357u /* "WCR2" */
#define WEIR_CACHE_VERSION 2u
#define WEIR_CACHE_PAGE_SHIFT 12u
#define WEIR_CACHE_PAGE_SIZE 4096u
#define WEIR_CACHE_HEADER_SIZE 4096u
#define WEIR_CACHE_STATE_SIZE 4u
#define WEIR_CACHE_CHUNK_PAGES 1024u
#define WEIR_CACHE_CHUNK_BYTES 4194304u /* file bytes a chunk holds */
#define WEIR_CACHE_MAX_CAPACITY 0x100000000000ull /* 16 TiB */
#define WEIR_CACHE_FIELD_TRIES 64u

/* State word (u32 per page). */
#define WEIR_CACHE_KIND_MASK 0x3u
#define WEIR_CACHE_KIND_ABSENT 0u   /* nothing cached: zeros */
#define WEIR_CACHE_KIND_RESIDENT 1u /* the file's bytes */
#define WEIR_CACHE_KIND_BUSY 2u     /* the service is changing the page */
#define WEIR_CACHE_DIRTY 0x4u       /* not yet written home */
#define WEIR_CACHE_RESERVED_MASK 0xf8u
#define WEIR_CACHE_PIN_SHIFT 8u
#define WEIR_CACHE_PIN_MASK 0xff00u
#define WEIR_CACHE_SEQ_SHIFT 16u

/* Header offsets. */
#define WEIR_CACHE_OFF_MAGIC 0u
#define WEIR_CACHE_OFF_VERSION 4u
#define WEIR_CACHE_OFF_PAGE_SHIFT 6u
#define WEIR_CACHE_OFF_CHUNK_PAGES 8u
#define WEIR_CACHE_OFF_RESERVED 12u
#define WEIR_CACHE_OFF_INO 16u
#define WEIR_CACHE_OFF_CAPACITY 24u
#define WEIR_CACHE_OFF_GENERATION 32u
#define WEIR_CACHE_OFF_FIELDS_SEQ 64u
#define WEIR_CACHE_OFF_SIZE 72u
#define WEIR_CACHE_OFF_MTIME 80u
#define WEIR_CACHE_OFF_CTIME 88u
#define WEIR_CACHE_OFF_DATA_VERSION 96u

struct weir_cache_header {
	uint32_t magic;       /* WEIR_CACHE_MAGIC */
	uint16_t version;     /* WEIR_CACHE_VERSION */
	uint16_t page_shift;  /* WEIR_CACHE_PAGE_SHIFT */
	uint32_t chunk_pages; /* WEIR_CACHE_CHUNK_PAGES */
	uint32_t reserved;    /* zero */
	uint64_t ino;         /* the file's inode number */
	uint64_t capacity;    /* file bytes covered; a multiple of CHUNK_BYTES; grows only */
	uint64_t generation;  /* bumped when the service drops pages wholesale */
	uint8_t pad0[24];
	/* The field group, one cache line: a seqlock. */
	uint64_t fields_seq; /* odd while the group changes */
	uint64_t size;
	int64_t mtime_ns;
	int64_t ctime_ns;
	uint64_t data_version;
};

/* Offsets of file page p's state word (in the meta memfd) and data (in
 * the data memfd). */
static inline uint64_t weir_cache_state_off(uint64_t p) {
	return WEIR_CACHE_HEADER_SIZE + p * WEIR_CACHE_STATE_SIZE;
}
static inline uint64_t weir_cache_page_off(uint64_t p) {
	return p * WEIR_CACHE_PAGE_SIZE;
}

#endif /* WEIR_CACHE_H */
