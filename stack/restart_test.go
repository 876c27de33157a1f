package stack_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/fsck"
)

// serviceProc is one service of the registry run as a process of its own,
// on a NATS server the test runs, as systemd would run it.
type serviceProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been waited for
}

// logLevel is the services' log level in these tests (WEIR_TEST_LOG_LEVEL).
var logLevel = func() string {
	if l := os.Getenv("WEIR_TEST_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}()

// startService starts `weir <name>` for cfg on the NATS server at url and
// returns once it is ready.
func startService(t *testing.T, exe, name string, cfg *config.Config, url string, extra ...string) *serviceProc {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(exe, name, "--ready-fd", "3", "--nats-url", url, "--data", cfg.DataDir,
		"--run-dir", cfg.RunDir, "--log-level", logLevel)
	cmd.Args = append(cmd.Args, extra...)
	cmd.Stdout, cmd.Stderr = testOut{t}, testOut{t}
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	p := &serviceProc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("service %s did not become ready: %q %v", name, line, err)
	}
	return p
}

func (p *serviceProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stack.ShutdownTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// pause stops the process (SIGSTOP) and returns once the kernel reports
// it stopped: the signal is asynchronous, and a process that runs on
// another CPU may otherwise still answer a request or two.
func (p *serviceProc) pause(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatal(err)
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not stop: %s", p.name, b)
		}
	}
}

func (p *serviceProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// rawSession is a metadata ring that said hello and an IO ring attached to
// it, driven by hand.
type rawSession struct {
	meta, data *ring.Client
	hello      proto.HelloResp
}

func rawDial(t *testing.T, cfg *config.Config) *rawSession {
	t.Helper()
	return rawDialFeatures(t, cfg, 0)
}

// rawDialFeatures is rawDial asking for features, which the service must
// give.
func rawDialFeatures(t *testing.T, cfg *config.Config, features uint64) *rawSession {
	t.Helper()
	ctx := context.Background()
	s := &rawSession{}
	var err error
	if s.meta, err = ring.Dial(ctx, cfg.Metadata.Socket, ring.ClientOptions{}); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, proto.HelloRespSize)
	req := proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: features}
	if c := rawDo(t, s.meta, proto.OpHello, 0, 0, req.Append(nil), out); c.Result != proto.HelloRespSize {
		t.Fatalf("hello: %+v", c)
	}
	if s.hello, err = proto.DecodeHelloResp(out); err != nil || s.hello.Features != features {
		t.Fatalf("hello: %+v %v (asked for features %#x)", s.hello, err, features)
	}
	if s.data, err = ring.Dial(ctx, cfg.IO.Socket, ring.ClientOptions{}); err != nil {
		t.Fatal(err)
	}
	att := proto.AttachReq{Version: s.hello.Version, Session: s.hello.Session, Token: s.hello.Token}
	if c := rawDo(t, s.data, proto.OpAttach, 0, 0, att.Append(nil), nil); c.Result != 0 {
		t.Fatalf("attach: %+v", c)
	}
	t.Cleanup(func() { s.meta.Close(); s.data.Close() })
	return s
}

func rawDo(t *testing.T, c *ring.Client, op uint8, handle, off uint64, in, out []byte) ring.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := ring.Call{Op: op, Handle: handle, Offset: off}
	if n := max(len(in), len(out)); n > 0 {
		b, err := c.Alloc(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		b.CopyFrom(in)
		call.Buf = b
		comp, err := c.Do(ctx, &call)
		if err != nil {
			return ring.Completion{Result: -int64(syscall.EPIPE)}
		}
		if out != nil && comp.Result > 0 {
			b.CopyTo(out[:min(len(out), int(comp.Result))])
		}
		return comp
	}
	comp, err := c.Do(ctx, &call)
	if err != nil {
		return ring.Completion{Result: -int64(syscall.EPIPE)}
	}
	return comp
}

// open opens name for reading and writing (creating it) and grants the
// handle: the raw session can then read it at io.
func (s *rawSession) open(t *testing.T, name string) uint64 {
	t.Helper()
	out := make([]byte, proto.OpenRespSize(0))
	in := (&proto.ModePathReq{Mode: 0o600, Path: name}).Append(nil)
	c := rawCall(t, s.meta, proto.OpOpen, syscall.O_RDWR|syscall.O_CREAT, 0, in, out)
	r, err := proto.DecodeOpenResp(out[:max(c.Result, 0)], 0)
	if err != nil {
		t.Fatalf("open %s: %+v %v", name, c, err)
	}
	if c := rawDo(t, s.meta, proto.OpGrant, r.Handle, 0, nil, nil); c.Result != 0 {
		t.Fatalf("grant: %+v", c)
	}
	return r.Handle
}

