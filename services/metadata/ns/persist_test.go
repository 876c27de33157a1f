package ns

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/vfs"
	"github.com/weir-storage/weir/internal/wal"
)

// TestRandomOpsSurviveRestart applies seeded random operations, restarts
// (clean Close and Open) at random points, and compares full dumps.
func TestRandomOpsSurviveRestart(t *testing.T) {
	seed := testSeed(t)
	for _, tc := range []struct {
		name    string
		every   int
		segment int64
		syncOp  bool
	}{
		{"defaults", 0, 0, true},
		{"checkpoint every 7, small segments", 7, 300, false},
		{"checkpoint every 1", 1, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := vfs.NewMem()
			clk := newClock()
			o := testOpts(clk)
			o.CheckpointEvery, o.SyncEveryOp = tc.every, tc.syncOp
			cfg := config{fs: m, inlineCheckpoint: true, segmentSize: tc.segment}
			n, err := open(o, cfg)
			must(t, err)
			g := newGen(seed, "")
			var log []string
			for i := 0; i < 1500; i++ {
				log = append(log, g.step(n))
				if i%97 == 96 || i == 1499 {
					before, orphans := dump(n), unnamedBlobs(n)
					must(t, n.Check())
					must(t, n.Close())
					n, err = open(o, cfg)
					must(t, err)
					g.handles = nil // opens do not survive a restart
					if after := dump(n); after != before {
						t.Fatalf("after %d ops (seed %d) the state differs:\n%s\nlast ops:\n%s", i+1, seed, diff(before, after), tail(log, 5))
					}
					if got := n.Orphans(); !slices.Equal(got, orphans) {
						t.Fatalf("orphans %v, want %v", got, orphans)
					}
				}
			}
			must(t, n.Check())
			must(t, n.Close())
			names, _ := m.List(o.Dir)
			var ckpts int
			for _, name := range names {
				if _, ok := parseCkptName(name); ok {
					ckpts++
				}
			}
			if ckpts > 2 {
				t.Errorf("%d checkpoints kept, want at most 2: %v", ckpts, names)
			}
		})
	}
}

func tail(log []string, n int) string {
	if len(log) > n {
		log = log[len(log)-n:]
	}
	return strings.Join(log, "\n")
}

// diff shows the first differing lines of two dumps.
func diff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for i := 0; i < max(len(al), len(bl)) && len(out) < 10; i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			out = append(out, "- "+x, "+ "+y)
		}
	}
	return strings.Join(out, "\n")
}

// TestCrashCopyRecoversEverythingWritten simulates SIGKILL: at random
// points the live data directory is copied (no Close, no checkpoint) and
// opened. A killed process loses nothing it wrote, so the copy must hold
// exactly the state after the last completed operation, with the files
// unlinked while open reported as orphans.
func TestCrashCopyRecoversEverythingWritten(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	clk := newClock()
	o := Options{Dir: dir, Now: clk.Now, CheckpointEvery: 13, SyncEveryOp: seed%2 == 0, SyncInterval: time.Hour}
	cfg := config{fs: vfs.OS{}, inlineCheckpoint: true, segmentSize: 2000}
	n, err := open(o, cfg)
	must(t, err)
	defer n.Close()
	g := newGen(seed, "")
	for i := 0; i < 600; i++ {
		g.step(n)
		if rng.IntN(25) != 0 {
			continue
		}
		want, orphans := dump(n), unnamedBlobs(n)
		cp := copyDir(t, dir)
		o2 := o
		o2.Dir = cp
		r, err := open(o2, config{fs: vfs.OS{}, inlineCheckpoint: true})
		if err != nil {
			t.Fatalf("op %d: recovering a copy: %v", i, err)
		}
		if got := dump(r); got != want {
			t.Fatalf("op %d (seed %d): recovered state differs:\n%s", i, seed, diff(want, got))
		}
		if got := r.Orphans(); !slices.Equal(got, orphans) {
			t.Fatalf("op %d: orphans %v, want %v", i, got, orphans)
		}
		must(t, r.Check())
		must(t, r.Close())
	}
}

