// weir_spdk.h: the C side of weir's SPDK Blobstore backend (build tag spdk).
//
// Every function is static inline: each Go file of the package that needs
// them includes this header in its cgo preamble, and no state lives here
// (SPDK threads and channels are passed in from Go).
#ifndef WEIR_SPDK_H
#define WEIR_SPDK_H

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <spdk/stdinc.h>
#include <spdk/env.h>
#include <spdk/thread.h>
#include <spdk/init.h>
#include <spdk/rpc.h>
#include <spdk/log.h>
#include <spdk/bdev.h>
#include <spdk/blob.h>
#include <spdk/blob_bdev.h>

// WEIR_MAX_IOV: an I/O is at most a partial head unit, a middle and a
// partial tail unit.
#define WEIR_MAX_IOV 3

// weir_cq is a worker's completion queue: SPDK's completion callbacks, which
// run on the worker's own thread inside spdk_thread_poll, append the slot of
// the finished op; the worker's Go loop drains it after each poll. One
// thread writes and reads it, so it needs no atomics.
typedef struct {
	uint32_t n;
	uint32_t slots[];
} weir_cq;

static inline uint32_t *weir_cq_slots(weir_cq *cq) { return cq->slots; }

// weir_op is one asynchronous SPDK operation. It lives in C memory so that
// SPDK may keep a pointer to it. Metadata ops (on the metadata thread) are
// waited for through done; I/O ops (on a worker) report through cq, or
// through a cgo callback in the measured alternative.
typedef struct {
	volatile int done;
	int rc;
	uint64_t id;
	struct spdk_blob_store *bs;
	struct spdk_blob *blob;
	weir_cq *cq;
	uint32_t slot;
	uint64_t tag;
	int iovcnt;
	struct iovec iov[WEIR_MAX_IOV];
} weir_op;

static inline void weir_done(void *arg, int rc) { weir_op *op = arg; op->rc = rc; op->done = 1; }
static inline void weir_done_id(void *arg, spdk_blob_id id, int rc) { weir_op *op = arg; op->id = id; op->rc = rc; op->done = 1; }
static inline void weir_done_bs(void *arg, struct spdk_blob_store *bs, int rc) { weir_op *op = arg; op->bs = bs; op->rc = rc; op->done = 1; }
static inline void weir_done_blob(void *arg, struct spdk_blob *b, int rc) { weir_op *op = arg; op->blob = b; op->rc = rc; op->done = 1; }

// weir_env_init starts the SPDK environment and returns the metadata
// thread, owned by the calling OS thread. no_huge runs on ordinary memory
// (tests on hosts without huge pages); mem_mb sizes it; pci lets DPDK
// scan and drive PCI devices (a config attaching a PCIe NVMe controller).
static inline int weir_env_init(int no_huge, int mem_mb, int pci, struct spdk_thread **md) {
	struct spdk_env_opts opts;
	opts.opts_size = sizeof(opts);
	spdk_env_opts_init(&opts);
	opts.name = "weir-io";
	opts.no_pci = !pci;
	if (no_huge) {
		opts.no_huge = true;
	}
	if (mem_mb > 0) {
		opts.mem_size = mem_mb;
	}
	if (spdk_env_init(&opts) < 0) {
		return -EIO;
	}
	spdk_log_set_print_level(SPDK_LOG_ERROR);
	if (spdk_thread_lib_init(NULL, 0) != 0) {
		return -ENOMEM;
	}
	*md = spdk_thread_create("weir-md", NULL);
	if (*md == NULL) {
		return -ENOMEM;
	}
	spdk_set_thread(*md);
	return 0;
}

// weir_thread_start makes an SPDK thread owned by the calling OS thread.
static inline struct spdk_thread *weir_thread_start(const char *name) {
	struct spdk_thread *t = spdk_thread_create(name, NULL);
	if (t != NULL) {
		spdk_set_thread(t);
	}
	return t;
}

// weir_thread_stop exits the calling OS thread's SPDK thread: it polls until
// every outstanding message and channel release has run, then destroys it.
static inline void weir_thread_stop(struct spdk_thread *t) {
	spdk_thread_exit(t);
	while (!spdk_thread_is_exited(t)) {
		spdk_thread_poll(t, 0, 0);
	}
	spdk_thread_destroy(t);
	spdk_set_thread(NULL);
}

static inline void weir_init_done(int rc, void *arg) { weir_done(arg, rc); }

static inline void weir_load_config(void *json, size_t len, weir_op *op) {
	spdk_subsystem_load_config(json, (ssize_t)len, weir_init_done, op, true);
}

// As spdk_app_start does: the configuration's startup-time RPCs, then the
// subsystems' initialisation, then its runtime RPCs (bdev creation).
static inline void weir_subsystem_init(weir_op *op) { spdk_subsystem_init(weir_init_done, op); }
static inline void weir_rpc_runtime(void) { spdk_rpc_set_state(SPDK_RPC_RUNTIME); }

static inline void weir_bdev_event(enum spdk_bdev_event_type type, struct spdk_bdev *bdev, void *ctx) {}

