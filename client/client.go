// Package client is the Go client of weir. It looks like package os and
// io/fs: Dial returns an *FS with OpenFile, Mkdir, Rename, Stat, ReadDir and
// friends, and *File has Read, Write, ReadAt, WriteAt, Seek, Truncate, Sync,
// Stat, ReadDir, Chmod, Chown and Close; a directory *File also resolves
// paths relative to itself (OpenAt, StatAt, MkdirAt, ...), as the *at()
// system calls do. Errors are *fs.PathError (or *os.LinkError for Rename)
// wrapping a syscall.Errno, so errors.Is(err, fs.ErrNotExist) works.
//
// Every request travels on shared-memory rings (package ring) in the
// protocol of package proto: namespace requests to the metadata service,
// reads and writes to the IO service. No socket is used after the two
// handshakes.
//
// Recovery. When the metadata service restarts, or the IO service restarts
// or is resynchronised, the FS re-establishes its sessions by itself (for
// up to Options.RecoverTimeout): a new metadata session, the IO ring
// attached again, every open file reopened with the ticket its open
// returned, and granted again at its next read or write. A request that
// the services refused as stale is sent again; one whose ring died under
// it is sent again only if repeating it is harmless (reads, writes at an
// offset, stat, chmod, ...); otherwise (mkdir, rename, unlink, an append,
// an exclusive create) it returns EIO, since it may or may not have taken
// effect, and later calls work. Writes not yet fsynced when the IO service
// died may be lost: the next Sync of such a file returns EIO once, as
// Linux reports a lost writeback.
//
// Paths are relative to the root of the weir file system; a leading "/" means
// the same. FS.Open follows the io/fs contract instead (fs.ValidPath names).
package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// Options say where the services are and how to wait for them.
type Options struct {
	// MetadataSocket and IOSocket are the services' Unix sockets, as
	// `weir up` prints them. An empty one is found in the run directory:
	// $WEIR_RUN_DIR if set, else DefaultRunDir (where weir up puts the
	// sockets when it runs on the default data directory).
	MetadataSocket string
	IOSocket       string
	// Mode is how a caller waits for its completion; WaitAdaptive spins
	// briefly and then sleeps, WaitBusyPoll never sleeps.
	Mode ring.WaitMode
	// RecoverTimeout bounds how long a call waits for a service that went
	// away to come back (see the package comment); 0 means
	// DefaultRecoverTimeout, a negative value never recovers: the sessions'
	// loss is returned as EIO.
	RecoverTimeout time.Duration
	// Mount is the host path where the C shim serves weir (its
	// WEIR_MOUNT); empty means $WEIR_MOUNT, else DefaultMount. A symbolic
	// link's absolute target under it is followed inside weir; one
	// elsewhere leads out of weir, which this client cannot follow
	// (EXDEV). Mount "/" makes weir's root the root of every absolute
	// target.
	Mount string
}

// DefaultMount is where the shim serves weir unless WEIR_MOUNT says.
const DefaultMount = "/weir"

// DefaultRecoverTimeout is how long a call waits for a restarted service.
const DefaultRecoverTimeout = 30 * time.Second

// FS is a connection to weir: one metadata session and one IO session. It is
// safe for concurrent use by many goroutines.
type FS struct {
	opts  Options
	umask uint32

	mu     sync.RWMutex
	cur    *conn         // the current sessions; protected by mu
	gen    atomic.Uint64 // cur.gen, for readers that take no lock
	closed atomic.Bool
	life   context.Context // cancelled by Close: ends the watchers and any recovery
	end    context.CancelFunc

	recoverMu sync.Mutex // one recovery at a time

	filesMu sync.Mutex
	files   map[*File]struct{} // open files, reopened at recovery; protected by filesMu

	kept keptCaches // mappings of files closed under a kept lease (leases.go)
	caps keptCaps   // unclaimed capabilities of files closed under a kept lease (leases.go)
	late lateCloses // read-only handles' closes not sent yet (leases.go)
	// direct holds the directory snapshots of direct opens (direct.go).
	direct directState

	// Recoveries counts the times the sessions were re-established.
	Recoveries atomic.Uint64
	// metaNow is cur's metadata ring, for the data path's look at its
	// completion queue (recall notices: leases.go) without f.mu.
	metaNow atomic.Pointer[ring.Client]
	// RecallNotices counts the data handles the metadata service said
	// another trust group's grant recalled (proto.FeatureRecalls).
	RecallNotices atomic.Uint64
	// ClosesAside counts read-only closes sent beside a later open
	// (lateCloses), the others going from the closer.
	ClosesAside atomic.Uint64
	// Direct opens (direct.go): made at io alone, refused there (opened
	// through metadata instead), made ordinary files later (promoted);
	// and directory snapshots kept.
	DirectOpens, DirectRefused, DirectPromoted, Snapshots atomic.Uint64
	// CacheHits counts reads served from cache regions alone (no round
	// trip); CacheMisses reads that had to ask the IO service for part.
	CacheHits, CacheMisses atomic.Uint64
}

