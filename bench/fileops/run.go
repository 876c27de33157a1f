package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/bench/internal/benchutil"
	iosvc "github.com/weir-storage/weir/services/io"
)

// Workload families, in report order.
const (
	famRandom = "4 KiB random, queue depth 1"
	famMeta   = "metadata, one directory"
	famSeq    = "sequential 1 MiB"
	famCache  = "cache: warm and cold reads, two processes on one file"
	famSmall  = "small files"
)

var families = []string{famRandom, famMeta, famSeq, famCache, famSmall}

// familyFlag maps the names -only takes to the families.
var familyFlag = map[string]string{"random": famRandom, "metadata": famMeta, "sequential": famSeq, "cache": famCache, "smallfiles": famSmall}

// familyNames are familyFlag's keys in report order, for help and errors.
const familyNames = "random, metadata, sequential, cache, smallfiles"

// Workload names within their family.
const (
	wlRead      = "read"
	wlWrite     = "write (no fsync)"
	wlWriteSync = "write + fsync"
	wlCreate    = "create"
	wlStat      = "stat"
	wlUnlink    = "unlink"
	wlSeqWrite  = "write (fsync once at the end)"
	wlSeqRead   = "read"
	// The cache family (issue 9: the rows the page cache is measured by).
	wlWarmRand  = "warm 4 KiB random read"
	wlColdRand  = "cold 4 KiB random read"
	wlColdSeq   = "cold 1 MiB sequential read"
	wlWarmSeq   = "warm 1 MiB sequential read"
	wlTwoReader = "two processes: 4 KiB random read, the other writing"
	wlTwoWriter = "two processes: 4 KiB random write, the other reading"
	// The small-files family.
	wlWarmOpen = "open + read 4 KiB + close, warm"
	wlColdOpen = "open + read 4 KiB + close, cold"
	wlStatHeld = "stat of a file another process holds open for writing"
	wlFSTest   = "fstest.TestFS over 1,000 files"
	wlPingPong = "ping-pong: two trust groups write 4 KiB at 0 of one file in turn"
)

// readOnly are the workloads that change nothing and run alone (their
// "other CPU" is disturbance, not work done for them; the two-process
// reader's includes the writer's).
var readOnly = map[string]bool{wlRead: true, wlStat: true, wlWarmRand: true, wlColdRand: true, wlColdSeq: true, wlWarmSeq: true,
	wlWarmOpen: true, wlColdOpen: true, wlStatHeld: true, wlFSTest: true}

// Names of the files and directory each target works on.
const (
	randFile  = "rand.dat"
	seqFile   = "seq.dat"
	cacheFile = "cache.dat"
	metaDir   = "meta"
	seed      = 42
	// The small-files family's directories: the warm and the cold rows'
	// 4 KiB files, the file the stat row's second process holds open, and
	// the tree fstest.TestFS walks.
	warmDir = "small/warm"
	coldDir = "small/cold"
	heldDir = "small/held"
	treeDir = "small/tree"
	pingDir = "small/pingpong" // the ping-pong row's file
)

// Sizes of the small-files rows.
const (
	warmFiles = 16   // files the warm open + read + close row cycles through
	treeFiles = 1000 // files of the fstest.TestFS tree, in directories of treeDirFiles
	// treeDirFiles is the files per directory of the tree.
	treeDirFiles = 100
	// fstestRuns bounds the TestFS runs of its row: as many as fit in the
	// window, at least one.
	fstestRuns = 5
	// pingTurns bounds the ping-pong row's turns (as many as fit in the
	// window, at most this many).
	pingTurns = 2000
	// otherUID runs the ping-pong row's second weir driver: another user,
	// so another trust group under the default trust_groups = "uid".
	otherUID = 65534
)

