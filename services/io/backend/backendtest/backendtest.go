// Package backendtest is the conformance suite for backend.Backend: every
// backend (mem, file, faulty, and later SPDK) runs Run unchanged.
//
// The random tests are seeded. Run logs its seed; replay a failure with
//
//	go test ./services/io/backend/file -run 'TestConformance/tempdir/RandomModel' -args -backendtest.seed=N
//
// or WEIR_BACKENDTEST_SEED=N in the environment (the flag wins).
package backendtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
)

var seedFlag = flag.Uint64("backendtest.seed", 0, "seed of the backend conformance suite's random tests (0: pick one; see also WEIR_BACKENDTEST_SEED)")

// SeedEnv is the environment variable that replays a seed when the
// -backendtest.seed flag is not given.
const SeedEnv = "WEIR_BACKENDTEST_SEED"

// Factory makes the backends under test.
type Factory struct {
	// New returns a fresh, empty backend. The suite closes it at the end of
	// the test (ignoring EBADF if the test closed it already).
	New func(t *testing.T) backend.Backend
	// Reopen closes old and opens the same storage again; nil for
	// backends that keep nothing across Close, which skips the
	// persistence tests.
	Reopen func(t *testing.T, old backend.Backend) backend.Backend
}

// Run runs the conformance suite against backends made by f, each check in
// its own subtest with its own fresh backend.
func Run(t *testing.T, f Factory) {
	seed := pickSeed(t)
	s := &suite{f: f, seed: seed}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"Name", s.testName},
		{"CreateOpenDelete", s.testCreateOpenDelete},
		{"UseAfterClose", s.testUseAfterClose},
		{"ClosedBackend", s.testClosedBackend},
		{"SharedHandles", s.testSharedHandles},
		{"Holes", s.testHoles},
		{"EOF", s.testEOF},
		{"Arguments", s.testArguments},
		{"RandomModel", s.testRandomModel},
		{"Beyond4GiB", s.testBeyond4GiB},
		{"Truncate", s.testTruncate},
		{"ConcurrentStripesPresized", func(t *testing.T) { s.testConcurrentStripes(t, true) }},
		{"ConcurrentStripesGrowing", func(t *testing.T) { s.testConcurrentStripes(t, false) }},
		{"ConcurrentAppends", s.testConcurrentAppends},
		{"List", s.testList},
		{"Sync", s.testSync},
		{"Persistence", s.testPersistence},
		{"Identity", s.testIdentity},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

// pickSeed returns the seed from the flag, the environment or chance, and
// logs how to replay it.
func pickSeed(t *testing.T) uint64 {
	seed := *seedFlag
	if seed == 0 {
		if env := os.Getenv(SeedEnv); env != "" {
			v, err := strconv.ParseUint(env, 0, 64)
			if err != nil {
				t.Fatalf("%s=%q: %v", SeedEnv, env, err)
			}
			seed = v
		}
	}
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	t.Logf("backendtest seed %d (replay: -args -backendtest.seed=%d, or %s=%d)", seed, seed, SeedEnv, seed)
	return seed
}

type suite struct {
	f    Factory
	seed uint64
}

// newBackend returns a fresh backend closed at the end of t.
func (s *suite) newBackend(t *testing.T) backend.Backend {
	t.Helper()
	be := s.f.New(t)
	t.Cleanup(func() { be.Close() })
	return be
}

// reopen closes be and opens its storage again, closed at the end of t.
func (s *suite) reopen(t *testing.T, be backend.Backend) backend.Backend {
	t.Helper()
	nb := s.f.Reopen(t, be)
	t.Cleanup(func() { nb.Close() })
	return nb
}

// rng is a seeded source of decisions and of bulk random bytes.
type rng struct {
	*rand.Rand
	src *rand.ChaCha8
}

// rngFor derives the stream of one test from the suite seed and a label,
// so each test replays on its own.
func (s *suite) rngFor(label string) *rng {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:8], s.seed)
	h := fnv.New64a()
	h.Write([]byte(label))
	binary.LittleEndian.PutUint64(key[8:16], h.Sum64())
	src := rand.NewChaCha8(key)
	return &rng{Rand: rand.New(src), src: src}
}

func (r *rng) bytes(n int) []byte {
	p := make([]byte, n)
	r.src.Read(p)
	return p
}