static inline int weir_bs_dev(const char *name, struct spdk_bs_dev **dev) {
	return spdk_bdev_create_bs_dev_ext(name, weir_bdev_event, NULL, dev);
}

static inline void weir_bs_load(struct spdk_bs_dev *dev, int init, uint64_t cluster_sz, weir_op *op) {
	struct spdk_bs_opts opts;
	spdk_bs_opts_init(&opts, sizeof(opts));
	memcpy(opts.bstype.bstype, "weir", 4);
	if (init) {
		if (cluster_sz) {
			opts.cluster_sz = cluster_sz;
		}
		// A new blobstore starts with every cluster reading zeros.
		opts.clear_method = BS_CLEAR_WITH_WRITE_ZEROES;
		spdk_bs_init(dev, &opts, weir_done_bs, op);
	} else {
		spdk_bs_load(dev, &opts, weir_done_bs, op);
	}
}

// The device flush: the blobstore's bdev bs_dev has no flush, so weir opens
// a descriptor of its own on the bdev (the blobstore does not claim it) and
// flushes the whole bdev: a volatile write cache (NVMe), or the file system
// under an aio bdev (fsync), persists what completed writes put there.
static inline int weir_flush_open(const char *name, struct spdk_bdev_desc **desc) {
	return spdk_bdev_open_ext(name, true, weir_bdev_event, NULL, desc);
}
// A flush is sent only to a bdev with a volatile write cache: SPDK's NVMe
// bdev completes one to a drive without a volatile cache at once, so
// spdk_flushes counts the flushes that reach a device (NVMe ones only with
// enable_flush, which the backend sets: spdkconf.WithNVMeFlush).
static inline int weir_flush_supported(struct spdk_bdev_desc *d) {
	struct spdk_bdev *b = spdk_bdev_desc_get_bdev(d);
	return spdk_bdev_io_type_supported(b, SPDK_BDEV_IO_TYPE_FLUSH) && spdk_bdev_has_write_cache(b);
}
static inline void weir_flush_done(struct spdk_bdev_io *io, bool ok, void *arg) {
	spdk_bdev_free_io(io);
	weir_done(arg, ok ? 0 : -EIO);
}
static inline void weir_flush(struct spdk_bdev_desc *d, struct spdk_io_channel *ch, weir_op *op) {
	struct spdk_bdev *b = spdk_bdev_desc_get_bdev(d);
	int rc = spdk_bdev_flush_blocks(d, ch, 0, spdk_bdev_get_num_blocks(b), weir_flush_done, op);
	if (rc != 0) {
		weir_done(op, rc);
	}
}

static inline void weir_bs_unload(struct spdk_blob_store *bs, weir_op *op) { spdk_bs_unload(bs, weir_done, op); }

static inline void weir_create(struct spdk_blob_store *bs, weir_op *op) {
	struct spdk_blob_opts opts;
	spdk_blob_opts_init(&opts, sizeof(opts));
	opts.thin_provision = true;
	// Freed clusters (shrink, delete) are zeroed: a thin blob's newly
	// allocated cluster is not, so this keeps "free clusters read as
	// zeros", which holes and grows rely on.
	opts.clear_method = BLOB_CLEAR_WITH_WRITE_ZEROES;
	spdk_bs_create_blob_ext(bs, &opts, weir_done_id, op);
}
static inline void weir_open(struct spdk_blob_store *bs, uint64_t id, weir_op *op) { spdk_bs_open_blob(bs, id, weir_done_blob, op); }
static inline void weir_close(struct spdk_blob *b, weir_op *op) { spdk_blob_close(b, weir_done, op); }
static inline void weir_delete(struct spdk_blob_store *bs, uint64_t id, weir_op *op) { spdk_bs_delete_blob(bs, id, weir_done, op); }
static inline void weir_resize(struct spdk_blob *b, uint64_t clusters, weir_op *op) { spdk_blob_resize(b, clusters, weir_done, op); }
static inline void weir_sync_md(struct spdk_blob *b, weir_op *op) { spdk_blob_sync_md(b, weir_done, op); }
static inline void weir_iter_first(struct spdk_blob_store *bs, weir_op *op) { spdk_bs_iter_first(bs, weir_done_blob, op); }
static inline void weir_iter_next(struct spdk_blob_store *bs, struct spdk_blob *b, weir_op *op) { spdk_bs_iter_next(bs, b, weir_done_blob, op); }

// Synchronous-style I/O on the metadata thread (truncate's edge unit).
static inline void weir_read(struct spdk_blob *b, struct spdk_io_channel *ch, void *buf, uint64_t off, uint64_t n, weir_op *op) {
	spdk_blob_io_read(b, ch, buf, off, n, weir_done, op);
}
static inline void weir_write(struct spdk_blob *b, struct spdk_io_channel *ch, void *buf, uint64_t off, uint64_t n, weir_op *op) {
	spdk_blob_io_write(b, ch, buf, off, n, weir_done, op);
}
static inline void weir_write_zeroes(struct spdk_blob *b, struct spdk_io_channel *ch, uint64_t off, uint64_t n, weir_op *op) {
	spdk_blob_io_write_zeroes(b, ch, off, n, weir_done, op);
}

