package file

import (
	"bytes"
	"container/list"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	hclog "github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/services/io/backend"
)

// formatV1 is the content of blobs/FORMAT for this layout.
const formatV1 = "weir-blobs 1\n"

// DirectMode says whether blob files are opened with O_DIRECT.
type DirectMode int

const (
	// DirectAuto uses O_DIRECT when the file system accepts it and falls
	// back to buffered I/O when it refuses or is tmpfs. The default.
	DirectAuto DirectMode = iota
	// DirectOn requires O_DIRECT: New fails if the file system refuses it.
	DirectOn
	// DirectOff always uses buffered I/O.
	DirectOff
)

// String returns "auto", "on" or "off".
func (m DirectMode) String() string {
	switch m {
	case DirectAuto:
		return "auto"
	case DirectOn:
		return "on"
	case DirectOff:
		return "off"
	}
	return "DirectMode(" + strconv.Itoa(int(m)) + ")"
}

// Options configures New.
type Options struct {
	// Dir is the data directory; the backend keeps its blobs in Dir/blobs,
	// creating it if needed.
	Dir string
	// Direct chooses O_DIRECT or buffered I/O; the zero value is DirectAuto.
	Direct DirectMode
	// Logger receives the backend's few messages (the I/O mode chosen,
	// stray files seen by List). Nil discards them.
	Logger hclog.Logger

	// ReadOnly opens the blobs of a stopped service for an offline check:
	// nothing is created or written (no directory, FORMAT file or probe),
	// blob files open read-only and every change fails with EROFS. The
	// lock is still taken, so a check refuses to run beside a live
	// service.
	ReadOnly bool

	// refuseDirect makes the O_DIRECT probe fail with EINVAL, as on a file
	// system without direct I/O. Tests only (export_test.go).
	refuseDirect bool
}

// Stats are the backend's counters since New.
type Stats struct {
	// Direct is true when blob files use O_DIRECT (all but the staging
	// log's, which is written through the page cache).
	Direct bool
	// EdgeReads counts partial edge blocks read for a read-modify-write.
	EdgeReads uint64
	// EdgeWrites counts partial edge blocks written (after a read, or
	// zero-filled when the block lay at or past the end of the blob).
	EdgeWrites uint64
	// DirectReads and DirectWrites count O_DIRECT transfers made straight
	// from or into the caller's memory, without a bounce buffer (the
	// range and the memory were both block aligned).
	DirectReads, DirectWrites uint64
	// SyncErrors counts failed blob and directory syncs.
	SyncErrors uint64
	// OpenBlobs is the number of blobs with at least one open handle,
	// IdleBlobs of those kept open with none (Backend.idle).
	OpenBlobs, IdleBlobs int
}

// Backend stores each blob in its own file. Use New; the Backend returned
// by New is a *Backend, for Mode and Stats.
type Backend struct {
	root     string       // Dir/blobs; immutable
	direct   bool         // O_DIRECT in use; immutable after New
	readOnly bool         // immutable after New
	log      hclog.Logger // immutable

	mu     sync.Mutex
	closed atomic.Bool                  // written under mu, read anywhere
	lockFD int                          // holds the flock on LOCK; protected by mu
	open   map[backend.BlobID]*blobFile // blobs with open handles, and the idle ones; protected by mu
	// idle are the blobs whose last handle closed, kept open (least
	// recently closed first; each blobFile's idleAt is its element), so
	// that opening one again costs no system call, as the kernel's inode
	// cache saves a lookup: a cold open of a file written a moment ago
	// paid 6 µs p50 for open(2) and fstat(2) here. At most idleLimit
	// (maxIdleFiles unless SetIdleLimit said otherwise); both protected by
	// mu.
	idle      list.List
	idleLimit int
	failed    map[backend.BlobID]error // sticky blob sync errors; protected by mu
	dirty     map[string]struct{}      // directories to fsync at Sync; protected by mu

	syncMu  sync.Mutex // serialises Sync
	syncErr error      // sticky directory sync error; protected by syncMu

	edgeReads    atomic.Uint64
	edgeWrites   atomic.Uint64
	directReads  atomic.Uint64
	directWrites atomic.Uint64
	syncErrors   atomic.Uint64

	// syncHook, when set, runs before each blob sync's system call; an
	// error it returns is the sync's result. Tests only.
	syncHook atomic.Pointer[func(backend.BlobID) error]
}

