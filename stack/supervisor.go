package stack

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
)

// NATSURLFile in the run directory tells `weir status` where NATS is.
const NATSURLFile = "nats.url"

// UpLockFile in the data directory is flocked by the supervisor (weir up)
// that runs the stack, and holds its pid: taken before any run file is
// touched, released once every service it started is gone.
const UpLockFile = "up.LOCK"

// ErrUpRunning: another supervisor runs the stack of the data directory.
var ErrUpRunning = errors.New("another weir up runs this stack")

// ErrInterrupted: a signal on Supervisor.Interrupt ended Start; Stop
// stops what it started.
var ErrInterrupted = errors.New("stopped by a signal during the start")

// child is a service process started by the supervisor.
type child struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been waited for
	err    error         // cmd.Wait's result; read only after exited
	ready  bool          // it said it is ready (set by startChild, before Stop)
}

// Supervisor runs embedded NATS (unless the configuration names a server)
// and each service as a child process of Exe (the weir binary), the way
// `weir up` does.
type Supervisor struct {
	// Config must be what ConfigPath and the override flags (--data,
	// --log-level, --log-format) yield: the services rebuild their
	// configuration from those, not from this value.
	Config     *config.Config
	ConfigPath string       // passed to the services with --config; may be empty
	Exe        string       // the weir binary; empty = this executable
	Log        hclog.Logger // must not be nil
	// Out receives the services' standard output and error; nil = os.Stderr.
	Out io.Writer
	// Interrupt, if set, stops the supervisor: a signal on it ends Start
	// at once (ErrInterrupted: call Stop, which stops what it started) and
	// makes Wait return nil. The caller registers it (signal.Notify)
	// before Start, so that no moment of the start is left to a signal's
	// default action (which would leave the services without their
	// supervisor, holding their locks until they notice). Nil: Wait
	// listens for SIGINT and SIGTERM itself.
	Interrupt <-chan os.Signal

	nats     *control.Embedded
	url      string
	kids     []*child
	lock     *os.File // the data directory's UpLockFile, flocked; nil before Start took it
	wroteURL bool     // NATSURLFile is this supervisor's, to remove at Stop
}

// URL is the NATS server the services use (valid after Start).
func (s *Supervisor) URL() string { return s.url }

// PIDs maps each running service's name to its process id.
func (s *Supervisor) PIDs() map[string]int {
	m := map[string]int{}
	for _, k := range s.kids {
		m[k.name] = k.cmd.Process.Pid
	}
	return m
}

// Start brings up NATS and the services in the registry's order, each
// ready before the next starts. It creates the stack's credentials if
// there are none; the embedded server admits only them, and an external
// one must refuse connections without credentials, or Start refuses it.
func (s *Supervisor) Start() error {
	creds, err := Prepare(s.Config, s.Log)
	if err != nil {
		return err
	}
	if s.lock, err = lockUp(s.Config.DataDir); err != nil {
		return err
	}
	if err := s.interrupted("NATS"); err != nil {
		return err
	}
	s.url = s.Config.NATS.URL
	if s.url == "" {
		e, err := control.StartEmbedded(control.EmbeddedOptions{Listen: s.Config.NATS.Listen,
			Users: creds.Users(s.Config.NATS.Namespace), Logger: s.Log.Named("nats")})
		if err != nil {
			return err
		}
		s.nats, s.url = e, e.URL()
	} else if err := CheckServerAuth(s.url, s.Config.NATS.ConnectTimeout); err != nil {
		return err
	}
	s.wroteURL = true
	if err := os.WriteFile(filepath.Join(s.Config.RunDir, NATSURLFile), []byte(s.url+"\n"), 0o644); err != nil {
		return fmt.Errorf("record NATS URL: %w", err)
	}
	for _, spec := range Services(s.Config) {
		if err := s.interrupted(spec.Name); err != nil {
			return err
		}
		if err := s.startChild(spec.Name); err != nil {
			return err
		}
	}
	return nil
}

// interrupted is ErrInterrupted if a signal is waiting on Interrupt
// before what starts next.
func (s *Supervisor) interrupted(next string) error {
	select {
	case sig := <-s.Interrupt:
		return fmt.Errorf("%w (%v, before %s started)", ErrInterrupted, sig, next)
	default:
		return nil
	}
}