// create makes blob id and opens it; the handle closes at the end of t.
func create(t *testing.T, be backend.Backend, id backend.BlobID) backend.Blob {
	t.Helper()
	if err := be.Create(id); err != nil {
		t.Fatalf("Create(%d): %v", id, err)
	}
	return open(t, be, id)
}

func open(t *testing.T, be backend.Backend, id backend.BlobID) backend.Blob {
	t.Helper()
	b, err := be.Open(id)
	if err != nil {
		t.Fatalf("Open(%d): %v", id, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func wantErrno(t *testing.T, err error, want syscall.Errno, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %s (%v)", what, err, errnoName(want), want)
	}
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.EFBIG:
		return "EFBIG"
	case syscall.EEXIST:
		return "EEXIST"
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EBUSY:
		return "EBUSY"
	case syscall.EBADF:
		return "EBADF"
	case syscall.EIO:
		return "EIO"
	}
	return fmt.Sprintf("errno %d", int(e))
}

func mustWrite(t *testing.T, b backend.Blob, p []byte, off int64) {
	t.Helper()
	n, err := b.WriteAt(p, off)
	if err != nil || n != len(p) {
		t.Fatalf("blob %d: WriteAt(%d bytes, %d) = %d, %v", b.ID(), len(p), off, n, err)
	}
}

func mustTruncate(t *testing.T, b backend.Blob, size int64) {
	t.Helper()
	if err := b.Truncate(size); err != nil {
		t.Fatalf("blob %d: Truncate(%d): %v", b.ID(), size, err)
	}
}

// checkRead reads len(want) bytes at off and wants exactly want back, with
// io.EOF only when wantEOF.
func checkRead(t *testing.T, b backend.Blob, off int64, want []byte, wantEOF bool, n int) {
	t.Helper()
	p := make([]byte, n)
	got, err := b.ReadAt(p, off)
	switch {
	case wantEOF && err != io.EOF:
		t.Fatalf("blob %d: ReadAt(%d bytes, %d): error %v, want io.EOF", b.ID(), n, off, err)
	case !wantEOF && err != nil:
		t.Fatalf("blob %d: ReadAt(%d bytes, %d): %v", b.ID(), n, off, err)
	case got != len(want):
		t.Fatalf("blob %d: ReadAt(%d bytes, %d) = %d bytes, want %d", b.ID(), n, off, got, len(want))
	}
	if i := firstDiff(p[:got], want); i >= 0 {
		t.Fatalf("blob %d: ReadAt(%d bytes, %d): byte at offset %d is %#02x, want %#02x",
			b.ID(), n, off, off+int64(i), p[i], want[i])
	}
}

// checkContent reads the whole blob and compares it with want.
func checkContent(t *testing.T, b backend.Blob, want []byte) {
	t.Helper()
	if got := b.Size(); got != int64(len(want)) {
		t.Fatalf("blob %d: Size() = %d, want %d", b.ID(), got, len(want))
	}
	checkRead(t, b, 0, want, true, len(want)+1)
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func (s *suite) testName(t *testing.T) {
	if name := s.newBackend(t).Name(); name == "" {
		t.Error("Name() is empty")
	}
}

func (s *suite) testCreateOpenDelete(t *testing.T) {
	be := s.newBackend(t)
	wantErrno(t, be.Create(0), syscall.EINVAL, "Create(0)")
	_, err := be.Open(0)
	wantErrno(t, err, syscall.EINVAL, "Open(0)")
	wantErrno(t, be.Delete(0), syscall.EINVAL, "Delete(0)")

	if err := be.Create(1); err != nil {
		t.Fatalf("Create(1): %v", err)
	}
	wantErrno(t, be.Create(1), syscall.EEXIST, "second Create(1)")
	_, err = be.Open(2)
	wantErrno(t, err, syscall.ENOENT, "Open(2) of a missing blob")
	wantErrno(t, be.Delete(2), syscall.ENOENT, "Delete(2) of a missing blob")

	h1, err := be.Open(1)
	if err != nil {
		t.Fatalf("Open(1): %v", err)
	}
	if h1.ID() != 1 || h1.Size() != 0 {
		t.Fatalf("new blob: ID() = %d, Size() = %d; want 1, 0", h1.ID(), h1.Size())
	}
	h2, err := be.Open(1)
	if err != nil {
		t.Fatalf("second Open(1): %v", err)
	}
	wantErrno(t, be.Delete(1), syscall.EBUSY, "Delete(1) with two handles open")
	wantErrno(t, be.Create(1), syscall.EEXIST, "Create(1) while open")
	if err := h1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wantErrno(t, be.Delete(1), syscall.EBUSY, "Delete(1) with one handle open")
	if err := h2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := be.Delete(1); err != nil {
		t.Fatalf("Delete(1) after closing its handles: %v", err)
	}
	_, err = be.Open(1)
	wantErrno(t, err, syscall.ENOENT, "Open(1) after Delete")
	wantErrno(t, be.Delete(1), syscall.ENOENT, "second Delete(1)")

	// The id is free again, and the new blob starts empty.
	h := create(t, be, 1)
	if h.Size() != 0 {
		t.Fatalf("re-created blob: Size() = %d, want 0", h.Size())
	}
}

func (s *suite) testUseAfterClose(t *testing.T) {
	be := s.newBackend(t)
	h := create(t, be, 7)
	mustWrite(t, h, []byte("hello"), 0)
	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p := make([]byte, 5)
	_, err := h.ReadAt(p, 0)
	wantErrno(t, err, syscall.EBADF, "ReadAt after Close")
	_, err = h.WriteAt(p, 0)
	wantErrno(t, err, syscall.EBADF, "WriteAt after Close")
	wantErrno(t, h.Truncate(0), syscall.EBADF, "Truncate after Close")
	wantErrno(t, h.Sync(), syscall.EBADF, "Sync after Close")
	wantErrno(t, h.Close(), syscall.EBADF, "second Close")
	// Closing one handle leaves the blob alone.
	h2 := open(t, be, 7)
	checkContent(t, h2, []byte("hello"))
}

func (s *suite) testClosedBackend(t *testing.T) {
	be := s.newBackend(t)
	h := create(t, be, 3)
	mustWrite(t, h, []byte("data"), 0)
	if err := be.Create(4); err != nil {
		t.Fatalf("Create(4): %v", err)
	}
	if err := be.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wantErrno(t, be.Create(5), syscall.EBADF, "Create after Close")
	_, err := be.Open(4)
	wantErrno(t, err, syscall.EBADF, "Open after Close")
	wantErrno(t, be.Delete(4), syscall.EBADF, "Delete after Close")
	_, err = be.List()
	wantErrno(t, err, syscall.EBADF, "List after Close")
	wantErrno(t, be.Sync(), syscall.EBADF, "Sync after Close")
	wantErrno(t, be.Close(), syscall.EBADF, "second Close")

	p := make([]byte, 4)
	_, err = h.ReadAt(p, 0)
	wantErrno(t, err, syscall.EBADF, "ReadAt on a handle of a closed backend")
	_, err = h.WriteAt(p, 0)
	wantErrno(t, err, syscall.EBADF, "WriteAt on a handle of a closed backend")
	wantErrno(t, h.Truncate(1), syscall.EBADF, "Truncate on a handle of a closed backend")
	wantErrno(t, h.Sync(), syscall.EBADF, "Sync on a handle of a closed backend")
}

func (s *suite) testSharedHandles(t *testing.T) {
	be := s.newBackend(t)
	r := s.rngFor("SharedHandles")
	h1 := create(t, be, 9)
	h2 := open(t, be, 9)
	data := r.bytes(10000)
	mustWrite(t, h1, data, 0)
	checkContent(t, h2, data)
	mustTruncate(t, h2, 5000)
	checkContent(t, h1, data[:5000])
	mustWrite(t, h2, data[:10], 4999)
	checkContent(t, h1, append(slices.Clone(data[:4999]), data[:10]...))
}

func (s *suite) testHoles(t *testing.T) {
	be := s.newBackend(t)
	h := create(t, be, 1)
	checkRead(t, h, 0, nil, true, 10)

	mustWrite(t, h, []byte{1, 2, 3}, 100000)
	want := make([]byte, 100003)
	copy(want[100000:], []byte{1, 2, 3})
	checkContent(t, h, want)

	// A hole between two writes in the same and in other blocks.
	mustWrite(t, h, []byte{9}, 5)
	want[5] = 9
	mustWrite(t, h, []byte{8}, 4095)
	want[4095] = 8
	checkContent(t, h, want)

	// Growing by Truncate makes a hole too.
	h2 := create(t, be, 2)
	mustTruncate(t, h2, 50001)
	checkContent(t, h2, make([]byte, 50001))
}

func (s *suite) testEOF(t *testing.T) {
	be := s.newBackend(t)
	r := s.rngFor("EOF")
	h := create(t, be, 1)
	data := r.bytes(10000)
	mustWrite(t, h, data, 0)

	checkRead(t, h, 9950, data[9950:], true, 100)    // crosses the end
	checkRead(t, h, 9900, data[9900:], false, 100)   // ends exactly at the end
	checkRead(t, h, 10000, nil, true, 1)             // at the end
	checkRead(t, h, 10001, nil, true, 100)           // past the end
	checkRead(t, h, 1<<40, nil, true, 100)           // far past the end
	checkRead(t, h, 0, data, true, 1<<20)            // buffer larger than the blob
	checkRead(t, h, 8191, data[8191:8192], false, 1) // one byte
	if n, err := h.ReadAt(nil, 0); n != 0 || err != nil {
		t.Errorf("ReadAt(empty, 0) = %d, %v; want 0, nil", n, err)
	}
	if n, err := h.WriteAt(nil, 20000); n != 0 || err != nil || h.Size() != 10000 {
		t.Errorf("WriteAt(empty, 20000) = %d, %v, Size %d; want 0, nil, 10000", n, err, h.Size())
	}
}

func (s *suite) testArguments(t *testing.T) {
	be := s.newBackend(t)
	h := create(t, be, 1)
	mustWrite(t, h, []byte("abc"), 0)
	p := make([]byte, 10)
	limit := backend.MaxBlobSize

	_, err := h.ReadAt(p, -1)
	wantErrno(t, err, syscall.EINVAL, "ReadAt(off -1)")
	_, err = h.WriteAt(p, -1)
	wantErrno(t, err, syscall.EINVAL, "WriteAt(off -1)")
	_, err = h.WriteAt(p, math.MinInt64)
	wantErrno(t, err, syscall.EINVAL, "WriteAt(off MinInt64)")
	wantErrno(t, h.Truncate(-1), syscall.EINVAL, "Truncate(-1)")

	_, err = h.WriteAt(p[:1], limit)
	wantErrno(t, err, syscall.EFBIG, "WriteAt(1 byte at MaxBlobSize)")
	_, err = h.WriteAt(p[:2], limit-1)
	wantErrno(t, err, syscall.EFBIG, "WriteAt(2 bytes at MaxBlobSize-1)")
	_, err = h.WriteAt(p, math.MaxInt64-5)
	wantErrno(t, err, syscall.EFBIG, "WriteAt(off+len overflows)")
	_, err = h.WriteAt(p, math.MaxInt64)
	wantErrno(t, err, syscall.EFBIG, "WriteAt(off MaxInt64)")
	_, err = h.ReadAt(p, math.MaxInt64-5)
	wantErrno(t, err, syscall.EFBIG, "ReadAt(off+len overflows)")
	_, err = h.ReadAt(p, limit)
	wantErrno(t, err, syscall.EFBIG, "ReadAt(10 bytes at MaxBlobSize)")
	wantErrno(t, h.Truncate(limit+1), syscall.EFBIG, "Truncate(MaxBlobSize+1)")
	wantErrno(t, h.Truncate(math.MaxInt64), syscall.EFBIG, "Truncate(MaxInt64)")

	// Refused calls change nothing.
	checkContent(t, h, []byte("abc"))
}

// testRandomModel compares random unaligned writes, reads and truncates
// with an in-memory model.
func (s *suite) testRandomModel(t *testing.T) {
	be := s.newBackend(t)
	r := s.rngFor("RandomModel")
	t.Logf("seed %d", s.seed)
	const (
		id     = 42
		span   = 3 << 20 // offsets fall in [0, span)
		ops    = 400
		maxLen = 300 << 10
	)
	h := create(t, be, id)
	var model []byte // the blob as it should be; len(model) is its size

	randLen := func() int {
		switch r.IntN(4) {
		case 0:
			return 1 + r.IntN(64)
		case 1:
			return 1 + r.IntN(8192)
		case 2:
			return 4096 * (1 + r.IntN(16)) // whole blocks
		default:
			return 1 + r.IntN(maxLen)
		}
	}
	randOff := func() int64 {
		switch r.IntN(4) {
		case 0:
			return int64(r.IntN(span/4096)) * 4096
		case 1:
			return max(0, int64(len(model)-r.IntN(8192))) // near the end
		default:
			return int64(r.IntN(span))
		}
	}
	for i := range ops {
		switch k := r.IntN(100); {
		case k < 55:
			p, off := r.bytes(randLen()), randOff()
			n, err := h.WriteAt(p, off)
			if err != nil || n != len(p) {
				t.Fatalf("op %d: WriteAt(%d bytes, %d) = %d, %v", i, len(p), off, n, err)
			}
			if end := int(off) + len(p); end > len(model) {
				model = append(model, make([]byte, end-len(model))...)
			}
			copy(model[off:], p)
		case k < 88:
			n, off := randLen(), randOff()
			var want []byte
			if int(off) < len(model) {
				want = model[off:min(len(model), int(off)+n)]
			}
			checkRead(t, h, off, want, len(want) < n, n)
		case k < 93:
			size := int64(r.IntN(span + span/4))
			mustTruncate(t, h, size)
			if int(size) <= len(model) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, int(size)-len(model))...)
			}
		case k < 96:
			checkContent(t, h, model)
		default:
			// A new handle must see the same blob.
			if err := h.Close(); err != nil {
				t.Fatalf("op %d: Close: %v", i, err)
			}
			h = open(t, be, id)
		}
		if h.Size() != int64(len(model)) {
			t.Fatalf("op %d: Size() = %d, want %d", i, h.Size(), len(model))
		}
	}
	checkContent(t, h, model)
}

