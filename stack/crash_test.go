package stack_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/stack/stacktest"
)

// The crash harness (issue 10): client processes run a mixed workload
// (writes, appends, overwrites, truncates, fsync, create, rename, unlink,
// directory fsync) while the test SIGKILLs the IO service, the metadata
// service, the journal service or all three, with the clients, at a
// random moment; in a quarter of the rounds the journal service is down
// from the round's start (its records pile up in the staging log, and the
// kill finds them live). Then it starts what it killed again and checks every file and name against a model of
// what was acknowledged, through a new client. Every few rounds, and at
// the end, it stops the services cleanly and runs `weir check`, which
// must find nothing wrong.
//
// The model is built from the workers' reports: a worker prints a line
// before each operation ("begin": it may have happened) and after it
// ("ok" or "err": it returned). A file's acknowledged state is its bytes
// at its last fsync that returned; anything begun since may have reached
// the device, page by page, as on Linux. A name is durable once its file's
// fsync or its directory's fsync returned after it was made, and stays
// until an unlink or rename of it begins.

const crashWorkerEnv = "WEIR_CRASH_WORKER"

// crashEvent is one line of a worker's report.
type crashEvent struct {
	Seq   int    `json:"seq"`
	Phase string `json:"phase"` // begin, ok, err
	Op    string `json:"op"`    // write, truncate, fsync, create, rename, unlink, dirsync
	Path  string `json:"path"`
	To    string `json:"to,omitempty"` // rename
	Off   int64  `json:"off,omitempty"`
	Len   int    `json:"len,omitempty"`
	Fill  byte   `json:"fill,omitempty"`
}

