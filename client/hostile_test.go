package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// fakeServices are a metadata and an IO service made of ring muxes, to
// answer the client with whatever a test needs; everything else behaves.
type fakeServices struct {
	meta    map[uint8]ring.HandlerFunc
	io      map[uint8]ring.HandlerFunc
	ioAsync map[uint8]ring.AsyncHandlerFunc
	dir     string
}

func serveFake(t *testing.T, path string, mux *ring.Mux) {
	t.Helper()
	ln, err := ring.Listen(path, ring.Config{SQEntries: 16, ArenaSize: 1 << 20, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			sc, err := ln.Accept(context.Background(), mux, ring.WaitAdaptive)
			if err != nil {
				return
			}
			go func() { _ = sc.Serve(); sc.Close() }()
		}
	}()
}

func payload(q *ring.Request) []byte {
	b := make([]byte, q.Length)
	q.ReadPayload(b)
	return b
}

// newFake makes fake services that say hello, attach, open (handle 5,
// granted) and stat a regular file of 10 bytes correctly; a test changes
// the handlers, then starts them.
func newFake(t *testing.T, helloVersion uint32) *fakeServices {
	t.Helper()
	dir, err := os.MkdirTemp("", "weir-fake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeServices{meta: map[uint8]ring.HandlerFunc{}, io: map[uint8]ring.HandlerFunc{},
		ioAsync: map[uint8]ring.AsyncHandlerFunc{}, dir: dir}
	attr := proto.Attr{Ino: 9, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Size: 10}
	f.meta[proto.OpHello] = func(q *ring.Request) (int64, uint64) {
		if helloVersion == 0 {
			return -int64(syscall.EPROTONOSUPPORT), proto.VersionRange(7, 9)
		}
		r := proto.HelloResp{Version: helloVersion, Session: proto.MakeID(1, 1), Features: proto.FeatureReopen}
		return int64(q.WritePayload(r.Append(nil))), 0
	}
	f.meta[proto.OpStat] = func(q *ring.Request) (int64, uint64) {
		return int64(q.WritePayload(proto.AppendAttr(nil, &attr))), 0
	}
	f.meta[proto.OpOpen] = func(q *ring.Request) (int64, uint64) {
		r := proto.OpenResp{Handle: 5, Attr: attr, Granted: true, HasTicket: true}
		return int64(q.WritePayload(r.Append(nil))), 0
	}
	f.meta[proto.OpClose] = func(*ring.Request) (int64, uint64) { return 0, 0 }
	f.io[proto.OpAttach] = func(*ring.Request) (int64, uint64) { return 0, 0 }
	return f
}

// dial starts the fake services and dials them.
func (f *fakeServices) dial(t *testing.T) (*client.FS, error) {
	t.Helper()
	meta, io := ring.NewMux(), ring.NewMux()
	for op, h := range f.meta {
		meta.Handle(op, h)
	}
	for op, h := range f.io {
		io.Handle(op, h)
	}
	for op, h := range f.ioAsync {
		io.HandleAsync(op, h)
	}
	serveFake(t, filepath.Join(f.dir, "m.sock"), meta)
	serveFake(t, filepath.Join(f.dir, "io.sock"), io)
	return client.Dial(context.Background(), client.Options{
		MetadataSocket: filepath.Join(f.dir, "m.sock"), IOSocket: filepath.Join(f.dir, "io.sock"), RecoverTimeout: -1})
}

