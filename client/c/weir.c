/*
 * libweir: the ring ABI's client side and the protocol's first calls.
 * See weir.h for what is built; docs/ring-abi.md and proto/doc.go are the
 * contracts this file follows, section by section.
 */
#define _GNU_SOURCE
#include "weir.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "weir_cache.h"
#include "weir_ring.h"

/* One ring: a session with one service (docs/ring-abi.md). */
struct ring {
	int sock;
	uint8_t *base;
	size_t size;
	struct weir_ring_header geo; /* private copy of the immutable part (§2) */
	uint64_t sq_tail, cq_head;   /* private positions (§5) */
	uint64_t next_id;
	int64_t sync_mean; /* ns, the recent mean of WEIR_OP_SYNC calls (0: none yet) */
	int dead; /* the session is over: every call fails with EPIPE */
	int inited; /* mu is initialised (ring_dial ran) */
	pthread_mutex_t mu;
};

/* A file message the io socket brought that no caller has taken yet. */
struct pending_file {
	uint64_t tag;
	int fd; /* -1: free */
};
#define MAX_PENDING_FILES 8

/* A handle as this session holds it (FeatureLeases and FeatureCaps): the
 * data handle its IO requests name, and how it gets its grant at io. */
struct hrec {
	uint64_t h, dh; /* h 0: free; ~0: deleted */
	uint8_t granted, has_cap, writable;
	uint8_t cap[WEIR_CAP_SIZE];
};

struct weir_fs {
	struct ring meta, io;
	uint64_t features;     /* what the metadata service answered */
	pthread_mutex_t hmu;   /* recs */
	struct hrec *recs;     /* open addressing by h */
	size_t nrecs, caprecs; /* used (deleted included), slots */
	/* Capabilities of kept leases never claimed (a read-only file opened
	 * and closed before its first read): by data handle, for the next
	 * open of the file, which the service answers as granted under that
	 * lease although io never heard of it. Under hmu. */
	struct {
		uint64_t dh;
		uint8_t cap[WEIR_CAP_SIZE];
	} kept[64];
	unsigned kept_next;
	pthread_mutex_t files_mu; /* the io socket's reads, and files[] */
	struct pending_file files[MAX_PENDING_FILES];
	uint32_t version;
	uint64_t session;
	uint8_t token[WEIR_TOKEN_SIZE];
	/* Where weir is mounted on the host (weir_set_mount; "" until then):
	 * an absolute link target under it stays in weir. */
	char mount[WEIR_MAX_PATH + 1];
	/* Write windows (docs/cache-abi.md §7): the session's write log,
	 * mapped read-write at the first window (NULL until then), and what
	 * each of its slots holds. Fast writes take wmu shared, pins and
	 * unpins exclusive. */
	pthread_rwlock_t wmu;
	uint8_t *wlog;
	int wlog_failed;     /* io gave no log: no windows for this session */
	int64_t wfull_until; /* io refused a pin (ENOMEM): none asked before then */
	struct wwin {
		weir_cache *c; /* whose window (NULL: the slot is free) */
		uint64_t win;  /* the window: file bytes [win, win + 1) * WIN_BYTES */
		int64_t used;  /* its last store, for the choice of a slot to free */
	} wins[WEIR_WRITE_LOG_SLOTS];
};

/* A call's bound on one request's payload (a client policy). */
#define CHUNK (1u << 20)
/* How long a caller spins for its completion before it sleeps. */
#define SPIN_NS 50000L
/* A sync request (fsync, fdatasync) waits for a device flush, tens of µs
 * on a fast device: its caller spins for up to twice the recent mean of
 * its ring's syncs (SYNC_SPIN_MAX_NS at most; SPIN_NS when the mean is
 * past that bound, a slow device, or when the service asks its clients
 * not to spin). Sleeping instead costs the caller a wake-up, which on an
 * idle vCPU of a VM is 15-70 µs: as much as the flush (docs/benchmarks.md,
 * "The shim"). The mean starts at SYNC_MEAN0_NS. */
#define SYNC_SPIN_MAX_NS 1000000L
#define SYNC_MEAN0_NS 150000L

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

static inline uint32_t *word32(struct ring *r, size_t off) { return (uint32_t *)(r->base + off); }

static inline uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static inline uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static inline void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static long futex(uint32_t *w, int op, uint32_t val, const struct timespec *ts)
{
	/* Not FUTEX_PRIVATE_FLAG: the sleeper and the waker are two processes (§8). */
	return syscall(SYS_futex, w, op, val, ts, NULL, 0);
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int pow2_in(uint32_t v, uint32_t lo, uint32_t hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

/* validate is Geometry.Validate (§2, "Attaching", step 5), on the
 * private copy g, for a memfd of size bytes. */
static int validate(const struct weir_ring_header *g, uint64_t size)
{
	if (g->magic != WEIR_RING_MAGIC || g->version != WEIR_RING_ABI_VERSION || g->header_size != WEIR_RING_HEADER_SIZE ||
	    g->sq_slot_size != WEIR_SQ_SLOT_SIZE || g->cq_slot_size != WEIR_CQ_SLOT_SIZE)
		return -EPROTO;
	if ((g->features & ~WEIR_KNOWN_FEATURES) != 0 || !pow2_in(g->sq_entries, 2, WEIR_MAX_QUEUE_ENTRIES) ||
	    !pow2_in(g->cq_entries, g->sq_entries, WEIR_MAX_QUEUE_ENTRIES) || !pow2_in(g->block_size, 64, 1u << 20) ||
	    g->max_segments < 1 || g->max_segments > WEIR_MAX_SEGMENTS || g->sq_offset != WEIR_RING_HEADER_SIZE)
		return -EPROTO;
	/* No sum below can wrap: each operand is checked against total_size first. */
	if (g->total_size != size || g->cq_offset > g->total_size || g->arena_offset > g->total_size)
		return -EPROTO;
	if (g->cq_offset % WEIR_PAGE_SIZE != 0 || g->cq_offset < g->sq_offset + (uint64_t)g->sq_entries * WEIR_SQ_SLOT_SIZE)
		return -EPROTO;
	if (g->arena_offset % WEIR_PAGE_SIZE != 0 || g->arena_offset < g->cq_offset + (uint64_t)g->cq_entries * WEIR_CQ_SLOT_SIZE)
		return -EPROTO;
	if (g->arena_size == 0 || g->arena_size >= WEIR_MAX_ARENA_SIZE || g->arena_size % g->block_size != 0 ||
	    g->arena_size > g->total_size - g->arena_offset)
		return -EPROTO;
	return 0;
}

/* attach checks the region memfd fd and maps it (§2, "Attaching"). */
static int attach(struct ring *r, int fd)
{
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return -EPROTO; /* it could shrink under the mapping (SIGBUS) */
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (st.st_size < (off_t)WEIR_RING_HEADER_SIZE)
		return -EPROTO;
	memset(&r->geo, 0, sizeof r->geo);
	if (pread(fd, &r->geo, WEIR_HDR_FIXED_LEN, 0) != (ssize_t)WEIR_HDR_FIXED_LEN)
		return -EPROTO;
	int err = validate(&r->geo, (uint64_t)st.st_size);
	if (err)
		return err;
	void *p = mmap(NULL, r->geo.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	r->base = p;
	r->size = r->geo.total_size;
	return 0;
}

/* handshake receives the hello and its memfd, attaches, and acks (§6). */
static int handshake(struct ring *r)
{
	uint8_t msg[WEIR_HELLO_LEN];
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(4 * sizeof(int))];
	} ctl;
	struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
	ssize_t n = recvmsg(r->sock, &mh, MSG_CMSG_CLOEXEC);
	int fds[4] = {-1, -1, -1, -1}, nfd = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k && nfd < 4; i++)
			memcpy(&fds[nfd++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	int err = 0;
	if (n < 0)
		err = -errno;
	else if (n == (ssize_t)sizeof msg && nfd == 0 && get64(msg) == WEIR_REFUSE_MAGIC &&
		 get32(msg + 8) == WEIR_RING_ABI_VERSION && get32(msg + 12) >= 1 && get32(msg + 12) <= 4095)
		err = -(int)get32(msg + 12); /* refused: a limit of this uid's (EAGAIN, EUSERS) */
	else if (n != (ssize_t)sizeof msg || nfd != 1 || (mh.msg_flags & MSG_CTRUNC) || get64(msg) != WEIR_HELLO_MAGIC ||
		 get32(msg + 8) != WEIR_RING_ABI_VERSION || get32(msg + 12) != 0)
		err = -EPROTO;
	if (!err)
		err = attach(r, fds[0]);
	for (int i = 0; i < nfd; i++)
		close(fds[i]); /* the mapping keeps the region */
	if (err)
		return err;
	put64(msg, WEIR_ACK_MAGIC);
	put32(msg + 8, WEIR_RING_ABI_VERSION);
	put32(msg + 12, 0);
	if (send(r->sock, msg, sizeof msg, MSG_NOSIGNAL) != (ssize_t)sizeof msg)
		return errno ? -errno : -EPIPE;
	__atomic_store_n(word32(r, WEIR_HDR_OFF_CLIENT_STATE), WEIR_STATE_RUNNING, __ATOMIC_RELEASE);
	return 0;
}

/* move_high moves fd to a number at the top of the process's range, so
 * that a program under the shim, which knows nothing of it, does not
 * close it or dup2 over it as one of its own low numbers (dash moves fd
 * 3 away for "exec 3>file"). */
static int move_high(int fd)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < 256)
		return fd;
	rlim_t top = rl.rlim_cur > (1u << 20) ? (1u << 20) : rl.rlim_cur;
	int hi = fcntl(fd, F_DUPFD_CLOEXEC, (int)(top - 64));
	if (hi < 0)
		return fd;
	close(fd);
	return hi;
}

static int ring_dial(struct ring *r, const char *path)
{
	memset(r, 0, sizeof *r);
	r->sock = -1;
	pthread_mutex_init(&r->mu, NULL);
	r->inited = 1;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path)
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	r->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (r->sock < 0)
		return -errno;
	r->sock = move_high(r->sock);
	struct timeval tv = {.tv_sec = WEIR_HANDSHAKE_TIMEOUT_MS / 1000};
	setsockopt(r->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(r->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(r->sock, (struct sockaddr *)&sa, sizeof sa) < 0)
		return -errno;
	return handshake(r);
}

static void ring_close(struct ring *r)
{
	if (r->base) {
		__atomic_store_n(word32(r, WEIR_HDR_OFF_CLIENT_STATE), WEIR_STATE_CLOSED, __ATOMIC_RELEASE);
		uint32_t *bell = word32(r, WEIR_HDR_OFF_SQ_BELL);
		__atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
		futex(bell, FUTEX_WAKE, 1 << 30, NULL); /* the server sees the close at once */
		munmap(r->base, r->size);
		r->base = NULL;
	}
	if (r->sock >= 0)
		close(r->sock);
	r->sock = -1;
	if (r->inited)
		pthread_mutex_destroy(&r->mu);
	r->inited = 0;
}

/* peer_gone reports whether the service closed the socket or its session
 * (§7, §8): then no completion will come. */
