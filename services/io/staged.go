package iosvc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/staging"
	"github.com/weir-storage/weir/proto/cache"
	"github.com/weir-storage/weir/services/io/backend"
)

// The fsync path of Split Journaling (docs/architecture.md, "fsync"). An
// fsync writes the file's changed pages and its inode fields as one
// record to the staging log (staging.Log, on the blob
// backend.StagingBlob) and returns after the flush that covers it: one
// device flush, shared by concurrent fsyncs, no metadata round trip.
// The checkpointer, in the background, makes the files of the live
// records durable at home and their sizes durable at metadata, then
// trims the log. At start, io replays the live records before it serves
// anyone.
//
// What a record must carry is tracked per file (stagedFile): the pages
// written into the cache since the file's last record (changed), and
// whether changes reached the blob directly (dirtyHome: write-through,
// O_DIRECT, uncached writes), which the next fsync makes durable at home
// first and marks the record FlagHome, so that replay skips the file's
// earlier records. A truncate that shrinks a file logs a FlagTruncate
// record (flushed) before it cuts the blob: the cut destroys bytes at
// home that an earlier record's size would otherwise bring back as zeros
// (TestCrash found it: an unacknowledged shrink, then a crash, then the
// replay of the acknowledged size).
//
// A checkpoint of a file with live records only makes its home durable:
// it leaves changed alone, so the file's next record still carries every
// page changed since its last one, and replaying the records after the
// trim point over the durable home gives the file's acknowledged state.
// Only a closed file with no live record has changed cleared by a
// checkpoint (to bound the memory of files never fsynced): no record is
// left that its replay could take back.

// stager is the staging log and what io knows of its live records.
type stager struct {
	svc  *Service
	log  *staging.Log
	blob backend.Blob
	// maxBlocks bounds one record: a file with more changed pages than
	// fit is made durable at home instead (FlagHome).
	maxBlocks int

	mu     sync.Mutex
	files  map[backend.BlobID]*stagedFile // protected by mu
	recs   []stagedRec                    // live records, lsn order; protected by mu
	room   *sync.Cond                     // on mu: a trim happened, or the checkpointer failed a pass
	pass   uint64                         // checkpoint passes ended; protected by mu
	kick   chan struct{}
	resync chan struct{}
	stop   chan struct{}
	done   chan struct{}
	// opened: log and blob are set (the first resync opened the log);
	// until then no session exists and nothing else is used.
	opened atomic.Bool
	// stopping: Shutdown began; waits for room or trims end. started:
	// the checkpointer runs. Both protected by mu.
	stopping, started bool
	lastCkptErr       atomic.Pointer[error]

	// ckptMu serialises checkpoint passes: io's own and the journal
	// service's (journal.go), whose batch jb is; nextBatch numbers them.
	ckptMu    sync.Mutex
	jb        *journalBatch
	nextBatch uint64

	// Counters (weir status, the stats endpoint).
	Records     atomic.Uint64 // records appended by fsyncs
	HomeSyncs   atomic.Uint64 // fsyncs that made the file durable at home (FlagHome records)
	PagesStaged atomic.Uint64
	FullWaits   atomic.Uint64 // fsyncs that waited for room
	Waiting     atomic.Int64  // fsyncs waiting for room now
	Passes      atomic.Uint64 // checkpoint passes that trimmed
	Checkpoints atomic.Uint64 // files checkpointed
	Replayed    atomic.Uint64 // records replayed at start
	Skipped     atomic.Uint64 // records replay could not apply (fields out of range)
	Empty       atomic.Uint64 // fsyncs with nothing to stage: no record
	Truncates   atomic.Uint64 // truncates that shrank a file, logged (FlagTruncate)
	FailedFiles atomic.Uint64 // files whose fsync failed (sticky EIO)
	// JournalBatches and JournalCommits count the journal service's
	// batches and the ones it committed.
	JournalBatches, JournalCommits atomic.Uint64
	// journalFailing: the journal service's failed passes in a row, as
	// its last OpNext said.
	journalFailing atomic.Uint64
	lastErr        atomic.Pointer[error]
}

// stagedRec is a live record: which file it staged.
type stagedRec struct {
	lsn uint64
	id  backend.BlobID
	ino uint64
}

// stagedFile is the staging state of one blob, kept while it is open,
// has live records or changes not yet in a record.
type stagedFile struct {
	id  backend.BlobID
	ino uint64

	fsyncMu sync.Mutex // serialises the file's fsyncs (its records)

	mu       sync.Mutex
	changed  []uint64 // bit per page: written into the cache since the last record
	nchanged int
	// dirtyHome: changes reached the blob itself since the last home
	// sync; the next fsync syncs home first (FlagHome).
	dirtyHome bool
	named     bool  // the file's name is durable at metadata (false: made here, no synced report yet)
	err       error // sticky: an fsync of the file failed
	// size and mtime as of the file's last record (or its replay): what
	// a checkpoint reports of a file not written since it was opened;
	// size -1 until there is one.
	size, mtime int64
	last        uint64 // lsn of the file's last live record, 0 if none; protected by stager.mu
	refs        int    // open blobs; protected by stager.mu
}

// markChanged records that pages [p0, p1) take new bytes in the cache.
// Call it before the size covers them.
func (f *stagedFile) markChanged(p0, p1 uint64) {
	if p1 > maxChangedPages {
		f.markHome() // a bitmap this large is not worth it: the fsync syncs home
		return
	}
	f.mu.Lock()
	for p := p0; p < p1; p++ {
		if !bitGet(f.changed, p) {
			bitSet(&f.changed, p)
			f.nchanged++
		}
	}
	f.mu.Unlock()
}

// changedSinceRecord says whether page p may hold bytes no record of the
// file has: written into the cache since the last record, or a change
// that went to the blob (dirtyHome).
func (f *stagedFile) changedSinceRecord(p uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dirtyHome || bitGet(f.changed, p)
}

