package ring

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The handshake runs once per session on a Unix stream socket:
//
//	server -> client  hello: 16 bytes {u64 helloMagic, u32 ABIVersion, u32 0}
//	                  with the region's memfd in SCM_RIGHTS
//	client -> server  ack:   16 bytes {u64 ackMagic, u32 ABIVersion, u32 0}
//
// or, when the server will not serve this peer (a limit of its uid's):
//
//	server -> client  refusal: 16 bytes {u64 refuseMagic, u32 ABIVersion, u32 errno}
//	                  with no file; the server closes the socket after it
//
// After the ack the client never writes to the socket again, and the
// server writes only file messages (files.go); it stays open so that its
// EOF tells each side the other has gone. A pidfd of the peer (from
// SO_PEERCRED) covers a peer whose socket outlives it in a forked child.

const (
	helloMagic  = 0x4f4c454852494557 // "WEIRHELO"
	ackMagic    = 0x4b43414852494557 // "WEIRHACK"
	refuseMagic = 0x4b414e4852494557 // "WEIRHNAK"
	helloLen    = 16

	// HandshakeTimeout bounds how long either side waits for the other.
	HandshakeTimeout = 5 * time.Second

	// maxRefusalErrno bounds the errno of a refusal (Linux's are below
	// 4096); anything else is a broken server.
	maxRefusalErrno = 4095
)

// Refuse tells the client on conn that the server will not serve it, with
// errno (syscall.EAGAIN: too many of its uid's handshakes in progress;
// syscall.EUSERS: its uid has as many sessions as it may), and closes
// conn. It never waits: the message goes into the socket's empty send
// buffer or is dropped (the client then sees EOF).
func Refuse(conn *net.UnixConn, errno syscall.Errno) {
	var msg [helloLen]byte
	binary.LittleEndian.PutUint64(msg[:], refuseMagic)
	binary.LittleEndian.PutUint32(msg[8:], ABIVersion)
	binary.LittleEndian.PutUint32(msg[12:], uint32(errno))
	if raw, err := conn.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			_ = unix.Send(int(fd), msg[:], unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		})
	}
	conn.Close()
}

// RefusedError is the client's side of a refusal (Refuse): the server
// will not serve this peer, for the reason Errno says. It matches Errno
// with errors.Is.
type RefusedError struct{ Errno syscall.Errno }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("ring: the server refused the session: %v", e.Errno)
}

func (e *RefusedError) Unwrap() error { return e.Errno }