var (
	_ fs.FS         = (*FS)(nil)
	_ fs.StatFS     = (*FS)(nil)
	_ fs.ReadDirFS  = (*FS)(nil)
	_ fs.ReadFileFS = (*FS)(nil)
)

var bgctx = context.Background()

// Where the services' sockets are when Options leaves them empty: the same
// defaults as the services' own configuration (configs/weir.hcl: run_dir,
// metadata.socket, io.socket).
const (
	// DefaultRunDir is run_dir for the default data_dir, /var/lib/weir.
	DefaultRunDir = "/run/weir"
	// RunDirEnv names the environment variable that overrides it.
	RunDirEnv          = "WEIR_RUN_DIR"
	MetadataSocketName = "metadata.sock"
	IOSocketName       = "io.sock"
)

// RunDir is the directory Dial looks in for sockets Options leaves empty:
// $WEIR_RUN_DIR, or DefaultRunDir when that is unset or empty.
func RunDir() string {
	if d := os.Getenv(RunDirEnv); d != "" {
		return d
	}
	return DefaultRunDir
}

// maxChunk bounds one read or write request; larger calls are split.
const maxChunk = 1 << 20

// Dial connects to the metadata and IO services.
func Dial(ctx context.Context, opts Options) (*FS, error) {
	if opts.MetadataSocket == "" {
		opts.MetadataSocket = filepath.Join(RunDir(), MetadataSocketName)
	}
	if opts.IOSocket == "" {
		opts.IOSocket = filepath.Join(RunDir(), IOSocketName)
	}
	if opts.RecoverTimeout == 0 {
		opts.RecoverTimeout = DefaultRecoverTimeout
	}
	f := &FS{opts: opts, umask: processUmask(), files: map[*File]struct{}{}, late: lateCloses{bell: make(chan struct{}, 1)}}
	f.life, f.end = context.WithCancel(bgctx)
	c, err := f.connect(ctx, nil)
	if err != nil {
		f.end()
		return nil, err
	}
	c.gen = 1
	f.cur = c
	f.metaNow.Store(c.meta)
	f.gen.Store(c.gen)
	go f.watch(c)
	go f.closer()
	return f, nil
}

// watch recovers as soon as a session of c ends, without waiting for the
// next call: a restarted metadata service takes back the tickets of open
// files only within its reclaim grace (30 s by default), and an idle
// process must not lose its files to that. It tries until the sessions
// are back, c was replaced, or the FS is closed; a call meanwhile waits
// for the recovery in progress (up to RecoverTimeout for its own try).
func (f *FS) watch(c *conn) {
	if f.opts.RecoverTimeout < 0 {
		return
	}
	var cause error
	select {
	case <-f.life.Done():
		return
	case <-c.meta.Done():
		cause = c.meta.Err()
	case <-c.data.Done():
		cause = c.data.Err()
	}
	for attempt := 0; f.current() == c && !f.closed.Load(); attempt++ {
		if _, err := f.recover(c, &sessionError{err: cause}); err == nil {
			return // recover started the next watcher
		}
		select {
		case <-f.life.Done():
			return
		case <-time.After(min(100*time.Millisecond<<min(attempt, 4), time.Second)):
		}
	}
}