// runCrashWorker is a client process: spec is "dir seed mdsock iosock".
// It runs until it is killed.
func runCrashWorker(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 4 {
		return 2
	}
	dir := f[0]
	seed, _ := strconv.ParseUint(f[1], 10, 64)
	rng := rand.New(rand.NewPCG(seed, 11))
	fsys, err := client.Dial(context.Background(), client.Options{MetadataSocket: f[2], IOSocket: f[3]})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash worker:", err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	seq := 0
	say := func(e crashEvent) {
		b, _ := json.Marshal(e)
		out.Write(append(b, '\n'))
		out.Flush() // one write per line: a kill cuts at most the last
	}
	handles := map[string]*client.File{}
	open := func(p string) (*client.File, error) {
		if h := handles[p]; h != nil {
			return h, nil
		}
		h, err := fsys.OpenFile(p, os.O_RDWR, 0)
		if err == nil {
			handles[p] = h
		}
		return h, err
	}
	drop := func(p string) {
		if h := handles[p]; h != nil {
			h.Close()
			delete(handles, p)
		}
	}
	names := func() []string {
		ents, _ := fsys.ReadDir(dir)
		var n []string
		for _, e := range ents {
			n = append(n, dir+"/"+e.Name())
		}
		return n
	}
	for {
		seq++
		e := crashEvent{Seq: seq}
		ns := names()
		pick := func() string {
			if len(ns) == 0 {
				return dir + "/f0"
			}
			return ns[rng.IntN(len(ns))]
		}
		var run func() error
		switch k := rng.IntN(100); {
		case k < 35 || len(ns) == 0 && k < 60:
			e.Op, e.Path = "write", pick()
			e.Off, e.Len, e.Fill = int64(rng.IntN(40<<10)), 1+rng.IntN(12<<10), byte(seq%251+1)
			if rng.IntN(4) == 0 { // an append
				if st, err := fsys.Stat(e.Path); err == nil {
					e.Off = st.Size()
				}
			}
			run = func() error {
				h, err := open(e.Path)
				if err != nil {
					return err
				}
				_, err = h.WriteAt(slices.Repeat([]byte{e.Fill}, e.Len), e.Off)
				return err
			}
		case k < 42:
			e.Op, e.Path, e.Off = "truncate", pick(), int64(rng.IntN(48<<10))
			run = func() error {
				h, err := open(e.Path)
				if err != nil {
					return err
				}
				return h.Truncate(e.Off)
			}
		case k < 70:
			e.Op, e.Path = "fsync", pick()
			run = func() error {
				h, err := open(e.Path)
				if err != nil {
					return err
				}
				return h.Sync()
			}
		case k < 78:
			e.Op, e.Path = "create", fmt.Sprintf("%s/f%d", dir, rng.IntN(8))
			run = func() error {
				h, err := fsys.OpenFile(e.Path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
				if err == nil {
					handles[e.Path] = h
				}
				return err
			}
		case k < 85:
			e.Op, e.Path, e.To = "rename", pick(), fmt.Sprintf("%s/f%d", dir, rng.IntN(8))
			run = func() error {
				drop(e.Path)
				drop(e.To)
				return fsys.Rename(e.Path, e.To)
			}
		case k < 90:
			e.Op, e.Path = "unlink", pick()
			run = func() error {
				drop(e.Path)
				return fsys.Remove(e.Path)
			}
		case k < 96:
			e.Op, e.Path = "dirsync", dir
			run = func() error {
				h, err := fsys.OpenFile(dir, os.O_RDONLY, 0)
				if err != nil {
					return err
				}
				defer h.Close()
				return h.Sync()
			}
		default: // close a handle (changes outlive it)
			for p := range handles {
				drop(p)
				break
			}
			continue
		}
		e.Phase = "begin"
		say(e)
		if err := run(); err != nil {
			e.Phase = "err"
		} else {
			e.Phase = "ok"
		}
		say(e)
	}
}

// crashFile is the model of one file (one inode, whatever its names).
type crashFile struct {
	id     int
	states [][]byte // states[0]: acknowledged; then every one begun since
	cur    []byte   // as if every begun operation happened
	names  []string // every name it had since its name was last durable
}

func (f *crashFile) add(b []byte) {
	f.cur = b
	f.states = append(f.states, slices.Clone(b))
}

// fits reports why got is not a state the model allows, or "".
func (f *crashFile) fits(got []byte) string {
	lo, hi := len(f.states[0]), len(f.states[0])
	for _, s := range f.states {
		lo, hi = min(lo, len(s)), max(hi, len(s))
	}
	if len(got) < lo || len(got) > hi {
		return fmt.Sprintf("%d bytes, its states since the acknowledged fsync have %d to %d", len(got), lo, hi)
	}
	var bad []string
	for off := 0; off < len(got) && len(bad) < 4; off += 4096 {
		end := min(off+4096, len(got))
		ok := false
		for i, s := range f.states {
			if !stacktest.Padded(f.states, i, end) {
				continue
			}
			want := make([]byte, end-off)
			if off < len(s) {
				copy(want, s[off:min(end, len(s))])
			}
			ok = ok || string(want) == string(got[off:end])
		}
		if !ok {
			var runs []string
			for _, st := range f.states {
				runs = append(runs, stacktest.PageRuns(st, off, end))
			}
			bad = append(bad, fmt.Sprintf("page %d holds bytes of none of its %d states since the acknowledged fsync (%d bytes acknowledged, %d found): found %s; states %s",
				off/4096, len(f.states), len(f.states[0]), len(got), stacktest.PageRuns(got, off, end), strings.Join(runs, " | ")))
		}
	}
	return strings.Join(bad, "; ")
}

// crashDir is the model of one worker's directory.
type crashDir struct {
	path  string
	at    map[string]*crashFile // name -> file, if every begun operation happened
	maybe map[string][]*crashFile
	// durable: names that must exist after a crash, with the file they
	// name; a name leaves it when an unlink or rename of it begins.
	durable map[string]*crashFile
	files   int
	log     []crashEvent // this round's events, for a failure's report
}

func newCrashDir(path string) *crashDir {
	return &crashDir{path: path, at: map[string]*crashFile{}, maybe: map[string][]*crashFile{}, durable: map[string]*crashFile{}}
}

func (d *crashDir) mayBe(name string, f *crashFile) {
	if f != nil && !slices.Contains(d.maybe[name], f) {
		d.maybe[name] = append(d.maybe[name], f)
	}
}

// apply takes one report line into the model.
func (d *crashDir) apply(e crashEvent) {
	d.log = append(d.log, e)
	switch e.Phase {
	case "begin":
		switch e.Op {
		case "write", "truncate":
			f := d.at[e.Path]
			if f == nil {
				return // no such file: it fails
			}
			b := slices.Clone(f.cur)
			if e.Op == "write" {
				if end := int(e.Off) + e.Len; end > len(b) {
					b = append(b, make([]byte, end-len(b))...)
				}
				copy(b[e.Off:], slices.Repeat([]byte{e.Fill}, e.Len))
			} else if int(e.Off) < len(b) {
				b = b[:e.Off]
			} else {
				b = append(b, make([]byte, int(e.Off)-len(b))...)
			}
			f.add(b)
		case "create":
			if d.at[e.Path] == nil {
				d.files++
				f := &crashFile{id: d.files, states: [][]byte{nil}, names: []string{e.Path}}
				d.at[e.Path] = f
				d.mayBe(e.Path, f)
			}
		case "rename":
			f := d.at[e.Path]
			if f == nil || e.Path == e.To {
				return
			}
			delete(d.durable, e.Path)
			delete(d.durable, e.To)
			d.mayBe(e.To, f)
			f.names = append(f.names, e.To)
			delete(d.at, e.Path)
			d.at[e.To] = f
		case "unlink":
			delete(d.durable, e.Path)
			delete(d.at, e.Path)
		}
	case "ok":
		switch e.Op {
		case "fsync":
			// What the fsync covers: the file's state when it began is
			// cur at its return (operations of one worker are
			// sequential); its name too if the file was made under it
			// (an fsync of a new file makes its name durable; a rename
			// is durable at a directory fsync).
			if f := d.at[e.Path]; f != nil {
				f.states = [][]byte{slices.Clone(f.cur)}
				if d.durable[e.Path] == nil && len(f.names) == 1 {
					d.durable[e.Path] = f
				}
			}
		case "dirsync":
			// The entries as they were when it began: exactly these.
			d.durable, d.maybe = map[string]*crashFile{}, map[string][]*crashFile{}
			for n, f := range d.at {
				d.durable[n] = f
				d.mayBe(n, f)
			}
		}
	}
}

// check compares the directory found after a crash (names and bytes) with
// the model and, if it fits, makes it the model's new acknowledged state
// (a process crash loses nothing more once the services are back).
func (d *crashDir) check(found map[string][]byte) []string {
	var bad []string
	for n, f := range d.durable {
		got, ok := found[n]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s (file %d): durable name missing", n, f.id))
			continue
		}
		if why := f.fits(got); why != "" {
			bad = append(bad, fmt.Sprintf("%s (file %d): %s", n, f.id, why))
		}
	}
	for n, got := range found {
		if _, ok := d.durable[n]; ok {
			continue
		}
		cands := d.maybe[n]
		if len(cands) == 0 {
			bad = append(bad, fmt.Sprintf("%s: a name no operation made", n))
			continue
		}
		ok := false
		var why string
		for _, f := range cands {
			if why = f.fits(got); why == "" {
				ok = true
			}
		}
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: %s", n, why))
		}
	}
	if len(bad) > 0 {
		for _, e := range d.log {
			bad = append(bad, fmt.Sprintf("event %+v", e))
		}
		return bad
	}
	d.log = nil
	// The new baseline: what was found, all of it durable now.
	d.at, d.maybe, d.durable = map[string]*crashFile{}, map[string][]*crashFile{}, map[string]*crashFile{}
	for n, got := range found {
		d.files++
		f := &crashFile{id: d.files, states: [][]byte{got}, cur: got, names: []string{n}}
		d.at[n], d.durable[n] = f, f
		d.mayBe(n, f)
	}
	return nil
}