static int peer_gone(struct ring *r)
{
	if (__atomic_load_n(word32(r, WEIR_HDR_OFF_SERVER_STATE), __ATOMIC_ACQUIRE) == WEIR_STATE_CLOSED)
		return 1;
	struct pollfd p = {.fd = r->sock, .events = POLLIN | POLLRDHUP};
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
		return 1;
	return 0;
}

/* reap takes the next completion if one is published: 1 with *c filled,
 * 0 if the CQ is empty, -EIO if the peer wrote a sequence from the future. */
static int reap(struct ring *r, struct weir_cqe *c)
{
	uint64_t pos = r->cq_head;
	uint8_t *slot = r->base + r->geo.cq_offset + (pos & (r->geo.cq_entries - 1)) * WEIR_CQ_SLOT_SIZE;
	uint64_t seq = __atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE);
	int64_t diff = (int64_t)(seq - (pos + 1));
	if (diff < 0)
		return 0;
	if (diff > 0)
		return -EIO;
	memcpy(c, slot, sizeof *c);
	__atomic_store_n((uint64_t *)slot, pos + r->geo.cq_entries, __ATOMIC_RELEASE);
	r->cq_head = pos + 1;
	return 1;
}

/* wait_for waits for the completion of req_id; r->mu is held. */
static int wait_for(struct ring *r, uint64_t id, struct weir_cqe *c, long spin)
{
	int64_t spin_until = now_ns() + spin;
	uint32_t *bell = word32(r, WEIR_HDR_OFF_CQ_BELL), *waiters = word32(r, WEIR_HDR_OFF_CQ_WAITERS);
	for (;;) {
		int got = reap(r, c);
		if (got < 0)
			return got;
		if (got) {
			if (c->req_id == id)
				return 0;
			continue; /* a stray: no request of ours waits for it */
		}
		if (now_ns() < spin_until) {
			cpu_relax();
			continue;
		}
		if (peer_gone(r))
			return -EPIPE;
		uint32_t v = __atomic_load_n(bell, __ATOMIC_ACQUIRE);
		__atomic_store_n(waiters, 1, __ATOMIC_SEQ_CST);
		__atomic_thread_fence(__ATOMIC_SEQ_CST); /* the re-check's load after the store (§5) */
		got = reap(r, c);
		if (got == 0) {
			struct timespec ts = {.tv_nsec = WEIR_MAX_SLEEP_NS};
			futex(bell, FUTEX_WAIT, v, &ts); /* EAGAIN, EINTR, ETIMEDOUT: look again */
		}
		__atomic_store_n(waiters, 0, __ATOMIC_SEQ_CST);
		if (got < 0)
			return got;
		if (got && c->req_id == id)
			return 0;
	}
}

/* sync_spin is how long a sync request's caller spins (SYNC_SPIN_MAX_NS
 * above); r->mu is held. */
static long sync_spin(struct ring *r)
{
	int64_t m = r->sync_mean ? r->sync_mean : SYNC_MEAN0_NS;
	if (2 * m > SYNC_SPIN_MAX_NS ||
	    (__atomic_load_n(word32(r, WEIR_HDR_OFF_SERVER_HINTS), __ATOMIC_RELAXED) & WEIR_HINT_NO_SPIN))
		return SPIN_NS;
	return 2 * m < SPIN_NS ? SPIN_NS : (long)(2 * m);
}

/* call sends one request with a payload of max(inlen, outlen) bytes
 * (in copied in first) and waits for it; out receives the answer's
 * bytes. It returns the completion's result; *aux its aux. */
static int64_t call(struct ring *r, uint8_t op, uint32_t arg, uint64_t handle, uint64_t off, const void *in,
		    size_t inlen, void *out, size_t outlen, uint64_t *aux)
{
	size_t len = inlen > outlen ? inlen : outlen;
	if (len > r->geo.arena_size || len > UINT32_MAX)
		return -E2BIG;
	pthread_mutex_lock(&r->mu);
	int64_t res;
	if (r->dead) {
		res = -EPIPE;
		goto out;
	}
	uint8_t *arena = r->base + r->geo.arena_offset;
	if (inlen)
		memcpy(arena, in, inlen); /* one request at a time: its payload is the arena's start */
	uint64_t pos = r->sq_tail;
	uint8_t *slot = r->base + r->geo.sq_offset + (pos & (r->geo.sq_entries - 1)) * WEIR_SQ_SLOT_SIZE;
	uint64_t seq = __atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE);
	int64_t diff = (int64_t)(seq - pos);
	if (diff != 0) {
		/* With one request at a time the slot is free unless the
		 * server never took an earlier one (full) or wrote a
		 * sequence from the future (corrupt): the session is over. */
		r->dead = 1;
		res = diff < 0 ? -EBUSY : -EIO;
		goto out;
	}
	uint64_t id = ++r->next_id;
	struct weir_sqe *d = (struct weir_sqe *)slot;
	d->opcode = op;
	d->flags = 0;
	d->nseg = len ? 1 : 0;
	d->arg = arg;
	d->req_id = id;
	d->handle = handle;
	d->offset = off;
	d->length = len;
	d->segs[0].off = 0;
	d->segs[0].len = (uint32_t)len;
	__atomic_store_n((uint64_t *)slot, pos + 1, __ATOMIC_SEQ_CST);
	r->sq_tail = pos + 1;
	if (__atomic_load_n(word32(r, WEIR_HDR_OFF_SQ_WAITERS), __ATOMIC_SEQ_CST) != 0) {
		uint32_t *bell = word32(r, WEIR_HDR_OFF_SQ_BELL);
		__atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
		futex(bell, FUTEX_WAKE, 1 << 30, NULL);
	}
	struct weir_cqe c;
	int64_t t0 = op == WEIR_OP_SYNC ? now_ns() : 0;
	int err = wait_for(r, id, &c, op == WEIR_OP_SYNC ? sync_spin(r) : SPIN_NS);
	if (op == WEIR_OP_SYNC && !err) {
		int64_t d = now_ns() - t0, m = r->sync_mean ? r->sync_mean : SYNC_MEAN0_NS;
		r->sync_mean = m + (d - m) / 8;
	}
	if (err) {
		r->dead = 1;
		res = err;
		goto out;
	}
	res = c.result;
	if (aux)
		*aux = c.aux;
	if (res > 0 && out) {
		if ((uint64_t)res > len) {
			res = -EIO; /* more than the buffer: a broken service */
			goto out;
		}
		memcpy(out, arena, (size_t)res < outlen ? (size_t)res : outlen);
	}
out:
	pthread_mutex_unlock(&r->mu);
	return res;
}

/* The most times one request is granted again after io refused it
 * (EBADF): each time another trust group's grant recalled the handle's
 * in between (the Go client's maxRegrants). */
#define MAX_REGRANTS 8

/* The handle table. */
#define H_DELETED (~(uint64_t)0)

static struct hrec *hfind(weir_fs *fs, uint64_t h)
{
	if (!fs->caprecs || h == 0 || h == H_DELETED)
		return NULL;
	for (size_t i = (size_t)(h * 0x9e3779b97f4a7c15ull) & (fs->caprecs - 1), k = 0; k < fs->caprecs; k++, i = (i + 1) & (fs->caprecs - 1)) {
		if (fs->recs[i].h == h)
			return &fs->recs[i];
		if (fs->recs[i].h == 0)
			return NULL;
	}
	return NULL;
}

static int hput(weir_fs *fs, const struct hrec *r)
{
	if ((fs->nrecs + 1) * 2 > fs->caprecs) {
		/* Full of live and deleted slots: rebuilt, twice as large only
		 * if the live ones fill a quarter (an open-close workload keeps
		 * the table small). */
		size_t live = 0;
		for (size_t i = 0; i < fs->caprecs; i++)
			live += fs->recs[i].h && fs->recs[i].h != H_DELETED;
		size_t n = !fs->caprecs ? 64 : (live + 1) * 4 > fs->caprecs ? fs->caprecs * 2 : fs->caprecs;
		struct hrec *old = fs->recs, *nr = calloc(n, sizeof *nr);
		size_t oldn = fs->caprecs;
		if (!nr)
			return -ENOMEM;
		fs->recs = nr;
		fs->caprecs = n;
		fs->nrecs = 0;
		for (size_t i = 0; i < oldn; i++)
			if (old[i].h && old[i].h != H_DELETED)
				hput(fs, &old[i]);
		free(old);
	}
	for (size_t i = (size_t)(r->h * 0x9e3779b97f4a7c15ull) & (fs->caprecs - 1);; i = (i + 1) & (fs->caprecs - 1))
		if (fs->recs[i].h == 0 || fs->recs[i].h == H_DELETED || fs->recs[i].h == r->h) {
			if (fs->recs[i].h == 0)
				fs->nrecs++;
			fs->recs[i] = *r;
			return 0;
		}
}

static void hdel(weir_fs *fs, uint64_t h)
{
	pthread_mutex_lock(&fs->hmu);
	struct hrec *r = hfind(fs, h);
	if (r) {
		if (r->has_cap && !r->granted && r->dh != h) {
			unsigned i = fs->kept_next++ % 64;
			fs->kept[i].dh = r->dh;
			memcpy(fs->kept[i].cap, r->cap, WEIR_CAP_SIZE);
		}
		r->h = H_DELETED;
	}
	pthread_mutex_unlock(&fs->hmu);
}

/* kept_cap takes the unclaimed capability of kept lease dh into r. */
static void kept_cap(weir_fs *fs, struct hrec *r)
{
	for (int i = 0; i < 64; i++)
		if (fs->kept[i].dh == r->dh) {
			r->granted = 0;
			r->has_cap = 1;
			memcpy(r->cap, fs->kept[i].cap, WEIR_CAP_SIZE);
			fs->kept[i].dh = 0;
			return;
		}
}

/* through_io grants handle h at io over the control plane
 * (WEIR_GRANT_THROUGH_IO): a capability's claim failed, or io does not
 * hold a grant metadata recorded as made. */
static int64_t through_io(weir_fs *fs, uint64_t h, uint64_t *dh)
{
	uint64_t aux = 0;
	int64_t g = call(&fs->meta, WEIR_OP_GRANT, WEIR_GRANT_THROUGH_IO, h, 0, NULL, 0, NULL, 0, &aux);
	if (g < 0)
		return g;
	*dh = (fs->features & WEIR_FEATURE_LEASES) && aux ? aux : h;
	return 0;
}

/* claim claims capability cap of data handle dh at io; refused, the grant
 * goes through io. */
static int64_t claim(weir_fs *fs, uint64_t h, const uint8_t *cap, uint64_t *dh)
{
	int64_t c = call(&fs->io, WEIR_OP_CLAIM, 0, *dh, 0, cap, WEIR_CAP_SIZE, NULL, 0, NULL);
	if (c == 0)
		return 0;
	if (c == -EPIPE)
		return c;
	return through_io(fs, h, dh);
}

/* grant grants handle h (whose record is r, copied out) at io, before its
 * first data request (proto/doc.go's grant rule): by its open's
 * capability, or OpGrant (a read-only handle's answers a capability to
 * claim; a writable one's its lease epoch, unused here). */
