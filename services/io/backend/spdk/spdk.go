//go:build spdk

// Package spdk is the SPDK Blobstore backend of the IO service: one blob per
// weir blob on a blobstore over an SPDK bdev (NVMe in production; malloc or
// aio for tests), built only with the spdk build tag against an installed
// SPDK (pkg-config). docs/spdk-backend.md is the design.
//
// This first version runs every SPDK call on one SPDK thread owned by one
// locked OS thread, one request at a time: metadata operations (create,
// open, resize, sync_md, delete) and I/O alike. Payloads go through one
// DMA-able bounce buffer. The per-worker I/O channels and the zero-copy
// path of the design come next.
//
// A weir blob is an SPDK blob with two xattrs: "weir.id" (the 8-byte
// BlobID) and "weir.size" (the byte size; the blob's clusters are only
// capacity, thin provisioned, so holes read as zeros).
package spdk

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/weir-storage/weir/services/io/backend"
)

/*
#cgo pkg-config: spdk_blob_bdev spdk_blob spdk_bdev spdk_env_dpdk spdk_init spdk_thread spdk_event_bdev spdk_bdev_malloc spdk_bdev_aio spdk_syslibs
#cgo LDFLAGS: -Wl,--no-as-needed

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

// weir_op is one asynchronous SPDK operation: its callback fills it in,
// and the Go loop polls the SPDK thread until done is set. It lives in C
// memory so that SPDK may keep a pointer to it.
typedef struct {
	volatile int done;
	int rc;
	uint64_t id;
	struct spdk_blob_store *bs;
	struct spdk_blob *blob;
} weir_op;

static struct spdk_thread *weir_thread;

static void weir_done(void *arg, int rc) { weir_op *op = arg; op->rc = rc; op->done = 1; }
static void weir_done_id(void *arg, spdk_blob_id id, int rc) { weir_op *op = arg; op->id = id; op->rc = rc; op->done = 1; }
static void weir_done_bs(void *arg, struct spdk_blob_store *bs, int rc) { weir_op *op = arg; op->bs = bs; op->rc = rc; op->done = 1; }
static void weir_done_blob(void *arg, struct spdk_blob *b, int rc) { weir_op *op = arg; op->blob = b; op->rc = rc; op->done = 1; }

// weir_env_init starts the SPDK environment and the one SPDK thread weir
// uses, owned by the calling OS thread. no_huge runs on ordinary memory
// (tests on hosts without huge pages); mem_mb sizes it.
static int weir_env_init(int no_huge, int mem_mb) {
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
	weir_thread = spdk_thread_create("weir-spdk", NULL);
	if (weir_thread == NULL) {
		return -ENOMEM;
	}
	spdk_set_thread(weir_thread);
	return 0;
}

static int weir_poll(void) { return spdk_thread_poll(weir_thread, 0, 0); }

static void weir_init_done(int rc, void *arg) { weir_done(arg, rc); }

static void weir_load_config(void *json, size_t len, weir_op *op) {
	spdk_subsystem_load_config(json, (ssize_t)len, weir_init_done, op, true);
}

// As spdk_app_start does: the configuration's startup-time RPCs, then the
// subsystems' initialisation, then its runtime RPCs (bdev creation).
static void weir_subsystem_init(weir_op *op) { spdk_subsystem_init(weir_init_done, op); }
static void weir_rpc_runtime(void) { spdk_rpc_set_state(SPDK_RPC_RUNTIME); }

static void weir_bdev_event(enum spdk_bdev_event_type type, struct spdk_bdev *bdev, void *ctx) {}

static int weir_bs_dev(const char *name, struct spdk_bs_dev **dev) {
	return spdk_bdev_create_bs_dev_ext(name, weir_bdev_event, NULL, dev);
}

static void weir_bs_load(struct spdk_bs_dev *dev, int init, uint64_t cluster_sz, weir_op *op) {
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

static void weir_bs_unload(struct spdk_blob_store *bs, weir_op *op) { spdk_bs_unload(bs, weir_done, op); }
static void weir_create(struct spdk_blob_store *bs, weir_op *op) {
	struct spdk_blob_opts opts;
	spdk_blob_opts_init(&opts, sizeof(opts));
	opts.thin_provision = true;
	// Freed clusters (shrink, delete) are zeroed: a thin blob's newly
	// allocated cluster is not, so this keeps "free clusters read as
	// zeros", which holes and grows rely on.
	opts.clear_method = BLOB_CLEAR_WITH_WRITE_ZEROES;
	spdk_bs_create_blob_ext(bs, &opts, weir_done_id, op);
}
static void weir_open(struct spdk_blob_store *bs, uint64_t id, weir_op *op) { spdk_bs_open_blob(bs, id, weir_done_blob, op); }
static void weir_close(struct spdk_blob *b, weir_op *op) { spdk_blob_close(b, weir_done, op); }
static void weir_delete(struct spdk_blob_store *bs, uint64_t id, weir_op *op) { spdk_bs_delete_blob(bs, id, weir_done, op); }
static void weir_resize(struct spdk_blob *b, uint64_t clusters, weir_op *op) { spdk_blob_resize(b, clusters, weir_done, op); }
static void weir_sync_md(struct spdk_blob *b, weir_op *op) { spdk_blob_sync_md(b, weir_done, op); }
static void weir_iter_first(struct spdk_blob_store *bs, weir_op *op) { spdk_bs_iter_first(bs, weir_done_blob, op); }
static void weir_iter_next(struct spdk_blob_store *bs, struct spdk_blob *b, weir_op *op) { spdk_bs_iter_next(bs, b, weir_done_blob, op); }
static void weir_read(struct spdk_blob *b, struct spdk_io_channel *ch, void *buf, uint64_t off, uint64_t n, weir_op *op) {
	spdk_blob_io_read(b, ch, buf, off, n, weir_done, op);
}
static void weir_write(struct spdk_blob *b, struct spdk_io_channel *ch, void *buf, uint64_t off, uint64_t n, weir_op *op) {
	spdk_blob_io_write(b, ch, buf, off, n, weir_done, op);
}

static void weir_write_zeroes(struct spdk_blob *b, struct spdk_io_channel *ch, uint64_t off, uint64_t n, weir_op *op) {
	spdk_blob_io_write_zeroes(b, ch, off, n, weir_done, op);
}

// weir_get_u64 reads an 8-byte xattr; -ENOENT if missing.
static int weir_get_u64(struct spdk_blob *b, const char *name, uint64_t *v) {
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

static int weir_set_u64(struct spdk_blob *b, const char *name, uint64_t v) {
	return spdk_blob_set_xattr(b, name, &v, sizeof(v));
}
*/
import "C"

