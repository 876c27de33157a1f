package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"strings"
	"testing/fstest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// driverRoleArg, as the first argument, makes this program a driver: the
// child process that runs one target's workloads. The orchestrator sends it
// one JSON request per line on stdin and reads one JSON result per line
// from stdout; closing stdin ends it. Each target gets its own process, so
// each client's peak RSS is its own and the orchestrator's embedded NATS
// server shares no process with any client.
const driverRoleArg = "__fileops-driver"

// Driver operations.
const (
	opPrepare   = "prepare"         // write File (Size bytes) in 1 MiB blocks, fsync, keep it open
	opRandRead  = "randread"        // Block-byte reads at random aligned offsets of File
	opRandWrite = "randwrite"       // Block-byte writes at random aligned offsets, no fsync
	opRandSync  = "randwrite-fsync" // the same, each followed by Sync
	opSeqWrite  = "seqwrite"        // create File, write Size bytes in Block-byte writes, then fsync
	opSeqRead   = "seqread"         // read the open File from start to end in Block-byte reads
	opMkdir     = "mkdir"           // MkdirAll(File)
	opCreate    = "create"          // create Count files in directory File
	opStat      = "stat"            // stat them, in a shuffled order
	opUnlink    = "unlink"          // remove them, in another shuffled order
	opRemove    = "remove"          // close and remove File
	opOpen      = "open"            // open the existing File (another driver prepared it) O_RDWR, write Block bytes at 0 (if any), keep it open
	opMkFiles   = "mkfiles"         // create Count files of Block bytes in directory File, each written and closed
	opMkTree    = "mktree"          // create Count files of 1 byte to 4 KiB under File, treeDirFiles per directory
	opOpenRead  = "openread"        // open one of the mkfiles files, read Block bytes, close; in turn, in a shuffled order
	opStatFile  = "statfile"        // stat File over and over, then check that it has Size bytes
	opFSTest    = "fstest"          // fstest.TestFS over the mktree tree under File
	opShare     = "share"           // chmod File 0666 (a second driver of another uid writes it)
	opWriteOnce = "writeonce"       // write Block bytes at 0 of the open File, once (the ping-pong row's turn)
)

// request is one workload for a driver.
type request struct {
	Op     string        `json:"op"`
	File   string        `json:"file"`
	Size   int64         `json:"size,omitempty"`    // file size
	Block  int           `json:"block,omitempty"`   // bytes per read or write
	Count  int           `json:"count,omitempty"`   // files of the metadata workloads
	Warmup time.Duration `json:"warmup,omitempty"`  // ops run and not counted before the window
	Window time.Duration `json:"window,omitempty"`  // measured time; 0 = until MaxOps
	MaxOps int           `json:"max_ops,omitempty"` // measured ops; 0 = until Window
	Seed   uint64        `json:"seed,omitempty"`
	// Services are the PIDs whose CPU time counts as the row's service
	// time (weir's metadata and IO processes and the process running the
	// embedded NATS server).
	Services []int `json:"services,omitempty"`
}

// result is what a driver measured for one request.
type result struct {
	Error string `json:"error,omitempty"`
	NA    string `json:"na,omitempty"` // the target cannot run this workload here

	Ops     uint64               `json:"ops"`
	Bytes   int64                `json:"bytes"`
	Elapsed time.Duration        `json:"elapsed_ns"`
	P50us   float64              `json:"p50_us"`
	P99us   float64              `json:"p99_us"`
	P999us  float64              `json:"p999_us"`
	MeanUs  float64              `json:"mean_us"`
	MaxUs   float64              `json:"max_us"`
	CDF     []benchutil.CDFPoint `json:"cdf,omitempty"`

	ClientCPU  time.Duration `json:"client_cpu_ns"`
	ServiceCPU time.Duration `json:"service_cpu_ns"`
	// OtherCPU is machine-wide busy time not used by the driver or the
	// services, plus time stolen by the hypervisor, over the window.
	OtherCPU   time.Duration `json:"other_cpu_ns"`
	FinalSync  time.Duration `json:"final_sync_ns,omitempty"` // seqwrite: the fsync after the last write
	PeakRSSKiB int64         `json:"peak_rss_kib"`            // the driver's, after the request
	// RSSKiB and ShmemKiB: the driver's resident set after the request, and
	// the shared memory in it (for weir, the cache region pages it mapped).
	RSSKiB   int64 `json:"rss_kib"`
	ShmemKiB int64 `json:"shmem_kib"`
}

