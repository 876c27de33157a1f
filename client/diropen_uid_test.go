package client_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
)

// envDirChild makes the test binary act as TestDirectOpenAsAnotherUID's
// child: "metadata socket,io socket".
const envDirChild = "WEIR_CLIENT_TEST_DIROPEN"

// TestDirectOpenAsAnotherUID: a client of another uid opens the files of
// a directory it may read directly, and not the one it may not: its
// snapshot does not list it, and the open through metadata is EACCES.
func TestDirectOpenAsAnotherUID(t *testing.T) {
	st := otherUIDStack(t)
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Mkdir("d", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name string
		mode os.FileMode
	}{{"f0", 0o644}, {"f1", 0o644}, {"f2", 0o644}, {"secret", 0o600}} {
		if err := c.WriteFile("d/"+f.name, []byte("of "+f.name), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := c.Chmod("d/"+f.name, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(copyTestBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s", envDirChild, st.Config.Metadata.Socket, st.Config.IO.Socket))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	for _, want := range []string{"f2: of f2 direct=1", "secret: " + syscall.EACCES.Error()} {
		if !strings.Contains(string(out), want) {
			t.Errorf("uid %d: want %q in %q", otherUID, want, out)
		}
	}
}

// dirOpenChild runs in the child: two cold opens for the snapshot, then
// the direct open of f2 and an open of secret.
func dirOpenChild() int {
	f := strings.Split(os.Getenv(envDirChild), ",")
	c, err := client.Dial(context.Background(), client.Options{MetadataSocket: f[0], IOSocket: f[1]})
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	defer c.Close()
	for _, n := range []string{"d/f0", "d/f1"} {
		if _, err := c.ReadFile(n); err != nil {
			fmt.Println(n+":", err)
			return 2
		}
	}
	for deadline := time.Now().Add(10 * time.Second); c.Snapshots.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			fmt.Println("no snapshot")
			return 2
		}
	}
	b, err := c.ReadFile("d/f2")
	fmt.Printf("f2: %s direct=%d %v\n", b, c.DirectOpens.Load(), err)
	_, err = c.ReadFile("d/secret")
	var errno syscall.Errno
	if pe, ok := err.(*os.PathError); ok {
		errno, _ = pe.Err.(syscall.Errno)
	}
	fmt.Printf("secret: %v (%v)\n", errno.Error(), err)
	return 0
}
