package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
)

// Per-user fairness (docs/architecture.md, "Limits per uid"): a process of
// another uid (65534, a real process: this test binary run again as that
// user) takes all it can of one resource, and the test checks that the
// service refused it past its share and counted the refusals, and that
// root's stat through client.FS stays within twice its latency with the
// attacker idle (medians of several batches, measured in the same test:
// a ratio, no wall-clock bound).

// envFair makes the test binary a fairness attacker: the mode, then its
// arguments, comma-separated. It runs until its stdin closes (the test
// ends) and says "ready ..." on stdout once the attack is in place.
const envFair = "WEIR_CLIENT_TEST_FAIR"

var weirExe struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// buildWeir builds the weir command once per test binary (the fairness
// tests run the services as processes, as weir up does).
func buildWeir(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH: cannot build the weir binary the fairness tests run")
	}
	weirExe.once.Do(func() {
		if weirExe.dir, weirExe.err = os.MkdirTemp("", "weir-fair-bin-"); weirExe.err != nil {
			return
		}
		weirExe.path = filepath.Join(weirExe.dir, "weir")
		cmd := exec.Command(gobin, "build", "-o", weirExe.path, "github.com/weir-storage/weir/cmd/weir")
		if out, err := cmd.CombinedOutput(); err != nil {
			weirExe.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if weirExe.err != nil {
		t.Fatal(weirExe.err)
	}
	return weirExe.path
}

// fairEnv is a stack whose services run as processes (as weir up runs
// them), root's client of it, and its status on NATS.
type fairEnv struct {
	cfg  *config.Config
	sup  *stack.Supervisor
	fsys *client.FS
	nc   *nats.Conn
}

// fairOpts change a fairness test's stack: io is added to the
// configuration's io block, extra to the file; nofile, if not 0, is the
// services' RLIMIT_NOFILE.
type fairOpts struct {
	io, extra string
	nofile    int
}

// fairStack starts the services as processes on the mem backend, with
// sockets uid 65534 reaches, and dials them as root; it skips the test
// unless it runs as root.
func fairStack(t *testing.T, o fairOpts) *fairEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: the attacker runs as uid %d, a real process of another user", otherUID)
	}
	exe := buildWeir(t)
	run, err := os.MkdirTemp("", "weir-fair-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	if err := os.Chmod(run, 0o755); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	path := filepath.Join(t.TempDir(), "weir.hcl")
	body := fmt.Sprintf("data_dir = %q\nrun_dir = %q\nlog_level = \"warn\"\nio {\n  backend = \"mem\"\n  staging_size = \"4MiB\"\n%s}\n%s", data, run, o.io, o.extra)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	e := &fairEnv{cfg: cfg}
	if o.nofile != 0 {
		// The services start under a shell that lowers their limit (soft
		// and hard: Go raises the soft one to the hard at start).
		wrap := filepath.Join(t.TempDir(), "weir-nofile")
		script := fmt.Sprintf("#!/bin/sh\nulimit -n %d || exit 1\nexec %s \"$@\"\n", o.nofile, exe)
		if err := os.WriteFile(wrap, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		exe = wrap
	}
	e.sup = &stack.Supervisor{Config: cfg, ConfigPath: path, Exe: exe, Log: hclog.NewNullLogger(), Out: testWriter{t}}
	if err := e.sup.Start(); err != nil {
		e.sup.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() { e.sup.Stop() })
	if e.nc, err = stack.Connect(cfg, e.sup.URL(), control.RoleCLI, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.fsys, err = client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.fsys.Close() })
	if err := e.fsys.WriteFile("probe", []byte("root's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.fsys.Mkdir("pub", 0o777); err != nil {
		t.Fatal(err)
	}
	if err := e.fsys.Chmod("pub", 0o777); err != nil {
		t.Fatal(err)
	}
	return e
}

// counter is the counter key of the service ("weir-metadata", "weir-io")
// as weir status shows it.
func (e *fairEnv) counter(t *testing.T, service, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := control.Status(ctx, e.nc, e.cfg.NATS.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Name != service {
			continue
		}
		v, ok := s.Stats[key]
		if !ok {
			t.Fatalf("%s's status has no %s", service, key)
		}
		n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
		if err != nil {
			t.Fatalf("%s's %s = %v: %v", service, key, v, err)
		}
		return n
	}
	t.Fatalf("no %s in weir status", service)
	return 0
}

// statMedian is the median of the medians of batches of root's stats of
// the probe file (each batch's median, so that a pause in one batch moves
// one sample). The stats are 2 ms apart, as an interactive user's: the
// service's poller is asleep when each comes, and wakes for it.
func statMedian(t *testing.T, fsys *client.FS) time.Duration {
	t.Helper()
	const batches, per = 7, 100
	meds := make([]time.Duration, 0, batches)
	lat := make([]time.Duration, per)
	for range batches {
		for i := range lat {
			t0 := time.Now()
			if _, err := fsys.Stat("probe"); err != nil {
				t.Fatalf("root's stat: %v", err)
			}
			lat[i] = time.Since(t0)
			time.Sleep(2 * time.Millisecond)
		}
		slices.Sort(lat)
		meds = append(meds, lat[per/2])
	}
	slices.Sort(meds)
	return meds[batches/2]
}

// checkLatency compares root's stat latency now (loaded) with idle: at
// most twice it. The machine is shared, so a loaded median past that is
// measured again, up to three times, and the least counts: an attack
// that slows root keeps every measurement slow.
func checkLatency(t *testing.T, fsys *client.FS, idle time.Duration, what string) {
	t.Helper()
	var loaded time.Duration
	for i := range 3 {
		m := statMedian(t, fsys)
		if i == 0 || m < loaded {
			loaded = m
		}
		if loaded <= 2*idle {
			break
		}
	}
	ratio := float64(loaded) / float64(idle)
	t.Logf("root's stat, median: %v idle, %v with %s: %.2fx", idle, loaded, what, ratio)
	if ratio > 2 {
		t.Errorf("root's stat with %s: %v against %v idle (%.1fx; want at most 2x)", what, loaded, idle, ratio)
	}
}

// attacker is a running fairness attacker.
type attacker struct {
	t     *testing.T
	mode  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// attack starts the attacker in mode with args, as uid 65534, and waits
// for its "ready" line, whose words it returns.
func attack(t *testing.T, mode string, args ...string) (*attacker, []string) {
	t.Helper()
	cmd := exec.Command(copyTestBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), envFair+"="+strings.Join(append([]string{mode}, args...), ","))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID}}
	cmd.Stderr = testWriter{t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &attacker{t: t, mode: mode, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	t.Cleanup(a.stop)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			a.lines <- sc.Text()
		}
		close(a.lines)
	}()
	return a, a.await("ready")
}

