package ring

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	// envHold makes the peer start a grandchild ("sleep") that inherits
	// its end of the session socket, so the socket stays open when the
	// peer dies and only the pidfd can tell the survivor. The peer then
	// prints "ready <grandchild pid>".
	envHold = "WEIR_RING_TEST_HOLD"
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
	case "panic":
		panicServer()
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
	hold := os.Getenv(envHold) != ""
	ready := make(chan int, 1)
	go func() {
		h := newTestHandler()
		for {
			conn, err := l.AcceptUnix()
			if err != nil {
				return
			}
			holder := 0
			if hold {
				if holder, err = holdSocket(conn); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
			}
			sc, err := NewServerConn(context.Background(), conn, smallCfg(), h, peerMode())
			if err != nil {
				continue
			}
			go func() { sc.Serve(); sc.Close() }()
			if hold {
				ready <- holder
			}
		}
	}()
	if hold {
		// The test dials after "listening" and waits for "ready".
		fmt.Println("listening")
		fmt.Printf("ready %d\n", <-ready)
	} else {
		fmt.Println("ready")
	}
	io.Copy(io.Discard, os.Stdin)
	l.Close()
	return 0
}

// holdSocket starts a grandchild that inherits conn's descriptor and sleeps.
func holdSocket(conn *net.UnixConn) (int, error) {
	f, err := conn.File() // a dup; the grandchild inherits it
	if err != nil {
		return 0, err
	}
	defer f.Close()
	cmd := exec.Command("sleep", "600")
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start socket holder: %w", err)
	}
	return cmd.Process.Pid, nil
}

// peerClient connects, proves the session works, then puts a request
// (opSleep of 50 ms) in flight and waits to be killed: the server answers
// a client that is already dead.
func peerClient() int {
	conn, err := net.Dial("unix", os.Getenv(envSock))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ready := "ready"
	if os.Getenv(envHold) != "" {
		holder, err := holdSocket(conn.(*net.UnixConn))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ready = fmt.Sprintf("ready %d", holder)
	}
	c, err := NewClientConn(context.Background(), conn.(*net.UnixConn), ClientOptions{Mode: peerMode()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := c.Do(context.Background(), &Call{Op: OpNop}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go c.Do(context.Background(), &Call{Op: opSleep, Arg: 50})
	fmt.Println(ready)
	io.Copy(io.Discard, os.Stdin)
	c.Close()
	return 0
}

type peerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	sock  string
}

// startPeer runs this test binary as role and waits for its ready line.
func startPeer(t *testing.T, role, sock string, mode WaitMode) *peerProc {
	t.Helper()
	p := spawnPeer(t, role, sock, mode, false)
	p.expect(t, "ready")
	return p
}

// spawnPeer starts this test binary as role without waiting for it; with
// hold, the peer's session socket is also held open by a grandchild.
func spawnPeer(t *testing.T, role, sock string, mode WaitMode, hold bool) *peerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role, envSock+"="+sock, envMode+"="+mode.String())
	if hold {
		cmd.Env = append(cmd.Env, envHold+"=1")
	}
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
	p := &peerProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout), sock: sock}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return p
}

// expect reads the peer's next line, which must be word or start with
// word and a space; it returns the rest.
func (p *peerProc) expect(t *testing.T, word string) string {
	t.Helper()
	line, err := p.out.ReadString('\n')
	line = strings.TrimSpace(line)
	if err != nil || (line != word && !strings.HasPrefix(line, word+" ")) {
		t.Fatalf("peer: got %q (%v), want %q", line, err, word)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, word))
}

// holderPid reads "ready <pid>" and arranges for that grandchild to be killed.
func (p *peerProc) holderPid(t *testing.T) int {
	t.Helper()
	pid, err := strconv.Atoi(p.expect(t, "ready"))
	if err != nil || pid <= 0 {
		t.Fatalf("peer: bad holder pid: %v", err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	return pid
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

// killServerUnderCall SIGKILLs server peer p while a call of c waits for
// its completion; the call must return ErrPeerGone.
func killServerUnderCall(t *testing.T, c *Client, p *peerProc, what string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), &Call{Op: opSleep, Arg: 60_000})
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it park
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := guard(t, done, what); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("%s: %v, want ErrPeerGone", what, err)
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
			killServerUnderCall(t, c, p, "Do with a killed server")
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

// TestCrossProcessPeerKilledSocketHeld: the peer is SIGKILLed but a
// grandchild still holds its end of the session socket, so no EOF comes:
// only the pidfd taken at the handshake can say the peer is gone. Both
// directions: a caller waiting on a dead server, a server serving a dead
// client.
func TestCrossProcessPeerKilledSocketHeld(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skipf("needs the sleep command to hold a socket open: %v", err)
	}
	t.Run("server", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "ring.sock")
		p := spawnPeer(t, "server", sock, WaitAdaptive, true)
		p.expect(t, "listening")
		c, err := Dial(context.Background(), sock, ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		p.holderPid(t)
		killServerUnderCall(t, c, p, "Do with a killed server whose socket is held")
	})
	t.Run("client", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "ring.sock")
		l, err := Listen(sock, smallCfg())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		served := make(chan error, 1)
		go func() {
			sc, err := l.Accept(context.Background(), newTestHandler(), WaitAdaptive)
			if err != nil {
				served <- err
				return
			}
			served <- sc.Serve()
			sc.Close()
		}()
		p := spawnPeer(t, "client", sock, WaitAdaptive, true)
		p.holderPid(t)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := guard(t, served, "Serve with a killed client whose socket is held"); !errors.Is(err, ErrPeerGone) {
			t.Fatalf("Serve: %v, want ErrPeerGone", err)
		}
	})
}