// TestCrash is the harness; WEIR_CRASH_ROUNDS sets the rounds (3 in make
// test, 300 in make crash) and WEIR_CRASH_SEED replays a run.
func TestCrash(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("WEIR_CRASH_SEED"), 10, 64); err == nil {
		seed = v
	}
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("WEIR_CRASH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	t.Logf("seed %d (WEIR_CRASH_SEED), %d rounds (WEIR_CRASH_ROUNDS)", seed, rounds)
	rng := rand.New(rand.NewPCG(seed, 5))
	cfg := testConfig(t)
	url, md, iop, jr := startTrio(t, cfg)
	const workers = 3
	dirs := make([]*crashDir, workers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	{
		fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
		if err != nil {
			t.Fatal(err)
		}
		for i := range dirs {
			dirs[i] = newCrashDir(fmt.Sprintf("w%d", i))
			if err := fsys.Mkdir(dirs[i].path, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		d, err := fsys.OpenFile(".", os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(); err != nil { // the workers' directories are durable
			t.Fatal(err)
		}
		d.Close()
		fsys.Close()
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	kills := map[string]int{}
	checked, acked := 0, 0
	journalDown := 0
	for round := range rounds {
		downAll := rng.IntN(4) == 0
		if downAll {
			jr.kill(t)
			journalDown++
		}
		// The workers, as processes of this test binary.
		var wg sync.WaitGroup
		events := make([][]crashEvent, workers)
		var cmds []*exec.Cmd
		for i := range workers {
			cmd := exec.Command(self, "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s %s", crashWorkerEnv, dirs[i].path, rng.Uint64(), cfg.Metadata.Socket, cfg.IO.Socket))
			cmd.Stderr = testOut{t}
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			cmds = append(cmds, cmd)
			wg.Go(func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					var e crashEvent
					if json.Unmarshal(sc.Bytes(), &e) == nil {
						events[i] = append(events[i], e)
					}
				}
				_, _ = io.Copy(io.Discard, out)
			})
		}
		time.Sleep(time.Duration(100+rng.IntN(700)) * time.Millisecond)
		victim := []string{"io", "metadata", "journal", "all"}[rng.IntN(4)]
		kills[victim]++
		killIO, killMD, killJR := victim == "io" || victim == "all", victim == "metadata" || victim == "all", victim == "journal" || victim == "all"
		// The services first, then the clients: a client must not see a
		// reply the services' death would not have let it see.
		if killIO {
			iop.kill(t)
		}
		if killMD {
			md.kill(t)
		}
		if killJR && !downAll {
			jr.kill(t)
		}
		for _, c := range cmds {
			_ = c.Process.Kill()
		}
		wg.Wait()
		for _, c := range cmds {
			_ = c.Wait()
		}
		for i, evs := range events {
			for _, e := range evs {
				dirs[i].apply(e)
				if e.Phase == "ok" && (e.Op == "fsync" || e.Op == "dirsync") {
					acked++
				}
			}
		}
		if victim == "all" && rng.IntN(2) == 0 {
			// The crash image, before anything recovers it: weir check
			// must read it (the staging log included) and find no
			// damage; sizes the replay will set are notes. Allowed: a
			// blob whose file's create was not durable (orphan-blob, the
			// next start deletes it) and a blob shorter than the size
			// recorded (size-mismatch: a truncate no fsync covered
			// reached the device; the file's next open takes the blob's
			// size). The model checks every acknowledged file below.
			code, rep, stderr := weirCheck(t, cfg)
			for _, p := range rep.Problems {
				if !p.Note && p.Kind != "orphan-blob" && p.Kind != "size-mismatch" {
					t.Fatalf("round %d: weir check of the crash image (exit %d): %+v\n%s", round, code, p, stderr)
				}
			}
		}
		if killIO {
			iop = startService(t, buildWeir(t), "io", cfg, url)
		}
		if killMD {
			md = startService(t, buildWeir(t), "metadata", cfg, url)
		}
		if killJR || downAll {
			jr = startService(t, buildWeir(t), "journal", cfg, url)
		}
		found := readCrashDirs(t, ctx, cfg.Metadata.Socket, cfg.IO.Socket, dirs)
		for i, d := range dirs {
			checked += len(found[i])
			if bad := d.check(found[i]); len(bad) > 0 {
				t.Fatalf("round %d (killed %s), worker %d: %d acknowledged operations lost or wrong: %s",
					round, victim, i, len(bad), strings.Join(bad, "; "))
			}
		}
		if round%25 == 24 || round == rounds-1 {
			jr.stop()
			iop.stop()
			md.stop()
			if code, rep, stderr := weirCheck(t, cfg); code != 0 || !rep.OK() {
				t.Fatalf("round %d: weir check after a clean stop: exit %d, %+v\n%s", round, code, rep, stderr)
			}
			md = startService(t, buildWeir(t), "metadata", cfg, url)
			iop = startService(t, buildWeir(t), "io", cfg, url)
			jr = startService(t, buildWeir(t), "journal", cfg, url)
		}
	}
	t.Logf("%d rounds (%d with the journal service down from the start); SIGKILLs: %v; %d acknowledged fsyncs and directory fsyncs; %d files checked; 0 lost", rounds, journalDown, kills, acked, checked)
}

// readAll reads name to its end as io serves it, not to the size a stat
// reports (after a crash, the metadata service may record a size smaller
// than the blob holds until the file's first read or write grant puts it
// right: a note of weir check).
func readAll(fsys *client.FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if n == len(buf) {
		return nil, fmt.Errorf("%s: larger than the harness reads", name)
	}
	return buf[:n], nil
}

// readCrashDirs reads every file of the workers' directories through a new
// client, waiting for the services to serve again.
func readCrashDirs(t *testing.T, ctx context.Context, mdSock, ioSock string, dirs []*crashDir) []map[string][]byte {
	t.Helper()
	// Until the restarted services have resynchronised each other.
	var fsys *client.FS
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if fsys, err = client.Dial(ctx, client.Options{MetadataSocket: mdSock, IOSocket: ioSock}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no client session after the restart: %v", err)
		}
	}
	defer fsys.Close()
	out := make([]map[string][]byte, len(dirs))
	for i, d := range dirs {
		out[i] = map[string][]byte{}
		ents, err := fsys.ReadDir(d.path)
		if err != nil {
			t.Fatalf("read %s after the crash: %v", d.path, err)
		}
		for _, e := range ents {
			p := d.path + "/" + e.Name()
			b, err := readAll(fsys, p)
			if err != nil {
				t.Fatalf("read %s after the crash: %v", p, err)
			}
			out[i][p] = b
			// What was found becomes the model's acknowledged state: make
			// it so (a write no fsync covered may have been read here and
			// still be taken back by a later replay).
			f, err := fsys.OpenFile(p, os.O_RDONLY, 0)
			if err == nil {
				err = f.Sync()
				f.Close()
			}
			if err != nil {
				t.Fatalf("fsync %s after the crash: %v", p, err)
			}
		}
		dh, err := fsys.OpenFile(d.path, os.O_RDONLY, 0)
		if err == nil {
			err = dh.Sync()
			dh.Close()
		}
		if err != nil {
			t.Fatalf("fsync %s after the crash: %v", d.path, err)
		}
	}
	return out
}
