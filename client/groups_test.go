package client_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/stack"
)

// groupStack starts a stack on the mem backend whose trust groups are
// mode ("uid", "process" or "session").
func groupStack(t *testing.T, mode string) *stack.Stack {
	t.Helper()
	cfg := testConfig(t, t.TempDir(), "mem")
	cfg.Metadata.TrustGroups = mode
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st := startStack(t, cfg)
	t.Cleanup(func() { stopStack(t, st) })
	return st
}

func dialStack(t *testing.T, st *stack.Stack) *client.FS {
	t.Helper()
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func recalls(st *stack.Stack) uint64 { return st.Metadata.Snapshot()["recalls"].(uint64) }

// TestOneGroupSharesLeases: two sessions of one uid are one trust group
// (the default): both write one file, and neither recalls the other.
func TestOneGroupSharesLeases(t *testing.T) {
	st := groupStack(t, "uid")
	a, b := dialStack(t, st), dialStack(t, st)
	fa, err := a.OpenFile("shared", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := b.OpenFile("shared", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	for i := range 20 {
		if _, err := fa.WriteAt([]byte{'a'}, int64(2*i)); err != nil {
			t.Fatal(err)
		}
		if _, err := fb.WriteAt([]byte{'b'}, int64(2*i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if n := recalls(st); n != 0 {
		t.Fatalf("%d recalls between sessions of one trust group", n)
	}
	if ta, tb := client.Tenure(fa), client.Tenure(fb); ta == 0 || ta != tb {
		t.Fatalf("lease epochs %d and %d: one tenure wanted", ta, tb)
	}
}

// TestRecallAcrossGroups: sessions in two trust groups take a file's
// exclusive lease from each other: each write grant recalls the other's
// (io refuses the holder's next request, EBADF, and its client asks
// again), the lease epoch grows at each hand-over, and nothing written is
// lost. A reader of a third group recalls the writer too, and its kept
// lease, recalled in turn, is never used again.
func TestRecallAcrossGroups(t *testing.T) {
	st := groupStack(t, "session")
	a, b, r := dialStack(t, st), dialStack(t, st), dialStack(t, st)
	fa, err := a.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := b.OpenFile("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	var last uint64
	for i := range 10 {
		if _, err := fa.WriteAt([]byte{'a'}, int64(2*i)); err != nil {
			t.Fatalf("a's write %d: %v", i, err)
		}
		ta := client.Tenure(fa)
		if _, err := fb.WriteAt([]byte{'b'}, int64(2*i+1)); err != nil {
			t.Fatalf("b's write %d: %v", i, err)
		}
		tb := client.Tenure(fb)
		if ta <= last || tb <= ta {
			t.Fatalf("round %d: lease epochs %d then %d after %d: each hand-over must begin a later tenure", i, ta, tb, last)
		}
		last = tb
	}
	if n := recalls(st); n < 19 {
		t.Fatalf("%d recalls for 20 alternating writes of two groups, want at least 19", n)
	}
	got, err := r.ReadFile("f")
	if err != nil || string(got) != "abababababababababab" {
		t.Fatalf("read %q %v", got, err)
	}

	// r now keeps a read lease of f (its ReadFile), in a third group. A
	// write recalls it; r's next open must not use it.
	before := recalls(st)
	if _, err := fa.WriteAt([]byte("A"), 0); err != nil {
		t.Fatal(err)
	}
	if recalls(st) == before {
		t.Fatal("a's write recalled nothing: r's kept read lease and b's write grant were live")
	}
	got, err = r.ReadFile("f")
	if err != nil || string(got) != "Abababababababababab" {
		t.Fatalf("after the recall, read %q %v", got, err)
	}

	// With the client's regrant off, a recalled holder sees io's refusal.
	client.NoRegrant(t)
	if _, err := fb.WriteAt([]byte("B"), 1); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("write under a recalled grant: %v, want EBADF", err)
	}
	if got, err := r.ReadFile("f"); err != nil || got[1] != 'b' {
		t.Fatalf("read %q %v: the refused write took effect", got, err)
	}
}

// TestUnusedRecallProtectsNextGrant: a grant recalled before it served
// a request (an O_TRUNC open is granted at open) makes its handle's next
// grant protected, so the recall of that one waits out its MinTenure
// (recall_waits; 1 s here, the most allowed, so that the next write comes within
// it); a grant that served requests is recalled with no wait, however
// young.
func TestUnusedRecallProtectsNextGrant(t *testing.T) {
	cfg := testConfig(t, t.TempDir(), "mem")
	cfg.Metadata.TrustGroups = "session"
	cfg.Metadata.LeaseMinTenure = time.Second
	st := startStack(t, cfg)
	t.Cleanup(func() { stopStack(t, st) })
	a, b := dialStack(t, st), dialStack(t, st)
	stat := func(k string) uint64 { return st.Metadata.Snapshot()[k].(uint64) }
	fa, err := a.OpenFile("f", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644) // granted, unused
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := b.OpenFile("f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if _, err := fb.WriteAt([]byte("b"), 0); err != nil { // recalls a's unused grant
		t.Fatal(err)
	}
	if n := stat("recalls_unused"); n != 1 {
		t.Fatalf("recalls_unused %d after recalling a grant that served nothing, want 1", n)
	}
	// Used grants, young ones included, are recalled with no wait.
	for i := range 4 {
		f := fb
		if i%2 == 0 {
			f = fa // its first write after the recall: a protected grant
		}
		if _, err := f.WriteAt([]byte{'x'}, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if w := stat("recall_waits"); w != 1 {
		t.Fatalf("recall_waits %d: want 1 (b's recall of a's protected grant, and no other)", w)
	}
	if n := stat("recalls_unused"); n != 1 {
		t.Fatalf("recalls_unused %d: the alternating writes' grants each served their write", n)
	}
}

// TestRecallNotices: a session whose grants another group's recalled is
// told (proto.FeatureRecalls: a long-poll OpRecallWait it keeps
// outstanding, delivered at its next call or data-path read): the open
// file's cache mapping and the mappings kept under a recalled lease are
// dropped, and its next read asks for its grant again and reads the new
// bytes.
func TestRecallNotices(t *testing.T) {
	st := groupStack(t, "session")
	r, w := dialStack(t, st), dialStack(t, st)
	if err := w.WriteFile("f", []byte("old!"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile("g", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := r.Open("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rf := f.(*client.File)
	buf := make([]byte, 4)
	for range 4 { // the third read maps the region
		if _, err := rf.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if client.CacheFile(rf) == nil {
		t.Fatal("f's region is not mapped after four reads")
	}
	g, err := r.Open("g")
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := g.(*client.File).ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	g.Close() // its mapping stays, kept under the session's lease of g
	if n := client.KeptMappings(r); n != 1 {
		t.Fatalf("%d kept mappings after g's close, want 1", n)
	}
	before := r.RecallNotices.Load()
	for _, name := range []string{"f", "g"} {
		wf, err := w.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wf.WriteAt([]byte("new!"), 0); err != nil { // recalls r's grant
			t.Fatal(err)
		}
		wf.Close()
	}
	// The notices wait in r's completion queue until r looks: any call.
	deadline := time.Now().Add(10 * time.Second)
	for r.RecallNotices.Load() < before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d recall notices after recalls of two of r's grants, want 2", r.RecallNotices.Load()-before)
		}
		if _, err := r.Stat("f"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	for client.CacheFile(rf) != nil || client.KeptMappings(r) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the notices: f mapped %v, %d kept mappings; want none", client.CacheFile(rf) != nil, client.KeptMappings(r))
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := rf.ReadAt(buf, 0); err != nil || string(buf) != "new!" {
		t.Fatalf("read after the notice: %q %v", buf, err)
	}
	if n := st.Metadata.Snapshot()["recall_notices"].(uint64); n < 2 {
		t.Fatalf("recall_notices %d, want at least 2", n)
	}
}
