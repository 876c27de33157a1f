package iosvc

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/grantcap"
	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/internal/livetab"
	"github.com/weir-storage/weir/internal/staging"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/io/backend"
)

// ServiceName is the service's name on NATS: Start registers it as a NATS
// micro service with the endpoints "health" (Health) and "stats"
// (Snapshot), which `weir status` and `nats micro` query.
const ServiceName = "weir-io"

// Options configure an IO service.
type Options struct {
	Socket string // Unix socket clients connect to
	// MetadataSocket is the metadata service's service socket: the IO
	// service keeps a service session there, so that each service knows
	// at once when the other is gone. "" means none (an IO service alone,
	// in tests): then no client can attach, since no metadata service
	// resynchronises this one.
	MetadataSocket string
	Backend        backend.Backend // owned by the service from New on
	NATS           *nats.Conn      // the service's authenticated connection; not owned
	Ring           ring.Config     // per-session ring size
	WaitMode       ring.WaitMode   // how session pollers wait
	Logger         hclog.Logger
	// RequestTimeout bounds each control request to the metadata service.
	RequestTimeout time.Duration
	// NATSNamespace starts every NATS subject of the stack
	// (control.SubjectsIn) and the service's health and stats endpoints;
	// "" means control.DefaultNamespace. The metadata service must use
	// the same.
	NATSNamespace string
	// Version is the version the service reports on NATS; "" means
	// "0.0.0-dev".
	Version string
	// CacheSize bounds the page cache in shared memory (bytes of resident
	// file pages across all open files); 0 turns it off. Readahead is the
	// largest window a sequential reader's misses fill ahead (bytes).
	CacheSize, Readahead int64
	// Descriptors bounds the descriptors kept for files nobody has open:
	// idle cache regions and the backend's idle blob files
	// (descriptors.go); 0 means DefaultDescriptors. Never more than a
	// quarter of RLIMIT_NOFILE.
	Descriptors int
	// StagingBytes is the ring of the staging log that fsync writes to
	// (staged.go), made at the first start on a store that has none (an
	// existing log keeps its size); 0 turns the log off: an fsync then
	// syncs the blob, the backend and the metadata service's WAL in the
	// foreground, as before Split Journaling (the benchmark's ablation).
	StagingBytes int64
	// JournalSocket is the service socket the journal service opens its
	// session on (journal.go): io then leaves the checkpoint of the
	// staging log to it. "" means io checkpoints the log itself (an IO
	// service alone, in tests).
	JournalSocket string
	// ForegroundCheckpoint makes every fsync wait until its record is
	// checkpointed (the benchmark's ablation "no background journaling").
	ForegroundCheckpoint bool
	// LiveTable is where the table of open blobs' live sizes is made
	// (internal/livetab), in a directory only the service user may
	// enter; the metadata service maps it to answer stat of files being
	// written. "" means none: such a stat asks io over the control plane.
	LiveTable string
	// Limits bound each uid's handshakes and sessions on Socket, and name
	// the uids Shares do not bind (limits.go).
	Limits host.Limits
	// Shares are the parts of pins, the staging log and descriptors one
	// uid's sessions may hold (limits.go).
	Shares Shares
}

// Stats are the service's counters, reported on NATS.
type Stats struct {
	Sessions     atomic.Int64
	Reads        atomic.Uint64
	Writes       atomic.Uint64
	BytesRead    atomic.Uint64
	BytesWritten atomic.Uint64
	Syncs        atomic.Uint64
	SyncFSs      atomic.Uint64 // syncfs requests served (OpSyncFS)
	Grants       atomic.Int64
	// Claims counts read grants installed from a capability (OpClaim,
	// claims.go); ClaimsRefused the claims refused.
	Claims        atomic.Uint64
	ClaimsRefused atomic.Uint64
	// Direct opens (OpClaimDir, direct.go): made, refused (the client
	// opens through metadata), released, ended by a writer's grant.
	DirClaims        atomic.Uint64
	DirClaimsRefused atomic.Uint64
	DirReleases      atomic.Uint64
	DirEnded         atomic.Uint64
	Denied           atomic.Uint64 // requests refused for lack of a grant
	Stale            atomic.Uint64 // requests answered ESTALE: the session predates a resync
	// Reads and writes served on the session's poller (alone: nothing else
	// of the session in flight or queued) and handed to a goroutine.
	InlineIO    atomic.Uint64
	HandedOffIO atomic.Uint64

	Resyncs        atomic.Uint64 // resynchronisations by the metadata service
	GrantsDropped  atomic.Uint64 // grants a resync dropped
	StaleControl   atomic.Uint64 // grants and revokes not newer than the file's last: ignored
	Deletes        atomic.Uint64
	RevokesWaiting atomic.Int64 // revocations waiting for requests in flight
	// AdoptionsRefused counts grants of new files whose blob existed
	// already (control.Grant.Fresh): refused, not served.
	AdoptionsRefused atomic.Uint64
	// RegionFailures counts cache regions that could not be made: those
	// files are served without the cache.
	RegionFailures atomic.Uint64
	// ResourceErrors counts descriptors and memory the kernel refused
	// (EMFILE, ENFILE, ENOMEM: descriptors.go); Relieved the idle regions
	// and blob files given back for them.
	ResourceErrors, Relieved atomic.Uint64
	// NoSpace counts writes refused for want of room at home (ENOSPC).
	NoSpace atomic.Uint64
	// CloseWritebackFailures counts last closes whose write-back failed
	// (the blob stays open for the flusher).
	CloseWritebackFailures atomic.Uint64

	// Zero-copy memory (backends that implement backend.MemRegistrar).
	HugePageFallbacks     atomic.Uint64 // sessions given ordinary pages: no huge page region could be made
	MemRegisterFailures   atomic.Uint64 // regions the backend refused to register: it bounces their payloads
	MemUnregisterFailures atomic.Uint64 // regions the backend failed to unregister

	// Write windows (windows.go): pinned, and pages their drains made dirty.
	WindowPins, WindowPages atomic.Uint64
	// WindowsEnded: windows ended by their grant's end; MapsDemoted:
	// writable pins whose grant ended (pins.go).
	WindowsEnded, MapsDemoted atomic.Uint64
}