// Options configure the backend.
type Options struct {
	// ConfigJSON is an SPDK JSON configuration ({"subsystems": [...]})
	// that creates the bdev. It is loaded once per process: SPDK's
	// environment cannot be started twice.
	ConfigJSON []byte
	// Bdev names the bdev that holds the blobstore.
	Bdev string
	// ClusterSize for a new blobstore (0: SPDK's default, 1 MiB).
	ClusterSize uint64
	// NoHuge runs SPDK on ordinary memory, for hosts without huge pages
	// (tests); MemMB sizes its memory.
	NoHuge bool
	MemMB  int
	// Format makes a new, empty blobstore even if the bdev holds one.
	Format bool
}

const bounceSize = 1 << 20

// spdkRuntime is the process's SPDK thread.
type spdkRuntime struct {
	reqs chan func()
}

var rt struct {
	once sync.Once
	r    *spdkRuntime
	err  error
}

// start brings SPDK up once per process.
func start(opts Options) (*spdkRuntime, error) {
	rt.once.Do(func() {
		r := &spdkRuntime{reqs: make(chan func(), 256)}
		ready := make(chan error, 1)
		go r.loop(opts, ready)
		if err := <-ready; err != nil {
			rt.err = err
			return
		}
		rt.r = r
	})
	return rt.r, rt.err
}