// run brings weir up, runs every workload on every target and builds the
// report.
func run(ctx context.Context, cfg options, logger *log.Logger) (rep *report, err error) {
	rep, err = newReport(cfg)
	if err != nil {
		return nil, err
	}
	base := cfg.dir
	if base == "" {
		base = os.TempDir()
	}
	parent, err := os.MkdirTemp(base, "wb-")
	if err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	if cfg.keep {
		logger.Printf("keeping %s", parent)
	} else {
		defer os.RemoveAll(parent)
	}
	rep.Dir = parent
	if rep.Filesystem, err = benchutil.DescribeFS(parent); err != nil {
		return nil, err
	}

	exe := cfg.weirBin
	if exe == "" {
		logger.Print("building cmd/weir")
		bin := filepath.Join(parent, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			return nil, err
		}
		if exe, err = benchutil.BuildWeir(bin); err != nil {
			return nil, err
		}
	}
	var verbose io.Writer
	if cfg.verbose {
		verbose = os.Stderr
	}
	w, err := startWeir(exe, parent, cfg.direct, cfg.wait, verbose)
	if err != nil {
		return nil, err
	}
	weirUp := true
	defer func() {
		if weirUp {
			w.stop()
		}
	}()
	serviceNames, servicePIDs := w.pids()
	logger.Printf("weir is up: services %v, pids %v; data in %s", serviceNames, servicePIDs, parent)

	// The embedded NATS server runs in this process, which otherwise only
	// waits for the drivers: its CPU time counts as weir's.
	r := &runner{ctx: ctx, rep: rep, logger: logger, services: append(slices.Clone(servicePIDs), os.Getpid()),
		drivers: map[string]*driverProc{}, driverArgs: map[string][]string{}, na: map[string]string{}, dir: parent,
		dropWeir: func() error {
			out, err := exec.Command(exe, "drop-caches", "--config", w.cfgPath).CombinedOutput()
			if err != nil {
				return fmt.Errorf("weir drop-caches: %w: %s", err, out)
			}
			return nil
		},
		ioStats: func() (map[string]any, error) { return weirIOStats(exe, w.cfgPath) }}
	for i, n := range serviceNames {
		if n == "io" {
			r.ioPID = servicePIDs[i]
		}
	}
	defer r.stopDrivers()
	for _, t := range allTargets {
		var args []string
		switch t {
		case targetWeir:
			args = []string{"-meta-sock", w.cfg.Metadata.Socket, "-io-sock", w.cfg.IO.Socket, "-wait", cfg.wait}
		default:
			args = []string{"-root", filepath.Join(parent, t)}
		}
		d, err := startDriver(t, args, os.Stderr)
		if err != nil {
			return nil, err
		}
		r.drivers[t] = d
		r.driverArgs[t] = args
	}

	if err := r.workloads(cfg.s, cfg.only); err != nil {
		return nil, err
	}

	// Peak RSS, before anything stops.
	for i, pid := range servicePIDs {
		rep.addRSS(serviceNames[i]+" service", pid)
	}
	for _, t := range allTargets {
		rep.addRSS(t+" client (driver process)", r.drivers[t].Pid())
	}
	rep.addRSS("benchmark process (orchestration, embedded NATS)", os.Getpid())

	r.stopDrivers()
	w.stop()
	weirUp = false
	rep.setWeir(cfg, w)
	rep.finish()
	return rep, nil
}

// runner sends workloads to the drivers and records the rows.
type runner struct {
	ctx      context.Context
	rep      *report
	logger   *log.Logger
	services []int
	drivers  map[string]*driverProc
	// driverArgs start another driver of a target (two-process rows).
	driverArgs map[string][]string
	// dir is the parent of every target's files; syncfs on it before each
	// row writes back what earlier rows left dirty, so that writeback does
	// not land in the next row's window.
	dir string
	// na remembers "target/file" pairs a target could not create (O_DIRECT
	// refused), so the workloads that use the file are n/a too.
	na map[string]string
	// dropWeir empties the IO service's page cache (weir drop-caches).
	dropWeir func() error
	// ioPID is the IO service's process; ioStats asks it for its counters
	// (weir status --json).
	ioPID   int
	ioStats func() (map[string]any, error)
}

