package stack_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// hostileEnv is a running stack, an honest client holding a file open,
// and one raw metadata session and one raw IO session (hello and attach
// done) that send whatever they are told.
type hostileEnv struct {
	st     *stack.Stack
	honest *client.FS
	kept   *client.File
	meta   *ring.Client
	data   *ring.Client
	// answers counts the completions of hostileRequest: "ok" or the errno.
	answers map[string]int
	att     proto.AttachReq // attaches an IO session to the raw metadata session
}

// attachAs attaches the IO session c to the raw metadata session.
func (e *hostileEnv) attachAs(t testing.TB, c *ring.Client) {
	t.Helper()
	if comp := e.do(t, c, &ring.Call{Op: proto.OpAttach}, e.att.Append(nil), nil); comp.Result != 0 {
		t.Fatalf("attach: %+v", comp)
	}
}

const keptData = "the honest client's bytes"

func startHostile(t testing.TB) *hostileEnv {
	t.Helper()
	cfg := stacktest.Config(t, "")
	cfg.IO.Backend = "mem"
	st, err := stack.Start(cfg, hclog.New(&hclog.LoggerOptions{Name: "hostile", Level: hclog.Error}))
	if err != nil {
		t.Fatal(err)
	}
	e := &hostileEnv{st: st, answers: map[string]int{}}
	ctx := context.Background()
	if e.honest, err = st.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.honest.Mkdir("dir", 0o755); err != nil {
		t.Fatal(err)
	}
	if e.kept, err = e.honest.Create("dir/kept"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kept.Write([]byte(keptData)); err != nil {
		t.Fatal(err)
	}
	if e.meta, err = ring.Dial(ctx, cfg.Metadata.Socket, ring.ClientOptions{}); err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, proto.HelloRespSize)
	req := proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: proto.FeatureReopen}
	if c := e.do(t, e.meta, &ring.Call{Op: proto.OpHello}, req.Append(nil), hello); c.Result != int64(len(hello)) {
		t.Fatalf("hello: %+v", c)
	}
	hr, err := proto.DecodeHelloResp(hello)
	if err != nil {
		t.Fatal(err)
	}
	if e.data, err = ring.Dial(ctx, cfg.IO.Socket, ring.ClientOptions{}); err != nil {
		t.Fatal(err)
	}
	e.att = proto.AttachReq{Version: hr.Version, Session: hr.Session, Token: hr.Token}
	e.attachAs(t, e.data)
	t.Cleanup(func() {
		e.meta.Close()
		e.data.Close()
		e.kept.Close()
		e.honest.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return e
}

// do sends call with in as its payload (and room for out) and returns the
// completion; a transport error fails the test: a hostile request must be
// answered, never end the session.
func (e *hostileEnv) do(t testing.TB, c *ring.Client, call *ring.Call, in, out []byte) ring.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b *ring.Buffer
	if n := max(len(in), len(out)); n > 0 {
		var err error
		if b, err = c.Alloc(ctx, min(n, c.MaxBuffer())); err != nil {
			t.Fatalf("alloc %d: %v", n, err)
		}
		defer b.Release()
		b.CopyFrom(in)
		call.Buf = b
	}
	comp, err := c.Do(ctx, call)
	if err == nil && b != nil && comp.Result > 0 {
		b.CopyTo(out[:min(len(out), int(comp.Result))])
	}
	if err != nil {
		t.Fatalf("op %d arg %d handle %d offset %d, %d bytes in: the session failed: %v",
			call.Op, call.Arg, call.Handle, call.Offset, len(in), err)
	}
	if comp.Result < -4095 {
		t.Fatalf("op %d: result %d is neither a count nor an errno", call.Op, comp.Result)
	}
	return comp
}

// hostileRequest sends one request built from r: any opcode near the
// services' ranges, small or wild handles and offsets, and a payload that
// is random bytes or a well-formed body with random fields.
func (e *hostileEnv) hostileRequest(t testing.TB, r *rand.Rand) {
	c, first, n := e.meta, proto.OpHello, int(proto.OpLink-proto.OpHello)+1
	if r.IntN(2) == 0 {
		c, first, n = e.data, proto.OpAttach, int(proto.OpMapUnpin-proto.OpAttach)+1
	}
	call := &ring.Call{Op: uint8(int(first) - 2 + r.IntN(n+4)), Arg: r.Uint32()}
	switch r.IntN(3) {
	case 0:
		call.Handle, call.Offset = uint64(r.IntN(8)), uint64(r.IntN(1<<16))
	case 1:
		call.Handle, call.Offset = r.Uint64(), r.Uint64()
	default:
		call.Handle, call.Offset = uint64(r.IntN(4)), uint64(1)<<r.IntN(64)
	}
	if r.IntN(4) == 0 {
		call.Arg = uint32(r.IntN(8)) // small flags, modes
	}
	var in []byte
	switch r.IntN(3) {
	case 0:
		in = make([]byte, r.IntN(9000))
		for i := range in {
			in[i] = byte(r.Uint32())
		}
	case 1: // u32, str: the shape of open, mkdir, chmod
		var enc proto.Enc
		enc.U32(r.Uint32())
		enc.Str(hostilePath(r))
		in = enc.B
	default: // str, str: the shape of rename and readdir
		var enc proto.Enc
		enc.Str(hostilePath(r))
		enc.Str(hostilePath(r))
		if r.IntN(2) == 0 {
			in = enc.B[:r.IntN(len(enc.B)+1)] // cut anywhere
		} else {
			in = enc.B
		}
	}
	out := make([]byte, r.IntN(4096))
	if comp := e.do(t, c, call, in, out); comp.Result >= 0 {
		e.answers["ok"]++
	} else {
		e.answers[syscall.Errno(-comp.Result).Error()]++
	}
}