// loop owns the SPDK thread: it runs submitted functions and polls.
func (r *spdkRuntime) loop(opts Options, ready chan<- error) {
	runtime.LockOSThread()
	noHuge := C.int(0)
	if opts.NoHuge {
		noHuge = 1
	}
	if rc := C.weir_env_init(noHuge, C.int(opts.MemMB)); rc != 0 {
		ready <- fmt.Errorf("spdk: start the environment: %w", syscall.Errno(-rc))
		return
	}
	json := C.CBytes(opts.ConfigJSON) // kept until the loads complete
	n := C.size_t(len(opts.ConfigJSON))
	_, _, _, err := r.do(func(op *C.weir_op) { C.weir_load_config(json, n, op) })
	if err == nil {
		_, _, _, err = r.do(func(op *C.weir_op) { C.weir_subsystem_init(op) })
	}
	if err == nil {
		C.weir_rpc_runtime()
		_, _, _, err = r.do(func(op *C.weir_op) { C.weir_load_config(json, n, op) })
	}
	C.free(json)
	if err != nil {
		ready <- fmt.Errorf("spdk: load the JSON configuration: %w", err)
		return
	}
	ready <- nil
	// Poll while there is work. After idleSleep without any, sleep on the
	// request channel, waking at least every millisecond for SPDK's timed
	// pollers, so that an idle backend does not burn a core. (Waking this
	// locked OS thread costs tens of microseconds here, so the spin covers
	// the gaps between the requests of a busy caller.)
	idle := 0
	var idleFrom time.Time
	tick := time.NewTimer(time.Millisecond)
	for {
		select {
		case f := <-r.reqs:
			f()
			idle = 0
			continue
		default:
		}
		if C.weir_poll() != 0 {
			idle = 0
			continue
		}
		if idle++; idle == 1 {
			idleFrom = time.Now()
		}
		if idle%256 != 0 || time.Since(idleFrom) < idleSleep {
			continue
		}
		tick.Reset(time.Millisecond)
		select {
		case f := <-r.reqs:
			f()
			idle = 0
		case <-tick.C:
		}
	}
}

// idleSleep is how long the SPDK thread polls without work before it
// sleeps.
const idleSleep = 500 * time.Microsecond

// run executes f on the SPDK thread and waits for it: spinning first (a
// parked goroutine's thread takes tens of microseconds to wake on a small
// VM, longer than most SPDK requests), then blocking.
func (r *spdkRuntime) run(f func()) {
	var finished atomic.Bool
	done := make(chan struct{})
	r.reqs <- func() { f(); finished.Store(true); close(done) }
	start := time.Now()
	for i := 1; !finished.Load(); i++ {
		if i%64 == 0 {
			if time.Since(start) > runSpin {
				<-done
				return
			}
			runtime.Gosched()
		}
	}
}

// runSpin bounds how long a caller spins for its SPDK request.
const runSpin = 200 * time.Microsecond

// wait polls the SPDK thread until op completes; on the SPDK thread only.
func (r *spdkRuntime) wait(op *C.weir_op) error {
	for op.done == 0 {
		C.weir_poll()
	}
	if op.rc != 0 {
		return syscall.Errno(-op.rc)
	}
	return nil
}

func newOp() *C.weir_op {
	return (*C.weir_op)(C.calloc(1, C.size_t(unsafe.Sizeof(C.weir_op{}))))
}

func freeOp(op *C.weir_op) { C.free(unsafe.Pointer(op)) }

// do runs one asynchronous SPDK call started by start on the SPDK thread.
func (r *spdkRuntime) do(start func(op *C.weir_op)) (id uint64, bs *C.struct_spdk_blob_store, blob *C.struct_spdk_blob, err error) {
	op := newOp()
	defer freeOp(op)
	start(op)
	err = r.wait(op)
	return uint64(op.id), op.bs, op.blob, err
}

// Backend is a blobstore on one bdev.
type Backend struct {
	r       *spdkRuntime
	bs      *C.struct_spdk_blob_store
	ch      *C.struct_spdk_io_channel
	ioUnit  int64
	cluster int64
	bounce  []byte // DMA-able; used on the SPDK thread only
	edge    []byte // DMA-able, one io unit, for edge read-modify-write

	mu     sync.Mutex
	ids    map[backend.BlobID]C.spdk_blob_id // protected by mu
	open   map[backend.BlobID]*blobState     // protected by mu
	closed bool                              // protected by mu
	gone   atomic.Bool                       // closed, for handles

	bounceBytes atomic.Uint64 // payload bytes copied through the bounce buffer
	edgeReads   atomic.Uint64 // partial io units read for read-modify-write
}

var _ backend.Reporter = (*Backend)(nil)

// Counters reports the backend's counters. Every payload byte is bounced
// in this version (no registered arenas yet), which bounce_bytes shows.
func (be *Backend) Counters() map[string]uint64 {
	return map[string]uint64{"spdk_bounce_bytes": be.bounceBytes.Load(), "spdk_edge_reads": be.edgeReads.Load()}
}

