package stack_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/stack"
)

// upProc is a `weir up` process of a test, in a process group of its own.
type upProc struct {
	cmd    *exec.Cmd
	logs   *syncBuffer
	out    *syncBuffer
	exited chan struct{} // closed once waited for; then err is set
	err    error
}

// syncBuffer is a bytes.Buffer that a process's output and the test share.
type syncBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.String()
}

// startUp starts `weir up --data data` and returns at once.
func startUp(t *testing.T, exe, data string) *upProc {
	t.Helper()
	p := &upProc{logs: newSyncBuffer(), out: newSyncBuffer(), exited: make(chan struct{})}
	p.cmd = exec.Command(exe, "up", "--data", data)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	})
	return p
}

// waitUp waits until the process printed "weir is up".
func (p *upProc) waitUp(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(p.out.String(), "weir is up"); time.Sleep(5 * time.Millisecond) {
		select {
		case <-p.exited:
			t.Fatalf("weir up exited (%v) before it was up\n%s", p.err, p.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("weir up not up after 60 s\n%s", p.logs)
		}
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *upProc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("weir up still running after %v\n%s", within, p.logs)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0
}

// TestSecondUpLeavesTheRunningStack: a second `weir up` on the data
// directory of a running one fails (exit 1, saying so) and touches none
// of the running stack's run files: nats.url still names its NATS, and
// `weir status` of the stack still answers.
func TestSecondUpLeavesTheRunningStack(t *testing.T) {
	exe := buildWeir(t)
	data := filepath.Join(t.TempDir(), "data")
	first := startUp(t, exe, data)
	first.waitUp(t)
	cfg, err := stack.LocalConfig(data, "")
	if err != nil {
		t.Fatal(err)
	}
	urlFile := filepath.Join(cfg.RunDir, stack.NATSURLFile)
	url, err := os.ReadFile(urlFile)
	if err != nil {
		t.Fatal(err)
	}
	second := startUp(t, exe, data)
	if code := second.wait(t, 60*time.Second); code != 1 {
		t.Errorf("the second weir up exited %d, want 1\n%s", code, second.logs)
	}
	if !strings.Contains(second.logs.String(), "another weir up") {
		t.Errorf("the second weir up did not say another runs the stack:\n%s", second.logs)
	}
	if got, err := os.ReadFile(urlFile); err != nil || !bytes.Equal(got, url) {
		t.Errorf("%s after the second weir up: %q %v, want %q", urlFile, got, err, url)
	}
	if out, err := exec.Command(exe, "status", "--data", data).CombinedOutput(); err != nil {
		t.Errorf("weir status of the running stack after the second weir up: %v\n%s", err, out)
	}
	if err := syscall.Kill(first.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := first.wait(t, 60*time.Second); code != 0 {
		t.Errorf("the first weir up exited %d after SIGTERM\n%s", code, first.logs)
	}
	if _, err := os.Stat(urlFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after the stack stopped: %v, want it gone", urlFile, err)
	}
}

// TestUpStopsAtASignalDuringStart: SIGTERM to `weir up` at each point of
// its start (NATS up, io half started, each service ready, and once it is
// up) stops whatever it started, and weir up exits 0 (a stop asked for);
// no service it started is left running, and a new `weir up` on the same
// data directory starts.
func TestUpStopsAtASignalDuringStart(t *testing.T) {
	exe := buildWeir(t)
	for _, at := range []string{"embedded nats ready", "service=metadata", "file backend ready", "staging log made",
		"service=io", "service=journal", "weir is up"} {
		t.Run(strings.ReplaceAll(at, " ", "_"), func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			p := startUp(t, exe, data)
			for deadline := time.Now().Add(60 * time.Second); !strings.Contains(p.logs.String()+p.out.String(), at); time.Sleep(time.Millisecond) {
				select {
				case <-p.exited:
					t.Fatalf("weir up exited (%v) before %q\n%s", p.err, at, p.logs)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("no %q from weir up after 60 s\n%s", at, p.logs)
				}
			}
			if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t, 60*time.Second); code != 0 {
				t.Errorf("weir up exited %d after SIGTERM at %q, want 0\n%s", code, at, p.logs)
			}
			for _, pid := range servicePIDs(p.logs.String()) {
				if err := syscall.Kill(pid, 0); err == nil {
					t.Errorf("service pid %d still runs after weir up exited\n%s", pid, p.logs)
				}
			}
			next := startUp(t, exe, data)
			next.waitUp(t)
			if err := syscall.Kill(next.cmd.Process.Pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := next.wait(t, 60*time.Second); code != 0 {
				t.Errorf("the next weir up exited %d after SIGTERM\n%s", code, next.logs)
			}
		})
	}
}

// servicePIDs are the pids weir up's log names for the services it
// started ("service ready ... pid=N").
func servicePIDs(logs string) []int {
	var pids []int
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "service ready") {
			continue
		}
		if _, rest, ok := strings.Cut(line, "pid="); ok {
			if pid, err := strconv.Atoi(strings.Fields(rest)[0]); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