var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.IdleKeeper = (*Backend)(nil)
)

// New opens (creating if needed) the blob store under opts.Dir.
func New(opts Options) (backend.Backend, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("backend file: no directory: %w", syscall.EINVAL)
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	root := filepath.Join(opts.Dir, "blobs")
	if opts.ReadOnly {
		return openReadOnly(root, log)
	}
	if err := makeDir(root); err != nil {
		return nil, fmt.Errorf("backend file: %w", err)
	}
	lockFD, err := openFile(filepath.Join(root, "LOCK"), unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		return nil, fmt.Errorf("backend file: lock %s: %w", root, err)
	}
	if err := unix.Flock(lockFD, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(lockFD)
		if err == unix.EWOULDBLOCK {
			err = syscall.EBUSY
		}
		return nil, fmt.Errorf("backend file: %s is in use by another backend: %w", root, err)
	}
	fail := func(err error) (backend.Backend, error) {
		unix.Close(lockFD)
		return nil, fmt.Errorf("backend file: %w", err)
	}
	if err := checkFormat(root); err != nil {
		return fail(err)
	}
	direct := false
	switch opts.Direct {
	case DirectOff:
	case DirectAuto, DirectOn:
		ok, why, err := probeDirect(root, opts.Direct == DirectAuto, opts.refuseDirect)
		if err != nil {
			return fail(err)
		}
		if !ok && opts.Direct == DirectOn {
			return fail(fmt.Errorf("O_DIRECT required but unusable in %s (%s): %w", root, why, syscall.EINVAL))
		}
		if !ok {
			log.Info("O_DIRECT not used, falling back to buffered I/O", "dir", root, "reason", why)
		}
		direct = ok
	default:
		return fail(fmt.Errorf("unknown direct mode %d: %w", opts.Direct, syscall.EINVAL))
	}
	log.Info("file backend ready", "dir", root, "direct", direct)
	return &Backend{
		root:   root,
		direct: direct,
		log:    log,
		lockFD: lockFD,
		open:   make(map[backend.BlobID]*blobFile),
		// SetIdleLimit changes it (the IO service's descriptor budget).
		idleLimit: maxIdleFiles,
		failed:    make(map[backend.BlobID]error),
		dirty:     make(map[string]struct{}),
	}, nil
}

// openReadOnly opens root for reading only (Options.ReadOnly).
func openReadOnly(root string, log hclog.Logger) (backend.Backend, error) {
	lockFD, err := openFile(filepath.Join(root, "LOCK"), unix.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("backend file: read-only: %s holds no blobs (no LOCK file): %w", root, err)
	}
	if err := unix.Flock(lockFD, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(lockFD)
		if err == unix.EWOULDBLOCK {
			err = syscall.EBUSY
		}
		return nil, fmt.Errorf("backend file: %s is in use by another backend: %w", root, err)
	}
	path := filepath.Join(root, "FORMAT")
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, []byte(formatV1)) {
		unix.Close(lockFD)
		if err == nil {
			err = fmt.Errorf("unsupported format %q (want %q): %w", got, formatV1, syscall.EINVAL)
		}
		return nil, fmt.Errorf("backend file: %s: %w", path, err)
	}
	log.Debug("file backend open read-only", "dir", root)
	return &Backend{root: root, readOnly: true, log: log, lockFD: lockFD, idleLimit: maxIdleFiles,
		open: make(map[backend.BlobID]*blobFile), failed: make(map[backend.BlobID]error), dirty: make(map[string]struct{})}, nil
}

// errReadOnly fails every change of a read-only backend.
var errReadOnly = syscall.EROFS

// makeDir creates dir (and its parents) if missing, and makes a new dir
// durable in its parent.
func makeDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	_, err := fsyncDir(filepath.Dir(dir))
	return err
}