var _ backend.Backend = (*Backend)(nil)

var (
	nameID   = C.CString("weir.id")
	nameSize = C.CString("weir.size")
)

// New loads the blobstore on opts.Bdev, or creates it if the bdev holds
// none, and indexes its blobs.
func New(opts Options) (*Backend, error) {
	r, err := start(opts)
	if err != nil {
		return nil, err
	}
	be := &Backend{r: r, ids: map[backend.BlobID]C.spdk_blob_id{}, open: map[backend.BlobID]*blobState{}}
	r.run(func() { err = be.load(opts) })
	if err != nil {
		return nil, err
	}
	return be, nil
}

// load runs on the SPDK thread.
func (be *Backend) load(opts Options) error {
	name := C.CString(opts.Bdev)
	defer C.free(unsafe.Pointer(name))
	var dev *C.struct_spdk_bs_dev
	if rc := C.weir_bs_dev(name, &dev); rc != 0 {
		return fmt.Errorf("spdk: open bdev %q: %w", opts.Bdev, syscall.Errno(-rc))
	}
	var bs *C.struct_spdk_blob_store
	err := errors.New("format requested")
	if !opts.Format {
		_, bs, _, err = be.r.do(func(op *C.weir_op) { C.weir_bs_load(dev, 0, 0, op) })
	}
	if err != nil && opts.Format {
		_, bs, _, err = be.r.do(func(op *C.weir_op) { C.weir_bs_load(dev, 1, C.uint64_t(opts.ClusterSize), op) })
		if err != nil {
			return fmt.Errorf("spdk: create a blobstore on %q: %w", opts.Bdev, err)
		}
	} else if err != nil {
		// No blobstore on the bdev yet (or another kind): make one. The
		// failed load released dev, so open it again.
		if rc := C.weir_bs_dev(name, &dev); rc != 0 {
			return fmt.Errorf("spdk: reopen bdev %q: %w", opts.Bdev, syscall.Errno(-rc))
		}
		_, bs, _, err = be.r.do(func(op *C.weir_op) { C.weir_bs_load(dev, 1, C.uint64_t(opts.ClusterSize), op) })
		if err != nil {
			return fmt.Errorf("spdk: create a blobstore on %q: %w", opts.Bdev, err)
		}
	}
	be.bs = bs
	be.ch = C.spdk_bs_alloc_io_channel(bs)
	if be.ch == nil {
		return errors.New("spdk: no I/O channel")
	}
	be.ioUnit = int64(C.spdk_bs_get_io_unit_size(bs))
	be.cluster = int64(C.spdk_bs_get_cluster_size(bs))
	buf := C.spdk_dma_zmalloc(bounceSize, 4096, nil)
	if buf == nil {
		return errors.New("spdk: no DMA memory for the bounce buffer")
	}
	be.bounce = unsafe.Slice((*byte)(buf), bounceSize)
	ebuf := C.spdk_dma_zmalloc(C.size_t(be.ioUnit), 4096, nil)
	if ebuf == nil {
		return errors.New("spdk: no DMA memory for the edge buffer")
	}
	be.edge = unsafe.Slice((*byte)(ebuf), be.ioUnit)
	// Index the blobs: iter_next closes the blob it is given.
	_, _, blob, err := be.r.do(func(op *C.weir_op) { C.weir_iter_first(bs, op) })
	for err == nil {
		var v C.uint64_t
		if C.weir_get_u64(blob, nameID, &v) == 0 {
			be.ids[backend.BlobID(v)] = C.spdk_blob_get_id(blob)
		}
		prev := blob
		_, _, blob, err = be.r.do(func(op *C.weir_op) { C.weir_iter_next(bs, prev, op) })
	}
	if !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("spdk: list blobs: %w", err)
	}
	return nil
}

func errorf(op string, id backend.BlobID, err error) error {
	return fmt.Errorf("backend spdk: %s blob %d: %w", op, id, err)
}

// Name is "spdk".
func (be *Backend) Name() string { return "spdk" }