// TestPowerLossRecoversSyncedPrefix simulates power loss on the in-memory
// file system: unsynced appends survive only partly (possibly as zeros),
// unsynced directory changes vanish. The recovered state must be the
// state after some operation k, with k at least the last one covered by
// Sync (with SyncEveryOp: every acknowledged one).
func TestPowerLossRecoversSyncedPrefix(t *testing.T) {
	seed := testSeed(t)
	for _, syncOp := range []bool{false, true} {
		t.Run(fmt.Sprintf("SyncEveryOp=%v", syncOp), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 2))
			m := vfs.NewMem()
			clk := newClock()
			o := testOpts(clk)
			o.CheckpointEvery, o.SyncEveryOp = 11, syncOp
			n, err := open(o, config{fs: m, inlineCheckpoint: true, segmentSize: 1500})
			must(t, err)
			defer n.Close()
			g := newGen(seed, "")
			dumps := []string{dump(n)}
			orphans := [][]uint64{nil}
			synced := 0
			// verify opens a crash image and requires the state after some
			// operation in [lo, hi].
			verify := func(img *vfs.Mem, lo, hi int, when string) {
				t.Helper()
				r, err := open(o, config{fs: img, inlineCheckpoint: true})
				if err != nil {
					t.Fatalf("%s (seed %d): recovery failed: %v", when, seed, err)
				}
				got := dump(r)
				k := -1
				for j := hi; j >= lo; j-- {
					if dumps[j] == got && slices.Equal(orphans[j], r.Orphans()) {
						k = j
						break
					}
				}
				if k < 0 {
					t.Fatalf("%s (seed %d): recovered state matches none of states %d..%d:\n%s", when, seed, lo, hi, diff(dumps[hi], got))
				}
				must(t, r.Check())
				must(t, r.Close())
			}
			// Images taken inside a flush (in the middle of an operation,
			// a rotation or a checkpoint), checked once the operation is done.
			type midImage struct {
				img    *vfs.Mem
				lo, hi int
				what   string
			}
			var mids []midImage
			op, midCount := 0, 0
			m.FailSync = func(name string) error {
				if rng.IntN(6) == 0 {
					mids = append(mids, midImage{m.Crash(func(k int) int { return rng.IntN(k + 1) }, rng.IntN(3) == 0), synced, op, "flush of " + name})
				}
				return nil
			}
			for i := 1; i <= 1500; i++ {
				op = i
				g.step(n)
				dumps = append(dumps, dump(n))
				orphans = append(orphans, unnamedBlobs(n))
				for _, mi := range mids {
					verify(mi.img, mi.lo, mi.hi, fmt.Sprintf("op %d, image taken before the %s", i, mi.what))
					midCount++
				}
				mids = mids[:0]
				if syncOp {
					synced = i
				} else if rng.IntN(20) == 0 {
					must(t, n.Sync())
					synced = i
				}
				if rng.IntN(10) == 0 {
					verify(m.Crash(func(k int) int { return rng.IntN(k + 1) }, rng.IntN(3) == 0), synced, i, fmt.Sprintf("after op %d", i))
				}
			}
			m.FailSync = nil
			t.Logf("%d images taken inside flushes; %d records", midCount, n.w.LastLSN())
		})
	}
}

