//go:build spdk

// Package spdk is the SPDK Blobstore backend of the IO service: one blob per
// weir blob on a blobstore over an SPDK bdev (NVMe in production; malloc or
// aio for tests), built only with the spdk build tag against an installed
// SPDK (pkg-config). docs/spdk-backend.md is the design.
//
// Threads: blobstore metadata operations (load, create, open, resize,
// sync_md, delete, close, unload) run on one SPDK thread, the metadata
// thread, owned by one locked OS thread for the life of the process. Reads
// and writes run on I/O workers (worker.go), each a locked OS thread that
// owns an SPDK thread and a blobstore I/O channel and polls it. Payloads
// move straight between the device and memory registered with
// RegisterMem (ring arenas on huge pages) where they are aligned, and
// through DMA bounce buffers otherwise (mem.go).
//
// A weir blob is an SPDK blob with two xattrs: "weir.id" (the 8-byte
// BlobID) and "weir.size" (the byte size; the blob's clusters are only
// capacity, thin provisioned, so holes read as zeros).
package spdk

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/internal/spdkconf"
	"github.com/weir-storage/weir/services/io/backend"
)

/*
#cgo pkg-config: spdk_blob_bdev spdk_blob spdk_bdev spdk_env_dpdk spdk_init spdk_thread spdk_event_bdev spdk_bdev_malloc spdk_bdev_aio spdk_bdev_error spdk_bdev_nvme spdk_syslibs
#cgo LDFLAGS: -Wl,--no-as-needed
#include "weir_spdk.h"
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
	// Format makes a new, empty blobstore even if the bdev holds one or
	// holds something else: it erases the device. Without it, New makes a
	// blobstore only on a provably empty bdev (its first and last MiB read
	// as zeros), and refuses every other bdev that holds no weir
	// blobstore, and any bdev it cannot read, changing nothing on it.
	Format bool
	// ReadOnly loads the blobstore without writing to the device (weir
	// check): the recovery of a blobstore that was not shut down cleanly
	// stays in memory (the filter device holds its writes and never
	// writes them), every later write is refused before it reaches the
	// bdev, and every change through the backend fails with EROFS.
	ReadOnly bool
	// LockFile, if set, is flock(2)ed exclusively from New to Close, so
	// that two processes of one data directory (an IO service, weir check,
	// weir format) never load the blobstore at once: the second gets
	// EBUSY. The file under an aio bdev is flocked too (lockAll), which
	// keeps processes of different data directories off one aio file;
	// SPDK itself keeps two processes off one PCIe device.
	LockFile string
	// fault makes the device fail I/Os of the blobstore (tests).
	fault loadFault
	// Workers is the number of I/O workers, each a polling OS thread with
	// its own SPDK thread and I/O channel (0: 1). One worker keeps many
	// I/Os in flight; more spread them over cores.
	Workers int
	// CGOCallbacks completes each I/O through a cgo callback into Go
	// instead of the workers' C completion queues. For the measurement in
	// docs/spdk-backend.md only.
	CGOCallbacks bool
}

// spdkRuntime is the process's SPDK environment and its metadata thread.
type spdkRuntime struct {
	md   *C.struct_spdk_thread
	reqs chan func()
	// kick wakes a sleeping metadata thread: a worker sends it when one of
	// its writes needs a cluster allocated (a message to this thread).
	kick chan struct{}
	// mdWanted counts worker I/Os in flight that need the metadata thread;
	// it does not sleep while any are.
	mdWanted atomic.Int64
	// workers are every backend's I/O workers, kicked while a metadata
	// operation waits: resize and delete use spdk_for_each_channel, a
	// barrier that needs every worker's thread polled.
	workers atomic.Pointer[[]*worker]
	wmu     sync.Mutex // serialises updates of workers
	// halted is set by Halt, on the metadata thread, which then never
	// polls again.
	halted atomic.Bool
}

var rt struct {
	once sync.Once
	r    *spdkRuntime
	err  error
	live atomic.Pointer[spdkRuntime] // r once it started; for Halt
	// env is the environment the process started SPDK with: a later New
	// must ask for the same one (SPDK cannot be configured twice).
	env envKey
}

// envKey is what of Options configures SPDK's environment, once per
// process.
type envKey struct {
	config string
	noHuge bool
	memMB  int
}

func envOf(o Options) envKey {
	return envKey{config: string(o.ConfigJSON), noHuge: o.NoHuge, memMB: o.MemMB}
}

// Halt stops SPDK for the rest of the process: the metadata thread stops
// polling for good and New fails from then on. Call it after every Backend
// is closed, right before the process exits. C exit handlers may run at
// exit (a build with the race detector runs them: __tsan_fini calls
// exit(3)), and SPDK's environment destructor then tears DPDK's memory
// down; a thread still polling SPDK faults on it (seen about once in 30
// `go test -race` runs: spdk_ring_dequeue on the metadata thread's message
// ring). Halt does nothing if SPDK never started; it fails while a
// Backend is open.
func Halt() error {
	r := rt.live.Load()
	if r == nil || r.halted.Load() {
		return nil
	}
	if ws := r.workers.Load(); ws != nil && len(*ws) > 0 {
		return fmt.Errorf("spdk: halt: %d I/O workers of open backends still run", len(*ws))
	}
	r.run(func() { r.halted.Store(true) })
	return nil
}

// start brings SPDK up once per process.
func start(opts Options) (*spdkRuntime, error) {
	rt.once.Do(func() {
		rt.env = envOf(opts)
		r := &spdkRuntime{reqs: make(chan func(), 256), kick: make(chan struct{}, 1)}
		addProcs(1)
		r.workers.Store(&[]*worker{})
		ready := make(chan error, 1)
		go r.loop(opts, ready)
		if err := <-ready; err != nil {
			rt.err = err
			return
		}
		rt.r = r
		rt.live.Store(r)
	})
	if rt.err == nil && envOf(opts) != rt.env {
		return nil, fmt.Errorf("spdk: this process started SPDK with another configuration (JSON config, no-huge or memory size): "+
			"SPDK's environment is set up once per process, so every backend of a process must use the same one, "+
			"with its bdevs all in that JSON config: %w", syscall.EINVAL)
	}
	return rt.r, rt.err
}

// loop owns the metadata thread: it runs submitted functions and polls.
func (r *spdkRuntime) loop(opts Options, ready chan<- error) {
	runtime.LockOSThread()
	noHuge := C.int(0)
	if opts.NoHuge {
		noHuge = 1
	}
	// PCI only for a config that attaches a PCIe NVMe controller: otherwise
	// no device is touched, and no IOMMU or uio/vfio binding is needed.
	pci := C.int(0)
	if spdkconf.UsesPCI(opts.ConfigJSON) {
		pci = 1
	}
	if !opts.NoHuge {
		if err := hugePagesProblem(); err != nil {
			ready <- err
			return
		}
	}
	if rc := C.weir_env_init(noHuge, C.int(opts.MemMB), pci, &r.md); rc != 0 {
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
	// request and kick channels, waking at least every millisecond for
	// SPDK's timed pollers, so that an idle backend does not burn a core.
	// (Waking a locked OS thread costs tens of microseconds on a small VM,
	// so the spin covers the gaps between the requests of a busy caller.)
	var idle idler
	for {
		if r.halted.Load() {
			select {} // Halt: never touch SPDK again; the process is exiting
		}
		select {
		case f := <-r.reqs:
			f()
			idle.reset()
			continue
		default:
		}
		if !idle.sleepy(C.spdk_thread_poll(r.md, 0, 0) != 0 || r.mdWanted.Load() > 0) {
			continue
		}
		select {
		case f := <-r.reqs:
			f()
			idle.reset()
		case <-r.kick:
			idle.reset()
		case <-idle.tick():
		}
	}
}

// idler decides when a polling thread sleeps: after idleSleep of polls
// that found no work. Its sleeps last at most a millisecond, for SPDK's
// timed pollers.
type idler struct {
	n     int
	from  time.Time
	timer *time.Timer
}

func (i *idler) reset() { i.n = 0 }

// sleepy records one poll (busy: it found work) and reports whether the
// thread should sleep now.
func (i *idler) sleepy(busy bool) bool {
	if busy {
		i.n = 0
		return false
	}
	if i.n++; i.n == 1 {
		i.from = time.Now()
	}
	return i.n%256 == 0 && time.Since(i.from) >= idleSleep
}

// tick returns a channel that fires in a millisecond.
func (i *idler) tick() <-chan time.Time {
	if i.timer == nil {
		i.timer = time.NewTimer(time.Millisecond)
	} else {
		i.timer.Reset(time.Millisecond)
	}
	return i.timer.C
}

// addProcs changes GOMAXPROCS by n. Each polling thread (the metadata
// thread and every worker) is a locked OS thread that runs Go code between
// its SPDK polls, so it holds a P while it polls; one more P per poller
// keeps the callers' goroutines from waiting for one (on a 2-CPU host,
// without this, two pollers left the callers to sysmon's preemption, about
// 2 ms per I/O). How pollers and callers share the CPUs is then the
// kernel's business, as it is for SPDK's own reactors.
func addProcs(n int) {
	procMu.Lock()
	defer procMu.Unlock()
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + n)
}

var procMu sync.Mutex

// idleSleep is how long a polling thread (metadata or worker) goes
// without work before it sleeps.
const idleSleep = 500 * time.Microsecond

// wantMD tells the metadata thread that a worker I/O needs it (until
// doneMD), waking it if it sleeps.
func (r *spdkRuntime) wantMD() {
	if r.mdWanted.Add(1) == 1 {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

func (r *spdkRuntime) doneMD() { r.mdWanted.Add(-1) }

// kickWorkers wakes every sleeping worker so that it polls its thread.
func (r *spdkRuntime) kickWorkers() {
	for _, w := range *r.workers.Load() {
		w.wake()
	}
}

func (r *spdkRuntime) addWorkers(ws []*worker) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	all := append(slices.Clone(*r.workers.Load()), ws...)
	r.workers.Store(&all)
}

func (r *spdkRuntime) removeWorkers(ws []*worker) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	all := slices.DeleteFunc(slices.Clone(*r.workers.Load()), func(w *worker) bool { return slices.Contains(ws, w) })
	r.workers.Store(&all)
}

// run executes f on the metadata thread and waits for it: spinning first
// (a parked goroutine's thread takes tens of microseconds to wake on a
// small VM, longer than most SPDK requests), then blocking.
func (r *spdkRuntime) run(f func()) {
	var finished atomic.Bool
	done := make(chan struct{})
	r.reqs <- func() { f(); finished.Store(true); close(done) }
	spinWait(finished.Load, done)
}

// spinWait spins until ready() for up to runSpin, then blocks on done
// (which is closed or sent to after ready() turns true) until ready().
func spinWait(ready func() bool, done <-chan struct{}) {
	start := time.Now()
	for i := 1; !ready(); i++ {
		if i%64 == 0 {
			if time.Since(start) > runSpin {
				for !ready() {
					<-done
				}
				return
			}
			runtime.Gosched()
		}
	}
}

// runSpin bounds how long a caller spins for its SPDK request.
const runSpin = 200 * time.Microsecond

// wait polls the metadata thread until op completes; on the metadata
// thread only. While it waits it keeps the workers awake: the op may be a
// barrier (spdk_for_each_channel) that needs each of their threads.
func (r *spdkRuntime) wait(op *C.weir_op) error {
	for i := 1; op.done == 0; i++ {
		if C.spdk_thread_poll(r.md, 0, 0) == 0 && i%64 == 0 {
			r.kickWorkers()
		}
	}
	if op.rc != 0 {
		return syscall.Errno(-op.rc)
	}
	return nil
}

// do runs one asynchronous SPDK call started by start on the metadata
// thread.
func (r *spdkRuntime) do(start func(op *C.weir_op)) (id uint64, bs *C.struct_spdk_blob_store, blob *C.struct_spdk_blob, err error) {
	op := newOp()
	defer freeOp(op)
	start(op)
	err = r.wait(op)
	return uint64(op.id), op.bs, op.blob, err
}

// Backend is a blobstore on one bdev.
type Backend struct {
	r    *spdkRuntime
	opts Options
	bs   *C.struct_spdk_blob_store
	ch   *C.struct_spdk_io_channel // the metadata thread's, for Truncate's I/O
	// flushDesc is weir's own descriptor of the bdev, and flushCh its
	// channel on the metadata thread: nil when the bdev has nothing to
	// flush (no flush support, or no volatile write cache: NVMe drives
	// without one). Sync flushes through them.
	flushDesc *C.struct_spdk_bdev_desc
	flushCh   *C.struct_spdk_io_channel
	flushes   atomic.Uint64
	ioUnit    int64
	cluster   int64
	edge      []byte // DMA-able, one io unit, for Truncate on the metadata thread

	workers []*worker
	bufs    bouncePool
	regs    memRegistry

	// life is held shared by every I/O and exclusively by Close, so that
	// the workers stop only once no I/O is in flight.
	life sync.RWMutex

	mu     sync.Mutex
	ids    map[backend.BlobID]C.spdk_blob_id // protected by mu
	open   map[backend.BlobID]*blobState     // protected by mu
	closed bool                              // protected by mu
	gone   atomic.Bool                       // closed, for handles
	strays []string                          // found at load; immutable after New
	super  C.spdk_blob_id                    // the super blob (identity), 0 if none; protected by mu
	// formatted: New made this blobstore; dev: the filter device the
	// blobstore is loaded on (weir_filter_dev, owned by the blobstore);
	// devState: its state, in C memory that outlives it.
	formatted bool
	locks     []*os.File // Options.LockFile and the bdev's backing file, flocked (lockAll)
	dev       *C.struct_spdk_bs_dev
	devState  *C.int

	bounceBytes atomic.Uint64 // payload bytes copied through bounce buffers
	directBytes atomic.Uint64 // payload bytes moved with no copy (registered memory)
	edgeReads   atomic.Uint64 // partial io units read for read-modify-write
}

var _ backend.Reporter = (*Backend)(nil)

// Counters reports the backend's counters.
func (be *Backend) Counters() map[string]uint64 {
	regions, failures := be.regs.counts()
	return map[string]uint64{
		"spdk_bounce_bytes":       be.bounceBytes.Load(),
		"spdk_direct_bytes":       be.directBytes.Load(),
		"spdk_edge_reads":         be.edgeReads.Load(),
		"spdk_registered_regions": regions,
		"spdk_register_failures":  failures,
		"spdk_workers":            uint64(len(be.workers)),
		"spdk_flushes":            be.flushes.Load(),
	}
}

var _ backend.Backend = (*Backend)(nil)

var _ backend.Auditor = (*Backend)(nil)

// Strays lists the blobs found at load that are not weir blobs.
func (be *Backend) Strays() []string { return slices.Clone(be.strays) }

var (
	nameID   = C.CString("weir.id")
	nameSize = C.CString("weir.size")
)

// New loads the blobstore on opts.Bdev, or creates it if the bdev holds
// none, indexes its blobs and starts the I/O workers.
func New(opts Options) (*Backend, error) {
	// NVMe flushes must reach the device (spdkconf): the config gets
	// enable_flush, or is refused if it turns it off.
	cfg, _, err := spdkconf.WithNVMeFlush(opts.ConfigJSON)
	if err != nil {
		return nil, fmt.Errorf("spdk: %w", err)
	}
	opts.ConfigJSON = cfg
	// The locks come first: a second process must not even attach the
	// devices of the config while another loads the blobstore.
	locks, err := lockAll(opts)
	if err != nil {
		return nil, err
	}
	unlock := func() {
		for _, l := range locks {
			l.Close()
		}
	}
	r, err := start(opts)
	if err == nil && r.halted.Load() {
		err = errors.New("spdk: halted (Halt was called: the process is exiting)")
	}
	if err != nil {
		unlock()
		return nil, err
	}
	be := &Backend{r: r, opts: opts, ids: map[backend.BlobID]C.spdk_blob_id{}, open: map[backend.BlobID]*blobState{}, locks: locks}
	r.run(func() { err = be.load(opts) })
	if err != nil {
		if be.devState != nil {
			freeDevState(be.devState)
		}
		unlock()
		return nil, err
	}
	be.bufs.unit = be.ioUnit
	n := max(opts.Workers, 1)
	for i := range n {
		w, err := startWorker(be, i)
		if err != nil {
			be.stopWorkers()
			be.Close()
			return nil, err
		}
		be.workers = append(be.workers, w)
	}
	r.addWorkers(be.workers)
	return be, nil
}

// load runs on the metadata thread. Every load goes through the filter
// device (weir_filter_dev): what the blobstore writes while loading (the
// recovery of a store not shut down cleanly) is held in memory and written
// only once the whole load, index included, has succeeded; a failed load
// writes nothing, not even at its unload, and a read-only load never
// writes.
func (be *Backend) load(opts Options) (err error) {
	if opts.Format && opts.ReadOnly {
		return errors.New("spdk: a read-only backend cannot format its bdev")
	}
	name := C.CString(opts.Bdev)
	defer freeCString(name)
	be.devState = newDevState()
	setDevState(be.devState, wFailRead, opts.fault.readAt)
	setDevState(be.devState, wFailWrite, opts.fault.writeFrom)
	setDevState(be.devState, wFailWriteAt, opts.fault.writeAt)
	setDevState(be.devState, wFailLandedAt, opts.fault.landedAt)
	var dev *C.struct_spdk_bs_dev
	openDev := func(hold bool) error {
		if rc := C.weir_bs_dev(name, &dev); rc != 0 {
			return fmt.Errorf("spdk: open bdev %q: %w", opts.Bdev, syscall.Errno(-rc))
		}
		if dev = C.weir_filter_wrap(dev, be.devState); dev == nil {
			return fmt.Errorf("spdk: open bdev %q: %w", opts.Bdev, syscall.ENOMEM)
		}
		setDevState(be.devState, wHold, boolInt(hold))
		return nil
	}
	defer func() {
		if err != nil && be.bs != nil {
			if rerr := errors.Join(be.release(true)...); rerr != nil {
				err = fmt.Errorf("%w (and releasing the blobstore: %v)", err, rerr)
			}
		}
	}()
	format := func() (*C.struct_spdk_blob_store, error) {
		if err := openDev(false); err != nil {
			return nil, err
		}
		_, bs, _, err := be.r.do(func(op *C.weir_op) { C.weir_bs_load(dev, 1, C.uint64_t(opts.ClusterSize), op) })
		if err != nil {
			return nil, fmt.Errorf("spdk: create a blobstore on %q: %w", opts.Bdev, err)
		}
		be.formatted = true
		return bs, nil
	}
	var bs *C.struct_spdk_blob_store
	if opts.Format {
		if bs, err = format(); err != nil {
			return err
		}
	} else {
		if err := openDev(true); err != nil {
			return err
		}
		// A failed load releases dev.
		_, bs, _, err = be.r.do(func(op *C.weir_op) { C.weir_bs_load(dev, 0, 0, op) })
		switch {
		case err == nil:
		case errors.Is(err, syscall.EILSEQ) || errors.Is(err, syscall.ENXIO):
			// No weir blobstore: a signature, version or checksum that
			// does not match (EILSEQ), or another program's blobstore
			// (ENXIO). Only an empty device is made one.
			cause := err
			empty, err := be.provablyEmpty(name)
			switch {
			case err != nil:
				return fmt.Errorf("spdk: bdev %q holds no weir blobstore (%v), and reading it to see whether it is empty failed: %w; nothing was changed", opts.Bdev, cause, err)
			case !empty:
				return fmt.Errorf("spdk: bdev %q holds data that is not a weir blobstore (%v): weir makes a blobstore only on an empty device; "+
					"nothing was changed. To erase the device and make a new store, run `weir format`: %w", opts.Bdev, cause, syscall.EEXIST)
			case opts.ReadOnly:
				return fmt.Errorf("spdk: bdev %q is empty: it holds no weir blobstore yet: %w", opts.Bdev, syscall.ENOENT)
			}
			if bs, err = format(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("spdk: load the blobstore on %q: %w; nothing on the device was changed (a failed load is not taken for an empty device: "+
				"check the device, `weir doctor`; `weir format` erases it)", opts.Bdev, err)
		}
	}
	be.dev = dev
	be.bs = bs
	be.ch = C.spdk_bs_alloc_io_channel(bs)
	if be.ch == nil {
		return errors.New("spdk: no I/O channel")
	}
	if !opts.ReadOnly {
		if rc := C.weir_flush_open(name, &be.flushDesc); rc != 0 {
			return fmt.Errorf("spdk: open bdev %q for flushes: %w", opts.Bdev, syscall.Errno(-rc))
		}
		if C.weir_flush_supported(be.flushDesc) != 0 {
			if be.flushCh = C.spdk_bdev_get_io_channel(be.flushDesc); be.flushCh == nil {
				return errors.New("spdk: no bdev channel for flushes")
			}
		}
	}
	be.ioUnit = int64(C.spdk_bs_get_io_unit_size(bs))
	be.cluster = int64(C.spdk_bs_get_cluster_size(bs))
	ebuf := C.spdk_dma_zmalloc(C.size_t(be.ioUnit), 4096, nil)
	if ebuf == nil {
		return errors.New("spdk: no DMA memory for the edge buffer")
	}
	be.edge = dmaSlice(ebuf, be.ioUnit)
	// The super blob holds the store's identity (Identity).
	super, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_get_super(bs, op) })
	switch {
	case err == nil:
		be.super = C.spdk_blob_id(super)
	case errors.Is(err, syscall.ENOENT):
	default:
		return fmt.Errorf("spdk: read the super blob id: %w", err)
	}
	// Index the blobs: iter_next closes the blob it is given. A blob
	// without a valid weir.id, or claiming an id another blob claims, is
	// a stray: not served, reported to weir check.
	_, _, blob, err := be.r.do(func(op *C.weir_op) { C.weir_iter_first(bs, op) })
	for err == nil {
		var v C.uint64_t
		sid := C.spdk_blob_get_id(blob)
		switch rc := C.weir_get_u64(blob, nameID, &v); {
		case be.super != 0 && sid == be.super:
		case rc != 0:
			be.strays = append(be.strays, fmt.Sprintf("SPDK blob %#x has no valid weir.id xattr: %v", uint64(sid), syscall.Errno(-rc)))
		case backend.CheckID(backend.BlobID(v)) != nil:
			be.strays = append(be.strays, fmt.Sprintf("SPDK blob %#x has weir.id %d, not a valid blob id", uint64(sid), uint64(v)))
		default:
			if other, dup := be.ids[backend.BlobID(v)]; dup {
				be.strays = append(be.strays, fmt.Sprintf("SPDK blobs %#x and %#x both claim weir blob %d; %#x is served", uint64(other), uint64(sid), uint64(v), uint64(other)))
				break
			}
			be.ids[backend.BlobID(v)] = sid
		}
		prev := blob
		_, _, blob, err = be.r.do(func(op *C.weir_op) { C.weir_iter_next(bs, prev, op) })
	}
	if !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("spdk: list blobs on %q: %w; nothing on the device was changed", opts.Bdev, err)
	}
	// SPDK's iterator skips a blob it cannot read: the filter counted.
	if n := devStateAt(be.devState, wReadErrs); n > 0 {
		return fmt.Errorf("spdk: load the blobstore on %q: %d read(s) of the device failed: %w; "+
			"nothing on the device was changed (check the device, `weir doctor`)", opts.Bdev, n, syscall.EIO)
	}
	switch {
	case opts.ReadOnly:
		// The recovery (if any) stays in memory; nothing is written.
		setDevState(be.devState, wFailWrite, 1)
		setDevState(be.devState, wHold, 2)
	default:
		if partly, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_filter_commit(dev, op) }); err != nil {
			if partly != 0 {
				return fmt.Errorf("spdk: write the recovery of the blobstore on %q: %w; putting back what it overwrote failed too, "+
					"so the device may be partly updated (the recovery is crash-safe and is redone at the next load)", opts.Bdev, err)
			}
			return fmt.Errorf("spdk: write the recovery of the blobstore on %q: %w; nothing on the device was changed "+
				"(what the recovery overwrote was put back)", opts.Bdev, err)
		}
		if opts.fault == (loadFault{}) {
			C.weir_filter_quiet(dev)
		}
	}
	return nil
}

// emptyProbe is how much of each end of a device must read as zeros for it
// to count as empty: 1 MiB covers the labels of partition tables (GPT keeps
// a copy at the end), file systems, LVM, ZFS (labels at both ends) and
// SPDK's own blobstore and lvol super blocks.
const emptyProbe = 1 << 20

// provablyEmpty reads the first and last emptyProbe bytes of bdev name and
// reports whether they are all zeros. On the metadata thread.
func (be *Backend) provablyEmpty(name *C.char) (bool, error) {
	var desc *C.struct_spdk_bdev_desc
	if rc := C.weir_bdev_open_ro(name, &desc); rc != 0 {
		return false, fmt.Errorf("open: %w", syscall.Errno(-rc))
	}
	defer C.spdk_bdev_close(desc)
	ch := C.spdk_bdev_get_io_channel(desc)
	if ch == nil {
		return false, errors.New("no I/O channel")
	}
	defer C.spdk_put_io_channel(ch)
	size, block := int64(C.weir_bdev_size(desc)), int64(C.weir_bdev_block(desc))
	n := min(alignDown(emptyProbe, block), size)
	buf := dmaAlloc(max(n, block), 4096)
	if buf == nil {
		return false, syscall.ENOMEM
	}
	defer dmaFree(buf)
	for _, off := range []int64{0, alignDown(size-n, block)} {
		_, _, _, err := be.r.do(func(op *C.weir_op) {
			C.weir_bdev_read(desc, ch, bufPtr(buf), C.uint64_t(off), C.uint64_t(n), op)
		})
		if err != nil {
			return false, fmt.Errorf("read %d bytes at %d: %w", n, off, err)
		}
		for _, b := range buf[:n] {
			if b != 0 {
				return false, nil
			}
		}
	}
	return true, nil
}

// lockAll flocks, exclusively, Options.LockFile (created if missing) and
// the file under the bdev if it is an aio bdev (directly or under an
// error bdev), so that no two processes load one blobstore, whatever
// their data directories: the second gets EBUSY. (SPDK keeps two
// processes off one PCIe device itself.)
func lockAll(opts Options) ([]*os.File, error) {
	var locks []*os.File
	lock := func(path string, create bool, what string) error {
		flag := os.O_RDONLY
		if create {
			flag = os.O_RDWR | os.O_CREATE
		}
		f, err := os.OpenFile(path, flag, 0o600)
		if err != nil {
			return fmt.Errorf("spdk: lock %s: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				err = syscall.EBUSY
			}
			return fmt.Errorf("spdk: %s is in use (an IO service, weir check or weir format holds %s): %w", what, path, err)
		}
		locks = append(locks, f)
		return nil
	}
	var err error
	if opts.LockFile != "" {
		err = lock(opts.LockFile, true, "the blobstore of this data directory")
	}
	if file := aioFile(opts.ConfigJSON, opts.Bdev); err == nil && file != "" {
		err = lock(file, false, fmt.Sprintf("the file under bdev %q", opts.Bdev))
	}
	if err != nil {
		for _, l := range locks {
			l.Close()
		}
		return nil, err
	}
	return locks, nil
}

// CheckFree says whether New could take opts' locks now, taking and
// releasing them (weir format asks before it erases anything).
func CheckFree(opts Options) error {
	locks, err := lockAll(opts)
	for _, l := range locks {
		l.Close()
	}
	return err
}

// aioFile returns the file under bdev in an SPDK JSON config: the filename
// of its bdev_aio_create, or of its base's if it is an error bdev
// (bdev_error_create names it "EE_" + base_name); "" for other bdevs.
func aioFile(configJSON []byte, bdev string) string {
	files, bases := map[string]string{}, map[string]string{}
	for _, c := range spdkconf.Calls(configJSON) {
		switch c.Method {
		case "bdev_aio_create":
			files[c.Params.Name] = c.Params.Filename
		case "bdev_error_create":
			bases["EE_"+c.Params.BaseName] = c.Params.BaseName
		}
	}
	for range 4 { // error bdevs over error bdevs, a few deep
		if f, ok := files[bdev]; ok {
			return f
		}
		if bdev = bases[bdev]; bdev == "" {
			return ""
		}
	}
	return ""
}

// loadFault fails the readAt-th read the blobstore issues, the writeAt-th
// device write, and every device write from the writeFrom-th on, before
// they reach the device; and reports the landedAt-th device write of a
// commit failed after it reached the device (0: none).
type loadFault struct{ readAt, writeAt, writeFrom, landedAt int }

// Indexes of the filter device's state (weir_spdk.h).
const (
	wReads        = C.W_READS
	wWrites       = C.W_WRITES
	wFailRead     = C.W_FAIL_READ
	wFailWrite    = C.W_FAIL_WRITE
	wFailWriteAt  = C.W_FAIL_WRITE_AT
	wFailLandedAt = C.W_FAIL_LANDED_AT
	wHold         = C.W_HOLD
	wReadErrs     = C.W_READ_ERRORS
	wStateLen     = C.WEIR_FILTER_STATE
)

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Formatted says whether New made a new blobstore (on an empty bdev, or
// with Options.Format).
func (be *Backend) Formatted() bool { return be.formatted }

var nameStack = C.CString("weir.stack")

// Identity reads the xattr weir.stack of the blobstore's super blob.
func (be *Backend) Identity() (backend.Identity, bool, error) {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return backend.Identity{}, false, fmt.Errorf("backend spdk: identity: %w", syscall.EBADF)
	}
	if be.super == 0 {
		return backend.Identity{}, false, nil
	}
	var id [16]byte
	var err error
	be.r.run(func() {
		_, _, blob, oerr := be.r.do(func(op *C.weir_op) { C.weir_open(be.bs, C.uint64_t(be.super), op) })
		if oerr != nil {
			err = fmt.Errorf("open the super blob: %w", oerr)
			return
		}
		if rc := getIdentityXattr(blob, nameStack, &id); rc != 0 {
			err = fmt.Errorf("the super blob's weir.stack: %w", syscall.Errno(-rc))
		}
		_, _, _, cerr := be.r.do(func(op *C.weir_op) { C.weir_close(blob, op) })
		err = errors.Join(err, cerr)
	})
	if err != nil {
		return backend.Identity{}, false, fmt.Errorf("backend spdk: identity: %w", err)
	}
	return backend.Identity(id), true, nil
}

// SetIdentity makes a super blob with xattr weir.stack = id, durably;
// EEXIST if the store has another identity.
func (be *Backend) SetIdentity(id backend.Identity) error {
	cur, ok, err := be.Identity()
	switch {
	case err != nil:
		return err
	case ok && cur == id:
		return nil
	case ok:
		return fmt.Errorf("backend spdk: set identity %s: the store on bdev %q belongs to stack %s: %w", id, be.opts.Bdev, cur, syscall.EEXIST)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	switch {
	case be.closed:
		return fmt.Errorf("backend spdk: set identity: %w", syscall.EBADF)
	case be.opts.ReadOnly:
		return fmt.Errorf("backend spdk: set identity: %w", syscall.EROFS)
	}
	raw := [16]byte(id)
	be.r.run(func() {
		var sid C.spdk_blob_id
		if sid, err = be.newBlob(0); err != nil { // it deletes what it made
			return
		}
		drop := func() { _, _, _, _ = be.r.do(func(op *C.weir_op) { C.weir_delete(be.bs, C.uint64_t(sid), op) }) }
		_, _, blob, oerr := be.r.do(func(op *C.weir_op) { C.weir_open(be.bs, C.uint64_t(sid), op) })
		if oerr != nil {
			err = oerr
			drop()
			return
		}
		if rc := setIdentityXattr(blob, nameStack, &raw); rc != 0 {
			err = syscall.Errno(-rc)
		}
		if err == nil {
			_, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_sync_md(blob, op) })
		}
		_, _, _, cerr := be.r.do(func(op *C.weir_op) { C.weir_close(blob, op) })
		if err = errors.Join(err, cerr); err != nil {
			drop()
			return
		}
		// The super block names the super blob: written when this returns.
		// set_super names the blob in memory before it writes the super
		// block; failed, the unload writes it all the same: the blob
		// stays, as the store's identity.
		_, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_set_super(be.bs, C.uint64_t(sid), op) })
		be.super = sid
		if err == nil {
			err = be.flushLocked()
		}
	})
	if err != nil {
		return fmt.Errorf("backend spdk: set identity: %w", err)
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
	switch {
	case be.closed:
		return errorf("create", id, syscall.EBADF)
	case be.opts.ReadOnly:
		return errorf("create", id, syscall.EROFS)
	}
	if _, ok := be.ids[id]; ok {
		return errorf("create", id, syscall.EEXIST)
	}
	var err error
	be.r.run(func() {
		var sid C.spdk_blob_id
		if sid, err = be.newBlob(uint64(id)); err == nil {
			be.ids[id] = sid
		}
	})
	if err != nil {
		return errorf("create", id, err)
	}
	return nil
}

// newBlob creates a thin blob with weir.id = tag and weir.size = 0 (no
// xattrs if tag is 0: tests make strays so) and persists its metadata. On
// the metadata thread.
func (be *Backend) newBlob(tag uint64) (C.spdk_blob_id, error) {
	sid, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_create(be.bs, op) })
	if err != nil {
		return 0, err
	}
	drop := func(err error) (C.spdk_blob_id, error) {
		_, _, _, _ = be.r.do(func(op *C.weir_op) { C.weir_delete(be.bs, C.uint64_t(sid), op) })
		return 0, err
	}
	_, _, blob, err := be.r.do(func(op *C.weir_op) { C.weir_open(be.bs, C.uint64_t(sid), op) })
	if err != nil {
		return drop(err)
	}
	if tag != 0 {
		if rc := C.weir_set_u64(blob, nameID, C.uint64_t(tag)); rc != 0 {
			err = syscall.Errno(-rc)
		} else if rc := C.weir_set_u64(blob, nameSize, 0); rc != 0 {
			err = syscall.Errno(-rc)
		}
	}
	if err == nil {
		_, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_sync_md(blob, op) })
	}
	_, _, _, cerr := be.r.do(func(op *C.weir_op) { C.weir_close(blob, op) })
	if err = errors.Join(err, cerr); err != nil {
		return drop(err)
	}
	return C.spdk_blob_id(sid), nil
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
	switch {
	case be.closed:
		return errorf("delete", id, syscall.EBADF)
	case be.opts.ReadOnly:
		return errorf("delete", id, syscall.EROFS)
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

// Sync flushes the device: creates and deletes wrote their metadata
// (sync_md) before they returned.
func (be *Backend) Sync() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return fmt.Errorf("backend spdk: sync: %w", syscall.EBADF)
	}
	if be.opts.ReadOnly {
		return nil
	}
	var err error
	be.r.run(func() { err = be.flushLocked() })
	if err != nil {
		return fmt.Errorf("backend spdk: sync: %w", err)
	}
	return nil
}

// flushLocked flushes the bdev, if it has anything to flush. On the
// metadata thread.
func (be *Backend) flushLocked() error {
	if be.flushCh == nil {
		return nil
	}
	be.flushes.Add(1)
	_, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_flush(be.flushDesc, be.flushCh, op) })
	if err != nil {
		return fmt.Errorf("flush the device: %w", err)
	}
	return nil
}

// stopWorkers stops every worker: each releases its I/O channel and exits
// its SPDK thread, polling until both are done.
func (be *Backend) stopWorkers() {
	be.r.removeWorkers(be.workers)
	for _, w := range be.workers {
		w.stop()
	}
	be.workers = nil
}

// Close waits for I/O in flight, stops the workers, syncs and closes open
// blobs and unloads the blobstore (a clean shutdown: the next load needs no
// recovery).
func (be *Backend) Close() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed {
		return fmt.Errorf("backend spdk: close: %w", syscall.EBADF)
	}
	be.closed = true
	be.gone.Store(true)
	be.life.Lock() // no I/O in flight from here on
	be.life.Unlock()
	be.stopWorkers()
	var errs []error
	be.r.run(func() { errs = be.release(be.opts.ReadOnly) })
	if be.devState != nil {
		freeDevState(be.devState)
		be.devState = nil
	}
	for _, l := range be.locks {
		errs = append(errs, l.Close())
	}
	be.locks = nil
	return errors.Join(errs...)
}

// release syncs and closes the open blobs, frees the channels and buffers
// and unloads the blobstore, on the metadata thread. discard (read-only, a
// failed load) makes the unload's writes fail first (with EIO, which frees
// the blobstore all the same): the device stays as it was.
func (be *Backend) release(discard bool) []error {
	var errs []error
	for _, s := range be.open {
		if err := be.syncMDLocked(s); err != nil {
			errs = append(errs, err)
		}
		if _, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_close(s.blob, op) }); err != nil {
			errs = append(errs, err)
		}
	}
	if be.ch != nil {
		C.spdk_bs_free_io_channel(be.ch)
		be.ch = nil
	}
	if be.flushCh != nil {
		C.spdk_put_io_channel(be.flushCh)
		be.flushCh = nil
	}
	if be.flushDesc != nil {
		C.spdk_bdev_close(be.flushDesc)
		be.flushDesc = nil
	}
	if be.edge != nil {
		dmaFree(be.edge)
		be.edge = nil
	}
	be.bufs.free()
	if be.bs != nil {
		if discard {
			setDevState(be.devState, wFailWrite, 1)
			if devStateAt(be.devState, wHold) == 1 {
				setDevState(be.devState, wHold, 2)
			}
		}
		// Discarding, the unload's writes fail with EIO (expected); any
		// other error (EBUSY: a blob still open) is reported.
		if _, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_bs_unload(be.bs, op) }); err != nil && !(discard && errors.Is(err, syscall.EIO)) {
			errs = append(errs, fmt.Errorf("unload blobstore: %w", err))
		}
		be.bs, be.dev = nil, nil
	}
	return errs
}

// blobState is one open blob.
type blobState struct {
	id   backend.BlobID
	sid  C.spdk_blob_id
	blob *C.struct_spdk_blob
	size atomic.Int64

	// rw is held shared by reads and by writes of whole io units, and
	// exclusively by writes that read-modify-write a partial unit, by
	// Truncate and by a resize: so a partial unit is never written from a
	// stale copy, and the blob's cluster map never changes under a worker
	// that is looking at it.
	rw sync.RWMutex

	// On the metadata thread (or under Backend.mu for refs):
	sizeDirty atomic.Bool // weir.size differs from what sync_md last wrote
	syncErr   error       // sticky
	refs      int         // protected by Backend.mu
}

// growSize raises the blob's size to end if it is smaller.
func (s *blobState) growSize(end int64) {
	for {
		old := s.size.Load()
		if end <= old {
			return
		}
		if s.size.CompareAndSwap(old, end) {
			s.sizeDirty.Store(true)
			return
		}
	}
}

// syncMDLocked writes weir.size and the blob's metadata if they changed.
// On the metadata thread.
func (be *Backend) syncMDLocked(s *blobState) error {
	if s.syncErr != nil {
		return s.syncErr
	}
	if !s.sizeDirty.Swap(false) {
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

// writable is usable, and EROFS on a read-only backend.
func (h *handle) writable(op string) error {
	if err := h.usable(op); err != nil {
		return err
	}
	if h.be.opts.ReadOnly {
		return errorf(op, h.s.id, syscall.EROFS)
	}
	return nil
}

func alignDown(v, a int64) int64 { return v - v%a }
func alignUp(v, a int64) int64   { return alignDown(v+a-1, a) }

// mdIO moves whole io units [pos, pos+len(buf)) between the device and buf
// (DMA-able) on the metadata thread's channel. On the metadata thread.
func (be *Backend) mdIO(write bool, s *blobState, pos int64, buf []byte) error {
	p := bufPtr(buf)
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

// clustersFor is the number of clusters that hold end bytes.
func (be *Backend) clustersFor(end int64) uint64 {
	return uint64(alignUp(end, be.cluster) / be.cluster)
}

// resize sets the blob's length in clusters. On the metadata thread.
func (be *Backend) resize(s *blobState, clusters uint64) error {
	_, _, _, err := be.r.do(func(op *C.weir_op) { C.weir_resize(s.blob, C.uint64_t(clusters), op) })
	return err
}

// grow gives the blob the clusters to hold end bytes, if it has fewer. The
// caller holds the blob's lock exclusively.
func (be *Backend) grow(s *blobState, end int64) error {
	need := be.clustersFor(end)
	if uint64(C.spdk_blob_get_num_clusters(s.blob)) >= need {
		return nil
	}
	var err error
	be.r.run(func() { err = be.resize(s, need) })
	return err
}

// ensure is grow for a caller that holds the blob's lock shared: it takes
// the lock exclusively for the resize, and gives it back shared.
func (be *Backend) ensure(s *blobState, end int64) error {
	if uint64(C.spdk_blob_get_num_clusters(s.blob)) >= be.clustersFor(end) {
		return nil
	}
	s.rw.RUnlock()
	defer s.rw.RLock()
	s.rw.Lock()
	defer s.rw.Unlock()
	return be.grow(s, end)
}

func (h *handle) Truncate(size int64) error {
	if err := h.writable("truncate"); err != nil {
		return err
	}
	if err := backend.CheckSize(size); err != nil {
		return errorf("truncate", h.s.id, err)
	}
	be, s := h.be, h.s
	be.life.RLock()
	defer be.life.RUnlock()
	if be.gone.Load() {
		return errorf("truncate", s.id, syscall.EBADF)
	}
	s.rw.Lock()
	defer s.rw.Unlock()
	var err error
	be.r.run(func() {
		old := s.size.Load()
		need := be.clustersFor(size)
		if size >= old {
			if uint64(C.spdk_blob_get_num_clusters(s.blob)) < need {
				if err = be.resize(s, need); err != nil {
					return
				}
			}
			if size != old {
				s.size.Store(size)
				s.sizeDirty.Store(true)
			}
			return
		}
		// Zero the tail of the last unit so a later grow reads zeros,
		// then give back the clusters past the end.
		if tail := size % be.ioUnit; tail != 0 {
			last := size - tail
			if err = be.mdIO(false, s, last, be.edge); err != nil {
				return
			}
			clear(be.edge[tail:])
			if err = be.mdIO(true, s, last, be.edge); err != nil {
				return
			}
		}
		// Whole units between the new and the old end that stay in kept
		// clusters must read as zeros after a later grow.
		from := alignUp(size, be.ioUnit)
		to := min(alignUp(old, be.ioUnit), int64(need)*be.cluster)
		if to > from {
			f, n := C.uint64_t(from/be.ioUnit), C.uint64_t((to-from)/be.ioUnit)
			if _, _, _, err = be.r.do(func(op *C.weir_op) { C.weir_write_zeroes(s.blob, be.ch, f, n, op) }); err != nil {
				return
			}
		}
		if err = be.resize(s, need); err != nil {
			return
		}
		// A shrink releases (and clears) its clusters only when the
		// metadata is persisted; until then a grow would map the old
		// clusters back, stale data and all. Persist now.
		s.size.Store(size)
		s.sizeDirty.Store(true)
		err = be.syncMDLocked(s)
	})
	if err != nil {
		return errorf("truncate", s.id, err)
	}
	return nil
}

// Sync makes the blob durable: its size (weir.size, sync_md) and every
// write completed before the call, which the blobstore does not cache but
// the device may (a flush of the bdev).
func (h *handle) Sync() error {
	if err := h.usable("sync"); err != nil {
		return err
	}
	if h.be.opts.ReadOnly {
		return nil // nothing was written
	}
	var err error
	h.be.r.run(func() {
		if err = h.be.syncMDLocked(h.s); err == nil {
			if err = h.be.flushLocked(); err != nil {
				err = errorf("sync", h.s.id, err)
			}
		}
	})
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
	s.rw.Lock() // the last handle: wait for its I/O in flight
	defer s.rw.Unlock()
	var err error
	be.r.run(func() {
		err = be.syncMDLocked(s)
		if _, _, _, cerr := be.r.do(func(op *C.weir_op) { C.weir_close(s.blob, op) }); err == nil {
			err = cerr
		}
	})
	return err
}