func (r *runner) stopDrivers() {
	for _, t := range allTargets {
		d := r.drivers[t]
		if d == nil {
			continue
		}
		if err := d.stop(); err != nil {
			r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("%s driver: %v", t, err))
		}
		delete(r.drivers, t)
	}
}

// workloads runs every family, each workload on every target in turn.
func (r *runner) workloads(s settings, only []string) error {
	run := func(fam string) bool { return len(only) == 0 || slices.Contains(only, fam) }
	if run(famRandom) {
		if err := r.random(s); err != nil {
			return err
		}
	}
	if run(famMeta) {
		if err := r.metadata(s); err != nil {
			return err
		}
	}
	if run(famSeq) {
		if err := r.sequential(s); err != nil {
			return err
		}
	}
	if run(famCache) {
		if err := r.cache(s); err != nil {
			return err
		}
	}
	if run(famSmall) {
		return r.smallFiles(s)
	}
	return nil
}

// Targets of the data and of the namespace workloads.
var (
	dataTargets = []string{targetWeir, targetOS, targetOSDirect}
	nsTargets   = []string{targetWeir, targetOS}
)

// random runs the 4 KiB random family on a file prepared per target.
func (r *runner) random(s settings) error {
	for _, t := range dataTargets {
		if err := r.prepare(t, request{Op: opPrepare, File: randFile, Size: s.RandSize}); err != nil {
			return err
		}
	}
	random := request{File: randFile, Size: s.RandSize, Block: randBlock, Warmup: s.Warmup, Window: s.Window, Seed: seed}
	for _, step := range []struct {
		wl string
		q  request
	}{
		{wlRead, with(random, func(q *request) { q.Op = opRandRead })},
		{wlWrite, with(random, func(q *request) { q.Op = opRandWrite })},
		{wlWriteSync, with(random, func(q *request) {
			q.Op, q.Window, q.MaxOps, q.Warmup = opRandSync, s.FsyncWindow, s.FsyncOps, min(s.Warmup, s.FsyncWindow/10)
		})},
	} {
		for _, t := range dataTargets {
			if err := r.row(famRandom, step.wl, t, step.q); err != nil {
				return err
			}
		}
	}
	for _, t := range dataTargets {
		if err := r.prepare(t, request{Op: opRemove, File: randFile}); err != nil {
			return err
		}
	}
	return nil
}

// metadata runs create, stat and unlink of s.Files files in one directory.
func (r *runner) metadata(s settings) error {
	for _, t := range nsTargets {
		if err := r.prepare(t, request{Op: opMkdir, File: metaDir}); err != nil {
			return err
		}
	}
	for _, step := range []struct{ wl, op string }{{wlCreate, opCreate}, {wlStat, opStat}, {wlUnlink, opUnlink}} {
		for _, t := range nsTargets {
			if err := r.row(famMeta, step.wl, t, request{Op: step.op, File: metaDir, Count: s.Files, Seed: seed}); err != nil {
				return err
			}
		}
	}
	return nil
}

// sequential writes a new file per target in 1 MiB writes, then reads it.
func (r *runner) sequential(s settings) error {
	if err := pretouch(filepath.Join(r.dir, ".pagecache-scratch"), s.SeqSize); err != nil {
		r.rep.Warnings = append(r.rep.Warnings, err.Error())
	}
	seq := request{File: seqFile, Size: s.SeqSize, Block: seqBlock}
	for _, step := range []struct{ wl, op string }{{wlSeqWrite, opSeqWrite}, {wlSeqRead, opSeqRead}} {
		for _, t := range dataTargets {
			if err := r.row(famSeq, step.wl, t, with(seq, func(q *request) { q.Op = step.op })); err != nil {
				return err
			}
		}
	}
	for _, t := range dataTargets {
		if err := r.prepare(t, request{Op: opRemove, File: seqFile}); err != nil {
			return err
		}
	}
	return nil
}