// failure returns the file's sticky fsync failure, nil if none.
func (f *stagedFile) failure() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// markHome records a change that goes to the blob, not the cache. Call
// it before the change.
func (f *stagedFile) markHome() {
	f.mu.Lock()
	f.dirtyHome = true
	f.mu.Unlock()
}

// cleanLocked reports whether nothing of the file waits for the log or
// the metadata service: the state may be forgotten (a file whose fsync
// failed keeps its sticky error while it is open only). A new file's name
// not made durable yet keeps it: the checkpointer makes the name durable
// (a synced report) once the file is closed.
func (f *stagedFile) cleanLocked() bool {
	return f.nchanged == 0 && !f.dirtyHome && f.last == 0 && f.named
}

// testAfterMark, set by tests only (SetAfterMark), runs in a cached write
// between marking its pages changed and extending the size.
var testAfterMark func()

// testAfterTruncateLog, set by tests only (SetAfterTruncateLog), runs in
// a truncate that shrinks a file between logging the cut and making it.
var testAfterTruncateLog func()

// maxChangedPages bounds the pages a file's changed bitmap covers (4 GiB
// of file: a 128 KiB bitmap); a write past it marks the file dirtyHome.
const maxChangedPages = 1 << 20

// checkpointAfter is how long the checkpointer lets records gather
// before a pass (it runs at once when poked).
const checkpointAfter = 200 * time.Millisecond

// newStager makes the staging state of s; open opens the log.
func newStager(s *Service) *stager {
	st := &stager{svc: s, files: map[backend.BlobID]*stagedFile{}, kick: make(chan struct{}, 1),
		resync: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	st.room = sync.NewCond(&st.mu)
	return st
}

// open opens the staging log (making it of blocks blocks on a store that
// has none), replays its live records into their blobs and syncs them;
// the first resync calls it, once the store is known to be this stack's
// and before any session can attach (start then runs the checkpointer).
// (The resync's reply then carries the replayed files' sizes:
// stagedSizes.)
func (st *stager) open(blocks uint64) error {
	s := st.svc
	b, err := s.be.Open(backend.StagingBlob)
	if errors.Is(err, syscall.ENOENT) {
		if blocks, err = st.fit(blocks); err != nil {
			return err
		}
		if err = s.be.Create(backend.StagingBlob); err == nil {
			if b, err = s.be.Open(backend.StagingBlob); err == nil {
				if err = staging.Format(b, blocks); err == nil {
					err = s.be.Sync()
				}
				if err != nil {
					b.Close()
					_ = s.be.Delete(backend.StagingBlob)
				}
			}
		}
		if err != nil {
			return fmt.Errorf("make the staging log: %w", err)
		}
		s.log.Info("staging log made", "ring_bytes", blocks*staging.BlockSize)
	} else if err != nil {
		return fmt.Errorf("open the staging log: %w", err)
	}
	l, recs, err := staging.Open(b)
	if err != nil {
		b.Close()
		return fmt.Errorf("open the staging log: %w", err)
	}
	ring := l.Stats().RingBytes / staging.BlockSize
	// A record takes at most a quarter of the ring: more changed pages
	// than that are made durable at home instead (plan).
	st.maxBlocks = int(min(ring/4, staging.MaxRecordBlocks))
	if uint64(ring) != blocks {
		s.log.Warn("the staging log keeps the size it was made with", "ring_bytes", ring*staging.BlockSize, "configured", blocks*staging.BlockSize)
	}
	if err := st.replay(recs); err != nil {
		b.Close()
		return err
	}
	st.log, st.blob = l, b
	st.opened.Store(true)
	return nil
}

// minStagingBlocks is the smallest ring fit makes (1 MiB, config's
// MinStagingSize).
const minStagingBlocks = (1 << 20) / staging.BlockSize

// fit returns the ring a new staging log gets on this store: blocks, or
// less where the store has not twice that room free: a quarter of what is
// free, at least 1 MiB (logged, naming io.staging_size). The log is
// written whole when it is made, so that its appends never need new
// space; a store that cannot hold the smallest is an error that says so.
func (st *stager) fit(blocks uint64) (uint64, error) {
	sp, ok := st.svc.be.(backend.Spacer)
	if !ok {
		return blocks, nil
	}
	space, err := sp.Space()
	if err != nil {
		return blocks, nil // the format itself says what is wrong, if anything
	}
	free := space.Avail / staging.BlockSize
	if free >= 2*blocks {
		return blocks, nil
	}
	fit := max(free/4/minStagingBlocks*minStagingBlocks, minStagingBlocks)
	if fit+minStagingBlocks > free {
		return 0, fmt.Errorf("make the staging log: the store has %d bytes free, too little for the smallest log (%d bytes; io.staging_size = 0 turns the log off): %w",
			space.Avail, minStagingBlocks*staging.BlockSize, syscall.ENOSPC)
	}
	if fit < blocks {
		st.svc.log.Warn("the store has too little room for the staging log configured: made smaller (set io.staging_size to choose)",
			"configured", blocks*staging.BlockSize, "ring_bytes", fit*staging.BlockSize, "free", space.Avail)
		return fit, nil
	}
	return blocks, nil
}

// start runs the checkpointer (once the resync that opened the log has
// set the data version floor: its reports must be newer than any the
// metadata service applied), unless Shutdown began meanwhile.
func (st *stager) start() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stopping || st.started {
		return
	}
	st.started = true
	if st.svc.opts.JournalSocket == "" {
		go st.checkpointer()
	} else {
		close(st.done) // the journal service checkpoints
	}
}

// Replay opens the staging log on be, a stopped IO service's store,
// replays its live records into their blobs, as the service's start does
// before it serves anyone, and trims them: the caller records the blobs'
// sizes (weir check --repair does; tests that recover a power cut's image
// read the blobs). It returns how many records it applied; a store
// without a log has none.
func Replay(be backend.Backend, log hclog.Logger) (int, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	b, err := be.Open(backend.StagingBlob)
	if errors.Is(err, syscall.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open the staging log: %w", err)
	}
	b.Close()
	s := &Service{be: be, log: log}
	s.creates.be = be
	st := newStager(s)
	if err := st.open(16); err != nil {
		return 0, err
	}
	defer st.blob.Close()
	if n := len(st.recs); n > 0 {
		if err := st.log.Trim(st.recs[n-1].lsn); err != nil {
			return 0, fmt.Errorf("trim the staging log: %w", err)
		}
	}
	return int(st.Replayed.Load()), nil
}

