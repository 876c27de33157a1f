package ns

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/vfs"
	"github.com/weir-storage/weir/internal/wal"
)

// Defaults for zero Options fields.
const (
	DefaultCheckpointEvery = 10000
	DefaultSyncInterval    = 5 * time.Millisecond
)

// lockName is the file in Options.Dir that one NS holds locked.
const lockName = "LOCK"

// NS is a namespace. All methods are safe for concurrent use.
type NS struct {
	opts Options      // defaults applied; immutable after Open
	cfg  config       // immutable after Open
	fs   vfs.FS       // immutable after Open
	log  hclog.Logger // immutable after Open
	lock io.Closer    // the directory lock; immutable after Open
	w    *wal.Writer  // the log; has its own locking

	// mu protects st and closed. Mutations hold it for writing from their
	// first check until their record is appended and applied, so the WAL
	// order is the order of the changes; readers and the checkpoint
	// snapshot hold it for reading.
	mu     sync.RWMutex
	st     *state
	closed bool
	buf    []byte // record encoding buffer; protected by mu (write)

	orphans []uint64 // blobs of the inodes recovery found without a name; immutable after Open

	sinceCkpt atomic.Int64 // records appended since the last checkpoint snapshot
	// ckptEvery is how many records the next checkpoint waits for:
	// Options.CheckpointEvery, or a quarter of the inodes the last one
	// held if that is more (checkpoint), so that a snapshot's cost, which
	// grows with the namespace, stays a few inodes' encoding per record.
	ckptEvery atomic.Int64
	ckptKick  chan struct{} // wakes the checkpointer; capacity 1
	stop      chan struct{} // closed by Close to stop the goroutines
	wg        sync.WaitGroup

	ckptMu sync.Mutex // serialises checkpoint()
	ckpts  []uint64   // LSNs of the valid checkpoints on disk, ascending; protected by ckptMu
}

// config holds knobs that only tests set.
type config struct {
	fs          vfs.FS
	segmentSize int64 // WAL segment size before rotation; 0 means the default
	// inlineCheckpoint checkpoints synchronously in the mutation that
	// reaches CheckpointEvery instead of in the background, so a seeded
	// test replays identically.
	inlineCheckpoint bool
}

var errClosed = &IOError{Op: "use", Err: ErrClosed}

// Open opens the namespace stored in opts.Dir, creating an empty one (a
// root directory owned by root, mode 0755) if the directory holds none.
// Recovery loads the newest checkpoint that verifies, replays the WAL
// after it, cuts a torn tail, and frees the inodes that had no name left
// (their blobs are reported by Orphans). It fails, naming the file and
// offset, on damage a crash cannot explain.
func Open(opts Options) (*NS, error) {
	if opts.FS != nil {
		return open(opts, config{fs: opts.FS})
	}
	return open(opts, config{fs: vfs.OS{FailSync: opts.FailSync}})
}