// cache runs the rows the page cache (issue 9) is measured by, on a file
// of s.RandSize prepared per target: 4 KiB random reads of the file just
// written (warm: in the kernel's page cache for os) and after every cache
// was dropped (cold: echo 3 > /proc/sys/vm/drop_caches, which needs root;
// a bounded number of reads, a sixteenth of the file's blocks, so that the
// row itself does not warm the cache much); a 1 MiB sequential read of the
// whole file cold, then again warm; and two processes on the file at once,
// one writing 4 KiB blocks at random while the other reads them (a second
// driver process per target).
func (r *runner) cache(s settings) error {
	for _, t := range dataTargets {
		if err := r.prepare(t, request{Op: opPrepare, File: cacheFile, Size: s.RandSize}); err != nil {
			return err
		}
	}
	random := request{File: cacheFile, Size: s.RandSize, Block: randBlock, Warmup: s.Warmup, Window: s.Window, Seed: seed, Op: opRandRead}
	cold := with(random, func(q *request) { q.Warmup, q.MaxOps = 0, int(s.RandSize/randBlock/16) })
	seq := request{File: cacheFile, Size: s.RandSize, Block: seqBlock, Op: opSeqRead}
	for _, step := range []struct {
		wl   string
		q    request
		drop bool
	}{
		{wlWarmRand, random, false},
		{wlColdRand, cold, true},
		{wlColdSeq, seq, true},
		{wlWarmSeq, seq, false},
	} {
		for _, t := range dataTargets {
			if step.drop {
				err := dropCaches(r.dir)
				if err == nil && t == targetWeir {
					err = r.dropWeir()
				}
				if err != nil {
					r.naRow(famCache, step.wl, t, step.q, err.Error())
					continue
				}
			}
			if err := r.row(famCache, step.wl, t, step.q); err != nil {
				return err
			}
		}
	}
	for _, t := range dataTargets {
		if err := r.twoProcesses(t, with(random, func(q *request) { q.Op = opRandWrite }), random); err != nil {
			return err
		}
	}
	r.rep.Limits = measureLimits(s.RandSize)
	for _, t := range dataTargets {
		if err := r.prepare(t, request{Op: opRemove, File: cacheFile}); err != nil {
			return err
		}
	}
	return nil
}

// smallFiles runs the rows of small files on weir and os, each file
// written and closed first:
//
//   - open, read 4 KiB of and close one of warmFiles files, in turn: warm,
//     every file opened many times, with a warm-up before the window;
//   - the same on s.ColdFiles files, each opened once in a shuffled order,
//     until all were or the window ends: cold for the client, which has
//     not opened the file since writing it (the kernel's caches are not
//     dropped: for os the inode and the data are cached);
//   - stat of a file a second driver process of the target opened for
//     writing (O_RDWR) and wrote 4 KiB to, holding it open for the row: a
//     file some session may be writing, whose size weir's metadata cannot
//     answer alone;
//   - fstest.TestFS over a tree of treeFiles files of 1 byte to 4 KiB,
//     which opens, reads, stats and lists every file and directory several
//     times, as a program relying on io/fs would: os.DirFS for os, the
//     client's FS (fs.Sub at the tree) for weir. It runs as many times as
//     fit in the window, at least once; an error it finds fails the row.
func (r *runner) smallFiles(s settings) error {
	for _, t := range nsTargets {
		for _, q := range []request{
			{Op: opMkFiles, File: warmDir, Count: warmFiles, Block: randBlock},
			{Op: opMkFiles, File: coldDir, Count: s.ColdFiles, Block: randBlock},
			{Op: opMkFiles, File: heldDir, Count: 1}, // empty: the second process writes it
			{Op: opMkTree, File: treeDir, Count: treeFiles, Seed: seed},
			{Op: opMkFiles, File: pingDir, Count: 1, Block: randBlock},
			{Op: opShare, File: fileName(pingDir, 0)},
		} {
			if err := r.prepare(t, q); err != nil {
				return err
			}
		}
	}
	open := request{Op: opOpenRead, Block: randBlock, Seed: seed}
	warm := with(open, func(q *request) { q.File, q.Count, q.Warmup, q.Window = warmDir, warmFiles, s.Warmup, s.Window })
	cold := with(open, func(q *request) { q.File, q.Count, q.MaxOps, q.Window = coldDir, s.ColdFiles, s.ColdFiles, s.Window })
	for _, step := range []struct {
		wl string
		q  request
	}{{wlWarmOpen, warm}, {wlColdOpen, cold}} {
		for _, t := range nsTargets {
			if err := r.row(famSmall, step.wl, t, step.q); err != nil {
				return err
			}
		}
	}
	held := request{Op: opStatFile, File: fileName(heldDir, 0), Size: randBlock, Warmup: s.Warmup, Window: s.Window}
	for _, t := range nsTargets {
		if err := r.statHeld(t, held); err != nil {
			return err
		}
	}
	for _, t := range nsTargets {
		if err := r.row(famSmall, wlFSTest, t, request{Op: opFSTest, File: treeDir, Count: treeFiles, MaxOps: fstestRuns, Window: s.Window}); err != nil {
			return err
		}
	}
	for _, t := range nsTargets {
		r.pingPong(t, s)
	}
	return nil
}