// validRecord says why a record (whole and checksummed: the log's own)
// names nothing replay can apply, or "".
func validRecord(r *staging.Record) string {
	switch {
	case r.Blob == 0 || r.Blob == uint64(backend.StagingBlob) || r.Blob >= 1<<48 || r.Ino != r.Blob:
		return fmt.Sprintf("blob %d of inode %d", r.Blob, r.Ino)
	case r.Size > backend.MaxBlobSize:
		return fmt.Sprintf("size %d", r.Size)
	}
	for _, e := range r.Extents {
		if e.First > uint64(backend.MaxBlobSize)/staging.PageSize-uint64(e.Pages) {
			return fmt.Sprintf("pages %d+%d", e.First, e.Pages)
		}
	}
	return ""
}

// replay applies the live records to their blobs, in lsn order, skipping
// each file's records before its last FlagHome one and each record's bytes
// past a later FlagTruncate record's cut (the cut's page written whole,
// zeros past the cut), sets each blob to its last
// record's size, and syncs each blob
// after its last record (then closes it: only blobs whose records
// interleave are open together). The records stay
// live: the checkpointer trims them once the sizes are durable at
// metadata (a crash before that replays them again, to the same result).
// A record replay cannot apply (its fields out of range: not one this
// code wrote) is skipped and logged.
func (st *stager) replay(recs []staging.Record) error {
	st.recs, st.files = nil, map[backend.BlobID]*stagedFile{} // a failed open may be tried again
	if len(recs) == 0 {
		return nil
	}
	s := st.svc
	from := map[uint64]uint64{} // blob -> lsn of its last FlagHome record
	last := map[uint64]int{}    // blob -> index of its last record
	// cutAfter[i]: the smallest size a truncate record of record i's blob
	// after it cut the file to: record i's bytes past it are older than
	// the cut, and home past it holds only what came after the cut.
	cutAfter := make([]int64, len(recs))
	cut := map[uint64]int64{}
	for i := len(recs) - 1; i >= 0; i-- {
		r := &recs[i]
		c, ok := cut[r.Blob]
		if !ok {
			c = math.MaxInt64
		}
		cutAfter[i] = c
		if r.Flags&staging.FlagTruncate != 0 {
			cut[r.Blob] = min(c, r.Size)
		}
	}
	for i, r := range recs {
		if r.Flags&staging.FlagHome != 0 {
			from[r.Blob] = r.LSN
		}
		last[r.Blob] = i
	}
	files := 0
	open := map[backend.BlobID]backend.Blob{}
	defer func() {
		for _, b := range open {
			b.Close()
		}
	}()
	for i := range recs {
		r := &recs[i]
		id := backend.BlobID(r.Blob)
		if why := validRecord(r); why != "" {
			st.recs = append(st.recs, stagedRec{lsn: r.LSN}) // void: trimmed with the rest, names no file
			st.Skipped.Add(1)
			s.log.Error("staging record not replayed: its fields are out of range", "lsn", r.LSN, "why", why)
			continue
		}
		st.recs = append(st.recs, stagedRec{lsn: r.LSN, id: id, ino: r.Ino})
		f := st.fileLocked(id, r.Ino)
		f.last, f.size, f.mtime = r.LSN, r.Size, r.MtimeNs
		if r.LSN < from[r.Blob] {
			continue // its file's home holds a later state
		}
		// (A FlagTruncate record has no extents: below, only the cut.)
		b := open[id]
		if b == nil {
			var err error
			b, err = s.be.Open(id)
			if errors.Is(err, syscall.ENOENT) {
				// Its create was not durable: a blob is deleted only
				// once no live record names it (onDelete).
				if err = s.be.Create(id); err == nil {
					b, err = s.be.Open(id)
				}
			}
			if err != nil {
				return fmt.Errorf("replay staging record %d (blob %d): %w", r.LSN, id, err)
			}
			open[id] = b
		}
		at := 0
		for _, e := range r.Extents {
			n := int(e.Pages) * staging.PageSize
			data, off := r.Data[at:at+n], int64(e.First)*staging.PageSize
			at += n
			// Not past a later cut: those bytes are older than it. The
			// page the cut falls in is written whole, zeros past the cut
			// (the file's bytes there once it was cut): home may hold that
			// page in a later state, and half of each is a page the file
			// never had (TestReplayKeepsACutPageWhole). A later write to
			// the page is in a later record, which replay applies after.
			if c := cutAfter[i]; off+int64(len(data)) > c {
				keep := max(0, c-off)
				whole := min(int64(len(data)), max(keep, alignPage(c)-off))
				if whole > keep {
					data = slices.Clone(data[:whole])
					clear(data[keep:])
				} else {
					data = data[:keep]
				}
			}
			if len(data) == 0 {
				continue
			}
			if _, err := b.WriteAt(data, off); err != nil {
				return fmt.Errorf("replay staging record %d (blob %d): %w", r.LSN, id, err)
			}
		}
		// The size: the blob's last record's only. No cut in between (an
		// earlier record's size, or a truncate record's): that would tear
		// a page home holds in a later state (TestCrash found both).
		if last[r.Blob] == i {
			if err := b.Truncate(r.Size); err != nil {
				return fmt.Errorf("replay staging record %d (blob %d): size %d: %w", r.LSN, id, r.Size, err)
			}
		}
		st.Replayed.Add(1)
		if last[r.Blob] == i {
			if err := b.Sync(); err != nil {
				return fmt.Errorf("replay staging: sync blob %d: %w", id, err)
			}
			b.Close()
			delete(open, id)
			files++
		}
	}
	if err := s.be.Sync(); err != nil {
		return fmt.Errorf("replay staging: sync the backend: %w", err)
	}
	s.log.Info("staging log replayed", "records", len(recs), "files", files)
	return nil
}

