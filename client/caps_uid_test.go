package client_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
)

// envClaimChild makes the test binary act as TestClaimAsAnotherUID's
// child: "meta socket,io socket,handle,capability in hex".
const envClaimChild = "WEIR_CLIENT_TEST_CLAIM"

// TestClaimAsAnotherUID: a process of another uid that has root's
// capability of a file it may not read, and its handle, gets nothing: io
// refuses the claim on its own session (EPERM) and reads naming the
// handle (EBADF); root's claim still works after.
func TestClaimAsAnotherUID(t *testing.T) {
	st := otherUIDStack(t)
	cfg := st.Config
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteFile("secret", []byte("root's only"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := dialRaw(t, st, capFeatures)
	r := s.open(t, "secret")
	comp, cp := s.grantCap(t, r.Handle, 0)
	if comp.Result != proto.CapSize {
		t.Fatalf("grant: %+v", comp)
	}
	cmd := exec.Command(copyTestBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d,%s", envClaimChild, cfg.Metadata.Socket, cfg.IO.Socket, r.Handle, hex.EncodeToString(cp)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	for _, want := range []string{"claim: " + syscall.EPERM.Error(), "read: " + syscall.EBADF.Error()} {
		if !strings.Contains(string(out), want) {
			t.Errorf("uid 65534 with root's capability: want %q in %q", want, out)
		}
	}
	if err := s.claim(t, r.Handle, cp); err != nil {
		t.Fatalf("root's claim after the other uid's: %v", err)
	}
	if got, err := s.read(t, r.Handle); err != nil || string(got) != "root's only" {
		t.Fatalf("root's read: %q %v", got, err)
	}
}

// otherUID is the uid tests run a second client as.
const otherUID = 65534

// otherUIDStack starts a stack on the mem backend whose sockets a client
// of otherUID can reach; it skips the test unless it runs as root.
func otherUIDStack(t *testing.T) *stack.Stack {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: the test runs a client as uid %d", otherUID)
	}
	run, err := os.MkdirTemp("", "weir-uid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	if err := os.Chmod(run, 0o755); err != nil { // the other uid must reach the sockets
		t.Fatal(err)
	}
	cfg, err := stack.LocalConfig(t.TempDir(), run)
	if err != nil {
		t.Fatal(err)
	}
	cfg.IO.Backend = "mem"
	cfg.Ring.ArenaSize = 4 << 20
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st := startStack(t, cfg)
	t.Cleanup(func() { stopStack(t, st) })
	return st
}

// claimChild runs in the child: a session of its own, then the claim of
// the capability it was given, and a read naming the handle.
func claimChild() int {
	f := strings.Split(os.Getenv(envClaimChild), ",")
	if len(f) != 4 {
		fmt.Println("bad", envClaimChild)
		return 2
	}
	handle, err1 := strconv.ParseUint(f[2], 10, 64)
	cp, err2 := hex.DecodeString(f[3])
	if err1 != nil || err2 != nil {
		fmt.Println("bad", envClaimChild, err1, err2)
		return 2
	}
	ctx := context.Background()
	meta, err := ring.Dial(ctx, f[0], ring.ClientOptions{})
	if err != nil {
		fmt.Println("dial metadata:", err)
		return 2
	}
	defer meta.Close()
	data, err := ring.Dial(ctx, f[1], ring.ClientOptions{})
	if err != nil {
		fmt.Println("dial io:", err)
		return 2
	}
	defer data.Close()
	do := func(c *ring.Client, op uint8, h uint64, buf []byte) (ring.Completion, error) {
		return rawDo(ctx, c, op, h, buf, false)
	}
	hello := make([]byte, proto.HelloRespSize)
	copy(hello, (&proto.HelloReq{MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion, Features: capFeatures}).Append(nil))
	if comp, err := do(meta, proto.OpHello, 0, hello); err != nil || comp.Result != proto.HelloRespSize {
		fmt.Println("hello:", err, comp.Err())
		return 2
	}
	hr, err := proto.DecodeHelloResp(hello)
	if err != nil {
		fmt.Println("hello:", err)
		return 2
	}
	if comp, err := do(data, proto.OpAttach, 0, (&proto.AttachReq{Version: proto.Version, Session: hr.Session, Token: hr.Token}).Append(nil)); err != nil || comp.Result < 0 {
		fmt.Println("attach:", err, comp.Err())
		return 2
	}
	comp, err := do(data, proto.OpClaim, handle, cp)
	if err != nil {
		fmt.Println("claim call:", err)
		return 2
	}
	fmt.Println("claim:", comp.Err())
	comp, err = do(data, proto.OpRead, handle, make([]byte, 16))
	if err != nil {
		fmt.Println("read call:", err)
		return 2
	}
	fmt.Println("read:", comp.Err())
	return 0
}
