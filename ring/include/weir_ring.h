/*
 * weir_ring.h - the weir shared-memory ring ABI, for C peers.
 *
 * This header mirrors github.com/weir-storage/weir/ring (layout.go, desc.go,
 * server.go, session.go, wait.go). docs/ring-abi.md is the full description;
 * ring/cheader_test.go checks every number below against the Go constants
 * and, when a C compiler is present, every struct offset and size.
 *
 * Byte order: the ABI is defined for little-endian hosts. The Go side writes
 * the header, descriptor and completion fields as little-endian and the
 * atomically accessed words (sequence, doorbell and state words) in native
 * order; the two agree only on a little-endian machine.
 *
 * ------------------------------------------------------------------------
 * Region
 * ------------------------------------------------------------------------
 * A session's region is one sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_SEAL) created by the server and received over the handshake socket
 * with SCM_RIGHTS. Map all of it, MAP_SHARED, PROT_READ | PROT_WRITE:
 *
 *   [0, 4096)                       struct weir_ring_header
 *   [sq_offset, +sq_entries*128)    SQ: struct weir_sqe[sq_entries]
 *   [cq_offset, +cq_entries*32)     CQ: struct weir_cqe[cq_entries]
 *   [arena_offset, +arena_size)     payload arena, addressed by u32 offsets
 *
 * Before mapping: check F_GET_SEALS has F_SEAL_SHRINK, fstat the fd, pread
 * the first WEIR_HDR_FIXED_LEN bytes into private memory and validate them
 * there (docs/ring-abi.md, "Attaching"). Keep that private copy: never
 * re-read geometry from the shared header, the peer can rewrite it.
 *
 * ------------------------------------------------------------------------
 * Memory-ordering contract
 * ------------------------------------------------------------------------
 * The Go side accesses every shared word below with sync/atomic, which is
 * sequentially consistent (amd64: MOV loads, XCHG stores; arm64: LDAR/STLR).
 * A C peer must use at least the orders given here. Using __ATOMIC_SEQ_CST
 * everywhere is always correct and costs nothing extra for loads on x86.
 *
 *   word                  written by            C access
 *   --------------------  --------------------  ------------------------------
 *   header [0, 88)        the server, once,     plain reads, of a private copy
 *                         before the handshake  taken once before use
 *   seq (SQ and CQ slot)  producer: pos + 1     load: __atomic_load_n ACQUIRE
 *                         (publish)             store: __atomic_store_n RELEASE
 *                         consumer: pos +       (SEQ_CST for a publish that is
 *                         entries (recycle)     followed by a doorbell check,
 *                                               and for a consumer's re-check
 *                                               after setting waiters)
 *   slot body (the other  the slot's current    plain loads/stores, only
 *   fields of a slot)     owner                 between claim and
 *                                               publish/recycle
 *   sq_bell, cq_bell      the producing side    __atomic_fetch_add SEQ_CST;
 *                                               the sleeper loads ACQUIRE
 *   sq_waiters,           the consuming side    __atomic_fetch_add/sub SEQ_CST;
 *   cq_waiters                                  the producer loads SEQ_CST
 *   server_state          the server only       store RELEASE, load ACQUIRE
 *   server_hints          the server only       store RELEASE, load ACQUIRE
 *   client_state          the client only       store RELEASE, load ACQUIRE
 *
 * ACQUIRE on a sequence load pairs with the RELEASE that stored it: a
 * consumer that sees seq == pos+1 sees the whole body the producer wrote; a
 * producer that sees seq == pos sees the consumer finished reading the old
 * body. The doorbell is a Dekker pair and needs store->load order on both
 * sides, which only SEQ_CST (or __atomic_thread_fence(__ATOMIC_SEQ_CST)
 * between the two accesses) gives:
 *
 *   producer: store seq (publish)    ; load waiters ; if != 0 ring the bell
 *   consumer: add waiters 1          ; load seq (re-check) ; if empty sleep
 *
 * At least one side then sees the other's store, so no wake-up is lost.
 *
 * ------------------------------------------------------------------------
 * Queues: Vyukov's bounded MPMC queue
 * ------------------------------------------------------------------------
 * Slot i starts with seq == i. The slot for position pos is
 * slots[pos & (entries - 1)], and it is
 *
 *   free for the producer of pos    when seq == pos
 *   ready for the consumer of pos   when seq == pos + 1
 *   free again for pos + entries    after the consumer stores pos + entries
 *
 * Positions are u64 counters starting at 0 and live in each process's
 * private memory, never in the region; only seq words and bodies are shared.
 * A C client is the SQ producer and the CQ consumer. Claiming an SQ slot,
 * filling it and ringing the doorbell (tail is this process's private SQ
 * position, shared by its threads):
 *
 *   struct weir_sqe *s;
 *   uint64_t pos;
 *   for (;;) {
 *       pos = __atomic_load_n(&tail, __ATOMIC_RELAXED);
 *       s = &sq[pos & (sq_entries - 1)];
 *       uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
 *       int64_t diff = (int64_t)(seq - pos);
 *       if (diff == 0) {
 *           if (__atomic_compare_exchange_n(&tail, &pos, pos + 1, 0,
 *                   __ATOMIC_RELAXED, __ATOMIC_RELAXED))
 *               break;                         // slot pos is ours
 *       } else if (diff < 0) {
 *           return WOULD_BLOCK;                // full: retry later
 *       } else if (__atomic_load_n(&tail, __ATOMIC_RELAXED) == pos) {
 *           return DAMAGED;                    // seq from the future: the
 *       }                                      // peer wrote it
 *   }
 *   s->opcode = ...; ... s->segs[...] = ...;  // plain stores, not s->seq
 *   __atomic_store_n(&s->seq, pos + 1, __ATOMIC_SEQ_CST);    // publish
 *   if (__atomic_load_n(&hdr->sq_waiters, __ATOMIC_SEQ_CST) != 0) {
 *       __atomic_fetch_add(&hdr->sq_bell, 1, __ATOMIC_SEQ_CST);
 *       syscall(SYS_futex, &hdr->sq_bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
 *   }
 *
 * Consuming the CQ is the mirror image: ready when seq == pos + 1 (diff
 * computed against pos + 1; diff < 0 means empty), CAS the private head,
 * copy the 32-byte body out once, store seq = pos + cq_entries (RELEASE),
 * then act on the copy. Never act on the shared bytes.
 *
 * ------------------------------------------------------------------------
 * Doorbells
 * ------------------------------------------------------------------------
 * The futexes are NOT private (no FUTEX_PRIVATE_FLAG): the words are in a
 * MAP_SHARED memfd mapping and the sleeper is in the other process.
 * waiters counts the consuming side's sleepers (the Go client's reaper and
 * its callers of long calls, such as a sync, may sleep on cq_bell
 * together); the producer wakes them all while it is not zero. A consumer
 * going to sleep does
 *
 *   uint32_t v = __atomic_load_n(&hdr->cq_bell, __ATOMIC_ACQUIRE);
 *   __atomic_fetch_add(&hdr->cq_waiters, 1, __ATOMIC_SEQ_CST);
 *   if (!ready())                              // SEQ_CST load of next seq
 *       syscall(SYS_futex, &hdr->cq_bell, FUTEX_WAIT, v, &ts, NULL, 0);
 *   __atomic_fetch_sub(&hdr->cq_waiters, 1, __ATOMIC_SEQ_CST);
 *
 * (a side with one sleeper may store 1 and 0 instead)
 *
 * with ts no longer than WEIR_MAX_SLEEP_NS, so that it re-checks the peer's
 * liveness (socket EOF, pidfd, state word) at least that often. EAGAIN,
 * EINTR and ETIMEDOUT all mean "look again".
 */