// alignPage rounds n up to a multiple of the staging page size.
func alignPage(n int64) int64 {
	return (n + staging.PageSize - 1) / staging.PageSize * staging.PageSize
}

// fileLocked returns the staging state of blob id, making it. st.mu is
// held (or st is not shared yet).
func (st *stager) fileLocked(id backend.BlobID, ino uint64) *stagedFile {
	f := st.files[id]
	if f == nil {
		f = &stagedFile{id: id, ino: ino, named: true, size: -1}
		st.files[id] = f
	}
	return f
}

// attach gives an opened blob its staging state; fresh says the file is
// new (its name is not durable until a synced report).
func (st *stager) attach(ob *openBlob, fresh bool) {
	st.mu.Lock()
	f := st.fileLocked(ob.id, ob.ino)
	f.refs++
	st.mu.Unlock()
	if fresh {
		f.mu.Lock()
		f.named = false
		f.mu.Unlock()
	}
	ob.sf = f
}

// detach drops an open blob's reference, forgetting a file that has
// nothing staged.
func (st *stager) detach(f *stagedFile) {
	st.mu.Lock()
	defer st.mu.Unlock()
	f.refs--
	f.mu.Lock()
	forget := f.refs == 0 && f.cleanLocked()
	f.mu.Unlock()
	if forget && st.files[f.id] == f {
		delete(st.files, f.id)
	}
}

// fsync makes ob durable through the log: see the package comment above.
// On a failure the file's later fsyncs fail too (EIO, as Linux's errseq
// reports a lost write-back once per open file and weir for good).
func (s *Service) stagedSync(ob *openBlob) syscall.Errno { return s.stagedSyncAs(ob, noUID) }

// stagedSyncAs is stagedSync for a client of uid: past the uid's share of
// the log (limits.go) the file goes home instead of into a record.
func (s *Service) stagedSyncAs(ob *openBlob, uid uint32) syscall.Errno {
	st, f := s.stg, ob.sf
	if !st.opened.Load() {
		return syscall.EIO // no session exists before the log is open
	}
	f.fsyncMu.Lock()
	defer f.fsyncMu.Unlock()
	f.mu.Lock()
	if f.err != nil {
		f.mu.Unlock()
		return syscall.EIO
	}
	f.mu.Unlock()
	// The size and the changes together, no write or truncate of the
	// blob in progress: every write the size covers has marked its pages
	// (and its pages are dirty, for a home sync's write-back), and a
	// change that goes to the device is done or not begun.
	unhold := ob.holdChanges()
	size, mtime, dv := ob.live()
	f.mu.Lock()
	home := f.dirtyHome
	take := f.changed
	nothing := f.nchanged == 0 && !home && size == f.size && f.named
	f.changed, f.nchanged, f.dirtyHome = nil, 0, false
	named := f.named
	f.mu.Unlock()
	unhold()
	if nothing {
		// Nothing changed since the file's last record or checkpoint
		// (an fsync of a file only read, or fsynced twice): no record.
		st.Empty.Add(1)
		return 0
	}
	rec := staging.Record{Blob: uint64(ob.id), Ino: ob.ino, Size: size, MtimeNs: mtime, DataVersion: dv}
	if !home && !st.plan(&rec, take, size) {
		home = true // more than a record should carry: the file's home instead
	}
	if !s.uids.exempt(uid) {
		// The uid's share of the log (limits.go): past it the file goes
		// home, and a uid with no room even for that waits for a pass.
		if !home && !s.stageFits(uid, &rec) {
			home = true
			s.uids.StagingHome.Add(1)
		}
		if home {
			if err := s.awaitStagingShare(uid); err != nil {
				st.failed(f, err, "fsync failed")
				return syscall.EIO
			}
		}
	}
	var err error
	var lsn uint64
	if home {
		rec.Flags, rec.Extents = staging.FlagHome, nil
		err = s.syncHome(ob)
		s.stg.HomeSyncs.Add(1)
	} else {
		err = s.readPages(ob, &rec)
	}
	if err == nil {
		if lsn, err = st.append(&rec); err == nil {
			if blocks, berr := rec.Blocks(); berr == nil {
				s.uids.staged(uid, lsn, uint64(blocks))
			}
			st.register(f, lsn, size, mtime)
			st.Records.Add(1)
			st.PagesStaged.Add(uint64(len(rec.Data) / staging.PageSize))
		}
	}
	if err != nil {
		st.failed(f, err, "fsync failed")
		return syscall.EIO
	}
	if !named {
		// A file made since its name was last durable: the name must
		// survive with the data (as ext4 gives in practice). One synced
		// report makes the metadata service's WAL durable.
		if err := s.reportLive(context.Background(), ob.ino, size, mtime, dv, true); err != nil {
			return metadataErrno(s, ob, err)
		}
		f.mu.Lock()
		f.named = true
		f.mu.Unlock()
	}
	if s.opts.ForegroundCheckpoint {
		// The ablation without background journaling: the fsync
		// returns once its record is checkpointed.
		st.awaitCheckpointed(lsn)
	}
	return 0
}

// register records that f's record lsn (of size and mtime) is durable.
func (st *stager) register(f *stagedFile, lsn uint64, size, mtime int64) {
	st.mu.Lock()
	f.mu.Lock()
	f.size, f.mtime = size, mtime
	f.mu.Unlock()
	f.last = max(f.last, lsn)
	// In lsn order: appends return out of order, and a trim covers only
	// a run of registered records (checkpoint).
	i, _ := slices.BinarySearchFunc(st.recs, lsn, func(r stagedRec, l uint64) int { return cmp.Compare(r.lsn, l) })
	st.recs = slices.Insert(st.recs, i, stagedRec{lsn: lsn, id: f.id, ino: f.ino})
	st.mu.Unlock()
}