func (s *suite) testBeyond4GiB(t *testing.T) {
	be := s.newBackend(t)
	r := s.rngFor("Beyond4GiB")
	const at = 5 << 30
	h := create(t, be, 1)
	data := r.bytes(10)
	mustWrite(t, h, data, at)
	if got := h.Size(); got != at+10 {
		t.Fatalf("Size() = %d, want %d", got, int64(at+10))
	}
	checkRead(t, h, at, data, true, 100)
	zeros := make([]byte, 64<<10)
	checkRead(t, h, at-int64(len(zeros)), zeros, false, len(zeros))
	checkRead(t, h, 0, zeros, false, len(zeros))
	checkRead(t, h, 1<<32-100, zeros[:200], false, 200)

	// An unaligned write across the 4 GiB line.
	span := r.bytes(10001)
	mustWrite(t, h, span, 1<<32-5003)
	checkRead(t, h, 1<<32-5003, span, false, len(span))
	checkRead(t, h, 1<<32-5003-100, zeros[:100], false, 100)
	h2 := open(t, be, 1)
	checkRead(t, h2, 1<<32-5003, span, false, len(span))
	checkRead(t, h2, at-5, append(make([]byte, 5), data...), true, 20)

	mustTruncate(t, h, at+5)
	checkRead(t, h, at, data[:5], true, 10)
}