// pingPong runs the ping-pong row on target t: t's driver and a second
// driver process, both holding one file open for writing, take turns
// writing 4 KiB at its offset 0; a turn is one write, timed in its driver.
// On weir the second driver runs as uid otherUID, another trust group
// (under the default trust_groups = "uid"), so every turn recalls the
// other's exclusive lease: the row is what a recall costs the writer
// whose turn it is (MinTenure included). The kernel has no trust groups;
// its second driver runs as this uid, and its row is a write to a file
// another process writes too.
func (r *runner) pingPong(t string, s settings) {
	q := request{Op: opWriteOnce, File: fileName(pingDir, 0), Block: randBlock}
	if t == targetWeir {
		q.Services = r.services
	}
	fail := func(format string, a ...any) {
		r.record(newRow(famSmall, wlPingPong, t, q, result{Error: fmt.Sprintf(format, a...)}))
	}
	if why := r.na[t+"/"+pingDir]; why != "" {
		r.naRow(famSmall, wlPingPong, t, q, why)
		return
	}
	d := r.drivers[t]
	if d == nil {
		r.naRow(famSmall, wlPingPong, t, q, t+" driver is gone")
		return
	}
	exe, cred, cleanup, why := r.secondGroup(t)
	defer cleanup()
	if why != "" {
		r.naRow(famSmall, wlPingPong, t, q, why)
		return
	}
	second, err := startDriverAs(exe, cred, t, r.driverArgs[t], os.Stderr)
	if err != nil {
		fail("start the second driver: %v", err)
		return
	}
	defer func() {
		if err := second.stop(); err != nil {
			r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("second %s driver: %v", t, err))
		}
	}()
	call := func(p *driverProc, q request) (result, error) {
		res, err := p.call(q)
		if err == nil && res.Error+res.NA != "" {
			err = errors.New(res.Error + res.NA)
		}
		return res, err
	}
	for i, p := range []*driverProc{d, second} {
		if _, err := call(p, request{Op: opOpen, File: q.File}); err != nil {
			fail("driver %d: open %s for writing: %v", i+1, q.File, err)
			return
		}
	}
	h := new(benchutil.Histogram)
	var sum result
	start := time.Now()
	for i := 0; i < pingTurns && time.Since(start) < s.Window; i++ {
		p := d
		if i%2 == 1 {
			p = second
		}
		q.Seed = uint64(i)
		res, err := call(p, q)
		if err != nil {
			fail("turn %d: %v", i, err)
			return
		}
		h.Record(int64(res.Elapsed))
		sum.Elapsed += res.Elapsed
		sum.ClientCPU += res.ClientCPU
		sum.ServiceCPU += res.ServiceCPU
		sum.OtherCPU += res.OtherCPU
	}
	sum.Ops, sum.Bytes = h.Count(), int64(h.Count())*int64(q.Block)
	sum.P50us, sum.P99us, sum.P999us = h.QuantileUs(0.50), h.QuantileUs(0.99), h.QuantileUs(0.999)
	sum.MeanUs, sum.MaxUs = h.Mean()/1e3, float64(h.Max())/1e3
	sum.CDF = h.CDF()
	r.record(newRow(famSmall, wlPingPong, t, q, sum))
}