// checkFormat writes blobs/FORMAT on first use and checks it afterwards.
// First use means a directory that is provably empty: a blob directory
// without FORMAT but with anything else in it (blobs of an older layout,
// files someone put there, a FORMAT lost by hand) is refused, not
// formatted over; so is a FORMAT that cannot be read.
func checkFormat(root string) error {
	path := filepath.Join(root, "FORMAT")
	got, err := os.ReadFile(path)
	if err == nil {
		if !bytes.Equal(got, []byte(formatV1)) {
			return fmt.Errorf("%s: unsupported format %q (want %q): %w", path, got, formatV1, syscall.EINVAL)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	for _, e := range ents {
		switch e.Name() {
		case "LOCK", "FORMAT.tmp":
			continue
		}
		return fmt.Errorf("%s has no FORMAT file but holds %q: not an empty directory, so not formatted; "+
			"if it is weir's and FORMAT was lost, restore it (%q), else point data_dir elsewhere: %w", root, e.Name(), formatV1, syscall.EEXIST)
	}
	return writeDurable(root, "FORMAT", []byte(formatV1))
}

// writeDurable writes data as root/name, atomically (a temporary file,
// synced, renamed over it) and durably (the directory synced).
func writeDurable(root, name string, data []byte) error {
	path := filepath.Join(root, name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	fd, err := openFile(tmp, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	err = fsync(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	_, err = fsyncDir(root)
	return err
}

// identityFile holds the identity of the stack the blobs belong to:
// "weir-stack <uuid>\n".
const identityFile = "IDENTITY"

// Identity reads blobs/IDENTITY; ok is false while there is none.
func (be *Backend) Identity() (backend.Identity, bool, error) {
	if be.closed.Load() {
		return backend.Identity{}, false, fmt.Errorf("backend file: identity: %w", syscall.EBADF)
	}
	path := filepath.Join(be.root, identityFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return backend.Identity{}, false, nil
	}
	if err != nil {
		return backend.Identity{}, false, fmt.Errorf("backend file: read %s: %w", path, err)
	}
	s, ok := strings.CutPrefix(string(b), "weir-stack ")
	s, nl := strings.CutSuffix(s, "\n")
	id, err := backend.ParseIdentity(s)
	if !ok || !nl || err != nil {
		return backend.Identity{}, false, fmt.Errorf("backend file: %s holds %q, not \"weir-stack <uuid>\": %w", path, b, syscall.EINVAL)
	}
	return id, true, nil
}

// SetIdentity writes blobs/IDENTITY, durably; EEXIST if it names another
// stack.
func (be *Backend) SetIdentity(id backend.Identity) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.readOnly {
		return fmt.Errorf("backend file: set identity: %w", errReadOnly)
	}
	cur, ok, err := be.Identity()
	switch {
	case err != nil:
		return err
	case ok && cur == id:
		return nil
	case ok:
		return fmt.Errorf("backend file: set identity %s: %s belongs to stack %s: %w", id, be.root, cur, syscall.EEXIST)
	}
	if err := writeDurable(be.root, identityFile, []byte("weir-stack "+id.String()+"\n")); err != nil {
		return fmt.Errorf("backend file: set identity: %w", err)
	}
	return nil
}

// probeDirect decides whether blob files under root can use O_DIRECT. why
// explains a refusal; err is for failures that are not a refusal.
func probeDirect(root string, auto, refuse bool) (ok bool, why string, err error) {
	if auto {
		var fs unix.Statfs_t
		if err := unix.Statfs(root, &fs); err != nil {
			return false, "", fmt.Errorf("statfs %s: %w", root, err)
		}
		if fs.Type == unix.TMPFS_MAGIC {
			return false, "tmpfs: the page cache is the medium", nil
		}
	}
	path := filepath.Join(root, ".direct-probe")
	fd, err := openFile(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o600)
	if err != nil {
		return false, "", fmt.Errorf("direct I/O probe: %w", err)
	}
	unix.Close(fd)
	defer os.Remove(path)

	if refuse {
		fd, err = -1, unix.EINVAL
	} else {
		fd, err = openFile(path, unix.O_RDWR|unix.O_DIRECT, 0)
	}
	if refused(err) {
		return false, "open with O_DIRECT: " + err.Error(), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("direct I/O probe: %w", err)
	}
	defer unix.Close(fd)

	var stx unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx) == nil && stx.Mask&unix.STATX_DIOALIGN != 0 {
		switch {
		case stx.Dio_offset_align == 0:
			return false, "statx: no direct I/O on this file", nil
		case stx.Dio_offset_align > blockSize || stx.Dio_mem_align > blockSize:
			return false, fmt.Sprintf("statx: direct I/O needs %d-byte offsets and %d-byte buffers, more than %d",
				stx.Dio_offset_align, stx.Dio_mem_align, blockSize), nil
		}
	}
	buf := alignedBuf(blockSize, blockSize)
	if _, err := pwriteFull(fd, buf, 0); err != nil {
		if refused(err) {
			return false, "aligned O_DIRECT write: " + err.Error(), nil
		}
		return false, "", fmt.Errorf("direct I/O probe: %w", err)
	}
	if _, err := preadFull(fd, buf, 0, true); err != nil {
		if refused(err) {
			return false, "aligned O_DIRECT read: " + err.Error(), nil
		}
		return false, "", fmt.Errorf("direct I/O probe: %w", err)
	}
	return true, "", nil
}

// refused reports whether err is how a file system says no to O_DIRECT.
func refused(err error) bool { return err == unix.EINVAL || err == unix.EOPNOTSUPP }

// Name returns "file".
func (be *Backend) Name() string { return "file" }

// Mode returns DirectOn when blob files use O_DIRECT, DirectOff otherwise.
func (be *Backend) Mode() DirectMode {
	if be.direct {
		return DirectOn
	}
	return DirectOff
}

var _ backend.Reporter = (*Backend)(nil)

// Counters reports Stats for the IO service's stats.
func (be *Backend) Counters() map[string]uint64 {
	st := be.Stats()
	return map[string]uint64{"file_edge_reads": st.EdgeReads, "file_edge_writes": st.EdgeWrites,
		"file_direct_reads": st.DirectReads, "file_direct_writes": st.DirectWrites, "file_sync_errors": st.SyncErrors}
}

// Stats returns the backend's counters.
func (be *Backend) Stats() Stats {
	be.mu.Lock()
	open, idle := len(be.open)-be.idle.Len(), be.idle.Len()
	be.mu.Unlock()
	return Stats{
		Direct:       be.direct,
		EdgeReads:    be.edgeReads.Load(),
		EdgeWrites:   be.edgeWrites.Load(),
		DirectReads:  be.directReads.Load(),
		DirectWrites: be.directWrites.Load(),
		SyncErrors:   be.syncErrors.Load(),
		OpenBlobs:    open,
		IdleBlobs:    idle,
	}
}

// fanout returns the directory of blob id.
func (be *Backend) fanout(id backend.BlobID) string {
	return filepath.Join(be.root, fmt.Sprintf("%02x", uint8(id)))
}

// path returns the file of blob id.
func (be *Backend) path(id backend.BlobID) string {
	return filepath.Join(be.fanout(id), fmt.Sprintf("%016x", uint64(id)))
}

func errorf(op string, id backend.BlobID, err error) error {
	return fmt.Errorf("backend file: %s blob %d: %w", op, id, err)
}

// Create makes an empty file for blob id; it is durable after Sync.
func (be *Backend) Create(id backend.BlobID) error {
	if err := backend.CheckID(id); err != nil {
		return errorf("create", id, err)
	}
	if be.closed.Load() {
		return errorf("create", id, syscall.EBADF)
	}
	if be.readOnly {
		return errorf("create", id, errReadOnly)
	}
	dir, path := be.fanout(id), be.path(id)
	newDir := false
	fd, err := openFile(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err == unix.ENOENT {
		switch err = unix.Mkdir(dir, 0o700); err {
		case nil:
			newDir = true
		case unix.EEXIST:
		default:
			return errorf("create", id, fmt.Errorf("mkdir %s: %w", dir, err))
		}
		fd, err = openFile(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
	}
	if err != nil {
		return errorf("create", id, err)
	}
	unix.Close(fd)
	be.mu.Lock()
	be.dirty[dir] = struct{}{}
	if newDir {
		be.dirty[be.root] = struct{}{}
	}
	be.mu.Unlock()
	return nil
}

// Open returns a handle to blob id. Handles of one blob share one file
// descriptor, its size and its edge-block locks.
func (be *Backend) Open(id backend.BlobID) (backend.Blob, error) {
	if err := backend.CheckID(id); err != nil {
		return nil, errorf("open", id, err)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed.Load() {
		return nil, errorf("open", id, syscall.EBADF)
	}
	if b := be.open[id]; b != nil {
		if b.idleAt != nil {
			be.idle.Remove(b.idleAt)
			b.idleAt = nil
		}
		b.refs++
		return &handle{b: b}, nil
	}
	flags := unix.O_RDWR
	if be.readOnly {
		flags = unix.O_RDONLY
	}
	direct := be.direct && id != backend.StagingBlob // blobFile.direct says why
	if direct {
		flags |= unix.O_DIRECT
	}
	fd, err := openFile(be.path(id), flags, 0)
	if err != nil {
		return nil, errorf("open", id, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, errorf("open", id, err)
	}
	b := &blobFile{be: be, id: id, direct: direct, fd: fd, tailFD: -1, dsyncFD: -1, refs: 1, syncErr: be.failed[id]}
	b.size.Store(st.Size)
	be.open[id] = b
	return &handle{b: b}, nil
}

// maxIdleFiles bounds the blobs kept open with no handle (Backend.idle)
// unless SetIdleLimit says otherwise (the IO service does, from its
// descriptor budget): an eighth of the descriptors the process may open,
// within [64, 4096].
var maxIdleFiles = func() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 64
	}
	return int(min(max(rl.Cur/8, 64), 4096))
}()

// keepIdleLocked keeps b, whose last handle closed, open in the idle
// list, and closes the least recently kept past the limit. be.mu is held.
func (be *Backend) keepIdleLocked(b *blobFile) error {
	b.idleAt = be.idle.PushBack(b)
	be.trimIdleLocked(be.idleLimit)
	return nil
}

// trimIdleLocked closes the least recently kept idle blobs until at most
// limit are left, and returns how many it closed. be.mu is held.
func (be *Backend) trimIdleLocked(limit int) int {
	n := 0
	for be.idle.Len() > max(limit, 0) {
		old := be.idle.Front().Value.(*blobFile)
		if err := be.dropIdleLocked(old); err != nil {
			be.log.Warn("close of an idle blob failed", "blob", old.id, "error", err)
		}
		n++
	}
	return n
}

// SetIdleLimit bounds the blobs kept open without a handle
// (backend.IdleKeeper); those past it close now.
func (be *Backend) SetIdleLimit(n int) {
	be.mu.Lock()
	defer be.mu.Unlock()
	be.idleLimit = max(n, 0)
	be.trimIdleLocked(be.idleLimit)
}

// DropIdle closes up to n blobs kept open without a handle, least recently
// kept first (backend.IdleKeeper): the IO service gives descriptors back
// under pressure.
func (be *Backend) DropIdle(n int) int {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.trimIdleLocked(be.idle.Len() - n)
}

// dropIdleLocked forgets idle blob b and closes its file. be.mu is held.
func (be *Backend) dropIdleLocked(b *blobFile) error {
	if b.idleAt != nil {
		be.idle.Remove(b.idleAt)
		b.idleAt = nil
	}
	if be.open[b.id] == b {
		delete(be.open, b.id)
	}
	return b.closeFile()
}

// Delete unlinks blob id's file; it is durable after Sync.
func (be *Backend) Delete(id backend.BlobID) error {
	if err := backend.CheckID(id); err != nil {
		return errorf("delete", id, err)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed.Load() {
		return errorf("delete", id, syscall.EBADF)
	}
	if be.readOnly {
		return errorf("delete", id, errReadOnly)
	}
	if b := be.open[id]; b != nil {
		if b.refs > 0 {
			return errorf("delete", id, syscall.EBUSY)
		}
		_ = be.dropIdleLocked(b) // no handle: its file closes first
	}
	if err := unix.Unlink(be.path(id)); err != nil {
		return errorf("delete", id, err)
	}
	delete(be.failed, id)
	be.dirty[be.fanout(id)] = struct{}{}
	return nil
}

// List reads every fan-out directory and returns the blob ids found,
// ascending. Names that are not blobs are logged and skipped.
func (be *Backend) List() ([]backend.BlobID, error) {
	if be.closed.Load() {
		return nil, fmt.Errorf("backend file: list: %w", syscall.EBADF)
	}
	top, err := os.ReadDir(be.root)
	if err != nil {
		return nil, fmt.Errorf("backend file: list: %w", err)
	}
	var ids []backend.BlobID
	for _, d := range top {
		fan, err := strconv.ParseUint(d.Name(), 16, 8)
		if !d.IsDir() || len(d.Name()) != 2 || err != nil || d.Name() != fmt.Sprintf("%02x", fan) {
			if !d.IsDir() && (d.Name() == "FORMAT" || d.Name() == "LOCK" || d.Name() == ".direct-probe" || d.Name() == identityFile) {
				continue
			}
			be.log.Warn("stray entry in blob directory", "path", filepath.Join(be.root, d.Name()))
			continue
		}
		dir := filepath.Join(be.root, d.Name())
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("backend file: list: %w", err)
		}
		for _, e := range ents {
			id, err := strconv.ParseUint(e.Name(), 16, 64)
			if err != nil || !e.Type().IsRegular() || e.Name() != fmt.Sprintf("%016x", id) ||
				id == 0 || uint8(id) != uint8(fan) {
				be.log.Warn("stray entry in blob directory", "path", filepath.Join(dir, e.Name()))
				continue
			}
			ids = append(ids, backend.BlobID(id))
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Sync fsyncs the directories changed by Create and Delete since the last
// Sync. A failure is sticky.
// SyncAll makes every blob file's bytes durable with one syncfs(2) of the
// file system that holds them (backend.SyncAller).
func (be *Backend) SyncAll() error {
	if be.closed.Load() {
		return fmt.Errorf("backend file: sync all: %w", syscall.EBADF)
	}
	fd, err := unix.Open(be.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("backend file: sync all: open %s: %w", be.root, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("backend file: syncfs %s: %w", be.root, err)
	}
	return nil
}

func (be *Backend) Sync() error {
	be.syncMu.Lock()
	defer be.syncMu.Unlock()
	if be.syncErr != nil {
		return be.syncErr
	}
	be.mu.Lock()
	if be.closed.Load() {
		be.mu.Unlock()
		return fmt.Errorf("backend file: sync: %w", syscall.EBADF)
	}
	dirs := make([]string, 0, len(be.dirty))
	rootDirty := false
	for d := range be.dirty {
		if d == be.root {
			rootDirty = true
			continue
		}
		dirs = append(dirs, d)
	}
	clear(be.dirty)
	be.mu.Unlock()
	// Entries first, then the fan-out directories that hold them.
	slices.Sort(dirs)
	if rootDirty {
		dirs = append(dirs, be.root)
	}
	for i, d := range dirs {
		if opened, err := fsyncDir(d); err != nil {
			if !opened {
				// No descriptor for the directory (EMFILE, ENOMEM): nothing
				// was synced, so nothing is known lost. The directories
				// wait for the next Sync, and this one fails alone.
				be.mu.Lock()
				for _, d := range dirs[i:] {
					be.dirty[d] = struct{}{}
				}
				be.mu.Unlock()
				return fmt.Errorf("backend file: sync %s: %w", d, err)
			}
			be.syncErrors.Add(1)
			be.syncErr = fmt.Errorf("backend file: sync %s: %w", d, err)
			return be.syncErr
		}
	}
	return nil
}

// Close closes every open blob file (their handles return EBADF from then
// on) and releases the directory lock.
func (be *Backend) Close() error {
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.closed.Load() {
		return fmt.Errorf("backend file: close: %w", syscall.EBADF)
	}
	be.closed.Store(true)
	var first error
	for _, b := range be.open {
		if err := b.closeFile(); err != nil && first == nil {
			first = err
		}
	}
	clear(be.open)
	be.idle.Init()
	if err := unix.Close(be.lockFD); err != nil && first == nil {
		first = fmt.Errorf("backend file: close lock: %w", err)
	}
	be.lockFD = -1
	return first
}

// Space is the room of the file system that holds the blobs
// (backend.Spacer).
func (b *Backend) Space() (backend.Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(b.root, &st); err != nil {
		return backend.Space{}, fmt.Errorf("backend file: statfs %s: %w", b.root, err)
	}
	bs := uint64(st.Bsize)
	return backend.Space{Total: st.Blocks * bs, Free: st.Bfree * bs, Avail: st.Bavail * bs}, nil
}