#ifndef WEIR_RING_H
#define WEIR_RING_H

#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "weir ring ABI: little-endian hosts only"
#endif

/* Identification ("WEIRRING" read as a little-endian u64). */
#define WEIR_RING_MAGIC 0x474e495252494557ull
#define WEIR_RING_ABI_VERSION 1u

/* Sizes. */
#define WEIR_RING_HEADER_SIZE 4096u /* the header is the first page */
#define WEIR_PAGE_SIZE 4096u        /* alignment of SQ, CQ and arena */
#define WEIR_SQ_SLOT_SIZE 128u      /* sizeof(struct weir_sqe) */
#define WEIR_CQ_SLOT_SIZE 32u       /* sizeof(struct weir_cqe) */
#define WEIR_SEG_SIZE 8u            /* sizeof(struct weir_seg) */
#define WEIR_INLINE_SEGS 10u        /* segments inside a descriptor */
#define WEIR_MAX_SEGMENTS 1024u     /* per descriptor, inline or indirect */
#define WEIR_SEG_ALIGN 8u           /* segment / indirect table offsets */
#define WEIR_MAX_QUEUE_ENTRIES 65536u
#define WEIR_MAX_ARENA_SIZE 0x100000000ull /* arena_size must be below */

/* Feature bits (header features). A peer refuses unknown bits. */
#define WEIR_FEATURE_INDIRECT 0x1ull   /* descriptors may be indirect */
#define WEIR_FEATURE_HUGE_PAGES 0x2ull /* region is MFD_HUGETLB backed */
#define WEIR_KNOWN_FEATURES 0x3ull

