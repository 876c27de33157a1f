package client_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
)

// A child process dials weir, opens files and waits to be killed.
const (
	envChild    = "WEIR_CLIENT_TEST_CHILD"
	envChildBig = "WEIR_CLIENT_TEST_CHILD_BIG"
	envMetaSock = "WEIR_CLIENT_TEST_METADATA"
	envIOSock   = "WEIR_CLIENT_TEST_IO"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(childClient())
	}
	if os.Getenv(envReopen) != "" {
		os.Exit(reopenChild())
	}
	if os.Getenv(envClaimChild) != "" {
		os.Exit(claimChild())
	}
	if os.Getenv(envHammer) != "" {
		os.Exit(hammerChild())
	}
	if os.Getenv(envHolder) != "" {
		os.Exit(holderChild())
	}
	if os.Getenv(envDirChild) != "" {
		os.Exit(dirOpenChild())
	}
	if os.Getenv(envFair) != "" {
		os.Exit(fairChild())
	}
	stop, err := exampleServices()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the services for Example:", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

func childClient() int {
	c, err := client.Dial(context.Background(), client.Options{
		MetadataSocket: os.Getenv(envMetaSock), IOSocket: os.Getenv(envIOSock)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := range 3 {
		f, err := c.Create(fmt.Sprintf("child-%d", i))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := f.Write([]byte("unsynced but written")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if os.Getenv(envChildBig) != "" {
		// A MiB that stays dirty in the IO service's cache (no fsync).
		f, err := c.Create("child-big")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := f.Write(bigData()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("ready")
	select {}
}

// TestClientDeathFreesSession: SIGKILL a client process holding open files;
// both services notice, release its handles and grants, and record what it
// wrote.
func TestClientDeathFreesSession(t *testing.T) {
	c, st := newFS(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1",
		envMetaSock+"="+st.Config.Metadata.Socket, envIOSock+"="+st.Config.IO.Socket)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		cmd.Process.Kill()
		t.Fatalf("child: %q %v", line, err)
	}
	if h := st.Metadata.Stats.Handles.Load(); h != 3 {
		t.Fatalf("%d handles open before the kill, want 3", h)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for st.Metadata.Stats.Handles.Load() != 0 || st.IO.Stats.Grants.Load() != 0 || st.Metadata.Stats.Sessions.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after the kill: %d handles, %d grants, %d metadata sessions",
				st.Metadata.Stats.Handles.Load(), st.IO.Stats.Grants.Load(), st.Metadata.Stats.Sessions.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 3 {
		got, err := c.ReadFile(fmt.Sprintf("child-%d", i))
		if err != nil || string(got) != "unsynced but written" {
			t.Fatalf("child-%d: %q %v", i, got, err)
		}
	}
}

func bigData() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i*7 + i/4096)
	}
	return b
}

// TestClientDeathWritesReachHome: a client killed with writes that are
// still dirty in the IO service's cache (written back later, no fsync)
// loses nothing, as on Linux a process crash loses no write that
// returned: once its handles are released the dirty pages are written
// home, and a clean restart of the services (the file backend) reads
// them from the device.
func TestClientDeathWritesReachHome(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir, "file")
	st := startStack(t, cfg)
	cmd := startChild(t, os.Args[0], nil, cfg, "ready", envChild+"=1", envChildBig+"=1")
	if d := st.IO.Snapshot()["cache_dirty_pages"].(int64); d < 256 {
		t.Errorf("%d dirty pages before the kill: the child's MiB is not waiting in the cache", d)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for st.IO.Stats.Grants.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the kill: %d grants", st.IO.Stats.Grants.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The grants go at the revocation; the last reference to each blob
	// (a request finishing) writes its dirty pages home just after.
	for d := st.IO.Snapshot()["cache_dirty_pages"].(int64); d != 0; d = st.IO.Snapshot()["cache_dirty_pages"].(int64) {
		if time.Now().After(deadline) {
			t.Fatalf("%d dirty pages after the child's handles were released, want 0 (written home at the last close)", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopStack(t, st)
	st = startStack(t, cfg)
	defer stopStack(t, st)
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.ReadFile("child-big")
	if err != nil || !bytes.Equal(got, bigData()) {
		t.Fatalf("child-big after the kill and a restart: %d bytes, %v; want the MiB it wrote", len(got), err)
	}
}

// startChild runs bin (this test binary, or a copy another uid may run)
// as a child client of the stack of cfg, with the credentials cred (nil:
// this process's) and env added to its environment, and waits for it to
// print the line want.
func startChild(t *testing.T, bin string, cred *syscall.Credential, cfg *config.Config, want string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...),
		envMetaSock+"="+cfg.Metadata.Socket, envIOSock+"="+cfg.IO.Socket)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != want {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q %v, want %q", line, err, want)
	}
	return cmd
}