// Worker I/O completions: into the worker's C queue (the default), or
// through a cgo callback into Go (measured, see docs/spdk-backend.md).
static inline void weir_io_done(void *arg, int rc) {
	weir_op *op = arg;
	op->rc = rc;
	weir_cq *cq = op->cq;
	cq->slots[cq->n++] = op->slot;
}

extern void weirGoIODone(uint64_t tag, int rc);

static inline void weir_io_done_cgo(void *arg, int rc) {
	weir_op *op = arg;
	weirGoIODone(op->tag, rc);
}

// weir_io_submit starts op's read or write of n io units at io unit off,
// on the worker's channel. For a write it returns 1 if part of the range
// has no cluster yet: the blobstore then allocates one, which takes a
// message to the metadata thread.
static inline int weir_io_submit(struct spdk_blob *b, struct spdk_io_channel *ch, int write,
				 weir_op *op, uint64_t off, uint64_t n, int cgo) {
	spdk_blob_op_complete cb = cgo ? weir_io_done_cgo : weir_io_done;
	int alloc = 0;
	if (write) {
		alloc = spdk_blob_get_next_unallocated_io_unit(b, off) < off + n;
		spdk_blob_io_writev(b, ch, op->iov, op->iovcnt, off, n, cb, op);
	} else {
		spdk_blob_io_readv(b, ch, op->iov, op->iovcnt, off, n, cb, op);
	}
	return alloc;
}

// weir_get_u64 reads an 8-byte xattr; -ENOENT if missing.
static inline int weir_get_u64(struct spdk_blob *b, const char *name, uint64_t *v) {
	const void *val;
	size_t len;
	int rc = spdk_blob_get_xattr_value(b, name, &val, &len);
	if (rc != 0) {
		return rc;
	}
	if (len != sizeof(*v)) {
		return -EINVAL;
	}
	memcpy(v, val, sizeof(*v));
	return 0;
}

static inline int weir_set_u64(struct spdk_blob *b, const char *name, uint64_t v) {
	return spdk_blob_set_xattr(b, name, &v, sizeof(v));
}

// The filter device: a blobstore device over the bdev's bs_dev, through
// which every blobstore load goes, so that a failed load changes nothing.
//
// While it holds (state[W_HOLD] = 1), the writes, zeroings and unmaps the
// blobstore issues (the recovery of a store not shut down cleanly) are
// kept in memory, in order, and reads see them; weir_filter_commit writes
// them to the device once the whole load has succeeded, and a failed load
// drops them. Read-only (weir check), the load holds and nothing is ever
// committed (W_HOLD 2: the held changes stay, every later write goes to the
// W_FAIL_WRITE check, which refuses it). While holding, it counts the reads
// that fail (W_READ_ERRORS): SPDK's blob iterator skips a blob it cannot
// read, so the load asks the filter instead. It also counts the reads and device writes, and fails the
// state[W_FAIL_READ]-th read and every device write from the
// state[W_FAIL_WRITE]-th on with -EIO (tests; read-only and a failed load
// set W_FAIL_WRITE to 1, so that the unload's writes fail: the blobstore
// frees itself after a failed write only when the error is -EIO).
//
// state is the caller's (it outlives the device; WEIR_FILTER_STATE ints):
enum {
	W_READS,      // reads issued
	W_WRITES,     // device writes issued
	W_FAIL_READ,  // the read to fail (0: none)
	W_FAIL_WRITE, // the first device write to fail (0: none)
	W_FAIL_WRITE_AT, // the one device write to fail (0: none)
	W_FAIL_LANDED_AT, // the one commit write reported failed after it reached the device (0: none)
	W_HOLD,       // 1: keep writes in memory; 2: keep the held ones, refuse more
	W_READ_ERRORS, // reads that failed while holding
	WEIR_FILTER_STATE
};

// weir_held is one held change: data (n blocks) or, if NULL, a zeroing
// (unmap set: an unmap).
typedef struct {
	uint64_t lba, n;
	uint8_t *data;
	bool unmap;
} weir_held;

typedef struct {
	struct spdk_bs_dev dev; // first: the blobstore sees only this
	struct spdk_bs_dev *inner;
	int *state;
	weir_held *held;
	size_t nheld, capheld;
	bool quiet; // set before the data path starts: count and fail nothing
} weir_filter_dev;

static inline weir_filter_dev *weir_filter_of(struct spdk_bs_dev *d) { return (weir_filter_dev *)d; }
static inline int weir_filter_get(weir_filter_dev *f, int i) { return __atomic_load_n(&f->state[i], __ATOMIC_SEQ_CST); }
static inline void weir_filter_set(int *state, int i, int v) { __atomic_store_n(&state[i], v, __ATOMIC_SEQ_CST); }
static inline int weir_filter_at(int *state, int i) { return __atomic_load_n(&state[i], __ATOMIC_SEQ_CST); }

static inline void weir_filter_drop(weir_filter_dev *f) {
	for (size_t i = 0; i < f->nheld; i++) {
		spdk_dma_free(f->held[i].data);
	}
	free(f->held);
	f->held = NULL;
	f->nheld = f->capheld = 0;
}