// driver runs requests against one target.
type driver struct {
	t     target
	files map[string]dataFile // open data files by name
	// wbuf and rbuf are page-aligned (mmap), as O_DIRECT needs, and hold
	// the largest block any request uses.
	wbuf, rbuf []byte
}

// maxBlock bounds Block and is the size of the prepare writes.
const maxBlock = 1 << 20

func driverMain(args []string) int {
	fs := flag.NewFlagSet(driverRoleArg, flag.ContinueOnError)
	name := fs.String("target", "", "weir, os or os-direct")
	root := fs.String("root", "", "directory the os targets work in")
	metaSock := fs.String("meta-sock", "", "weir metadata socket")
	ioSock := fs.String("io-sock", "", "weir IO socket")
	wait := fs.String("wait", "adaptive", "weir client wait mode")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	enc := json.NewEncoder(os.Stdout)
	d, err := newDriver(*name, *root, *metaSock, *ioSock, *wait)
	if err != nil {
		// The first line is the driver's hello: an error or an empty result.
		_ = enc.Encode(result{Error: err.Error()})
		return 1
	}
	defer d.close()
	if err := enc.Encode(result{}); err != nil {
		return 1
	}
	dec := json.NewDecoder(os.Stdin)
	for {
		var q request
		if err := dec.Decode(&q); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			fmt.Fprintf(os.Stderr, "fileops driver %s: %v\n", *name, err)
			return 1
		}
		r := d.do(q)
		if kib, err := benchutil.ProcPeakRSS(os.Getpid()); err == nil {
			r.PeakRSSKiB = kib
		}
		if rss, shmem, err := benchutil.ProcMem(os.Getpid()); err == nil {
			r.RSSKiB, r.ShmemKiB = rss, shmem
		}
		if err := enc.Encode(r); err != nil {
			return 1
		}
	}
}

func newDriver(name, root, metaSock, ioSock, wait string) (*driver, error) {
	var t target
	switch name {
	case targetWeir:
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w, err := dialWeir(ctx, metaSock, ioSock, wait)
		if err != nil {
			return nil, err
		}
		t = w
	case targetOS, targetOSDirect:
		if root == "" {
			return nil, errors.New("no -root")
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, err
		}
		t = &osTarget{root: root, direct: name == targetOSDirect}
	default:
		return nil, fmt.Errorf("unknown target %q", name)
	}
	d := &driver{t: t, files: map[string]dataFile{}}
	var err error
	if d.wbuf, err = alignedBuffer(maxBlock); err != nil {
		return nil, err
	}
	if d.rbuf, err = alignedBuffer(maxBlock); err != nil {
		return nil, err
	}
	fill(d.wbuf, 0, 1)
	return d, nil
}

// alignedBuffer returns n bytes of page-aligned anonymous memory.
func alignedBuffer(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	return b, nil
}

func (d *driver) close() {
	for name, f := range d.files {
		_ = f.Close()
		delete(d.files, name)
	}
	_ = d.t.Close()
}

// Every 4 KiB block the benchmark writes starts with its own file offset
// (8 bytes, little endian) followed by pseudo-random bytes, so reads can be
// checked cheaply after the measured window.
const stamp = 4096

// fill gives b (written at offset off) its stamps and a pseudo-random body.
func fill(b []byte, off int64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	restamp(b, off)
}

// restamp writes the offset stamps of b, written at offset off.
func restamp(b []byte, off int64) {
	for i := 0; i+8 <= len(b); i += stamp {
		binary.LittleEndian.PutUint64(b[i:], uint64(off)+uint64(i))
	}
}

// checkStamps reports the first block of b (read at off) whose stamp is
// wrong.
func checkStamps(b []byte, off int64) error {
	for i := 0; i+8 <= len(b); i += stamp {
		if got, want := binary.LittleEndian.Uint64(b[i:]), uint64(off)+uint64(i); got != want {
			return fmt.Errorf("data read at offset %d holds the stamp of offset %d", want, got)
		}
	}
	return nil
}