func (s *suite) testTruncate(t *testing.T) {
	be := s.newBackend(t)
	r := s.rngFor("Truncate")
	h := create(t, be, 1)
	data := r.bytes(10000)
	mustWrite(t, h, data, 0)

	mustTruncate(t, h, 5000)
	checkContent(t, h, data[:5000])
	mustTruncate(t, h, 12000)
	want := append(slices.Clone(data[:5000]), make([]byte, 7000)...)
	checkContent(t, h, want)

	// Shrinking inside a block then growing must not bring old bytes back.
	ff := bytes.Repeat([]byte{0xff}, 8192)
	mustWrite(t, h, ff, 0)
	mustTruncate(t, h, 4100)
	mustTruncate(t, h, 8192)
	checkContent(t, h, append(slices.Clone(ff[:4100]), make([]byte, 8192-4100)...))

	// A write past the end after a shrink leaves zeros between.
	mustTruncate(t, h, 10)
	mustWrite(t, h, []byte{7}, 20000)
	want = make([]byte, 20001)
	copy(want, ff[:10])
	want[20000] = 7
	checkContent(t, h, want)

	mustTruncate(t, h, 0)
	checkContent(t, h, nil)
	mustTruncate(t, h, 0)
	checkContent(t, h, nil)
}

// testConcurrentStripes runs 8 writers over interleaved 1000-byte stripes,
// so neighbouring stripes of different writers share 4 KiB blocks, then
// checks every byte. presized first sets the size so no write extends the
// blob; otherwise the writes grow it while Size is watched.
func (s *suite) testConcurrentStripes(t *testing.T, presized bool) {
	be := s.newBackend(t)
	const (
		writers = 8
		stripe  = 1000
		per     = 64 // stripes per writer
		total   = writers * per * stripe
		rounds  = 3
	)
	h := create(t, be, 1)
	r := s.rngFor(fmt.Sprintf("ConcurrentStripes/%v", presized))
	if presized {
		mustTruncate(t, h, total)
	}
	for round := range rounds {
		if !presized {
			mustTruncate(t, h, 0)
		}
		want := r.bytes(total)
		orders := make([][]int, writers)
		for w := range writers {
			orders[w] = r.Perm(per)
		}
		var (
			wg      sync.WaitGroup
			done    atomic.Bool
			monitor = make(chan error, 1)
			errs    = make(chan error, writers)
		)
		go func() { monitor <- watchSize(h, &done) }()
		for w := range writers {
			wg.Go(func() {
				bl := h
				if w%2 == 1 { // half the writers use their own handle
					var err error
					if bl, err = be.Open(1); err != nil {
						errs <- err
						return
					}
					defer bl.Close()
				}
				for _, k := range orders[w] {
					off := (k*writers + w) * stripe
					if n, err := bl.WriteAt(want[off:off+stripe], int64(off)); err != nil || n != stripe {
						errs <- fmt.Errorf("writer %d: WriteAt(%d, %d) = %d, %v", w, stripe, off, n, err)
						return
					}
				}
			})
		}
		wg.Wait()
		done.Store(true)
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := <-monitor; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		checkContent(t, h, want)
	}
}