static inline struct spdk_io_channel *weir_filter_create_channel(struct spdk_bs_dev *d) {
	struct spdk_bs_dev *in = weir_filter_of(d)->inner;
	return in->create_channel(in);
}
static inline void weir_filter_destroy_channel(struct spdk_bs_dev *d, struct spdk_io_channel *ch) {
	struct spdk_bs_dev *in = weir_filter_of(d)->inner;
	in->destroy_channel(in, ch);
}
static inline void weir_filter_destroy(struct spdk_bs_dev *d) {
	weir_filter_dev *f = weir_filter_of(d);
	f->inner->destroy(f->inner);
	weir_filter_drop(f);
	free(f);
}
// weir_filter_read_fails counts a read and says whether it is to fail.
static inline int weir_filter_read_fails(weir_filter_dev *f) {
	if (f->quiet) {
		return 0;
	}
	return __atomic_add_fetch(&f->state[W_READS], 1, __ATOMIC_SEQ_CST) == weir_filter_get(f, W_FAIL_READ);
}
// weir_filter_write_fails counts a device write and says whether it is to
// fail.
static inline int weir_filter_write_fails(weir_filter_dev *f) {
	if (f->quiet) {
		return 0;
	}
	int n = __atomic_add_fetch(&f->state[W_WRITES], 1, __ATOMIC_SEQ_CST);
	int from = weir_filter_get(f, W_FAIL_WRITE), at = weir_filter_get(f, W_FAIL_WRITE_AT);
	if ((from > 0 && n >= from) || n == at) {
		return 1;
	}
	return 0;
}
static inline int weir_filter_holds(weir_filter_dev *f) { return f->quiet ? 0 : weir_filter_get(f, W_HOLD); }

// weir_iov_put copies len bytes of src (zeros if NULL) into iov at byte off.
static inline void weir_iov_put(struct iovec *iov, int iovcnt, uint64_t off, const uint8_t *src, uint64_t len) {
	for (int i = 0; i < iovcnt && len > 0; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		uint64_t k = iov[i].iov_len - off < len ? iov[i].iov_len - off : len;
		if (src != NULL) {
			memcpy((uint8_t *)iov[i].iov_base + off, src, k);
			src += k;
		} else {
			memset((uint8_t *)iov[i].iov_base + off, 0, k);
		}
		len -= k;
		off = 0;
	}
}

// weir_filter_hold keeps a change of n blocks at lba: data from iov, or a
// zeroing/unmap if iov is NULL. 0 or -ENOMEM.
static inline int weir_filter_hold(weir_filter_dev *f, uint64_t lba, uint64_t n, struct iovec *iov, int iovcnt,
				   bool unmap) {
	if (f->nheld == f->capheld) {
		size_t c = f->capheld ? 2 * f->capheld : 16;
		weir_held *h = realloc(f->held, c * sizeof(*h));
		if (h == NULL) {
			return -ENOMEM;
		}
		f->held = h;
		f->capheld = c;
	}
	weir_held e = {.lba = lba, .n = n, .unmap = unmap};
	if (iov != NULL) {
		uint64_t len = n * f->dev.blocklen, off = 0;
		// DMA memory: the commit hands it to the device (a PCIe NVMe
		// device reads it by physical address).
		if ((e.data = spdk_dma_malloc(len, 4096, NULL)) == NULL) {
			return -ENOMEM;
		}
		for (int i = 0; i < iovcnt && off < len; i++) {
			uint64_t k = iov[i].iov_len < len - off ? iov[i].iov_len : len - off;
			memcpy(e.data + off, iov[i].iov_base, k);
			off += k;
		}
	}
	f->held[f->nheld++] = e;
	return 0;
}

// weir_filter_overlaps says whether a held change meets [lba, lba+n).
static inline bool weir_filter_overlaps(weir_filter_dev *f, uint64_t lba, uint64_t n) {
	for (size_t i = 0; i < f->nheld; i++) {
		if (f->held[i].lba < lba + n && lba < f->held[i].lba + f->held[i].n) {
			return true;
		}
	}
	return false;
}

// A read while holding: the device's data, then the held changes over it
// in the order they were made; a failure is counted.
typedef struct {
	struct spdk_bs_dev_cb_args cb; // the inner read's
	struct spdk_bs_dev_cb_args *orig;
	weir_filter_dev *f;
	uint64_t lba, n;
	int iovcnt;
	struct iovec iov[];
} weir_held_read;

static inline void weir_held_read_done(struct spdk_io_channel *ch, void *arg, int rc) {
	weir_held_read *r = arg;
	weir_filter_dev *f = r->f;
	if (rc != 0) {
		__atomic_add_fetch(&f->state[W_READ_ERRORS], 1, __ATOMIC_SEQ_CST);
	}
	uint64_t bl = f->dev.blocklen;
	for (size_t i = 0; rc == 0 && i < f->nheld; i++) {
		weir_held *e = &f->held[i];
		uint64_t lo = e->lba > r->lba ? e->lba : r->lba;
		uint64_t hi = e->lba + e->n < r->lba + r->n ? e->lba + e->n : r->lba + r->n;
		if (lo < hi) {
			weir_iov_put(r->iov, r->iovcnt, (lo - r->lba) * bl, e->data ? e->data + (lo - e->lba) * bl : NULL,
				     (hi - lo) * bl);
		}
	}
	struct spdk_bs_dev_cb_args *orig = r->orig;
	free(r);
	orig->cb_fn(ch, orig->cb_arg, rc);
}