// Snapshot returns the service's counters and the backend's, for the
// stats endpoint.
func (s *Service) Snapshot() map[string]any {
	st := &s.Stats
	m := map[string]any{
		"sessions": st.Sessions.Load(), "reads": st.Reads.Load(), "writes": st.Writes.Load(),
		"bytes_read": st.BytesRead.Load(), "bytes_written": st.BytesWritten.Load(),
		"syncs": st.Syncs.Load(), "syncfs": st.SyncFSs.Load(), "grants": st.Grants.Load(), "denied": st.Denied.Load(), "stale": st.Stale.Load(),
		"claims": st.Claims.Load(), "claims_refused": st.ClaimsRefused.Load(),
		"dir_claims": st.DirClaims.Load(), "dir_claims_refused": st.DirClaimsRefused.Load(),
		"dir_releases": st.DirReleases.Load(), "dir_ended": st.DirEnded.Load(),
		"io_inline": st.InlineIO.Load(), "io_handed_off": st.HandedOffIO.Load(),
		"resyncs": st.Resyncs.Load(), "grants_dropped": st.GrantsDropped.Load(),
		"stale_control": st.StaleControl.Load(), "deletes": st.Deletes.Load(),
		"revokes_waiting":         st.RevokesWaiting.Load(),
		"adoptions_refused":       st.AdoptionsRefused.Load(),
		"ring_hugepage_fallbacks": st.HugePageFallbacks.Load(),
		"mem_register_failures":   st.MemRegisterFailures.Load(),
		"mem_unregister_failures": st.MemUnregisterFailures.Load(),
		"window_pins":             st.WindowPins.Load(),
		"window_pages":            st.WindowPages.Load(),
		"windows_ended":           st.WindowsEnded.Load(),
		"maps_demoted":            st.MapsDemoted.Load(),
		"backend_syncs":           s.creates.syncs.Load(),
		"metadata_incarnation":    s.inc.Load(),
		"metadata_connected":      s.peer != nil && s.peer.Up(),
	}
	s.mu.Lock()
	m["claim_floors"] = len(s.capFloor)          // sessions whose revoked capabilities io remembers (claims.go)
	m["syncfs_unsynced_files"] = len(s.unsynced) // closed with changes home, not synced: a syncfs syncs them
	s.mu.Unlock()
	if pc := s.pc; pc != nil {
		m["cache_limit_pages"] = pc.limit
		m["cache_resident_pages"] = pc.resident.Load()
		m["cache_regions"] = pc.Regions.Load()
		m["cache_idle_regions"] = s.idleCount()
		m["cache_maps"] = pc.Maps.Load()
		m["cache_hits"] = pc.Hits.Load()
		m["cache_misses"] = pc.Misses.Load()
		m["cache_fills"] = pc.Fills.Load()
		m["cache_fill_ns"] = pc.FillNanos.Load()
		m["cache_filled_pages"] = pc.FilledPages.Load()
		m["cache_readahead_pages"] = pc.ReadaheadPages.Load()
		m["cache_evictions"] = pc.Evictions.Load()
		m["cache_bypassed_pages"] = pc.Bypassed.Load()
		m["cache_write_allocated_pages"] = pc.WriteAllocated.Load()
		m["cache_write_updated_pages"] = pc.WriteUpdated.Load()
		m["cache_memory_bytes"] = s.cacheMemory()
		m["cache_dirty_pages"] = pc.dirty.Load()
		m["cache_dirty_limit_pages"] = pc.dirtyLimit
		m["cache_writeback_pages"] = pc.WritebackPages.Load()
		m["cache_writeback_errors"] = pc.WritebackErrors.Load()
		m["cache_write_throughs"] = pc.WriteThroughs.Load()
		m["cache_page_failures"] = pc.PageFailures.Load()
		m["cache_scrubbed_bytes"] = pc.Scrubbed.Load()
		m["cache_direct_writes"] = pc.DirectWrites.Load()
		m["cache_direct_flushes"] = pc.DirectFlushes.Load()
	}
	m["cache_region_failures"] = st.RegionFailures.Load()
	m["resource_errors"] = st.ResourceErrors.Load()
	m["descriptors_relieved"] = st.Relieved.Load()
	m["descriptors"] = openDescriptors()
	m["descriptor_spares"] = s.spares.count()
	m["close_writeback_failures"] = st.CloseWritebackFailures.Load()
	m["no_space"] = st.NoSpace.Load()
	s.uids.snapshot(m)
	m["descriptor_budget_idle_regions"] = s.idleRegions
	if s.stg != nil {
		s.stg.snapshot(m)
	}
	if r, ok := s.be.(backend.Reporter); ok {
		for k, v := range r.Counters() {
			m[k] = v
		}
	}
	maps.Copy(m, s.host.Counters())
	return m
}

// background runs fn on a goroutine of its own that Shutdown waits for,
// unless the service is stopping (false: fn does not run). Control
// handlers still running when Shutdown unsubscribed get false.
func (s *Service) background(fn func()) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return false
	}
	s.bg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.bg.Done()
		fn()
	}()
	return true
}

// errAdoption is the error of a grant for a new file (control.Grant.Fresh)
// whose blob exists: io does not serve another file's data as its own.
var errAdoption = fmt.Errorf("refused to adopt an existing blob: %w", syscall.EIO)

// maxDeletes bounds the blob deletes io runs at once (the metadata
// service sends up to 8).
const maxDeletes = 8

// openBlob is a blob with at least one grant or request in flight.
type openBlob struct {
	id  backend.BlobID
	ino uint64
	b   backend.Blob

	appendMu sync.Mutex // serialises O_APPEND writes (offset = size)
	// res is the room reserved at home for cached writes (space.go).
	res reservation
	// size is the file's size: the backend's, or past it by the writes
	// that wait in the cache to be written home (write-back).
	size  atomic.Int64
	mtime atomic.Int64 // Unix ns of the last change through this service
	wrote atomic.Bool  // changed since it was opened here
	dv    atomic.Uint64
	// hasLive: the blob holds slot liveSlot of the live table (set at
	// open).
	hasLive  bool
	liveSlot uint32

	refs int    // grants + in-flight requests; protected by Service.mu
	ver  uint64 // version of the last grant or revoke applied; protected by Service.mu
	// writers counts its write grants, direct its direct opens
	// (direct.go); protected by Service.mu.
	writers int
	direct  map[*grant]dirOpen

	// The blob's cache region, made at its first read (regionOf), or
	// kept from an earlier opening (openBlobLocked); nil while there is
	// none or the cache is off.
	rmu    sync.Mutex
	reg    *region // protected by rmu; read without it through cached
	cached atomic.Pointer[region]
	rfail  bool // making the region failed: the blob goes uncached; protected by rmu
	// dirtyHeld: the last reference could not write the dirty pages home
	// and stays, for the flusher to drop once they are (Service.mu).
	dirtyHeld bool
	// sf is the file's staging state (staged.go); nil when the staging
	// log is off.
	sf *stagedFile
	// rgate: a write or truncate of the blob while it has no region holds
	// it shared; making the region takes it exclusive, so that no fill
	// can read the device under a change the region does not know of.
	rgate sync.RWMutex
}

// grant is a session's handle on a blob, as the metadata service granted
// it. Requests hold it active; a revocation takes it out of the table at
// once (new requests get EBADF) and answers when the active ones are done.
type grant struct {
	blob        *openBlob
	read, write bool
	sync        control.SyncMode
	ver         uint64 // the file version of the grant: its revoke must be newer

	active  int           // requests in flight; protected by Service.mu
	revoked bool          // protected by Service.mu
	used    bool          // it served a request; protected by Service.mu
	drained chan struct{} // closed once revoked and active is 0
	// dirOpens: a direct open's (direct.go), its session's count of
	// them, which its end lowers; nil for every other grant.
	dirOpens *int
	// pinners: the sessions that pinned ranges through it (pins.go),
	// whose pins end with it (grantGone); protected by Service.mu.
	pinners []*session

	// The sequential read detector (readahead): where the last read
	// ended and the readahead window it got, in pages. Racing reads of
	// one handle only blur it.
	raNext atomic.Int64
	raWin  atomic.Int32
}

