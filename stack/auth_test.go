package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// The attacker is this test binary run again with attackerEnv set, as
// another user when the tests run as root: a local process with no
// credentials of any kind that knows where NATS is (run/nats.url is
// world-readable) and tries what the control plane must not let it do.
const (
	attackerEnv = "WEIR_TEST_ATTACKER"
	nobodyUID   = 65534
)

// attackReport is what the attacker saw.
type attackReport struct {
	UID          int    `json:"uid"`
	Connected    bool   `json:"connected"`
	ConnectError string `json:"connect_error,omitempty"`
	DeletesAcked int    `json:"deletes_acked"` // deletes answered without an error
	GrantsAcked  int    `json:"grants_acked"`
	Sniffed      int    `json:"sniffed"` // session queries (with tokens) it read
}

// runAttacker is the attacker's main: url is the NATS server, the rest of
// the environment names the stack's namespace and the victim's blob.
func runAttacker(url string) int {
	r := attackReport{UID: os.Getuid()}
	ns := os.Getenv(attackerEnv + "_NS")
	var victim uint64
	fmt.Sscan(os.Getenv(attackerEnv+"_BLOB"), &victim)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		r.ConnectError = err.Error()
	} else {
		r.Connected = true
		sj := control.SubjectsIn(ns)
		if sub, err := nc.Subscribe(sj.Session, func(*nats.Msg) { r.Sniffed++ }); err == nil {
			defer sub.Unsubscribe()
		}
		for blob := uint64(1); blob <= 20; blob++ {
			var ack control.Ack
			if err := control.Request(nc, sj.Delete, control.Delete{Blob: blob}, &ack, time.Second); err == nil && ack.Error == "" {
				r.DeletesAcked++
			}
		}
		var ack control.Ack
		g := control.Grant{Session: 1<<40 | 1, Handle: 1<<40 | 99, Ino: victim, Blob: victim, Read: true, Write: true, Ver: 1 << 62}
		if err := control.Request(nc, sj.Grant, g, &ack, time.Second); err == nil && ack.Error == "" {
			r.GrantsAcked++
		}
		nc.Close()
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

// runAsNobody runs the command as uid 65534 when the tests run as root
// (and says so in the log otherwise: the attack then runs as this user,
// still without any credential). exe must be reachable by that user.
func runAsNobody(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyUID}}
	} else {
		t.Logf("not root: the other process runs as uid %d, without credentials", os.Getuid())
	}
}

// publicCopy copies the executable at exe to a directory every user can
// reach, so that another uid can run it.
func publicCopy(t *testing.T, exe string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "weir-public-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(dir, filepath.Base(exe))
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// attack runs the attacker against the NATS server at url.
func attack(t *testing.T, url, namespace string, victimBlob uint64) attackReport {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(publicCopy(t, self), "-test.run=^$")
	cmd.Env = append(os.Environ(), attackerEnv+"="+url, attackerEnv+"_NS="+namespace,
		fmt.Sprintf("%s_BLOB=%d", attackerEnv, victimBlob))
	runAsNobody(t, cmd)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("attacker: %v\n%s", err, stderr.String())
	}
	var r attackReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("attacker printed %q: %v", out, err)
	}
	t.Logf("attacker (uid %d): %+v", r.UID, r)
	return r
}

