package ring

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// guard fails the test if ch yields nothing for a long time: a hang is a
// bug, but the bound is generous and not a performance assertion.
func guard[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no result after 30s (hang)", what)
		panic("unreachable")
	}
}

func TestClientCloseWhileRequestInFlight(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	done := make(chan error, 1)
	go func() {
		_, err := e.cli.Do(context.Background(), &Call{Op: opBlock})
		done <- err
	}()
	<-e.h.entered
	e.cli.Close()
	if err := guard(t, done, "Do after Close"); !errors.Is(err, ErrClosed) {
		t.Fatalf("in-flight Do: %v, want ErrClosed", err)
	}
	close(e.h.gate)
	if err := guard(t, e.serveCh, "Serve after client close"); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("Serve: %v, want ErrPeerGone", err)
	}
	if _, err := e.cli.Do(context.Background(), &Call{Op: OpNop}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
	if _, err := e.cli.Alloc(context.Background(), 10); !errors.Is(err, ErrClosed) {
		t.Fatalf("Alloc after Close: %v", err)
	}
}

func TestServerCloseWakesParkedClient(t *testing.T) {
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newPipe(t, smallCfg(), mode, ClientOptions{Mode: mode})
			if _, err := e.cli.Do(context.Background(), &Call{Op: OpNop}); err != nil {
				t.Fatal(err)
			}
			// Stop serving first, so the next request is never answered.
			e.srv.ServerSession.Close()
			done := make(chan error, 1)
			go func() {
				_, err := e.cli.Do(context.Background(), &Call{Op: OpNop})
				done <- err
			}()
			time.Sleep(5 * time.Millisecond) // let the caller park
			e.srv.stop()                     // the socket closes: the client learns the peer went
			if err := guard(t, done, "Do on a closed server"); !errors.Is(err, ErrPeerGone) {
				t.Fatalf("Do: %v, want ErrPeerGone", err)
			}
		})
	}
}