// Service is the IO service.
type Service struct {
	opts Options
	log  hclog.Logger
	be   backend.Backend
	host *host.Host
	subj control.Subjects // immutable after New
	// reg is be when it registers memory, else nil; immutable after New.
	// When it wants huge pages, opts.Ring.HugePages is set.
	reg backend.MemRegistrar
	// newRegion creates a session's region: ring.Create; tests replace it
	// before Start to make huge pages fail. Immutable after Start.
	newRegion func(ring.Config) (*ring.Region, error)
	// handOffAlways serves every read and write on a goroutine of its own,
	// even one that is alone; tests of concurrency set it.
	handOffAlways atomic.Bool
	// load counts the requests in flight across the client sessions, so
	// that their completions tell clients when not to spin
	// (ring.HintNoSpin).
	load *ring.Load

	// inc is the metadata service's incarnation as of the last resync (0:
	// none yet); resyncs counts resyncs: an IO session attached before the
	// latest one is stale. allocLimit: blob ids below it are allocated.
	inc        atomic.Uint32
	resyncs    atomic.Uint64
	allocLimit atomic.Uint64
	resynced   chan struct{} // closed at the first resync
	resyncOnce sync.Once
	// The store's owner: claimed is the stack whose resync the store was
	// checked for (nil until one was); storeErr is the refusal of the last
	// resync from a stack the store does not belong to (nil again after a
	// resync of the right one); wrongStore is closed at the first such
	// refusal (Start then fails).
	claimed    atomic.Pointer[backend.Identity]
	storeErr   atomic.Pointer[error]
	wrongStore chan struct{}
	wrongOnce  sync.Once
	// dv hands out data versions: every change of a blob takes the next.
	// It starts at the clock so that a restarted service's versions are
	// newer than its predecessor's.
	dv atomic.Uint64

	mu       sync.Mutex
	blobs    map[backend.BlobID]*openBlob // protected by mu
	deleting map[backend.BlobID]struct{}  // blobs being deleted: not to be opened; protected by mu
	// unsynced holds the blobs closed here after a change (written home,
	// not synced): a syncfs (OpSyncFS) syncs them; by inode; protected by mu.
	unsynced      map[backend.BlobID]uint64
	syncingClosed atomic.Bool // a background syncClosed runs (maxUnsynced)
	// syncFSMu serialises syncfs passes (syncAll, the background
	// syncClosed): a pass takes a blob off unsynced when it opens it, so
	// another pass must wait for it to end (or to list again what failed)
	// before it answers. Taken before mu.
	syncFSMu sync.Mutex
	// syncClosedFailed is when a background pass last failed (unix ns):
	// none starts again for syncClosedBackoff.
	syncClosedFailed atomic.Int64
	// allSynced: a syncfs of this incarnation synced the whole backend
	// once (backend.SyncAller), covering what earlier ones left unsynced.
	allSynced bool                         // protected by syncFSMu
	delSem    chan struct{}                // bounds the deletes running at once
	grants    map[uint64]map[uint64]*grant // session -> handle -> grant; protected by mu
	sessions  map[uint64]*session          // attached sessions by metadata session id; protected by mu
	// Capabilities (claims.go), protected by mu: the key of this io epoch
	// (nil before the first resync), the claim floor of each session, the
	// sessions whose end came before any ring of theirs attached.
	capKey          *grantcap.Key
	live            *livetab.Table // the live table (Options.LiveTable); nil: none
	capFloor        map[uint64]uint64
	rings           map[uint64]int // rings attached in this epoch, by session
	endedUnattached []uint64
	// Direct opens (direct.go), protected by mu but dirSeq: the
	// directory generation, the direct opens of each session, the
	// counter of their handles.
	dirGen   uint64
	dirLive  bool // a resync came since the metadata session was last lost: direct opens are honoured
	dirOpens map[uint64]*int
	dirSeq   atomic.Uint64
	peer     *host.Peer  // the service session with metadata; immutable after Start
	jpeers   *host.Peers // the journal service's session (journal.go); immutable after Start
	meta     metaLink    // requests to metadata fail at once while its session is down
	listing  blobListing // for the metadata service's orphan scan
	closed   atomic.Bool
	// syncFailure is the first failed sync of a blob or of the backend:
	// set once, never cleared (after a failed fsync the device may have
	// dropped data, so a later success proves nothing). Health reports it.
	syncFailure atomic.Pointer[error]
	// full: the last reservation found the store full (space.go); Health
	// says so until one succeeds again.
	full atomic.Bool
	// creates makes blob creates durable at the fsync that needs them.
	creates createSync
	// uids are each uid's parts of the shared resources (limits.go).
	uids uidBudgets
	// stg is the staging log of fsync; nil when Options.StagingBytes is 0.
	stg *stager
	// pc is the page cache; nil when Options.CacheSize is 0. The flusher
	// writes its dirty pages home until flushStop closes (flushDone).
	pc                   *pageCache
	flushStop, flushDone chan struct{}
	// regions are the blobs' cache regions, open or not: a region
	// outlives its blob's closing (its pages stay cached, as the kernel's
	// do after close) until the blob is deleted or idleRegions newer
	// idle ones push it out. idle lists those of closed blobs, least
	// recently closed first (each region's idleAt is its element, so
	// that an open takes it out at once). Both protected by mu.
	regions map[backend.BlobID]*region
	idle    list.List
	// idleRegions bounds idle's length (descriptors.go); immutable after
	// New.
	idleRegions int
	// spares are descriptors held for io's own write-back at the limit.
	spares spares
	bg     sync.WaitGroup // revocations waiting, live reports after a resync, deletes, blob listings
	// stopping: Shutdown waits for bg; nothing more may start (protected by mu).
	stopping bool

	Stats Stats
}

// New checks opts and builds a service; Start makes it serve.
func New(opts Options) (*Service, error) {
	if opts.Socket == "" || opts.Backend == nil || opts.NATS == nil {
		return nil, errors.New("iosvc: Socket, Backend and NATS are required")
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = host.DefaultRequestTimeout
	}
	var s *Service
	h, err := host.New(host.Options{
		Name: ServiceName, Description: "blob storage and the data path", Version: opts.Version,
		Namespace: opts.NATSNamespace, NATS: opts.NATS, Logger: opts.Logger, RequestTimeout: opts.RequestTimeout,
		Endpoints: map[string]func([]byte) (any, error){
			control.DropCacheEndpoint: func([]byte) (any, error) { return s.DropCache(), nil },
		},
	})
	if err != nil {
		return nil, fmt.Errorf("iosvc: %w", err)
	}
	reg, _ := opts.Backend.(backend.MemRegistrar)
	if reg != nil && reg.HugePages() {
		opts.Ring.HugePages = true
	}
	s = &Service{
		opts: opts, log: opts.Logger, be: opts.Backend, host: h, subj: h.Subjects(),
		reg: reg, newRegion: ring.Create, load: ring.NewLoad(),
		blobs:      make(map[backend.BlobID]*openBlob),
		unsynced:   make(map[backend.BlobID]uint64),
		deleting:   make(map[backend.BlobID]struct{}),
		delSem:     make(chan struct{}, maxDeletes),
		grants:     make(map[uint64]map[uint64]*grant),
		sessions:   make(map[uint64]*session),
		capFloor:   make(map[uint64]uint64),
		rings:      make(map[uint64]int),
		regions:    make(map[backend.BlobID]*region),
		resynced:   make(chan struct{}),
		wrongStore: make(chan struct{}),
	}
	s.uids.init(&opts)
	budget := descriptorBudget(opts.Descriptors)
	var idleFiles int
	s.idleRegions, idleFiles = splitBudget(budget)
	if k, ok := opts.Backend.(backend.IdleKeeper); ok {
		k.SetIdleLimit(idleFiles)
	}
	s.spares.fill()
	s.dv.Store(uint64(time.Now().UnixNano()))
	s.creates.be = opts.Backend
	if opts.StagingBytes > 0 {
		s.stg = newStager(s)
	}
	if opts.LiveTable != "" {
		t, err := livetab.Create(opts.LiveTable, livetab.DefaultSlots)
		if err != nil {
			return nil, fmt.Errorf("iosvc: %w", err)
		}
		s.live = t
	}
	if opts.CacheSize > 0 {
		s.pc = newPageCache(opts.CacheSize, opts.Readahead)
		s.flushStop, s.flushDone = make(chan struct{}), make(chan struct{})
		go s.flusher(s.flushStop, s.flushDone)
	}
	return s, nil
}