// watchSize polls b.Size until done is set and reports a size that went
// down: with only writes under way, it never may.
func watchSize(b backend.Blob, done *atomic.Bool) error {
	last := b.Size()
	for !done.Load() {
		cur := b.Size()
		if cur < last {
			return fmt.Errorf("Size() went from %d down to %d during writes", last, cur)
		}
		last = cur
	}
	return nil
}

// testConcurrentAppends has writers reserve ranges at the end with an
// atomic counter and write them; no byte may be lost and the size ends at
// the last reserved byte.
func (s *suite) testConcurrentAppends(t *testing.T) {
	be := s.newBackend(t)
	const (
		writers = 8
		appends = 40
	)
	h := create(t, be, 1)
	type rec struct {
		off  int64
		data []byte
	}
	recs := make([][]rec, writers)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		done    atomic.Bool
		monitor = make(chan error, 1)
		errs    = make(chan error, writers)
	)
	rngs := make([]*rng, writers)
	for w := range writers {
		rngs[w] = s.rngFor(fmt.Sprintf("ConcurrentAppends/%d", w))
	}
	go func() { monitor <- watchSize(h, &done) }()
	for w := range writers {
		wg.Go(func() {
			r := rngs[w]
			for range appends {
				p := r.bytes(1 + r.IntN(20000))
				off := next.Add(int64(len(p))) - int64(len(p))
				if n, err := h.WriteAt(p, off); err != nil || n != len(p) {
					errs <- fmt.Errorf("writer %d: WriteAt(%d, %d) = %d, %v", w, len(p), off, n, err)
					return
				}
				recs[w] = append(recs[w], rec{off, p})
			}
		})
	}
	wg.Wait()
	done.Store(true)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := <-monitor; err != nil {
		t.Fatal(err)
	}
	want := make([]byte, next.Load())
	for _, rs := range recs {
		for _, r := range rs {
			copy(want[r.off:], r.data)
		}
	}
	checkContent(t, h, want)
}