// TestConcurrentCrashSnapshots runs concurrent writers, each in its own
// directory, with background checkpoints and flushes, and freezes the
// file system at random instants (between two file-system calls, possibly
// in the middle of a checkpoint) to copy it. Every writer's subtree in the
// copy must be its state after an operation it had started by then and no
// earlier than the last one it had seen acknowledged.
func TestConcurrentCrashSnapshots(t *testing.T) {
	seed := testSeed(t)
	const writers, ops = 4, 300
	dir := t.TempDir()
	var gate sync.RWMutex
	clk := newClock()
	o := Options{Dir: dir, Now: clk.Now, CheckpointEvery: 25, SyncEveryOp: true}
	n, err := open(o, config{fs: vfs.Gated{FS: vfs.OS{}, Gate: &gate}, segmentSize: 4000})
	must(t, err)
	defer n.Close()
	type history struct {
		mu    sync.Mutex
		dumps []string // dumps[k]: the subtree after k operations
	}
	hist := make([]*history, writers)
	for w := range hist {
		_, err := n.Mkdir(root, fmt.Sprintf("w%d", w), 0o777)
		must(t, err)
		hist[w] = &history{dumps: []string{subtreeDump(n, fmt.Sprintf("w%d", w))}}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var stop sync.Once
	stopped := make(chan struct{})
	halt := func() { stop.Do(func() { close(stopped) }) }
	defer halt()
	gens := make([]*gen, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		gens[w] = newGen(seed+uint64(w), fmt.Sprintf("w%d", w))
		go func() {
			defer wg.Done()
			g := gens[w]
			for i := 0; i < ops; i++ {
				select {
				case <-stopped:
					return
				default:
				}
				g.step(n)
				d := subtreeDump(n, fmt.Sprintf("w%d", w))
				hist[w].mu.Lock()
				hist[w].dumps = append(hist[w].dumps, d)
				hist[w].mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	rng := rand.New(rand.NewPCG(seed, 3))
	snapshots := 0
	type snap struct {
		i, w, lo, hi int
		got          string
	}
	var pending []snap
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-time.After(time.Duration(rng.IntN(3000)) * time.Microsecond):
		}
		lo := make([]int, writers)
		for w, h := range hist {
			h.mu.Lock()
			lo[w] = len(h.dumps) - 1
			h.mu.Unlock()
		}
		gate.Lock()
		cp := copyDir(t, dir)
		gate.Unlock()
		hi := make([]int, writers)
		for w, h := range hist {
			h.mu.Lock()
			hi[w] = len(h.dumps) - 1
			h.mu.Unlock()
		}
		o2 := o
		o2.Dir = cp
		r, err := open(o2, config{fs: vfs.OS{}, inlineCheckpoint: true})
		if err != nil {
			t.Fatalf("snapshot %d (seed %d): recovery failed: %v", snapshots, seed, err)
		}
		must(t, r.Check())
		for w := range hist {
			// Checked once the writers are done: the state after the
			// operation in flight may not be recorded yet.
			pending = append(pending, snap{snapshots, w, lo[w], hi[w] + 1, subtreeDump(r, fmt.Sprintf("w%d", w))})
		}
		must(t, r.Close())
		snapshots++
	}
	wg.Wait()
	for _, p := range pending {
		dumps := hist[p.w].dumps
		ok := false
		for k := p.lo; k <= p.hi && k < len(dumps); k++ {
			ok = ok || dumps[k] == p.got
		}
		if !ok {
			t.Errorf("snapshot %d (seed %d): writer %d's subtree is none of its states %d..%d:\n%s\nstate %d:\n%s",
				p.i, seed, p.w, p.lo, p.hi, p.got, p.lo, diff(dumps[p.lo], p.got))
		}
	}
	for w, g := range gens {
		if g.bad != nil {
			t.Errorf("writer %d: %v", w, g.bad)
		}
	}
	t.Logf("%d snapshots", snapshots)
}

// subtreeDump renders the subtree at p without inode numbers of p itself.
func subtreeDump(n *NS, p string) string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	nd, err := n.st.resolve(&root, p)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	var walk func(path string, nd *inode)
	walk = func(path string, nd *inode) {
		a := nd.attr
		fmt.Fprintf(&b, "%s ino=%d mode=%o uid=%d gid=%d nlink=%d size=%d a=%d m=%d c=%d\n",
			path, a.Ino, a.Mode, a.UID, a.GID, a.Nlink, a.Size, a.Atime, a.Mtime, a.Ctime)
		names := make([]string, 0, len(nd.entries))
		for name := range nd.entries {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			walk(path+"/"+name, n.st.inodes[nd.entries[name]])
		}
	}
	walk(p, nd)
	return b.String()
}

// tornSetup runs a few operations with SyncEveryOp, then stops without a
// checkpoint. It returns the directory, the last segment, the dumps before
// and after the last operation, and the offsets of the last record.
func tornSetup(t *testing.T) (dir, seg, before, after string, start, end int) {
	dir = t.TempDir()
	clk := newClock()
	o := Options{Dir: dir, Now: clk.Now, SyncEveryOp: true}
	n, err := open(o, config{fs: vfs.OS{}, inlineCheckpoint: true})
	must(t, err)
	fixture(t, n)
	before = dump(n)
	_, err = n.Mkdir(root, "d/last-"+strings.Repeat("x", 40), 0o755)
	must(t, err)
	after = dump(n)
	n.crash()
	segs := walFiles(t, dir)
	seg = segs[len(segs)-1]
	data, err := os.ReadFile(seg)
	must(t, err)
	offs, e := recordOffsets(t, data)
	if e != len(data) || len(offs) < 3 {
		t.Fatalf("unexpected segment layout: %d records, end %d, size %d", len(offs), e, len(data))
	}
	return dir, seg, before, after, offs[len(offs)-1], e
}

func openDir(t *testing.T, dir string) (*NS, error) {
	return open(Options{Dir: dir, SyncInterval: time.Hour}, config{fs: vfs.OS{}, inlineCheckpoint: true})
}

// bootRecordLen is the size of a boot record in a WAL segment.
var bootRecordLen = int64(len(wal.AppendRecord(nil, 1, recBoot, (&bootRec{}).encode(nil))))

func TestTornTailAtEveryOffset(t *testing.T) {
	dir, seg, before, after, start, end := tornSetup(t)
	for off := start; off <= end; off++ {
		cp := copyDir(t, dir)
		cseg := filepath.Join(cp, filepath.Base(seg))
		must(t, os.Truncate(cseg, int64(off)))
		r, err := openDir(t, cp)
		if err != nil {
			t.Fatalf("cut at %d (record %d..%d): %v", off, start, end, err)
		}
		want := before
		if off == end {
			want = after
		}
		if got := dump(r); got != want {
			t.Fatalf("cut at %d: wrong state:\n%s", off, diff(want, got))
		}
		// Cut at the start of the torn record, then the boot record of
		// the new incarnation.
		if fi, err := os.Stat(cseg); err != nil || (off < end && fi.Size() != int64(start)+bootRecordLen) {
			t.Fatalf("cut at %d: segment not truncated to %d (+ a boot record): %v %v", off, start, fi.Size(), err)
		}
		must(t, r.Check())
		must(t, r.Close())
		os.RemoveAll(cp)
	}
}

func TestZeroedTailIsTorn(t *testing.T) {
	dir, seg, before, after, start, end := tornSetup(t)
	data, err := os.ReadFile(seg)
	must(t, err)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"zeros appended", append(slices.Clone(data), make([]byte, 8192)...), after},
		{"last record zeroed", append(slices.Clone(data[:start]), make([]byte, end-start)...), before},
		{"last record zeroed and more", append(slices.Clone(data[:start]), make([]byte, 3*4096)...), before},
		{"last record half zeroed", append(slices.Clone(data[:start+(end-start)/2]), make([]byte, end-start)...), before},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := copyDir(t, dir)
			must(t, os.WriteFile(filepath.Join(cp, filepath.Base(seg)), tc.data, 0o600))
			r, err := openDir(t, cp)
			must(t, err)
			if got := dump(r); got != tc.want {
				t.Fatalf("wrong state:\n%s", diff(tc.want, got))
			}
			must(t, r.Close())
		})
	}
}

