package iosvc_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/faulty"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/services/io/backend/powercut"
	"github.com/weir-storage/weir/stack/stacktest"
)

// stagedFile is the model of one file in TestStagedFsyncPowerCuts: every
// state it had since its last acknowledged fsync, that one first.
type modelFile struct {
	name   string
	f      *client.File
	direct *client.File // an O_DIRECT handle of the same file
	blob   backend.BlobID
	cur    []byte
	states [][]byte // states[0] is what the last acknowledged fsync covers
	gone   bool     // removed, and its blob deleted
}

func (m *modelFile) changed() { m.states = append(m.states, slices.Clone(m.cur)) }

// check holds a file found after a cut against the model: its size lies
// between the smallest and the largest of its states since the
// acknowledged fsync (write-back may have taken a later state home in
// part), and each page holds the bytes of one of them (a write not
// acknowledged may be kept, lost, or kept in part, page by page, as on
// Linux).
func (m *modelFile) check(t *testing.T, got []byte, what string) {
	t.Helper()
	lo, hi := len(m.states[0]), len(m.states[0])
	for _, s := range m.states {
		lo, hi = min(lo, len(s)), max(hi, len(s))
	}
	if len(got) < lo || len(got) > hi {
		t.Fatalf("%s: %s has %d bytes after the cut; its states since the acknowledged fsync have %d to %d", what, m.name, len(got), lo, hi)
	}
	for off := 0; off < len(got); off += 4096 {
		end := min(off+4096, len(got))
		ok := false
		for i, s := range m.states {
			if !stacktest.Padded(m.states, i, end) {
				continue
			}
			want := make([]byte, end-off)
			if off < len(s) {
				copy(want, s[off:min(end, len(s))])
			}
			ok = ok || bytes.Equal(got[off:end], want)
		}
		if !ok {
			var runs []string
			for _, st := range m.states {
				runs = append(runs, stacktest.PageRuns(st, off, end))
			}
			t.Fatalf("%s: %s page %d holds bytes of none of its %d states since the acknowledged fsync (acknowledged: %d bytes, found %d): found %s; states %s",
				what, m.name, off/4096, len(m.states), len(m.states[0]), len(got), stacktest.PageRuns(got, off, end), strings.Join(runs, " | "))
		}
	}
}