// await waits for the attacker's line starting with word and returns its
// other words.
func (a *attacker) await(word string) []string {
	a.t.Helper()
	timeout := time.After(3 * time.Minute)
	for {
		select {
		case l, ok := <-a.lines:
			if !ok {
				a.t.Fatalf("attacker %s ended before it said %q", a.mode, word)
			}
			f := strings.Fields(l)
			if len(f) > 0 && f[0] == word {
				a.t.Logf("attacker %s: %s", a.mode, l)
				return f[1:]
			}
			a.t.Logf("attacker %s: %s", a.mode, l)
		case <-timeout:
			a.t.Fatalf("attacker %s did not say %q within 3 minutes", a.mode, word)
		}
	}
}

// again asks the attacker for another round of its attack and waits for
// it.
func (a *attacker) again() []string {
	a.t.Helper()
	if _, err := io.WriteString(a.stdin, "again\n"); err != nil {
		a.t.Fatal(err)
	}
	return a.await("done")
}

// stop ends the attacker (its stdin closes) and waits for it.
func (a *attacker) stop() {
	if a.cmd.ProcessState != nil {
		return
	}
	a.stdin.Close()
	done := make(chan struct{})
	go func() {
		for range a.lines {
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		a.cmd.Process.Kill()
	}
	a.cmd.Wait()
}

// fairChild is the attacker's main. Each mode sets up its attack, says
// "ready ...", then does one more round at each "again" on stdin (saying
// "done ..."), until stdin closes.
func fairChild() int {
	f := strings.Split(os.Getenv(envFair), ",")
	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	modes := map[string]func(args []string, cmds <-chan string) error{
		"handshakes": idleHandshakes, "sessions": idleSessions, "noreap": noReap,
		"pins": holdPins, "leases": keepLeases, "staging": fillStaging, "descriptors": holdFiles,
	}
	run := modes[f[0]]
	if run == nil {
		fmt.Fprintf(os.Stderr, "attacker: unknown mode %q\n", f[0])
		return 2
	}
	if err := run(f[1:], cmds); err != nil {
		fmt.Fprintln(os.Stderr, "attacker:", err)
		return 1
	}
	return 0
}

// rounds serves the attacker's commands: round at each "again", until
// stdin closes.
func rounds(cmds <-chan string, round func() (string, error)) error {
	for c := range cmds {
		if c != "again" {
			return fmt.Errorf("unknown command %q", c)
		}
		out, err := round()
		if err != nil {
			return err
		}
		fmt.Println("done", out)
	}
	return nil
}

// attackerFS dials the stack as the attacker. args[0] and args[1] are the
// sockets.
func attackerFS(args []string) (*client.FS, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return client.Dial(ctx, client.Options{MetadataSocket: args[0], IOSocket: args[1]})
}

// idleHandshakes keeps n connections to socket that never complete the
// handshake (the hello is read, never acked): a connection the service
// closes is made again a second later. (A flood of connects as fast as
// the attacker can make them is a fight for the CPU, which the kernel's
// scheduler arbitrates: each costs the attacker a connect and the service
// an accept, a getsockopt, a send and a close.) args: socket, n.
func idleHandshakes(args []string, cmds <-chan string) error {
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	var dial func() error
	dial = func() error {
		c, err := net.Dial("unix", args[0])
		if err != nil {
			return err
		}
		go func() {
			var b [64]byte
			for {
				if _, err := c.Read(b[:]); err != nil {
					break
				}
			}
			c.Close()
			time.Sleep(time.Second)
			for dial() != nil {
				time.Sleep(time.Second)
			}
		}()
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			if err := dial(); err != nil {
				errs <- fmt.Errorf("dial: %w", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Println("ready", n)
	return rounds(cmds, func() (string, error) { return "", nil })
}

// handshake opens a session on socket (the ring's handshake only); a
// refusal is returned as its errno.
func handshake(socket string) (*ring.Region, net.Conn, error) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := ring.ClientHandshake(ctx, c.(*net.UnixConn))
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return r, c, nil
}

// idleSessions opens n sessions on each of the sockets (the ring's
// handshake done) that never send a request, and then tries a client of
// its own; it says how many each service took and what the client was
// told. args: metadata socket, io socket, n.
func idleSessions(args []string, cmds <-chan string) error {
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	var keep []any
	var out []string
	for _, socket := range args[:2] {
		took, refused := 0, ""
		for range n {
			r, c, err := handshake(socket)
			if err != nil {
				var re *ring.RefusedError
				if !errors.As(err, &re) {
					return fmt.Errorf("handshake: %w", err)
				}
				refused = strconv.Itoa(int(re.Errno))
				continue
			}
			keep = append(keep, r, c)
			took++
		}
		out = append(out, strconv.Itoa(took), refused)
	}
	_, err = attackerFS(args)
	dial := "ok"
	if errors.Is(err, syscall.EUSERS) {
		dial = "EUSERS"
	} else if err != nil {
		dial = strings.ReplaceAll(err.Error(), " ", "_")
	}
	fmt.Println("ready", strings.Join(out, " "), dial)
	err = rounds(cmds, func() (string, error) { return "", nil })
	runtime.KeepAlive(keep)
	return err
}

// noReap opens n sessions on socket and fills each one's submission
// queue with OpNop, again as the service takes them, never taking a
// completion. args: socket, n.
func noReap(args []string, cmds <-chan string) error {
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	var rs []*rawRing
	var conns []net.Conn
	for range n {
		r, c, err := handshake(args[0])
		if err != nil {
			return fmt.Errorf("handshake: %w", err)
		}
		rs = append(rs, newRawRing(r))
		conns = append(conns, c)
	}
	for _, r := range rs {
		r.fill(ring.OpNop)
	}
	fmt.Println("ready", len(rs))
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				for _, r := range rs {
					r.fill(ring.OpNop)
				}
			}
		}
	}()
	err = rounds(cmds, func() (string, error) { return "", nil })
	close(stop)
	runtime.KeepAlive(conns)
	return err
}