func TestCorruptMiddleRecordFailsOpen(t *testing.T) {
	dir, seg, _, _, _, _ := tornSetup(t)
	data, err := os.ReadFile(seg)
	must(t, err)
	offs, _ := recordOffsets(t, data)
	mid := len(offs) / 2
	from, to := offs[mid], offs[mid+1]
	for i := from; i < to; i++ {
		cp := copyDir(t, dir)
		bad := slices.Clone(data)
		bad[i] ^= 0x40
		must(t, os.WriteFile(filepath.Join(cp, filepath.Base(seg)), bad, 0o600))
		r, err := openDir(t, cp)
		if err == nil {
			r.Close()
			t.Fatalf("flipped byte %d of the record at %d: Open succeeded", i, from)
		}
		var ce *wal.CorruptError
		if !errors.As(err, &ce) || ce.File != filepath.Join(cp, filepath.Base(seg)) || ce.Offset != int64(from) {
			t.Fatalf("flipped byte %d: error %v does not name the file and offset %d", i, err, from)
		}
		if !strings.Contains(err.Error(), filepath.Base(seg)) || !strings.Contains(err.Error(), fmt.Sprint(from)) {
			t.Fatalf("error message %q lacks the file or offset", err)
		}
		os.RemoveAll(cp)
	}
	// A bad record in a segment that is not the last one is corruption even
	// at its end.
	cp := copyDir(t, dir)
	r, err := open(Options{Dir: cp, SyncInterval: time.Hour}, config{fs: vfs.OS{}, inlineCheckpoint: true, segmentSize: 100})
	must(t, err)
	for i := 0; i < 5; i++ {
		_, err = r.Mkdir(root, fmt.Sprintf("after-rotation-%d", i), 0o755)
		must(t, err)
	}
	r.crash()
	segs := walFiles(t, cp)
	if len(segs) < 3 {
		t.Fatalf("want three segments, have %v", segs)
	}
	midSeg, err := os.ReadFile(segs[len(segs)-2])
	must(t, err)
	_, e := recordOffsets(t, midSeg)
	must(t, os.Truncate(segs[len(segs)-2], int64(e-3)))
	r, err = openDir(t, cp)
	if err == nil {
		r.Close()
		t.Fatal("Open succeeded with a torn segment followed by another")
	}
	t.Logf("torn middle segment: %v", err)
}

