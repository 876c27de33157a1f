package iosvc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/ring"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/mem"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

const hugePage = 2 << 20

// regBackend is the mem backend with memory registration. It records every
// registration and checks what SPDK relies on: an unregistered region is
// still mapped, only registered memory is unregistered, and no payload
// moves through a region after it was unregistered. With huge set it wants
// huge pages and, like spdk_mem_register, refuses memory that is not 2 MiB
// aligned and sized.
type regBackend struct {
	backend.Backend
	huge          bool
	registerErr   error // returned by every RegisterMem
	unregisterErr error // returned by every UnregisterMem, after unregistering

	mu           sync.Mutex
	registered   [][]byte // every successful RegisterMem, in order
	unregistered [][]byte // every UnregisterMem of registered memory, in order
	refused      int      // RegisterMem calls that failed
	live         [][]byte // registered and not yet unregistered
	zeroCopy     int      // payload buffers inside registered memory
	bounced      int      // payload buffers outside it
	problems     []string
	unregCh      chan []byte // gets each unregistered slice
}

var _ backend.MemRegistrar = (*regBackend)(nil)

func newRegBackend(huge bool) *regBackend {
	return &regBackend{Backend: mem.New(), huge: huge, unregCh: make(chan []byte, 16)}
}

func (b *regBackend) problem(format string, a ...any) {
	b.problems = append(b.problems, fmt.Sprintf(format, a...))
}

func (b *regBackend) HugePages() bool { return b.huge }

func (b *regBackend) RegisterMem(m []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := mappedRegion(m); err != nil {
		b.problem("RegisterMem: %v", err)
	}
	err := b.registerErr
	if start, _ := span(m); err == nil && b.huge && (start%hugePage != 0 || len(m)%hugePage != 0) {
		err = fmt.Errorf("register %d bytes at %#x: not 2 MiB aligned and sized: %w", len(m), start, syscall.EINVAL)
	}
	if err != nil {
		b.refused++
		return err
	}
	b.registered = append(b.registered, m)
	b.live = append(b.live, m)
	return nil
}

func (b *regBackend) UnregisterMem(m []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Reading the region here would fault if it were unmapped already. The
	// pause gives a service that unmaps it behind the session's back (a
	// Shutdown closing rather than stopping sessions) time to show; a
	// correct one cannot fail for it.
	time.Sleep(10 * time.Millisecond)
	if err := mappedRegion(m); err != nil {
		b.problem("UnregisterMem: %v", err)
	}
	i := 0
	for i < len(b.live) && !sameSlice(b.live[i], m) {
		i++
	}
	if i == len(b.live) {
		b.problem("UnregisterMem of %d bytes that are not registered", len(m))
		return fmt.Errorf("unregister: %w", syscall.EINVAL)
	}
	b.live = append(b.live[:i], b.live[i+1:]...)
	b.unregistered = append(b.unregistered, m)
	b.unregCh <- m
	return b.unregisterErr
}

// payload records whether a request's buffer lies in registered memory, as
// SPDK's choice between DMA and a bounce buffer would.
func (b *regBackend) payload(op string, p []byte) {
	if len(p) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.live {
		if within(p, m) {
			b.zeroCopy++
			return
		}
	}
	for _, m := range b.unregistered {
		if within(p, m) {
			b.problem("%s of %d bytes in a region already unregistered", op, len(p))
		}
	}
	b.bounced++
}

func (b *regBackend) Open(id backend.BlobID) (backend.Blob, error) {
	bl, err := b.Backend.Open(id)
	if err != nil {
		return nil, err
	}
	if id == backend.StagingBlob {
		return bl, nil // the staging log writes from io's heap: not a session's payload
	}
	return checkedBlob{bl, b}, nil
}

type regState struct {
	registered, unregistered [][]byte
	refused, zeroCopy        int
	bounced                  int
	problems                 []string
}

func (b *regBackend) state() regState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return regState{registered: append([][]byte(nil), b.registered...),
		unregistered: append([][]byte(nil), b.unregistered...),
		refused:      b.refused, zeroCopy: b.zeroCopy, bounced: b.bounced,
		problems: append([]string(nil), b.problems...)}
}