// do runs one request. Errors end up in the result.
func (d *driver) do(q request) (r result) {
	var err error
	switch q.Op {
	case opPrepare:
		r, err = d.prepare(q)
	case opRandRead, opRandWrite, opRandSync:
		r, err = d.random(q)
	case opSeqWrite:
		r, err = d.seqWrite(q)
	case opSeqRead:
		r, err = d.seqRead(q)
	case opOpen:
		err = d.open(q)
	case opMkdir:
		err = d.t.MkdirAll(q.File)
	case opCreate, opStat, opUnlink:
		r, err = d.meta(q)
	case opMkFiles:
		err = d.mkFiles(q)
	case opMkTree:
		err = d.mkTree(q)
	case opOpenRead:
		r, err = d.openRead(q)
	case opStatFile:
		r, err = d.statFile(q)
	case opFSTest:
		r, err = d.fsTest(q)
	case opShare:
		err = d.t.Chmod(q.File, 0o666)
	case opWriteOnce:
		r, err = d.writeOnce(q)
	case opRemove:
		if f := d.files[q.File]; f != nil {
			err = f.Close()
			delete(d.files, q.File)
		}
		err = errors.Join(err, d.t.Remove(q.File))
	default:
		err = fmt.Errorf("unknown op %q", q.Op)
	}
	var na *notApplicable
	switch {
	case errors.As(err, &na):
		r.NA = na.why
	case err != nil:
		r.Error = err.Error()
	}
	return r
}

func (d *driver) block(q request) ([]byte, []byte, error) {
	if q.Block <= 0 || q.Block > maxBlock || q.Block%stamp != 0 {
		return nil, nil, fmt.Errorf("block size %d: want a multiple of %d up to %d", q.Block, stamp, maxBlock)
	}
	return d.wbuf[:q.Block], d.rbuf[:q.Block], nil
}