// Create makes an empty, thin-provisioned blob tagged with id.
func (be *Backend) Create(id backend.BlobID) error {
	if err := backend.CheckID(id); err != nil {
		return errorf("create", id, err)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return errorf("create", id, syscall.EBADF)
	}
	if _, ok := be.ids[id]; ok {
		return errorf("create", id, syscall.EEXIST)
	}
	var err error
	be.r.run(func() {
		var sid uint64
		var blob *C.struct_spdk_blob
		if sid, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_create(be.bs, op) }); err != nil {
			return
		}
		if _, _, blob, err = be.r.do(func(op *C.weir_op) { C.weir_open(be.bs, C.uint64_t(sid), op) }); err != nil {
			return
		}
		if rc := C.weir_set_u64(blob, nameID, C.uint64_t(id)); rc != 0 {
			err = syscall.Errno(-rc)
		} else if rc := C.weir_set_u64(blob, nameSize, 0); rc != 0 {
			err = syscall.Errno(-rc)
		} else {
			_, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_sync_md(blob, op) })
		}
		_, _, _, cerr := be.r.do(func(op *C.weir_op) { C.weir_close(blob, op) })
		if err == nil {
			err = cerr
		}
		if err == nil {
			be.ids[id] = C.spdk_blob_id(sid)
		}
	})
	if err != nil {
		return errorf("create", id, err)
	}
	return nil
}

// Open opens blob id; handles of one blob share its state.
func (be *Backend) Open(id backend.BlobID) (backend.Blob, error) {
	if err := backend.CheckID(id); err != nil {
		return nil, errorf("open", id, err)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return nil, errorf("open", id, syscall.EBADF)
	}
	if s := be.open[id]; s != nil {
		s.refs++
		return &handle{be: be, s: s}, nil
	}
	sid, ok := be.ids[id]
	if !ok {
		return nil, errorf("open", id, syscall.ENOENT)
	}
	var err error
	var blob *C.struct_spdk_blob
	var size C.uint64_t
	be.r.run(func() {
		if _, _, blob, err = be.r.do(func(op *C.weir_op) { C.weir_open(be.bs, C.uint64_t(sid), op) }); err != nil {
			return
		}
		if rc := C.weir_get_u64(blob, nameSize, &size); rc != 0 {
			err = syscall.Errno(-rc)
		}
	})
	if err != nil {
		return nil, errorf("open", id, err)
	}
	s := &blobState{id: id, sid: sid, blob: blob, refs: 1}
	s.size.Store(int64(size))
	be.open[id] = s
	return &handle{be: be, s: s}, nil
}

// Delete removes blob id; EBUSY while it is open.
func (be *Backend) Delete(id backend.BlobID) error {
	if err := backend.CheckID(id); err != nil {
		return errorf("delete", id, err)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return errorf("delete", id, syscall.EBADF)
	}
	if be.open[id] != nil {
		return errorf("delete", id, syscall.EBUSY)
	}
	sid, ok := be.ids[id]
	if !ok {
		return errorf("delete", id, syscall.ENOENT)
	}
	var err error
	be.r.run(func() {
		_, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_delete(be.bs, C.uint64_t(sid), op) })
	})
	if err != nil {
		return errorf("delete", id, err)
	}
	delete(be.ids, id)
	return nil
}

// List returns every blob, ascending.
func (be *Backend) List() ([]backend.BlobID, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return nil, fmt.Errorf("backend spdk: list: %w", syscall.EBADF)
	}
	ids := make([]backend.BlobID, 0, len(be.ids))
	for id := range be.ids {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Sync: creates and deletes are durable when they return (sync_md).
func (be *Backend) Sync() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return fmt.Errorf("backend spdk: sync: %w", syscall.EBADF)
	}
	return nil
}

// Close syncs and closes open blobs and unloads the blobstore (a clean
// shutdown: the next load needs no recovery).
func (be *Backend) Close() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return fmt.Errorf("backend spdk: close: %w", syscall.EBADF)
	}
	be.closed = true
	be.gone.Store(true)
	var errs []error
	be.r.run(func() {
		for _, s := range be.open {
			if err := be.syncMDLocked(s); err != nil {
				errs = append(errs, err)
			}
			if _, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_close(s.blob, op) }); err != nil {
				errs = append(errs, err)
			}
		}
		C.spdk_bs_free_io_channel(be.ch)
		C.spdk_dma_free(unsafe.Pointer(unsafe.SliceData(be.bounce)))
		C.spdk_dma_free(unsafe.Pointer(unsafe.SliceData(be.edge)))
		if _, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_bs_unload(be.bs, op) }); err != nil {
			errs = append(errs, fmt.Errorf("unload blobstore: %w", err))
		}
	})
	return errors.Join(errs...)
}

