package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// peerAttackerEnv runs this test binary as a process that tries to open a
// session on a service socket (the socket path is the value).
const peerAttackerEnv = "WEIR_TEST_PEER_ATTACKER"

// runPeerAttacker tries a ring handshake on socket and prints what
// happened as JSON: {"uid":..., "error": "..."} ("" when it got a session).
func runPeerAttacker(socket string) int {
	var r struct {
		UID   int    `json:"uid"`
		Error string `json:"error"`
	}
	r.UID = os.Getuid()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ring.Dial(ctx, socket, ring.ClientOptions{})
	if err != nil {
		r.Error = err.Error()
	} else {
		// The service may refuse after the kernel accepted: a ping
		// shows whether the session works.
		if _, err := c.Do(ctx, &ring.Call{Op: ring.OpNop}); err != nil {
			r.Error = err.Error()
		}
		c.Close()
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

// TestServiceSocketIsTheServiceUsers: the service sockets (metadata's,
// that io keeps its session on, and io's journal socket, that the journal
// service keeps its session on) are mode 0600, and a process of another uid
// that gets past the mode (a socket whose mode was opened, or a system
// that does not honour socket modes) is refused by its peer credentials
// and counted in service_peers_refused; the metadata service runs on.
func TestServiceSocketIsTheServiceUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test connects to the service socket as uid 65534")
	}
	c := stacktest.Config(t, "")
	c.IO.Backend = "mem"
	if err := os.Chmod(c.RunDir, 0o755); err != nil { // as /run/weir is: clients reach their sockets
		t.Fatal(err)
	}
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe := publicCopy(t, self)
	for _, sv := range []struct {
		name, sock, connected string // connected: the stats key of the rightful peer's session
		snapshot              func() map[string]any
		health                func() error
	}{
		{"metadata", c.Metadata.ServiceSocket, "io_connected", st.Metadata.Snapshot, st.Metadata.Health},
		{"io (journal socket)", c.Journal.Socket, "journal_connected", st.IO.Snapshot, st.IO.Health},
	} {
		t.Run(sv.name, func(t *testing.T) {
			sock := sv.sock
			fi, err := os.Stat(sock)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("service socket %s is mode %v, want 0600", sock, fi.Mode().Perm())
			}
			try := func() (int, string) {
				t.Helper()
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), peerAttackerEnv+"="+sock)
				runAsNobody(t, cmd)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("peer attacker: %v\n%s", err, stderr.String())
				}
				var r struct {
					UID   int    `json:"uid"`
					Error string `json:"error"`
				}
				if err := json.Unmarshal(out, &r); err != nil {
					t.Fatalf("peer attacker printed %q: %v", out, err)
				}
				return r.UID, r.Error
			}
			if uid, e := try(); uid != nobodyUID || !strings.Contains(e, "permission denied") {
				t.Errorf("uid %d on the 0600 service socket: error %q, want permission denied", uid, e)
			}
			if err := os.Chmod(sock, 0o666); err != nil {
				t.Fatal(err)
			}
			before := sv.snapshot()["service_peers_refused"]
			if _, e := try(); e == "" {
				t.Error("another uid got a session on the service socket once its mode was opened")
			} else {
				t.Logf("refused: %s", e)
			}
			// The listener counts after it closed the connection: wait for it.
			for deadline := time.Now().Add(10 * time.Second); toUint(sv.snapshot()["service_peers_refused"]) != toUint(before)+1; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("service_peers_refused = %v, was %v: want one more", sv.snapshot()["service_peers_refused"], before)
				}
			}
			if err := sv.health(); err != nil {
				t.Errorf("%s after the refused peer: %v", sv.name, err)
			}
			if sv.snapshot()[sv.connected] != true {
				t.Errorf("the rightful peer's service session is gone (%s)", sv.connected)
			}
		})
	}
}

// toUint reads a stats counter.
func toUint(v any) uint64 {
	switch v := v.(type) {
	case uint64:
		return v
	case int64:
		return uint64(v)
	case int:
		return uint64(v)
	}
	return 0
}