// open is Open with test knobs.
func open(opts Options, cfg config) (*NS, error) {
	if opts.Dir == "" {
		return nil, errors.New("ns: Options.Dir is empty")
	}
	if opts.CheckpointEvery <= 0 {
		opts.CheckpointEvery = DefaultCheckpointEvery
	}
	if opts.SyncInterval <= 0 {
		opts.SyncInterval = DefaultSyncInterval
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	n := &NS{
		opts:     opts,
		cfg:      cfg,
		fs:       cfg.fs,
		log:      opts.Logger,
		ckptKick: make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	if opts.ReadOnly {
		if _, err := n.fs.List(opts.Dir); err != nil {
			return nil, &IOError{Op: "open " + opts.Dir, Err: err}
		}
	} else if err := n.fs.MkdirAll(opts.Dir); err != nil {
		return nil, &IOError{Op: "create " + opts.Dir, Err: err}
	}
	lock, err := n.fs.Lock(filepath.Join(opts.Dir, lockName))
	if err != nil {
		return nil, &IOError{Op: "open", Err: err}
	}
	n.lock = lock
	if err := n.recover(); err != nil {
		if n.w != nil {
			n.w.Abandon()
		}
		lock.Close()
		return nil, fmt.Errorf("ns: recover %s: %w", opts.Dir, err)
	}
	if opts.ReadOnly {
		return n, nil
	}
	if !opts.SyncEveryOp {
		n.wg.Add(1)
		go n.syncLoop()
	}
	if !cfg.inlineCheckpoint {
		n.wg.Add(1)
		go n.checkpointLoop()
	}
	return n, nil
}

// recover builds the state from the directory.
func (n *NS) recover() error {
	dir := n.opts.Dir
	names, err := n.fs.List(dir)
	if err != nil {
		return err
	}
	var ckpts []uint64
	haveWAL := false
	for _, name := range names {
		switch {
		case strings.HasPrefix(name, "ckpt-") && strings.HasSuffix(name, ".tmp"):
			if n.opts.ReadOnly {
				continue
			}
			n.log.Info("removing unfinished checkpoint", "file", name)
			if err := n.fs.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		default:
			if lsn, ok := parseCkptName(name); ok {
				ckpts = append(ckpts, lsn)
			} else if _, ok := wal.ParseSegmentName(name); ok {
				haveWAL = true
			}
		}
	}
	slices.Sort(ckpts)
	walOpts := wal.Options{FS: n.fs, Dir: dir, SegmentSize: n.cfg.segmentSize, Logger: n.log, ReadOnly: n.opts.ReadOnly}
	if len(ckpts) == 0 && n.opts.ReadOnly {
		return errors.New("no namespace here (no checkpoint)")
	}
	if len(ckpts) == 0 {
		// A new namespace: the first segment, then checkpoint 0. A crash in
		// between leaves an empty first segment; a checkpoint without a WAL
		// is therefore always damage.
		if haveWAL {
			fresh, err := wal.OnlyEmptyFirstSegment(walOpts)
			if err != nil {
				return err
			}
			if !fresh {
				return errors.New("WAL segments exist but no checkpoint: refusing to guess the state")
			}
			n.log.Info("removing the empty WAL of an unfinished initialisation")
			if err := n.fs.Remove(filepath.Join(dir, wal.SegmentName(1))); err != nil {
				return err
			}
		}
		if n.w, err = wal.Create(walOpts, 1); err != nil {
			return err
		}
		n.st = newState(n.now())
		if err := n.writeCheckpoint(0, encodeCheckpoint(n.st, 0)); err != nil {
			return err
		}
		n.ckpts = []uint64{0}
		return n.boot()
	}
	chosen := -1
	var lsn uint64
	var failures []string
	for i := len(ckpts) - 1; i >= 0; i-- {
		path := filepath.Join(dir, ckptName(ckpts[i]))
		data, err := n.fs.ReadFile(path)
		if err == nil {
			n.st, lsn, err = decodeCheckpoint(data)
			if err == nil && lsn != ckpts[i] {
				err = fmt.Errorf("covers LSN %d but is named for %d", lsn, ckpts[i])
			}
		}
		if err != nil {
			n.log.Error("checkpoint does not verify; trying an older one", "file", path, "error", err)
			failures = append(failures, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		chosen = i
		break
	}
	if chosen < 0 {
		return fmt.Errorf("no valid checkpoint: %s", strings.Join(failures, "; "))
	}
	replayed := 0
	n.w, err = wal.Recover(walOpts, lsn, func(r wal.Record) error {
		rec, err := decodeRecord(r.Type, r.Payload)
		if err != nil {
			return err
		}
		replayed++
		return n.st.apply(rec)
	})
	if err != nil {
		return err
	}
	for _, bad := range ckpts[chosen+1:] {
		if n.opts.ReadOnly {
			break
		}
		path := filepath.Join(dir, ckptName(bad))
		if err := n.fs.Rename(path, path+".corrupt"); err != nil {
			return err
		}
	}
	n.ckpts = ckpts[:chosen+1]
	n.sinceCkpt.Store(int64(replayed))
	n.log.Info("namespace recovered", "checkpoint", lsn, "replayed", replayed, "inodes", len(n.st.inodes))
	// Opens do not survive a restart, but their holders may reopen the
	// files (with the tickets their opens gave them) once the service is
	// back: inodes without a name are held until ReleaseHeld.
	for _, nd := range n.st.inodes {
		if nd.attr.Nlink == 0 {
			nd.held = true
			if nd.attr.Blob != 0 {
				n.orphans = append(n.orphans, nd.attr.Blob)
			}
		}
	}
	slices.Sort(n.orphans)
	if !n.opts.ReadOnly {
		if err := n.boot(); err != nil {
			return err
		}
	}
	return n.st.check(true)
}

// boot starts the next incarnation (the first one chooses the stack id and
// the ticket key) and makes it durable before anything is served.
func (n *NS) boot() error {
	rec := bootRec{incarnation: n.st.boot.incarnation + 1, stackID: n.st.boot.stackID, key: n.st.boot.key}
	if rec.incarnation > MaxIncarnation {
		return fmt.Errorf("incarnation %d exhausted", n.st.boot.incarnation)
	}
	if n.st.boot.incarnation == 0 {
		if _, err := rand.Read(rec.stackID[:]); err != nil {
			return err
		}
		if _, err := rand.Read(rec.key[:]); err != nil {
			return err
		}
	}
	if _, err := n.logLocked(&rec); err != nil {
		return err
	}
	return n.w.SyncAll()
}

// now is the current time in Unix nanoseconds.
func (n *NS) now() int64 { return n.opts.Now().UnixNano() }

// fail makes a flush failure found outside the WAL sticky.
func (n *NS) fail(err error) {
	if n.w != nil {
		n.w.Fail(err)
	}
}

// Err returns the failure that made the namespace read-only, as an
// *IOError, or nil. A failed WAL write or flush, or a failed checkpoint,
// is sticky: from then on every mutation and Sync fails with it and reads
// keep working. Closing the namespace is not a failure.
func (n *NS) Err() error {
	if err := n.w.Err(); err != nil {
		return &IOError{Op: "write-ahead log failed", Err: err}
	}
	return nil
}

// lockMut takes mu for a mutation; it fails if the namespace is closed or
// a flush has failed.
func (n *NS) lockMut() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return errClosed
	}
	if err := n.w.Err(); err != nil {
		n.mu.Unlock()
		return &IOError{Op: "write-ahead log failed earlier", Err: err}
	}
	return nil
}

// logLocked appends r to the WAL, then applies it. mu is held for writing.
func (n *NS) logLocked(r record) (uint64, error) {
	n.buf = r.encode(n.buf[:0])
	lsn, err := n.w.Append(r.typ(), n.buf)
	if err != nil {
		if n.w.Err() == nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)) {
			// The store is full: this mutation fails with ENOSPC (a bare
			// errno, as every namespace error) and the log goes on once
			// room is freed (wal.Writer.Append).
			n.log.Debug("WAL append: no room", "error", err)
			return 0, syscall.ENOSPC
		}
		return 0, &IOError{Op: "append to WAL", Err: err}
	}
	if err := n.st.apply(r); err != nil {
		// A record that passed every check but does not apply is a bug;
		// recovery would stop at it, so nothing may follow it.
		err = fmt.Errorf("record LSN %d does not apply: %w", lsn, err)
		n.w.Fail(err)
		n.log.Error("internal error", "error", err)
		return 0, &IOError{Op: "apply", Err: err}
	}
	n.sinceCkpt.Add(1)
	return lsn, nil
}