// connect makes a new generation of sessions. It keeps the rings of old
// that still work: a live metadata session is reused (it is not stale
// just because io was resynchronised), a live IO ring attaches again.
func (f *FS) connect(ctx context.Context, old *conn) (*conn, error) {
	c := &conn{}
	var dialed []*ring.Client
	fail := func(err error) (*conn, error) {
		for _, r := range dialed {
			r.Close()
		}
		return nil, err
	}
	if old != nil && alive(ctx, old.meta) {
		c.meta, c.session, c.token, c.version, c.features = old.meta, old.session, old.token, old.version, old.features
	} else {
		meta, err := ring.Dial(ctx, f.opts.MetadataSocket, ring.ClientOptions{Mode: f.opts.Mode})
		if err != nil {
			return fail(fmt.Errorf("weir: connect to metadata service: %w", err))
		}
		dialed = append(dialed, meta)
		r, err := hello(ctx, meta)
		if err != nil {
			return fail(fmt.Errorf("weir: hello: %w", err))
		}
		c.meta, c.session, c.token, c.version, c.features = meta, r.Session, r.Token, r.Version, r.Features
	}
	if old != nil && alive(ctx, old.data) {
		c.data = old.data
	} else {
		data, err := ring.Dial(ctx, f.opts.IOSocket, ring.ClientOptions{Mode: f.opts.Mode})
		if err != nil {
			return fail(fmt.Errorf("weir: connect to IO service: %w", err))
		}
		dialed = append(dialed, data)
		c.data = data
	}
	c.chunk = min(maxChunk, c.data.MaxBuffer())
	if err := attach(ctx, c.data, c); err != nil {
		if errors.Is(err, proto.ErrStale) && old != nil && c.meta == old.meta {
			// io serves a newer incarnation than this session's: the
			// metadata service restarted and this ring has not noticed
			// yet. The next attempt opens a new metadata session.
			old.meta.Close()
		}
		return fail(fmt.Errorf("weir: attach IO session: %w", err))
	}
	if (old == nil || c.meta != old.meta) && c.features&proto.FeatureRecalls != 0 {
		go f.recallNotices(c.meta)
	}
	return c, nil
}

// alive reports whether the service behind r still answers: a no-op
// round trip. A ring whose peer died fails it as soon as the death is
// noticed (socket or pidfd), which may be after the failure that brought
// us here.
func alive(ctx context.Context, r *ring.Client) bool {
	if r.Err() != nil {
		return false
	}
	comp, err := r.Do(ctx, &ring.Call{Op: ring.OpNop})
	return err == nil && comp.Result == 0
}

// current returns the sessions in use.
func (f *FS) current() *conn {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.cur
}

// errFSClosed is the cause of EBADF after Close.
var errFSClosed = errors.New("weir: file system closed")

// recover replaces the sessions c, which failed with cause, and returns
// the new ones; if another call recovered already, its sessions. It
// retries for up to RecoverTimeout.
func (f *FS) recover(c *conn, cause error) (*conn, error) {
	f.recoverMu.Lock()
	defer f.recoverMu.Unlock()
	if cur := f.current(); cur != c {
		return cur, nil
	}
	if f.closed.Load() {
		return nil, fmt.Errorf("%w (%v)", syscall.EBADF, errFSClosed)
	}
	if f.opts.RecoverTimeout < 0 {
		return nil, cause
	}
	ctx, cancel := context.WithTimeout(f.life, f.opts.RecoverTimeout)
	defer cancel()
	ioLost := c.data.Err() != nil
	var nc *conn
	var err error
	for attempt := 0; ; attempt++ {
		if nc, err = f.connect(ctx, c); err == nil {
			break
		}
		wait := min(50*time.Millisecond<<min(attempt, 5), time.Second)
		select {
		case <-ctx.Done():
			if f.closed.Load() {
				return nil, fmt.Errorf("%w (%v)", syscall.EBADF, errFSClosed)
			}
			return nil, fmt.Errorf("%w: weir sessions lost (%v) and not re-established within %v: %v",
				syscall.EIO, cause, f.opts.RecoverTimeout, err)
		case <-time.After(wait):
		}
	}
	newMeta := nc.meta != c.meta
	nc.gen = c.gen + 1
	f.mu.Lock()
	f.cur = nc
	f.metaNow.Store(nc.meta)
	f.gen.Store(nc.gen)
	f.mu.Unlock()
	if newMeta {
		c.meta.Close()
	}
	if nc.data != c.data {
		c.data.Close()
	}
	f.Recoveries.Add(1)
	files := f.openFiles()
	// Files reopen now rather than at their next use, so that a file
	// unlinked while open is claimed within the service's reclaim grace.
	for _, fl := range files {
		fl.rebind(nc, ioLost)
	}
	go f.watch(nc)
	return nc, nil
}

// openFiles returns the files open now.
func (f *FS) openFiles() []*File {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	files := make([]*File, 0, len(f.files))
	for fl := range f.files {
		files = append(files, fl)
	}
	return files
}

// Close ends both sessions. Files still open are closed by the services.
func (f *FS) Close() error {
	if !f.closed.CompareAndSwap(false, true) {
		return nil
	}
	f.end() // a recovery in progress gives up at once
	f.metaNow.Store(nil)
	f.recoverMu.Lock()
	defer f.recoverMu.Unlock()
	c := f.current()
	c.data.Close()
	err := c.meta.Close()
	f.kept.drop()
	return err
}

// retryable says whether a request that failed with err on c may go again
// on new sessions: it was refused as stale (nothing happened), or its ring
// died and repeating it is harmless.
func retryable(err error, idempotent bool) bool {
	return errors.Is(err, proto.ErrStale) || (lostSession(err) && idempotent)
}