func (s *suite) testList(t *testing.T) {
	be := s.newBackend(t)
	r := s.rngFor("List")
	ids := []backend.BlobID{1, 2, 255, 256, 257, 4096, 1 << 32, 1<<32 + 1, 1 << 63, 1<<63 + 255, math.MaxUint64}
	for _, i := range r.Perm(len(ids)) {
		if err := be.Create(ids[i]); err != nil {
			t.Fatalf("Create(%d): %v", ids[i], err)
		}
	}
	got, err := be.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("List() = %v, want %v", got, ids)
	}
	for _, id := range []backend.BlobID{256, 1 << 63} {
		if err := be.Delete(id); err != nil {
			t.Fatalf("Delete(%d): %v", id, err)
		}
	}
	ids = slices.DeleteFunc(ids, func(id backend.BlobID) bool { return id == 256 || id == 1<<63 })
	if got, err = be.List(); err != nil || !slices.Equal(got, ids) {
		t.Fatalf("List() after deletes = %v, %v; want %v", got, err, ids)
	}
	empty := s.newBackend(t)
	if got, err := empty.List(); err != nil || len(got) != 0 {
		t.Fatalf("List() of an empty backend = %v, %v; want none", got, err)
	}
}

func (s *suite) testSync(t *testing.T) {
	be := s.newBackend(t)
	r := s.rngFor("Sync")
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync of an empty backend: %v", err)
	}
	h := create(t, be, 1)
	for i := range 3 {
		if err := h.Sync(); err != nil {
			t.Fatalf("blob Sync %d: %v", i, err)
		}
		mustWrite(t, h, r.bytes(5000), int64(r.IntN(100000)))
		if err := h.Sync(); err != nil {
			t.Fatalf("blob Sync after write %d: %v", i, err)
		}
		mustWrite(t, h, r.bytes(100), 0) // no size change
		if err := h.Sync(); err != nil {
			t.Fatalf("blob Sync after overwrite %d: %v", i, err)
		}
		mustTruncate(t, h, int64(r.IntN(50000)))
		if err := h.Sync(); err != nil {
			t.Fatalf("blob Sync after truncate %d: %v", i, err)
		}
	}
	for id := backend.BlobID(2); id < 20; id++ {
		if err := be.Create(id); err != nil {
			t.Fatalf("Create(%d): %v", id, err)
		}
	}
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync after creates: %v", err)
	}
	for id := backend.BlobID(2); id < 20; id += 2 {
		if err := be.Delete(id); err != nil {
			t.Fatalf("Delete(%d): %v", id, err)
		}
	}
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync after deletes: %v", err)
	}
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync with nothing to do: %v", err)
	}
}