// Start takes the metadata service's control requests (on one ordered
// subscription: grants and revocations apply in the order metadata sent
// them), accepts client sessions, registers the health and stats
// endpoints (ServiceName) and opens the service session with the metadata
// service, waiting (up to the request timeout) for its first resync so
// that clients can attach as soon as Start returns.
func (s *Service) Start() error {
	sj := s.subj
	s.host.HandleOrdered(sj.IO, map[string]nats.MsgHandler{
		sj.Grant: s.onGrant, sj.Revoke: s.onRevoke, sj.Live: s.onLive, sj.Delete: s.onDelete,
		sj.Resync: s.onResync, sj.Alloc: s.onAlloc, sj.DirGen: s.onDirGen, sj.Blobs: s.onBlobs,
	})
	s.host.Serve(&host.Listener{Socket: s.opts.Socket, Ring: s.opts.Ring, Mode: s.opts.WaitMode,
		New: func() host.Session { return newSession(s) }, NewRegion: s.createRegion, Limits: s.opts.Limits})
	if s.stg != nil && s.opts.JournalSocket != "" {
		s.serveJournal()
	}
	if err := s.host.Start(s.Health, s.Snapshot); err != nil {
		return fmt.Errorf("iosvc: %w", err)
	}
	if s.opts.MetadataSocket != "" {
		s.meta.init()
		s.peer = host.DialPeer(s.opts.MetadataSocket, string(control.RoleIO), s.log.Named("peer"), func(up bool) {
			s.meta.set(up)
			if !up {
				s.mu.Lock()
				s.dirLive = false // no direct open until the next resync: a new metadata may not know the snapshots out
				s.mu.Unlock()
			}
			if !up && !s.closed.Load() {
				s.log.Info("metadata service session ended; serving existing grants until it is back")
			}
		})
		deadline := time.After(s.opts.RequestTimeout)
		select {
		case <-s.wrongStore:
			err := *s.storeErr.Load()
			_ = s.Shutdown(context.Background())
			return fmt.Errorf("iosvc: %w", err)
		case <-s.resynced:
			select {
			case <-s.meta.upChan():
			case <-deadline:
				s.log.Warn("resynchronised, but the service session with the metadata service is not up yet", "socket", s.opts.MetadataSocket)
			}
		case <-deadline:
			s.log.Warn("no resync from the metadata service yet; clients cannot attach until it comes", "socket", s.opts.MetadataSocket)
		}
	}
	s.log.Info("serving", "socket", s.opts.Socket, "backend", s.be.Name(), "wait", s.opts.WaitMode,
		"register_mem", s.reg != nil, "hugepages", s.opts.Ring.HugePages, "metadata_incarnation", s.inc.Load())
	return nil
}

// createRegion makes a session's region. When huge pages were asked for
// and none can be had (none free, or no hugetlb support), the session gets
// ordinary pages: it works, but the backend cannot register the region and
// copies its payloads through a bounce buffer. Only the first fallback is
// logged as a warning; ring_hugepage_fallbacks counts them all.
func (s *Service) createRegion(cfg ring.Config) (*ring.Region, error) {
	// Its memfd is a descriptor: at the limit the idle ones go back first.
	r, err := withRelief(s, func() (*ring.Region, error) { return s.newRegion(cfg) })
	if err == nil || !cfg.HugePages {
		return r, err
	}
	cfg.HugePages = false
	r, err2 := s.newRegion(cfg)
	if err2 != nil {
		return nil, fmt.Errorf("iosvc: session region: huge pages: %w; ordinary pages: %w", err, err2)
	}
	lvl := hclog.Debug
	if s.Stats.HugePageFallbacks.Add(1) == 1 {
		lvl = hclog.Warn
	}
	s.log.Log(lvl, "no huge pages for a session region: it gets ordinary pages and the backend copies its payloads (later fallbacks are logged at debug level; all are counted in ring_hugepage_fallbacks)",
		"error", err)
	return r, nil
}

// Ready is closed once the service accepts sessions.
func (s *Service) Ready() <-chan struct{} { return s.host.Ready() }

// Health says whether the service does its job: nil while it accepts
// sessions and its storage has not failed; otherwise why not: not started
// or shut down, a listener that no longer accepts, or a failed sync of a
// blob or of the backend (sticky: data may be lost, so only a restart
// clears it). It is what the health endpoint reports; safe to call at any
// time, from any goroutine.
func (s *Service) Health() error {
	if err := s.host.Health(); err != nil {
		return fmt.Errorf("iosvc: %w", err)
	}
	if p := s.syncFailure.Load(); p != nil {
		return fmt.Errorf("iosvc: storage failed: %w", *p)
	}
	if p := s.storeErr.Load(); p != nil {
		return fmt.Errorf("iosvc: %w", *p)
	}
	if s.stg != nil && s.stg.opened.Load() {
		if err := s.stg.log.Stats().Err; err != nil {
			return fmt.Errorf("iosvc: the staging log failed (every fsync fails until a restart): %w", err)
		}
	}
	if err := s.roomHealth(); err != nil {
		return fmt.Errorf("iosvc: %w", err)
	}
	return nil
}

// checkStore makes sure the store belongs to the stack a resync came from:
// it records that stack's identity, or claims a store that records none,
// unless that store holds blobs and the stack's namespace is empty (they
// are another namespace's). It remembers the stack it checked for, so a
// later resync of the same stack costs nothing.
func (s *Service) checkStore(stack backend.Identity, empty bool) error {
	if c := s.claimed.Load(); c != nil && *c == stack {
		return nil
	}
	what := func(format string, a ...any) error {
		return fmt.Errorf("the %s store belongs to another stack: "+format+
			"; point this IO service at the store of this namespace (io.backend, data_dir, io.spdk_bdev), "+
			"or at a new data_dir for the store it has, or erase the store with `weir format`", append([]any{s.be.Name()}, a...)...)
	}
	id, ok, err := s.be.Identity()
	switch {
	case err != nil:
		return fmt.Errorf("read the store's identity: %w", err)
	case ok && id != stack:
		return what("it records stack %s, and this namespace is stack %s", id, stack)
	case !ok && empty:
		ids, err := s.be.List()
		if err != nil {
			return fmt.Errorf("list the store: %w", err)
		}
		ids = slices.DeleteFunc(ids, func(id backend.BlobID) bool { return id == backend.StagingBlob })
		if len(ids) > 0 {
			return what("it records no stack but holds %d blobs, and this namespace (stack %s) holds no file", len(ids), stack)
		}
		fallthrough
	case !ok:
		if err := s.be.SetIdentity(stack); err != nil {
			return fmt.Errorf("record the store's identity: %w", err)
		}
		s.log.Info("store claimed for this namespace", "stack", stack.String(), "backend", s.be.Name())
	}
	s.claimed.Store(&stack)
	return nil
}

// syncFailed records err, a failed sync, for Health if it is the first.
// EBADF is not a storage failure: the blob or backend closed under the
// caller.
//
// Nor is a descriptor the kernel refused (EMFILE, ENFILE: a sync that
// could not open what it syncs synced nothing, so nothing is known lost):
// the request fails with it, counted in resource_errors.
func (s *Service) syncFailed(err error) {
	if errors.Is(err, syscall.EBADF) {
		return
	}
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		s.resourceRefused(err)
		return
	}
	if s.syncFailure.CompareAndSwap(nil, &err) {
		s.log.Error("sync failed; the service reports itself unhealthy until restarted", "error", err)
	}
}