// metaOp runs fn on the current sessions; when the metadata ring died
// under it, it recovers and, if idempotent, runs it once more. An ESTALE
// answer from the metadata service is a real answer (a file reopened
// after it was removed), not a stale session.
func (f *FS) metaOp(idempotent bool, fn func(c *conn) error) error {
	c := f.current()
	err := fn(c)
	if err == nil || !lostSession(err) {
		return err
	}
	nc, rerr := f.recover(c, err)
	if rerr != nil {
		return rerr
	}
	if !idempotent {
		return fmt.Errorf("%w (the metadata service went away during the request: it may or may not have taken effect)", syscall.EIO)
	}
	return fn(nc)
}

// dataOp is metaOp for requests to the IO service: an ESTALE answer there
// means the session predates a resync, and the request was not served.
func (f *FS) dataOp(idempotent bool, fn func(c *conn) error) error {
	c := f.current()
	err := fn(c)
	if err == nil || !(lostSession(err) || errors.Is(err, proto.ErrStale)) {
		return err
	}
	nc, rerr := f.recover(c, err)
	if rerr != nil {
		return rerr
	}
	if !retryable(err, idempotent) {
		return fmt.Errorf("%w (the IO service went away during the request: it may or may not have taken effect)", syscall.EIO)
	}
	return stillStale(fn(nc))
}

// SyncFS makes every file of the store with changes not yet durable
// durable, whoever wrote them, as syncfs(2) does a file system's
// (proto.OpSyncFS), then the namespace (proto.OpSyncMeta); it tries them
// all and answers the first error. It does
// not report writes lost with an IO service that died (File.Sync does).
func (f *FS) SyncFS() error {
	err := f.dataOp(true, func(c *conn) error {
		_, err := call(bgctx, c.data, proto.OpSyncFS, 0, 0, 0, nil, nil)
		return err
	})
	if err == nil {
		// Then metadata's log: every name, and every size io reported
		// without a sync (at a close).
		err = f.metaOp(true, func(c *conn) error {
			_, err := call(bgctx, c.meta, proto.OpSyncMeta, 0, 0, 0, nil, nil)
			return err
		})
	}
	if err != nil {
		return pathErr("syncfs", ".", err)
	}
	return nil
}

// processUmask reads this process's umask without changing it.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
					return uint32(m)
				}
			}
		}
	}
	return 0o022
}

