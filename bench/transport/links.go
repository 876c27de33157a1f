package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/ring"
)

// Transports, in the order they are measured and reported.
const (
	transportRingBusyPoll = "ring-busypoll"
	transportRingAdaptive = "ring-adaptive"
	transportUDS          = "uds"
	transportUDSBlocking  = "uds-blocking"
	transportPipe         = "pipe"
)

var allTransports = []string{transportRingBusyPoll, transportRingAdaptive, transportUDS, transportUDSBlocking, transportPipe}

func isRing(transport string) bool {
	return transport == transportRingBusyPoll || transport == transportRingAdaptive
}

// Request ops, the same numbers on every transport.
const (
	opNop  = uint32(ring.OpNop)
	opEcho = uint32(ring.OpEcho)
)

// A link is one client thread's path to the server. roundTrip sends one
// request and waits for its answer: with a payload (an echo) it copies in
// into the request and the answer into out; without one it is a no-op.
// A link is used by one goroutine at a time. Stream links ignore ctx: the
// ctx given to openLinks interrupts them.
type link interface {
	roundTrip(ctx context.Context, in, out []byte) error
}

// openLinks connects threads links to c's server for one configuration.
// Round trips fail once ctx is done. The returned function closes them.
func openLinks(ctx context.Context, c *child, threads, payload int) ([]link, func() error, error) {
	switch c.transport {
	case transportRingBusyPoll:
		return openRing(ctx, c.sock, ring.WaitBusyPoll, threads, payload)
	case transportRingAdaptive:
		return openRing(ctx, c.sock, ring.WaitAdaptive, threads, payload)
	case transportUDS:
		return openUDS(ctx, c.sock, threads)
	case transportUDSBlocking:
		return openBlockingUDS(ctx, c.sock, threads)
	case transportPipe:
		return openPipes(ctx, c.pipes, threads)
	}
	return nil, nil, fmt.Errorf("unknown transport %q", c.transport)
}

// ringLink is one goroutine's use of a Client shared by all of them. An echo
// reuses one arena Buffer: CopyFrom before each call and CopyTo after, so
// the ring pays the same user-level copies as the stream transports.
type ringLink struct {
	c    *ring.Client
	buf  *ring.Buffer // nil for no-ops
	call ring.Call
}

func (l *ringLink) roundTrip(ctx context.Context, in, out []byte) error {
	l.call = ring.Call{Op: ring.OpNop}
	if len(in) > 0 {
		l.buf.CopyFrom(in)
		l.call = ring.Call{Op: ring.OpEcho, Buf: l.buf}
	}
	comp, err := l.c.Do(ctx, &l.call)
	if err != nil {
		return fmt.Errorf("ring call: %w", err)
	}
	if err := comp.Err(); err != nil {
		return fmt.Errorf("ring op %d: %w", l.call.Op, err)
	}
	if comp.Result != int64(len(in)) {
		return fmt.Errorf("ring op %d: result %d, want %d", l.call.Op, comp.Result, len(in))
	}
	if len(in) > 0 {
		l.buf.CopyTo(out)
	}
	return nil
}

func openRing(ctx context.Context, sock string, mode ring.WaitMode, threads, payload int) ([]link, func() error, error) {
	c, err := ring.Dial(ctx, sock, ring.ClientOptions{Mode: mode})
	if err != nil {
		return nil, nil, fmt.Errorf("dial: %w", err)
	}
	links := make([]*ringLink, threads)
	closeAll := func() error {
		for _, l := range links {
			if l != nil && l.buf != nil {
				l.buf.Release()
			}
		}
		return c.Close()
	}
	for i := range links {
		l := &ringLink{c: c}
		if payload > 0 {
			if l.buf, err = c.Alloc(ctx, payload); err != nil {
				_ = closeAll()
				return nil, nil, fmt.Errorf("alloc %d-byte buffer: %w", payload, err)
			}
		}
		links[i] = l
	}
	out := make([]link, threads)
	for i, l := range links {
		out[i] = l
	}
	return out, closeAll, nil
}

// streamLink is a request/response link over a socket or a pipe pair. An
// echo copies the payload into the request frame behind the header (one
// write), and the answer's payload out of the receive buffer.
type streamLink struct {
	r         io.Reader // answers come in here
	w         io.Writer // requests go out here
	interrupt func()    // makes a blocked round trip fail; any goroutine
	close     func() error
	sbuf      []byte
	rbuf      []byte
	broken    error // set when a round trip fails: the stream is out of step
}

func newStreamLink(r io.Reader, w io.Writer, interrupt func(), close func() error) *streamLink {
	return &streamLink{r: r, w: w, interrupt: interrupt, close: close,
		sbuf: make([]byte, frameBufLen), rbuf: make([]byte, frameBufLen)}
}

func (l *streamLink) roundTrip(_ context.Context, in, out []byte) error {
	if l.broken != nil {
		return l.broken
	}
	if err := l.exchange(in, out); err != nil {
		l.broken = err
		return err
	}
	return nil
}