static inline weir_held_read *weir_held_read_new(weir_filter_dev *f, struct spdk_bs_dev_cb_args *orig, uint64_t lba,
						 uint64_t n, struct iovec *iov, int iovcnt) {
	weir_held_read *r = malloc(sizeof(*r) + iovcnt * sizeof(struct iovec));
	if (r == NULL) {
		return NULL;
	}
	r->cb.cb_fn = weir_held_read_done;
	r->cb.channel = orig->channel;
	r->cb.cb_arg = r;
	r->orig = orig;
	r->f = f;
	r->lba = lba;
	r->n = n;
	r->iovcnt = iovcnt;
	memcpy(r->iov, iov, iovcnt * sizeof(struct iovec));
	return r;
}

static inline void weir_filter_done(struct spdk_io_channel *ch, struct spdk_bs_dev_cb_args *cb, int rc) {
	cb->cb_fn(ch, cb->cb_arg, rc);
}

// weir_filter_read_any reads through the filter: into buf if iov is NULL
// (read), else into iov (readv, or readv_ext if use_ext). The iovec array
// handed to the device must live until the read completes: a read while
// holding passes its own copy.
static inline void weir_filter_read_any(struct spdk_bs_dev *d, struct spdk_io_channel *ch, void *buf,
					struct iovec *iov, int iovcnt, uint64_t lba, uint32_t n,
					struct spdk_bs_dev_cb_args *cb, struct spdk_blob_ext_io_opts *ext, bool use_ext) {
	weir_filter_dev *f = weir_filter_of(d);
	struct spdk_bs_dev *in = f->inner;
	if (weir_filter_read_fails(f)) {
		if (weir_filter_holds(f)) {
			__atomic_add_fetch(&f->state[W_READ_ERRORS], 1, __ATOMIC_SEQ_CST);
		}
		weir_filter_done(ch, cb, -EIO);
		return;
	}
	if (weir_filter_holds(f)) {
		struct iovec one = {.iov_base = buf, .iov_len = (size_t)n * d->blocklen};
		weir_held_read *r = iov ? weir_held_read_new(f, cb, lba, n, iov, iovcnt)
					: weir_held_read_new(f, cb, lba, n, &one, 1);
		if (r == NULL) {
			weir_filter_done(ch, cb, -ENOMEM);
			return;
		}
		if (iov == NULL) {
			in->read(in, ch, buf, lba, n, &r->cb);
		} else if (use_ext) {
			in->readv_ext(in, ch, r->iov, iovcnt, lba, n, &r->cb, ext);
		} else {
			in->readv(in, ch, r->iov, iovcnt, lba, n, &r->cb);
		}
		return;
	}
	if (iov == NULL) {
		in->read(in, ch, buf, lba, n, cb);
	} else if (use_ext) {
		in->readv_ext(in, ch, iov, iovcnt, lba, n, cb, ext);
	} else {
		in->readv(in, ch, iov, iovcnt, lba, n, cb);
	}
}
static inline void weir_filter_read(struct spdk_bs_dev *d, struct spdk_io_channel *ch, void *buf, uint64_t lba,
				    uint32_t n, struct spdk_bs_dev_cb_args *cb) {
	weir_filter_read_any(d, ch, buf, NULL, 0, lba, n, cb, NULL, false);
}
static inline void weir_filter_readv(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov, int iovcnt,
				     uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb) {
	weir_filter_read_any(d, ch, NULL, iov, iovcnt, lba, n, cb, NULL, false);
}
static inline void weir_filter_readv_ext(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov,
					 int iovcnt, uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb,
					 struct spdk_blob_ext_io_opts *o) {
	weir_filter_read_any(d, ch, NULL, iov, iovcnt, lba, n, cb, o, true);
}