// secondGroup returns how to start the ping-pong row's second driver of
// t: the executable, the credentials, a cleanup to run after it, and why
// it cannot run here ("" when it can). For weir, another uid: it needs
// root, a copy of this executable that uid may run, and the weir sockets
// reachable by it.
func (r *runner) secondGroup(t string) (exe string, cred *syscall.Credential, cleanup func(), why string) {
	cleanup = func() {}
	self, err := os.Executable()
	if err != nil {
		return "", nil, cleanup, fmt.Sprintf("find own executable: %v", err)
	}
	if t != targetWeir {
		return self, nil, cleanup, ""
	}
	if os.Geteuid() != 0 {
		return "", nil, cleanup, fmt.Sprintf("needs root: the second writer runs as uid %d, another trust group", otherUID)
	}
	dir, err := os.MkdirTemp("", "fileops-exe-")
	if err != nil {
		return "", nil, cleanup, err.Error()
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	exe = filepath.Join(dir, "fileops")
	if err := copyExecutable(self, exe); err != nil {
		return "", nil, cleanup, fmt.Sprintf("copy the executable for uid %d: %v", otherUID, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", nil, cleanup, err.Error()
	}
	args := r.driverArgs[t]
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-meta-sock" && args[i] != "-io-sock" {
			continue
		}
		run := filepath.Dir(args[i+1])
		// The run directory, and the directories from it up to the
		// run's parent directory, are the benchmark's own (temporary).
		for d := run; ; d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				return "", nil, cleanup, fmt.Sprintf("open %s to uid %d: %v", d, otherUID, err)
			}
			if rel, err := filepath.Rel(r.dir, d); d == run && (err != nil || strings.HasPrefix(rel, "..")) || d == r.dir || d == filepath.Dir(d) {
				break
			}
		}
		for d := run; ; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err != nil || fi.Mode().Perm()&0o001 == 0 {
				return "", nil, cleanup, fmt.Sprintf("uid %d cannot reach the weir socket %s: %s is not searchable by others", otherUID, args[i+1], d)
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return exe, &syscall.Credential{Uid: otherUID, Gid: otherUID}, cleanup, ""
}

// copyExecutable copies the program at from to a new file to, mode 0755.
func copyExecutable(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// statHeld runs the stat row q on target t while a second driver process
// of t holds q.File open for writing, having written q.Size bytes to it.
func (r *runner) statHeld(t string, q request) error {
	second, err := startDriver(t, r.driverArgs[t], os.Stderr)
	if err != nil {
		return err
	}
	defer func() {
		if err := second.stop(); err != nil {
			r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("second %s driver: %v", t, err))
		}
	}()
	res, err := second.call(request{Op: opOpen, File: q.File, Block: int(q.Size)})
	if err == nil && res.Error+res.NA != "" {
		err = errors.New(res.Error + res.NA)
	}
	if err != nil {
		why := fmt.Sprintf("the second process could not open the file for writing and write %d bytes: %v", q.Size, err)
		r.record(newRow(famSmall, wlStatHeld, t, q, result{Error: why}))
		return nil
	}
	return r.row(famSmall, wlStatHeld, t, q)
}