func pathErr(op, path string, err error) error {
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// checkPath refuses what cannot travel: NUL bytes (EINVAL, as package os
// says before any system call) and paths longer than PATH_MAX.
func checkPath(name string) error {
	if strings.IndexByte(name, 0) >= 0 {
		return syscall.EINVAL
	}
	if len(name) > proto.MaxPath {
		return syscall.ENAMETOOLONG
	}
	return nil
}

// maxLinks is the most symbolic links one call follows (Linux's
// MAXSYMLINKS); one more is ELOOP.
const maxLinks = 40

// follow runs op on name and, each time the metadata service answers that
// the path met a symbolic link to follow, reads the link and runs op on
// the rewritten path, as the kernel's walk would go on. An error that
// names a rewritten path names name again.
func (f *FS) follow(dir *File, name string, op func(name string) error) error {
	return f.follow2(dir, name, nil, "", func(a, _ string) error { return op(a) })
}

// follow2 is follow for a call with two paths (rename, link).
func (f *FS) follow2(olddir *File, oldname string, newdir *File, newname string, op func(oldname, newname string) error) error {
	o, n := oldname, newname
	for links := 0; ; links++ {
		err := op(o, n)
		var fe *followError
		if !errors.As(err, &fe) {
			var pe *fs.PathError
			if errors.As(err, &pe) && (pe.Path == o || pe.Path == n) {
				pe.Path = map[bool]string{true: oldname, false: newname}[pe.Path == o]
			}
			return err
		}
		if links >= maxLinks {
			return syscall.ELOOP
		}
		p, dir := &o, olddir
		start, end, second, above, ok := proto.SplitFollowAux(fe.aux, len(o))
		if second {
			p, dir = &n, newdir
			start, end, _, above, ok = proto.SplitFollowAux(fe.aux, len(n))
		}
		if !ok || above { // (above: only for FeatureMounted, which this client does not ask)
			return badCompletion(proto.OpStat, fmt.Sprintf("a link at %#x of a path of %d bytes", fe.aux, len(*p)))
		}
		next, err := f.chase(dir, *p, start, end)
		if err != nil {
			return err
		}
		*p = next
	}
}

// chase rewrites path p, whose bytes [start, end) are a symbolic link:
// p[:start] + target + p[end:], or for an absolute target inside the
// mount, its part after the mount + p[end:] (from weir's root).
func (f *FS) chase(dir *File, p string, start, end int) (string, error) {
	t, err := f.readlinkAt(dir, p[:end])
	if errors.Is(err, syscall.EINVAL) {
		return p, nil // no link any more: it changed in between; ask again
	}
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(t, "/") {
		return p[:start] + t + p[end:], nil
	}
	m := f.opts.Mount
	if m == "" {
		if m = os.Getenv("WEIR_MOUNT"); !strings.HasPrefix(m, "/") {
			m = DefaultMount
		}
	}
	if m = strings.TrimRight(m, "/"); m == "" {
		return t + p[end:], nil // Mount "/"
	}
	rest, in := underMount(m, t)
	if !in {
		return "", fmt.Errorf("%w: the symbolic link %s leads to %s, out of weir (mounted at %s)", syscall.EXDEV, p[:end], t, m)
	}
	return "/" + rest + p[end:], nil
}

// underMount reports whether the absolute path t, cleaned (this client
// has no ".." above weir's root to keep), lies under the mount m, and
// returns its part after the mount.
func underMount(m, t string) (string, bool) {
	t = path.Clean(t)
	if t == m {
		return "", true
	}
	if rest, ok := strings.CutPrefix(t, m+"/"); ok {
		return rest, true
	}
	return "", false
}

// readlinkAt reads the symbolic link name (from dir) without following
// a final link; intermediate ones are the caller's (follow).
func (f *FS) readlinkAt(dir *File, name string) (string, error) {
	var t string
	err := f.pathCall(dir, proto.OpReadlink, 0, true, (&proto.PathReq{Path: name}).Append(nil), proto.MaxPath,
		func(_ ring.Completion, b []byte) error {
			if len(b) == 0 || bytes.IndexByte(b, 0) >= 0 {
				return badCompletion(proto.OpReadlink, "an empty target or one with a NUL")
			}
			t = string(b)
			return nil
		})
	return t, err
}

// Readlink returns the target of the symbolic link name.
func (f *FS) Readlink(name string) (string, error) {
	if err := checkPath(name); err != nil {
		return "", pathErr("readlink", name, err)
	}
	var t string
	err := f.follow(nil, name, func(p string) (err error) {
		t, err = f.readlinkAt(nil, p)
		return err
	})
	if err != nil {
		return "", pathErr("readlink", name, err)
	}
	return t, nil
}

// Symlink creates newname as a symbolic link to oldname, as os.Symlink.
func (f *FS) Symlink(oldname, newname string) error {
	err := checkPath(oldname)
	if err == nil {
		err = checkPath(newname)
	}
	if err == nil {
		err = f.follow(nil, newname, func(p string) error {
			body := (&proto.SymlinkReq{Target: oldname, Path: p}).Append(nil)
			return f.pathCall(nil, proto.OpSymlink, 0, false, body, proto.AttrSize, nil)
		})
	}
	if err != nil {
		return &os.LinkError{Op: "symlink", Old: oldname, New: newname, Err: err}
	}
	return nil
}

// Link creates newname as a hard link to oldname, as os.Link (a final
// symbolic link of oldname is not followed, as linkat without
// AT_SYMLINK_FOLLOW).
func (f *FS) Link(oldname, newname string) error {
	err := checkPath(oldname)
	if err == nil {
		err = checkPath(newname)
	}
	if err == nil {
		err = f.follow2(nil, oldname, nil, newname, func(o, n string) error {
			return f.metaOp(false, func(c *conn) error {
				body := (&proto.RenameReq{NewDir: proto.RootHandle, Old: o, New: n}).Append(nil)
				_, err := call(bgctx, c.meta, proto.OpLink, 0, proto.RootHandle, 0, body, make([]byte, proto.AttrSize))
				return err
			})
		})
	}
	if err != nil {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: err}
	}
	return nil
}

// modeBits turns an fs.FileMode's permission and special bits into the
// POSIX mode bits the services store.
func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		b |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		b |= syscall.S_ISVTX
	}
	return b
}

// pathCall runs a path request from directory dir (nil: the root) on the
// metadata ring: it encodes body, sends it with the directory's handle in
// the current sessions, and decodes the answer with decode (out bytes of
// response space; decode may be nil).
func (f *FS) pathCall(dir *File, op uint8, arg uint32, idempotent bool, body []byte, out int, decode func(c ring.Completion, b []byte) error) error {
	return f.metaOp(idempotent, func(c *conn) error {
		h := proto.RootHandle
		if dir != nil {
			var err error
			if h, err = dir.handleIn(c); err != nil {
				return err
			}
		}
		buf := make([]byte, out)
		comp, err := call(bgctx, c.meta, op, arg, h, 0, body, buf)
		if err != nil {
			return err
		}
		if decode != nil {
			return decode(comp, buf[:comp.Result])
		}
		return nil
	})
}