// weir_filter_write_any writes through the filter: held (copied), or to
// the device. Its data is buf if iov is NULL and buf is not (write), iov
// (writev, or writev_ext if use_ext), or none: a zeroing (an unmap if
// unmap is set).
static inline void weir_filter_write_any(struct spdk_bs_dev *d, struct spdk_io_channel *ch, void *buf,
					 struct iovec *iov, int iovcnt, uint64_t lba, uint64_t n,
					 struct spdk_bs_dev_cb_args *cb, struct spdk_blob_ext_io_opts *ext, bool use_ext,
					 bool unmap) {
	weir_filter_dev *f = weir_filter_of(d);
	struct spdk_bs_dev *in = f->inner;
	if (weir_filter_holds(f) == 1) {
		struct iovec one = {.iov_base = buf, .iov_len = (size_t)n * d->blocklen};
		if (iov == NULL && buf != NULL) {
			iov = &one;
			iovcnt = 1;
		}
		weir_filter_done(ch, cb, weir_filter_hold(f, lba, n, iov, iovcnt, unmap));
		return;
	}
	if (weir_filter_write_fails(f)) {
		weir_filter_done(ch, cb, -EIO);
		return;
	}
	if (buf != NULL) {
		in->write(in, ch, buf, lba, (uint32_t)n, cb);
	} else if (iov == NULL) {
		if (unmap) {
			in->unmap(in, ch, lba, n, cb);
		} else {
			in->write_zeroes(in, ch, lba, n, cb);
		}
	} else if (use_ext) {
		in->writev_ext(in, ch, iov, iovcnt, lba, (uint32_t)n, cb, ext);
	} else {
		in->writev(in, ch, iov, iovcnt, lba, (uint32_t)n, cb);
	}
}
static inline void weir_filter_write(struct spdk_bs_dev *d, struct spdk_io_channel *ch, void *buf, uint64_t lba,
				     uint32_t n, struct spdk_bs_dev_cb_args *cb) {
	weir_filter_write_any(d, ch, buf, NULL, 0, lba, n, cb, NULL, false, false);
}
static inline void weir_filter_writev(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov, int iovcnt,
				      uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb) {
	weir_filter_write_any(d, ch, NULL, iov, iovcnt, lba, n, cb, NULL, false, false);
}
static inline void weir_filter_writev_ext(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov,
					  int iovcnt, uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb,
					  struct spdk_blob_ext_io_opts *o) {
	weir_filter_write_any(d, ch, NULL, iov, iovcnt, lba, n, cb, o, true, false);
}
static inline void weir_filter_write_zeroes(struct spdk_bs_dev *d, struct spdk_io_channel *ch, uint64_t lba,
					    uint64_t n, struct spdk_bs_dev_cb_args *cb) {
	weir_filter_write_any(d, ch, NULL, NULL, 0, lba, n, cb, NULL, false, false);
}
static inline void weir_filter_unmap(struct spdk_bs_dev *d, struct spdk_io_channel *ch, uint64_t lba, uint64_t n,
				     struct spdk_bs_dev_cb_args *cb) {
	weir_filter_write_any(d, ch, NULL, NULL, 0, lba, n, cb, NULL, false, true);
}
static inline void weir_filter_flush(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct spdk_bs_dev_cb_args *cb) {
	weir_filter_dev *f = weir_filter_of(d);
	struct spdk_bs_dev *in = f->inner;
	if (weir_filter_holds(f) == 1) { // the commit flushes
		weir_filter_done(ch, cb, 0);
		return;
	}
	if (weir_filter_write_fails(f)) {
		weir_filter_done(ch, cb, -EIO);
		return;
	}
	in->flush(in, ch, cb);
}
static inline void weir_filter_copy(struct spdk_bs_dev *d, struct spdk_io_channel *ch, uint64_t dst, uint64_t src,
				    uint64_t n, struct spdk_bs_dev_cb_args *cb) {
	weir_filter_dev *f = weir_filter_of(d);
	struct spdk_bs_dev *in = f->inner;
	if (weir_filter_holds(f) == 1 || weir_filter_write_fails(f)) { // no load copies
		weir_filter_done(ch, cb, -EIO);
		return;
	}
	in->copy(in, ch, dst, src, n, cb);
}
static inline struct spdk_bdev *weir_filter_base(struct spdk_bs_dev *d) {
	struct spdk_bs_dev *in = weir_filter_of(d)->inner;
	return in->get_base_bdev ? in->get_base_bdev(in) : NULL;
}
static inline bool weir_filter_is_zeroes(struct spdk_bs_dev *d, uint64_t lba, uint64_t n) {
	weir_filter_dev *f = weir_filter_of(d);
	if (weir_filter_holds(f) && weir_filter_overlaps(f, lba, n)) {
		return false;
	}
	return f->inner->is_zeroes(f->inner, lba, n);
}
static inline bool weir_filter_is_range_valid(struct spdk_bs_dev *d, uint64_t lba, uint64_t n) {
	struct spdk_bs_dev *in = weir_filter_of(d)->inner;
	return in->is_range_valid(in, lba, n);
}
static inline bool weir_filter_translate_lba(struct spdk_bs_dev *d, uint64_t lba, uint64_t *base) {
	struct spdk_bs_dev *in = weir_filter_of(d)->inner;
	return in->translate_lba(in, lba, base);
}
static inline bool weir_filter_is_degraded(struct spdk_bs_dev *d) {
	struct spdk_bs_dev *in = weir_filter_of(d)->inner;
	return in->is_degraded(in);
}