// victimStack runs a stack whose embedded server authenticates (or, with
// noAuth, admits anyone, as the stack did before it had credentials), and
// root's mode-0600 file "secret", closed.
func victimStack(t *testing.T, noAuth bool) (*stack.Stack, uint64, []byte) {
	t.Helper()
	c := stacktest.Config(t, "")
	log := hclog.New(&hclog.LoggerOptions{Name: "victim", Level: hclog.Error, Output: testOut{t}})
	var h stack.Hooks
	if noAuth {
		srv, err := control.StartEmbedded(control.EmbeddedOptions{Listen: config.DefaultNATSListen, UnsafeNoAuth: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		h.NATS, h.UnsafeNoCreds = srv, true
	}
	st, err := stack.StartWith(c, log, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = st.Shutdown(ctx)
	})
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	secret := []byte("root's secret, mode 0600")
	if err := fsys.WriteFile("secret", secret, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := fsys.Stat("secret")
	if err != nil {
		t.Fatal(err)
	}
	return st, fi.Sys().(*syscall.Stat_t).Ino, secret
}

func readSecret(t *testing.T, st *stack.Stack) ([]byte, error) {
	t.Helper()
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	return fsys.ReadFile("secret")
}

// TestForgedControlMessages: a local process without credentials, as
// another user, cannot speak on the control plane: its connection is
// refused, so its deletes and grants change nothing and root's file reads
// back intact. With authentication off (what the stack had before) the
// same attack deletes the file's data: the test can fail.
func TestForgedControlMessages(t *testing.T) {
	t.Run("authenticated", func(t *testing.T) {
		st, blob, secret := victimStack(t, false)
		r := attack(t, st.URL(), st.Config.NATS.Namespace, blob)
		if r.Connected || !strings.Contains(strings.ToLower(r.ConnectError), "authorization") {
			t.Fatalf("the attacker connected (%+v); want an authorization violation", r)
		}
		got, err := readSecret(t, st)
		if err != nil || !bytes.Equal(got, secret) {
			t.Fatalf("after the attack the file reads %q, %v; want it intact", got, err)
		}
		if n := st.IO.Snapshot()["deletes"]; n != uint64(0) {
			t.Errorf("io deleted %v blobs", n)
		}
	})
	t.Run("unauthenticated", func(t *testing.T) {
		st, blob, _ := victimStack(t, true)
		r := attack(t, st.URL(), st.Config.NATS.Namespace, blob)
		if !r.Connected || r.DeletesAcked == 0 {
			t.Fatalf("without authentication the attack should reach the services: %+v", r)
		}
		got, err := readSecret(t, st)
		if err != nil || len(got) != 0 {
			t.Fatalf("without authentication the forged deletes should have emptied the file; it reads %q, %v", got, err)
		}
	})
}

// TestRoleCannotForge: a process that holds a service's credentials may
// do only what that service does: the io role cannot send a grant or a
// delete, the cli role neither, the journal role neither, and only the
// journal role may commit a checkpoint's sizes (SetLiveBatch); the victim stays intact and io applies
// nothing.
func TestRoleCannotForge(t *testing.T) {
	st, blob, secret := victimStack(t, false)
	sj := control.SubjectsIn(st.Config.NATS.Namespace)
	for _, role := range []control.Role{control.RoleIO, control.RoleCLI, control.RoleJournal} {
		violations := make(chan error, 8)
		creds, err := control.LoadCreds(st.Config.NATS.CredsDir, role)
		if err != nil {
			t.Fatal(err)
		}
		opts, _ := creds.Options(st.Config.NATS.Namespace, role)
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
		nc, err := nats.Connect(st.URL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		forged := []struct {
			subj string
			msg  any
		}{
			{sj.Delete, control.Delete{Blob: blob}},
			{sj.Grant, control.Grant{Session: 1, Handle: 1, Ino: blob, Blob: blob, Read: true, Ver: 1}},
		}
		if role != control.RoleJournal {
			// Only the journal service commits a checkpoint's sizes: a
			// forged one would cut the victim to 0.
			forged = append(forged, struct {
				subj string
				msg  any
			}{sj.SetLiveBatch, control.SetLiveBatch{Live: []control.SetLive{{Ino: blob, Size: 0, DV: 1 << 62}}}})
		}
		for _, m := range forged {
			var ack control.Ack
			err := control.Request(nc, m.subj, m.msg, &ack, 500*time.Millisecond)
			if err == nil && ack.Error == "" {
				t.Errorf("role %s: %s was acknowledged", role, m.subj)
			}
			select {
			case v := <-violations:
				if !errors.Is(v, nats.ErrPermissionViolation) {
					t.Errorf("role %s: %s: %v, want a permissions violation", role, m.subj, v)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("role %s: %s: no permissions violation reported", role, m.subj)
			}
		}
		nc.Close()
	}
	if got, err := readSecret(t, st); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the file reads %q, %v; want it intact", got, err)
	}
	if n := st.IO.Snapshot()["deletes"]; n != uint64(0) {
		t.Errorf("io deleted %v blobs", n)
	}
}

// TestRefusesServerWithoutAuth: weir refuses an external NATS server that
// admits connections without credentials, saying why and what to do.
func TestRefusesServerWithoutAuth(t *testing.T) {
	open, err := control.StartEmbedded(control.EmbeddedOptions{Listen: config.DefaultNATSListen, UnsafeNoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Shutdown()
	c := stacktest.Config(t, "")
	c.NATS.URL = open.URL()
	_, err = stack.Start(c, hclog.NewNullLogger())
	if err == nil || !strings.Contains(err.Error(), "admits connections without credentials") || !strings.Contains(err.Error(), "weir nats-config") {
		t.Fatalf("Start on a server without authorization: %v", err)
	}
	s := &stack.Supervisor{Config: c, Log: hclog.NewNullLogger()}
	if err := s.Start(); err == nil || !strings.Contains(err.Error(), "admits connections without credentials") {
		t.Errorf("weir up on a server without authorization: %v", err)
	}
	s.Stop()
}

// TestStatusAsAnotherUser: weir status run by a user who cannot read the
// credentials says so, and to run it as the service user.
func TestStatusAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs weir status as uid 65534 against root's credentials")
	}
	// The run directory lies beside the data directory: put both where
	// every user can reach the run directory, as /run/weir is.
	base, err := os.MkdirTemp("", "weir-status-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := stack.LocalConfig(filepath.Join(base, "data"), "")
	if err != nil {
		t.Fatal(err)
	}
	s := startSupervisor(t, cfg, "")
	exe := publicCopy(t, buildWeir(t))
	cmd := exec.Command(exe, "status", "--data", cfg.DataDir)
	runAsNobody(t, cmd)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("weir status as uid %d: %v\n%s", nobodyUID, err, out)
	}
	if !strings.Contains(string(out), "permission denied reading "+cfg.NATS.CredsDir) || !strings.Contains(string(out), "run as the service user") {
		t.Errorf("weir status as uid %d (%v) said:\n%s", nobodyUID, err, out)
	}
	// As the service user it works.
	out, err = exec.Command(buildWeir(t), "status", "--data", cfg.DataDir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "weir-io") {
		t.Errorf("weir status as the service user: %v\n%s", err, out)
	}
	_ = s
}
