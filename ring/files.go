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

// After the handshake the server may pass files to the client on the
// session socket, one per message: the answer to a request on the ring
// that carries a tag (the completion's Aux), the file in the message:
//
//	server -> client  file: 16 bytes {u32 fileMagic, u32 0, u64 tag}
//	                  with exactly one fd in SCM_RIGHTS
//
// The client still writes nothing after the ack: any byte from it ends the
// session, as before. A client that receives anything else (another
// length, another magic, a nonzero reserved word, no fd or more than one)
// ends the session: its server is broken.

const (
	fileMagic = 0x31465257 // "WRF1"
	fileLen   = 16

	// MaxPendingFiles bounds the files a client holds that no caller took
	// (ReceiveFile) yet: past it the oldest is closed.
	MaxPendingFiles = 64
	// maxOutq bounds the bytes the kernel holds unread in a session
	// socket's send queue: a client that never reads its socket cannot
	// make the server pile up files in flight (each counts against the
	// server user's in-flight fd limit). SendFile refuses past it.
	maxOutq = 64 << 10
	// sendFileTimeout bounds one SendFile's write.
	sendFileTimeout = time.Second
)

// ErrSocketFull is SendFile's error when the client leaves too much unread
// on its socket.
var ErrSocketFull = errors.New("ring: the client left too much unread on its session socket")

// SendFile passes f to the client with tag, for the completion that
// carries tag to name. It is safe for concurrent use.
func (sc *ServerConn) SendFile(tag uint64, f *os.File) error {
	if sc.conn == nil {
		return errors.New("ring: session has no socket")
	}
	sc.sendMu.Lock()
	defer sc.sendMu.Unlock()
	if raw, err := sc.conn.SyscallConn(); err == nil {
		var outq int
		var qerr error
		_ = raw.Control(func(fd uintptr) { outq, qerr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		if qerr == nil && outq > maxOutq {
			return fmt.Errorf("%w (%d bytes)", ErrSocketFull, outq)
		}
	}
	var msg [fileLen]byte
	binary.LittleEndian.PutUint32(msg[:], fileMagic)
	binary.LittleEndian.PutUint64(msg[8:], tag)
	_ = sc.conn.SetWriteDeadline(time.Now().Add(sendFileTimeout))
	defer sc.conn.SetWriteDeadline(time.Time{})
	n, _, err := sc.conn.WriteMsgUnix(msg[:], unix.UnixRights(int(f.Fd())), nil)
	if err != nil {
		return fmt.Errorf("ring: send file: %w", err)
	}
	if n != fileLen {
		// A stream socket that took part of the frame: the rest would
		// be read as the next frame's start. The client ends the session
		// on the short frame; closing the socket ends it at once.
		sc.conn.Close()
		return fmt.Errorf("ring: send file: wrote %d of %d bytes", n, fileLen)
	}
	return nil
}

// files holds what the server passed a client: received files by tag,
// and the callers waiting for one.
type files struct {
	mu      sync.Mutex
	got     map[uint64]*os.File
	order   []uint64 // tags in got, oldest first
	changed chan struct{}
	err     error // set once the socket ended
}

func newFiles() *files {
	return &files{got: make(map[uint64]*os.File), changed: make(chan struct{})}
}

func (fs *files) put(tag uint64, f *os.File) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.err != nil {
		f.Close()
		return
	}
	if old := fs.got[tag]; old != nil {
		old.Close()
	} else {
		fs.order = append(fs.order, tag)
	}
	fs.got[tag] = f
	for len(fs.order) > MaxPendingFiles {
		t := fs.order[0]
		fs.order = fs.order[1:]
		if g := fs.got[t]; g != nil {
			g.Close()
			delete(fs.got, t)
		}
	}
	close(fs.changed)
	fs.changed = make(chan struct{})
}

func (fs *files) end(err error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.err != nil {
		return
	}
	fs.err = err
	for _, f := range fs.got {
		f.Close()
	}
	fs.got, fs.order = map[uint64]*os.File{}, nil
	close(fs.changed)
}

func (fs *files) take(ctx context.Context, tag uint64, done <-chan struct{}) (*os.File, error) {
	for {
		fs.mu.Lock()
		if f := fs.got[tag]; f != nil {
			delete(fs.got, tag)
			for i, t := range fs.order {
				if t == tag {
					fs.order = append(fs.order[:i], fs.order[i+1:]...)
					break
				}
			}
			fs.mu.Unlock()
			return f, nil
		}
		if fs.err != nil {
			err := fs.err
			fs.mu.Unlock()
			return nil, err
		}
		ch := fs.changed
		fs.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return nil, ErrPeerGone
		case <-ctx.Done():
			return nil, fmt.Errorf("ring: wait for file %d: %w", tag, ctx.Err())
		}
	}
}

// ReceiveFile returns the file the server passed with tag, waiting for it
// until ctx is done or the session ends. The caller owns the file. A
// session made without a socket (NewClient) has none to receive.
func (c *Client) ReceiveFile(ctx context.Context, tag uint64) (*os.File, error) {
	if c.files == nil {
		return nil, errors.New("ring: session has no socket to receive files on")
	}
	return c.files.take(ctx, tag, c.done)
}

// readFiles is the client's side of the socket after the handshake: it
// reads file messages until EOF, an error or a malformed message, and
// returns why it stopped.
func readFiles(conn *net.UnixConn, fs *files) error {
	oob := make([]byte, unix.CmsgSpace(4*4))
	var msg [fileLen]byte
	for {
		n, oobn, _, _, err := conn.ReadMsgUnix(msg[:], oob)
		if err != nil {
			return err
		}
		if n == 0 && oobn == 0 {
			return errors.New("ring: session socket closed")
		}
		fds, ferr := parseRights(oob[:oobn])
		bad := func(why string) error {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return fmt.Errorf("ring: malformed file message from the server: %s", why)
		}
		switch {
		case ferr != nil:
			return bad(ferr.Error())
		case n != fileLen:
			// SendFile writes whole frames of 16 bytes; the kernel does not
			// split one that carries rights.
			return bad(fmt.Sprintf("%d bytes", n))
		case binary.LittleEndian.Uint32(msg[:]) != fileMagic || binary.LittleEndian.Uint32(msg[4:]) != 0:
			return bad(fmt.Sprintf("header %x", msg[:8]))
		case len(fds) != 1:
			return bad(fmt.Sprintf("%d fds", len(fds)))
		}
		fs.put(binary.LittleEndian.Uint64(msg[8:]), os.NewFile(uintptr(fds[0]), "weir-ring-file"))
	}
}

// errSocketRead is what the files of a session whose socket ended answer.
var errSocketRead = fmt.Errorf("ring: session socket ended: %w", syscall.EPIPE)
