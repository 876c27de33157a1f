package ring

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Cross-process tests re-execute this test binary as the peer. The peer's
// role comes from the environment; it prints "ready" on stdout when it can
// be talked to and exits when its stdin closes (or when it is killed).
const (
	envRole = "WEIR_RING_TEST_ROLE"
	envSock = "WEIR_RING_TEST_SOCK"
	envMode = "WEIR_RING_TEST_MODE"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "":
		flag.Parse()
		os.Exit(m.Run())
	case "server":
		os.Exit(peerServer())
	case "client":
		os.Exit(peerClient())
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", envRole, os.Getenv(envRole))
		os.Exit(2)
	}
}

func peerMode() WaitMode {
	m, err := ParseWaitMode(os.Getenv(envMode))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return m
}

func peerServer() int {
	l, err := Listen(os.Getenv(envSock), smallCfg())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		h := newTestHandler()
		for {
			sc, err := l.Accept(context.Background(), h, peerMode())
			if err != nil {
				return
			}
			go func() { sc.Serve(); sc.Close() }()
		}
	}()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	l.Close()
	return 0
}

// peerClient connects, proves the session works, then puts a request
// (opSleep of 50 ms) in flight and waits to be killed: the server answers
// a client that is already dead.
func peerClient() int {
	c, err := Dial(context.Background(), os.Getenv(envSock), ClientOptions{Mode: peerMode()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := c.Do(context.Background(), &Call{Op: OpNop}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go c.Do(context.Background(), &Call{Op: opSleep, Arg: 50})
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	c.Close()
	return 0
}

type peerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	sock  string
}

// startPeer runs this test binary as role and waits for its ready line.
func startPeer(t *testing.T, role, sock string, mode WaitMode) *peerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role, envSock+"="+sock, envMode+"="+mode.String())
	cmd.Stderr = os.Stderr
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
	p := &peerProc{cmd: cmd, stdin: stdin, sock: sock}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("peer %s: %q %v", role, line, err)
	}
	return p
}

func TestCrossProcessEcho(t *testing.T) {
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "ring.sock")
			startPeer(t, "server", sock, mode)
			c, err := Dial(context.Background(), sock, ClientOptions{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			seed := testSeed(t)
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := newRand(seed, g)
					for i := range 150 {
						if err := stressOne(c, rng); err != nil {
							t.Errorf("goroutine %d op %d: %v", g, i, err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// TestCrossProcessServerKilled: SIGKILL the server while a caller waits for
// a completion (parked on the futex in adaptive mode, spinning in busy-poll
// mode). The caller must get ErrPeerGone, not sleep forever.
func TestCrossProcessServerKilled(t *testing.T) {
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "ring.sock")
			p := startPeer(t, "server", sock, mode)
			c, err := Dial(context.Background(), sock, ClientOptions{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			done := make(chan error, 1)
			go func() {
				_, err := c.Do(context.Background(), &Call{Op: opSleep, Arg: 60_000})
				done <- err
			}()
			time.Sleep(10 * time.Millisecond) // let it park
			if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := guard(t, done, "Do with a killed server"); !errors.Is(err, ErrPeerGone) {
				t.Fatalf("Do: %v, want ErrPeerGone", err)
			}
			if _, err := c.Do(context.Background(), &Call{Op: OpNop}); !errors.Is(err, ErrPeerGone) {
				t.Fatalf("later Do: %v, want ErrPeerGone", err)
			}
		})
	}
}

// TestCrossProcessClientKilled: SIGKILL a client with a request in flight
// and the server idle on its doorbell; the session must end with
// ErrPeerGone and the listener must go on serving others.
func TestCrossProcessClientKilled(t *testing.T) {
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "ring.sock")
			l, err := Listen(sock, smallCfg())
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			h := newTestHandler()
			served := make(chan error, 4)
			go func() {
				for {
					sc, err := l.Accept(context.Background(), h, mode)
					if err != nil {
						return
					}
					go func() { served <- sc.Serve(); sc.Close() }()
				}
			}()
			p := startPeer(t, "client", sock, mode)
			if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := guard(t, served, "Serve with a killed client"); !errors.Is(err, ErrPeerGone) {
				t.Fatalf("Serve: %v, want ErrPeerGone", err)
			}
			c, err := Dial(context.Background(), sock, ClientOptions{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if r, err := c.Do(context.Background(), &Call{Op: OpNop}); err != nil || r.Result != 0 {
				t.Fatalf("after a killed client: %+v %v", r, err)
			}
		})
	}
}