func rawCall(t *testing.T, c *ring.Client, op uint8, arg uint32, handle uint64, in, out []byte) ring.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := c.Alloc(ctx, max(len(in), len(out)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	b.CopyFrom(in)
	comp, err := c.Do(ctx, &ring.Call{Op: op, Arg: arg, Handle: handle, Buf: b})
	if err != nil {
		t.Fatal(err)
	}
	if comp.Result > 0 {
		b.CopyTo(out[:min(len(out), int(comp.Result))])
	}
	return comp
}

// readErr is the errno of a one-byte read of handle on the raw session's
// IO ring (0: it read).
func (s *rawSession) readErr(t *testing.T, handle uint64) syscall.Errno {
	t.Helper()
	c := rawDo(t, s.data, proto.OpRead, handle, 0, nil, make([]byte, 1))
	if c.Result < 0 {
		return syscall.Errno(-c.Result)
	}
	return 0
}

// TestMetadataRestartUnderLoad kills only the metadata process, with
// clients writing, syncing, reading and stat'ing their files, and starts
// it again. The IO process runs on: at the new incarnation's resync it
// drops every grant of the old one. Every client recovers by itself (new
// session, reattached IO ring, files reopened with their tickets, a file
// unlinked while open included) and its data is all there; no session of
// the new incarnation can use a handle of the old one, and an IO session
// of the old one is stale.
func TestMetadataRestartUnderLoad(t *testing.T) {
	exe := buildWeir(t)
	cfg := testConfig(t)
	users, err := stack.Users(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := control.StartEmbedded(control.EmbeddedOptions{Listen: config.DefaultNATSListen, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	md := startService(t, exe, "metadata", cfg, srv.URL())
	startService(t, exe, "io", cfg, srv.URL())
	startService(t, exe, "journal", cfg, srv.URL())

	// A raw session of the first incarnation with a granted handle.
	old := rawDial(t, cfg)
	oldHandle := old.open(t, "raw-old")
	if e := old.readErr(t, oldHandle); e != 0 {
		t.Fatalf("the raw session cannot read its own handle: %v", e)
	}

	const clients = 4
	var (
		progress [clients]atomic.Int64
		wg       sync.WaitGroup
		stop     atomic.Bool
		errs     = make(chan error, clients*4)
		fsyses   [clients]*client.FS
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range clients {
		fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
		if err != nil {
			t.Fatal(err)
		}
		fsyses[i] = fsys
		t.Cleanup(func() { fsys.Close() })
		wg.Go(func() {
			fail := func(format string, a ...any) { errs <- fmt.Errorf("client %d: "+format, append([]any{i}, a...)...) }
			f, err := fsys.OpenFile(fmt.Sprintf("load-%d", i), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				fail("open: %v", err)
				return
			}
			defer f.Close()
			// Client 0 also holds a file it unlinked: it must survive
			// the restart for its holder.
			var gone *client.File
			if i == 0 {
				if gone, err = fsys.Create("unlinked-while-open"); err == nil {
					_, err = gone.Write([]byte("kept by its holder"))
				}
				if err == nil {
					err = fsys.Remove("unlinked-while-open")
				}
				if err != nil {
					fail("unlinked file: %v", err)
					return
				}
				defer gone.Close()
			}
			block := make([]byte, 4096)
			for n := 0; !stop.Load(); n++ {
				for j := range block {
					block[j] = byte(n + j + i)
				}
				off := int64(n%64) * 4096
				if _, err := f.WriteAt(block, off); err != nil {
					fail("write %d: %v", n, err)
					return
				}
				if n%8 == 7 {
					if err := f.Sync(); err != nil {
						fail("sync %d: %v", n, err)
						return
					}
				}
				got := make([]byte, len(block))
				if _, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, block) {
					fail("read back %d: %v", n, err)
					return
				}
				if fi, err := fsys.Stat(fmt.Sprintf("load-%d", i)); err != nil || fi.Size() < off+4096 {
					fail("stat %d: %v %v", n, fi, err)
					return
				}
				if gone != nil {
					got := make([]byte, 18)
					if _, err := gone.ReadAt(got, 0); err != nil || string(got) != "kept by its holder" {
						fail("the unlinked file reads %q, %v", got, err)
						return
					}
				}
				progress[i].Add(1)
			}
		})
	}
	waitProgress := func(min int64) {
		t.Helper()
		for i := range clients {
			for progress[i].Load() < min {
				select {
				case err := <-errs:
					t.Fatal(err)
				case <-ctx.Done():
					t.Fatalf("client %d made %d rounds, want %d", i, progress[i].Load(), min)
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
	}
	waitProgress(20)
	md.kill(t)
	before := [clients]int64{}
	for i := range clients {
		before[i] = progress[i].Load()
	}
	startService(t, exe, "metadata", cfg, srv.URL())
	for i := range clients {
		for progress[i].Load() < before[i]+40 {
			select {
			case err := <-errs:
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatalf("client %d made no progress after the restart (%d rounds)", i, progress[i].Load())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, fsys := range fsyses {
		if fsys.Recoveries.Load() == 0 {
			t.Errorf("client %d never recovered", i)
		}
	}

	// The new incarnation: handles and sessions of the old one are dead.
	fresh := rawDial(t, cfg)
	if proto.IncarnationOf(fresh.hello.Session) == proto.IncarnationOf(old.hello.Session) {
		t.Fatalf("session %#x after the restart is of the same incarnation as %#x", fresh.hello.Session, old.hello.Session)
	}
	if e := fresh.readErr(t, oldHandle); e != syscall.EBADF {
		t.Errorf("a session of the new incarnation reading the old session's handle: %v, want EBADF", e)
	}
	freshHandle := fresh.open(t, "raw-new")
	if proto.IncarnationOf(freshHandle) == proto.IncarnationOf(oldHandle) {
		t.Errorf("handle %#x of the new incarnation carries the old incarnation (%#x)", freshHandle, oldHandle)
	}
	if e := old.readErr(t, oldHandle); e != syscall.ESTALE {
		t.Errorf("the old IO session reading its old handle: %v, want ESTALE", e)
	}
	if e := old.readErr(t, freshHandle); e != syscall.ESTALE {
		t.Errorf("the old IO session reading a handle of the new incarnation: %v, want ESTALE", e)
	}
	if e := fresh.readErr(t, freshHandle); e != 0 {
		t.Errorf("the new session cannot read its own handle: %v", e)
	}
	// The old IO session cannot attach to a session that is not its
	// process's either.
	att := proto.AttachReq{Version: fresh.hello.Version, Session: fresh.hello.Session, Token: [32]byte{1}}
	if c := rawDo(t, old.data, proto.OpAttach, 0, 0, att.Append(nil), nil); !errors.Is(c.Err(), syscall.EPERM) {
		t.Errorf("the old IO session attaching with a forged token: %+v", c)
	}
}

// startPair runs NATS (admitting the stack's users) and the metadata and
// IO services of cfg as processes; extra flags go to both services.
func startPair(t *testing.T, cfg *config.Config, extra ...string) (url string, md, io *serviceProc) {
	t.Helper()
	url, md, io, _ = startTrio(t, cfg, extra...)
	return url, md, io
}

// startTrio starts the services of cfg as processes, as weir up does, on
// an embedded NATS server of the test: metadata, io and, when cfg runs
// one, the journal service (nil otherwise).
func startTrio(t *testing.T, cfg *config.Config, extra ...string) (url string, md, io, jr *serviceProc) {
	t.Helper()
	exe := buildWeir(t)
	users, err := stack.Users(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := control.StartEmbedded(control.EmbeddedOptions{Listen: config.DefaultNATSListen, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	md = startService(t, exe, "metadata", cfg, srv.URL(), extra...)
	io = startService(t, exe, "io", cfg, srv.URL(), extra...)
	if stack.JournalEnabled(cfg) {
		jr = startService(t, exe, "journal", cfg, srv.URL(), extra...)
	}
	return srv.URL(), md, io, jr
}

// dataDigest maps every file under dir to its contents' digest.
func dataDigest(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			m[path] = fmt.Sprintf("dir %v", fi.Mode())
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		m[path] = fmt.Sprintf("%v %x", fi.Mode(), sha256.Sum256(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// weirCheck runs `weir check` on cfg's stopped data directory and returns
// its exit code and JSON report.
func weirCheck(t *testing.T, cfg *config.Config, args ...string) (int, fsck.Report, string) {
	t.Helper()
	cmd := exec.Command(buildWeir(t), append([]string{"check", "--json", "--data", cfg.DataDir, "--log-level", "error"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var r fsck.Report
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		t.Fatalf("weir check printed %q (%s): %v", out, stderr.String(), jerr)
	}
	return code, r, stderr.String()
}

// TestDeleteSurvivesCrash: a Remove acknowledged while the IO service is
// stopped (SIGSTOP), then io and metadata killed, must not leak the blob:
// the pending delete is durable, `weir check` of the stopped directory
// notes it (and changes nothing on disk), and after one clean restart the
// blob is gone and the check is clean.
func TestDeleteSurvivesCrash(t *testing.T) {
	cfg := testConfig(t)
	url, md, io := startPair(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if err := fsys.WriteFile("doomed", bytes.Repeat([]byte("x"), 10000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile("kept", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	io.pause(t)
	if err := fsys.Remove("doomed"); err != nil {
		t.Fatalf("remove while io is stopped: %v", err)
	}
	io.kill(t)
	md.kill(t)

	// The stopped directory: the delete is pending, not leaked; the check
	// writes nothing.
	before := dataDigest(t, cfg.DataDir)
	code, r, errOut := weirCheck(t, cfg)
	if code != 0 || !r.OK() {
		t.Fatalf("weir check after the crash: exit %d %+v %s", code, r, errOut)
	}
	notes := 0
	for _, p := range r.Problems {
		if p.Kind == "pending-delete" && p.Note {
			notes++
		}
	}
	if notes != 1 {
		t.Errorf("weir check after the crash: %+v, want one pending-delete note", r.Problems)
	}
	if after := dataDigest(t, cfg.DataDir); !maps.Equal(before, after) {
		t.Errorf("weir check changed the data directory:\nbefore %v\nafter  %v", before, after)
	}

	// One clean restart finishes the delete.
	exe := buildWeir(t)
	md = startService(t, exe, "metadata", cfg, url)
	io = startService(t, exe, "io", cfg, url)
	cli, err := stack.Connect(cfg, url, control.RoleCLI, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, err := control.Status(ctx, cli, cfg.NATS.Namespace, stack.ServiceNames(nil)...)
		if err != nil {
			t.Fatal(err)
		}
		done := false
		for _, s := range st {
			if s.Name == "weir-metadata" && fmt.Sprint(s.Stats["deletes_pending"]) == "0" {
				done = true
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pending delete did not finish after the restart: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	md.stop()
	io.stop()
	code, r, errOut = weirCheck(t, cfg)
	if code != 0 || len(r.Problems) != 0 || r.Files != 1 || r.Blobs != 1 {
		t.Fatalf("weir check after one clean restart: exit %d %+v %s", code, r, errOut)
	}
}

// TestDeadIONoticedAtOnce: with a request timeout of an hour, closes (each
// a revocation at io) sent while io is stopped (SIGSTOP: the requests are
// delivered, nobody answers) return as soon as io is killed: the metadata
// service learns of io's death from their service session and cancels the
// requests in flight, instead of waiting for their answers. (The test's
// own deadline only catches a hang.)
func TestDeadIONoticedAtOnce(t *testing.T) {
	cfg := testConfig(t)
	path := filepath.Join(t.TempDir(), "weir.hcl")
	if err := os.WriteFile(path, []byte("nats {\n  request_timeout = \"1h\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, io := startPair(t, cfg, "--config", path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket, RecoverTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	var files []*client.File
	for i := range 8 {
		f, err := fsys.Create(fmt.Sprintf("f%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("granted")); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	io.pause(t)
	done := make(chan error, len(files))
	for _, f := range files {
		go func() { done <- f.Close() }()
	}
	time.Sleep(100 * time.Millisecond) // let the revocations reach the stopped io
	select {
	case err := <-done:
		t.Fatalf("a close returned (%v) while io was stopped: its revocation cannot have been answered", err)
	default:
	}
	io.kill(t)
	for range files {
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, syscall.EIO) {
				t.Errorf("close after io died: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("a close after io died waited for the request timeout")
		}
	}
	// Opening with O_TRUNC needs io at once, and fails at once too.
	if _, err := fsys.OpenFile("f0", os.O_RDWR|os.O_TRUNC, 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("open with O_TRUNC while io is dead: %v, want EIO", err)
	}
}