// blobState is one open blob; its fields other than size are used on the
// SPDK thread (or under Backend.mu for refs).
type blobState struct {
	id        backend.BlobID
	sid       C.spdk_blob_id
	blob      *C.struct_spdk_blob
	size      atomic.Int64
	sizeDirty bool  // weir.size differs from what sync_md last wrote
	syncErr   error // sticky
	refs      int   // protected by Backend.mu
}

// syncMDLocked writes weir.size and the blob's metadata if they changed.
// On the SPDK thread.
func (be *Backend) syncMDLocked(s *blobState) error {
	if s.syncErr != nil {
		return s.syncErr
	}
	if !s.sizeDirty {
		return nil
	}
	if rc := C.weir_set_u64(s.blob, nameSize, C.uint64_t(s.size.Load())); rc != 0 {
		s.syncErr = errorf("sync", s.id, syscall.Errno(-rc))
		return s.syncErr
	}
	if _, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_sync_md(s.blob, op) }); err != nil {
		s.syncErr = errorf("sync", s.id, err)
		return s.syncErr
	}
	s.sizeDirty = false
	return nil
}

type handle struct {
	be     *Backend
	s      *blobState
	closed atomic.Bool
}

func (h *handle) ID() backend.BlobID { return h.s.id }
func (h *handle) Size() int64        { return h.s.size.Load() }

func (h *handle) usable(op string) error {
	if h.closed.Load() || h.be.gone.Load() {
		return errorf(op, h.s.id, syscall.EBADF)
	}
	return nil
}

func alignDown(v, a int64) int64 { return v - v%a }
func alignUp(v, a int64) int64   { return alignDown(v+a-1, a) }

// io moves whole io units [pos, pos+len(buf)) between the device and buf,
// which must be DMA-able memory (the bounce or edge buffer). On the SPDK
// thread.
func (be *Backend) io(write bool, s *blobState, pos int64, buf []byte) error {
	p := unsafe.Pointer(unsafe.SliceData(buf))
	off, cnt := C.uint64_t(pos/be.ioUnit), C.uint64_t(int64(len(buf))/be.ioUnit)
	_, _, _, err := be.r.do(func(op *C.weir_op) {
		if write {
			C.weir_write(s.blob, be.ch, p, off, cnt, op)
		} else {
			C.weir_read(s.blob, be.ch, p, off, cnt, op)
		}
	})
	return err
}

// loadUnit fills dst (one io unit of the bounce buffer) with the unit at
// pos: read through the edge buffer if it holds data (below size), zeros
// otherwise. On the SPDK thread.
func (be *Backend) loadUnit(s *blobState, pos, size int64, dst []byte) error {
	if pos >= size {
		clear(dst)
		return nil
	}
	if err := be.io(false, s, pos, be.edge); err != nil {
		return err
	}
	be.edgeReads.Add(1)
	copy(dst, be.edge)
	return nil
}

func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	if err := h.usable("read"); err != nil {
		return 0, err
	}
	if err := backend.CheckRange(off, len(p)); err != nil {
		return 0, errorf("read", h.s.id, err)
	}
	if len(p) == 0 {
		return 0, nil
	}
	be, s := h.be, h.s
	size := s.size.Load()
	if off >= size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-off))
	var err error
	be.r.run(func() {
		end := off + int64(n)
		for pos := alignDown(off, be.ioUnit); pos < end && err == nil; {
			chunk := min(alignUp(end, be.ioUnit)-pos, bounceSize)
			if err = be.io(false, s, pos, be.bounce[:chunk]); err != nil {
				break
			}
			from, to := max(off, pos), min(end, pos+chunk)
			copy(p[from-off:to-off], be.bounce[from-pos:to-pos])
			be.bounceBytes.Add(uint64(to - from))
			pos += chunk
		}
	})
	if err != nil {
		return 0, errorf("read", s.id, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// ensure grows the blob's clusters to hold end bytes. On the SPDK thread.
func (be *Backend) ensure(s *blobState, end int64) error {
	need := uint64(alignUp(end, be.cluster) / be.cluster)
	if uint64(C.spdk_blob_get_num_clusters(s.blob)) >= need {
		return nil
	}
	_, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_resize(s.blob, C.uint64_t(need), op) })
	return err
}