// open opens the existing file for reading and writing and keeps it open;
// with Block, it then writes Block bytes at offset 0 (not synced).
func (d *driver) open(q request) error {
	if q.Block < 0 || q.Block > maxBlock {
		return fmt.Errorf("block size %d: want up to %d", q.Block, maxBlock)
	}
	f, err := d.t.OpenFile(q.File, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if old := d.files[q.File]; old != nil {
		old.Close()
	}
	d.files[q.File] = f
	if q.Block == 0 {
		return nil
	}
	w := d.wbuf[:q.Block]
	restamp(w, 0)
	_, err = f.WriteAt(w, 0)
	return err
}

// prepare writes the file of the random workloads in full and syncs it.
func (d *driver) prepare(q request) (result, error) {
	var r result
	if q.Size <= 0 || q.Size%maxBlock != 0 {
		return r, fmt.Errorf("size %d: want a positive multiple of %d", q.Size, maxBlock)
	}
	if old := d.files[q.File]; old != nil {
		_ = old.Close()
		delete(d.files, q.File)
	}
	f, err := d.t.OpenFile(q.File, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return r, err
	}
	d.files[q.File] = f
	start := time.Now()
	for off := int64(0); off < q.Size; off += maxBlock {
		restamp(d.wbuf, off)
		if _, err := f.WriteAt(d.wbuf, off); err != nil {
			return r, refused(err)
		}
	}
	if err := f.Sync(); err != nil {
		return r, err
	}
	r.Elapsed, r.Bytes, r.Ops = time.Since(start), q.Size, uint64(q.Size/maxBlock)
	return r, nil
}

// refused turns EINVAL from an O_DIRECT transfer into "not applicable".
func refused(err error) error {
	if errors.Is(err, unix.EINVAL) {
		return &notApplicable{fmt.Sprintf("direct I/O refused: %v", err)}
	}
	return err
}

// random runs 4 KiB (Block) reads or writes at uniformly random aligned
// offsets of a prepared file.
func (d *driver) random(q request) (result, error) {
	f := d.files[q.File]
	if f == nil {
		return result{}, fmt.Errorf("%s is not prepared", q.File)
	}
	w, rb, err := d.block(q)
	if err != nil {
		return result{}, err
	}
	blocks := q.Size / int64(q.Block)
	if blocks <= 0 {
		return result{}, fmt.Errorf("file size %d below one block", q.Size)
	}
	rng := rand.New(rand.NewPCG(q.Seed, 3))
	var lastOff int64
	var op func(int) error
	switch q.Op {
	case opRandRead:
		op = func(int) error {
			lastOff = rng.Int64N(blocks) * int64(q.Block)
			_, err := f.ReadAt(rb, lastOff)
			return err
		}
	case opRandWrite:
		op = func(int) error {
			lastOff = rng.Int64N(blocks) * int64(q.Block)
			binary.LittleEndian.PutUint64(w, uint64(lastOff))
			_, err := f.WriteAt(w, lastOff)
			return err
		}
	case opRandSync:
		op = func(int) error {
			lastOff = rng.Int64N(blocks) * int64(q.Block)
			binary.LittleEndian.PutUint64(w, uint64(lastOff))
			if _, err := f.WriteAt(w, lastOff); err != nil {
				return err
			}
			return f.Sync()
		}
	}
	r, err := measure(q, op)
	if err != nil {
		return r, refused(err)
	}
	r.Bytes = int64(r.Ops) * int64(q.Block)
	if q.Op == opRandRead {
		return r, checkStamps(rb, lastOff)
	}
	// Read the last block written back: the write must have landed.
	if _, err := f.ReadAt(rb, lastOff); err != nil {
		return r, fmt.Errorf("read back: %w", err)
	}
	return r, checkStamps(rb, lastOff)
}

// seqWrite creates the file and writes it from start to end, each Block
// one timed op, then syncs it once (timed apart).
func (d *driver) seqWrite(q request) (result, error) {
	w, _, err := d.block(q)
	if err != nil {
		return result{}, err
	}
	if q.Size <= 0 || q.Size%int64(q.Block) != 0 {
		return result{}, fmt.Errorf("size %d: want a positive multiple of %d", q.Size, q.Block)
	}
	f, err := d.t.OpenFile(q.File, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return result{}, err
	}
	d.files[q.File] = f
	q.MaxOps, q.Window, q.Warmup = int(q.Size/int64(q.Block)), 0, 0
	r, err := measure(q, func(i int) error {
		off := int64(i) * int64(q.Block)
		restamp(w, off)
		_, err := f.WriteAt(w, off)
		return err
	})
	if err != nil {
		return r, refused(err)
	}
	start := time.Now()
	if err := f.Sync(); err != nil {
		return r, err
	}
	r.FinalSync = time.Since(start)
	r.Bytes = q.Size
	return r, nil
}

// seqRead reads the file seqWrite left open from start to end and checks
// every block's stamp after the window.
func (d *driver) seqRead(q request) (result, error) {
	f := d.files[q.File]
	if f == nil {
		return result{}, fmt.Errorf("%s is not written", q.File)
	}
	_, rb, err := d.block(q)
	if err != nil {
		return result{}, err
	}
	q.MaxOps, q.Window, q.Warmup = int(q.Size/int64(q.Block)), 0, 0
	var bad error
	r, err := measure(q, func(i int) error {
		off := int64(i) * int64(q.Block)
		if _, err := f.ReadAt(rb, off); err != nil {
			return err
		}
		if bad == nil {
			// A few ns per 4 KiB against µs per op; kept inside the loop
			// so every block is checked without a second pass.
			bad = checkStamps(rb, off)
		}
		return nil
	})
	if err != nil {
		return r, refused(err)
	}
	r.Bytes = q.Size
	return r, bad
}

// meta runs one of the metadata workloads over Count files in directory
// File: create in name order, stat and unlink in shuffled orders.
func (d *driver) meta(q request) (result, error) {
	if q.Count <= 0 {
		return result{}, fmt.Errorf("count %d", q.Count)
	}
	names := make([]string, q.Count)
	for i := range names {
		names[i] = fileName(q.File, i)
	}
	var op func(string) error
	switch q.Op {
	case opCreate:
		op = d.t.Create
	case opStat:
		op = func(name string) error {
			_, err := d.t.Stat(name)
			return err
		}
	case opUnlink:
		op = d.t.Remove
	}
	if q.Op != opCreate {
		rng := rand.New(rand.NewPCG(q.Seed, 5))
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	}
	q.MaxOps, q.Window, q.Warmup = q.Count, 0, 0
	return measure(q, func(i int) error { return op(names[i]) })
}

// fileName is the name of the i-th file of the metadata and small-files
// workloads in directory dir.
func fileName(dir string, i int) string { return fmt.Sprintf("%s/f%07d", dir, i) }

// mkFiles creates Count files of Block bytes in directory File, in name
// order, each written in one write and closed; nothing is synced.
func (d *driver) mkFiles(q request) error {
	if q.Count <= 0 || q.Block < 0 || q.Block > maxBlock {
		return fmt.Errorf("count %d, block size %d: want a positive count and a block up to %d", q.Count, q.Block, maxBlock)
	}
	if err := d.t.MkdirAll(q.File); err != nil {
		return err
	}
	w := d.wbuf[:q.Block]
	restamp(w, 0)
	for i := range q.Count {
		if err := d.writeFile(fileName(q.File, i), w); err != nil {
			return err
		}
	}
	return nil
}

// treeName is the name of the i-th file of the fstest tree, relative to
// the tree's root.
func treeName(i int) string { return fmt.Sprintf("d%03d/f%04d", i/treeDirFiles, i%treeDirFiles) }

// mkTree creates Count files under directory File, treeDirFiles to a
// directory, of 1 byte to 4 KiB each (pseudo-random sizes from Seed, the
// same on every target).
func (d *driver) mkTree(q request) error {
	if q.Count <= 0 {
		return fmt.Errorf("count %d", q.Count)
	}
	rng := rand.New(rand.NewPCG(q.Seed, 11))
	for i := range q.Count {
		if i%treeDirFiles == 0 {
			if err := d.t.MkdirAll(q.File + "/" + path.Dir(treeName(i))); err != nil {
				return err
			}
		}
		if err := d.writeFile(q.File+"/"+treeName(i), d.wbuf[:1+rng.IntN(randBlock)]); err != nil {
			return err
		}
	}
	return nil
}

// writeFile creates (or truncates) name and writes b to it in one write.
func (d *driver) writeFile(name string, b []byte) error {
	f, err := d.t.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if len(b) > 0 {
		if _, err := f.WriteAt(b, 0); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// openRead opens one of the Count files mkFiles made in directory File,
// reads its Block bytes and closes it, each op the next file of one
// shuffled order (starting over after the last: with MaxOps = Count and
// no warm-up each file is opened once). The last block read is checked
// against what mkFiles wrote after the window.
func (d *driver) openRead(q request) (result, error) {
	if q.Count <= 0 {
		return result{}, fmt.Errorf("count %d", q.Count)
	}
	_, rb, err := d.block(q)
	if err != nil {
		return result{}, err
	}
	names := make([]string, q.Count)
	for i := range names {
		names[i] = fileName(q.File, i)
	}
	rng := rand.New(rand.NewPCG(q.Seed, 13))
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	r, err := measure(q, func(i int) error {
		f, err := d.t.OpenFile(names[i%len(names)], os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		n, err := f.ReadAt(rb, 0)
		if n == len(rb) && errors.Is(err, io.EOF) {
			err = nil // the read ends at the end of the file
		}
		if err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
	if err != nil {
		return r, err
	}
	r.Bytes = int64(r.Ops) * int64(q.Block)
	w := d.wbuf[:q.Block]
	restamp(w, 0)
	if !bytes.Equal(rb, w) {
		return r, errors.New("the last file read does not hold the bytes written to it")
	}
	return r, nil
}

// statFile stats File over and over, then checks that the size it reports
// is Size: on the stat row, what the process holding the file open wrote.
func (d *driver) statFile(q request) (result, error) {
	r, err := measure(q, func(int) error {
		_, err := d.t.Stat(q.File)
		return err
	})
	if err != nil {
		return r, err
	}
	fi, err := d.t.Stat(q.File)
	if err != nil {
		return r, err
	}
	if fi.Size() != q.Size {
		return r, fmt.Errorf("stat of %s reports %d bytes, want the %d the other process wrote", q.File, fi.Size(), q.Size)
	}
	return r, nil
}

// writeOnce writes Block bytes at offset 0 of the open File, once, stamped
// with q.Seed, and measures it.
func (d *driver) writeOnce(q request) (result, error) {
	f := d.files[q.File]
	if f == nil {
		return result{}, fmt.Errorf("%s is not open", q.File)
	}
	if q.Block <= 0 || q.Block > maxBlock {
		return result{}, fmt.Errorf("block size %d: want 1 to %d", q.Block, maxBlock)
	}
	w := d.wbuf[:q.Block]
	restamp(w, int64(q.Seed))
	q.MaxOps, q.Window, q.Warmup = 1, 0, 0
	return measure(q, func(int) error {
		_, err := f.WriteAt(w, 0)
		return err
	})
}

// fsTestErrLines bounds the lines of a failed TestFS's error kept in the
// result (it lists every misbehaviour it found, which may be thousands).
const fsTestErrLines = 20

// fsTest runs fstest.TestFS on the tree mkTree made under File (Count
// files), expecting its first, middle and last files; each run is one op.
func (d *driver) fsTest(q request) (result, error) {
	if q.Count <= 0 {
		return result{}, fmt.Errorf("count %d", q.Count)
	}
	fsys, err := d.t.FS(q.File)
	if err != nil {
		return result{}, err
	}
	want := []string{treeName(0), treeName(q.Count / 2), treeName(q.Count - 1)}
	r, err := measure(q, func(int) error { return fstest.TestFS(fsys, want...) })
	if err != nil {
		lines := strings.Split(err.Error(), "\n")
		if len(lines) > fsTestErrLines {
			lines = append(lines[:fsTestErrLines], fmt.Sprintf("(and %d more lines)", len(lines)-fsTestErrLines))
		}
		return r, errors.New(strings.Join(lines, "\n"))
	}
	return r, nil
}

// cpuSample is the CPU time of the driver, of the services and of the
// machine at one moment.
type cpuSample struct {
	client, services time.Duration
	machine          benchutil.MachineCPU
}

func sampleCPU(services []int) (s cpuSample, err error) {
	if s.client, err = benchutil.ProcCPU(os.Getpid()); err != nil {
		return s, err
	}
	for _, pid := range services {
		c, err := benchutil.ProcCPU(pid)
		if err != nil {
			return s, fmt.Errorf("service: %w", err)
		}
		s.services += c
	}
	s.machine, err = benchutil.ReadMachineCPU()
	return s, err
}

// measure runs op for q.Warmup uncounted, then times each op until
// q.Window has passed or q.MaxOps ops ran (whichever comes first; a zero
// one does not limit). The first error ends the run.
func measure(q request, op func(i int) error) (result, error) {
	var r result
	if q.Window <= 0 && q.MaxOps <= 0 {
		return r, errors.New("neither a window nor an op count")
	}
	if q.Warmup > 0 {
		end := time.Now().Add(q.Warmup)
		for i := 0; time.Now().Before(end); i++ {
			if err := op(i); err != nil {
				return r, fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	h := new(benchutil.Histogram)
	cpu0, err := sampleCPU(q.Services)
	if err != nil {
		return r, err
	}
	start := time.Now()
	deadline := start.Add(q.Window)
	now := start
	n := 0
	for (q.MaxOps <= 0 || n < q.MaxOps) && (q.Window <= 0 || now.Before(deadline)) {
		t0 := time.Now()
		if err := op(n); err != nil {
			return r, fmt.Errorf("op %d: %w", n, err)
		}
		now = time.Now()
		h.Record(int64(now.Sub(t0)))
		n++
	}
	r.Elapsed = time.Since(start)
	cpu1, err := sampleCPU(q.Services)
	if err != nil {
		return r, err
	}
	r.Ops = h.Count()
	r.P50us, r.P99us, r.P999us = h.QuantileUs(0.50), h.QuantileUs(0.99), h.QuantileUs(0.999)
	r.MeanUs, r.MaxUs = h.Mean()/1e3, float64(h.Max())/1e3
	r.CDF = h.CDF()
	r.ClientCPU = cpu1.client - cpu0.client
	r.ServiceCPU = cpu1.services - cpu0.services
	r.OtherCPU = (cpu1.machine.Busy - cpu0.machine.Busy) - r.ClientCPU - r.ServiceCPU +
		(cpu1.machine.Steal - cpu0.machine.Steal)
	return r, nil
}