// mapFile opens name read-write (made with size bytes if missing) and
// reads it until the client maps its cache region (OpCacheMap), as
// mappedFile does for a test.
func mapFile(fsys *client.FS, name string, size int) (*client.File, error) {
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if fi.Size() < int64(size) {
		if _, err := f.WriteAt(make([]byte, size), 0); err != nil {
			return nil, err
		}
	}
	b := make([]byte, 4096)
	for range 3 {
		if _, err := f.ReadAt(b, 0); err != nil {
			return nil, err
		}
	}
	if client.CacheFile(f) == nil {
		return nil, fmt.Errorf("%s: the client did not map its cache region", name)
	}
	return f, nil
}

// pinAll takes every write window (OpWritePin, slot after slot) and then
// every pinned range of 1 MiB (OpMapPin) io lets f's session take, and
// returns the windows and pages it got; ENOMEM ends each.
func pinAll(f *client.File) (windows, pages int, err error) {
	const wbytes = proto.WindowPages * 4096
	if _, lf, err := client.IOCall(f, proto.OpWriteLog, 0, 0, true); err != nil || lf == nil {
		return 0, 0, fmt.Errorf("OpWriteLog: %v", err)
	} else {
		defer lf.Close()
	}
	for slot := 0; slot < proto.WriteLogSlots; slot++ {
		res, _, err := client.IOCall(f, proto.OpWritePin, uint32(slot), uint64(slot)*wbytes, false)
		if err != nil {
			return windows, pages, err
		}
		if res == -int64(syscall.ENOMEM) {
			break
		}
		if res != 0 {
			return windows, pages, fmt.Errorf("OpWritePin of slot %d: %d", slot, res)
		}
		windows++
	}
	for off := uint64(0); ; off += 1 << 20 {
		res, _, err := client.IOCall(f, proto.OpMapPin, 256, off, false)
		if err != nil {
			return windows, pages, err
		}
		if res == -int64(syscall.ENOMEM) {
			return windows, pages, nil
		}
		if res != 0 {
			return windows, pages, fmt.Errorf("OpMapPin at %d: %d", off, res)
		}
		pages += 256
	}
}