func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	if err := h.usable("write"); err != nil {
		return 0, err
	}
	if err := backend.CheckRange(off, len(p)); err != nil {
		return 0, errorf("write", h.s.id, err)
	}
	if len(p) == 0 {
		return 0, nil
	}
	be, s := h.be, h.s
	end := off + int64(len(p))
	var err error
	be.r.run(func() {
		if err = be.ensure(s, end); err != nil {
			return
		}
		size := s.size.Load()
		u := be.ioUnit
		for pos := alignDown(off, u); pos < end && err == nil; {
			chunk := min(alignUp(end, u)-pos, bounceSize)
			from, to := max(off, pos), min(end, pos+chunk)
			// Read-modify-write only the partial first and last units
			// (zeros where they lie past the size), never whole units.
			if from > pos {
				if err = be.loadUnit(s, pos, size, be.bounce[:u]); err != nil {
					break
				}
			}
			if last := pos + chunk - u; to < pos+chunk && !(last == pos && from > pos) {
				if err = be.loadUnit(s, last, size, be.bounce[last-pos:last-pos+u]); err != nil {
					break
				}
			}
			copy(be.bounce[from-pos:to-pos], p[from-off:to-off])
			be.bounceBytes.Add(uint64(to - from))
			if err = be.io(true, s, pos, be.bounce[:chunk]); err != nil {
				break
			}
			pos += chunk
		}
		if err == nil && end > size {
			s.size.Store(end)
			s.sizeDirty = true
		}
	})
	if err != nil {
		return 0, errorf("write", s.id, err)
	}
	return len(p), nil
}

func (h *handle) Truncate(size int64) error {
	if err := h.usable("truncate"); err != nil {
		return err
	}
	if err := backend.CheckSize(size); err != nil {
		return errorf("truncate", h.s.id, err)
	}
	be, s := h.be, h.s
	var err error
	be.r.run(func() {
		old := s.size.Load()
		if size < old {
			// Zero the tail of the last unit so a later grow reads zeros,
			// then give back the clusters past the end.
			if tail := size % be.ioUnit; tail != 0 {
				last := size - tail
				if err = be.io(false, s, last, be.edge); err != nil {
					return
				}
				clear(be.edge[tail:])
				if err = be.io(true, s, last, be.edge); err != nil {
					return
				}
			}
			// Whole units between the new and the old end that stay in
			// kept clusters must read as zeros after a later grow.
			need := uint64(alignUp(size, be.cluster) / be.cluster)
			from := alignUp(size, be.ioUnit)
			to := min(alignUp(old, be.ioUnit), int64(need)*be.cluster)
			if to > from {
				f, n := C.uint64_t(from/be.ioUnit), C.uint64_t((to-from)/be.ioUnit)
				if _, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_write_zeroes(s.blob, be.ch, f, n, op) }); err != nil {
					return
				}
			}
			_, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_resize(s.blob, C.uint64_t(need), op) })
			if err != nil {
				return
			}
			// A shrink releases (and clears) its clusters only when the
			// metadata is persisted; until then a grow would map the old
			// clusters back, stale data and all. Persist now.
			s.size.Store(size)
			s.sizeDirty = true
			err = be.syncMDLocked(s)
			return
		} else if err = be.ensure(s, size); err != nil {
			return
		}
		s.size.Store(size)
		s.sizeDirty = s.sizeDirty || size != old
	})
	if err != nil {
		return errorf("truncate", s.id, err)
	}
	return nil
}

// Sync makes the blob's size durable; its data already is once each write
// completes (blobstore writes are not cached).
func (h *handle) Sync() error {
	if err := h.usable("sync"); err != nil {
		return err
	}
	var err error
	h.be.r.run(func() { err = h.be.syncMDLocked(h.s) })
	return err
}

func (h *handle) Close() error {
	if !h.closed.CompareAndSwap(false, true) {
		return errorf("close", h.s.id, syscall.EBADF)
	}
	be, s := h.be, h.s
	be.mu.Lock()
	defer be.mu.Unlock()
	s.refs--
	if s.refs > 0 || be.closed {
		return nil
	}
	delete(be.open, s.id)
	var err error
	be.r.run(func() {
		err = be.syncMDLocked(s)
		if _, _, _, cerr := be.r.do(func(op *C.weir_op) { C.weir_close(s.blob, op) }); err == nil {
			err = cerr
		}
	})
	return err
}