func TestCheckpointCorruptionFallsBack(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	o := testOpts(clk)
	o.CheckpointEvery = 10
	n := openMem(t, m, o)
	g := newGen(7, "")
	for i := 0; i < 200; i++ {
		g.step(n)
	}
	want := dump(n)
	must(t, n.Close())
	names, _ := m.List(o.Dir)
	var ckpts []string
	for _, name := range names {
		if _, ok := parseCkptName(name); ok {
			ckpts = append(ckpts, filepath.Join(o.Dir, name))
		}
	}
	if len(ckpts) != 2 {
		t.Fatalf("want 2 checkpoints, have %v", names)
	}
	newest, err := m.ReadFile(ckpts[1])
	must(t, err)
	for _, damage := range []func([]byte) []byte{
		func(b []byte) []byte { b[len(b)/2] ^= 1; return b },                   // body
		func(b []byte) []byte { b[20] ^= 1; return b },                         // header
		func(b []byte) []byte { return b[:len(b)-1] },                          // short
		func(b []byte) []byte { return nil },                                   // empty
		func(b []byte) []byte { return make([]byte, len(b)) },                  // zeroed
		func(b []byte) []byte { return append(b, 0) },                          // trailing byte
		func(b []byte) []byte { le.PutUint32(b[8:], ckptVersion+1); return b }, // version (checksum too)
	} {
		img := m.Snapshot()
		img.WriteFile(ckpts[1], damage(slices.Clone(newest)))
		r, err := open(o, config{fs: img, inlineCheckpoint: true})
		if err != nil {
			t.Fatalf("fallback to the previous checkpoint failed: %v", err)
		}
		if got := dump(r); got != want {
			t.Fatalf("state after fallback differs:\n%s", diff(want, got))
		}
		must(t, r.Check())
		must(t, r.Close())
		if _, err := img.ReadFile(ckpts[1] + ".corrupt"); err != nil {
			t.Errorf("damaged checkpoint not set aside: %v", err)
		}
		// Later recoveries work from what is left.
		r, err = open(o, config{fs: img, inlineCheckpoint: true})
		must(t, err)
		if got := dump(r); got != want {
			t.Fatalf("second recovery differs:\n%s", diff(want, got))
		}
		must(t, r.Close())
	}
	// Both damaged: Open fails loudly.
	img := m.Snapshot()
	for _, c := range ckpts {
		b, _ := img.ReadFile(c)
		b[70] ^= 1
		img.WriteFile(c, b)
	}
	if _, err := open(o, config{fs: img, inlineCheckpoint: true}); err == nil || !strings.Contains(err.Error(), "no valid checkpoint") {
		t.Fatalf("Open with no valid checkpoint: %v", err)
	}
}

func TestMissingFilesFailOpen(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	o := testOpts(clk)
	o.CheckpointEvery = 50
	n, err := open(o, config{fs: m, inlineCheckpoint: true, segmentSize: 150})
	must(t, err)
	g := newGen(9, "")
	for i := 0; i < 60; i++ {
		g.step(n)
	}
	n.crash()
	names, _ := m.List(o.Dir)
	var segs, ckpts []string
	for _, name := range names {
		if _, ok := wal.ParseSegmentName(name); ok {
			segs = append(segs, filepath.Join(o.Dir, name))
		}
		if _, ok := parseCkptName(name); ok {
			ckpts = append(ckpts, filepath.Join(o.Dir, name))
		}
	}
	if len(segs) < 3 {
		t.Fatalf("want at least 3 segments: %v", names)
	}
	for name, remove := range map[string][]string{
		"a middle segment": {segs[len(segs)-2]},
		"all checkpoints":  ckpts,
		"the whole WAL":    segs,
	} {
		img := m.Snapshot()
		for _, p := range remove {
			must(t, img.Remove(p))
		}
		if r, err := open(o, config{fs: img, inlineCheckpoint: true}); err == nil {
			r.Close()
			t.Errorf("Open without %s succeeded", name)
		} else {
			t.Logf("without %s: %v", name, err)
		}
	}
}