static int64_t grant(weir_fs *fs, uint64_t h, const struct hrec *r, uint64_t *dh)
{
	*dh = r->dh;
	if (r->has_cap)
		return claim(fs, h, r->cap, dh);
	uint8_t buf[WEIR_CAP_SIZE];
	uint64_t aux = 0;
	size_t want = !(fs->features & WEIR_FEATURE_CAPS) ? 0 : r->writable ? WEIR_TENURE_SIZE : WEIR_CAP_SIZE;
	int64_t g = call(&fs->meta, WEIR_OP_GRANT, 0, h, 0, NULL, 0, want ? buf : NULL, want, &aux);
	if (g < 0)
		return g;
	*dh = (fs->features & WEIR_FEATURE_LEASES) && aux ? aux : h;
	if (!r->writable && g == WEIR_CAP_SIZE)
		return claim(fs, h, buf, dh);
	if (g != 0 && !(r->writable && g == WEIR_TENURE_SIZE))
		return -EPROTO;
	return 0;
}

/* data_handle returns the data handle of h's IO requests, granting it
 * first if it is not yet. */
static int64_t data_handle(weir_fs *fs, uint64_t h, uint64_t *dh)
{
	pthread_mutex_lock(&fs->hmu);
	struct hrec *p = hfind(fs, h);
	if (!p) {
		pthread_mutex_unlock(&fs->hmu);
		*dh = h; /* not one of weir_open's: io answers for it */
		return 0;
	}
	struct hrec r = *p;
	pthread_mutex_unlock(&fs->hmu);
	if (r.granted) {
		*dh = r.dh;
		return 0;
	}
	int64_t e = grant(fs, h, &r, dh);
	if (e)
		return e;
	pthread_mutex_lock(&fs->hmu);
	if ((p = hfind(fs, h)) != NULL) {
		p->granted = 1;
		p->has_cap = 0; /* (spent) */
		p->dh = *dh;
	}
	pthread_mutex_unlock(&fs->hmu);
	return 0;
}

/* regrant asks for h's grant again after io answered EBADF on dh: another
 * trust group's grant recalled it, or a grant metadata recorded as made
 * never reached io (a kept lease of a capability never claimed). A
 * read-only handle asks through io, which covers both. */
static int64_t regrant(weir_fs *fs, uint64_t h, uint64_t *dh)
{
	pthread_mutex_lock(&fs->hmu);
	struct hrec *p = hfind(fs, h);
	struct hrec r = p ? *p : (struct hrec){.h = h, .dh = h, .writable = 1};
	pthread_mutex_unlock(&fs->hmu);
	int64_t e;
	if (r.writable) {
		r.has_cap = 0;
		e = grant(fs, h, &r, dh);
	} else {
		e = through_io(fs, h, dh);
	}
	if (e)
		return e;
	pthread_mutex_lock(&fs->hmu);
	if ((p = hfind(fs, h)) != NULL) {
		p->granted = 1;
		p->has_cap = 0;
		p->dh = *dh;
	}
	pthread_mutex_unlock(&fs->hmu);
	return 0;
}

/* MAX_REGRANTS bounds the regrants of one request: each one is a grant
 * another trust group's recalled in between (the Go client's maxRegrants). */
#define MAX_REGRANTS 8

/* io_call is call on the IO ring for a request naming handle (a metadata
 * handle: the request names its data handle, granted first if need be);
 * an EBADF asks for the grant again and sends the request again, as
 * proto/doc.go's grant rule says. */
static int64_t io_call(weir_fs *fs, uint8_t op, uint32_t arg, uint64_t handle, uint64_t off, const void *in,
		       size_t inlen, void *out, size_t outlen, uint64_t *aux)
{
	uint64_t dh;
	int64_t res = data_handle(fs, handle, &dh);
	if (res < 0)
		return res == -EBADF ? -EBADF : res;
	res = call(&fs->io, op, arg, dh, off, in, inlen, out, outlen, aux);
	for (int i = 0; res == -EBADF && i < MAX_REGRANTS; i++) {
		int64_t g = regrant(fs, handle, &dh);
		if (g < 0)
			return g == -EBADF ? res : g; /* not a handle of ours: io's EBADF stands */
		res = call(&fs->io, op, arg, dh, off, in, inlen, out, outlen, aux);
	}
	return res;
}

#define WANT_FEATURES                                                                                       \
	(WEIR_FEATURE_REOPEN | WEIR_FEATURE_LEASES | WEIR_FEATURE_CAPS | WEIR_FEATURE_OPEN_CAP | WEIR_FEATURE_LINKS | \
	 WEIR_FEATURE_MOUNTED | WEIR_FEATURE_RECORD_CUTS)

int weir_dial(const char *meta_sock, const char *io_sock, weir_fs **out)
{
	weir_fs *fs = calloc(1, sizeof *fs);
	if (!fs)
		return -ENOMEM;
	fs->meta.sock = fs->io.sock = -1; /* (0 is the program's stdin: never ours to close) */
	pthread_mutex_init(&fs->files_mu, NULL);
	pthread_mutex_init(&fs->hmu, NULL);
	/* Writers first: a pin or a close (wmu exclusive) must not wait
	 * behind a steady stream of window stores (wmu shared). */
	pthread_rwlockattr_t wa;
	pthread_rwlockattr_init(&wa);
	pthread_rwlockattr_setkind_np(&wa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&fs->wmu, &wa);
	pthread_rwlockattr_destroy(&wa);
	for (int i = 0; i < MAX_PENDING_FILES; i++)
		fs->files[i].fd = -1;
	int err = ring_dial(&fs->meta, meta_sock);
	if (!err)
		err = ring_dial(&fs->io, io_sock);
	uint8_t b[WEIR_HELLO_RESP_SIZE] = {0};
	if (!err) {
		put32(b, WEIR_PROTO_MIN_VERSION);
		put32(b + 4, WEIR_PROTO_MAX_VERSION);
		/* Tickets (a description shared across fork and exec:
		 * weir_inherit); kept leases and read capabilities, so that a
		 * read-only open, and an open of a file this session opened
		 * before, cost no round trip between the services. */
		put64(b + 8, WANT_FEATURES);
		int64_t res = call(&fs->meta, WEIR_OP_HELLO, 0, 0, 0, b, 16, b, sizeof b, NULL);
		if (res < 0)
			err = (int)res;
		else if (res != WEIR_HELLO_RESP_SIZE || (get64(b + 8) & ~WANT_FEATURES) || !(get64(b + 8) & WEIR_FEATURE_REOPEN) ||
			 ((get64(b + 8) & WEIR_FEATURE_OPEN_CAP) && (get64(b + 8) & (WEIR_FEATURE_LEASES | WEIR_FEATURE_CAPS)) !=
									   (WEIR_FEATURE_LEASES | WEIR_FEATURE_CAPS)))
			err = -EPROTO; /* (a service that cannot issue tickets is too old for this library) */
		else
			fs->features = get64(b + 8);
	}
	if (!err) {
		fs->version = get32(b);
		fs->session = get64(b + 16);
		memcpy(fs->token, b + 24, WEIR_TOKEN_SIZE);
		uint8_t a[WEIR_ATTACH_REQ_SIZE] = {0};
		put32(a, fs->version);
		put64(a + 8, fs->session);
		memcpy(a + 16, fs->token, WEIR_TOKEN_SIZE);
		int64_t res;
		for (int i = 0; i < 50; i++) { /* EAGAIN: io could not reach metadata yet */
			res = call(&fs->io, WEIR_OP_ATTACH, 0, 0, 0, a, sizeof a, NULL, 0, NULL);
			if (res != -EAGAIN)
				break;
			usleep(20000);
		}
		if (res < 0)
			err = (int)res;
	}
	if (err) {
		weir_fs_close(fs);
		return err;
	}
	*out = fs;
	return 0;
}

int weir_own_fd(const weir_fs *fs, int fd)
{
	return fs && fd >= 0 && (fd == fs->meta.sock || fd == fs->io.sock);
}

void weir_fs_close(weir_fs *fs)
{
	if (!fs)
		return;
	ring_close(&fs->io);
	ring_close(&fs->meta);
	for (int i = 0; i < MAX_PENDING_FILES; i++)
		if (fs->files[i].fd >= 0)
			close(fs->files[i].fd);
	pthread_mutex_destroy(&fs->files_mu);
	pthread_mutex_destroy(&fs->hmu);
	pthread_rwlock_destroy(&fs->wmu);
	if (fs->wlog)
		munmap(fs->wlog, WEIR_WRITE_LOG_SIZE);
	free(fs->recs);
	free(fs);
}

/* Symbolic links (WEIR_FEATURE_LINKS). The metadata service follows
 * none: a path that meets one answers -WEIR_ERR_FOLLOW with its place,
 * and pcall reads the link, rewrites the path and asks again, while the
 * path stays inside weir. One that leads out (an absolute target outside
 * the mount, or ".." above weir's root) ends the call with
 * -WEIR_ERR_FOLLOW and the host path in weir_followed(). */

/* The host path the calling thread's last call was led out to. */
static __thread char followed_path[WEIR_MAX_PATH + 1];

const char *weir_followed(void) { return followed_path; }

int weir_set_mount(weir_fs *fs, const char *mount)
{
	size_t n = strlen(mount);
	while (n > 1 && mount[n - 1] == '/')
		n--;
	if (mount[0] != '/' || n > WEIR_MAX_PATH)
		return -EINVAL;
	memcpy(fs->mount, mount, n);
	fs->mount[n] = 0;
	return 0;
}

/* fold resolves ".", ".." and repeated slashes of the absolute path in
 * lexically into out (cap bytes, not terminated), and returns its length,
 * or -1 if it does not fit. With a mount (m bytes, more than "/"), it
 * stops where the folded path reaches the mount and points *rest at the
 * rest of in, as it is. */
static ssize_t fold(const char *in, char *out, size_t cap, const char *mount, size_t m, const char **rest)
{
	size_t n = 0;
	for (const char *p = in; *p;) {
		while (*p == '/')
			p++;
		const char *e = p;
		while (*e && *e != '/')
			e++;
		size_t len = (size_t)(e - p);
		if (len == 0)
			break;
		if (len == 1 && p[0] == '.') {
		} else if (len == 2 && p[0] == '.' && p[1] == '.') {
			while (n > 0 && out[n - 1] != '/')
				n--;
			if (n > 0)
				n--;
		} else {
			if (n + 1 + len >= cap)
				return -1;
			out[n++] = '/';
			memcpy(out + n, p, len);
			n += len;
			if (mount && n == m && memcmp(out, mount, m) == 0) {
				*rest = e; /* into the mount: from here the path is weir's, as it is */
				break;
			}
		}
		p = e;
	}
	return (ssize_t)n;
}

int weir_normalize(const char *in, char *out, size_t cap)
{
	if (cap < 2)
		return 0;
	ssize_t n = fold(in, out, cap, NULL, 0, NULL);
	if (n < 0)
		return 0;
	if (n == 0)
		out[n++] = '/';
	out[n] = 0;
	return 1;
}

int weir_route(const char *mount, const char *in, char *w, size_t wcap, char *host, size_t hcap)
{
	size_t m = strlen(mount);
	ssize_t n = 0;
	while (m > 1 && mount[m - 1] == '/')
		m--;
	const char *rest = NULL;
	if (m <= 1)
		rest = in; /* (mount "/": every path is weir's) */
	else if ((n = fold(in, host, hcap, mount, m, &rest)) < 0)
		return -1;
	if (rest) {
		while (*rest == '/')
			rest++;
		if (!*rest)
			rest = ".";
		if (strlen(rest) >= wcap)
			return -1;
		strcpy(w, rest);
		return 1;
	}
	if (hcap < 2)
		return -1;
	if (n == 0)
		host[n++] = '/';
	host[n] = 0;
	return 0;
}