// Shutdown withdraws the health and stats endpoints, ends every session,
// stops taking control requests, closes the service session, reports the
// live size and mtime of every changed blob to the metadata service, syncs
// and closes the backend.
func (s *Service) Shutdown(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	if s.stg != nil {
		// fsyncs waiting for room (or, in the foreground ablation, for
		// their checkpoint) end now: the sessions' end below waits for
		// them, and the journal service has stopped already.
		s.stg.endWaits()
	}
	if err := s.host.Shutdown(ctx); err != nil {
		// Sessions that did not end in time still have requests running:
		// nothing may be closed under them. Write home what is dirty and
		// not busy, sync, and leave the rest to the process's end.
		if s.pc != nil {
			s.flushAll(false)
		}
		if serr := s.be.Sync(); serr != nil {
			err = errors.Join(err, serr)
		}
		return fmt.Errorf("iosvc: shutdown (requests still running; dirty pages not busy were written home): %w", err)
	}
	s.mu.Lock()
	s.stopping = true // no more background work: bg.Add must not race Wait
	s.mu.Unlock()
	if s.stg != nil {
		// Before the wait: deletes wait in it for the checkpointer, and
		// no pass may run while blobs close below.
		s.stg.halt()
	}
	s.bg.Wait()
	if s.pc != nil {
		close(s.flushStop)
		<-s.flushDone
		s.pc.bg.Wait() // readaheads read blobs closed below
	}
	s.mu.Lock()
	blobs := make([]*openBlob, 0, len(s.blobs))
	for _, ob := range s.blobs {
		blobs = append(blobs, ob)
	}
	s.blobs = map[backend.BlobID]*openBlob{}
	s.grants = map[uint64]map[uint64]*grant{}
	s.mu.Unlock()
	for _, ob := range blobs {
		size, mtime, dv := ob.live()
		if err := s.flushBlob(ob, true); err != nil {
			s.syncFailed(err)
			errs = append(errs, err)
		}
		if err := ob.b.Sync(); err != nil {
			err = fmt.Errorf("sync blob %d: %w", ob.id, err)
			s.syncFailed(err)
			errs = append(errs, err)
		} else if ob.wrote.Load() {
			if err := s.reportLive(ctx, ob.ino, size, mtime, dv, true); err != nil {
				errs = append(errs, err)
			}
		}
		if err := ob.b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close blob %d: %w", ob.id, err))
		}
	}
	s.mu.Lock()
	regions := s.regions
	s.regions = map[backend.BlobID]*region{}
	for s.idle.Len() > 0 {
		s.idle.Remove(s.idle.Front()).(*region).idleAt = nil
	}
	s.mu.Unlock()
	for _, r := range regions {
		r.close()
	}
	if s.stg != nil {
		// A last checkpoint: a clean stop leaves the log empty.
		if err := s.stg.close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("staging log: %w", err))
		}
	}
	if s.peer != nil {
		s.peer.Close()
	}
	if err := s.be.Sync(); err != nil {
		err = fmt.Errorf("sync backend: %w", err)
		s.syncFailed(err)
		errs = append(errs, err)
	}
	if err := s.be.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// live returns the blob's size, mtime and data version, read in an order
// that makes the version no newer than the size: a report carries a size
// at least as new as its version.
func (ob *openBlob) live() (size, mtime int64, dv uint64) {
	dv = ob.dv.Load()
	mtime = ob.mtime.Load()
	size = ob.logical()
	return size, mtime, dv
}

// logical is the file's size (see openBlob.size).
func (ob *openBlob) logical() int64 { return ob.size.Load() }

// extend raises the size to end if it is smaller.
func (ob *openBlob) extend(end int64) {
	for {
		s := ob.size.Load()
		if end <= s || ob.size.CompareAndSwap(s, end) {
			return
		}
	}
}

// touch records a change of the blob; call it after the change. The cache
// region's field group follows.
func (s *Service) touch(ob *openBlob) {
	ob.mtime.Store(time.Now().UnixNano())
	s.changed(ob)
}

// changed is touch without a new mtime: a write window's drain, whose
// stores took their mtime from the ring write that kept the field group
// fresh (windows.go). The data version moves, and the live table and the
// field group follow.
func (s *Service) changed(ob *openBlob) {
	ob.wrote.Store(true)
	ob.dv.Store(s.dv.Add(1))
	if r := ob.cached.Load(); r != nil {
		r.setFields(ob.live)
	}
	if ob.hasLive {
		s.live.PublishFrom(ob.liveSlot, uint64(ob.id), func() (int64, int64, bool) {
			size, mtime, _ := ob.live()
			return size, mtime, ob.wrote.Load()
		})
	}
}

// regionOf returns the blob's cache region, making it at the first call;
// nil when the cache is off or the region could not be made (counted in
// cache_region_failures and logged once: the blob is served uncached).
func (s *Service) regionOf(ob *openBlob) *region {
	if r := ob.cached.Load(); r != nil || s.pc == nil {
		return r
	}
	ob.rmu.Lock()
	defer ob.rmu.Unlock()
	if ob.reg != nil || ob.rfail {
		return ob.reg
	}
	ob.rgate.Lock()
	defer ob.rgate.Unlock()
	r, err := withRelief(s, func() (*region, error) { return s.pc.newRegion(ob.id, ob.ino, ob.logical()) })
	if err != nil {
		ob.rfail = true
		if s.Stats.RegionFailures.Add(1) == 1 {
			s.log.Warn("cannot make a cache region: the file is served without the cache (later failures are counted in cache_region_failures)",
				"blob", ob.id, "error", err)
		}
		return nil
	}
	r.setFields(ob.live)
	s.mu.Lock()
	old := s.regions[ob.id]
	s.regions[ob.id] = r
	ob.reg = r
	ob.cached.Store(r)
	s.mu.Unlock()
	if old != nil {
		// An idle region that openBlobLocked did not take: it would have
		// (nothing else makes one), but never leave two.
		s.mu.Lock()
		s.unidleLocked(old)
		s.mu.Unlock()
		old.close()
	}
	return r
}

// cachedGated returns the blob's region, or nil holding rgate shared until
// unlock is called: no region is made meanwhile.
func (ob *openBlob) cachedGated() (r *region, unlock func()) {
	if r := ob.cached.Load(); r != nil {
		return r, func() {}
	}
	ob.rgate.RLock()
	if r := ob.cached.Load(); r != nil {
		ob.rgate.RUnlock()
		return r, func() {}
	}
	return nil, ob.rgate.RUnlock
}

// holdChanges waits for the writes and truncates of the blob in progress
// and keeps new ones out until unlock: writes without a region hold rgate
// shared, writes and fills with one hold its trunc lock shared (and a
// truncate exclusive), for their whole course. A region, once made, stays
// while the blob is open.
func (ob *openBlob) holdChanges() (unlock func()) {
	ob.rgate.Lock()
	r := ob.cached.Load()
	if r == nil {
		return ob.rgate.Unlock
	}
	ob.rgate.Unlock()
	r.life.RLock()
	r.trunc.Lock()
	return func() {
		r.trunc.Unlock()
		r.life.RUnlock()
	}
}

// idleRegionLocked keeps the region of a blob that closed, and returns
// the idle region pushed out past s.idleRegions (each holds two
// descriptors and two mappings; their pages count against the cache
// size), for the caller to close after it released s.mu. A file whose
// region was pushed out is read from the device again at its next open.
// s.mu is held.
func (s *Service) idleRegionLocked(r *region) *region {
	if s.regions[r.id] != r {
		return nil
	}
	if r.idleAt == nil {
		r.idleAt = s.idle.PushBack(r)
	}
	if s.idle.Len() <= s.idleRegions && !s.spares.short() {
		return nil
	}
	// The oldest with no pinned page: a pinned region is mapped by a
	// client (a read-only MAP_SHARED mapping outlives its grant), whose
	// loads would no longer see the file's writes if it were dropped.
	// Pins are bounded (pins.go), so are the pinned regions kept past the
	// bound.
	for e := s.idle.Front(); e != nil; e = e.Next() {
		old := e.Value.(*region)
		if old.hasPins() {
			continue
		}
		s.idle.Remove(e)
		old.idleAt = nil
		delete(s.regions, old.id)
		return old
	}
	return nil
}

// unidleLocked takes r off the idle list: its blob is open again. s.mu is
// held.
func (s *Service) unidleLocked(r *region) {
	if r.idleAt != nil {
		s.idle.Remove(r.idleAt)
		r.idleAt = nil
	}
}

// dropRegion closes the region of a blob that is not open (being
// deleted).
func (s *Service) dropRegion(id backend.BlobID) {
	s.mu.Lock()
	r := s.regions[id]
	if r != nil {
		delete(s.regions, id)
		s.unidleLocked(r)
	}
	s.mu.Unlock()
	if r != nil {
		r.close()
	}
}

// DropCacheResult is what DropCache did.
type DropCacheResult struct {
	Evicted  int64 `json:"evicted_pages"`
	Resident int64 `json:"resident_pages"` // left: busy in a transition meanwhile
}