// checkRefusal reports the refusal b is (nil, a RefusedError, or an error
// for a malformed one); b is a message whose magic is refuseMagic.
func checkRefusal(b []byte, nfds int) error {
	if len(b) != helloLen || nfds != 0 {
		return fmt.Errorf("ring: refusal of %d bytes with %d fds, want %d and none", len(b), nfds, helloLen)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != ABIVersion {
		return fmt.Errorf("ring: peer speaks ABI %d, this side %d", v, ABIVersion)
	}
	e := binary.LittleEndian.Uint32(b[12:])
	if e == 0 || e > maxRefusalErrno {
		return fmt.Errorf("ring: refusal with errno %d", e)
	}
	return &RefusedError{Errno: syscall.Errno(e)}
}

func putHello(b []byte, magic uint64) {
	binary.LittleEndian.PutUint64(b, magic)
	binary.LittleEndian.PutUint32(b[8:], ABIVersion)
	binary.LittleEndian.PutUint32(b[12:], 0)
}

func checkHello(b []byte, magic uint64) error {
	if len(b) != helloLen {
		return fmt.Errorf("ring: handshake message of %d bytes, want %d", len(b), helloLen)
	}
	if m := binary.LittleEndian.Uint64(b); m != magic {
		return fmt.Errorf("ring: handshake magic %#x, want %#x", m, magic)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != ABIVersion {
		return fmt.Errorf("ring: peer speaks ABI %d, this side %d", v, ABIVersion)
	}
	if r := binary.LittleEndian.Uint32(b[12:]); r != 0 {
		return fmt.Errorf("ring: handshake reserved word is %#x, want 0", r)
	}
	return nil
}

// peerCred returns the credentials the kernel recorded for the other end of
// conn (at connect or listen time): they cannot be forged by the peer.
func peerCred(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("ring: SO_PEERCRED: %w", cerr)
	}
	return cred, nil
}

// ServerHandshake creates a region of cfg, sends it over conn and waits for
// the client's ack. It returns the region and the peer's credentials.
func ServerHandshake(ctx context.Context, conn *net.UnixConn, cfg Config) (*Region, *unix.Ucred, error) {
	cred, err := peerCred(conn)
	if err != nil {
		return nil, nil, err
	}
	r, err := Create(cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := sendRegion(ctx, conn, r); err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, cred, nil
}

// sendRegion sends r's memfd over conn and waits for the client's ack.
func sendRegion(ctx context.Context, conn *net.UnixConn, r *Region) error {
	dl := time.Now().Add(HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = conn.SetDeadline(dl)
	defer conn.SetDeadline(time.Time{})
	var msg [helloLen]byte
	putHello(msg[:], helloMagic)
	if _, _, err := conn.WriteMsgUnix(msg[:], unix.UnixRights(int(r.File().Fd())), nil); err != nil {
		return fmt.Errorf("ring: send hello: %w", err)
	}
	var ack [helloLen + 1]byte
	n, err := readFull(conn, ack[:helloLen])
	if err != nil {
		return fmt.Errorf("ring: read ack (%d bytes): %w", n, err)
	}
	return checkHello(ack[:helloLen], ackMagic)
}

func readFull(conn *net.UnixConn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := conn.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// ClientHandshake receives a region over conn, attaches it and acks.
func ClientHandshake(ctx context.Context, conn *net.UnixConn) (*Region, error) {
	dl := time.Now().Add(HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = conn.SetDeadline(dl)
	defer conn.SetDeadline(time.Time{})
	var msg [helloLen]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(msg[:], oob)
	if err != nil {
		return nil, fmt.Errorf("ring: read hello: %w", err)
	}
	fds, ferr := parseRights(oob[:oobn])
	if ferr != nil {
		return nil, ferr
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if n == helloLen && binary.LittleEndian.Uint64(msg[:]) == refuseMagic {
		closeAll()
		return nil, checkRefusal(msg[:n], len(fds))
	}
	if err := checkHello(msg[:n], helloMagic); err != nil {
		closeAll()
		return nil, err
	}
	if len(fds) != 1 {
		closeAll()
		return nil, fmt.Errorf("ring: hello carried %d fds, want 1", len(fds))
	}
	f := os.NewFile(uintptr(fds[0]), "weir-ring")
	r, err := Attach(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	putHello(msg[:], ackMagic)
	if _, err := conn.Write(msg[:]); err != nil {
		r.Close()
		return nil, fmt.Errorf("ring: send ack: %w", err)
	}
	return r, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("ring: parse control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

// watchPeer calls gone once when conn reaches EOF or an error, when the
// peer sends anything after the handshake (a server) or anything but file
// messages (a client, with fs non-nil: they go to fs), or when the process
// pid exits. The returned stop ends the watch without calling gone and
// closes conn.
func watchPeer(conn *net.UnixConn, pid int32, gone func(), fs *files) (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		fired   bool
	)
	fire := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped || fired {
			return
		}
		fired = true
		gone()
	}
	go func() {
		if fs != nil {
			err := readFiles(conn, fs)
			fs.end(fmt.Errorf("%w (%v)", errSocketRead, err))
		} else {
			var b [1]byte
			_, _ = conn.Read(b[:]) // any byte, EOF or error ends the session
		}
		fire()
	}()
	var pidf *os.File
	if pid > 0 && int(pid) != os.Getpid() {
		if fd, err := unix.PidfdOpen(int(pid), unix.PIDFD_NONBLOCK); err == nil {
			pidf = os.NewFile(uintptr(fd), "pidfd")
			go watchPidfd(pidf, fire)
		}
	}
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		conn.Close()
		if pidf != nil {
			pidf.Close()
		}
	}
}

// watchPidfd waits, on the runtime poller, for the pidfd to become readable,
// which the kernel makes it when the process exits.
func watchPidfd(f *os.File, fire func()) {
	raw, err := f.SyscallConn()
	if err != nil {
		return
	}
	exited := false
	err = raw.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, perr := unix.Poll(pfd, 0)
		if perr == syscall.EINTR {
			return false
		}
		exited = n > 0
		return exited || perr != nil
	})
	if err == nil && exited {
		fire()
	}
}

// Listener accepts ring sessions on a Unix socket.
type Listener struct {
	l   *net.UnixListener
	cfg Config
}

// Listen opens a session socket at path. A stale socket file left by a dead
// server is replaced; a live one is an error.
func Listen(path string, cfg Config) (*Listener, error) {
	if _, err := NewGeometry(cfg); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("ring: %s: a server is already listening", path)
		}
		_ = os.Remove(path)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("ring: listen: %w", err)
	}
	return &Listener{l: l, cfg: cfg}, nil
}

// Addr returns the socket path.
func (l *Listener) Addr() string { return l.l.Addr().String() }

// AcceptUnix waits for a connection without handshaking.
func (l *Listener) AcceptUnix() (*net.UnixConn, error) { return l.l.AcceptUnix() }

// Config returns the ring configuration sessions of this listener get.
func (l *Listener) Config() Config { return l.cfg }

// Close stops accepting; sessions already accepted go on.
func (l *Listener) Close() error { return l.l.Close() }

// ServerConn is an accepted session: the region, the peer's credentials and
// the socket that tells when the peer goes.
type ServerConn struct {
	Cred *unix.Ucred
	*ServerSession
	stop   func()
	conn   *net.UnixConn
	sendMu sync.Mutex // serialises SendFile
}

// Accept waits for a client and runs the handshake. ctx bounds only the
// handshake; to stop a blocked Accept, Close the listener (Accept then
// returns an error matching net.ErrClosed). A failed handshake is returned
// as an error that does not stop the listener. Accept handshakes in the
// caller's goroutine; a server that must not let a slow client delay others
// accepts with AcceptUnix and runs NewServerConn per connection.
func (l *Listener) Accept(ctx context.Context, h Handler, mode WaitMode) (*ServerConn, error) {
	conn, err := l.l.AcceptUnix()
	if err != nil {
		return nil, err
	}
	return NewServerConn(ctx, conn, l.cfg, h, mode)
}

// NewServerConn runs the server side of the handshake on conn and returns a
// session ready to Serve.
func NewServerConn(ctx context.Context, conn *net.UnixConn, cfg Config, h Handler, mode WaitMode) (*ServerConn, error) {
	r, cred, err := ServerHandshake(ctx, conn, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return newServerConn(conn, r, cred, h, mode), nil
}

// NewServerConnRegion is NewServerConn for a region the caller made with
// Create: a server that chooses each session's region itself (one that
// falls back to ordinary pages when huge pages run out) hands it over here.
// The session owns r from now on; on error r and conn are closed.
func NewServerConnRegion(ctx context.Context, conn *net.UnixConn, r *Region, h Handler, mode WaitMode) (*ServerConn, error) {
	cred, err := peerCred(conn)
	if err == nil {
		err = sendRegion(ctx, conn, r)
	}
	if err != nil {
		r.Close()
		conn.Close()
		return nil, err
	}
	return newServerConn(conn, r, cred, h, mode), nil
}

func newServerConn(conn *net.UnixConn, r *Region, cred *unix.Ucred, h Handler, mode WaitMode) *ServerConn {
	sc := &ServerConn{Cred: cred, ServerSession: NewServerSession(r, h, mode), conn: conn}
	sc.stop = watchPeer(conn, cred.Pid, sc.ServerSession.PeerGone, nil)
	return sc
}

// Close ends the session and its socket.
func (sc *ServerConn) Close() {
	sc.stop()
	sc.ServerSession.Close()
}

// Serve runs the session; when it ends for any reason the socket is closed
// so the client learns at once.
func (sc *ServerConn) Serve() error {
	err := sc.ServerSession.Serve()
	sc.stop()
	return err
}

// Dial connects to a ring server at path and returns a client session.
func Dial(ctx context.Context, path string, opts ClientOptions) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("ring: dial %s: %w", path, err)
	}
	return NewClientConn(ctx, c.(*net.UnixConn), opts)
}

// NewClientConn runs the client side of the handshake on conn.
func NewClientConn(ctx context.Context, conn *net.UnixConn, opts ClientOptions) (*Client, error) {
	cred, err := peerCred(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	r, err := ClientHandshake(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c := NewClient(r, opts)
	c.files = newFiles()
	c.onClose = watchPeer(conn, cred.Pid, c.PeerGone, c.files)
	return c, nil
}

// Pipe connects a server and a client session over a socketpair in this
// process, through the real handshake. Tests and benchmarks use it.
func Pipe(cfg Config, h Handler, serverMode WaitMode, opts ClientOptions) (*ServerConn, *Client, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ring: socketpair: %w", err)
	}
	toConn := func(fd int) (*net.UnixConn, error) {
		f := os.NewFile(uintptr(fd), "ring-socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			return nil, err
		}
		return c.(*net.UnixConn), nil
	}
	sconn, err := toConn(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	cconn, err := toConn(fds[1])
	if err != nil {
		sconn.Close()
		return nil, nil, err
	}
	type result struct {
		sc  *ServerConn
		err error
	}
	ch := make(chan result, 1)
	ctx := context.Background()
	go func() {
		sc, err := NewServerConn(ctx, sconn, cfg, h, serverMode)
		ch <- result{sc, err}
	}()
	c, cerr := NewClientConn(ctx, cconn, opts)
	res := <-ch
	if err := errors.Join(res.err, cerr); err != nil {
		if res.sc != nil {
			res.sc.Close()
		}
		if c != nil {
			c.Close()
		}
		return nil, nil, err
	}
	return res.sc, c, nil
}
