package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// TestLeaseCommand: weir lease ls lists the kept lease a client's read
// left (all of them, or a file's), and weir lease revoke ends it, by path
// or by id; a file open for writing shows as its group's exclusive lease.
func TestLeaseCommand(t *testing.T) {
	c := stacktest.Config(t, "")
	c.IO.Backend = "mem"
	st, err := stack.Start(c, hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	read := func(name string) {
		t.Helper()
		f, err := fsys.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, n := range []string{"a", "b"} {
		if err := fsys.WriteFile(n, []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
		read(n)
	}
	lease := func(args ...string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		flags := []string{"--nats-url", st.NATS.URL(), "--data", c.DataDir, "--run-dir", c.RunDir}
		code := runLease(&stdout, &stderr, append(append(args[:1:1], flags...), args[1:]...))
		return code, stdout.String(), stderr.String()
	}
	ls := func(args ...string) []control.LeaseInfo {
		t.Helper()
		code, out, errOut := lease(append([]string{"ls", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("weir lease ls exited %d: %s%s", code, out, errOut)
		}
		var l []control.LeaseInfo
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("weir lease ls --json printed %q: %v", out, err)
		}
		return l
	}
	if l := ls(); len(l) != 2 || l[0].Handles != 0 || l[0].UID != st.Metadata.Leases()[0].UID {
		t.Fatalf("weir lease ls: %+v", l)
	}
	la := ls("--file", "a")
	if len(la) != 1 {
		t.Fatalf("weir lease ls --file a: %+v", la)
	}
	if code, out, errOut := lease("ls", "--file", "a"); code != 0 || !strings.Contains(out, fmt.Sprint(la[0].Lease)) || !strings.Contains(out, "idle") {
		t.Fatalf("weir lease ls --file a (table) exited %d: %s%s", code, out, errOut)
	}
	if code, out, errOut := lease("revoke", "a"); code != 0 || !strings.HasPrefix(out, "1 ended") {
		t.Fatalf("weir lease revoke a exited %d: %s%s", code, out, errOut)
	}
	if l := ls("--file", "a"); len(l) != 0 {
		t.Fatalf("a's lease is still listed after its revoke: %+v", l)
	}
	lb := ls()
	if code, out, errOut := lease("revoke", fmt.Sprint(lb[0].Lease)); code != 0 || !strings.HasPrefix(out, "1 ended") {
		t.Fatalf("weir lease revoke %d exited %d: %s%s", lb[0].Lease, code, out, errOut)
	}
	if l := ls(); len(l) != 0 {
		t.Fatalf("leases listed after both were revoked: %+v", l)
	}
	read("a") // a new lease: the file still reads

	// A file open for writing, written: its trust group's exclusive
	// lease, listed with its group and tenure while the file is open.
	w, err := fsys.OpenFile("b", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("B"), 0); err != nil {
		t.Fatal(err)
	}
	lw := ls("--file", "b")
	if len(lw) != 1 || lw[0].Mode != "exclusive" || lw[0].Tenure == 0 || !strings.HasPrefix(lw[0].Group, "uid:") {
		t.Fatalf("weir lease ls --file b with b open for writing: %+v", lw)
	}
	if code, out, errOut := lease("ls", "--file", "b"); code != 0 || !strings.Contains(out, "exclusive") || !strings.Contains(out, "open for writing") {
		t.Fatalf("weir lease ls --file b (table) exited %d: %s%s", code, out, errOut)
	}
	if code, out, errOut := lease("revoke", "b"); code != 0 || !strings.Contains(out, "1 exclusive") {
		t.Fatalf("weir lease revoke b exited %d: %s%s", code, out, errOut)
	}
	w.Close()
	if l := ls("--file", "b"); len(l) != 0 {
		t.Fatalf("b's exclusive lease is listed after its close: %+v", l)
	}
	if code, _, _ := lease("revoke"); code != 2 {
		t.Errorf("weir lease revoke without an argument exited %d, want 2", code)
	}
}