// logTruncate logs, durably, that ob is about to be cut to size (a
// truncate that shrinks it), before the blob is cut: replay then cuts it
// there too, so that no earlier record's size and pages past the cut
// come back over a home that lost them. It costs one flush of the log
// (shared with concurrent fsyncs). A failure is the file's fsync failure
// too (sticky EIO).
func (s *Service) logTruncate(ob *openBlob, size int64) error {
	st, f := s.stg, ob.sf
	if !st.opened.Load() {
		return syscall.EIO
	}
	f.mu.Lock()
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return syscall.EIO
	}
	mtime := time.Now().UnixNano()
	lsn, err := st.append(&staging.Record{Blob: uint64(ob.id), Ino: ob.ino, Size: size, MtimeNs: mtime, DataVersion: ob.dv.Load(), Flags: staging.FlagTruncate})
	if err != nil {
		st.failed(f, err, "truncate: logging the cut failed")
		return syscall.EIO
	}
	st.register(f, lsn, size, mtime)
	st.Truncates.Add(1)
	return nil
}

// failed makes err f's sticky failure: every later fsync of the file
// returns EIO, and nothing of it is staged again.
func (st *stager) failed(f *stagedFile, err error, what string) {
	f.mu.Lock()
	if f.err == nil {
		st.FailedFiles.Add(1)
	}
	f.err = err
	f.changed, f.nchanged = nil, 0
	f.mu.Unlock()
	st.lastErr.Store(&err)
	st.svc.log.Error(what+": this and every later fsync of the file return EIO", "blob", f.id, "ino", f.ino, "error", err)
}

// isRefusal says the metadata service answered and refused (as opposed to
// not being reachable).
func isRefusal(err error) bool {
	var ref *control.Refusal
	return errors.As(err, &ref)
}

// metadataErrno is the answer of an fsync whose synced report failed.
func metadataErrno(s *Service, ob *openBlob, err error) syscall.Errno {
	if fileGone(err) {
		return errFileGone // (no client holds it: a syncfs of a closed file removed since)
	}
	if isRefusal(err) {
		s.log.Error("fsync: metadata refused the size", "blob", ob.id, "error", err)
		return syscall.EIO
	}
	s.log.Warn("fsync: the metadata service did not record the size (not reachable)", "blob", ob.id, "error", err)
	return errMetadataUnreachable
}

// syncHome makes the blob's whole state durable at home: its dirty pages
// written, the blob and its create synced.
func (s *Service) syncHome(ob *openBlob) error {
	if err := s.flushBlob(ob, true); err != nil {
		return fmt.Errorf("write back blob %d: %w", ob.id, err)
	}
	if err := ob.b.Sync(); err != nil {
		err = fmt.Errorf("sync blob %d: %w", ob.id, err)
		s.syncFailed(err)
		return err
	}
	if err := s.creates.sync(); err != nil {
		err = fmt.Errorf("sync backend (blob creates): %w", err)
		s.syncFailed(err)
		return err
	}
	return nil
}

// plan sets rec's extents to the pages of take (a page bitmap) below
// size, in runs inside one cache chunk; false when the record they make
// would be larger than a record of this log should be.
func (st *stager) plan(rec *staging.Record, take []uint64, size int64) bool {
	pages := bitList(take, 0)
	last := (uint64(size) + staging.PageSize - 1) / staging.PageSize
	for len(pages) > 0 && pages[len(pages)-1] >= last {
		pages = pages[:len(pages)-1]
	}
	if len(pages) > st.maxBlocks {
		return false
	}
	for i := 0; i < len(pages); {
		n := 1
		for i+n < len(pages) && pages[i+n] == pages[i]+uint64(n) && pages[i+n]/cache.ChunkPages == pages[i]/cache.ChunkPages {
			n++
		}
		rec.Extents = append(rec.Extents, staging.Extent{First: pages[i], Pages: uint32(n)})
		i += n
	}
	blocks, err := rec.Blocks()
	return err == nil && blocks <= st.maxBlocks
}

// readPages fills rec.Data with the pages of its extents, as a read now
// would return them: from the cache, each page held while it is copied,
// or from the blob for a page the cache does not hold.
func (s *Service) readPages(ob *openBlob, rec *staging.Record) error {
	n := 0
	for _, e := range rec.Extents {
		n += int(e.Pages)
	}
	rec.Data = make([]byte, n*staging.PageSize)
	at := 0
	for _, e := range rec.Extents {
		end := at + int(e.Pages)*staging.PageSize
		if err := s.copyPages(ob, rec.Data[at:end], e.First); err != nil {
			return err
		}
		at = end
	}
	return nil
}

// copyPages copies len(dst)/PageSize pages from page p0 (one cache chunk
// at most) into dst.
func (s *Service) copyPages(ob *openBlob, dst []byte, p0 uint64) error {
	n := uint64(len(dst) / staging.PageSize)
	r, ungate := ob.cachedGated()
	defer ungate()
	if r != nil {
		r.life.RLock()
		defer r.life.RUnlock()
		r.trunc.RLock()
		defer r.trunc.RUnlock()
	}
	if r == nil || r.closed {
		return deviceCopy(ob.b, dst, int64(p0)*staging.PageSize)
	}
	lr, err := r.lock(p0, p0+n)
	if err != nil {
		return fmt.Errorf("hold pages %d-%d of blob %d: %w", p0, p0+n-1, ob.id, err)
	}
	defer lr.release()
	for i := range n {
		d := dst[i*staging.PageSize : (i+1)*staging.PageSize]
		if lr.was[i] == cache.KindResident {
			src, err := lr.cr.Data(p0+i, 1)
			if err != nil {
				return fmt.Errorf("read page %d of blob %d from the cache: %w", p0+i, ob.id, err)
			}
			copy(d, src)
			continue
		}
		if err := deviceCopy(ob.b, d, int64(p0+i)*staging.PageSize); err != nil {
			return err
		}
	}
	return nil
}