/* Descriptor flag bits (weir_sqe.flags). Unknown bits: -EINVAL. */
#define WEIR_FLAG_INDIRECT 0x1u /* segs[0] names a table of nseg segs */
#define WEIR_KNOWN_FLAGS 0x1u

/* Session states (server_state, client_state). */
#define WEIR_STATE_INIT 0u
#define WEIR_STATE_RUNNING 1u
/* 2 is reserved: never written. */
#define WEIR_STATE_CLOSED 3u

/* Server hints (server_hints): advice a client may ignore. NO_SPIN: the
 * requests in flight across the server's sessions were at least half the
 * host's CPUs when it posted its last completion here; a client that spins
 * for a completion then holds a CPU the server or another client needs,
 * so it should sleep on cq_bell at once. */
#define WEIR_HINT_NO_SPIN 0x1u

/* Opcodes. 0 is invalid; 1..15 belong to the ring; services use 16..255. */
#define WEIR_OP_NOP 1u
#define WEIR_OP_ECHO 2u
#define WEIR_OP_FIRST_SERVICE 16u

/* Handshake: {u64 magic, u32 ABI version, u32 0}, little-endian. A
 * refusal is {WEIR_REFUSE_MAGIC, ABI version, u32 errno} with no fd, then
 * EOF: the server will not serve this peer (a limit of its uid's). */
#define WEIR_HELLO_MAGIC 0x4f4c454852494557ull  /* "WEIRHELO", server->client */
#define WEIR_ACK_MAGIC 0x4b43414852494557ull    /* "WEIRHACK", client->server */
#define WEIR_REFUSE_MAGIC 0x4b414e4852494557ull /* "WEIRHNAK", server->client */
#define WEIR_HELLO_LEN 16u
#define WEIR_HANDSHAKE_TIMEOUT_MS 5000u

/* Longest single futex sleep (ns) before re-checking peer liveness. */
#define WEIR_MAX_SLEEP_NS 50000000u