// TestClientValidatesCompletions: every answer the client cannot trust (a
// result larger than its buffer, a body that does not decode, values a
// service may not answer, a write at another offset than asked) is EIO,
// never a panic or a wrong value handed to the caller.
func TestClientValidatesCompletions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fakeServices)
		call  func(fsys *client.FS) error
	}{
		{"stat result beyond the buffer", func(f *fakeServices) {
			f.meta[proto.OpStat] = func(q *ring.Request) (int64, uint64) { return int64(q.Length) + 4096, 0 }
		}, func(fsys *client.FS) error { _, err := fsys.Stat("x"); return err }},
		{"stat answering a symlink (stat follows links)", func(f *fakeServices) {
			f.meta[proto.OpStat] = func(q *ring.Request) (int64, uint64) {
				a := proto.Attr{Ino: 9, Mode: syscall.S_IFLNK | 0o777}
				return int64(q.WritePayload(proto.AppendAttr(nil, &a))), 0
			}
		}, func(fsys *client.FS) error { _, err := fsys.Stat("x"); return err }},
		{"stat answer too short", func(f *fakeServices) {
			f.meta[proto.OpStat] = func(q *ring.Request) (int64, uint64) { return int64(q.WritePayload([]byte{1, 2, 3})), 0 }
		}, func(fsys *client.FS) error { _, err := fsys.Stat("x"); return err }},
		{"readdir names with a slash", func(f *fakeServices) {
			f.meta[proto.OpReadDir] = func(q *ring.Request) (int64, uint64) {
				b, _ := proto.AppendDirents(nil, []proto.Dirent{{Ino: 3, Mode: syscall.S_IFREG, Name: "../../etc"}}, 1<<20)
				return int64(q.WritePayload(b)), 0
			}
		}, func(fsys *client.FS) error { _, err := fsys.ReadDir("."); return err }},
		{"readdir promising more and giving none", func(f *fakeServices) {
			f.meta[proto.OpReadDir] = func(q *ring.Request) (int64, uint64) {
				b, _ := proto.AppendDirents(nil, nil, 1<<20)
				return int64(q.WritePayload(b)), 1
			}
		}, func(fsys *client.FS) error { _, err := fsys.ReadDir("."); return err }},
		{"open answering handle 0", func(f *fakeServices) {
			f.meta[proto.OpOpen] = func(q *ring.Request) (int64, uint64) {
				r := proto.OpenResp{Attr: proto.Attr{Ino: 9, Mode: syscall.S_IFREG}, HasTicket: true}
				return int64(q.WritePayload(r.Append(nil))), 0
			}
		}, func(fsys *client.FS) error { _, err := fsys.OpenFile("x", os.O_RDONLY, 0); return err }},
		{"read of more than asked", func(f *fakeServices) {
			f.ioAsync[proto.OpRead] = func(q *ring.Request, done func(int64, uint64)) { done(int64(q.Length)+1, 0) }
		}, func(fsys *client.FS) error {
			fl, err := fsys.OpenFile("x", os.O_RDONLY, 0)
			if err != nil {
				return err
			}
			defer fl.Close()
			_, err = fl.ReadAt(make([]byte, 100), 0)
			return err
		}},
		{"write at another offset", func(f *fakeServices) {
			f.ioAsync[proto.OpWrite] = func(q *ring.Request, done func(int64, uint64)) { done(int64(q.Length), q.Offset+1) }
		}, func(fsys *client.FS) error {
			fl, err := fsys.OpenFile("x", os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer fl.Close()
			_, err = fl.WriteAt([]byte("data"), 0)
			return err
		}},
		{"a result for a request that answers none", func(f *fakeServices) {
			f.meta[proto.OpChmod] = func(*ring.Request) (int64, uint64) { return 77, 0 }
		}, func(fsys *client.FS) error { return fsys.Chmod("x", 0o644) }},
		// A long name makes the request buffer larger than the response:
		// a result that fits the buffer but not the response.
		{"stat of a long name answering the whole buffer", func(f *fakeServices) {
			f.meta[proto.OpStat] = func(q *ring.Request) (int64, uint64) { return int64(q.Length), 0 }
		}, func(fsys *client.FS) error { _, err := fsys.Stat(strings.Repeat("n", 200)); return err }},
		{"mkdir of a long name answering the whole buffer", func(f *fakeServices) {
			f.meta[proto.OpMkdir] = func(q *ring.Request) (int64, uint64) { return int64(q.Length), 0 }
		}, func(fsys *client.FS) error { return fsys.Mkdir(strings.Repeat("n", 200), 0o755) }},
		{"open of a long name answering the whole buffer", func(f *fakeServices) {
			f.meta[proto.OpOpen] = func(q *ring.Request) (int64, uint64) { return int64(q.Length), 0 }
		}, func(fsys *client.FS) error {
			_, err := fsys.OpenFile(strings.Repeat("n", 250), os.O_RDONLY, 0)
			return err
		}},
		{"chmod of a long name answering the whole buffer", func(f *fakeServices) {
			f.meta[proto.OpChmod] = func(q *ring.Request) (int64, uint64) { return int64(q.Length), 0 }
		}, func(fsys *client.FS) error { return fsys.Chmod(strings.Repeat("n", 200), 0o644) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, proto.Version)
			tc.setup(f)
			fsys, err := f.dial(t)
			if err != nil {
				t.Fatal(err)
			}
			defer fsys.Close()
			if err := tc.call(fsys); !errors.Is(err, syscall.EIO) {
				t.Fatalf("got %v, want EIO", err)
			}
		})
	}
}

// TestDialRefusesUnknownVersion: a metadata service that speaks none of
// the client's versions is refused with both ranges in the error.
func TestDialRefusesUnknownVersion(t *testing.T) {
	f := newFake(t, 0) // answers EPROTONOSUPPORT, speaking 7 to 9
	_, err := f.dial(t)
	if !errors.Is(err, syscall.EPROTONOSUPPORT) || !strings.Contains(err.Error(), "speaks protocol versions 7 to 9") {
		t.Fatalf("dial: %v", err)
	}
	// A service that answers a version the client did not offer is not
	// believed either.
	f = newFake(t, proto.MaxVersion+3)
	if _, err := f.dial(t); !errors.Is(err, syscall.EIO) {
		t.Fatalf("dial of a service answering version %d: %v", proto.MaxVersion+3, err)
	}
}