// twoProcesses runs write on target t's driver and, at the same time, read
// on a second driver process of t that opens the same file.
func (r *runner) twoProcesses(t string, write, read request) error {
	if why := r.na[t+"/"+write.File]; why != "" {
		r.naRow(famCache, wlTwoWriter, t, write, why)
		r.naRow(famCache, wlTwoReader, t, read, why)
		return nil
	}
	d := r.drivers[t]
	if d == nil {
		r.naRow(famCache, wlTwoWriter, t, write, t+" driver is gone")
		r.naRow(famCache, wlTwoReader, t, read, t+" driver is gone")
		return nil
	}
	second, err := startDriver(t, r.driverArgs[t], os.Stderr)
	if err != nil {
		return err
	}
	defer func() {
		if err := second.stop(); err != nil {
			r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("second %s driver: %v", t, err))
		}
	}()
	if res, err := second.call(request{Op: opOpen, File: read.File}); err != nil || res.Error != "" || res.NA != "" {
		why := fmt.Sprintf("the second process cannot open the file: %v %s%s", err, res.Error, res.NA)
		r.naRow(famCache, wlTwoWriter, t, write, why)
		r.naRow(famCache, wlTwoReader, t, read, why)
		return nil
	}
	if err := syncFS(r.dir); err != nil {
		r.rep.Warnings = append(r.rep.Warnings, err.Error())
	}
	if t == targetWeir {
		write.Services, read.Services = r.services, r.services
	}
	var wres, rres result
	var werr, rerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		rres, rerr = second.call(read)
	}()
	wres, werr = d.call(write)
	<-done
	for _, x := range []struct {
		wl  string
		q   request
		res result
		err error
	}{{wlTwoWriter, write, wres, werr}, {wlTwoReader, read, rres, rerr}} {
		if x.err != nil {
			x.res = result{Error: x.err.Error()}
		}
		row := newRow(famCache, x.wl, t, x.q, x.res)
		r.memory(&row, x.res)
		r.record(row)
	}
	return nil
}

// naRow records a row that could not run, and why.
func (r *runner) naRow(family, wl, t string, q request, why string) {
	r.record(newRow(family, wl, t, q, result{NA: why}))
}

// dropCaches writes back what is dirty under dir and drops the kernel's
// page cache, dentries and inodes (root only). A cold weir row also
// empties weir's own cache (runner.dropWeir): the file backend's blobs
// are files under dir, read with O_DIRECT, so the kernel's cache holds
// none of them.
func dropCaches(dir string) error {
	if err := syncFS(dir); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		return fmt.Errorf("a cold row needs the kernel's caches dropped, which needs root: %w", err)
	}
	return nil
}

func with(q request, f func(*request)) request {
	f(&q)
	return q
}

// call sends q to target's driver. A driver that failed earlier fails the
// request; an interrupted run stops here.
func (r *runner) call(t string, q request) (result, error) {
	if err := r.ctx.Err(); err != nil {
		return result{}, fmt.Errorf("interrupted: %w", err)
	}
	d := r.drivers[t]
	if d == nil {
		return result{Error: t + " driver is gone"}, nil
	}
	if t == targetWeir {
		q.Services = r.services
	}
	res, err := d.call(q)
	if err != nil {
		// The driver was killed: its later requests fail as rows.
		delete(r.drivers, t)
		r.rep.Warnings = append(r.rep.Warnings, err.Error())
		return result{Error: err.Error()}, nil
	}
	return res, nil
}

// prepare runs a step that is not a row; its failure is a warning, except
// for the preparation of the random file, which is also recorded.
func (r *runner) prepare(t string, q request) error {
	res, err := r.call(t, q)
	if err != nil {
		return err
	}
	if res.NA != "" {
		r.na[t+"/"+q.File] = res.NA
	}
	if q.Op == opPrepare {
		r.rep.Prep = append(r.rep.Prep, prepNote{Target: t, Bytes: res.Bytes, Seconds: res.Elapsed.Seconds(), NA: res.NA, Error: res.Error})
	}
	switch {
	case res.Error != "":
		msg := fmt.Sprintf("%s %s %s: %s", t, q.Op, q.File, res.Error)
		r.logger.Print(msg)
		if q.Op != opPrepare {
			r.rep.Warnings = append(r.rep.Warnings, msg)
		}
	case res.NA != "":
		r.logger.Printf("%s %s %s: n/a: %s", t, q.Op, q.File, res.NA)
	case q.Op == opPrepare:
		r.logger.Printf("%-9s prepared %s: %d MiB in %.2f s", t, q.File, res.Bytes/mib, res.Elapsed.Seconds())
	}
	return nil
}