func TestBufferOutlivesClose(t *testing.T) {
	e := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	b, err := e.cli.Alloc(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	e.cli.Close()
	// The mapping stays until the buffer is released.
	b.CopyFrom([]byte("still mapped"))
	out := make([]byte, 12)
	b.CopyTo(out)
	if string(out) != "still mapped" {
		t.Fatalf("got %q", out)
	}
	b.Release()
	b.Release() // twice is harmless
	if _, err := e.cli.Do(context.Background(), &Call{Op: OpEcho, Buf: b}); err == nil {
		t.Fatal("released buffer accepted")
	}
}

func TestCloseBeforeServe(t *testing.T) {
	h := newTestHandler()
	srv, cli, err := Pipe(smallCfg(), h, WaitAdaptive, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if err := srv.Serve(); err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
	if err := srv.ServerSession.Serve(); err == nil {
		t.Fatal("second Serve accepted")
	}
	cli.Close()
	cli.Close()
}

func TestForeignBuffer(t *testing.T) {
	a := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	b := newPipe(t, smallCfg(), WaitAdaptive, ClientOptions{})
	buf, err := b.cli.Alloc(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	if _, err := a.cli.Do(context.Background(), &Call{Op: OpEcho, Buf: buf}); !errors.Is(err, ErrForeignBuffer) {
		t.Fatalf("foreign buffer: %v", err)
	}
}

// socketPair returns two connected Unix stream sockets.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := conv(fds[0]), conv(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func hello(magic uint64) []byte {
	b := make([]byte, helloLen)
	putHello(b, magic)
	return b
}

func refusal(errno uint32) []byte {
	b := make([]byte, helloLen)
	binary.LittleEndian.PutUint64(b, refuseMagic)
	binary.LittleEndian.PutUint32(b[8:], ABIVersion)
	binary.LittleEndian.PutUint32(b[12:], errno)
	return b
}

// TestRefuse: a server that will not serve a peer says why (Refuse); the
// client's handshake fails with that errno, and the socket is closed.
func TestRefuse(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.EAGAIN, syscall.EUSERS} {
		srv, cli := socketPair(t)
		Refuse(srv, e)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := ClientHandshake(ctx, cli)
		cancel()
		if err == nil {
			r.Close()
			t.Fatal("handshake succeeded")
		}
		var re *RefusedError
		if !errors.Is(err, e) || !errors.As(err, &re) || re.Errno != e {
			t.Fatalf("refused with %v: the client got %v", e, err)
		}
		var b [1]byte
		if n, err := cli.Read(b[:]); n != 0 || err == nil {
			t.Fatalf("after a refusal the socket is open: %d, %v", n, err)
		}
	}
}

// TestHandshakeFailures drives each handshake state with a peer that
// misbehaves there. Each side must fail with an error, never hang.
func TestHandshakeFailures(t *testing.T) {
	ctx := context.Background()
	clientCases := []struct {
		name string
		peer func(c *net.UnixConn)
		want string
	}{
		{"server closes before hello", func(c *net.UnixConn) { c.Close() }, "read hello"},
		{"hello without fd", func(c *net.UnixConn) { c.Write(hello(helloMagic)) }, "carried 0 fds"},
		{"bad magic", func(c *net.UnixConn) {
			r, _ := Create(smallCfg())
			c.WriteMsgUnix(hello(ackMagic), unix.UnixRights(int(r.File().Fd())), nil)
			r.Close()
		}, "handshake magic"},
		{"bad version", func(c *net.UnixConn) {
			r, _ := Create(smallCfg())
			m := hello(helloMagic)
			binary.LittleEndian.PutUint32(m[8:], 99)
			c.WriteMsgUnix(m, unix.UnixRights(int(r.File().Fd())), nil)
			r.Close()
		}, "ABI"},
		{"unsealed region", func(c *net.UnixConn) {
			fd, _ := unix.MemfdCreate("x", unix.MFD_CLOEXEC)
			unix.Ftruncate(fd, 1<<20)
			c.WriteMsgUnix(hello(helloMagic), unix.UnixRights(fd), nil)
			unix.Close(fd)
		}, "not sealed"},
		{"corrupt header", func(c *net.UnixConn) {
			r, _ := Create(smallCfg())
			r.mem[offSQEntries] = 3
			c.WriteMsgUnix(hello(helloMagic), unix.UnixRights(int(r.File().Fd())), nil)
			r.Close()
		}, "SQ entries"},
		{"server silent", func(c *net.UnixConn) {}, "read hello"},
		{"refusal without errno", func(c *net.UnixConn) { c.Write(refusal(0)) }, "errno 0"},
		{"refusal past the errnos", func(c *net.UnixConn) { c.Write(refusal(4096)) }, "errno 4096"},
		{"refusal with a fd", func(c *net.UnixConn) {
			r, _ := Create(smallCfg())
			c.WriteMsgUnix(refusal(uint32(syscall.EAGAIN)), unix.UnixRights(int(r.File().Fd())), nil)
			r.Close()
		}, "with 1 fds"},
		{"refusal of another ABI", func(c *net.UnixConn) {
			m := refusal(uint32(syscall.EAGAIN))
			binary.LittleEndian.PutUint32(m[8:], 99)
			c.Write(m)
		}, "ABI"},
	}
	for _, tc := range clientCases {
		t.Run("client/"+tc.name, func(t *testing.T) {
			srv, cli := socketPair(t)
			go tc.peer(srv)
			tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			r, err := ClientHandshake(tctx, cli)
			if err == nil {
				r.Close()
				t.Fatal("handshake succeeded")
			}
			if !mentions(err, tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
	serverCases := []struct {
		name string
		peer func(c *net.UnixConn)
		want string
	}{
		{"client closes", func(c *net.UnixConn) { c.Close() }, "hello|ack"},
		{"client never acks", func(c *net.UnixConn) {}, "ack"},
		{"bad ack", func(c *net.UnixConn) { c.Write(hello(helloMagic)) }, "handshake magic"},
		{"short ack then close", func(c *net.UnixConn) { c.Write([]byte{1, 2, 3}); c.Close() }, "hello|ack"},
	}
	for _, tc := range serverCases {
		t.Run("server/"+tc.name, func(t *testing.T) {
			srv, cli := socketPair(t)
			go tc.peer(cli)
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			r, _, err := ServerHandshake(short, srv, smallCfg())
			if err == nil {
				r.Close()
				t.Fatal("handshake succeeded")
			}
			if !mentions(err, tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// mentions reports whether err's text contains one of the |-separated words.
func mentions(err error, want string) bool {
	for _, w := range strings.Split(want, "|") {
		if strings.Contains(err.Error(), w) {
			return true
		}
	}
	return false
}

func TestListenerReplacesStaleSocket(t *testing.T) {
	path := t.TempDir() + "/s.sock"
	l, err := Listen(path, smallCfg())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, smallCfg()); err == nil {
		t.Fatal("second listener on a live socket accepted")
	}
	// Leave the socket file behind as a crashed server would.
	l.l.SetUnlinkOnClose(false)
	l.Close()
	l2, err := Listen(path, smallCfg())
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer l2.Close()
	h := newTestHandler()
	go func() {
		sc, err := l2.Accept(context.Background(), h, WaitAdaptive)
		if err != nil {
			return
		}
		defer sc.Close()
		sc.Serve()
	}()
	c, err := Dial(context.Background(), path, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r, err := c.Do(context.Background(), &Call{Op: OpNop}); err != nil || r.Result != 0 {
		t.Fatalf("%+v %v", r, err)
	}
}

// Stop ends Serve like Close but leaves the region mapped for its owner,
// whether Serve is running or has not started yet.
func TestStopKeepsRegion(t *testing.T) {
	for _, started := range []bool{true, false} {
		t.Run(fmt.Sprint("serving=", started), func(t *testing.T) {
			srv, cli, err := Pipe(smallCfg(), newTestHandler(), WaitAdaptive, ClientOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			defer srv.Close()
			serveCh := make(chan error, 1)
			if started {
				go func() { serveCh <- srv.Serve() }()
				if _, err := cli.Do(context.Background(), &Call{Op: OpNop}); err != nil {
					t.Fatal(err)
				}
				srv.Stop()
			} else {
				srv.Stop()
				go func() { serveCh <- srv.Serve() }()
			}
			if err := <-serveCh; err != nil {
				t.Fatalf("Serve after Stop: %v", err)
			}
			mem := srv.Region().Bytes()
			if uint64(len(mem)) != srv.Region().Geometry().TotalSize || binary.LittleEndian.Uint64(mem) != Magic {
				t.Fatalf("region after Stop: %d bytes (want %d), magic %#x",
					len(mem), srv.Region().Geometry().TotalSize, binary.LittleEndian.Uint64(mem))
			}
		})
	}
}