// TestInterruptedInitialisation: a crash between the first segment and
// checkpoint 0 leaves a directory that opens as a new namespace.
func TestInterruptedInitialisation(t *testing.T) {
	m := vfs.NewMem()
	o := testOpts(newClock())
	w, err := wal.Create(wal.Options{FS: m, Dir: o.Dir}, 1)
	must(t, err)
	w.Abandon()
	n := openMem(t, m, o)
	if got := dump(n); !strings.HasPrefix(got, "next=2\n") || strings.Count(got, "\n") != 3 {
		t.Fatalf("not a new namespace:\n%s", got)
	}
	// With a record in it, the same directory is refused.
	m2 := vfs.NewMem()
	w, err = wal.Create(wal.Options{FS: m2, Dir: o.Dir}, 1)
	must(t, err)
	_, err = w.Append(recFree, le.AppendUint64(nil, 5))
	must(t, err)
	must(t, w.Close())
	if _, err := open(o, config{fs: m2, inlineCheckpoint: true}); err == nil {
		t.Fatal("a WAL with records but no checkpoint was accepted")
	}
}

// TestFlushFailureIsSticky: after one failed fsync every mutation and Sync
// fails with an IOError (EIO), reads keep working, and Close reports it.
func TestFlushFailureIsSticky(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	o := testOpts(clk)
	o.SyncEveryOp = true
	n, err := open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	_, err = n.Mkdir(root, "ok", 0o755)
	must(t, err)
	if err := n.Err(); err != nil {
		t.Fatalf("Err before any failure = %v", err)
	}
	var fail sync.Once
	failing := false
	m.FailSync = func(string) error {
		fail.Do(func() { failing = true })
		if failing {
			return syscall.EIO
		}
		return nil
	}
	_, err = n.Mkdir(root, "bad", 0o755)
	assertIOError(t, "mkdir", err)
	m.FailSync = nil // the device recovers: it must not matter
	_, err = n.Mkdir(root, "later", 0o755)
	assertIOError(t, "later mkdir", err)
	_, _, err = n.Open(root, "f", syscall.O_CREAT|syscall.O_RDWR, 0o644)
	assertIOError(t, "create", err)
	assertIOError(t, "sync", n.Sync())
	assertIOError(t, "Err", n.Err())
	if _, err := n.Stat(root, "ok"); err != nil {
		t.Errorf("reads must keep working: %v", err)
	}
	assertIOError(t, "close", n.Close())
}

// TestFailSyncOption: Options.FailSync fails the flushes of the real file
// system, and the failure is as sticky as a real one.
func TestFailSyncOption(t *testing.T) {
	var failing atomic.Bool
	o := testOpts(newClock())
	o.Dir = t.TempDir()
	o.FailSync = func(path string) error {
		if failing.Load() {
			return fmt.Errorf("injected fsync failure of %s: %w", path, syscall.EIO)
		}
		return nil
	}
	n, err := Open(o)
	must(t, err)
	_, err = n.Mkdir(root, "ok", 0o755)
	must(t, err)
	must(t, n.Sync())
	failing.Store(true)
	_, err = n.Mkdir(root, "lost", 0o755)
	must(t, err) // group commit: the flush comes later
	assertIOError(t, "sync", n.Sync())
	failing.Store(false)
	assertIOError(t, "Err", n.Err())
	if err := n.Err(); !strings.Contains(err.Error(), "injected fsync failure") {
		t.Errorf("Err = %v, want the injected cause", err)
	}
	_, err = n.Mkdir(root, "later", 0o755)
	assertIOError(t, "later mkdir", err)
	assertIOError(t, "close", n.Close())
}

// TestNoSpaceIsNotSticky: a WAL write the store has no room for fails that
// mutation with ENOSPC (not EIO), applies nothing, and the namespace takes
// mutations again once there is room; everything logged survives a crash.
func TestNoSpaceIsNotSticky(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	n, err := open(testOpts(clk), config{fs: m, inlineCheckpoint: true})
	must(t, err)
	_, err = n.Mkdir(root, "before", 0o755)
	must(t, err)
	m.FailWrite = func(string) error { return syscall.ENOSPC }
	_, err = n.Mkdir(root, "full", 0o755)
	if errno(t, err) != syscall.ENOSPC {
		t.Fatalf("mkdir on a full store: %v, want ENOSPC", err)
	}
	if _, err := n.Stat(root, "full"); errno(t, err) != syscall.ENOENT {
		t.Errorf("a mutation that was not logged was applied: %v", err)
	}
	if err := n.Err(); err != nil {
		t.Fatalf("a full store made the namespace read-only: %v", err)
	}
	m.FailWrite = nil
	_, err = n.Mkdir(root, "after", 0o755)
	must(t, err)
	must(t, n.Sync())
	n.crash()
	r, err := open(testOpts(clk), config{fs: m, inlineCheckpoint: true})
	must(t, err)
	for _, name := range []string{"before", "after"} {
		if _, err := r.Stat(root, name); err != nil {
			t.Errorf("%s after recovery: %v", name, err)
		}
	}
	if _, err := r.Stat(root, "full"); errno(t, err) != syscall.ENOENT {
		t.Errorf("the refused mutation was recovered: %v", err)
	}
	must(t, r.Close())
}