// decodeAttr decodes an attr answer; a bad one is EIO.
func decodeAttr(op uint8) (*proto.Attr, func(ring.Completion, []byte) error) {
	a := new(proto.Attr)
	return a, func(_ ring.Completion, b []byte) error {
		v, err := proto.DecodeAttr(b)
		if err != nil {
			return badCompletion(op, "attr does not decode")
		}
		*a = v
		return nil
	}
}

func (f *FS) statAt(dir *File, op, name string) (*fileInfo, error) {
	if err := checkPath(name); err != nil {
		return nil, pathErr(op, name, err)
	}
	a, dec := decodeAttr(proto.OpStat)
	var arg uint32
	if op == "lstat" {
		arg = proto.PathNoFollow
	}
	err := f.follow(dir, name, func(p string) error {
		return f.pathCall(dir, proto.OpStat, arg, true, (&proto.PathReq{Path: p}).Append(nil), proto.AttrSize, dec)
	})
	if err == nil && arg == 0 && a.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		err = badCompletion(proto.OpStat, "a symbolic link for a stat that follows links")
	}
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	return newFileInfo(baseName(name), *a), nil
}

// Stat returns a FileInfo describing the named file, following symbolic
// links.
func (f *FS) Stat(name string) (fs.FileInfo, error) { return f.statAt(nil, "stat", name) }

// Lstat is Stat that describes a final symbolic link itself.
func (f *FS) Lstat(name string) (fs.FileInfo, error) { return f.statAt(nil, "lstat", name) }

func (f *FS) mkdirAt(dir *File, name string, perm fs.FileMode) error {
	if err := checkPath(name); err != nil {
		return pathErr("mkdir", name, err)
	}
	_, dec := decodeAttr(proto.OpMkdir)
	err := f.follow(dir, name, func(p string) error {
		body := (&proto.ModePathReq{Mode: modeBits(perm) &^ f.umask, Path: p}).Append(nil)
		return f.pathCall(dir, proto.OpMkdir, 0, false, body, proto.AttrSize, dec)
	})
	if err != nil {
		return pathErr("mkdir", name, err)
	}
	return nil
}

// Mkdir creates a directory with perm (before umask).
func (f *FS) Mkdir(name string, perm fs.FileMode) error { return f.mkdirAt(nil, name, perm) }

// MkdirAll creates a directory and every missing parent, like os.MkdirAll.
func (f *FS) MkdirAll(name string, perm fs.FileMode) error {
	if fi, err := f.Stat(name); err == nil {
		if fi.IsDir() {
			return nil
		}
		return pathErr("mkdir", name, syscall.ENOTDIR)
	}
	i := len(name)
	for i > 0 && name[i-1] == '/' {
		i--
	}
	j := i
	for j > 0 && name[j-1] != '/' {
		j--
	}
	if j > 1 {
		if err := f.MkdirAll(name[:j-1], perm); err != nil {
			return err
		}
	}
	err := f.Mkdir(name, perm)
	if err != nil {
		if fi, serr := f.Stat(name); serr == nil && fi.IsDir() {
			return nil
		}
		return err
	}
	return nil
}

func (f *FS) removeAt(dir *File, name string) error {
	if err := checkPath(name); err != nil {
		return pathErr("remove", name, err)
	}
	pathOp := func(op uint8) error {
		return f.follow(dir, name, func(p string) error {
			return f.pathCall(dir, op, 0, false, (&proto.PathReq{Path: p}).Append(nil), 0, nil)
		})
	}
	e := pathOp(proto.OpUnlink)
	if e == nil {
		return nil
	}
	e1 := pathOp(proto.OpRmdir)
	if e1 == nil {
		return nil
	}
	// rmdir(file) is ENOTDIR; otherwise rmdir's error is the real one.
	if !errors.Is(e1, syscall.ENOTDIR) {
		e = e1
	}
	return pathErr("remove", name, e)
}

// Remove removes a file or an empty directory, choosing the error as
// os.Remove does.
func (f *FS) Remove(name string) error { return f.removeAt(nil, name) }