// blobState is what the persistence test expects of one blob.
type blobState struct {
	size  int64
	parts map[int64][]byte // offset -> bytes; everything else reads zeros
}

func (s *suite) testPersistence(t *testing.T) {
	if s.f.Reopen == nil {
		t.Skip("backend keeps nothing across Close (Factory.Reopen is nil)")
	}
	r := s.rngFor("Persistence")
	be := s.newBackend(t)
	state := map[backend.BlobID]*blobState{}
	write := func(be backend.Backend, id backend.BlobID, create bool, do func(b backend.Blob, st *blobState)) {
		t.Helper()
		if create {
			if err := be.Create(id); err != nil {
				t.Fatalf("Create(%d): %v", id, err)
			}
			state[id] = &blobState{parts: map[int64][]byte{}}
		}
		b, err := be.Open(id)
		if err != nil {
			t.Fatalf("Open(%d): %v", id, err)
		}
		do(b, state[id])
		if err := b.Sync(); err != nil {
			t.Fatalf("blob %d: Sync: %v", id, err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("blob %d: Close: %v", id, err)
		}
	}
	put := func(b backend.Blob, st *blobState, p []byte, off int64) {
		mustWrite(t, b, p, off)
		st.parts[off] = p
		st.size = max(st.size, off+int64(len(p)))
	}

	write(be, 1, true, func(b backend.Blob, st *blobState) { put(b, st, r.bytes(10000), 0) })
	write(be, 2, true, func(b backend.Blob, st *blobState) { put(b, st, r.bytes(10), 5<<30) })
	write(be, 3, true, func(b backend.Blob, st *blobState) {})
	write(be, 4, true, func(b backend.Blob, st *blobState) {
		p := r.bytes(9000)
		mustWrite(t, b, p, 0)
		mustTruncate(t, b, 4097)
		st.parts[0], st.size = p[:4097], 4097
	})
	write(be, 5, true, func(b backend.Blob, st *blobState) { put(b, st, r.bytes(100), 77) })
	write(be, 6, true, func(b backend.Blob, st *blobState) {
		put(b, st, r.bytes(100), 0)
		mustTruncate(t, b, 123457)
		st.size = 123457
	})
	write(be, 1<<40+3, true, func(b backend.Blob, st *blobState) { put(b, st, r.bytes(5), 4093) })
	if err := be.Delete(5); err != nil {
		t.Fatalf("Delete(5): %v", err)
	}
	delete(state, 5)
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	be = s.reopen(t, be)
	checkState(t, be, state)

	// A second generation: change the reopened storage and reopen again.
	write(be, 3, false, func(b backend.Blob, st *blobState) { put(b, st, r.bytes(3000), 1) })
	write(be, 7, true, func(b backend.Blob, st *blobState) { put(b, st, r.bytes(1), 0) })
	if err := be.Delete(1); err != nil {
		t.Fatalf("Delete(1): %v", err)
	}
	delete(state, 1)
	if err := be.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	be = s.reopen(t, be)
	checkState(t, be, state)
}

// checkState compares be's blobs, sizes and contents with state.
// testIdentity: a new store has no identity; SetIdentity records one,
// which Identity returns, again after a reopen (a backend that keeps
// blobs across Reopen keeps it too); setting the same identity again is a
// no-op, another one EEXIST; blobs do not see it (List).
func (s *suite) testIdentity(t *testing.T) {
	be := s.newBackend(t)
	if _, ok, err := be.Identity(); err != nil || ok {
		t.Fatalf("a new store: Identity() = ok %v, %v; want none", ok, err)
	}
	id := backend.Identity{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	other := id
	other[15]++
	if err := be.SetIdentity(id); err != nil {
		t.Fatal(err)
	}
	create(t, be, 7).Close()
	for round := range 2 {
		if got, ok, err := be.Identity(); err != nil || !ok || got != id {
			t.Fatalf("round %d: Identity() = %v %v %v, want %v", round, got, ok, err, id)
		}
		if err := be.SetIdentity(id); err != nil {
			t.Errorf("round %d: SetIdentity of the same identity: %v", round, err)
		}
		wantErrno(t, be.SetIdentity(other), syscall.EEXIST, "SetIdentity of another identity")
		if ids, err := be.List(); err != nil || len(ids) != 1 || ids[0] != 7 {
			t.Errorf("round %d: List() = %v, %v; want [7]", round, ids, err)
		}
		if s.f.Reopen == nil {
			break
		}
		be = s.reopen(t, be)
		if ids, _ := be.List(); len(ids) == 0 {
			break // this backend keeps nothing across Reopen
		}
	}
}

func checkState(t *testing.T, be backend.Backend, state map[backend.BlobID]*blobState) {
	t.Helper()
	ids, err := be.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	want := make([]backend.BlobID, 0, len(state))
	for id := range state {
		want = append(want, id)
	}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("List() after reopen = %v, want %v", ids, want)
	}
	for _, id := range ids {
		checkBlob(t, be, id, state[id])
	}
}

// checkBlob compares blob id with st, through a handle it closes again.
func checkBlob(t *testing.T, be backend.Backend, id backend.BlobID, st *blobState) {
	t.Helper()
	b, err := be.Open(id)
	if err != nil {
		t.Fatalf("Open(%d) after reopen: %v", id, err)
	}
	defer b.Close()
	if b.Size() != st.size {
		t.Fatalf("blob %d: Size() after reopen = %d, want %d", id, b.Size(), st.size)
	}
	if st.size <= 1<<20 {
		want := make([]byte, st.size)
		for off, p := range st.parts {
			copy(want[off:], p)
		}
		checkContent(t, b, want)
		return
	}
	for off, p := range st.parts { // sparse: look around each part
		lo := max(0, off-4096)
		hi := min(st.size, off+int64(len(p))+4096)
		want := make([]byte, hi-lo)
		copy(want[off-lo:], p)
		checkRead(t, b, lo, want, false, int(hi-lo))
	}
}