// holdPins takes every window and pin io gives in n sessions of its own
// (each a client.FS) of one 16 MiB file, and holds them. args: sockets,
// n.
func holdPins(args []string, cmds <-chan string) error {
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	var keep []*client.FS
	windows, pages := 0, 0
	for i := range n {
		fsys, err := attackerFS(args)
		if err != nil {
			return err
		}
		keep = append(keep, fsys)
		f, err := mapFile(fsys, "pub/pinned", 16<<20)
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		w, p, err := pinAll(f)
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		windows += w
		pages += p
	}
	fmt.Println("ready", windows, pages)
	err = rounds(cmds, func() (string, error) { return "", nil })
	runtime.KeepAlive(keep)
	return err
}

// keepLeases opens and reads each of m files of its own read-only, then
// closes it, in n sessions: each session keeps a lease of each file.
// Each round opens them all again. args: sockets, n, m.
func keepLeases(args []string, cmds <-chan string) error {
	n, err1 := strconv.Atoi(args[2])
	m, err2 := strconv.Atoi(args[3])
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	var fss []*client.FS
	for range n {
		fsys, err := attackerFS(args)
		if err != nil {
			return err
		}
		fss = append(fss, fsys)
	}
	for i := range m {
		if err := fss[0].WriteFile(fmt.Sprintf("pub/l%d", i), []byte("leased"), 0o644); err != nil {
			return err
		}
	}
	round := func() (string, error) {
		for _, fsys := range fss {
			// Twice: a file's first open may be a direct one (from the
			// directory's snapshot, at io alone), its second goes through
			// metadata and keeps a lease.
			for range 2 {
				for i := range m {
					f, err := fsys.Open(fmt.Sprintf("pub/l%d", i))
					if err != nil {
						return "", err
					}
					var b [1]byte
					_, err = f.Read(b[:])
					f.Close()
					if err != nil {
						return "", err
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond) // the lingering closes go
		return "", nil
	}
	if _, err := round(); err != nil {
		return err
	}
	fmt.Println("ready")
	err := rounds(cmds, round)
	for _, fsys := range fss {
		fsys.Close()
	}
	return err
}

// fillStaging writes 256 KiB into one of n files of its own and fsyncs
// it, over and over, until stdin closes. args: sockets, n.
func fillStaging(args []string, cmds <-chan string) error {
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	fsys, err := attackerFS(args)
	if err != nil {
		return err
	}
	defer fsys.Close()
	var fs []*client.File
	for i := range n {
		f, err := fsys.Create(fmt.Sprintf("pub/s%d", i))
		if err != nil {
			return err
		}
		fs = append(fs, f)
	}
	buf := make([]byte, 256<<10)
	syncs := 0
	step := func() error {
		f := fs[syncs%n]
		buf[0]++
		if _, err := f.WriteAt(buf, int64(syncs/n%8)*int64(len(buf))); err != nil {
			return err
		}
		syncs++
		return f.Sync()
	}
	for range 4 * n {
		if err := step(); err != nil {
			return err
		}
	}
	fmt.Println("ready", syncs)
	stop := make(chan error, 1)
	go func() {
		for c := range cmds {
			if c != "again" {
				stop <- fmt.Errorf("unknown command %q", c)
				return
			}
			fmt.Println("done", syncs)
		}
		stop <- nil
	}()
	for {
		select {
		case err := <-stop:
			return err
		default:
		}
		if err := step(); err != nil {
			return err
		}
	}
}

// holdFiles creates n files of its own and opens and reads each, holding
// them open, until one fails; it says how many it holds and the errno of
// the failure. args: sockets, n.
func holdFiles(args []string, cmds <-chan string) error {
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	fsys, err := attackerFS(args)
	if err != nil {
		return err
	}
	defer fsys.Close()
	var held []*client.File
	failure := "none"
	for i := range n {
		name := fmt.Sprintf("pub/d%d", i)
		if err := fsys.WriteFile(name, []byte("held"), 0o644); err != nil {
			failure = errnoName(err)
			break
		}
		f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
		if err == nil {
			var b [1]byte
			_, err = f.Read(b[:])
		}
		if err != nil {
			failure = errnoName(err)
			break
		}
		held = append(held, f)
	}
	fmt.Println("ready", len(held), failure)
	err = rounds(cmds, func() (string, error) { return "", nil })
	for _, f := range held {
		f.Close()
	}
	return err
}

// errnoName is err's errno as a word ("EMFILE"), or its text.
func errnoName(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		if name := unix.ErrnoName(e); name != "" {
			return name
		}
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

// logProc logs the threads and resident memory of process pid.
func logProc(t *testing.T, what string, pid int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Log(err)
		return
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Threads:") || strings.HasPrefix(l, "VmRSS:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	t.Logf("%s (pid %d): %s", what, pid, strings.Join(out, ", "))
}

// atLeast waits until the counter of service reaches want (a bound on a
// hang: 30 s) and returns it.
func (e *fairEnv) atLeast(t *testing.T, service, key string, want int64) int64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := e.counter(t, service, key)
		if n >= want {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's %s = %d, want at least %d", service, key, n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFairHandshakes: 2,000 connections of uid 65534 to the metadata
// socket that never complete the handshake (each closed one made again):
// past limits.handshakes_per_uid (8) they are refused at once, each
// refusal counted, the 8 taken are dropped at limits.handshake_timeout,
// and root's stats keep their pace.
func TestFairHandshakes(t *testing.T) {
	e := fairStack(t, fairOpts{})
	idle := statMedian(t, e.fsys)
	attack(t, "handshakes", e.cfg.Metadata.Socket, "2000")
	const svc = "weir-metadata"
	e.atLeast(t, svc, "limits_refused_handshakes", 1)
	e.atLeast(t, svc, "handshakes_timed_out", 1)
	if n := e.counter(t, svc, "handshakes_pending"); n > config.DefaultHandshakesPerUID {
		t.Errorf("%d handshakes pending, past limits.handshakes_per_uid (%d)", n, config.DefaultHandshakesPerUID)
	}
	logProc(t, "metadata", e.sup.PIDs()["metadata"])
	checkLatency(t, e.fsys, idle, "2,000 idle handshakes of uid 65534")
	logProc(t, "metadata", e.sup.PIDs()["metadata"])
}

// TestFairSessions: uid 65534 opens 2,000 sessions on each service that
// never send a request: each service takes limits.sessions_per_uid (256)
// and refuses the rest with EUSERS, which the attacker's own client.Dial
// is told too; root's stats keep their pace, and root can still dial.
func TestFairSessions(t *testing.T) {
	e := fairStack(t, fairOpts{})
	idle := statMedian(t, e.fsys)
	_, got := attack(t, "sessions", e.cfg.Metadata.Socket, e.cfg.IO.Socket, "2000")
	want := []string{"256", strconv.Itoa(int(syscall.EUSERS)), "256", strconv.Itoa(int(syscall.EUSERS)), "EUSERS"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the attacker's sessions (metadata taken, errno; io taken, errno; client.Dial): %v, want %v", got, want)
	}
	for _, svc := range []string{"weir-metadata", "weir-io"} {
		e.atLeast(t, svc, "limits_refused_sessions", 2000-256)
	}
	logProc(t, "metadata", e.sup.PIDs()["metadata"])
	checkLatency(t, e.fsys, idle, "512 idle sessions of uid 65534")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{MetadataSocket: e.cfg.Metadata.Socket, IOSocket: e.cfg.IO.Socket})
	if err != nil {
		t.Fatalf("root's dial with uid 65534 at its limit: %v", err)
	}
	c.Close()
}

// TestFairNoReap: 40 sessions of uid 65534 on each service fill their
// submission queues and never take a completion: each stalls itself only
// (counted in ring_sessions_stalled), and root's stats keep their pace.
func TestFairNoReap(t *testing.T) {
	e := fairStack(t, fairOpts{})
	idle := statMedian(t, e.fsys)
	attack(t, "noreap", e.cfg.Metadata.Socket, "40")
	attack(t, "noreap", e.cfg.IO.Socket, "40")
	e.atLeast(t, "weir-metadata", "ring_sessions_stalled", 40)
	e.atLeast(t, "weir-io", "ring_sessions_stalled", 40)
	logProc(t, "metadata", e.sup.PIDs()["metadata"])
	logProc(t, "io", e.sup.PIDs()["io"])
	checkLatency(t, e.fsys, idle, "80 sessions of uid 65534 that never reap")
}

// TestFairPins: uid 65534 takes every write window and pin io gives it in
// three sessions (a 64 MiB cache: pins half of it, windows a quarter, a
// session a quarter): it gets limits.pins_share (half) of each, the rest
// refused with ENOMEM and counted, and root still maps and takes a window
// (before, uid 65534 took them all: root's map was ENOMEM, and the shim
// crashed on it).
func TestFairPins(t *testing.T) {
	e := fairStack(t, fairOpts{io: "  cache_size = \"64MiB\"\n"})
	idle := statMedian(t, e.fsys)
	_, got := attack(t, "pins", e.cfg.Metadata.Socket, e.cfg.IO.Socket, "3")
	const cachePages = 64 << 20 / 4096
	windows, _ := strconv.Atoi(got[0])
	pages, _ := strconv.Atoi(got[1])
	wantWindows := cachePages / 4 / 2 / proto.WindowPages
	if windows != wantWindows || pages+windows*proto.WindowPages > cachePages/2/2 {
		t.Fatalf("uid 65534 holds %d windows and %d pinned pages; want %d windows and at most %d pages in all",
			windows, pages, wantWindows, cachePages/2/2)
	}
	e.atLeast(t, "weir-io", "limits_refused_windows", 1)
	e.atLeast(t, "weir-io", "limits_refused_pins", 1)
	f, err := mapFile(e.fsys, "rootmap", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if w, p, err := pinAll(f); err != nil || w == 0 || p < cachePages/8 {
		t.Fatalf("root with uid 65534 at its share: %d windows, %d pinned pages, %v; want windows and %d pages at least", w, p, err, cachePages/8)
	}
	checkLatency(t, e.fsys, idle, "uid 65534's pins")
}

// TestFairLeases: uid 65534 keeps read leases in 17 sessions of 256 files
// each (more than the 4,096 metadata keeps in all): it keeps
// limits.leases_share (a quarter) of them, its own oldest ended past it
// and counted, and root's kept lease survives another round of the
// attacker's opens (before, the uid filled the table and root's lease
// ended at its own close).
func TestFairLeases(t *testing.T) {
	e := fairStack(t, fairOpts{})
	idle := statMedian(t, e.fsys)
	a, _ := attack(t, "leases", e.cfg.Metadata.Socket, e.cfg.IO.Socket, "17", "256")
	t.Logf("metadata: %d kept leases, %d opens through one", e.counter(t, "weir-metadata", "leases"), e.counter(t, "weir-metadata", "lease_opens"))
	e.atLeast(t, "weir-metadata", "limits_leases_over_share", 1)
	if n := e.counter(t, "weir-metadata", "leases"); n > 4096/4+16 {
		t.Fatalf("%d kept leases with uid 65534's share a quarter of 4,096", n)
	}
	if err := e.fsys.WriteFile("leased", []byte("root's"), 0o644); err != nil {
		t.Fatal(err)
	}
	readOnce := func() {
		f, err := e.fsys.Open("leased")
		if err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := f.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		f.Close()
		time.Sleep(50 * time.Millisecond) // the lingering close goes
	}
	readOnce() // root's lease, kept idle
	a.again()
	before := e.counter(t, "weir-metadata", "lease_opens")
	readOnce()
	if after := e.counter(t, "weir-metadata", "lease_opens"); after == before {
		t.Fatal("root's kept lease did not survive uid 65534's opens: its open asked for a grant")
	}
	checkLatency(t, e.fsys, idle, "uid 65534's kept leases")
}

// TestFairStaging: uid 65534 writes and fsyncs 256 KiB again and again
// into a 4 MiB staging log whose journal passes come once a second: its
// records take at most limits.staging_share (half) of the log, its later
// fsyncs going home (counted), so root's fsyncs never wait for room
// (before, the uid filled the log and every fsync waited for a pass).
func TestFairStaging(t *testing.T) {
	e := fairStack(t, fairOpts{extra: "journal {\n  interval = \"1s\"\n}\n"})
	idle := statMedian(t, e.fsys)
	attack(t, "staging", e.cfg.Metadata.Socket, e.cfg.IO.Socket, "8")
	e.atLeast(t, "weir-io", "limits_staging_home", 1)
	t.Logf("io: staging log %d of %d bytes used, %d fsyncs waited for room", e.counter(t, "weir-io", "staging_used_bytes"),
		e.counter(t, "weir-io", "staging_ring_bytes"), e.counter(t, "weir-io", "staging_full_waits"))
	f, err := e.fsys.Create("synced")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for i := range 20 {
		buf[0] = byte(i)
		if _, err := f.WriteAt(buf, int64(i%4)*int64(len(buf))); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.counter(t, "weir-io", "staging_full_waits"); n != 0 {
		t.Fatalf("%d fsyncs waited for room in the staging log", n)
	}
	checkLatency(t, e.fsys, idle, "uid 65534's fsyncs")
}

// TestFairDescriptors: with io's RLIMIT_NOFILE at 2,048, uid 65534 opens
// and reads files until one fails: its grants stop at
// limits.descriptors_share (a quarter, at three descriptors a file) with
// EMFILE, counted, and root still opens and reads (before, the uid took
// io's every descriptor and root's read failed with EMFILE).
func TestFairDescriptors(t *testing.T) {
	e := fairStack(t, fairOpts{nofile: 2048})
	idle := statMedian(t, e.fsys)
	_, got := attack(t, "descriptors", e.cfg.Metadata.Socket, e.cfg.IO.Socket, "3000")
	held, _ := strconv.Atoi(got[0])
	if cap := 2048 / 3 * 25 / 100; got[1] != "EMFILE" || held > cap {
		t.Fatalf("uid 65534 held %d files, then %s; want EMFILE at %d at most", held, got[1], cap)
	}
	e.atLeast(t, "weir-io", "limits_refused_grants", 1)
	for i := range 20 {
		name := fmt.Sprintf("root%d", i)
		if err := e.fsys.WriteFile(name, []byte("root's"), 0o644); err != nil {
			t.Fatalf("root's write with uid 65534 at its share: %v", err)
		}
		if b, err := e.fsys.ReadFile(name); err != nil || string(b) != "root's" {
			t.Fatalf("root's read with uid 65534 at its share: %q, %v", b, err)
		}
	}
	checkLatency(t, e.fsys, idle, "uid 65534's open files")
}