// DropCache evicts every clean page that is not busy from every region,
// as drop_caches does the kernel's page cache.
func (s *Service) DropCache() DropCacheResult {
	if s.pc == nil {
		return DropCacheResult{}
	}
	var n int64
	for _, r := range s.allRegions() {
		n += r.dropAll()
	}
	s.pc.Evictions.Add(uint64(n))
	return DropCacheResult{Evicted: n, Resident: s.pc.resident.Load()}
}

// allRegions lists the regions, open and idle.
func (s *Service) allRegions() []*region {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := make([]*region, 0, len(s.regions))
	for _, r := range s.regions {
		rs = append(rs, r)
	}
	return rs
}

// cacheMemory sums the memory the regions hold.
func (s *Service) cacheMemory() int64 {
	var n int64
	for _, r := range s.allRegions() {
		n += r.memoryBytes()
	}
	return n
}

// truncateBlob truncates the blob and drops its cached pages past the new
// size; no fill or write of the region runs meanwhile.
func (s *Service) truncateBlob(ob *openBlob, size int64) error {
	// Stores into write windows before the truncate are changes before
	// it: dirty pages (and changed, for the cut page's record below)
	// first.
	s.drainRegion(ob.cached.Load())
	logged := false
	if ob.sf != nil && size < ob.logical() {
		// A shrink cuts the blob at once: logged first (staged.go
		// logTruncate), outside the region's locks (it may wait for the
		// checkpointer, which takes them), and the cut made durable
		// after, so that replay never finds bytes from before the cut
		// past it (the records before it are clipped there). The file's
		// fsyncs wait from the log to the durable cut: one between
		// would record the size before the cut, and its replay would
		// give the bytes the cut took as zeros
		// (TestFsyncBetweenTruncateLogAndCut).
		// A cut inside a page whose bytes changed since the file's last
		// record (or that went home past the records): that page is
		// recorded first, by an fsync, so that replay, which clips the
		// records before the cut there and zeros the rest of the page,
		// gives the page as the cut left it. Without it, replay gave the
		// page of an older record, cut (TestReplayOfCutsRandom): a page
		// the file never had when writes changed it before the cut.
		// A failure of that fsync's metadata report alone (the name of a
		// new file: the record is durable, the next fsync reports again)
		// is not the truncate's; a failed record is sticky and fails it.
		if size%staging.PageSize != 0 && ob.sf.changedSinceRecord(uint64(size/staging.PageSize)) {
			if e := s.stagedSync(ob); e != 0 && ob.sf.failure() != nil {
				return syscall.EIO
			}
		}
		ob.sf.fsyncMu.Lock()
		defer ob.sf.fsyncMu.Unlock()
		if err := s.logTruncate(ob, size); err != nil {
			return err
		}
		logged = true
		if testAfterTruncateLog != nil {
			testAfterTruncateLog()
		}
	}
	cutDurable := func() error {
		if !logged {
			return nil
		}
		if err := ob.b.Sync(); err != nil {
			err = fmt.Errorf("sync blob %d after a truncate: %w", ob.id, err)
			s.syncFailed(err)
			return err
		}
		return nil
	}
	// A cut that fails once logged is the file's fsync failure (sticky
	// EIO): the log says the file ends at size, and a later fsync
	// recording the old size would have replay clip its bytes there.
	cutFailed := func(err error) error {
		if logged {
			s.stg.failed(ob.sf, err, "truncate: the cut failed after it was logged")
		}
		return err
	}
	r, unlock := ob.cachedGated()
	defer unlock()
	if r != nil {
		r.life.RLock()
		defer r.life.RUnlock()
		r.trunc.Lock()
		defer r.trunc.Unlock()
		old := ob.logical()
		if size > old {
			r.zeroPastEnd(ob.logical)
		}
		if err := ob.b.Truncate(size); err != nil {
			return cutFailed(err)
		}
		ob.truncatedRoom(size)
		r.truncated(size)
		if size > old {
			r.zeroPinnedGap(pageCeil(old), pageCeil(size))
		}
		ob.size.Store(size)
		return cutDurable()
	}
	if err := ob.b.Truncate(size); err != nil {
		return cutFailed(err)
	}
	ob.truncatedRoom(size)
	ob.size.Store(size)
	return cutDurable()
}

// flushBlob writes the blob's dirty pages home (waiting for pages busy
// meanwhile with wait), and makes the backend as long as the file: the
// last dirty pages may lie past what was written (a hole at the end).
// The caller holds a reference.
func (s *Service) flushBlob(ob *openBlob, wait bool) error {
	r := ob.cached.Load()
	if r == nil {
		return nil
	}
	// Write-back may create the blob's file: at the descriptor limit it
	// takes one of io's spares (descriptors.go), so that dirty pages of
	// files closed at the limit still go home and free their descriptors.
	if err := s.ownWork(func() error { _, err := r.flush(ob.b, ob.logical, wait); return err }); err != nil {
		return err
	}
	if !wait {
		return nil
	}
	r.trunc.RLock()
	defer r.trunc.RUnlock()
	if size := ob.logical(); ob.b.Size() < size {
		if err := ob.b.Truncate(size); err != nil {
			return fmt.Errorf("extend blob %d to its size %d: %w", ob.id, size, err)
		}
	}
	return nil
}

// isDirtyHeld reports ob.dirtyHeld.
func (ob *openBlob) isDirtyHeld(s *Service) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ob.dirtyHeld
}

// flushAll writes back every open blob's dirty pages.
func (s *Service) flushAll(wait bool) {
	s.drainAll()
	s.mu.Lock()
	var obs []*openBlob
	for _, ob := range s.blobs {
		if r := ob.cached.Load(); r != nil && (r.hasDirty() || ob.dirtyHeld) {
			ob.refs++
			obs = append(obs, ob)
		}
	}
	s.mu.Unlock()
	for _, ob := range obs {
		err := s.flushBlob(ob, wait || ob.isDirtyHeld(s))
		if err != nil {
			s.log.Warn("write-back failed: the pages stay dirty and are tried again", "blob", ob.id, "error", err)
		}
		s.mu.Lock()
		if err == nil && ob.dirtyHeld && !ob.reg.hasDirty() {
			ob.dirtyHeld = false // the close's reference, held for the dirt
			ob.refs--
		}
		s.mu.Unlock()
		s.releaseBlob(ob)
	}
}

// syncAll makes every blob with changes durable, as syncBlob does one: the
// open blobs written since they were opened here, and those whose last
// close left dirty pages. It goes on past a blob that fails and answers
// the first error. uid asked for it (its share of the staging log binds
// the records).
func (s *Service) syncAll(uid uint32) syscall.Errno {
	s.syncFSMu.Lock()
	defer s.syncFSMu.Unlock()
	if sa, ok := s.be.(backend.SyncAller); ok && !s.allSynced {
		if err := sa.SyncAll(); err != nil {
			s.syncFailed(fmt.Errorf("syncfs: %w", err))
			return errno(err)
		}
		s.allSynced = true
	}
	s.drainAll()
	s.mu.Lock()
	var obs []*openBlob
	for _, ob := range s.blobs {
		if r := ob.cached.Load(); ob.wrote.Load() || ob.dirtyHeld || (r != nil && r.hasDirty()) {
			ob.refs++
			obs = append(obs, ob)
		}
	}
	s.mu.Unlock()
	first := s.syncClosed()
	for _, ob := range obs {
		e := s.syncBlobAs(ob, uid)
		if e == errFileGone {
			e = 0 // closed and removed since: nothing to keep
		}
		if e != 0 && first == 0 {
			first = e
		}
		s.mu.Lock()
		if e == 0 && ob.dirtyHeld && !ob.reg.hasDirty() {
			ob.dirtyHeld = false // the close's reference, held for the dirt
			ob.refs--
		}
		s.mu.Unlock()
		s.releaseBlob(ob)
	}
	return first
}

// maxUnsynced bounds Service.unsynced: past it, the last close of a
// changed blob starts syncClosed in the background (one at a time), so
// that a store whose files are written and closed and never synced keeps
// a bounded list, at the cost of a device flush per file then.
var maxUnsynced atomic.Int64 // 8192 (init); tests lower it