/* chase rewrites the weir path p, whose bytes [start, end) are a link to
 * target (or, with target NULL, a ".." of weir's root): into p if the
 * result is inside weir (0), else into followed_path (1); or -errno. A
 * relative target stays as it is (the service resolves its "." and ".."
 * as Linux does, physically); an absolute one, and a climb above the
 * root, are routed by the mount (weir_route). Without a mount every
 * absolute target leads out. */
static int chase(weir_fs *fs, char *p, size_t start, size_t end, const char *target)
{
	enum { CAP = 2 * (WEIR_MAX_PATH + 1) };
	int n;
	if (target && target[0] != '/') {
		char full[WEIR_MAX_PATH + 1];
		n = snprintf(full, sizeof full, "%.*s%s%s", (int)start, p, target, p + end);
		if (n < 0 || (size_t)n > WEIR_MAX_PATH)
			return -ENAMETOOLONG;
		memcpy(p, full, (size_t)n + 1);
		return 0;
	}
	/* (On the heap: a call's stack is the program's, which may be small.) */
	char *full = malloc(3 * CAP), *host = full + CAP, *w = host + CAP;
	if (!full)
		return -ENOMEM;
	if (target) {
		n = snprintf(full, CAP, "%s%s", target, p + end);
	} else {
		/* The mount's parent, then the rest ("/" is its own parent). */
		const char *m = fs->mount[0] ? fs->mount : "/";
		size_t ml = strlen(m), dl = ml;
		while (dl > 0 && m[dl - 1] != '/')
			dl--;
		if (ml <= 1) {
			const char *rest = p + end;
			while (*rest == '/')
				rest++;
			memmove(p, *rest ? rest : ".", strlen(*rest ? rest : ".") + 1);
			free(full);
			return 0;
		}
		n = snprintf(full, CAP, "%.*s%s", (int)(dl > 1 ? dl - 1 : 1), m, p + end);
	}
	int rc = -ENAMETOOLONG;
	if (n >= 0 && n < CAP) {
		int in = fs->mount[0] ? weir_route(fs->mount, full, w, WEIR_MAX_PATH + 1, host, CAP) : 0;
		if (in == 1) {
			strcpy(p, w);
			rc = 0;
		} else if (in == 0 && (size_t)n <= WEIR_MAX_PATH) {
			/* Out of weir: the host path as it is, for the kernel to
			 * resolve (its ".." after a host link is the kernel's). */
			memcpy(followed_path, full, (size_t)n + 1);
			rc = 1;
		}
	}
	free(full);
	return rc;
}

/* no_links, while set (weir_no_links), ends a call at the first link:
 * the errno to answer. */
static __thread int no_links;

void weir_no_links(int err) { no_links = err > 0 ? -err : err; }

/* The most links one call follows (Linux's MAXSYMLINKS: then ELOOP). */
#define MAX_LINKS 40

/* pcall sends op with the body "pre, str p1[, str p2]" and follows the
 * links the answer reports (see above): p1 and p2 are buffers of
 * WEIR_MAX_PATH + 1 bytes, rewritten in place, so that they name what was
 * reached. *second (if given) says which path a -WEIR_ERR_FOLLOW is of. */
static int64_t pcall(weir_fs *fs, uint8_t op, uint32_t arg, const void *pre, size_t prelen, char *p1, char *p2, void *out,
		     size_t outlen, uint64_t *aux, int *second)
{
	uint8_t small[512], *body = small;
	int64_t res;
	for (int links = 0;; links++) {
		size_t a = strlen(p1), b = p2 ? strlen(p2) : 0;
		if (a > WEIR_MAX_PATH || b > WEIR_MAX_PATH) {
			res = -ENAMETOOLONG;
			break;
		}
		size_t n = prelen + 2 + a + (p2 ? 2 + b : 0);
		if (n > sizeof small && body == small && !(body = malloc(prelen + 2 * (2 + WEIR_MAX_PATH)))) {
			res = -ENOMEM;
			break;
		}
		memcpy(body, pre, prelen);
		put16(body + prelen, (uint16_t)a);
		memcpy(body + prelen + 2, p1, a);
		if (p2) {
			put16(body + prelen + 2 + a, (uint16_t)b);
			memcpy(body + prelen + 4 + a, p2, b);
		}
		uint64_t x = 0;
		res = call(&fs->meta, op, arg, WEIR_ROOT_HANDLE, 0, body, n, out, outlen, &x);
		if (aux)
			*aux = x;
		if (res != -(int64_t)WEIR_ERR_FOLLOW)
			break;
		/* The link is p[start:end]: read it, rewrite p, ask again. */
		size_t start = x & 0xffff, end = x >> 16 & 0xffff;
		int sec = (int)(x >> 32 & 1), above = (int)(x >> 33 & 1);
		char *p = sec ? p2 : p1;
		if ((x >> 34) != 0 || !p || start >= end || end > strlen(p)) {
			res = -EIO; /* (not an answer the service gives) */
			break;
		}
		if (links >= MAX_LINKS) {
			res = -ELOOP;
			break;
		}
		if (above) {
			/* ".." of weir's root: the mount's parent, then the rest. (Not
			 * a link: each takes a ".." off the path, so it ends.) */
			links--;
			int c = chase(fs, p, start, end, NULL);
			if (c != 0) {
				res = c < 0 ? c : -(int64_t)WEIR_ERR_FOLLOW;
				if (second)
					*second = sec;
				break;
			}
			continue;
		}
		if (no_links) {
			res = no_links; /* (openat2's RESOLVE_* flags: weir_no_links) */
			break;
		}
		/* One READLINK of p[:end], not followed further: an answer that
		 * it met a link on the way (the path changed in between) sends
		 * the outer loop round again, counted as a link. */
		uint8_t rb[2 + WEIR_MAX_PATH];
		char target[WEIR_MAX_PATH + 1];
		put16(rb, (uint16_t)end);
		memcpy(rb + 2, p, end);
		int64_t t = call(&fs->meta, WEIR_OP_READLINK, 0, WEIR_ROOT_HANDLE, 0, rb, 2 + end, target, WEIR_MAX_PATH, NULL);
		if (t == -EINVAL || t == -(int64_t)WEIR_ERR_FOLLOW)
			continue; /* no link there any more: it changed in between */
		if (t < 0) {
			res = t;
			break;
		}
		if (t == 0 || t > WEIR_MAX_PATH || memchr(target, 0, (size_t)t)) {
			res = -EIO;
			break;
		}
		target[t] = 0;
		int c = chase(fs, p, start, end, target);
		if (c != 0) {
			res = c < 0 ? c : -(int64_t)WEIR_ERR_FOLLOW;
			if (second)
				*second = sec;
			break;
		}
	}
	if (body != small)
		free(body);
	return res;
}

/* PATH_COPY copies the caller's path into the buffer P that pcall may
 * rewrite, failing the call if it is too long. */
#define PATH_COPY(P, path)                            \
	char P[WEIR_MAX_PATH + 1];                    \
	do {                                          \
		if (strlen(path) > WEIR_MAX_PATH)     \
			return -ENAMETOOLONG;         \
		strcpy(P, path);                      \
	} while (0)

static void decode_attr(const uint8_t *p, struct weir_attr *a)
{
	a->ino = get64(p);
	a->mode = get32(p + 8);
	a->uid = get32(p + 12);
	a->gid = get32(p + 16);
	a->nlink = get32(p + 20);
	a->size = (int64_t)get64(p + 24);
	a->atime = (int64_t)get64(p + 32);
	a->mtime = (int64_t)get64(p + 40);
	a->ctime = (int64_t)get64(p + 48);
}

/* open_size is the length of OPEN's and INHERIT's answers here. */
static size_t open_size(const weir_fs *fs)
{
	size_t n = WEIR_OPEN_RESP_SIZE_TICKET;
	if (fs->features & WEIR_FEATURE_LEASES)
		n += 8;
	if (fs->features & WEIR_FEATURE_OPEN_CAP)
		n += 1 + WEIR_CAP_SIZE;
	return n;
}

/* open_answer takes an OPEN or INHERIT answer of res bytes in r: records
 * the handle (its data handle, grant, capability), stores it, its
 * attributes and its ticket. The grant itself waits for the first data
 * request (data_handle). */
static int open_answer(weir_fs *fs, int64_t res, const uint8_t *r, int flags, uint64_t *handle, struct weir_attr *attr,
		       uint8_t *ticket)
{
	if (res < 0)
		return (int)res;
	if ((size_t)res != open_size(fs))
		return -EPROTO;
	uint64_t h = get64(r);
	struct weir_attr a;
	decode_attr(r + WEIR_OPEN_RESP_OFF_ATTR, &a);
	if (h == 0 || h == H_DELETED || ((a.mode & S_IFMT) != S_IFREG && (a.mode & S_IFMT) != S_IFDIR))
		return -EPROTO;
	struct hrec rec = {.h = h, .dh = h, .granted = r[WEIR_OPEN_RESP_OFF_GRANTED] != 0, .writable = (flags & O_ACCMODE) != O_RDONLY};
	size_t at = WEIR_OPEN_RESP_OFF_TICKET + WEIR_TICKET_SIZE;
	if (fs->features & WEIR_FEATURE_LEASES) {
		rec.dh = get64(r + at);
		at += 8;
		if (rec.dh == 0 || rec.dh == H_DELETED)
			return -EPROTO;
	}
	if (fs->features & WEIR_FEATURE_OPEN_CAP) {
		rec.has_cap = r[at] == 1;
		if (r[at] > 1 || (rec.has_cap && rec.granted))
			return -EPROTO;
		memcpy(rec.cap, r + at + 1, WEIR_CAP_SIZE);
	}
	if ((a.mode & S_IFMT) == S_IFREG) {
		pthread_mutex_lock(&fs->hmu);
		if (rec.granted && rec.dh != h && !rec.writable)
			kept_cap(fs, &rec);
		int e = hput(fs, &rec);
		pthread_mutex_unlock(&fs->hmu);
		if (e) {
			call(&fs->meta, WEIR_OP_CLOSE, 0, h, 0, NULL, 0, NULL, 0, NULL);
			return e;
		}
	}
	*handle = h;
	if (attr)
		*attr = a;
	if (ticket)
		memcpy(ticket, r + WEIR_OPEN_RESP_OFF_TICKET, WEIR_TICKET_SIZE);
	return 0;
}

#define OPEN_RESP_MAX (WEIR_OPEN_RESP_SIZE_TICKET + 8 + 1 + WEIR_CAP_SIZE)

int weir_open(weir_fs *fs, const char *path, int flags, uint32_t mode, uint64_t *handle, struct weir_attr *attr,
	      uint8_t *ticket)
{
	PATH_COPY(p, path);
	uint8_t perm[4], r[OPEN_RESP_MAX];
	put32(perm, mode);
	int64_t res = pcall(fs, WEIR_OP_OPEN, (uint32_t)(flags & ~O_CLOEXEC), perm, 4, p, NULL, r, open_size(fs), NULL, NULL);
	return open_answer(fs, res, r, flags, handle, attr, ticket);
}