// deviceCopy reads dst at off from the blob; past its end reads zeros.
func deviceCopy(b backend.Blob, dst []byte, off int64) error {
	n, err := b.ReadAt(dst, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read blob %d at %d: %w", b.ID(), off, err)
	}
	clear(dst[n:])
	return nil
}

// append writes rec, waiting for room while the log is full; it gives up
// (EIO) once the service's storage failed (no checkpoint can make room)
// or the service stops.
func (st *stager) append(rec *staging.Record) (uint64, error) {
	waited := false
	for {
		lsn, err := st.log.Append(rec)
		if !errors.Is(err, staging.ErrFull) {
			return lsn, err
		}
		if p := st.svc.syncFailure.Load(); p != nil {
			return 0, fmt.Errorf("staging log full, and no checkpoint can make room: %w", *p)
		}
		if !waited {
			waited = true
			st.FullWaits.Add(1)
		}
		st.Waiting.Add(1)
		st.mu.Lock()
		pass := st.pass
		st.poke()
		for st.pass == pass && st.log.Stats().Live > 0 && !st.stopping {
			st.room.Wait()
		}
		stopping := st.stopping
		st.mu.Unlock()
		st.Waiting.Add(-1)
		if stopping {
			return 0, errors.New("staging log full and the IO service is stopping")
		}
	}
}

// resynced asks the checkpointer for a pass now, even in a backoff: the
// metadata service is back.
func (st *stager) resynced() {
	select {
	case st.resync <- struct{}{}:
	default:
	}
}

// poke asks the checkpointer for a pass now (a no-op before open).
func (st *stager) poke() {
	select {
	case st.kick <- struct{}{}:
	default:
	}
}