func TestWriteFailureIsSticky(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	n, err := open(testOpts(clk), config{fs: m, inlineCheckpoint: true})
	must(t, err)
	m.FailWrite = func(string) error { return syscall.EIO }
	_, err = n.Mkdir(root, "bad", 0o755)
	assertIOError(t, "mkdir", err)
	if _, err := n.Stat(root, "bad"); errno(t, err) != syscall.ENOENT {
		t.Errorf("a mutation that was not logged was applied: %v", err)
	}
	m.FailWrite = nil
	_, err = n.Mkdir(root, "later", 0o755)
	assertIOError(t, "later mkdir", err)
	n.crash()
	// The half-written record is a torn tail.
	r, err := open(testOpts(clk), config{fs: m, inlineCheckpoint: true})
	must(t, err)
	if _, err := r.Stat(root, "bad"); errno(t, err) != syscall.ENOENT {
		t.Errorf("torn record applied: %v", err)
	}
	must(t, r.Close())
}

func assertIOError(t *testing.T, what string, err error) {
	t.Helper()
	var ioe *IOError
	if _, bare := err.(syscall.Errno); bare || !errors.As(err, &ioe) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("%s: got %v (%T), want an IOError", what, err, err)
	}
	if e := syscall.Errno(0); !errors.As(err, &e) || e != syscall.EIO {
		t.Fatalf("%s: errors.As gives errno %v, want EIO", what, e)
	}
}

// TestGroupCommit: mutations waiting for a flush share it. The first flush
// is held until every writer has appended its record, so the writers that
// arrive meanwhile must be covered by at most one more flush.
func TestGroupCommit(t *testing.T) {
	const writers = 16
	m := vfs.NewMem()
	clk := newClock()
	o := testOpts(clk)
	o.SyncEveryOp = true
	n, err := open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	defer n.Close()
	base := n.w.LastLSN()
	var mu sync.Mutex
	syncs := 0
	m.FailSync = func(string) error {
		mu.Lock()
		syncs++
		first := syncs == 1
		mu.Unlock()
		for first && n.w.LastLSN() < base+writers {
			time.Sleep(100 * time.Microsecond)
		}
		return nil
	}
	var wg sync.WaitGroup
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.Mkdir(root, fmt.Sprintf("d%d", i), 0o755)
			must(t, err)
		}()
	}
	wg.Wait()
	m.FailSync = nil
	if syncs > 2 {
		t.Errorf("%d flushes for %d concurrent mutations, want at most 2", syncs, writers)
	}
}

// TestReadsOlderCheckpoints: a checkpoint written before version 2 (no
// boot fields, no blobs awaiting deletion) or version 3 (no alloc limit)
// still opens, as the same tree.
func TestReadsOlderCheckpoints(t *testing.T) {
	n, _ := newNS(t)
	fixture(t, n)
	n.mu.RLock()
	v3 := encodeCheckpoint(n.st, 9)
	nInodes := len(n.st.inodes)
	n.mu.RUnlock()
	// Version 1 is version 2 without the boot fields and the (empty)
	// list of blobs awaiting deletion at the start of the body.
	body := v3[ckptHeaderSize+ckptBootSize+8:]
	v1 := append(slices.Clone(v3[:ckptHeaderSize]), body...)
	le.PutUint32(v1[8:], 1)
	le.PutUint64(v1[40:], uint64(len(body)))
	le.PutUint32(v1[48:], wal.Checksum(body))
	le.PutUint32(v1[60:], wal.Checksum(v1[:60]))
	s, lsn, err := decodeCheckpoint(v1)
	if err != nil {
		t.Fatalf("version 1 checkpoint: %v", err)
	}
	if lsn != 9 || len(s.inodes) != nInodes || s.boot.incarnation != 0 || len(s.dead) != 0 {
		t.Fatalf("version 1 checkpoint decoded to lsn %d, %d inodes, incarnation %d, %d dead", lsn, len(s.inodes), s.boot.incarnation, len(s.dead))
	}
	// Version 2 is version 3 with the alloc limit's bytes reserved (0).
	v2 := slices.Clone(v3)
	le.PutUint32(v2[8:], 2)
	le.PutUint32(v2[60:], wal.Checksum(v2[:60]))
	if s, _, err := decodeCheckpoint(v2); err != nil || len(s.inodes) != nInodes || s.allocLimit != 0 {
		t.Fatalf("version 2 checkpoint: %v", err)
	}
	le.PutUint64(v2[52:], 7)
	le.PutUint32(v2[60:], wal.Checksum(v2[:60]))
	if _, _, err := decodeCheckpoint(v2); err == nil {
		t.Fatal("a version 2 checkpoint with an alloc limit decoded")
	}
}