func init() { maxUnsynced.Store(8192) }

// syncClosedInBackground runs syncClosed until the list is within its
// bound (closes go on meanwhile) or a pass fails; s.bg counts it.
func (s *Service) syncClosedInBackground() {
	defer s.bg.Done()
	defer s.syncingClosed.Store(false)
	for {
		s.syncFSMu.Lock() // a pass at a time: a syncfs may come between two
		e := s.syncClosed()
		s.syncFSMu.Unlock()
		if e != 0 {
			s.syncClosedFailed.Store(time.Now().UnixNano())
			s.log.Warn("background sync of closed files failed; they stay listed for the next syncfs", "error", e, "retry_after", syncClosedBackoff)
			return
		}
		s.mu.Lock()
		again := int64(len(s.unsynced)) > maxUnsynced.Load() && !s.stopping
		s.mu.Unlock()
		if !again {
			return
		}
	}
}

// syncClosedBackoff is how long after a failed background pass no other
// starts (a failing device or an unreachable metadata service would
// otherwise cost a pass at every close).
const syncClosedBackoff = 10 * time.Second

// syncClosed syncs the blobs closed here after a change (Service.unsynced:
// their bytes are home, not synced), one at a time, each opened again for
// it (a blob open again meanwhile is synced too, whatever it did since): the
// first error, after trying them all; those that failed stay listed, and
// so do those left when the service stops. A blob deleted since is dropped
// (onDelete takes it off the list; one found missing here is gone too).
// s.syncFSMu is held.
func (s *Service) syncClosed() syscall.Errno {
	type entry struct {
		id  backend.BlobID
		ino uint64
	}
	s.mu.Lock()
	list := make([]entry, 0, len(s.unsynced))
	for id, ino := range s.unsynced {
		list = append(list, entry{id, ino})
	}
	s.mu.Unlock()
	relist := func(en entry) {
		s.mu.Lock()
		s.unsynced[en.id] = en.ino
		s.mu.Unlock()
	}
	var first syscall.Errno
	for _, en := range list {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			if first == 0 {
				first = syscall.EIO // not all synced: those left stay listed
			}
			return first
		}
		if _, ok := s.unsynced[en.id]; !ok {
			s.mu.Unlock()
			continue // deleted meanwhile
		}
		delete(s.unsynced, en.id)
		if _, del := s.deleting[en.id]; del {
			s.mu.Unlock()
			continue
		}
		ob, err := s.openBlobLocked(en.id, en.ino, false)
		s.mu.Unlock()
		if err != nil {
			relist(en)
			if first == 0 {
				first = errno(err)
			}
			continue
		}
		if lb, ok := ob.b.(*lazyBlob); ok && lb.b.Load() == nil {
			s.releaseBlob(ob) // the blob is gone (deleted): nothing to sync
			continue
		}
		if e := s.closedSync(ob); e != 0 {
			relist(en)
			if first == 0 {
				first = e
			}
		}
		s.releaseBlob(ob)
	}
	return first
}

// closedSync is syncBlob of a blob closed with changes and opened again
// by syncAll: with the staging log, its changes not yet in a record (the
// staging state outlives the close) make one, as an fsync's, and its
// bytes home and its create are synced (without it, syncBlob did that);
// then its size at metadata is made durable (syncBlob reports only what
// was written since the blob was opened, here nothing).
func (s *Service) closedSync(ob *openBlob) syscall.Errno {
	// The size and mtime before the sync: writes racing it may not be
	// durable, and the size reported must not cover them.
	size, mtime, dv := ob.live()
	e := s.syncBlob(ob)
	if e == 0 && ob.sf != nil {
		if err := s.syncHome(ob); err != nil {
			e = errno(err)
		}
	}
	if e == 0 {
		if err := s.reportLive(context.Background(), ob.ino, size, mtime, dv, true); err != nil {
			e = reportErrno(err)
		}
	}
	if e == errFileGone {
		return 0 // removed since: nothing to keep
	}
	return e
}

// The flusher writes back what is dirty every flushInterval (a write
// reaches home within about this, unless fsync asks sooner), and as soon
// as half the dirty limit is reached; every scrubInterval it scrubs the
// regions (ScrubCache).
const (
	flushInterval = 5 * time.Second
	scrubInterval = time.Second
)

// flusher writes dirty pages home in the background until stop closes.
func (s *Service) flusher(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(scrubInterval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.ScrubCache()
			if time.Since(last) < flushInterval {
				continue
			}
		case <-s.pc.kick:
		}
		last = time.Now()
		s.flushAll(false)
		s.spares.fill()
	}
}

// ScrubCache frees the memory the regions hold past their resident pages
// (pages clients faulted in by reading their mappings where nothing is
// cached) and returns the bytes freed. The flusher runs it every second.
func (s *Service) ScrubCache() int64 {
	if s.pc == nil {
		return 0
	}
	var n int64
	for _, r := range s.allRegions() {
		n += r.scrub()
	}
	return n
}

// metaLink follows the service session with the metadata service: while
// it is up, requests to metadata carry a context that is cancelled the
// moment it ends, so a request in flight to a metadata service that died
// fails at once instead of waiting out its timeout; while it is down they
// fail at once. One exception: a resync that arrives (on NATS) before the
// service session that prompted it is up shows that metadata is alive,
// so until the session is up requests wait for it (within their
// deadline) rather than fail. (Without a service session,
// Options.MetadataSocket "", requests just carry their timeout.)
type metaLink struct {
	mu     sync.Mutex
	used   bool               // a service session is configured; protected by mu
	up     bool               // protected by mu
	expect time.Time          // down, but a resync came since it went down: wait until then; protected by mu
	upc    chan struct{}      // closed while up; protected by mu
	ctx    context.Context    // protected by mu
	cancel context.CancelFunc // protected by mu
}

func (l *metaLink) init() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.used = true
	l.upc = make(chan struct{})
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.cancel()
}

func (l *metaLink) set(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel()
	if up == l.up {
		if up {
			l.ctx, l.cancel = context.WithCancel(context.Background())
		}
		return
	}
	l.up, l.expect = up, time.Time{}
	if up {
		l.ctx, l.cancel = context.WithCancel(context.Background())
		close(l.upc)
	} else {
		l.upc = make(chan struct{})
	}
}

// resynced notes a resync: if the service session is not up yet, it is
// about to be, within wait (past that, requests fail at once again).
func (l *metaLink) resynced(wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.used && !l.up {
		l.expect = time.Now().Add(wait)
	}
}

// upChan is closed once the service session is up.
func (l *metaLink) upChan() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.upc
}

// errMetadataDown is the cause of a request to metadata made while its
// service session is down.
var errMetadataDown = errors.New("the metadata service is not connected")

// context returns the context of a request to metadata, or errMetadataDown;
// it waits for a session that is expected (see metaLink) until ctx is done.
func (l *metaLink) context(ctx context.Context) (context.Context, error) {
	l.mu.Lock()
	if !l.used {
		l.mu.Unlock()
		return context.Background(), nil
	}
	if l.up {
		defer l.mu.Unlock()
		return l.ctx, nil
	}
	expect, upc := l.expect, l.upc
	l.mu.Unlock()
	wait := time.Until(expect)
	if wait <= 0 {
		return nil, errMetadataDown
	}
	select {
	case <-upc:
		return l.context(ctx)
	case <-ctx.Done():
		return nil, fmt.Errorf("%w (waited for its service session: %w)", errMetadataDown, ctx.Err())
	case <-time.After(wait):
		return nil, fmt.Errorf("%w (its service session did not come up after the resync)", errMetadataDown)
	}
}

// request sends a control request to the metadata service (see metaLink).
func (s *Service) request(ctx context.Context, subj string, msg any, reply interface{ Err() error }) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	lctx, err := s.meta.context(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	stop := context.AfterFunc(lctx, cancel)
	defer stop()
	return s.host.Request(ctx, subj, msg, reply)
}