func (s *Supervisor) startChild(name string) error {
	exe := s.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	args := []string{name, "--ready-fd", "3", "--nats-url", s.url,
		"--" + config.FlagNATSNS, s.Config.NATS.Namespace,
		"--" + config.FlagData, s.Config.DataDir, "--" + config.FlagRunDir, s.Config.RunDir,
		"--" + config.FlagLogLevel, s.Config.LogLevel,
		"--" + config.FlagLogFormat, s.Config.LogFormat}
	if s.ConfigPath != "" {
		args = append(args, "--config", s.ConfigPath)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(exe, args...)
	out := s.Out
	if out == nil {
		out = os.Stderr
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{w}
	// If the supervisor dies, so do its services. Each service gets its own
	// process group, so a Ctrl-C at the terminal reaches only weir up,
	// which then stops the services in order; otherwise every process of
	// the terminal's group gets SIGINT at once and io may stop before the
	// metadata service has revoked its grants.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	w.Close()
	k := &child{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() { k.err = cmd.Wait(); close(k.exited) }()
	s.kids = append(s.kids, k)
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("unexpected %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			<-k.exited
			return fmt.Errorf("service %s did not become ready: %v (%s)", name, err, describeExit(k.err))
		}
	case sig := <-s.Interrupt: // (nil: never)
		return fmt.Errorf("%w (%v while %s started)", ErrInterrupted, sig, name)
	case <-time.After(60 * time.Second):
		return fmt.Errorf("service %s not ready after 60s", name)
	}
	k.ready = true
	s.Log.Info("service ready", "service", name, "pid", cmd.Process.Pid)
	return nil
}

// Wait blocks until a signal (clean stop, returns nil) or the death of a
// service (returns an error naming it).
func (s *Supervisor) Wait() error {
	sigs := s.Interrupt
	if sigs == nil {
		own := make(chan os.Signal, 1)
		signal.Notify(own, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(own)
		sigs = own
	}
	died := make(chan *child, len(s.kids))
	for _, k := range s.kids {
		go func() { <-k.exited; died <- k }()
	}
	select {
	case sig := <-sigs:
		s.Log.Info("stopping", "signal", sig.String())
		return nil
	case k := <-died:
		return fmt.Errorf("service %s (pid %d) exited unexpectedly: %s", k.name, k.cmd.Process.Pid, describeExit(k.err))
	}
}

// terminated says the process died of SIGTERM.
func terminated(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

func describeExit(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// Stop stops a service still starting, then the others in the registry's
// stop order (metadata before io: it revokes its grants and records the
// sizes the IO service reports), then NATS, and releases the up lock. It
// returns an error naming every service that did not stop cleanly: one
// that exited with a non-zero status or had to be killed (one killed by
// the SIGTERM before it was ready is not). A service already gone before
// Stop is Wait's to report, not Stop's.
func (s *Supervisor) Stop() error {
	var errs []error
	// A service still starting (a Start that a signal or a failure ended)
	// goes first: it may be waiting for those before it (io for the
	// metadata service's resync), which stop after it.
	var order []*child
	for _, k := range s.kids {
		if !k.ready {
			order = append(order, k)
		}
	}
	for _, spec := range StopOrder(s.Config) {
		if k := s.kid(spec.Name); k != nil && k.ready {
			order = append(order, k)
		}
	}
	for _, k := range order {
		select {
		case <-k.exited:
			continue // already gone
		default:
		}
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.exited:
			if k.err != nil && !(!k.ready && terminated(k.err)) { // (one not ready yet may die of it before it listens)
				s.Log.Warn("service stopped with an error", "service", k.name, "status", describeExit(k.err))
				errs = append(errs, fmt.Errorf("service %s stopped with %s", k.name, describeExit(k.err)))
			}
		case <-time.After(ShutdownTimeout + 5*time.Second):
			s.Log.Error("service did not stop; killing it", "service", k.name)
			_ = k.cmd.Process.Kill()
			<-k.exited
			errs = append(errs, fmt.Errorf("service %s did not stop within %v and was killed", k.name, ShutdownTimeout+5*time.Second))
		}
	}
	if s.nats != nil {
		s.nats.Shutdown()
	}
	if s.wroteURL {
		_ = os.Remove(filepath.Join(s.Config.RunDir, NATSURLFile))
		s.wroteURL = false
	}
	if s.lock != nil {
		_ = s.lock.Close() // (every service it started is gone: the next weir up may start)
		s.lock = nil
	}
	return errors.Join(errs...)
}

// lockUp takes the up lock of the data directory dir (UpLockFile) and
// writes this process's pid into it; ErrUpRunning, naming the holder's
// pid, if another process holds it.
func lockUp(dir string) (*os.File, error) {
	name := filepath.Join(dir, UpLockFile)
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("up lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(b))
			if _, perr := strconv.Atoi(pid); perr != nil {
				pid = "unknown"
			}
			return nil, fmt.Errorf("%w (pid %s holds %s): its services and run files are left as they are", ErrUpRunning, pid, name)
		}
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("up lock %s: %w", name, err)
	}
	return f, nil
}

func (s *Supervisor) kid(name string) *child {
	for _, k := range s.kids {
		if k.name == name {
			return k
		}
	}
	return nil
}

// Announce prints where clients connect.
func (s *Supervisor) Announce() {
	fmt.Printf("weir is up (data %s)\n", s.Config.DataDir)
	fmt.Printf("  metadata socket  %s\n", s.Config.Metadata.Socket)
	fmt.Printf("  io socket        %s\n", s.Config.IO.Socket)
	fmt.Printf("  nats             %s\n", s.url)
	for _, k := range s.kids {
		fmt.Printf("  %-16s pid %d\n", k.name, k.cmd.Process.Pid)
	}
}