func (l *streamLink) exchange(in, out []byte) error {
	op := opNop
	if len(in) > 0 {
		op = opEcho
	}
	putFrameHeader(l.sbuf, op, uint32(len(in)))
	n := frameHeaderLen + copy(l.sbuf[frameHeaderLen:], in)
	if _, err := l.w.Write(l.sbuf[:n]); err != nil {
		return fmt.Errorf("send request: %w", err)
	}
	gotOp, payload, err := readFrame(l.r, l.rbuf)
	if err != nil {
		return fmt.Errorf("receive answer: %w", err)
	}
	if gotOp != op || len(payload) != len(in) {
		return fmt.Errorf("answer op %d with %d bytes to op %d with %d", gotOp, len(payload), op, len(in))
	}
	copy(out, payload)
	return nil
}

// Close closes the link's streams. No round trip may be running.
func (l *streamLink) Close() error { return l.close() }

// openStreams opens threads links with dial and makes their round trips
// fail once ctx is done. The returned function closes them.
func openStreams(ctx context.Context, threads int, dial func() (*streamLink, error)) ([]link, func() error, error) {
	var (
		links []*streamLink
		stops []func() bool
	)
	closeAll := func() error {
		var errs []error
		for i, l := range links {
			stops[i]()
			errs = append(errs, l.Close())
		}
		return errors.Join(errs...)
	}
	for range threads {
		l, err := dial()
		if err != nil {
			return nil, nil, errors.Join(err, closeAll())
		}
		links = append(links, l)
		stops = append(stops, context.AfterFunc(ctx, l.interrupt))
	}
	out := make([]link, len(links))
	for i, l := range links {
		out[i] = l
	}
	return out, closeAll, nil
}

func openUDS(ctx context.Context, sock string, threads int) ([]link, func() error, error) {
	var d net.Dialer
	return openStreams(ctx, threads, func() (*streamLink, error) {
		conn, err := d.DialContext(ctx, "unix", sock)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", sock, err)
		}
		interrupt := func() { _ = conn.SetDeadline(time.Unix(1, 0)) }
		return newStreamLink(conn, conn, interrupt, conn.Close), nil
	})
}

// openBlockingUDS connects sockets on which the client thread does blocking
// read and write system calls, as a C client does, instead of parking the
// goroutine on the runtime's netpoller.
func openBlockingUDS(ctx context.Context, sock string, threads int) ([]link, func() error, error) {
	return openStreams(ctx, threads, func() (*streamLink, error) {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("socket: %w", err)
		}
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("connect %s: %w", sock, err)
		}
		s := fdStream(fd)
		return newStreamLink(s, s, s.shutdown, s.Close), nil
	})
}

// pipeLink is the client end of one pipe pair: answers come in on r,
// requests go out on w. It lives as long as the server child; interrupting
// it sets a deadline in the past, which openPipes clears again.
type pipeLink struct {
	*streamLink
	r, w *os.File
}

func newPipeLink(r, w *os.File) *pipeLink {
	interrupt := func() {
		past := time.Unix(1, 0)
		_ = r.SetDeadline(past)
		_ = w.SetDeadline(past)
	}
	closeBoth := func() error { return errors.Join(r.Close(), w.Close()) }
	return &pipeLink{streamLink: newStreamLink(r, w, interrupt, closeBoth), r: r, w: w}
}

// openPipes uses the first threads of the child's pipe pairs; the returned
// function only ends the watch on ctx. A pair whose stream fell out of step
// in an earlier configuration stays broken.
func openPipes(ctx context.Context, pipes []*pipeLink, threads int) ([]link, func() error, error) {
	if threads > len(pipes) {
		return nil, nil, fmt.Errorf("%d threads but only %d pipe pairs", threads, len(pipes))
	}
	var (
		out   []link
		stops []func() bool
	)
	for _, p := range pipes[:threads] {
		if p.broken != nil {
			return nil, nil, fmt.Errorf("pipe pair unusable after an earlier failure: %w", p.broken)
		}
		if err := errors.Join(p.r.SetDeadline(time.Time{}), p.w.SetDeadline(time.Time{})); err != nil {
			return nil, nil, fmt.Errorf("clear pipe deadline: %w", err)
		}
		out = append(out, p)
		stops = append(stops, context.AfterFunc(ctx, p.interrupt))
	}
	return out, func() error {
		for _, stop := range stops {
			stop()
		}
		return nil
	}, nil
}

// fdStream does blocking read and write system calls on a socket: the
// calling thread sleeps in the kernel until data arrives, as in a C program,
// instead of the goroutine parking on the runtime's netpoller.
type fdStream int

func (s fdStream) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(int(s), b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, os.NewSyscallError("read", err)
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (s fdStream) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, err := unix.Write(int(s), b[done:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, os.NewSyscallError("write", err)
		}
		done += n
	}
	return done, nil
}

// shutdown wakes a thread blocked on the socket (its read returns EOF)
// without closing the descriptor under it.
func (s fdStream) shutdown() { _ = unix.Shutdown(int(s), unix.SHUT_RDWR) }

func (s fdStream) Close() error { return os.NewSyscallError("close", unix.Close(int(s))) }