// row runs one measured workload and records it.
func (r *runner) row(family, wl, t string, q request) error {
	res, err := result{NA: r.na[t+"/"+q.File]}, error(nil)
	if res.NA == "" {
		if err := syncFS(r.dir); err != nil {
			r.rep.Warnings = append(r.rep.Warnings, err.Error())
		}
		if res, err = r.call(t, q); err != nil {
			return err
		}
		if res.NA != "" {
			r.na[t+"/"+q.File] = res.NA
		}
	}
	row := newRow(family, wl, t, q, res)
	if family == famCache {
		r.memory(&row, res)
	}
	r.record(row)
	return nil
}

// memory fills in a cache row's memory: the driver's, and for weir the IO
// service's and its cache's.
func (r *runner) memory(row *Row, res result) {
	if row.NA != "" || row.Error != "" || res.RSSKiB == 0 {
		return
	}
	m := &RowMem{ClientRSSKiB: res.RSSKiB, ClientShmemKiB: res.ShmemKiB}
	row.Mem = m
	if row.Target != targetWeir || r.ioPID == 0 {
		return
	}
	m.IORSSKiB, m.IOShmemKiB, _ = benchutil.ProcMem(r.ioPID)
	st, err := r.ioStats()
	if err != nil {
		r.rep.Warnings = append(r.rep.Warnings, "io's cache counters: "+err.Error())
		return
	}
	num := func(k string) int64 {
		v, _ := strconv.ParseInt(fmt.Sprint(st[k]), 10, 64)
		return v
	}
	m.CacheBytes, m.CacheResidentPages, m.CacheLimitPages = num("cache_memory_bytes"), num("cache_resident_pages"), num("cache_limit_pages")
}

// record adds a row to the report and logs it.
func (r *runner) record(row Row) {
	r.rep.Rows = append(r.rep.Rows, row)
	switch {
	case row.Error != "":
		r.logger.Printf("%-28s %-30s %-9s error: %s", row.Family, row.Workload, row.Target, strings.ReplaceAll(row.Error, "\n", "; "))
	case row.NA != "":
		r.logger.Printf("%-28s %-30s %-9s n/a: %s", row.Family, row.Workload, row.Target, row.NA)
	default:
		r.logger.Printf("%-28s %-30s %-9s %7d ops %10.0f ops/s  p50 %8.1f µs  p99 %8.1f µs", row.Family, row.Workload, row.Target,
			row.Ops, row.OpsPerSec, row.P50us, row.P99us)
	}
}

// syncFS writes back every dirty page and inode of the file system holding
// dir (syncfs(2)).
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// pretouch writes size bytes to path through the page cache and removes
// the file, dropping its pages unwritten. The page cache then has that much
// memory the guest has used before. On the reference VM, growing the page
// cache into never-used memory was about ten times slower than reusing
// memory (dd of 512 MiB: 310 MB/s into fresh memory, 3.5 GB/s into reused;
// most likely the hypervisor backing guest memory on first touch), and that
// would be charged to the os row of the sequential write.
func pretouch(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("page cache pre-touch: %w", err)
	}
	defer os.Remove(path)
	buf := make([]byte, mib)
	for off := int64(0); off < size; off += mib {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return fmt.Errorf("page cache pre-touch: %w", err)
		}
	}
	return f.Close()
}

// weirIOStats returns the IO service's counters, as `weir status --json`
// prints them.
func weirIOStats(exe, cfgPath string) (map[string]any, error) {
	out, err := exec.Command(exe, "status", "--json", "--config", cfgPath).Output()
	if err != nil {
		return nil, fmt.Errorf("weir status: %w", err)
	}
	var st []struct {
		Name  string         `json:"name"`
		Stats map[string]any `json:"stats"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber() // counters past 2^53 stay exact, and print as integers
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("weir status --json: %w", err)
	}
	for _, s := range st {
		if s.Name == iosvc.ServiceName {
			return s.Stats, nil
		}
	}
	return nil, fmt.Errorf("weir status --json: no IO service in %s", out)
}