// RemoveAll removes name and everything it contains, like os.RemoveAll: a
// missing name is not an error.
func (f *FS) RemoveAll(name string) error {
	if name == "" {
		return nil
	}
	if err := checkPath(name); err != nil {
		return pathErr("RemoveAll", name, err)
	}
	if name == "." || strings.HasSuffix(name, "/.") {
		return pathErr("RemoveAll", name, syscall.EINVAL)
	}
	err := f.Remove(name)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	fi, serr := f.Stat(name)
	if serr != nil {
		if errors.Is(serr, fs.ErrNotExist) {
			return nil
		}
		return serr
	}
	if !fi.IsDir() {
		return err
	}
	ents, rerr := f.ReadDir(name)
	if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		return rerr
	}
	var first error
	for _, e := range ents {
		if err := f.RemoveAll(strings.TrimSuffix(name, "/") + "/" + e.Name()); err != nil && first == nil {
			first = err
		}
	}
	if err := f.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) && first == nil {
		first = err
	}
	return first
}

func (f *FS) renameAt(olddir *File, oldname string, newdir *File, newname string) error {
	err := checkPath(oldname)
	if err == nil {
		err = checkPath(newname)
	}
	if err == nil {
		err = f.follow2(olddir, oldname, newdir, newname, func(oldname, newname string) error {
			return f.renameOnce(olddir, oldname, newdir, newname)
		})
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	return nil
}

// renameOnce sends one OpRename.
func (f *FS) renameOnce(olddir *File, oldname string, newdir *File, newname string) error {
	{
		return f.metaOp(false, func(c *conn) error {
			oh, nh := proto.RootHandle, proto.RootHandle
			var err error
			if olddir != nil {
				if oh, err = olddir.handleIn(c); err != nil {
					return err
				}
			}
			if newdir != nil {
				if nh, err = newdir.handleIn(c); err != nil {
					return err
				}
			}
			body := (&proto.RenameReq{NewDir: nh, Old: oldname, New: newname}).Append(nil)
			_, err = call(bgctx, c.meta, proto.OpRename, 0, oh, 0, body, nil)
			return err
		})
	}
}

// Rename renames (moves) oldname to newname atomically, replacing newname.
func (f *FS) Rename(oldname, newname string) error { return f.renameAt(nil, oldname, nil, newname) }

func (f *FS) chmodAt(dir *File, name string, mode fs.FileMode) error {
	if err := checkPath(name); err != nil {
		return pathErr("chmod", name, err)
	}
	err := f.follow(dir, name, func(p string) error {
		body := (&proto.ModePathReq{Mode: modeBits(mode), Path: p}).Append(nil)
		return f.pathCall(dir, proto.OpChmod, 0, true, body, 0, nil)
	})
	if err != nil {
		return pathErr("chmod", name, err)
	}
	return nil
}

// Chmod changes the mode bits of the named file.
func (f *FS) Chmod(name string, mode fs.FileMode) error { return f.chmodAt(nil, name, mode) }

func (f *FS) chownAt(dir *File, name string, uid, gid int, arg uint32) error {
	op := map[bool]string{true: "lchown", false: "chown"}[arg == proto.PathNoFollow]
	if err := checkPath(name); err != nil {
		return pathErr(op, name, err)
	}
	err := f.follow(dir, name, func(p string) error {
		body := (&proto.OwnerReq{UID: int64(uid), GID: int64(gid), Path: p}).Append(nil, true)
		return f.pathCall(dir, proto.OpChown, arg, true, body, 0, nil)
	})
	if err != nil {
		return pathErr(op, name, err)
	}
	return nil
}

// Chown changes the owner and group; -1 leaves one unchanged.
func (f *FS) Chown(name string, uid, gid int) error { return f.chownAt(nil, name, uid, gid, 0) }

// Lchown is Chown that changes a final symbolic link itself.
func (f *FS) Lchown(name string, uid, gid int) error {
	return f.chownAt(nil, name, uid, gid, proto.PathNoFollow)
}

func (f *FS) chtimesAt(dir *File, name string, atime, mtime time.Time) error {
	if err := checkPath(name); err != nil {
		return pathErr("chtimes", name, err)
	}
	err := f.follow(dir, name, func(p string) error {
		body := (&proto.TimesReq{Atime: timeArg(atime), Mtime: timeArg(mtime), Path: p}).Append(nil, true)
		return f.pathCall(dir, proto.OpChtimes, 0, true, body, 0, nil)
	})
	if err != nil {
		return pathErr("chtimes", name, err)
	}
	return nil
}

// Chtimes sets the access and modification times. A zero time.Time leaves
// that time unchanged, as in os.Chtimes.
func (f *FS) Chtimes(name string, atime, mtime time.Time) error {
	return f.chtimesAt(nil, name, atime, mtime)
}

// Touch sets both times of the named file to the metadata service's
// clock, as utimensat(name, NULL) and touch(1): the owner, root, or a
// caller that may write the file may (else EACCES), while explicit times
// (Chtimes) are the owner's.
func (f *FS) Touch(name string) error {
	if err := checkPath(name); err != nil {
		return pathErr("touch", name, err)
	}
	err := f.follow(nil, name, func(p string) error {
		body := (&proto.TimesReq{Atime: proto.TimeNow, Mtime: proto.TimeNow, Path: p}).Append(nil, true)
		return f.pathCall(nil, proto.OpChtimes, 0, true, body, 0, nil)
	})
	if err != nil {
		return pathErr("touch", name, err)
	}
	return nil
}

func timeArg(t time.Time) int64 {
	if t.IsZero() {
		return proto.TimeOmit
	}
	return t.UnixNano()
}

// Truncate changes the size of the named file.
func (f *FS) Truncate(name string, size int64) error {
	if size < 0 {
		return pathErr("truncate", name, syscall.EINVAL)
	}
	file, err := f.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			pe.Op = "truncate"
		}
		return err
	}
	err = file.Truncate(size)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			pe.Op = "truncate"
		}
	}
	return err
}

