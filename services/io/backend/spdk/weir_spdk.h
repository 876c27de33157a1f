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
// (tests on hosts without huge pages); mem_mb sizes it.
static inline int weir_env_init(int no_huge, int mem_mb, struct spdk_thread **md) {
	struct spdk_env_opts opts;
	opts.opts_size = sizeof(opts);
	spdk_env_opts_init(&opts);
	opts.name = "weir-io";
	opts.no_pci = true;
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
static inline int weir_flush_supported(struct spdk_bdev_desc *d) {
	return spdk_bdev_io_type_supported(spdk_bdev_desc_get_bdev(d), SPDK_BDEV_IO_TYPE_FLUSH);
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

// Read-only blobstore device (weir check): reads go to the bdev's bs_dev,
// and every write, unmap, zeroing, copy or flush fails with -EIO, before it
// reaches the device. (-EIO rather than -EROFS: the blobstore's unload
// writes the super block, and frees itself after a failed write only when
// the error is -EIO.) *wrote (caller's memory, outliving the device) is
// set when the blobstore tried to write.
typedef struct {
	struct spdk_bs_dev dev; // first: the blobstore sees only this
	struct spdk_bs_dev *inner;
	int *wrote;
} weir_ro_dev;

static inline weir_ro_dev *weir_ro_of(struct spdk_bs_dev *d) { return (weir_ro_dev *)d; }

static inline struct spdk_io_channel *weir_ro_create_channel(struct spdk_bs_dev *d) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	return in->create_channel(in);
}
static inline void weir_ro_destroy_channel(struct spdk_bs_dev *d, struct spdk_io_channel *ch) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	in->destroy_channel(in, ch);
}
static inline void weir_ro_destroy(struct spdk_bs_dev *d) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	in->destroy(in);
	free(d);
}
static inline void weir_ro_read(struct spdk_bs_dev *d, struct spdk_io_channel *ch, void *buf, uint64_t lba,
				uint32_t n, struct spdk_bs_dev_cb_args *cb) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	in->read(in, ch, buf, lba, n, cb);
}
static inline void weir_ro_readv(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov, int iovcnt,
				 uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	in->readv(in, ch, iov, iovcnt, lba, n, cb);
}
static inline void weir_ro_readv_ext(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov, int iovcnt,
				     uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb,
				     struct spdk_blob_ext_io_opts *o) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	in->readv_ext(in, ch, iov, iovcnt, lba, n, cb, o);
}
static inline void weir_ro_refuse(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct spdk_bs_dev_cb_args *cb) {
	*weir_ro_of(d)->wrote = 1;
	cb->cb_fn(ch, cb->cb_arg, -EIO);
}
static inline void weir_ro_write(struct spdk_bs_dev *d, struct spdk_io_channel *ch, void *buf, uint64_t lba,
				 uint32_t n, struct spdk_bs_dev_cb_args *cb) { weir_ro_refuse(d, ch, cb); }
static inline void weir_ro_writev(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov, int iovcnt,
				  uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb) { weir_ro_refuse(d, ch, cb); }
static inline void weir_ro_writev_ext(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct iovec *iov, int iovcnt,
				      uint64_t lba, uint32_t n, struct spdk_bs_dev_cb_args *cb,
				      struct spdk_blob_ext_io_opts *o) { weir_ro_refuse(d, ch, cb); }
static inline void weir_ro_flush(struct spdk_bs_dev *d, struct spdk_io_channel *ch, struct spdk_bs_dev_cb_args *cb) {
	weir_ro_refuse(d, ch, cb);
}
static inline void weir_ro_range(struct spdk_bs_dev *d, struct spdk_io_channel *ch, uint64_t lba, uint64_t n,
				 struct spdk_bs_dev_cb_args *cb) { weir_ro_refuse(d, ch, cb); }
static inline void weir_ro_copy(struct spdk_bs_dev *d, struct spdk_io_channel *ch, uint64_t dst, uint64_t src,
				uint64_t n, struct spdk_bs_dev_cb_args *cb) { weir_ro_refuse(d, ch, cb); }
static inline struct spdk_bdev *weir_ro_base(struct spdk_bs_dev *d) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	return in->get_base_bdev ? in->get_base_bdev(in) : NULL;
}
static inline bool weir_ro_is_zeroes(struct spdk_bs_dev *d, uint64_t lba, uint64_t n) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	return in->is_zeroes(in, lba, n);
}
static inline bool weir_ro_is_range_valid(struct spdk_bs_dev *d, uint64_t lba, uint64_t n) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	return in->is_range_valid(in, lba, n);
}
static inline bool weir_ro_translate_lba(struct spdk_bs_dev *d, uint64_t lba, uint64_t *base) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	return in->translate_lba(in, lba, base);
}
static inline bool weir_ro_is_degraded(struct spdk_bs_dev *d) {
	struct spdk_bs_dev *in = weir_ro_of(d)->inner;
	return in->is_degraded(in);
}

// weir_ro_wrap returns a read-only device over inner (NULL without memory).
static inline struct spdk_bs_dev *weir_ro_wrap(struct spdk_bs_dev *inner, int *wrote) {
	weir_ro_dev *r = calloc(1, sizeof(*r));
	if (r == NULL) {
		inner->destroy(inner);
		return NULL;
	}
	r->inner = inner;
	r->wrote = wrote;
	struct spdk_bs_dev *d = &r->dev;
	d->create_channel = weir_ro_create_channel;
	d->destroy_channel = weir_ro_destroy_channel;
	d->destroy = weir_ro_destroy;
	d->read = weir_ro_read;
	d->readv = weir_ro_readv;
	d->readv_ext = inner->readv_ext ? weir_ro_readv_ext : NULL;
	d->write = weir_ro_write;
	d->writev = weir_ro_writev;
	d->writev_ext = inner->writev_ext ? weir_ro_writev_ext : NULL;
	d->flush = weir_ro_flush;
	d->write_zeroes = weir_ro_range;
	d->unmap = weir_ro_range;
	d->get_base_bdev = weir_ro_base;
	d->is_zeroes = inner->is_zeroes ? weir_ro_is_zeroes : NULL;
	d->is_range_valid = inner->is_range_valid ? weir_ro_is_range_valid : NULL;
	d->translate_lba = inner->translate_lba ? weir_ro_translate_lba : NULL;
	d->copy = inner->copy ? weir_ro_copy : NULL;
	d->is_degraded = inner->is_degraded ? weir_ro_is_degraded : NULL;
	d->blockcnt = inner->blockcnt;
	d->blocklen = inner->blocklen;
	d->phys_blocklen = inner->phys_blocklen;
	return d;
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
