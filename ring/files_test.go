package ring

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func tempFile(t *testing.T, content string) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestSendFile(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Out of order, and one tag never taken.
	for tag, s := range map[uint64]string{7: "seven", 3: "three", 9: "nine"} {
		if err := e.srv.SendFile(tag, tempFile(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		tag  uint64
		want string
	}{{3, "three"}, {7, "seven"}} {
		f, err := e.cli.ReceiveFile(ctx, tc.tag)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(io.NewSectionReader(f, 0, 100))
		f.Close()
		if err != nil || string(b) != tc.want {
			t.Fatalf("tag %d: %q %v, want %q", tc.tag, b, err, tc.want)
		}
	}
	// A tag that never comes: the wait ends with ctx.
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := e.cli.ReceiveFile(short, 11); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("missing tag: %v", err)
	}
	// The session still works, and files keep coming.
	if c, err := e.cli.Do(ctx, &Call{Op: OpNop}); err != nil || c.Result != 0 {
		t.Fatalf("nop after files: %+v %v", c, err)
	}
	// Past MaxPendingFiles untaken files the oldest are closed: the client
	// holds a bounded number of fds whatever the server sends.
	before := countFDs(t)
	for i := range MaxPendingFiles + 20 {
		if err := e.srv.SendFile(uint64(100+i), tempFile(t, "x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.cli.ReceiveFile(ctx, uint64(100+MaxPendingFiles+19)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.ReceiveFile(short, 100); err == nil {
		t.Fatal("the oldest untaken file is still held past the bound")
	}
	// tempFile's own fds are this process's too: count only the client's.
	if got := countFDs(t) - before - (MaxPendingFiles + 20); got > MaxPendingFiles+1 {
		t.Fatalf("the client holds %d received fds, bound %d", got, MaxPendingFiles)
	}
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A server that writes anything but file messages on the socket ends the
// session: the client fails its calls with ErrPeerGone and its waits for
// files with an error.
func TestMalformedFileMessageEndsSession(t *testing.T) {
	for name, frame := range map[string][]byte{
		"short":        {1, 2, 3},
		"bad magic":    make([]byte, fileLen),
		"no fd":        append([]byte{0x57, 0x52, 0x46, 0x31}, make([]byte, 12)...),
		"reserved set": append([]byte{0x57, 0x52, 0x46, 0x31, 1}, make([]byte, 11)...),
	} {
		t.Run(name, func(t *testing.T) {
			e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
			var err error
			if name == "reserved set" {
				// With an fd, so that only the reserved word is wrong.
				f := tempFile(t, "x")
				_, _, err = e.srv.conn.WriteMsgUnix(frame, unix.UnixRights(int(f.Fd())), nil)
			} else {
				_, err = e.srv.conn.Write(frame)
			}
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := e.cli.ReceiveFile(ctx, 1); err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("ReceiveFile after a malformed message: %v", err)
			}
			select {
			case <-e.cli.Done():
			case <-ctx.Done():
				t.Fatal("the session did not end")
			}
			if !errors.Is(e.cli.Err(), ErrPeerGone) {
				t.Fatalf("client error %v, want ErrPeerGone", e.cli.Err())
			}
		})
	}
}

// A client that never reads its socket cannot make the server queue files
// without bound: SendFile refuses once the socket's send queue is full.
func TestSendFileToClientThatDoesNotRead(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "s")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	sconn, cconn := conn(fds[0]), conn(fds[1])
	defer cconn.Close()
	done := make(chan *ServerConn, 1)
	go func() {
		sc, err := NewServerConn(context.Background(), sconn, smallCfg(), NewMux(), WaitAdaptive)
		if err != nil {
			t.Error(err)
		}
		done <- sc
	}()
	r, err := ClientHandshake(context.Background(), cconn) // a raw client: it never reads again
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sc := <-done
	if sc == nil {
		return
	}
	defer sc.Close()
	f := tempFile(t, "x")
	for i := range 100000 {
		err := sc.SendFile(uint64(i), f)
		if errors.Is(err, ErrSocketFull) {
			t.Logf("refused after %d files: %v", i, err)
			return
		}
		if err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
	}
	t.Fatal("100,000 files queued to a client that reads none")
}

// panicServer serves a session whose async handler panics while another
// async request is in flight: the process must crash, not hang in Serve
// waiting for the request the panic left unfinished.
func panicServer() {
	mux := NewMux()
	mux.HandleAsync(opAsyncPark, func(q *Request, done func(int64, uint64)) {}) // never done
	mux.Handle(opXor, func(q *Request) (int64, uint64) { panic("handler bug") })
	srv, cli, err := Pipe(smallCfg(), mux, WaitAdaptive, ClientOptions{})
	if err != nil {
		os.Exit(3)
	}
	go srv.Serve()
	ctx := context.Background()
	go cli.Do(ctx, &Call{Op: opAsyncPark})
	time.Sleep(50 * time.Millisecond)
	go cli.Do(ctx, &Call{Op: opXor})
	time.Sleep(5 * time.Second)
	os.Exit(0) // still alive: the panic was swallowed
}

func TestHandlerPanicCrashesNotHangs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=panic")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "handler bug") {
		t.Fatalf("a server whose handler panics: %v after %v (want the panic's exit 2)\n%s", err, time.Since(start), stderr.String())
	}
}