// weir_filter_wrap returns a filter device over inner, or NULL without
// memory (inner is then destroyed).
static inline struct spdk_bs_dev *weir_filter_wrap(struct spdk_bs_dev *inner, int *state) {
	weir_filter_dev *f = calloc(1, sizeof(*f));
	if (f == NULL) {
		inner->destroy(inner);
		return NULL;
	}
	f->inner = inner;
	f->state = state;
	struct spdk_bs_dev *d = &f->dev;
	d->create_channel = weir_filter_create_channel;
	d->destroy_channel = weir_filter_destroy_channel;
	d->destroy = weir_filter_destroy;
	d->read = weir_filter_read;
	d->readv = weir_filter_readv;
	d->readv_ext = inner->readv_ext ? weir_filter_readv_ext : NULL;
	d->write = weir_filter_write;
	d->writev = weir_filter_writev;
	d->writev_ext = inner->writev_ext ? weir_filter_writev_ext : NULL;
	d->flush = inner->flush ? weir_filter_flush : NULL;
	d->write_zeroes = inner->write_zeroes ? weir_filter_write_zeroes : NULL;
	d->unmap = inner->unmap ? weir_filter_unmap : NULL;
	d->get_base_bdev = weir_filter_base;
	d->is_zeroes = inner->is_zeroes ? weir_filter_is_zeroes : NULL;
	d->is_range_valid = inner->is_range_valid ? weir_filter_is_range_valid : NULL;
	d->translate_lba = inner->translate_lba ? weir_filter_translate_lba : NULL;
	d->copy = inner->copy ? weir_filter_copy : NULL;
	d->is_degraded = inner->is_degraded ? weir_filter_is_degraded : NULL;
	d->blockcnt = inner->blockcnt;
	d->blocklen = inner->blocklen;
	d->phys_blocklen = inner->phys_blocklen;
	return d;
}

// weir_filter_quiet makes d a plain pass-through from now on (the data
// path of a backend loaded without faults).
static inline void weir_filter_quiet(struct spdk_bs_dev *d) { weir_filter_of(d)->quiet = true; }

// weir_filter_commit writes the held changes to the device and stops
// holding. First it reads what each change overwrites (a failed read:
// nothing was written); then it writes the changes in order and flushes.
// If a write or the flush fails, it writes back what it read, newest
// first, and flushes, so that the device is as it was unless the device
// fails those writes too; op completes with the first error, and op->id
// is 1 if the restore did not complete. On the metadata thread, with no
// blobstore I/O in flight.
enum { WC_SAVE, WC_WRITE, WC_FLUSH, WC_RESTORE, WC_RESTORE_FLUSH };

typedef struct {
	weir_filter_dev *f;
	struct spdk_io_channel *ch;
	int phase;
	size_t next;      // WC_SAVE, WC_WRITE: the next change
	long restore;     // WC_RESTORE: the next change to put back (down to 0)
	bool landed_fail; // report the write in flight failed (W_FAIL_LANDED_AT)
	int rc0;          // the failure being undone
	bool restore_failed;
	uint8_t **orig; // what each change overwrites (DMA memory)
	weir_op *op;
	struct spdk_bs_dev_cb_args cb;
} weir_commit;

static inline void weir_commit_finish(weir_commit *c, int rc) {
	weir_filter_dev *f = c->f;
	f->inner->destroy_channel(f->inner, c->ch);
	for (size_t i = 0; c->orig != NULL && i < f->nheld; i++) {
		spdk_dma_free(c->orig[i]);
	}
	free(c->orig);
	if (rc == 0) {
		weir_filter_drop(f);
		weir_filter_set(f->state, W_HOLD, 0);
	}
	weir_op *op = c->op;
	op->id = c->restore_failed ? 1 : 0;
	free(c);
	weir_done(op, rc);
}

// weir_commit_undo puts back changes last down to 0 after failure rc.
static inline void weir_commit_next(struct spdk_io_channel *ch, void *arg, int rc);
static inline void weir_commit_undo(weir_commit *c, int rc, long last) {
	c->phase = WC_RESTORE;
	c->rc0 = rc;
	c->restore = last;
	weir_commit_next(c->ch, c, 0);
}

static inline void weir_commit_next(struct spdk_io_channel *ch, void *arg, int rc) {
	weir_commit *c = arg;
	weir_filter_dev *f = c->f;
	struct spdk_bs_dev *in = f->inner;
	uint64_t bl = f->dev.blocklen;
	if (c->landed_fail && rc == 0) { // the write reached the device; say it failed
		rc = -EIO;
	}
	c->landed_fail = false;
	switch (c->phase) {
	case WC_SAVE:
		if (rc != 0) {
			weir_commit_finish(c, rc);
			return;
		}
		if (c->next < f->nheld) {
			weir_held *e = &f->held[c->next];
			if ((c->orig[c->next] = spdk_dma_malloc(e->n * bl, 4096, NULL)) == NULL) {
				weir_commit_finish(c, -ENOMEM);
				return;
			}
			if (weir_filter_read_fails(f)) {
				weir_commit_finish(c, -EIO);
				return;
			}
			in->read(in, c->ch, c->orig[c->next++], e->lba, (uint32_t)e->n, &c->cb);
			return;
		}
		c->phase = WC_WRITE;
		c->next = 0;
		/* fall through */
	case WC_WRITE:
		if (rc != 0) {
			weir_commit_undo(c, rc, (long)c->next - 1);
			return;
		}
		if (c->next < f->nheld) {
			if (weir_filter_write_fails(f)) {
				weir_commit_undo(c, -EIO, (long)c->next - 1);
				return;
			}
			c->landed_fail = weir_filter_get(f, W_WRITES) == weir_filter_get(f, W_FAIL_LANDED_AT);
			weir_held *e = &f->held[c->next++];
			if (e->data != NULL) {
				in->write(in, c->ch, e->data, e->lba, (uint32_t)e->n, &c->cb);
			} else if (e->unmap) {
				in->unmap(in, c->ch, e->lba, e->n, &c->cb);
			} else {
				in->write_zeroes(in, c->ch, e->lba, e->n, &c->cb);
			}
			return;
		}
		c->phase = WC_FLUSH;
		if (in->flush == NULL) {
			weir_commit_finish(c, 0);
			return;
		}
		if (weir_filter_write_fails(f)) {
			weir_commit_undo(c, -EIO, (long)f->nheld - 1);
			return;
		}
		c->landed_fail = weir_filter_get(f, W_WRITES) == weir_filter_get(f, W_FAIL_LANDED_AT);
		in->flush(in, c->ch, &c->cb);
		return;
	case WC_FLUSH:
		if (rc != 0) {
			weir_commit_undo(c, rc, (long)f->nheld - 1);
			return;
		}
		weir_commit_finish(c, 0);
		return;
	case WC_RESTORE:
		if (rc != 0) {
			c->restore_failed = true;
		}
		while (c->restore >= 0) {
			long i = c->restore--;
			if (weir_filter_write_fails(f)) {
				c->restore_failed = true;
				continue;
			}
			in->write(in, c->ch, c->orig[i], f->held[i].lba, (uint32_t)f->held[i].n, &c->cb);
			return;
		}
		c->phase = WC_RESTORE_FLUSH;
		if (in->flush == NULL) {
			weir_commit_finish(c, c->rc0);
			return;
		}
		if (weir_filter_write_fails(f)) {
			c->restore_failed = true;
			weir_commit_finish(c, c->rc0);
			return;
		}
		in->flush(in, c->ch, &c->cb);
		return;
	default: // WC_RESTORE_FLUSH
		if (rc != 0) {
			c->restore_failed = true;
		}
		weir_commit_finish(c, c->rc0);
	}
}