/* Header field offsets (bytes from the start of the region). */
#define WEIR_HDR_OFF_MAGIC 0u
#define WEIR_HDR_OFF_VERSION 8u
#define WEIR_HDR_OFF_HEADER_SIZE 12u
#define WEIR_HDR_OFF_FEATURES 16u
#define WEIR_HDR_OFF_SQ_ENTRIES 24u
#define WEIR_HDR_OFF_CQ_ENTRIES 28u
#define WEIR_HDR_OFF_SQ_SLOT_SIZE 32u
#define WEIR_HDR_OFF_CQ_SLOT_SIZE 36u
#define WEIR_HDR_OFF_BLOCK_SIZE 40u
#define WEIR_HDR_OFF_MAX_SEGMENTS 44u
#define WEIR_HDR_OFF_SQ_OFFSET 48u
#define WEIR_HDR_OFF_CQ_OFFSET 56u
#define WEIR_HDR_OFF_ARENA_OFFSET 64u
#define WEIR_HDR_OFF_ARENA_SIZE 72u
#define WEIR_HDR_OFF_TOTAL_SIZE 80u
#define WEIR_HDR_FIXED_LEN 88u /* immutable part, written once */
#define WEIR_HDR_OFF_SQ_BELL 128u
#define WEIR_HDR_OFF_SQ_WAITERS 132u
#define WEIR_HDR_OFF_CQ_BELL 192u
#define WEIR_HDR_OFF_CQ_WAITERS 196u
#define WEIR_HDR_OFF_SERVER_STATE 256u
#define WEIR_HDR_OFF_SERVER_HINTS 260u
#define WEIR_HDR_OFF_CLIENT_STATE 320u

/* Submission descriptor field offsets (bytes from the start of a slot). */
#define WEIR_SQE_OFF_SEQ 0u
#define WEIR_SQE_OFF_OPCODE 8u
#define WEIR_SQE_OFF_FLAGS 9u
#define WEIR_SQE_OFF_NSEG 10u
#define WEIR_SQE_OFF_ARG 12u
#define WEIR_SQE_OFF_REQ_ID 16u
#define WEIR_SQE_OFF_HANDLE 24u
#define WEIR_SQE_OFF_OFFSET 32u
#define WEIR_SQE_OFF_LENGTH 40u
#define WEIR_SQE_OFF_SEGS 48u

/* Completion field offsets. */
#define WEIR_CQE_OFF_SEQ 0u
#define WEIR_CQE_OFF_REQ_ID 8u
#define WEIR_CQE_OFF_RESULT 16u
#define WEIR_CQE_OFF_AUX 24u

/* One scatter-gather entry: len bytes at arena offset off. off is a
 * multiple of WEIR_SEG_ALIGN, len is not 0, off + len <= arena_size. */
struct weir_seg {
	uint32_t off;
	uint32_t len;
};

/* The header page. Fields up to total_size are immutable after creation.
 * Each doorbell and each state word has a cache line of its own. */
struct weir_ring_header {
	uint64_t magic;        /* WEIR_RING_MAGIC */
	uint32_t version;      /* WEIR_RING_ABI_VERSION */
	uint32_t header_size;  /* WEIR_RING_HEADER_SIZE */
	uint64_t features;     /* WEIR_FEATURE_* */
	uint32_t sq_entries;   /* power of two in [2, 65536] */
	uint32_t cq_entries;   /* power of two in [sq_entries, 65536] */
	uint32_t sq_slot_size; /* WEIR_SQ_SLOT_SIZE */
	uint32_t cq_slot_size; /* WEIR_CQ_SLOT_SIZE */
	uint32_t block_size;   /* arena unit: power of two in [64, 1 MiB] */
	uint32_t max_segments; /* in [1, WEIR_MAX_SEGMENTS] */
	uint64_t sq_offset;    /* == WEIR_RING_HEADER_SIZE */
	uint64_t cq_offset;    /* page aligned, after the SQ */
	uint64_t arena_offset; /* page aligned, after the CQ */
	uint64_t arena_size;   /* multiple of block_size, < 4 GiB */
	uint64_t total_size;   /* size of the memfd */
	uint8_t _pad0[WEIR_HDR_OFF_SQ_BELL - WEIR_HDR_FIXED_LEN];