// checkedBlob reports each payload buffer to its backend.
type checkedBlob struct {
	backend.Blob
	be *regBackend
}

func (c checkedBlob) ReadAt(p []byte, off int64) (int, error) {
	c.be.payload("read", p)
	return c.Blob.ReadAt(p, off)
}

func (c checkedBlob) WriteAt(p []byte, off int64) (int, error) {
	c.be.payload("write", p)
	return c.Blob.WriteAt(p, off)
}

// mappedRegion checks that all of m is mapped (msync fails with ENOMEM on a
// range with unmapped pages) and still starts with the ring's magic.
func mappedRegion(m []byte) error {
	if err := unix.Msync(m, unix.MS_ASYNC); err != nil {
		return fmt.Errorf("region of %d bytes not mapped: %w", len(m), err)
	}
	if got := binary.LittleEndian.Uint64(m); got != ring.Magic {
		return fmt.Errorf("region starts with %#x, not the ring magic", got)
	}
	return nil
}

// logLines keeps the service's log lines and passes them to t.Log.
type logLines struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	s := string(bytes.TrimRight(p, "\n"))
	l.t.Log(s)
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	return len(p), nil
}

// count returns how many lines contain every one of subs.
func (l *logLines) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// ioEnv is NATS, the metadata service and an IO service on be, in this
// process, as stack runs them.
type ioEnv struct {
	cfg  *config.Config
	st   *stack.Stack
	io   *iosvc.Service
	logs *logLines
}

// startIO runs the services; newRegion, when not nil, replaces how the IO
// service creates session regions. The page cache is off: these tests
// count what reaches the backend (cachedIO turns it on).
func startIO(t testing.TB, be backend.Backend, newRegion func(ring.Config) (*ring.Region, error)) *ioEnv {
	t.Helper()
	return startIOWith(t, be, newRegion, func(c *config.Config) { c.IO.CacheSize = 0 })
}