func hostilePath(r *rand.Rand) string {
	parts := []string{"dir", "kept", "..", ".", "", "x", "dir/../dir", "a\x00b", string(make([]byte, 300)), "/", "new"}
	var b []byte
	for range 1 + r.IntN(4) {
		if len(b) > 0 {
			b = append(b, '/')
		}
		b = append(b, parts[r.IntN(len(parts))]...)
	}
	return string(b)
}

// check asserts the stack survived: both services healthy, the honest
// client's open file intact through its handle (which the hostile session
// cannot touch; by name it may rename or remove the file, as its
// credentials allow), and new sessions served.
func (e *hostileEnv) check(t testing.TB) {
	t.Helper()
	if err := e.st.Metadata.Health(); err != nil {
		t.Fatalf("metadata health: %v", err)
	}
	if err := e.st.IO.Health(); err != nil {
		t.Fatalf("io health: %v", err)
	}
	got := make([]byte, 64)
	n, _ := e.kept.ReadAt(got, 0)
	if string(got[:n]) != keptData {
		t.Fatalf("the honest client's open file reads %q", got[:n])
	}
	fresh, err := e.st.Dial(context.Background())
	if err != nil {
		t.Fatalf("a new client after the hostile one: %v", err)
	}
	defer fresh.Close()
	// The hostile client may legitimately rename or remove dir/kept (its
	// credentials allow it), so a new client checks a file of its own.
	name := fmt.Sprintf("fresh-%d", time.Now().UnixNano())
	if err := fresh.WriteFile(name, []byte(keptData), 0o600); err != nil {
		t.Fatalf("a new client's write: %v", err)
	}
	if b, err := fresh.ReadFile(name); err != nil || !bytes.Equal(b, []byte(keptData)) {
		t.Fatalf("a new client's read: %q %v", b, err)
	}
}

// TestHostileRequests: a client that passed the handshake sends thousands
// of malformed or random requests to both services. Each must be answered
// (a count or an errno), neither service may fail or stop serving, and
// the honest client's file must stay as it was.
// WEIR_HOSTILE_SEED replays a run.
func TestHostileRequests(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WEIR_HOSTILE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("WEIR_HOSTILE_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (WEIR_HOSTILE_SEED replays it)", seed)
	e := startHostile(t)

	// Handles are per session: before it opened anything, the hostile
	// session can use no handle number at all, the honest client's
	// included, at either service.
	payload := []byte("overwrite")
	for h := range uint64(256) {
		for _, op := range []struct {
			c    *ring.Client
			call ring.Call
			in   []byte
		}{
			{e.data, ring.Call{Op: proto.OpWrite, Handle: h}, payload},
			{e.data, ring.Call{Op: proto.OpTruncate, Handle: h}, nil},
			{e.data, ring.Call{Op: proto.OpRead, Handle: h}, make([]byte, 64)},
			{e.data, ring.Call{Op: proto.OpSync, Handle: h}, nil},
			{e.data, ring.Call{Op: proto.OpCacheMap, Handle: h}, nil},
			{e.data, ring.Call{Op: proto.OpReadahead, Handle: h, Arg: 4096}, nil},
			{e.meta, ring.Call{Op: proto.OpGrant, Handle: h}, nil},
			{e.meta, ring.Call{Op: proto.OpFStat, Handle: h}, make([]byte, proto.AttrSize)},
			{e.meta, ring.Call{Op: proto.OpClose, Handle: h}, nil},
		} {
			call := op.call
			if comp := e.do(t, op.c, &call, op.in, nil); comp.Result != -int64(syscall.EBADF) {
				t.Fatalf("op %d on handle %d of another session: result %d, want EBADF", call.Op, h, comp.Result)
			}
		}
	}
	e.check(t)

	r := rand.New(rand.NewPCG(seed, 1))
	for range 3000 {
		e.hostileRequest(t, r)
	}
	e.check(t)
	t.Logf("answers: %v", e.answers)
	if e.answers["ok"] == 0 || len(e.answers) < 4 {
		t.Errorf("the requests reached too little of the services: %v", e.answers)
	}
}

// FuzzServiceRequest drives the hostile client from fuzzer input: the
// input seeds one batch of requests. The stack starts once per fuzzing
// process (before the inputs) and must survive every batch.
func FuzzServiceRequest(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 0xdeadbeef} {
		f.Add(s, s^0x5555)
	}
	e := startHostile(f)
	f.Fuzz(func(t *testing.T, a, b uint64) {
		r := rand.New(rand.NewPCG(a, b))
		for range 8 {
			e.hostileRequest(t, r)
		}
		e.check(t)
	})
}