// reportLive tells the metadata service a file's size and mtime at data
// version dv; with sync, metadata makes them durable before it answers.
func (s *Service) reportLive(ctx context.Context, ino uint64, size, mtime int64, dv uint64, sync bool) error {
	var ack control.Ack
	msg := control.SetLive{Ino: ino, Size: size, Mtime: mtime, DV: dv, Sync: sync}
	if err := s.request(ctx, s.subj.SetLive, msg, &ack); err != nil {
		return fmt.Errorf("report size of file %d: %w", ino, err)
	}
	return nil
}

// openBlob returns the open blob for id, opening it if need be, with one
// reference for the caller. A blob that does not exist yet is created on
// its first write (lazyBlob). s.mu is held; should the kernel refuse a
// descriptor, it is released and taken again once (while idle
// descriptors go back): a caller checks again after the call what it
// checked under s.mu before.
func (s *Service) openBlobLocked(id backend.BlobID, ino uint64, fresh bool) (*openBlob, error) {
	if ob := s.blobs[id]; ob != nil {
		// Open for this very file (an earlier grant of it, e.g. one that
		// timed out at metadata after io applied it), the blob is the
		// file's own; open for another inode, it is not.
		if fresh && ob.ino != ino {
			return nil, fmt.Errorf("blob %d of new file %d is open already for inode %d: %w", id, ino, ob.ino, errAdoption)
		}
		ob.refs++
		return ob, nil
	}
	if _, ok := s.deleting[id]; ok {
		return nil, fmt.Errorf("open blob %d: it is being deleted: %w", id, syscall.EBUSY)
	}
	var b backend.Blob
	b, err := s.be.Open(id)
	if err != nil && isResourceErr(err) {
		// No descriptor left: every idle region and idle blob file goes
		// back, and one more try. Regions close without s.mu (their
		// close waits for requests that hold them), so it is dropped
		// meanwhile: what the blob's state was may have changed.
		s.resourceRefused(err)
		s.mu.Unlock()
		relieved := s.relieve()
		s.mu.Lock()
		if ob := s.blobs[id]; ob != nil {
			return s.openBlobLocked(id, ino, fresh) // opened meanwhile
		}
		if _, ok := s.deleting[id]; ok {
			return nil, fmt.Errorf("open blob %d: it is being deleted: %w", id, syscall.EBUSY)
		}
		if relieved {
			b, err = s.be.Open(id)
		}
	}
	if err == nil && fresh {
		b.Close()
		return nil, fmt.Errorf("blob %d of a new file exists already (a blob of another namespace, or a bug): %w", id, errAdoption)
	}
	if errors.Is(err, syscall.ENOENT) {
		b, err = &lazyBlob{be: s.be, creates: &s.creates, id: id, adopted: s.adoptionRefused}, nil // created on first write
	}
	if err != nil {
		return nil, fmt.Errorf("open blob %d: %w", id, err)
	}
	ob := &openBlob{id: id, ino: ino, b: b, refs: 1}
	if s.stg != nil {
		s.stg.attach(ob, fresh)
	}
	ob.size.Store(b.Size())
	ob.dv.Store(s.dv.Add(1)) // newer than any report of this blob so far
	if s.live != nil {
		ob.liveSlot, ob.hasLive = s.live.Take(uint64(id), ob.logical(), 0, false)
	}
	if r := s.regions[id]; r != nil {
		// Cached from when it was open before: nothing changed the blob
		// since (every change goes through an open blob; a delete drops
		// the region).
		s.unidleLocked(r)
		ob.reg = r
		ob.cached.Store(r)
		r.setFields(ob.live)
	}
	s.blobs[id] = ob
	return ob, nil
}

// adoptionRefused counts (and logs the first) refusal to serve an existing
// blob as a new file's.
func (s *Service) adoptionRefused(id backend.BlobID, err error) {
	if s.Stats.AdoptionsRefused.Add(1) == 1 {
		s.log.Error("a new file's blob exists already: refused to serve it as the new file's data", "blob", id, "error", err)
	}
}

// releaseBlob drops a reference; the last one closes the blob.
func (s *Service) releaseBlob(ob *openBlob) {
	s.mu.Lock()
	// The last reference writes the blob's dirty pages home first (with
	// the reference held, so the blob stays open for it): a closed blob's
	// region keeps clean pages only. If that fails, the reference stays,
	// held by the dirty pages (ob.dirtyHeld): the blob stays open and the
	// flusher tries again, and drops it once they are home.
	if ob.dirtyHeld && ob.refs == 2 && !ob.reg.hasDirty() {
		ob.dirtyHeld = false // clean now (an fsync, a truncate): the hold goes
		ob.refs--
	}
	for tries := 0; ob.refs == 1 && ob.reg != nil && ob.reg.hasDirty(); tries++ {
		s.mu.Unlock()
		err := s.flushBlob(ob, true)
		s.mu.Lock()
		if err == nil && tries < 3 {
			continue // written (and maybe dirtied again meanwhile): look again
		}
		if !ob.dirtyHeld {
			ob.dirtyHeld = true
			if err == nil {
				err = errors.New("dirtied again as fast as it was written")
			}
			// Logged at the first and at each power of two after: at the
			// descriptor limit every close of a written file lands here.
			if n := s.Stats.CloseWritebackFailures.Add(1); n&(n-1) == 0 {
				s.log.Error("write-back at close did not finish: the blob stays open, its dirty pages in the cache, and the flusher tries again", "blob", ob.id, "error", err, "count", n)
			}
		}
		s.mu.Unlock()
		return
	}
	ob.refs--
	last := ob.refs == 0
	if last {
		delete(s.blobs, ob.id)
		if ob.wrote.Load() {
			s.unsynced[ob.id] = ob.ino
			if int64(len(s.unsynced)) > maxUnsynced.Load() && !s.stopping &&
				time.Since(time.Unix(0, s.syncClosedFailed.Load())) > syncClosedBackoff && s.syncingClosed.CompareAndSwap(false, true) {
				s.bg.Add(1) // as s.background does (which takes s.mu, held here)
				go s.syncClosedInBackground()
			}
		}
		if ob.hasLive {
			s.live.Release(ob.liveSlot, uint64(ob.id))
		}
	}
	var drop *region
	if last && ob.reg != nil {
		drop = s.idleRegionLocked(ob.reg)
	}
	s.mu.Unlock()
	if drop != nil {
		drop.close()
	}
	if last {
		s.trimRoom(ob)
		if err := ob.b.Close(); err != nil {
			s.log.Warn("close blob", "blob", ob.id, "error", err)
		}
		if s.spares.short() {
			// At the descriptor limit: nothing is kept idle until the
			// spares are back.
			if k, ok := s.be.(backend.IdleKeeper); ok {
				k.DropIdle(1 << 30)
			}
			s.spares.fill()
		}
		if ob.sf != nil {
			s.stg.detach(ob.sf)
		}
	}
}

// lookup returns the grant of a session's handle, active (and its blob
// referenced) for one request: call done when the request is over.
func (s *Service) lookup(sid, handle uint64) *grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.grants[sid][handle]
	if g != nil {
		g.active++
		g.used = true
		g.blob.refs++
	}
	return g
}

// done ends a request that lookup started.
func (s *Service) done(g *grant) {
	s.mu.Lock()
	g.active--
	if g.revoked && g.active == 0 {
		close(g.drained)
	}
	s.mu.Unlock()
	s.releaseBlob(g.blob)
}

// revokeLocked takes g out of service: new requests no longer find it,
// and g.drained closes once the active ones are done. s.mu is held.
func (g *grant) revokeLocked() {
	if g.revoked {
		return
	}
	g.revoked = true
	if g.write {
		g.blob.writers--
	}
	if g.dirOpens != nil {
		*g.dirOpens--
		delete(g.blob.direct, g)
	}
	if g.active == 0 {
		close(g.drained)
	}
}