// startIOWith is startIO with the configuration changed by edit.
func startIOWith(t testing.TB, be backend.Backend, newRegion func(ring.Config) (*ring.Region, error), edit func(*config.Config)) *ioEnv {
	t.Helper()
	c := stacktest.Config(t, "")
	c.Ring.ArenaSize = 1 << 20 // with the queues, one 2 MiB huge page
	edit(c)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &logLines{t: t}
	log := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: logs})
	st, err := stack.StartWith(c, log, stack.Hooks{Backend: be, IOService: func(s *iosvc.Service) {
		if newRegion != nil {
			iosvc.SetNewRegion(s, newRegion)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &ioEnv{cfg: c, st: st, io: st.IO, logs: logs}
}

func (e *ioEnv) dial(t testing.TB) *client.FS {
	t.Helper()
	// No recovery: these tests stop the IO service under the client and
	// want its calls to fail, not to wait for a service that stays down.
	fsys, err := client.Dial(context.Background(), client.Options{
		MetadataSocket: e.cfg.Metadata.Socket, IOSocket: e.cfg.IO.Socket, RecoverTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

// regionSize is the size of a session region of e's ring configuration.
func (e *ioEnv) regionSize(t *testing.T, huge bool) int {
	t.Helper()
	cfg := stack.RingConfig(e.cfg)
	cfg.HugePages = huge
	g, err := ring.NewGeometry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return int(g.TotalSize)
}

func (e *ioEnv) counter(t *testing.T, name string) uint64 {
	t.Helper()
	v, ok := e.io.Snapshot()[name].(uint64)
	if !ok {
		t.Fatalf("no counter %q in %v", name, e.io.Snapshot())
	}
	return v
}

// waitSessions waits until the IO service has n sessions.
func (e *ioEnv) waitSessions(t *testing.T, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); e.io.Stats.Sessions.Load() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("IO service has %d sessions, want %d", e.io.Stats.Sessions.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// writeRead writes random bytes to a new file through fsys and reads them
// back.
func writeRead(t *testing.T, fsys *client.FS, name string) {
	t.Helper()
	f, err := fsys.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	if n, err := f.WriteAt(data, 4096); err != nil || n != len(data) {
		t.Fatalf("write %s: %d %v", name, n, err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 4096); err != nil || n != len(got) || !bytes.Equal(got, data) {
		t.Fatalf("read %s back: %d %v, same bytes %v", name, n, err, bytes.Equal(got, data))
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync %s: %v", name, err)
	}
}

func waitUnregistered(t *testing.T, be *regBackend) []byte {
	t.Helper()
	select {
	case m := <-be.unregCh:
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("region not unregistered; backend saw %+v", be.state())
		return nil
	}
}

func checkNoProblems(t *testing.T, st regState) {
	t.Helper()
	for _, p := range st.problems {
		t.Error(p)
	}
}

func checkCounters(t *testing.T, e *ioEnv, want map[string]uint64) {
	t.Helper()
	for name, v := range want {
		if got := e.counter(t, name); got != v {
			t.Errorf("%s = %d, want %d", name, got, v)
		}
	}
}

// A session registers its whole region when it starts, its payloads move
// through that memory, and it unregisters the same slice, still mapped,
// after the client has gone.
func TestSessionRegistersRegion(t *testing.T) {
	be := newRegBackend(false)
	e := startIO(t, be, nil)
	fsys := e.dial(t)
	writeRead(t, fsys, "f")
	st := be.state()
	if len(st.registered) != 1 || len(st.registered[0]) != e.regionSize(t, false) {
		t.Fatalf("registered %d regions (want 1 of %d bytes)", len(st.registered), e.regionSize(t, false))
	}
	if st.zeroCopy == 0 || st.bounced != 0 {
		t.Fatalf("%d payloads in registered memory, %d outside it; want all inside", st.zeroCopy, st.bounced)
	}
	fsys.Close()
	m := waitUnregistered(t, be)
	if !sameSlice(m, st.registered[0]) {
		t.Fatal("unregistered memory is not the registered region")
	}
	e.waitSessions(t, 0)
	st = be.state()
	if len(st.registered) != 1 || len(st.unregistered) != 1 {
		t.Fatalf("%d registrations, %d unregistrations; want 1 of each", len(st.registered), len(st.unregistered))
	}
	checkNoProblems(t, st)
	checkCounters(t, e, map[string]uint64{"mem_register_failures": 0, "mem_unregister_failures": 0,
		"ring_hugepage_fallbacks": 0})
}

// Shutdown ends a session whose client is still writing: the region is
// unregistered after the session's last request and before Shutdown
// returns, while it is still mapped.
func TestShutdownUnregistersRegion(t *testing.T) {
	be := newRegBackend(false)
	e := startIO(t, be, nil)
	fsys := e.dial(t)
	defer fsys.Close()
	writeRead(t, fsys, "f")
	f, err := fsys.Create("busy")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wrote := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		buf := bytes.Repeat([]byte{0xa5}, 64<<10)
		for i := 0; ; i++ {
			if _, err := f.WriteAt(buf, int64(i%64)*int64(len(buf))); err != nil {
				done <- err
				return
			}
			if i == 0 {
				wrote <- 1
			}
		}
	}()
	<-wrote
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.io.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	st := be.state()
	if len(st.registered) != 1 || len(st.unregistered) != 1 || !sameSlice(st.registered[0], st.unregistered[0]) {
		t.Fatalf("when Shutdown returned: %d registrations, %d unregistrations; want the one region both",
			len(st.registered), len(st.unregistered))
	}
	if err := <-done; err == nil {
		t.Fatal("writes went on after Shutdown")
	}
	checkNoProblems(t, be.state())
	checkCounters(t, e, map[string]uint64{"mem_register_failures": 0, "mem_unregister_failures": 0})
}

// A backend that wants huge pages on a host that has none: every session
// falls back to ordinary pages, is counted, and works; only the first
// fallback is logged as a warning. A fallback region is not offered to
// the backend, which could not register it.
func TestHugePageFallback(t *testing.T) {
	be := newRegBackend(true)
	var mu sync.Mutex
	var asked []bool // HugePages of each region asked for
	noHuge := func(cfg ring.Config) (*ring.Region, error) {
		mu.Lock()
		asked = append(asked, cfg.HugePages)
		mu.Unlock()
		if cfg.HugePages {
			return nil, fmt.Errorf("ring: map %d bytes: %w", 2<<20, syscall.ENOMEM)
		}
		return ring.Create(cfg)
	}
	e := startIO(t, be, noHuge)
	for i := range 2 {
		fsys := e.dial(t)
		writeRead(t, fsys, fmt.Sprint("f", i))
		fsys.Close()
		e.waitSessions(t, 0)
	}
	mu.Lock()
	if fmt.Sprint(asked) != "[true false true false]" {
		t.Errorf("regions asked for with HugePages %v, want huge then ordinary for each session", asked)
	}
	mu.Unlock()
	checkCounters(t, e, map[string]uint64{"ring_hugepage_fallbacks": 2, "mem_register_failures": 0})
	if n := e.logs.count("[WARN]", "no huge pages", "cannot allocate memory"); n != 1 {
		t.Errorf("%d warnings about the fallback, want 1", n)
	}
	st := be.state()
	if len(st.registered) != 0 || st.refused != 0 || st.zeroCopy != 0 || st.bounced == 0 {
		t.Errorf("backend: %d registered, %d refused, %d zero-copy, %d bounced payloads; want only bounced",
			len(st.registered), st.refused, st.zeroCopy, st.bounced)
	}
	checkNoProblems(t, st)
}

// A region the backend refuses is counted, and the session still reads
// and writes (the backend bounces); nothing is unregistered for it. Only
// the first refusal is logged as a warning.
func TestMemRegisterFailureStillServes(t *testing.T) {
	be := newRegBackend(false)
	be.registerErr = errors.New("no IOMMU mapping left")
	e := startIO(t, be, nil)
	for i := range 2 {
		fsys := e.dial(t)
		writeRead(t, fsys, fmt.Sprint("f", i))
		checkCounters(t, e, map[string]uint64{"mem_register_failures": uint64(i + 1)})
		fsys.Close()
		e.waitSessions(t, 0)
	}
	if n := e.logs.count("[WARN]", "register session region", "no IOMMU mapping left"); n != 1 {
		t.Errorf("%d warnings about refused regions, want 1", n)
	}
	st := be.state()
	if st.refused != 2 || len(st.registered) != 0 || len(st.unregistered) != 0 || st.bounced == 0 {
		t.Errorf("backend: %d refused, %d registered, %d unregistered, %d bounced payloads",
			st.refused, len(st.registered), len(st.unregistered), st.bounced)
	}
	checkNoProblems(t, st)
}

// A failed unregistration is counted.
func TestMemUnregisterFailureCounted(t *testing.T) {
	be := newRegBackend(false)
	be.unregisterErr = errors.New("region busy")
	e := startIO(t, be, nil)
	fsys := e.dial(t)
	writeRead(t, fsys, "f")
	fsys.Close()
	waitUnregistered(t, be)
	e.waitSessions(t, 0)
	checkCounters(t, e, map[string]uint64{"mem_register_failures": 0, "mem_unregister_failures": 1})
	checkNoProblems(t, be.state())
}

// On a host with free huge pages, a session of a backend that wants them
// gets a huge-page region whose whole mapping is 2 MiB aligned and sized,
// as SPDK registers it.
func TestHugePageRegionRegistered(t *testing.T) {
	probe, err := ring.Create(ring.Config{ArenaSize: 1 << 20, HugePages: true})
	if err != nil {
		t.Skipf("no huge pages on this host: %v", err)
	}
	probe.Close()
	be := newRegBackend(true)
	e := startIO(t, be, nil)
	fsys := e.dial(t)
	writeRead(t, fsys, "f")
	st := be.state()
	if len(st.registered) != 1 || len(st.registered[0]) != e.regionSize(t, true) || st.zeroCopy == 0 || st.bounced != 0 {
		t.Fatalf("backend: %d regions registered (want 1 of %d bytes), %d refused, %d zero-copy and %d bounced payloads",
			len(st.registered), e.regionSize(t, true), st.refused, st.zeroCopy, st.bounced)
	}
	fsys.Close()
	if m := waitUnregistered(t, be); !sameSlice(m, st.registered[0]) {
		t.Fatal("unregistered memory is not the registered region")
	}
	checkNoProblems(t, be.state())
	checkCounters(t, e, map[string]uint64{"ring_hugepage_fallbacks": 0, "mem_register_failures": 0})
}