int weir_inherit(weir_fs *fs, const uint8_t *ticket, int flags, uint64_t *handle)
{
	uint8_t r[OPEN_RESP_MAX];
	memcpy(r, ticket, WEIR_TICKET_SIZE);
	int64_t res = call(&fs->meta, WEIR_OP_INHERIT, 0, 0, 0, r, WEIR_TICKET_SIZE, r, open_size(fs), NULL);
	return open_answer(fs, res, r, flags, handle, NULL, NULL);
}

ssize_t weir_pread(weir_fs *fs, uint64_t handle, void *buf, size_t n, uint64_t off, int direct)
{
	size_t done = 0, chunk = fs->io.geo.arena_size < CHUNK ? fs->io.geo.arena_size : CHUNK;
	while (done < n) {
		size_t want = n - done < chunk ? n - done : chunk;
		int64_t res = io_call(fs, WEIR_OP_READ, direct ? WEIR_READ_DIRECT : 0, handle, off + done, NULL, 0, (uint8_t *)buf + done, want, NULL);
		if (res < 0)
			return done ? (ssize_t)done : (ssize_t)res;
		done += (size_t)res;
		if ((size_t)res < want)
			break; /* the end of the file */
	}
	return (ssize_t)done;
}

ssize_t weir_pwrite(weir_fs *fs, uint64_t handle, const void *buf, size_t n, uint64_t off, int direct)
{
	size_t done = 0, chunk = fs->io.geo.arena_size < CHUNK ? fs->io.geo.arena_size : CHUNK;
	while (done < n) {
		size_t want = n - done < chunk ? n - done : chunk;
		int64_t res = io_call(fs, WEIR_OP_WRITE, direct ? WEIR_WRITE_DIRECT : 0, handle, off + done, (const uint8_t *)buf + done, want, NULL, 0, NULL);
		if (res < 0)
			return done ? (ssize_t)done : (ssize_t)res;
		if (res == 0 || (size_t)res > want)
			return done ? (ssize_t)done : -EIO;
		done += (size_t)res;
	}
	return (ssize_t)done;
}

ssize_t weir_append(weir_fs *fs, uint64_t handle, const void *buf, size_t n, uint64_t *at, int direct)
{
	size_t chunk = fs->io.geo.arena_size < CHUNK ? fs->io.geo.arena_size : CHUNK;
	if (n > chunk)
		n = chunk; /* one request: one atomic append (a short write, as write(2) may) */
	uint64_t aux = 0;
	int64_t res = io_call(fs, WEIR_OP_WRITE, WEIR_WRITE_APPEND | (direct ? WEIR_WRITE_DIRECT : 0), handle, 0, buf, n, NULL, 0, &aux);
	if (res > (int64_t)n)
		return -EIO; /* more than was sent: a broken service */
	if (res >= 0 && at)
		*at = aux;
	return (ssize_t)res;
}

int weir_fstat(weir_fs *fs, uint64_t handle, struct weir_attr *attr)
{
	uint8_t r[WEIR_ATTR_SIZE];
	int64_t res = call(&fs->meta, WEIR_OP_FSTAT, 0, handle, 0, NULL, 0, r, sizeof r, NULL);
	if (res < 0)
		return (int)res;
	if (res != WEIR_ATTR_SIZE)
		return -EPROTO;
	decode_attr(r, attr);
	return 0;
}

/* cut_call is a TRUNCATE at io on dh. When io keeps no staging log
 * (WEIR_FEATURE_RECORD_CUTS) metadata records the size first, so that no
 * crash leaves it above the blob's: after the grant, whose answer records
 * the blob's size as it is, and before each try. */
static int64_t cut_call(weir_fs *fs, uint64_t handle, uint64_t dh, uint64_t size)
{
	if (fs->features & WEIR_FEATURE_RECORD_CUTS) {
		int64_t res = call(&fs->meta, WEIR_OP_CUT, 0, handle, size, NULL, 0, NULL, 0, NULL);
		if (res < 0)
			return res;
	}
	return call(&fs->io, WEIR_OP_TRUNCATE, 0, dh, size, NULL, 0, NULL, 0, NULL);
}

int weir_ftruncate(weir_fs *fs, uint64_t handle, uint64_t size)
{
	uint64_t dh;
	int64_t res = data_handle(fs, handle, &dh);
	if (res < 0)
		return (int)res;
	res = cut_call(fs, handle, dh, size);
	for (int i = 0; res == -EBADF && i < MAX_REGRANTS; i++) { /* as io_call */
		int64_t g = regrant(fs, handle, &dh);
		if (g < 0)
			return g == -EBADF ? (int)res : (int)g;
		res = cut_call(fs, handle, dh, size);
	}
	return res < 0 ? (int)res : 0;
}