static inline void weir_filter_commit(struct spdk_bs_dev *d, weir_op *op) {
	weir_filter_dev *f = weir_filter_of(d);
	if (f->nheld == 0) { // nothing held (a clean load): nothing to write
		weir_filter_set(f->state, W_HOLD, 0);
		op->id = 0;
		weir_done(op, 0);
		return;
	}
	weir_commit *c = calloc(1, sizeof(*c));
	if (c == NULL || (c->orig = calloc(f->nheld, sizeof(*c->orig))) == NULL) {
		free(c);
		weir_done(op, -ENOMEM);
		return;
	}
	c->f = f;
	c->op = op;
	if ((c->ch = f->inner->create_channel(f->inner)) == NULL) {
		free(c->orig);
		free(c);
		weir_done(op, -ENOMEM);
		return;
	}
	c->cb.cb_fn = weir_commit_next;
	c->cb.channel = c->ch;
	c->cb.cb_arg = c;
	weir_commit_next(c->ch, c, 0);
}

// weir_bdev_read reads n bytes at byte offset off of the bdev into buf
// (DMA memory), on the calling thread's channel ch.
static inline void weir_bdev_read_done(struct spdk_bdev_io *io, bool ok, void *arg) {
	spdk_bdev_free_io(io);
	weir_done(arg, ok ? 0 : -EIO);
}
static inline void weir_bdev_read(struct spdk_bdev_desc *d, struct spdk_io_channel *ch, void *buf, uint64_t off,
				  uint64_t n, weir_op *op) {
	int rc = spdk_bdev_read(d, ch, buf, off, n, weir_bdev_read_done, op);
	if (rc != 0) {
		weir_done(op, rc);
	}
}
static inline int weir_bdev_open_ro(const char *name, struct spdk_bdev_desc **desc) {
	return spdk_bdev_open_ext(name, false, weir_bdev_event, NULL, desc);
}
static inline uint64_t weir_bdev_size(struct spdk_bdev_desc *d) {
	struct spdk_bdev *b = spdk_bdev_desc_get_bdev(d);
	return spdk_bdev_get_num_blocks(b) * spdk_bdev_get_block_size(b);
}
static inline uint32_t weir_bdev_block(struct spdk_bdev_desc *d) {
	return spdk_bdev_get_block_size(spdk_bdev_desc_get_bdev(d));
}

// The super blob records the store's identity (xattr weir.stack).
static inline void weir_set_super(struct spdk_blob_store *bs, uint64_t id, weir_op *op) {
	spdk_bs_set_super(bs, id, weir_done, op);
}
static inline void weir_get_super(struct spdk_blob_store *bs, weir_op *op) { spdk_bs_get_super(bs, weir_done_id, op); }

// weir_get_bytes reads an xattr of exactly n bytes; -ENOENT if missing,
// -EINVAL if of another length.
static inline int weir_get_bytes(struct spdk_blob *b, const char *name, void *v, size_t n) {
	const void *val;
	size_t len;
	int rc = spdk_blob_get_xattr_value(b, name, &val, &len);
	if (rc != 0) {
		return rc;
	}
	if (len != n) {
		return -EINVAL;
	}
	memcpy(v, val, n);
	return 0;
}
static inline int weir_set_bytes(struct spdk_blob *b, const char *name, const void *v, size_t n) {
	return spdk_blob_set_xattr(b, name, v, n);
}

#endif