	uint32_t sq_bell;    /* futex: the server sleeps here; clients bump it */
	uint32_t sq_waiters; /* 1 while the server may sleep on sq_bell */
	uint8_t _pad1[WEIR_HDR_OFF_CQ_BELL - WEIR_HDR_OFF_SQ_WAITERS - 4];

	uint32_t cq_bell;    /* futex: the client sleeps here; the server bumps it */
	uint32_t cq_waiters; /* 1 while the client may sleep on cq_bell */
	uint8_t _pad2[WEIR_HDR_OFF_SERVER_STATE - WEIR_HDR_OFF_CQ_WAITERS - 4];

	uint32_t server_state; /* WEIR_STATE_*, written only by the server */
	uint32_t server_hints; /* WEIR_HINT_*, written only by the server */
	uint8_t _pad3[WEIR_HDR_OFF_CLIENT_STATE - WEIR_HDR_OFF_SERVER_HINTS - 4];

	uint32_t client_state; /* WEIR_STATE_*, written only by the client */
	uint8_t _pad4[WEIR_RING_HEADER_SIZE - WEIR_HDR_OFF_CLIENT_STATE - 4];
};

/* One SQ slot: a submission descriptor. */
struct weir_sqe {
	uint64_t seq;    /* queue sequence word; atomic, see above */
	uint8_t opcode;  /* WEIR_OP_* or a service opcode; 0 is invalid */
	uint8_t flags;   /* WEIR_FLAG_* */
	uint16_t nseg;   /* segments in segs[] or in the indirect table */
	uint32_t arg;    /* opcode-specific */
	uint64_t req_id; /* echoed in the completion */
	uint64_t handle; /* opcode-specific object (file, blob) */
	uint64_t offset; /* opcode-specific byte offset in that object */
	uint64_t length; /* sum of the segment lengths */
	struct weir_seg segs[WEIR_INLINE_SEGS]; /* or segs[0] = indirect table */
};

/* One CQ slot: a completion. */
struct weir_cqe {
	uint64_t seq;    /* queue sequence word; atomic, see above */
	uint64_t req_id; /* the descriptor's req_id */
	int64_t result;  /* >= 0: opcode-specific; < 0: -errno */
	uint64_t aux;    /* opcode-specific */
};