int weir_fsync(weir_fs *fs, uint64_t handle)
{
	int64_t res = io_call(fs, WEIR_OP_SYNC, 0, handle, 0, NULL, 0, NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

int weir_syncfs(weir_fs *fs)
{
	int64_t res = call(&fs->io, WEIR_OP_SYNC_FS, 0, 0, 0, NULL, 0, NULL, 0, NULL);
	if (res >= 0) /* then metadata's log: every name, and the sizes io reported at closes */
		res = call(&fs->meta, WEIR_OP_SYNC_META, 0, 0, 0, NULL, 0, NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

int weir_close(weir_fs *fs, uint64_t handle)
{
	hdel(fs, handle);
	int64_t res = call(&fs->meta, WEIR_OP_CLOSE, 0, handle, 0, NULL, 0, NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

/* stat_call stats p (rewritten in place as links are followed), or its
 * final link itself with WEIR_PATH_NOFOLLOW. */
static int stat_call(weir_fs *fs, char *p, uint32_t arg, struct weir_attr *attr)
{
	uint8_t r[WEIR_ATTR_SIZE];
	int64_t res = pcall(fs, WEIR_OP_STAT, arg, NULL, 0, p, NULL, r, sizeof r, NULL, NULL);
	if (res < 0)
		return (int)res;
	if (res != WEIR_ATTR_SIZE)
		return -EPROTO;
	decode_attr(r, attr);
	return 0;
}

int weir_stat(weir_fs *fs, const char *path, struct weir_attr *attr)
{
	PATH_COPY(p, path);
	return stat_call(fs, p, 0, attr);
}

int weir_lstat(weir_fs *fs, const char *path, struct weir_attr *attr)
{
	PATH_COPY(p, path);
	return stat_call(fs, p, WEIR_PATH_NOFOLLOW, attr);
}

int weir_resolve(weir_fs *fs, const char *path, char *out, struct weir_attr *attr)
{
	PATH_COPY(p, path);
	int e = stat_call(fs, p, 0, attr);
	if (e)
		return e;
	char full[WEIR_MAX_PATH + 2], norm[WEIR_MAX_PATH + 2];
	snprintf(full, sizeof full, "/%s", p);
	if (!weir_normalize(full, norm, sizeof norm))
		return -ENAMETOOLONG;
	strcpy(out, norm[1] ? norm + 1 : ".");
	return 0;
}

int weir_readlink(weir_fs *fs, const char *path, char *buf, size_t n)
{
	PATH_COPY(p, path);
	char t[WEIR_MAX_PATH + 1];
	int64_t res = pcall(fs, WEIR_OP_READLINK, 0, NULL, 0, p, NULL, t, WEIR_MAX_PATH, NULL, NULL);
	if (res < 0)
		return (int)res;
	if (res == 0 || res > WEIR_MAX_PATH)
		return -EPROTO;
	size_t k = (size_t)res < n ? (size_t)res : n;
	memcpy(buf, t, k);
	return (int)k;
}

int weir_symlink(weir_fs *fs, const char *target, const char *path)
{
	size_t tl = strlen(target);
	if (tl > WEIR_MAX_PATH)
		return -ENAMETOOLONG;
	PATH_COPY(p, path);
	uint8_t pre[2 + WEIR_MAX_PATH], r[WEIR_ATTR_SIZE];
	put16(pre, (uint16_t)tl);
	memcpy(pre + 2, target, tl);
	int64_t res = pcall(fs, WEIR_OP_SYMLINK, 0, pre, 2 + tl, p, NULL, r, sizeof r, NULL, NULL);
	return res < 0 ? (int)res : 0;
}

/* two_call sends RENAME or LINK: "u64 new directory (the root), str old,
 * str new". */
static int two_call(weir_fs *fs, uint8_t op, uint32_t arg, const char *oldpath, const char *newpath, int *second)
{
	PATH_COPY(a, oldpath);
	PATH_COPY(b, newpath);
	uint8_t pre[8], r[WEIR_ATTR_SIZE];
	put64(pre, WEIR_ROOT_HANDLE);
	int64_t res = pcall(fs, op, arg, pre, 8, a, b, r, op == WEIR_OP_LINK ? sizeof r : 0, NULL, second);
	return res < 0 ? (int)res : 0;
}

int weir_rename(weir_fs *fs, const char *oldpath, const char *newpath, int *second)
{
	return two_call(fs, WEIR_OP_RENAME, 0, oldpath, newpath, second);
}

int weir_link(weir_fs *fs, const char *oldpath, const char *newpath, int follow, int *second)
{
	return two_call(fs, WEIR_OP_LINK, follow ? WEIR_LINK_FOLLOW : 0, oldpath, newpath, second);
}

/* path_call sends op with the body "pre, str path"; out receives the
 * answer (MKDIR's attributes) if given. */
static int path_call(weir_fs *fs, uint8_t op, uint32_t arg, const void *pre, size_t prelen, const char *path, void *out,
		     size_t outlen)
{
	PATH_COPY(p, path);
	int64_t res = pcall(fs, op, arg, pre, prelen, p, NULL, out, outlen, NULL, NULL);
	return res < 0 ? (int)res : 0;
}

int weir_unlink(weir_fs *fs, const char *path) { return path_call(fs, WEIR_OP_UNLINK, 0, NULL, 0, path, NULL, 0); }
int weir_rmdir(weir_fs *fs, const char *path) { return path_call(fs, WEIR_OP_RMDIR, 0, NULL, 0, path, NULL, 0); }

/* mode_path_call sends op with the body "u32 mode, str path" (MKDIR,
 * CHMOD); out receives the answer (MKDIR's attributes) if given. */
static int mode_path_call(weir_fs *fs, uint8_t op, const char *path, uint32_t mode, void *out, size_t outlen)
{
	uint8_t pre[4];
	put32(pre, mode);
	return path_call(fs, op, 0, pre, 4, path, out, outlen);
}

int weir_mkdir(weir_fs *fs, const char *path, uint32_t mode)
{
	uint8_t r[WEIR_ATTR_SIZE];
	return mode_path_call(fs, WEIR_OP_MKDIR, path, mode, r, sizeof r);
}

int weir_chmod(weir_fs *fs, const char *path, uint32_t mode) { return mode_path_call(fs, WEIR_OP_CHMOD, path, mode, NULL, 0); }

int weir_fchmod(weir_fs *fs, uint64_t handle, uint32_t mode)
{
	int64_t res = call(&fs->meta, WEIR_OP_FCHMOD, mode, handle, 0, NULL, 0, NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

/* pair_call sends op with the body "i64 x, i64 y" and, for a path call,
 * "str path" after it (CHOWN, CHTIMES; arg WEIR_PATH_NOFOLLOW or 0), or
 * naming handle (FCHOWN, FCHTIMES). */
static int pair_call(weir_fs *fs, uint8_t op, uint32_t arg, uint64_t handle, const char *path, int64_t x, int64_t y)
{
	uint8_t b[16];
	put64(b, (uint64_t)x);
	put64(b + 8, (uint64_t)y);
	if (path)
		return path_call(fs, op, arg, b, 16, path, NULL, 0);
	int64_t res = call(&fs->meta, op, 0, handle, 0, b, 16, NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

int weir_chown(weir_fs *fs, const char *path, int64_t uid, int64_t gid, int nofollow)
{
	return pair_call(fs, WEIR_OP_CHOWN, nofollow ? WEIR_PATH_NOFOLLOW : 0, 0, path, uid, gid);
}
int weir_fchown(weir_fs *fs, uint64_t handle, int64_t uid, int64_t gid) { return pair_call(fs, WEIR_OP_FCHOWN, 0, handle, NULL, uid, gid); }
int weir_utimens(weir_fs *fs, const char *path, int64_t atime, int64_t mtime, int nofollow)
{
	return pair_call(fs, WEIR_OP_CHTIMES, nofollow ? WEIR_PATH_NOFOLLOW : 0, 0, path, atime, mtime);
}
int weir_futimens(weir_fs *fs, uint64_t handle, int64_t atime, int64_t mtime)
{
	return pair_call(fs, WEIR_OP_FCHTIMES, 0, handle, NULL, atime, mtime);
}

int weir_readdir(weir_fs *fs, const char *path, int (*fn)(void *arg, const char *name, uint64_t ino, uint32_t type),
		 void *arg)
{
	enum { PAGE = 16 << 10 };
	PATH_COPY(p, path);
	uint8_t *buf = malloc(PAGE);
	char after[WEIR_MAX_PATH + 1] = ""; /* (a name: pcall's second path, never followed) */
	if (!buf)
		return -ENOMEM;
	for (;;) {
		uint64_t more = 0;
		int64_t res = pcall(fs, WEIR_OP_READDIR, 0, NULL, 0, p, after, buf, PAGE, &more, NULL);
		if (res < 0) {
			free(buf);
			return (int)res;
		}
		/* u32 count, then {u64 ino, u32 type, str name}: checked, as any
		 * answer (a name is 1 to NAME_MAX bytes, no '/' or NUL). */
		if (res < 4) {
			free(buf);
			return -EPROTO;
		}
		uint32_t count = get32(buf);
		size_t at = 4, end = (size_t)res;
		for (uint32_t i = 0; i < count; i++) {
			if (end - at < 14) {
				free(buf);
				return -EPROTO;
			}
			uint64_t ino = get64(buf + at);
			uint32_t type = get32(buf + at + 8);
			uint16_t nl = (uint16_t)(buf[at + 12] | buf[at + 13] << 8);
			at += 14;
			char name[WEIR_MAX_NAME + 1];
			if (nl == 0 || nl > WEIR_MAX_NAME || end - at < nl || memchr(buf + at, '/', nl) || memchr(buf + at, 0, nl)) {
				free(buf);
				return -EPROTO;
			}
			memcpy(name, buf + at, nl);
			name[nl] = 0;
			if (after[0] && strcmp(name, after) <= 0) {
				free(buf);
				return -EPROTO; /* names must increase: a service that repeats them would make this loop */
			}
			memcpy(after, name, nl + 1);
			at += nl;
			if (fn(arg, after, ino, type)) {
				free(buf);
				return 0;
			}
		}
		if (more != 1 || count == 0)
			break;
	}
	free(buf);
	return 0;
}

int weir_lock(weir_fs *fs, uint64_t handle, int get, uint8_t type, uint8_t cls, uint64_t start, uint64_t end,
	      struct weir_lock_info *held)
{
	uint8_t b[WEIR_LOCK_REQ_SIZE] = {0};
	b[0] = get ? 1 : 0;
	b[1] = type;
	b[2] = cls;
	put64(b + 8, start);
	put64(b + 16, end);
	int64_t res = call(&fs->meta, WEIR_OP_LOCK, 0, handle, 0, b, sizeof b, b, sizeof b, NULL);
	if (res < 0)
		return (int)res;
	if (!get)
		return res == 0 ? 0 : -EPROTO;
	if (res != WEIR_LOCK_REQ_SIZE || b[0] > WEIR_LOCK_UNLOCK || b[1] > WEIR_LOCK_FLOCK)
		return -EPROTO;
	held->type = b[0];
	held->cls = b[1];
	held->pid = (int32_t)get32(b + 4);
	held->start = get64(b + 8);
	held->end = get64(b + 16);
	if (held->type != WEIR_LOCK_UNLOCK && held->start >= held->end)
		return -EPROTO;
	return 0;
}

/* The cache region (docs/cache-abi.md): a readable handle's mapping of
 * the file's pages in io's cache, read with the state words' seqlock. */
#define WIN_BYTES ((uint64_t)WEIR_WINDOW_PAGES * WEIR_CACHE_PAGE_SIZE)
#define WHASH 256 /* windows a region's mapping finds directly: by window % WHASH */
struct weir_cache {
	const uint8_t *base; /* the meta memfd: header and state words */
	size_t len;          /* mapped bytes of it */
	const uint8_t *data; /* the data memfd: file page p at p * 4096 */
	size_t dlen;
	uint64_t cap; /* file bytes both mappings cover */
	/* Write windows (weir_cache_pwrite): the data memfd read-write
	 * (NULL: none), the slot + 1 of the window at each WHASH place (0:
	 * none; checked against fs->wins under fs->wmu), and how many
	 * writes through the ring each place has had since its last pin. */
	uint8_t *wdata;
	weir_fs *wfs;
	uint64_t handle;
	uint16_t wslot[WHASH];
	uint8_t heat[WHASH];
};

#define FILE_MAGIC 0x31465257u /* "WRF1" (docs/ring-abi.md §6) */

/* take_file receives, from the io socket, the file message with tag
 * (keeping others for their callers): its fd, or -errno. */
static int take_file(weir_fs *fs, uint64_t tag)
{
	pthread_mutex_lock(&fs->files_mu);
	int fd = -EIO;
	for (int i = 0; i < MAX_PENDING_FILES; i++)
		if (fs->files[i].fd >= 0 && fs->files[i].tag == tag) {
			fd = fs->files[i].fd;
			fs->files[i].fd = -1;
			goto out;
		}
	for (int tries = 0; tries < 64; tries++) {
		uint8_t m[16];
		struct iovec iov = {m, sizeof m};
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(2 * sizeof(int))];
		} cb;
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
		struct pollfd p = {.fd = fs->io.sock, .events = POLLIN};
		if (poll(&p, 1, WEIR_HANDSHAKE_TIMEOUT_MS) != 1) {
			fd = -ETIMEDOUT; /* the service writes the message before it answers: it is broken */
			goto out;
		}
		ssize_t n = recvmsg(fs->io.sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		int got = -1, extra = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int f;
				memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
				if (got < 0) {
					got = f;
				} else {
					close(f);
					extra = 1;
				}
			}
		}
		if (n != 16 || got < 0 || extra || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || get32(m) != FILE_MAGIC || get32(m + 4) != 0) {
			if (got >= 0)
				close(got);
			fd = -EPROTO; /* (the Go client ends the session here; this one stops mapping) */
			goto out;
		}
		uint64_t t = get64(m + 8);
		if (t == tag) {
			fd = got;
			goto out;
		}
		int kept = 0;
		for (int i = 0; i < MAX_PENDING_FILES && !kept; i++)
			if (fs->files[i].fd < 0) {
				fs->files[i].tag = t;
				fs->files[i].fd = got;
				kept = 1;
			}
		if (!kept)
			close(got);
	}
out:
	pthread_mutex_unlock(&fs->files_mu);
	return fd;
}

/* header_ok checks a region's header (§2) before anything is read. */
static int header_ok(const uint8_t *b)
{
	uint64_t cap;
	memcpy(&cap, b + WEIR_CACHE_OFF_CAPACITY, sizeof cap);
	return get32(b) == WEIR_CACHE_MAGIC && (b[4] | b[5] << 8) == WEIR_CACHE_VERSION &&
	       (b[6] | b[7] << 8) == WEIR_CACHE_PAGE_SHIFT && get32(b + WEIR_CACHE_OFF_CHUNK_PAGES) == WEIR_CACHE_CHUNK_PAGES &&
	       get32(b + WEIR_CACHE_OFF_RESERVED) == 0 && cap % WEIR_CACHE_CHUNK_BYTES == 0 && cap <= WEIR_CACHE_MAX_CAPACITY &&
	       cap != 0;
}

/* region_fds asks io for the handle's region: its meta and data memfds
 * (read-only descriptions), or -errno. */
static int region_fds(weir_fs *fs, uint64_t handle, int *meta, int *data)
{
	uint64_t tag = 0;
	int64_t res = io_call(fs, WEIR_OP_CACHE_MAP, 0, handle, 0, NULL, 0, NULL, 0, &tag);
	if (res < 0)
		return (int)res;
	*meta = take_file(fs, tag);
	*data = take_file(fs, tag + 1);
	if (*meta < 0 || *data < 0) {
		int e = *meta < 0 ? *meta : *data;
		if (*meta >= 0)
			close(*meta);
		if (*data >= 0)
			close(*data);
		return e;
	}
	return 0;
}

int weir_cache_map(weir_fs *fs, uint64_t handle, weir_cache **out)
{
	int mfd, dfd;
	int e = region_fds(fs, handle, &mfd, &dfd);
	if (e)
		return e;
	struct stat ms, ds;
	void *p = MAP_FAILED, *d = MAP_FAILED;
	uint64_t covered = 0;
	if (fstat(mfd, &ms) == 0 && fstat(dfd, &ds) == 0 && ms.st_size >= (off_t)(WEIR_CACHE_HEADER_SIZE + WEIR_CACHE_PAGE_SIZE) &&
	    ds.st_size >= (off_t)WEIR_CACHE_CHUNK_BYTES) {
		/* The data memfd is sized for the largest region (and sealed
		 * there): what is mapped of it is what the meta memfd has state
		 * pages for (§1). */
		covered = ((uint64_t)ms.st_size - WEIR_CACHE_HEADER_SIZE) / WEIR_CACHE_PAGE_SIZE * WEIR_CACHE_CHUNK_BYTES;
		uint64_t dcovered = (uint64_t)ds.st_size / WEIR_CACHE_CHUNK_BYTES * WEIR_CACHE_CHUNK_BYTES;
		if (dcovered < covered)
			covered = dcovered;
		p = mmap(NULL, (size_t)ms.st_size, PROT_READ, MAP_SHARED, mfd, 0);
		if (covered)
			d = mmap(NULL, (size_t)covered, PROT_READ, MAP_SHARED, dfd, 0);
	}
	close(mfd);
	close(dfd);
	if (p == MAP_FAILED || d == MAP_FAILED || !header_ok(p)) {
		if (p != MAP_FAILED)
			munmap(p, (size_t)ms.st_size);
		if (d != MAP_FAILED)
			munmap(d, (size_t)covered);
		return -EPROTO;
	}
	const uint8_t *b = p;
	uint64_t cap = __atomic_load_n((const uint64_t *)(b + WEIR_CACHE_OFF_CAPACITY), __ATOMIC_ACQUIRE);
	weir_cache *c = malloc(sizeof *c);
	if (!c) {
		munmap(p, (size_t)ms.st_size);
		munmap(d, (size_t)covered);
		return -ENOMEM;
	}
	memset(c, 0, sizeof *c);
	c->base = b;
	c->len = (size_t)ms.st_size;
	c->data = d;
	c->dlen = (size_t)covered;
	c->cap = cap < covered ? cap : covered;
	*out = c;
	return 0;
}

/* The most pages one WEIR_OP_MAP_PIN pins (proto: maxPinPages). */
#define MAX_PIN_PAGES (1u << 20)

/* pin_pages is the page count of a pin of len bytes at off; 0 if the
 * range is not one io pins. */
static uint64_t pin_pages(size_t len, uint64_t off)
{
	uint64_t n = (len + WEIR_CACHE_PAGE_SIZE - 1) / WEIR_CACHE_PAGE_SIZE;
	if (off % WEIR_CACHE_PAGE_SIZE || n == 0 || n > MAX_PIN_PAGES ||
	    off / WEIR_CACHE_PAGE_SIZE + n > WEIR_CACHE_MAX_CAPACITY / WEIR_CACHE_PAGE_SIZE)
		return 0;
	return n;
}

int weir_map_pins(weir_fs *fs, uint64_t handle, size_t len, uint64_t off, int writable)
{
	uint64_t n = pin_pages(len, off);
	if (!n)
		return -EINVAL;
	int64_t res = io_call(fs, WEIR_OP_MAP_PIN, (uint32_t)n | (writable ? WEIR_MAP_PIN_WRITABLE : 0), handle, off, NULL, 0,
			      NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

int weir_map_at(weir_fs *fs, uint64_t handle, void *addr, size_t len, uint64_t off, int writable)
{
	uint64_t n = pin_pages(len, off);
	if (!n)
		return -EINVAL;
	int mfd = -1, dfd = -1;
	int e = region_fds(fs, handle, &mfd, &dfd);
	struct stat st;
	uint8_t h[WEIR_CACHE_HEADER_SIZE];
	/* The header is checked before anything is mapped (§2). */
	if (!e && pread(mfd, h, sizeof h, 0) != (ssize_t)sizeof h)
		e = -EPROTO;
	if (!e && !header_ok(h))
		e = -EPROTO;
	if (mfd >= 0)
		close(mfd);
	if (!e && writable) {
		/* The data memfd read-write: io passes it to a handle that
		 * writes the file, and holds nothing but the file's bytes. */
		close(dfd);
		uint64_t tag = 0;
		int64_t res = io_call(fs, WEIR_OP_MAP_WRITABLE, 0, handle, 0, NULL, 0, NULL, 0, &tag);
		dfd = res < 0 ? (int)res : take_file(fs, tag);
		if (dfd < 0)
			e = dfd;
	}
	/* The memfd must hold every page mapped, and be sealed against
	 * shrinking, or a load could be SIGBUS. */
	uint64_t p0 = off / WEIR_CACHE_PAGE_SIZE, p1 = p0 + n;
	if (!e && (fstat(dfd, &st) != 0 || (uint64_t)st.st_size < weir_cache_page_off(p1) || !(fcntl(dfd, F_GET_SEALS) & F_SEAL_SHRINK)))
		e = -EPROTO;
	/* One mapping: the data memfd holds the file's pages at their
	 * offsets. */
	if (!e && mmap(addr, n * WEIR_CACHE_PAGE_SIZE, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED | MAP_FIXED, dfd,
		       (off_t)weir_cache_page_off(p0)) == MAP_FAILED)
		e = -errno;
	if (dfd >= 0)
		close(dfd);
	return e;
}

int weir_map(weir_fs *fs, uint64_t handle, void *addr, size_t len, uint64_t off, int writable)
{
	int e = weir_map_pins(fs, handle, len, off, writable);
	if (e)
		return e;
	e = weir_map_at(fs, handle, addr, len, off, writable);
	if (e)
		weir_unmap_pins(fs, handle, len, off, writable);
	return e;
}

int weir_unmap_pins(weir_fs *fs, uint64_t handle, size_t len, uint64_t off, int writable)
{
	uint64_t n = (len + WEIR_CACHE_PAGE_SIZE - 1) / WEIR_CACHE_PAGE_SIZE;
	int64_t res = io_call(fs, WEIR_OP_MAP_UNPIN, (uint32_t)n | (writable ? WEIR_MAP_PIN_WRITABLE : 0), handle, off, NULL, 0,
			      NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

int weir_map_sync(weir_fs *fs, uint64_t handle, size_t len, uint64_t off)
{
	uint64_t n = pin_pages(len, off);
	if (!n)
		return -EINVAL;
	int64_t res = io_call(fs, WEIR_OP_MAP_SYNC, (uint32_t)n, handle, off, NULL, 0, NULL, 0, NULL);
	return res < 0 ? (int)res : 0;
}

void weir_cache_unmap(weir_cache *c)
{
	if (c) {
		munmap((void *)c->base, c->len);
		munmap((void *)c->data, c->dlen);
		if (c->wdata)
			munmap(c->wdata, c->dlen);
		free(c);
	}
}

/* cache_size reads the field group's size (the seqlock); -1 if it is
 * not stable within WEIR_CACHE_FIELD_TRIES. */
static int64_t cache_size(const weir_cache *c)
{
	const uint64_t *seq = (const uint64_t *)(c->base + WEIR_CACHE_OFF_FIELDS_SEQ);
	const uint64_t *size = (const uint64_t *)(c->base + WEIR_CACHE_OFF_SIZE);
	for (unsigned i = 0; i < WEIR_CACHE_FIELD_TRIES; i++) {
		uint64_t a = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
		if (a & 1)
			continue;
		uint64_t v = __atomic_load_n(size, __ATOMIC_ACQUIRE);
		if (__atomic_load_n(seq, __ATOMIC_ACQUIRE) == a)
			return v > WEIR_CACHE_MAX_CAPACITY ? -1 : (int64_t)v;
	}
	return -1;
}

int64_t weir_cache_size(const weir_cache *c)
{
	int64_t v = cache_size(c);
	return v < 0 ? -EAGAIN : v;
}

ssize_t weir_cache_read(const weir_cache *c, void *buf, size_t n, uint64_t off)
{
	int64_t size = cache_size(c);
	if (size < 0)
		return -EAGAIN;
	if (off >= (uint64_t)size)
		return 0;
	if (n > (uint64_t)size - off)
		n = (size_t)((uint64_t)size - off);
	if (off + n > c->cap)
		return -EAGAIN; /* past the mapping: the ring's */
	size_t done = 0;
	while (done < n) {
		uint64_t at = off + done, p = at >> WEIR_CACHE_PAGE_SHIFT;
		size_t in = (size_t)(at & (WEIR_CACHE_PAGE_SIZE - 1));
		size_t k = WEIR_CACHE_PAGE_SIZE - in < n - done ? WEIR_CACHE_PAGE_SIZE - in : n - done;
		const uint32_t *state = (const uint32_t *)(c->base + weir_cache_state_off(p));
		uint32_t w = __atomic_load_n(state, __ATOMIC_ACQUIRE);
		if ((w & WEIR_CACHE_KIND_MASK) != WEIR_CACHE_KIND_RESIDENT || (w & WEIR_CACHE_RESERVED_MASK))
			return -EAGAIN; /* absent or busy: the ring's (which fills it) */
		memcpy((uint8_t *)buf + done, c->data + weir_cache_page_off(p) + in, k);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(state, __ATOMIC_ACQUIRE) != w)
			return -EAGAIN; /* a transition overlapped the copy */
		done += k;
	}
	return (ssize_t)done;
}

/* Write windows (docs/cache-abi.md §7). A write through the ring that
 * lands in a window of a file the handle reads and writes warms the
 * window's place; at the WIN_HEAT-th, the window is pinned in a slot of
 * the session's write log. A write that then overwrites bytes inside one
 * pinned window, below the file's size, while the region's mtime is of
 * the last win_fresh_ns (so that the file's mtime stays as current as
 * the kernel's coarse clock keeps it), is a copy into the data memfd and
 * a bit per page in the log: io makes the pages dirty at the file's next
 * fsync (whoever asks), write-back pass or O_DIRECT access, and at the
 * window's unpin or the session's end. Everything else goes through the
 * ring. */
#define WIN_HEAT 4
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* win_fresh_ns is how old the file's mtime may be for a store to take a
 * window: one tick of the kernel's coarse clock, which stamps a Linux
 * file's mtime (4 ms at HZ=250), within [1, 10] ms. The ring write that
 * makes the mtime fresh again comes once a tick per file at most. */
static int64_t win_fresh_ns(void)
{
	static int64_t v;
	int64_t x = __atomic_load_n(&v, __ATOMIC_RELAXED);
	if (x)
		return x;
	struct timespec r;
	x = clock_getres(CLOCK_REALTIME_COARSE, &r) == 0 ? (int64_t)r.tv_sec * 1000000000 + r.tv_nsec : 0;
	x = x < 1000000 ? 1000000 : x > 10000000 ? 10000000 : x;
	__atomic_store_n(&v, x, __ATOMIC_RELAXED);
	return x;
}
#define WIN_FULL_BACKOFF_NS 100000000

int weir_cache_writable(weir_fs *fs, weir_cache *c, uint64_t handle)
{
	if (c->wdata)
		return 0;
	uint64_t tag = 0;
	int64_t res = io_call(fs, WEIR_OP_MAP_WRITABLE, 0, handle, 0, NULL, 0, NULL, 0, &tag);
	int fd = res < 0 ? (int)res : take_file(fs, tag);
	if (fd < 0)
		return fd;
	struct stat st;
	void *p = MAP_FAILED;
	/* Sealed against shrinking and as large as the read-only mapping:
	 * no store can fault. */
	if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= c->dlen && (fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK))
		p = mmap(NULL, c->dlen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return -EPROTO;
	c->wdata = p;
	c->wfs = fs;
	c->handle = handle;
	return 0;
}

/* cache_fields reads the field group's size and mtime (the seqlock);
 * -1 if they are not stable within WEIR_CACHE_FIELD_TRIES. */
static int cache_fields(const weir_cache *c, int64_t *size, int64_t *mtime)
{
	const uint64_t *seq = (const uint64_t *)(c->base + WEIR_CACHE_OFF_FIELDS_SEQ);
	for (unsigned i = 0; i < WEIR_CACHE_FIELD_TRIES; i++) {
		uint64_t a = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
		if (a & 1)
			continue;
		uint64_t v = __atomic_load_n((const uint64_t *)(c->base + WEIR_CACHE_OFF_SIZE), __ATOMIC_ACQUIRE);
		int64_t m = (int64_t)__atomic_load_n((const uint64_t *)(c->base + WEIR_CACHE_OFF_MTIME), __ATOMIC_ACQUIRE);
		if (__atomic_load_n(seq, __ATOMIC_ACQUIRE) == a) {
			if (v > WEIR_CACHE_MAX_CAPACITY)
				return -1;
			*size = (int64_t)v;
			*mtime = m;
			return 0;
		}
	}
	return -1;
}

static int64_t realtime_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* slot_live is slot i's live word in the write log (§7). */
static inline const uint64_t *slot_live(const weir_fs *fs, unsigned i)
{
	return (const uint64_t *)(fs->wlog + WEIR_WRITE_LOG_LIVE_OFF + (size_t)i * 8);
}

/* window_store is the store of a write inside a pinned window: n, or
 * -EAGAIN (through the ring). */
static ssize_t window_store(weir_fs *fs, weir_cache *c, const void *buf, size_t n, uint64_t off)
{
	uint64_t win = off / WIN_BYTES;
	if (n == 0 || (off + n - 1) / WIN_BYTES != win || off + n > c->cap)
		return -EAGAIN;
	unsigned s = __atomic_load_n(&c->wslot[win % WHASH], __ATOMIC_RELAXED);
	if (s == 0)
		return -EAGAIN;
	int64_t size, mtime, now = realtime_ns();
	if (cache_fields(c, &size, &mtime) || off + n > (uint64_t)size || now - mtime > win_fresh_ns() || mtime - now > win_fresh_ns())
		return -EAGAIN;
	ssize_t r = -EAGAIN;
	pthread_rwlock_rdlock(&fs->wmu);
	struct wwin *w = &fs->wins[s - 1];
	const uint64_t *live = slot_live(fs, s - 1);
	/* io ended the window (its grant ended: a recall, a resync): the
	 * ring's, which asks for the grant again. */
	if (w->c != c || w->win != win || !__atomic_load_n(live, __ATOMIC_ACQUIRE))
		goto out;
	uint64_t p0 = off >> WEIR_CACHE_PAGE_SHIFT, p1 = (off + n - 1) >> WEIR_CACHE_PAGE_SHIFT;
	/* Resident and not busy: a page in a transition (a ring write, a
	 * write-back, a truncate) takes this write through the ring. */
	for (uint64_t p = p0; p <= p1; p++) {
		uint32_t st = __atomic_load_n((const uint32_t *)(c->base + weir_cache_state_off(p)), __ATOMIC_ACQUIRE);
		if ((st & WEIR_CACHE_KIND_MASK) != WEIR_CACHE_KIND_RESIDENT || (st & WEIR_CACHE_RESERVED_MASK))
			goto out;
	}
	memcpy(c->wdata + off, buf, n);
	uint64_t *slot = (uint64_t *)(fs->wlog + (size_t)(s - 1) * WEIR_WRITE_SLOT_BYTES);
	for (uint64_t p = p0; p <= p1; p++) {
		uint64_t k = p - win * WEIR_WINDOW_PAGES;
		__atomic_fetch_or(&slot[k / 64], (uint64_t)1 << (k % 64), __ATOMIC_SEQ_CST);
	}
	/* Still live after the bits are set (§7): io's last drain, which
	 * comes after it clears the word, takes them. Cleared meanwhile: the
	 * bits may be after that drain, so the write goes through the ring
	 * too (the same bytes: the store is harmless). */
	if (!__atomic_load_n(live, __ATOMIC_SEQ_CST))
		goto out;
	__atomic_store_n(&w->used, now, __ATOMIC_RELAXED);
	r = (ssize_t)n;
out:
	pthread_rwlock_unlock(&fs->wmu);
	return r;
}

/* write_log maps the session's write log at the first window; under wmu
 * exclusive. */
static int write_log(weir_fs *fs)
{
	if (fs->wlog)
		return 0;
	if (fs->wlog_failed)
		return -EOPNOTSUPP;
	uint64_t tag = 0;
	int64_t res = call(&fs->io, WEIR_OP_WRITE_LOG, 0, 0, 0, NULL, 0, NULL, 0, &tag);
	int fd = res < 0 ? (int)res : take_file(fs, tag);
	struct stat st;
	void *p = MAP_FAILED;
	/* Sealed at its size: no load or store of it can fault. */
	if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size == WEIR_WRITE_LOG_SIZE &&
	    (fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW))
		p = mmap(NULL, WEIR_WRITE_LOG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	if (p == MAP_FAILED) {
		fs->wlog_failed = 1;
		return -EPROTO;
	}
	fs->wlog = p;
	return 0;
}

/* unpin_slot ends the window in slot i; under wmu exclusive. A window
 * io ended itself (its live word 0) is only forgotten here. */
static void unpin_slot(weir_fs *fs, unsigned i)
{
	struct wwin *w = &fs->wins[i];
	if (!w->c)
		return;
	if (w->c->wslot[w->win % WHASH] == i + 1)
		__atomic_store_n(&w->c->wslot[w->win % WHASH], 0, __ATOMIC_RELAXED);
	/* io drains the slot before it frees it: an error leaves it to the
	 * session's end, and the slot unused here, unless io ended it. */
	if (!__atomic_load_n(slot_live(fs, i), __ATOMIC_ACQUIRE) ||
	    call(&fs->io, WEIR_OP_WRITE_UNPIN, i, 0, 0, NULL, 0, NULL, 0, NULL) == 0 ||
	    !__atomic_load_n(slot_live(fs, i), __ATOMIC_ACQUIRE))
		w->c = NULL;
	else
		w->win = ~(uint64_t)0; /* held by io still: never free here */
}

/* warm counts an overwrite through the ring at off (below size, the
 * file's size before it), and pins its window at the WIN_HEAT-th: only
 * overwrites, as only they take the window's path, and only a window
 * that starts inside the file. */
static void warm(weir_fs *fs, weir_cache *c, uint64_t off, uint64_t size)
{
	uint64_t win = off / WIN_BYTES;
	unsigned h = (unsigned)(win % WHASH);
	unsigned cur = __atomic_load_n(&c->wslot[h], __ATOMIC_RELAXED);
	if ((cur && (!fs->wlog || __atomic_load_n(slot_live(fs, cur - 1), __ATOMIC_RELAXED))) ||
	    (win + 1) * WIN_BYTES > c->cap || win * WIN_BYTES >= size ||
	    __atomic_add_fetch(&c->heat[h], 1, __ATOMIC_RELAXED) < WIN_HEAT)
		return;
	c->heat[h] = 0;
	pthread_rwlock_wrlock(&fs->wmu);
	int64_t now = realtime_ns();
	if (c->wslot[h] && fs->wlog && !__atomic_load_n(slot_live(fs, c->wslot[h] - 1), __ATOMIC_ACQUIRE))
		unpin_slot(fs, c->wslot[h] - 1); /* io ended it: forgotten */
	if (c->wslot[h] || now < fs->wfull_until || write_log(fs))
		goto out;
	/* A free slot (or one io ended), else the one stored into least
	 * recently. */
	unsigned best = WEIR_WRITE_LOG_SLOTS;
	for (unsigned i = 0; i < WEIR_WRITE_LOG_SLOTS; i++) {
		struct wwin *w = &fs->wins[i];
		if (!w->c || !__atomic_load_n(slot_live(fs, i), __ATOMIC_ACQUIRE)) {
			best = i;
			break;
		}
		if (w->win != ~(uint64_t)0 && (best == WEIR_WRITE_LOG_SLOTS || w->used < fs->wins[best].used))
			best = i;
	}
	if (best == WEIR_WRITE_LOG_SLOTS)
		goto out;
	unpin_slot(fs, best);
	if (fs->wins[best].c)
		goto out;
	int64_t res = io_call(fs, WEIR_OP_WRITE_PIN, best, c->handle, win * WIN_BYTES, NULL, 0, NULL, 0, NULL);
	if (res == -ENOMEM) {
		/* io's budget for windows is full: give back the window stored
		 * into least recently, and try once more (io's budget, not the
		 * 256 slots, bounds how many a session holds). */
		unsigned lru = WEIR_WRITE_LOG_SLOTS;
		for (unsigned i = 0; i < WEIR_WRITE_LOG_SLOTS; i++) {
			struct wwin *w = &fs->wins[i];
			if (i != best && w->c && w->win != ~(uint64_t)0 && (lru == WEIR_WRITE_LOG_SLOTS || w->used < fs->wins[lru].used))
				lru = i;
		}
		if (lru != WEIR_WRITE_LOG_SLOTS) {
			unpin_slot(fs, lru);
			res = io_call(fs, WEIR_OP_WRITE_PIN, best, c->handle, win * WIN_BYTES, NULL, 0, NULL, 0, NULL);
		}
	}
	if (res == 0) {
		/* The window's page table entries now, in one call, not a
		 * fault at each page's first store (about 2 µs each here;
		 * Linux 5.14, else the faults it is): those inside the file,
		 * which io filled (a store past the end goes through the ring). */
		uint64_t end = (size + WEIR_CACHE_PAGE_SIZE - 1) & ~(uint64_t)(WEIR_CACHE_PAGE_SIZE - 1);
		if (end > (win + 1) * WIN_BYTES)
			end = (win + 1) * WIN_BYTES;
		(void)madvise(c->wdata + win * WIN_BYTES, end - win * WIN_BYTES, MADV_POPULATE_WRITE);
		fs->wins[best] = (struct wwin){.c = c, .win = win, .used = now};
		__atomic_store_n(&c->wslot[h], (uint16_t)(best + 1), __ATOMIC_RELAXED);
	} else if (res == -ENOMEM) {
		fs->wfull_until = now + WIN_FULL_BACKOFF_NS;
	}
out:
	pthread_rwlock_unlock(&fs->wmu);
}

ssize_t weir_cache_pwrite(weir_fs *fs, weir_cache *c, uint64_t handle, const void *buf, size_t n, uint64_t off)
{
	if (c && c->wdata && c->wfs == fs && c->handle == handle) {
		ssize_t r = window_store(fs, c, buf, n, off);
		if (r != -EAGAIN)
			return r;
	}
	int64_t size = c && c->wdata && c->wfs == fs && c->handle == handle ? cache_size(c) : -1;
	ssize_t r = weir_pwrite(fs, handle, buf, n, off, 0);
	if (r > 0 && size >= 0 && off + n <= (uint64_t)size)
		warm(fs, c, off, (uint64_t)size);
	return r;
}

void weir_cache_release(weir_fs *fs, weir_cache *c)
{
	if (!c || !c->wdata || c->wfs != fs)
		return;
	pthread_rwlock_wrlock(&fs->wmu);
	for (unsigned i = 0; i < WEIR_WRITE_LOG_SLOTS; i++)
		if (fs->wins[i].c == c)
			unpin_slot(fs, i);
	/* A slot io still holds (an unpin that failed) keeps a pointer to c
	 * for nothing but the comparison: it is never dereferenced again. */
	pthread_rwlock_unlock(&fs->wmu);
}

int weir_statfs(weir_fs *fs, struct weir_space *sp)
{
	uint8_t b[WEIR_STATFS_RESP_SIZE];
	int64_t res = call(&fs->io, WEIR_OP_STATFS, 0, 0, 0, NULL, 0, b, sizeof b, NULL);
	if (res < 0)
		return (int)res;
	if (res != WEIR_STATFS_RESP_SIZE)
		return -EPROTO;
	sp->total = get64(b);
	sp->free = get64(b + 8);
	sp->avail = get64(b + 16);
	if (sp->free > sp->total || sp->avail > sp->free)
		return -EPROTO;
	return 0;
}
