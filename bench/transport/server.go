package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/ring"
)

// serverRoleArg, as the first argument, makes the program the server child
// of one transport. The parent passes it when it re-executes itself; it is
// not among the flags a user sees.
const serverRoleArg = "-role=server"

// readyLine is what the server child prints on stdout once it accepts
// requests.
const readyLine = "ready"

// firstPipeFd is the descriptor of the first pipe the parent passes in
// exec.Cmd.ExtraFiles (after stdin, stdout and stderr).
const firstPipeFd = 3

// serverMain runs the server child and returns the process exit code. It
// serves until its stdin reaches EOF (the parent closed it or died).
func serverMain(args []string) int {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	name := fs.String("transport", "", "transport to serve")
	sock := fs.String("sock", "", "socket path (ring and uds)")
	pipes := fs.Int("pipes", 0, "pipe pairs passed from fd 3 on (pipe)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logger := log.New(os.Stderr, "server "+*name+": ", 0)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	var err error
	switch *name {
	case transportRingBusyPoll:
		err = serveRing(ctx, logger, *sock, ring.WaitBusyPoll)
	case transportRingAdaptive:
		err = serveRing(ctx, logger, *sock, ring.WaitAdaptive)
	case transportUDS:
		err = serveUDS(ctx, logger, *sock, false)
	case transportUDSBlocking:
		err = serveUDS(ctx, logger, *sock, true)
	case transportPipe:
		err = servePipes(ctx, logger, *pipes)
	default:
		err = fmt.Errorf("unknown transport %q", *name)
	}
	if err != nil {
		logger.Print(err)
		return 1
	}
	return 0
}

func announceReady() error {
	if _, err := fmt.Fprintln(os.Stdout, readyLine); err != nil {
		return fmt.Errorf("announce ready: %w", err)
	}
	return nil
}

// conns tracks what a server must close on shutdown.
type conns struct {
	mu   sync.Mutex
	open map[io.Closer]struct{} // protected by mu
	wg   sync.WaitGroup
}

func newConns() *conns { return &conns{open: make(map[io.Closer]struct{})} }

// serve runs fn for c on its own goroutine and closes c when fn returns.
func (cs *conns) serve(c io.Closer, fn func() error, logger *log.Logger) {
	cs.mu.Lock()
	cs.open[c] = struct{}{}
	cs.mu.Unlock()
	cs.wg.Add(1)
	go func() {
		defer cs.wg.Done()
		if err := fn(); err != nil {
			logger.Print(err)
		}
		cs.mu.Lock()
		delete(cs.open, c)
		cs.mu.Unlock()
		_ = c.Close()
	}()
}

// closeAll closes every open connection and waits for its goroutine.
func (cs *conns) closeAll() {
	cs.mu.Lock()
	open := slices.Collect(maps.Keys(cs.open))
	cs.mu.Unlock()
	for _, c := range open {
		_ = c.Close()
	}
	cs.wg.Wait()
}

// ringConn adapts a ring session to io.Closer.
type ringConn struct{ *ring.ServerConn }

func (c ringConn) Close() error { c.ServerConn.Close(); return nil }

func serveRing(ctx context.Context, logger *log.Logger, sock string, mode ring.WaitMode) error {
	l, err := ring.Listen(sock, ring.DefaultConfig())
	if err != nil {
		return fmt.Errorf("listen %s: %w", sock, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()
	if err := announceReady(); err != nil {
		_ = l.Close()
		return err
	}
	mux := ring.NewMux()
	cs := newConns()
	defer cs.closeAll()
	for {
		sc, err := l.Accept(ctx, mux, mode)
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			logger.Printf("accept: %v", err)
			continue
		}
		cs.serve(ringConn{sc}, func() error {
			if err := sc.Serve(); err != nil && !errors.Is(err, ring.ErrPeerGone) {
				return fmt.Errorf("ring session: %w", err)
			}
			return nil
		}, logger)
	}
}

// serveUDS serves each connection on its own goroutine. With blocking, the
// goroutine does blocking system calls on the socket instead of using the
// runtime's netpoller.
func serveUDS(ctx context.Context, logger *log.Logger, sock string, blocking bool) error {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen %s: %w", sock, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()
	if err := announceReady(); err != nil {
		_ = l.Close()
		return err
	}
	cs := newConns()
	defer cs.closeAll()
	for {
		conn, err := l.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		if !blocking {
			cs.serve(conn, func() error { return serveStream(conn, conn) }, logger)
			continue
		}
		s, err := blockingStream(conn)
		if err != nil {
			logger.Print(err)
			continue
		}
		// The tracked closer only shuts the socket down, and only while
		// the serving goroutine has not released the descriptor: once it
		// is closed its number may belong to a new connection.
		bc := &blockingConn{s: s}
		cs.serve(bc, func() error {
			defer bc.release()
			return serveStream(s, s)
		}, logger)
	}
}

// blockingStream takes conn's socket out of the netpoller: it duplicates
// the descriptor, closes conn and puts the socket in blocking mode.
func blockingStream(conn *net.UnixConn) (fdStream, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		_ = conn.Close()
		return -1, fmt.Errorf("socket descriptor: %w", err)
	}
	fd := -1
	var derr error
	if err := raw.Control(func(c uintptr) { fd, derr = unix.FcntlInt(c, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		derr = err
	}
	_ = conn.Close()
	if derr != nil {
		return -1, fmt.Errorf("duplicate socket descriptor: %w", derr)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("make socket blocking: %w", err)
	}
	return fdStream(fd), nil
}

// blockingConn is a blocking socket served by one goroutine. Close wakes
// that goroutine (shutdown); release, called by the goroutine when done,
// closes the descriptor. The mutex keeps a shutdown from reaching a
// descriptor number that was closed and reused.
type blockingConn struct {
	s        fdStream
	mu       sync.Mutex
	released bool // protected by mu
}

func (c *blockingConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.released {
		c.s.shutdown()
	}
	return nil
}

func (c *blockingConn) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = true
	_ = c.s.Close()
}

// pipeServer is the server end of one pipe pair.
type pipeServer struct{ req, resp *os.File }

func (p pipeServer) Close() error { return errors.Join(p.req.Close(), p.resp.Close()) }

func servePipes(ctx context.Context, logger *log.Logger, n int) error {
	if n <= 0 {
		return errors.New("no pipes passed")
	}
	cs := newConns()
	defer cs.closeAll()
	for i := range n {
		p, err := openPipeServer(firstPipeFd + 2*i)
		if err != nil {
			return err
		}
		cs.serve(p, func() error { return serveStream(p.req, p.resp) }, logger)
	}
	if err := announceReady(); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// openPipeServer wraps the inherited descriptors fd (requests in) and fd+1
// (answers out). They are made non-blocking first so that they use the
// runtime poller, as the socket does.
func openPipeServer(fd int) (pipeServer, error) {
	for _, f := range []int{fd, fd + 1} {
		if err := syscall.SetNonblock(f, true); err != nil {
			return pipeServer{}, fmt.Errorf("pipe fd %d: set non-blocking: %w", f, err)
		}
	}
	return pipeServer{
		req:  os.NewFile(uintptr(fd), fmt.Sprintf("request-pipe-%d", fd)),
		resp: os.NewFile(uintptr(fd+1), fmt.Sprintf("answer-pipe-%d", fd+1)),
	}, nil
}

// serveStream answers frames from r on w until r reaches EOF: the handler
// the socket and pipe transports share. An echo's payload is read into
// server memory and written back from it.
func serveStream(r io.Reader, w io.Writer) error {
	buf := make([]byte, frameBufLen)
	for {
		op, payload, err := readFrame(r, buf)
		if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read request: %w", err)
		}
		var n int
		switch op {
		case opNop:
		case opEcho:
			n = len(payload)
		default:
			return fmt.Errorf("unknown op %d", op)
		}
		putFrameHeader(buf, op, uint32(n))
		if _, err := w.Write(buf[:frameHeaderLen+n]); err != nil {
			if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("write answer: %w", err)
		}
	}
}