#define WEIR_ASSERT_OFF(type, field, off) \
	_Static_assert(offsetof(type, field) == (off), #type "." #field " offset")

WEIR_ASSERT_OFF(struct weir_seg, off, 0);
WEIR_ASSERT_OFF(struct weir_seg, len, 4);
_Static_assert(sizeof(struct weir_seg) == WEIR_SEG_SIZE, "weir_seg size");

WEIR_ASSERT_OFF(struct weir_ring_header, magic, WEIR_HDR_OFF_MAGIC);
WEIR_ASSERT_OFF(struct weir_ring_header, version, WEIR_HDR_OFF_VERSION);
WEIR_ASSERT_OFF(struct weir_ring_header, header_size, WEIR_HDR_OFF_HEADER_SIZE);
WEIR_ASSERT_OFF(struct weir_ring_header, features, WEIR_HDR_OFF_FEATURES);
WEIR_ASSERT_OFF(struct weir_ring_header, sq_entries, WEIR_HDR_OFF_SQ_ENTRIES);
WEIR_ASSERT_OFF(struct weir_ring_header, cq_entries, WEIR_HDR_OFF_CQ_ENTRIES);
WEIR_ASSERT_OFF(struct weir_ring_header, sq_slot_size, WEIR_HDR_OFF_SQ_SLOT_SIZE);
WEIR_ASSERT_OFF(struct weir_ring_header, cq_slot_size, WEIR_HDR_OFF_CQ_SLOT_SIZE);
WEIR_ASSERT_OFF(struct weir_ring_header, block_size, WEIR_HDR_OFF_BLOCK_SIZE);
WEIR_ASSERT_OFF(struct weir_ring_header, max_segments, WEIR_HDR_OFF_MAX_SEGMENTS);
WEIR_ASSERT_OFF(struct weir_ring_header, sq_offset, WEIR_HDR_OFF_SQ_OFFSET);
WEIR_ASSERT_OFF(struct weir_ring_header, cq_offset, WEIR_HDR_OFF_CQ_OFFSET);
WEIR_ASSERT_OFF(struct weir_ring_header, arena_offset, WEIR_HDR_OFF_ARENA_OFFSET);
WEIR_ASSERT_OFF(struct weir_ring_header, arena_size, WEIR_HDR_OFF_ARENA_SIZE);
WEIR_ASSERT_OFF(struct weir_ring_header, total_size, WEIR_HDR_OFF_TOTAL_SIZE);
WEIR_ASSERT_OFF(struct weir_ring_header, _pad0, WEIR_HDR_FIXED_LEN);
WEIR_ASSERT_OFF(struct weir_ring_header, sq_bell, WEIR_HDR_OFF_SQ_BELL);
WEIR_ASSERT_OFF(struct weir_ring_header, sq_waiters, WEIR_HDR_OFF_SQ_WAITERS);
WEIR_ASSERT_OFF(struct weir_ring_header, cq_bell, WEIR_HDR_OFF_CQ_BELL);
WEIR_ASSERT_OFF(struct weir_ring_header, cq_waiters, WEIR_HDR_OFF_CQ_WAITERS);
WEIR_ASSERT_OFF(struct weir_ring_header, server_state, WEIR_HDR_OFF_SERVER_STATE);
WEIR_ASSERT_OFF(struct weir_ring_header, server_hints, WEIR_HDR_OFF_SERVER_HINTS);
WEIR_ASSERT_OFF(struct weir_ring_header, client_state, WEIR_HDR_OFF_CLIENT_STATE);
_Static_assert(sizeof(struct weir_ring_header) == WEIR_RING_HEADER_SIZE, "weir_ring_header size");

WEIR_ASSERT_OFF(struct weir_sqe, seq, WEIR_SQE_OFF_SEQ);
WEIR_ASSERT_OFF(struct weir_sqe, opcode, WEIR_SQE_OFF_OPCODE);
WEIR_ASSERT_OFF(struct weir_sqe, flags, WEIR_SQE_OFF_FLAGS);
WEIR_ASSERT_OFF(struct weir_sqe, nseg, WEIR_SQE_OFF_NSEG);
WEIR_ASSERT_OFF(struct weir_sqe, arg, WEIR_SQE_OFF_ARG);
WEIR_ASSERT_OFF(struct weir_sqe, req_id, WEIR_SQE_OFF_REQ_ID);
WEIR_ASSERT_OFF(struct weir_sqe, handle, WEIR_SQE_OFF_HANDLE);
WEIR_ASSERT_OFF(struct weir_sqe, offset, WEIR_SQE_OFF_OFFSET);
WEIR_ASSERT_OFF(struct weir_sqe, length, WEIR_SQE_OFF_LENGTH);
WEIR_ASSERT_OFF(struct weir_sqe, segs, WEIR_SQE_OFF_SEGS);
_Static_assert(sizeof(struct weir_sqe) == WEIR_SQ_SLOT_SIZE, "weir_sqe size");

WEIR_ASSERT_OFF(struct weir_cqe, seq, WEIR_CQE_OFF_SEQ);
WEIR_ASSERT_OFF(struct weir_cqe, req_id, WEIR_CQE_OFF_REQ_ID);
WEIR_ASSERT_OFF(struct weir_cqe, result, WEIR_CQE_OFF_RESULT);
WEIR_ASSERT_OFF(struct weir_cqe, aux, WEIR_CQE_OFF_AUX);
_Static_assert(sizeof(struct weir_cqe) == WEIR_CQ_SLOT_SIZE, "weir_cqe size");

#undef WEIR_ASSERT_OFF

#endif /* WEIR_RING_H */