// ReadDir reads the named directory, sorted by name.
func (f *FS) ReadDir(name string) ([]fs.DirEntry, error) {
	return f.readDir(nil, "open", name, "", -1)
}

// readDir reads up to n entries (n < 0: all) of name, from directory dir,
// after the name after.
func (f *FS) readDir(dir *File, op, name, after string, n int) ([]fs.DirEntry, error) {
	if err := checkPath(name); err != nil {
		return nil, pathErr(op, name, err)
	}
	var ents []fs.DirEntry
	orig := name
	for n < 0 || len(ents) < n {
		var page []proto.Dirent
		var more bool
		err := f.follow(dir, name, func(p string) error {
			name = p // (the next page asks for the directory the links led to)
			body := (&proto.ReadDirReq{Path: p, After: after}).Append(nil)
			return f.pathCall(dir, proto.OpReadDir, 0, true, body, 16<<10, func(c ring.Completion, b []byte) error {
				var err error
				if page, err = proto.DecodeDirents(b); err != nil || (after != "" && len(page) > 0 && page[0].Name <= after) {
					return badCompletion(proto.OpReadDir, "entries do not decode or are not after the name asked")
				}
				more = c.Aux == 1
				if c.Aux > 1 || (more && len(page) == 0) {
					return badCompletion(proto.OpReadDir, "more entries promised but none given")
				}
				return nil
			})
		})
		if err != nil {
			return ents, pathErr(op, orig, err)
		}
		for _, de := range page {
			ents = append(ents, &dirEntry{fs: f, dir: dir, path: name, name: de.Name, ino: de.Ino, mode: de.Mode})
			after = de.Name
			if n >= 0 && len(ents) == n {
				return ents, nil
			}
		}
		if !more {
			break
		}
	}
	return ents, nil
}

// ReadFile reads a whole file. It satisfies fs.ReadFileFS, so name must
// satisfy fs.ValidPath (use OpenFile for os-style paths).
func (f *FS) ReadFile(name string) ([]byte, error) {
	if !fs.ValidPath(name) {
		return nil, pathErr("open", name, fs.ErrInvalid)
	}
	file, err := f.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, fi.Size())
	n, err := file.ReadAt(buf, 0)
	if err != nil && n < len(buf) && !errors.Is(err, errEOF) {
		return buf[:n], err
	}
	return buf[:n], nil
}

// WriteFile writes data to a file, creating it with perm or truncating it.
func (f *FS) WriteFile(name string, data []byte, perm fs.FileMode) error {
	file, err := f.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = file.Write(data)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	return err
}

// WaitStats are counters of how the calls of this FS's current data
// (IO) ring waited for their completions (ring.ClientStats): calls,
// calls that slept, long calls (fsync) that slept, and of those the ones
// whose completion the hybrid wait caught spinning or missed.
type WaitStats struct {
	Calls, Parked, LongParked, LongSpun, LongMissed uint64
	// NoSpin: waits that slept at once because io said its clients
	// should not spin (ring.HintNoSpin: many requests in flight).
	NoSpin uint64
}

// DataWaitStats returns the WaitStats of the current data ring (a
// recovery starts a new one, from zero).
func (f *FS) DataWaitStats() WaitStats {
	f.mu.RLock()
	c := f.cur
	f.mu.RUnlock()
	if c == nil || c.data == nil {
		return WaitStats{}
	}
	st := &c.data.Stats
	return WaitStats{Calls: st.Calls.Load(), Parked: st.Parked.Load(), LongParked: st.LongParked.Load(),
		LongSpun: st.LongSpun.Load(), LongMissed: st.LongMissed.Load(), NoSpin: st.NoSpin.Load()}
}