// finish completes a mutation after mu is released: it triggers a due
// checkpoint and, with SyncEveryOp, waits until record lsn is durable.
// lsn 0 means nothing was logged.
func (n *NS) finish(lsn uint64) error {
	if lsn == 0 {
		return nil
	}
	if n.sinceCkpt.Load() >= max(n.ckptEvery.Load(), int64(n.opts.CheckpointEvery)) {
		if n.cfg.inlineCheckpoint {
			if err := n.checkpoint(); err != nil {
				n.log.Error("checkpoint failed", "error", err)
			}
		} else {
			select {
			case n.ckptKick <- struct{}{}:
			default:
			}
		}
	}
	if n.opts.SyncEveryOp {
		if err := n.w.WaitDurable(lsn); err != nil {
			return &IOError{Op: "flush WAL", Err: err}
		}
	}
	return nil
}

// syncLoop flushes the WAL every SyncInterval when SyncEveryOp is off.
func (n *NS) syncLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.opts.SyncInterval)
	defer t.Stop()
	reported := false
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			if !n.w.Pending() {
				continue
			}
			if err := n.w.SyncAll(); err != nil && !reported {
				reported = true
				n.log.Error("WAL flush failed; the namespace is now read-only", "error", err)
			}
		}
	}
}

// checkpointLoop writes checkpoints in the background when mutations ask.
func (n *NS) checkpointLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.ckptKick:
			if err := n.checkpoint(); err != nil {
				n.log.Error("checkpoint failed", "error", err)
			}
		}
	}
}

// Sync returns once every mutation that has returned so far is durable.
func (n *NS) Sync() error {
	n.mu.RLock()
	closed := n.closed
	n.mu.RUnlock()
	if closed {
		return errClosed
	}
	if err := n.w.SyncAll(); err != nil {
		return &IOError{Op: "flush WAL", Err: err}
	}
	return nil
}

// Close writes a final checkpoint and closes the namespace. Open handles
// are forgotten: their unnamed inodes are reported by Orphans after the
// next Open. Later calls return nil.
func (n *NS) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	close(n.stop)
	n.wg.Wait()
	if n.opts.ReadOnly {
		n.w.Abandon()
		n.lock.Close()
		return nil
	}
	var errs []error
	if err := n.w.Err(); err != nil {
		errs = append(errs, &IOError{Op: "write-ahead log failed earlier", Err: err})
	} else if err := n.checkpoint(); err != nil {
		errs = append(errs, err)
	}
	if err := n.w.Close(); err != nil && len(errs) == 0 {
		errs = append(errs, &IOError{Op: "close WAL", Err: err})
	}
	n.lock.Close()
	return errors.Join(errs...)
}

// Orphans returns the blobs of the regular files that recovery found with
// no name left (unlinked while open when the service stopped), sorted.
// They are held until ReleaseHeld, so that their holders can reopen them.
func (n *NS) Orphans() []uint64 { return slices.Clone(n.orphans) }

// Incarnation is this open's incarnation: 1 for a new namespace, one more
// at every open since. A read-only open starts none and reports the last
// one's.
func (n *NS) Incarnation() uint32 { return n.st.boot.incarnation }

// StackID is the identity chosen when the namespace was created.
func (n *NS) StackID() [16]byte { return n.st.boot.stackID }

// Empty says that the namespace holds nothing but its root and owes no
// blob deletes: no blob can be one of its files'.
func (n *NS) Empty() bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return len(n.st.inodes) == 1 && len(n.st.dead) == 0
}

// TicketKey is the secret the metadata service makes reopen tickets with,
// chosen when the namespace was created and kept in its WAL and
// checkpoints (which only the service user can read).
func (n *NS) TicketKey() [32]byte { return n.st.boot.key }