// TestAllocLimitSurvivesPowerLoss: a limit promised to the IO service is
// durable when PromiseAlloc returns, and every later start numbers new
// inodes from it, so a create whose record a power cut lost (while io may
// have made its blob) never hands its number, and that blob, to a new file.
// The limit also survives checkpoints (format version 3).
func TestAllocLimitSurvivesPowerLoss(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	o := testOpts(clk)
	n := openMem(t, m, o)
	must(t, n.PromiseAlloc(50))
	must(t, n.PromiseAlloc(40))        // lower: nothing
	lost := create(t, n, root, "lost") // group commit: not synced yet
	if lost.Ino >= 50 {
		t.Fatalf("a create in the same life got %d: the limit moved the counter at once", lost.Ino)
	}
	img := m.Crash(func(int) int { return 0 }, false)
	must(t, n.Close())
	r, err := open(o, config{fs: img, inlineCheckpoint: true})
	must(t, err)
	if _, err := r.Stat(root, "lost"); errno(t, err) != syscall.ENOENT {
		t.Fatalf("the unsynced create survived the power cut (%v): the test cut nothing", err)
	}
	a := create(t, r, root, "new")
	if a.Ino < 50 {
		t.Fatalf("after the power cut a new file got inode %d, below the promised limit 50 (the lost create had %d)", a.Ino, lost.Ino)
	}
	must(t, r.PromiseAlloc(500))
	must(t, r.checkpoint()) // the records before it are gone
	must(t, r.Close())
	r, err = open(o, config{fs: img, inlineCheckpoint: true})
	must(t, err)
	if b := create(t, r, root, "after-ckpt"); b.Ino < 500 {
		t.Fatalf("inode %d after a restart from a checkpoint, below the promised limit 500", b.Ino)
	}
	must(t, r.Close())
	if err := n.PromiseAlloc(0); errno(t, err) != syscall.EINVAL {
		t.Errorf("PromiseAlloc(0) = %v, want EINVAL", err)
	}
}

// TestCheckpointsScaleWithTheNamespace: past CheckpointEvery, a checkpoint
// waits for a quarter of the inodes the last one held, so that a growing
// namespace is not snapshotted every CheckpointEvery records (a million
// creates spent most of their CPU there); recovery still finds every file.
func TestCheckpointsScaleWithTheNamespace(t *testing.T) {
	m := vfs.NewMem()
	clk := newClock()
	o := testOpts(clk)
	o.CheckpointEvery = 10
	n, err := open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	const files = 4000
	var lsns []uint64
	for i := range files {
		release(t, n, create(t, n, root, fmt.Sprintf("/f%04d", i)).Ino)
		if k := n.ckpts; len(k) > 0 && (len(lsns) == 0 || lsns[len(lsns)-1] != k[len(k)-1]) {
			lsns = append(lsns, k[len(k)-1])
		}
	}
	// Every 10 records to 40 inodes, then every quarter of the namespace:
	// about 30 checkpoints for 4,000 creates (each create logs a record or
	// two), where every 10 records would have taken hundreds.
	if len(lsns) < 5 || len(lsns) > 80 {
		t.Fatalf("%d checkpoints for %d creates with CheckpointEvery 10: %v", len(lsns), files, lsns)
	}
	for i := 1; i < len(lsns); i++ {
		if lsns[i]-lsns[i-1] < 10 {
			t.Fatalf("checkpoints at LSN %d and %d: closer than CheckpointEvery", lsns[i-1], lsns[i])
		}
	}
	must(t, n.Sync())
	n.crash()
	r, err := open(o, config{fs: m, inlineCheckpoint: true})
	must(t, err)
	for i := range files {
		stat(t, r, fmt.Sprintf("f%04d", i))
	}
	must(t, r.Close())
}