// checkpointer runs checkpoint passes: checkpointAfter after the last, at
// once when poked (an fsync waits for room, a delete for the blob's
// records, a resync); after a failed pass only when its backoff ends.
func (st *stager) checkpointer() {
	defer close(st.done)
	t := time.NewTimer(checkpointAfter)
	defer t.Stop()
	backoff := checkpointAfter
	failed := false
	for {
		kick := st.kick
		if failed {
			kick = nil // pokes do not cut a backoff short; a resync does
		}
		select {
		case <-st.stop:
			return
		case <-kick:
		case <-st.resync:
			backoff = checkpointAfter
		case <-t.C:
		}
		err := st.checkpoint(context.Background(), false)
		st.mu.Lock()
		st.pass++
		st.room.Broadcast()
		st.mu.Unlock()
		if failed = err != nil; failed {
			st.lastCkptErr.Store(&err)
			st.svc.log.Warn("checkpoint of the staging log did not finish; it is tried again", "error", err, "retry_in", backoff)
			t.Reset(backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		st.lastCkptErr.Store(nil)
		backoff = checkpointAfter
		t.Reset(checkpointAfter)
	}
}

// checkpoint makes every file of the live records durable at home and its
// size durable at metadata, then trims the log up to the last record it
// covered. A closed file with changes and no live record is synced home
// too, and its changes forgotten. With final (Shutdown) only the live
// records' files. This is the pass io runs itself (no journal service, or
// at Shutdown); the journal service runs the same steps over its session
// (journal.go).
func (st *stager) checkpoint(ctx context.Context, final bool) error {
	st.ckptMu.Lock()
	defer st.ckptMu.Unlock()
	b := st.collect(final, 0)
	if b == nil {
		return nil
	}
	var reports []liveReport
	for _, id := range b.order {
		l, err := st.checkpointFile(id, b.todo[id], b.closed[id])
		if err != nil {
			return err
		}
		if l != nil {
			reports = append(reports, *l)
		}
	}
	accepted, err := st.report(ctx, reports)
	if err != nil {
		return err
	}
	return st.commit(b, accepted)
}

// ckptBatch is the work of one checkpoint pass: the files to make durable
// at home and report, and the last record the pass covers.
type ckptBatch struct {
	id         uint64
	trim, upto uint64                    // the log's trim point when collected; the pass trims up to upto
	todo       map[backend.BlobID]uint64 // blob -> inode
	closed     map[backend.BlobID]bool   // closed files with changes and no live record
	order      []backend.BlobID          // todo's blobs, ascending
	// resyncs is the service's resync count when collected: reports of
	// one incarnation of the metadata service only, since a restart
	// between them would lose those not yet synced.
	resyncs uint64
}

// collect returns the next pass's batch, nil if there is nothing to do.
// limit > 0 bounds its files: the records it covers stop before the first
// whose file would be one too many.
func (st *stager) collect(final bool, limit int) *ckptBatch {
	b := &ckptBatch{trim: st.log.Stats().TrimLSN, todo: map[backend.BlobID]uint64{}, closed: map[backend.BlobID]bool{}}
	full := func(id backend.BlobID) bool {
		_, ok := b.todo[id]
		return limit > 0 && !ok && len(b.todo) >= limit
	}
	st.mu.Lock()
	// Only a run of registered records from the trim point: a record
	// with a smaller lsn may still be on its way (appended, not yet
	// registered), and its file would not be checkpointed.
	b.upto = b.trim
	for _, r := range st.recs {
		if r.lsn != b.upto+1 || (r.id != 0 && full(r.id)) {
			break
		}
		b.upto = r.lsn
		if r.id != 0 {
			b.todo[r.id] = r.ino
		}
	}
	for id, f := range st.files {
		if final {
			break
		}
		f.mu.Lock()
		if f.refs == 0 && f.last == 0 && (f.nchanged > 0 || f.dirtyHome || !f.named) && !full(id) {
			if _, ok := b.todo[id]; !ok {
				b.todo[id] = f.ino
				b.closed[id] = true
			}
		}
		f.mu.Unlock()
	}
	st.mu.Unlock()
	if len(b.todo) == 0 && b.upto == b.trim {
		return nil
	}
	b.order = slices.Sorted(maps.Keys(b.todo))
	b.resyncs = st.svc.resyncs.Load()
	return b
}

// commit ends the pass of b, whose files are durable at home and whose
// accepted reports the metadata service made durable: it marks their
// names durable, trims the log up to b.upto and forgets what the trim
// covered.
func (st *stager) commit(b *ckptBatch, accepted []*liveReport) error {
	if st.svc.resyncs.Load() != b.resyncs {
		return errors.New("the metadata service resynchronised during the checkpoint's reports")
	}
	st.mu.Lock()
	for _, l := range accepted {
		l.f.mu.Lock()
		l.f.named = true // made durable by the synced report
		if l.f.last <= b.upto {
			// No record since the batch: the size reported is the
			// file's durable state. A later record's size stays
			// (register sets it with last, under st.mu): an fsync
			// compares with it to find nothing to stage.
			l.f.size = l.size
		}
		l.f.mu.Unlock()
	}
	st.mu.Unlock()
	if b.upto > b.trim {
		if err := st.log.Trim(b.upto); err != nil {
			return fmt.Errorf("trim the staging log: %w", err)
		}
	}
	st.mu.Lock()
	i := 0
	for i < len(st.recs) && st.recs[i].lsn <= b.upto {
		i++
	}
	st.recs = slices.Delete(st.recs, 0, i)
	for id, f := range st.files {
		f.mu.Lock()
		if f.last <= b.upto {
			f.last = 0
		}
		if f.refs == 0 && f.cleanLocked() {
			delete(st.files, id)
		}
		f.mu.Unlock()
	}
	st.mu.Unlock()
	st.Passes.Add(1)
	return nil
}

// report sends the size reports, then makes them durable with one synced
// report (of the last file still there), and returns the reports taken:
// a report refused because its file is gone needs nothing more; any
// other failure fails the pass.
func (st *stager) report(ctx context.Context, reports []liveReport) ([]*liveReport, error) {
	s := st.svc
	var accepted []*liveReport
	for i := range reports {
		l := &reports[i]
		err := s.reportLive(ctx, l.ino, l.size, l.mtime, l.dv, false)
		switch {
		case err == nil:
			accepted = append(accepted, l)
		case !fileGone(err):
			return nil, err
		}
	}
	for k := len(accepted) - 1; k >= 0; k-- {
		l := accepted[k]
		err := s.reportLive(ctx, l.ino, l.size, l.mtime, l.dv, true)
		if err == nil {
			break
		}
		if !fileGone(err) {
			return nil, err
		}
		accepted = accepted[:k] // gone since: its report needs nothing more
	}
	return accepted, nil
}

// fileGone says a report was refused because its file no longer exists.
func fileGone(err error) bool {
	var ref *control.Refusal
	return errors.As(err, &ref) && strings.HasPrefix(ref.Msg, "unknown_file:")
}

// liveReport is a size report to send to metadata.
type liveReport struct {
	f           *stagedFile
	ino         uint64
	size, mtime int64
	dv          uint64
}

// checkpointFile makes blob id durable at home and returns its size
// report; nil when the blob is being deleted (its records are void). A
// closed file without live records (forget) also has its changes taken
// out of its staging state, unless an fsync of it runs.
func (st *stager) checkpointFile(id backend.BlobID, ino uint64, forget bool) (*liveReport, error) {
	s := st.svc
	st.mu.Lock()
	_, known := st.files[id]
	st.mu.Unlock()
	if !known {
		// Deleted since the batch was made (onDelete forgot it): opening
		// it now would make the blob again.
		return nil, nil
	}
	s.mu.Lock()
	ob, err := s.openBlobLocked(id, ino, false)
	s.mu.Unlock()
	if err != nil {
		if errors.Is(err, syscall.EBUSY) {
			return nil, nil // being deleted: nothing to keep
		}
		return nil, fmt.Errorf("checkpoint blob %d: %w", id, err)
	}
	defer s.releaseBlob(ob)
	f := ob.sf
	var take []uint64
	var home bool
	if forget && f.fsyncMu.TryLock() {
		defer f.fsyncMu.Unlock()
		unhold := ob.holdChanges()
		f.mu.Lock()
		if f.last == 0 {
			take, home = f.changed, f.dirtyHome
			f.changed, f.nchanged, f.dirtyHome = nil, 0, false
		}
		f.mu.Unlock()
		unhold()
	}
	size, mtime, dv := ob.live()
	f.mu.Lock()
	if !ob.wrote.Load() {
		// Not written since this opening (often the checkpointer's
		// own): the mtime of its last record, or none to report.
		mtime = f.mtime
	}
	f.mu.Unlock()
	if err := s.syncHome(ob); err != nil {
		f.mu.Lock()
		for _, p := range bitList(take, 0) {
			if !bitGet(f.changed, p) {
				bitSet(&f.changed, p)
				f.nchanged++
			}
		}
		f.dirtyHome = f.dirtyHome || home
		f.mu.Unlock()
		return nil, err
	}
	st.Checkpoints.Add(1)
	// mtime 0 (no write here, no record): the metadata service keeps its.
	return &liveReport{f: f, ino: ino, size: size, mtime: mtime, dv: dv}, nil
}

// stagedSizes returns a size report of every file with live records: the
// size io serves it with (its blob's, or its open blob's live size), the
// mtime of its last write here or its last record, and a new data
// version (the resync set the floor: newer than any report applied).
func (st *stager) stagedSizes() []control.SetLive {
	if !st.opened.Load() {
		return nil
	}
	s := st.svc
	st.mu.Lock()
	var files []*stagedFile
	for _, f := range st.files {
		if f.last != 0 {
			files = append(files, f)
		}
	}
	st.mu.Unlock()
	var out []control.SetLive
	for _, f := range files {
		s.mu.Lock()
		ob, err := s.openBlobLocked(f.id, f.ino, false)
		s.mu.Unlock()
		if err != nil {
			continue // being deleted
		}
		size, mtime, _ := ob.live()
		f.mu.Lock()
		if !ob.wrote.Load() {
			mtime = f.mtime
		}
		f.mu.Unlock()
		s.releaseBlob(ob)
		out = append(out, control.SetLive{Ino: f.ino, Size: size, Mtime: mtime, DV: s.dv.Add(1)}) // mtime 0: kept
	}
	return out
}

// awaitTrimmed returns once no live record names blob id (true), poking
// the checkpointer, or false when the service stops first.
func (st *stager) awaitTrimmed(id backend.BlobID) bool {
	if !st.opened.Load() {
		// Metadata asks for deletes only after its resync, which opens
		// the log first: none can come before.
		return true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		f := st.files[id]
		if f == nil || f.last == 0 {
			return true
		}
		if st.stopping {
			return false
		}
		st.poke()
		st.room.Wait()
	}
}

// endWaits ends every wait for the checkpointer: fsyncs waiting for room
// fail (EIO: not acknowledged), deletes in awaitTrimmed give up
// (Shutdown, before the sessions end).
func (st *stager) endWaits() {
	st.mu.Lock()
	st.stopping = true
	st.room.Broadcast()
	st.mu.Unlock()
}

// forget drops the staging state of blob id once the blob is deleted: no
// live record names it (onDelete waited for that), no session has it
// open, and its changes went with it.
func (st *stager) forget(id backend.BlobID) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if f := st.files[id]; f != nil && f.refs == 0 && f.last == 0 {
		delete(st.files, id)
	}
}

// halt stops the checkpointer and every wait for it (Shutdown, before it
// waits for background work: deletes wait in awaitTrimmed).
func (st *stager) halt() {
	st.endWaits()
	st.mu.Lock()
	started := st.started
	st.mu.Unlock()
	close(st.stop)
	if started {
		<-st.done
	}
}

// close ends the log at Shutdown, after halt and after the open blobs
// were synced and reported: a last checkpoint, so that a clean stop
// leaves the log empty. If it cannot finish (the metadata service stops
// first, the usual order), every file of a live record, synced home
// just now, gets a FlagHome record of its state: the next start's replay
// then keeps what was written after its last fsync.
func (st *stager) close(ctx context.Context) error {
	if !st.opened.Load() {
		return nil
	}
	err := st.checkpoint(ctx, true)
	if err != nil {
		st.mu.Lock()
		var files []*stagedFile
		for _, r := range st.recs {
			if f := st.files[r.id]; f != nil && !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
		st.mu.Unlock()
		kept := 0
		for _, f := range files {
			if st.homeRecord(f) == nil {
				kept++
			}
		}
		lvl := hclog.Info
		if kept < len(files) {
			// A file without its home record: the next start's replay
			// takes it back to its last fsync (the log was full, or the
			// device failed).
			lvl = hclog.Error
		}
		st.svc.log.Log(lvl, "staging records stay live for the next start to replay (the metadata service could not take the sizes)",
			"records", st.log.Stats().Live, "files", len(files), "home_records", kept, "reason", err)
		err = nil
	}
	if cerr := st.blob.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// homeRecord syncs f's blob home and appends a FlagHome record of its
// size and mtime (Shutdown, the checkpoint not finished).
func (st *stager) homeRecord(f *stagedFile) error {
	s := st.svc
	s.mu.Lock()
	ob, err := s.openBlobLocked(f.id, f.ino, false)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	defer s.releaseBlob(ob)
	if err := s.syncHome(ob); err != nil {
		return err
	}
	size, mtime, dv := ob.live()
	f.mu.Lock()
	if !ob.wrote.Load() {
		mtime = f.mtime
	}
	f.mu.Unlock()
	_, err = st.log.Append(&staging.Record{Blob: uint64(f.id), Ino: f.ino, Size: size, MtimeNs: mtime, DataVersion: dv, Flags: staging.FlagHome})
	return err
}

// snapshot adds the log's state to the stats.
func (st *stager) snapshot(m map[string]any) {
	if !st.opened.Load() {
		return
	}
	ls := st.log.Stats()
	m["staging_ring_bytes"] = ls.RingBytes
	m["staging_used_bytes"] = ls.UsedBytes
	m["staging_live_records"] = ls.Live
	m["staging_records"] = st.Records.Load()
	m["staging_pages"] = st.PagesStaged.Load()
	m["staging_flushes"] = st.log.Flushes.Load()
	m["staging_lone_writes"] = st.log.LoneWrites.Load() // of the flushes, lone appends' durable writes
	m["staging_home_syncs"] = st.HomeSyncs.Load()
	m["staging_full_waits"] = st.FullWaits.Load()
	m["staging_waiting"] = st.Waiting.Load()
	m["staging_checkpoint_passes"] = st.Passes.Load()
	if st.svc.opts.JournalSocket != "" {
		connected := st.svc.journalConnected()
		m["journal_connected"] = connected
		m["journal_batches"] = st.JournalBatches.Load()
		m["journal_commits"] = st.JournalCommits.Load()
		failing := st.journalFailing.Load()
		m["journal_failing_passes"] = failing
		switch {
		case st.Waiting.Load() == 0:
		case !connected:
			m["staging_backpressure"] = "fsyncs wait for a checkpoint (the staging log is full) and no journal service is connected: they wait until one is"
		case failing > 0:
			m["staging_backpressure"] = fmt.Sprintf("fsyncs wait for a checkpoint (the staging log is full) and the journal service's last %d passes failed (its last_error in weir status says why)", failing)
		}
	}
	m["staging_checkpointed_files"] = st.Checkpoints.Load()
	m["staging_replayed"] = st.Replayed.Load()
	m["staging_replay_skipped"] = st.Skipped.Load()
	m["staging_empty_fsyncs"] = st.Empty.Load()
	m["staging_truncates"] = st.Truncates.Load()
	if p := st.lastCkptErr.Load(); p != nil {
		m["staging_checkpoint_error"] = (*p).Error()
	}
	m["fsync_failed_files"] = st.FailedFiles.Load()
	if ls.Err != nil {
		m["staging_error"] = ls.Err.Error()
	}
	if p := st.lastErr.Load(); p != nil {
		m["fsync_last_error"] = (*p).Error()
	}
}