// TestStagedFsyncPowerCuts runs a random workload on a few files, cached
// and direct writes, overwrites, appends, truncates both ways, closes and
// reopens, removes, against an IO service on the power-cut model, with the
// checkpointer trimming the log meanwhile. After every fsync it cuts the
// power and recovers (the replay of io's start): every file holds what its
// last acknowledged fsync covered, or a later state, page by page; a file
// fsynced and not written since holds exactly that; a removed file's blob
// does not come back.
func TestStagedFsyncPowerCuts(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("WEIR_STAGED_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (WEIR_STAGED_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	pc := powercut.New(mem.New())
	e := startIOWith(t, pc, nil, func(c *config.Config) {
		c.IO.CacheSize = 4 << 20 // small: write-through and eviction happen too
		c.IO.StagingSize = 1 << 20
	})
	fsys := e.dial(t)
	defer fsys.Close()
	var files []*modelFile
	for i := range 4 {
		m := &modelFile{name: fmt.Sprintf("f%d", i)}
		f, err := fsys.Create(m.name)
		if err != nil {
			t.Fatal(err)
		}
		m.f, m.blob = f, backend.BlobID(inoOf(t, f))
		m.states = [][]byte{nil}
		files = append(files, m)
	}
	ops, cuts := 400, 0
	if testing.Short() {
		ops = 150
	}
	for i := range ops {
		m := files[rng.IntN(len(files))]
		if m.gone {
			continue
		}
		what := ""
		switch k := rng.IntN(100); {
		case k < 40: // a cached write: small or spanning pages, maybe past the end
			off := rng.IntN(64 << 10)
			n := 1 + rng.IntN(12<<10)
			data := make([]byte, n)
			for j := range data {
				data[j] = byte(rng.IntN(255) + 1)
			}
			if _, err := m.f.WriteAt(data, int64(off)); err != nil {
				t.Fatal(err)
			}
			if end := off + n; end > len(m.cur) {
				m.cur = append(m.cur, make([]byte, end-len(m.cur))...)
			}
			copy(m.cur[off:], data)
			m.changed()
			what = fmt.Sprintf("write %d at %d", n, off)
		case k < 48: // O_DIRECT: aligned, to the device
			if m.direct == nil {
				f, err := fsys.OpenFile(m.name, os.O_RDWR|syscall.O_DIRECT, 0)
				if err != nil {
					t.Fatal(err)
				}
				m.direct = f
			}
			off, n := 4096*rng.IntN(16), 4096*(1+rng.IntN(3))
			data := bytes.Repeat([]byte{byte(1 + rng.IntN(255))}, n)
			if _, err := m.direct.WriteAt(data, int64(off)); err != nil {
				t.Fatal(err)
			}
			if end := off + n; end > len(m.cur) {
				m.cur = append(m.cur, make([]byte, end-len(m.cur))...)
			}
			copy(m.cur[off:], data)
			m.changed()
			what = fmt.Sprintf("direct write %d at %d", n, off)
		case k < 56: // truncate, down or up
			size := rng.IntN(80 << 10)
			if err := m.f.Truncate(int64(size)); err != nil {
				t.Fatal(err)
			}
			if size < len(m.cur) {
				m.cur = m.cur[:size]
			} else {
				m.cur = append(m.cur, make([]byte, size-len(m.cur))...)
			}
			m.changed()
			what = fmt.Sprintf("truncate to %d", size)
		case k < 62: // close and reopen (changes outlive the handle)
			if err := m.f.Close(); err != nil {
				t.Fatal(err)
			}
			f, err := fsys.OpenFile(m.name, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			m.f = f
			continue
		case k < 66: // a burst of fsynced appends: more than the log holds
			for range 24 {
				data := bytes.Repeat([]byte{byte(1 + rng.IntN(255))}, 48<<10)
				if _, err := m.f.WriteAt(data, int64(len(m.cur))); err != nil {
					t.Fatal(err)
				}
				m.cur = append(m.cur, data...)
				if err := m.f.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			m.states = [][]byte{slices.Clone(m.cur)}
			if len(m.cur) > 512<<10 {
				if err := m.f.Truncate(0); err != nil { // keep the files small
					t.Fatal(err)
				}
				m.cur = m.cur[:0]
				m.changed()
			}
			continue
		case k < 68 && len(files) > 2: // remove, and wait for the blob's delete
			for _, h := range []*client.File{m.f, m.direct} {
				if h != nil {
					h.Close()
				}
			}
			if err := fsys.Remove(m.name); err != nil {
				t.Fatal(err)
			}
			// Done at io: metadata has no delete pending. (Not "the blob
			// is not listed": a file never written has no blob yet, and
			// io's delete, which waits for its records to be trimmed, may
			// still be on its way while a cut replays them.)
			waitFor(t, "the removed file's blob deleted", func() bool {
				ids, _ := pc.List()
				return !slices.Contains(ids, m.blob) && len(e.st.Metadata.NS().PendingDeletes()) == 0
			})
			// Deletes are durable at the backend's next sync (the model
			// keeps the blob until then, and metadata deletes it again
			// after a cut): make it so, so that a blob found after the
			// cut is one the replay made.
			if err := pc.Sync(); err != nil {
				t.Fatal(err)
			}
			m.gone = true
			what = "remove"
		case k < 73: // write-back of pages no fsync covers, then a cut
			iosvc.FlushAll(e.io)
			what = "write-back"
		default: // fsync, then a power cut
			if err := m.f.Sync(); err != nil {
				t.Fatal(err)
			}
			m.states = [][]byte{slices.Clone(m.cur)}
			what = "fsync"
		}
		if what != "fsync" && what != "remove" && what != "write-back" {
			continue
		}
		cuts++
		for kind, img := range map[string]map[backend.BlobID][]byte{"power cut": afterCut(t, pc), "SIGKILL": afterKill(t, pc)} {
			checkImage(t, files, m, img, fmt.Sprintf("op %d (%s of %s), %s %d", i, what, m.name, kind, cuts), what)
		}
	}
	snap := e.io.Snapshot()
	t.Logf("%d cuts; io: %v records, %v home syncs, %v truncates logged, %v checkpoint passes, %v full waits",
		cuts, snap["staging_records"], snap["staging_home_syncs"], snap["staging_truncates"], snap["staging_checkpoint_passes"], snap["staging_full_waits"])
	if snap["staging_records"].(uint64) == 0 || snap["staging_checkpoint_passes"].(uint64) == 0 {
		t.Fatalf("the workload wrote no staging record or no checkpoint trimmed: %v", snap)
	}
}

// checkImage holds every file of a recovered image against its model; m
// is the file of the operation just done (what).
func checkImage(t *testing.T, files []*modelFile, m *modelFile, img map[backend.BlobID][]byte, at, what string) {
	t.Helper()
	for _, o := range files {
		got, ok := img[o.blob]
		switch {
		case o.gone && ok:
			t.Fatalf("%s: removed file %s has its blob back after the replay", at, o.name)
		case o.gone:
		case !ok && len(o.states[0]) > 0:
			t.Fatalf("%s: %s (%d bytes acknowledged) has no blob after the cut", at, o.name, len(o.states[0]))
		default:
			o.check(t, got, at)
		}
	}
	if got := img[m.blob]; what == "fsync" && !bytes.Equal(got, m.cur) {
		t.Fatalf("%s: the file just fsynced holds %d bytes, not the %d it was acknowledged with", at, len(got), len(m.cur))
	}
}

// TestStagedFsyncCost: an fsync of a cached overwrite or append is one
// staging record and one flush of the log, and syncs neither the file's
// blob nor the backend (no device flush besides the log's).
func TestStagedFsyncCost(t *testing.T) {
	fb := faulty.New(mem.New())
	e := startIOWith(t, fb, nil, func(c *config.Config) { c.IO.CacheSize = 16 << 20 })
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil { // the first: its name too
		t.Fatal(err)
	}
	blob := backend.BlobID(inoOf(t, f))
	var blobSyncs, backendSyncs, logSyncs int
	fb.Inject(func(op faulty.Op) error {
		switch {
		case op.Kind == faulty.Sync && op.Blob == blob:
			blobSyncs++
		case op.Kind == faulty.Sync && op.Blob == backend.StagingBlob:
			logSyncs++
		case op.Kind == faulty.SyncMeta:
			backendSyncs++
		}
		return nil
	})
	before := e.counter(t, "staging_records")
	const n = 20
	for i := range n {
		if _, err := f.WriteAt([]byte{byte(i)}, int64(i*4096)); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if _, err := f.WriteAt(make([]byte, 4096), int64(64<<10+i*4096)); err != nil { // an append
				t.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	fb.Inject(nil)
	if got := e.counter(t, "staging_records") - before; got != n {
		t.Errorf("%d fsyncs wrote %d staging records", n, got)
	}
	// The checkpointer may sync the blob in the background meanwhile: at
	// most once per pass, far fewer than the fsyncs.
	if logSyncs != n || blobSyncs > n/4 || backendSyncs > n/4 {
		t.Errorf("%d fsyncs: %d flushes of the log, %d syncs of the file's blob, %d of the backend; want %d, few, few", n, logSyncs, blobSyncs, backendSyncs, n)
	}
}

// TestStagedFsyncErrorIsSticky: a failed flush of the staging log fails
// that fsync with EIO and every later fsync of the file, even once the
// device works again; the service says so in its stats and health.
func TestStagedFsyncErrorIsSticky(t *testing.T) {
	fb := faulty.New(mem.New())
	e := startIOWith(t, fb, nil, func(c *config.Config) { c.IO.CacheSize = 16 << 20 })
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	fb.Inject(func(op faulty.Op) error {
		if op.Kind == faulty.Sync && op.Blob == backend.StagingBlob {
			return syscall.EIO
		}
		return nil
	})
	if _, err := f.Write([]byte(" world")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync over a failed flush: %v, want EIO", err)
	}
	fb.Inject(nil)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("the next fsync of the file: %v, want EIO (sticky)", err)
	}
	snap := e.io.Snapshot()
	if snap["fsync_failed_files"] != uint64(1) || snap["staging_error"] == nil {
		t.Errorf("stats after the failure: fsync_failed_files %v, staging_error %v", snap["fsync_failed_files"], snap["staging_error"])
	}
	if err := e.io.Health(); err == nil {
		t.Error("health is fine after the staging log failed")
	}
}

// TestStagedFsyncRacingWrites: an fsync covers every write that returned
// before it began, even with writes of the same file running meanwhile:
// a writer appends pages and overwrites earlier ones while another
// goroutine fsyncs; after each fsync the power is cut, and the file must
// hold every page written before that fsync began (or a later version).
func TestStagedFsyncRacingWrites(t *testing.T) {
	pc := powercut.New(mem.New())
	e := startIOWith(t, pc, nil, func(c *config.Config) { c.IO.CacheSize = 16 << 20 })
	fsys := e.dial(t)
	defer fsys.Close()
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blob := backend.BlobID(inoOf(t, f))
	// Widen the window between a write marking its pages and covering
	// them with the size, where an fsync must not take them.
	iosvc.SetAfterMark(func() { time.Sleep(300 * time.Microsecond) })
	defer iosvc.SetAfterMark(nil)
	const pages = 500
	// version[p]: the last version of page p whose write returned.
	var mu sync.Mutex
	version := make([]byte, pages)
	done := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for p := 0; p < pages; p++ {
			for _, q := range []int{p, rng.IntN(p + 1)} { // an append, then an overwrite
				mu.Lock()
				v := version[q] + 1
				mu.Unlock()
				if _, err := f.WriteAt(bytes.Repeat([]byte{v}, 4096), int64(q)*4096); err != nil {
					done <- err
					return
				}
				mu.Lock()
				version[q] = v
				mu.Unlock()
				time.Sleep(20 * time.Microsecond) // more fsyncs per write
			}
		}
		done <- nil
	}()
	cuts := 0
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		default:
		}
		mu.Lock()
		want := slices.Clone(version)
		mu.Unlock()
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		cuts++
		got := afterCut(t, pc)[blob]
		for p, v := range want {
			if v == 0 {
				continue
			}
			if (p+1)*4096 > len(got) {
				t.Fatalf("cut %d: page %d (version %d written before the fsync) is past the file's end (%d bytes)", cuts, p, v, len(got))
			}
			if g := got[p*4096]; g < v || !bytes.Equal(got[p*4096:(p+1)*4096], bytes.Repeat([]byte{g}, 4096)) {
				t.Fatalf("cut %d: page %d holds version %d, want %d or later (whole)", cuts, p, g, v)
			}
		}
	}
	t.Logf("%d fsyncs and cuts raced %d page writes", cuts, 2*pages)
}

// TestStagedPowerCutAtEverySync enumerates every point a power cut can
// fall on in a small workload: after each sync that made something
// durable (the staging log's flush, a home sync, a backend sync, a
// checkpoint's), the model backend's image is taken with the model of
// what was acknowledged before it; each image is then recovered (replay)
// and every file held against its model. Writes enter the model before
// they are issued (a sync may make them durable while they run), fsyncs
// after they return.
func TestStagedPowerCutAtEverySync(t *testing.T) {
	type image struct {
		state map[backend.BlobID][]byte
		files []modelFile
	}
	var (
		mu     sync.Mutex
		images []image
		files  []*modelFile
		done   bool
	)
	pc := powercut.New(mem.New())
	pc.AfterSync = func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		im := image{state: pc.Cut()}
		for _, m := range files {
			c := *m
			c.states = slices.Clone(m.states)
			im.files = append(im.files, c)
		}
		images = append(images, im)
	}
	e := startIOWith(t, pc, nil, func(c *config.Config) {
		c.IO.CacheSize = 4 << 20
		c.IO.StagingSize = 1 << 20
	})
	fsys := e.dial(t)
	defer fsys.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 3 {
		f, err := fsys.Create(fmt.Sprintf("f%d", i))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		files = append(files, &modelFile{name: fmt.Sprintf("f%d", i), f: f, blob: backend.BlobID(inoOf(t, f)), states: [][]byte{nil}})
		mu.Unlock()
	}
	begin := func(m *modelFile, apply func(b []byte) []byte) {
		mu.Lock()
		m.cur = apply(slices.Clone(m.cur))
		m.states = append(m.states, slices.Clone(m.cur))
		mu.Unlock()
	}
	for i := range 60 {
		m := files[rng.IntN(len(files))]
		switch k := rng.IntN(10); {
		case k < 5:
			off, n := rng.IntN(32<<10), 1+rng.IntN(9<<10)
			data := bytes.Repeat([]byte{byte(i + 1)}, n)
			begin(m, func(b []byte) []byte {
				if end := off + n; end > len(b) {
					b = append(b, make([]byte, end-len(b))...)
				}
				copy(b[off:], data)
				return b
			})
			if _, err := m.f.WriteAt(data, int64(off)); err != nil {
				t.Fatal(err)
			}
		case k < 6:
			size := rng.IntN(40 << 10)
			begin(m, func(b []byte) []byte {
				if size < len(b) {
					return b[:size]
				}
				return append(b, make([]byte, size-len(b))...)
			})
			if err := m.f.Truncate(int64(size)); err != nil {
				t.Fatal(err)
			}
		default:
			if err := m.f.Sync(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			m.states = [][]byte{slices.Clone(m.cur)}
			mu.Unlock()
		}
	}
	time.Sleep(300 * time.Millisecond) // a checkpoint pass too
	mu.Lock()
	done = true
	all := images
	mu.Unlock()
	for k, im := range all {
		img := mem.New()
		if err := powercut.Restore(img, im.state); err != nil {
			t.Fatal(err)
		}
		if _, err := iosvc.Replay(img, nil); err != nil {
			t.Fatalf("image %d: replay: %v", k, err)
		}
		for _, m := range im.files {
			var got []byte
			if b, err := img.Open(m.blob); err == nil {
				got = make([]byte, b.Size())
				_, _ = b.ReadAt(got, 0)
				b.Close()
			} else if len(m.states[0]) > 0 {
				t.Fatalf("image %d: %s (%d bytes acknowledged) has no blob", k, m.name, len(m.states[0]))
			}
			m.check(t, got, fmt.Sprintf("cut after sync %d of %d", k+1, len(all)))
		}
	}
	t.Logf("%d cut points, each recovered and checked", len(all))
}
