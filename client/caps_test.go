package client_test

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/ring"
)

// capCounts are the counters a read grant moves: grants through io (a
// NATS round trip), capabilities minted, and claims io installed.
type capCounts struct{ grants, minted, claims uint64 }

// grantCap asks metadata to grant handle h on raw session s with room for
// a capability, and returns the completion and the capability.
func (s *rawSession) grantCap(t *testing.T, h uint64, arg uint32) (ring.Completion, []byte) {
	t.Helper()
	b, err := s.meta.Alloc(context.Background(), proto.CapSize)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	comp, err := s.meta.Do(context.Background(), &ring.Call{Op: proto.OpGrant, Arg: arg, Handle: h, Buf: b})
	if err != nil {
		t.Fatal(err)
	}
	c := make([]byte, proto.CapSize)
	if comp.Result == proto.CapSize {
		b.CopyTo(c)
	}
	return comp, c
}

// claim presents capability c for data handle h on s's IO ring.
func (s *rawSession) claim(t *testing.T, h uint64, c []byte) error {
	t.Helper()
	return rawCall(t, s.data, proto.OpClaim, h, c).Err()
}

const capFeatures = proto.FeatureLeases | proto.FeatureCaps

// TestColdReadClaimsCapability: a session's first read of a file whose
// size io reported in this epoch is granted by a capability it claims at
// io: no NATS grant. A file io has not reported since it started is
// granted through io first, and claimed by the next session.
func TestColdReadClaimsCapability(t *testing.T) {
	c, st := newFS(t)
	if err := c.WriteFile("f", []byte("written by the first session"), 0o644); err != nil {
		t.Fatal(err) // its write grant's ack reports the size: sized
	}
	counts := func() capCounts {
		m := st.Metadata.Snapshot()
		return capCounts{st.Metadata.Stats.Grants.Load(), m["caps_minted"].(uint64), st.IO.Stats.Claims.Load()}
	}
	for i := range 3 {
		c2, err := st.Dial(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		before := counts()
		f, err := c2.Open("f")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(f)
		if err != nil || string(got) != "written by the first session" {
			t.Fatalf("session %d read %q, %v", i, got, err)
		}
		f.Close()
		after := counts()
		if d := (capCounts{after.grants - before.grants, after.minted - before.minted, after.claims - before.claims}); d != (capCounts{0, 1, 1}) {
			t.Errorf("session %d's cold read: %+v grants through io, capabilities minted, claims; want 0, 1, 1", i, d)
		}
		c2.Close()
	}
}

// TestClaimRefusals: io installs a grant only from a capability of its
// own epoch, for the session and handle it names, and not once the grant
// it stands for was revoked (the session's lease ended), or the session
// ended; the client then grants through io, which metadata does only for
// a handle that is still the session's.
func TestClaimRefusals(t *testing.T) {
	c, st := newFS(t)
	for _, n := range []string{"a", "b"} {
		if err := c.WriteFile(n, []byte("contents of "+n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := dialRaw(t, st, capFeatures)
	other := dialRaw(t, st, capFeatures)
	ra := s.open(t, "a")
	comp, capA := s.grantCap(t, ra.Handle, 0)
	if comp.Result != proto.CapSize || comp.Aux != ra.Handle {
		t.Fatalf("grant of a: %+v, want a capability for data handle %d", comp, ra.Handle)
	}
	// Nothing is served before the claim.
	if _, err := s.read(t, ra.Handle); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read before the claim: %v, want EBADF", err)
	}
	forged := make([]byte, proto.CapSize)
	rand.Read(forged)
	for _, tc := range []struct {
		what   string
		s      *rawSession
		handle uint64
		cap    []byte
		want   error
	}{
		{"made-up bytes", s, ra.Handle, forged, syscall.EKEYREJECTED},
		{"a short capability", s, ra.Handle, capA[:proto.CapSize-1], syscall.EINVAL},
		{"another session's", other, ra.Handle, capA, syscall.EPERM},
		{"named for another handle", s, ra.Handle + 1, capA, syscall.EPERM},
	} {
		if err := tc.s.claim(t, tc.handle, tc.cap); !errors.Is(err, tc.want) {
			t.Errorf("claim of %s: %v, want %v", tc.what, err, tc.want)
		}
	}
	if _, err := other.read(t, ra.Handle); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("another session read with the handle: %v, want EBADF", err)
	}
	if err := s.claim(t, ra.Handle, capA); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := s.claim(t, ra.Handle, capA); err != nil {
		t.Fatalf("the same claim again: %v, want success (a retry)", err)
	}
	if got, err := s.read(t, ra.Handle); err != nil || string(got) != "contents of a" {
		t.Fatalf("read after the claim: %q %v", got, err)
	}
	// The lease ends (the mode changes, the handle closed): the grant is
	// revoked, and its capability claims nothing any more.
	if comp := bare(t, s.meta, proto.OpClose, ra.Handle); comp.Result < 0 {
		t.Fatal(comp.Err())
	}
	if err := c.Chmod("a", 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.read(t, ra.Handle); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read after the lease ended: %v, want EBADF", err)
	}
	if err := s.claim(t, ra.Handle, capA); !errors.Is(err, syscall.EKEYREJECTED) {
		t.Fatalf("claim after the revoke: %v, want EKEYREJECTED", err)
	}
	// An unclaimed capability is spent by a revoke too: b's is minted,
	// its lease ended before the claim.
	rb := s.open(t, "b")
	comp, capB := s.grantCap(t, rb.Handle, 0)
	if comp.Result != proto.CapSize {
		t.Fatalf("grant of b: %+v", comp)
	}
	if comp := bare(t, s.meta, proto.OpClose, rb.Handle); comp.Result < 0 {
		t.Fatal(comp.Err())
	}
	if err := c.Chmod("b", 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.claim(t, rb.Handle, capB); !errors.Is(err, syscall.EKEYREJECTED) {
		t.Fatalf("claim of a capability whose lease ended unclaimed: %v, want EKEYREJECTED", err)
	}
	// Granting through io is for handles that are the session's: a closed
	// one is not.
	if comp, _ := s.grantCap(t, rb.Handle, proto.GrantThroughIO); !errors.Is(comp.Err(), syscall.EBADF) {
		t.Fatalf("grant through io of a closed handle: %v, want EBADF", comp.Err())
	}
	if _, err := s.read(t, rb.Handle); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read with b's handle: %v, want EBADF", err)
	}
	// A refused claim of an open handle: granted through io instead.
	if err := c.Chmod("b", 0o644); err != nil {
		t.Fatal(err)
	}
	rb2 := s.open(t, "b")
	comp, capB2 := s.grantCap(t, rb2.Handle, 0)
	if comp.Result != proto.CapSize {
		t.Fatalf("grant of b again: %+v", comp)
	}
	capB2[0] ^= 1 // as if of another io epoch
	if err := s.claim(t, rb2.Handle, capB2); !errors.Is(err, syscall.EKEYREJECTED) {
		t.Fatalf("claim of a damaged capability: %v", err)
	}
	grants := st.Metadata.Stats.Grants.Load()
	if comp, _ := s.grantCap(t, rb2.Handle, proto.GrantThroughIO); comp.Result != 0 || comp.Aux != rb2.Handle {
		t.Fatalf("grant through io: %+v", comp)
	}
	if st.Metadata.Stats.Grants.Load() != grants+1 {
		t.Error("the grant through io sent no grant to io")
	}
	if got, err := s.read(t, rb2.Handle); err != nil || string(got) != "contents of b" {
		t.Fatalf("read after the grant through io: %q %v", got, err)
	}
	// The session ends (its metadata ring closes) while its IO ring stays:
	// a capability minted before claims nothing.
	rc := other.open(t, "b")
	comp, capC := other.grantCap(t, rc.Handle, 0)
	if comp.Result != proto.CapSize {
		t.Fatalf("grant of b to the other session: %+v", comp)
	}
	other.meta.Close()
	waitUntil(t, "the other session ended at io", func() bool { return st.Metadata.Snapshot()["sessions"].(int64) == 2 })
	waitUntil(t, "the other session's end reached io", func() bool {
		return errors.Is(other.claim(t, rc.Handle, capC), syscall.EKEYREJECTED)
	})
}

// TestCapsAfterRestart: after the services restart on the same data, the
// first read grant of a file goes through io (which reports its size), and
// the next session's is a capability again.
func TestCapsAfterRestart(t *testing.T) {
	cfg := testConfig(t, t.TempDir(), "file")
	st := startStack(t, cfg)
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("kept across the restart")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c.Close()
	stopStack(t, st)
	st = startStack(t, cfg)
	defer stopStack(t, st)
	read := func() capCounts {
		t.Helper()
		before := capCounts{st.Metadata.Stats.Grants.Load(), st.Metadata.Snapshot()["caps_minted"].(uint64), st.IO.Stats.Claims.Load()}
		c, err := st.Dial(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		got, err := c.ReadFile("f")
		if err != nil || string(got) != "kept across the restart" {
			t.Fatalf("read %q, %v", got, err)
		}
		return capCounts{st.Metadata.Stats.Grants.Load() - before.grants, st.Metadata.Snapshot()["caps_minted"].(uint64) - before.minted, st.IO.Stats.Claims.Load() - before.claims}
	}
	if d := read(); d != (capCounts{1, 0, 0}) {
		t.Errorf("first read after the restart: %+v, want one grant through io", d)
	}
	if d := read(); d != (capCounts{0, 1, 1}) {
		t.Errorf("second session's read: %+v, want a capability claimed", d)
	}
}

// TestFailedClaimsRecover: a client whose claim is refused grants through
// io and reads; one whose claim never reached io (metadata recorded the
// grant, io holds none) is answered EBADF and recovers the same way, also
// at the next open under the kept lease.
func TestFailedClaimsRecover(t *testing.T) {
	c, st := newFS(t)
	for _, n := range []string{"a", "b"} {
		if err := c.WriteFile(n, []byte("contents of "+n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		skip bool
	}{{"a", false}, {"b", true}} {
		t.Run(map[bool]string{false: "refused", true: "skipped"}[tc.skip], func(t *testing.T) {
			c2, err := st.Dial(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			client.BreakClaims(t, tc.skip)
			through := st.Metadata.Snapshot()["caps_refused_grants"].(uint64)
			for i := range 3 { // the first open claims; the next two use the kept lease
				got, err := c2.ReadFile(tc.name)
				if err != nil || string(got) != "contents of "+tc.name {
					t.Fatalf("read %d: %q, %v", i, got, err)
				}
			}
			if n := st.Metadata.Snapshot()["caps_refused_grants"].(uint64) - through; n != 1 {
				t.Errorf("%d grants through io, want 1", n)
			}
		})
	}
}

// TestClaimFloorsEndWithSessions: io remembers a session's revoked
// capabilities only while a ring of the session may still claim: once the
// session ended and its rings are gone, nothing is left of it.
func TestClaimFloorsEndWithSessions(t *testing.T) {
	c, st := newFS(t)
	if err := c.WriteFile("f", []byte("contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	floors := func() int { return st.IO.Snapshot()["claim_floors"].(int) }
	base := floors()
	for i := range 5 {
		s := dialRaw(t, st, capFeatures)
		r := s.open(t, "f")
		comp, cp := s.grantCap(t, r.Handle, 0)
		if comp.Result != proto.CapSize {
			t.Fatalf("grant: %+v", comp)
		}
		if i%2 == 0 {
			if err := s.claim(t, r.Handle, cp); err != nil {
				t.Fatal(err)
			}
		}
		if comp := bare(t, s.meta, proto.OpClose, r.Handle); comp.Result < 0 {
			t.Fatal(comp.Err())
		}
		if err := c.Chmod("f", fs.FileMode(0o600|(i%2)<<2)); err != nil { // ends the lease: a revoke, a floor
			t.Fatal(err)
		}
		waitUntil(t, "the revoke's floor", func() bool { return floors() == base+1 })
		s.meta.Close()
		s.data.Close()
		waitUntil(t, "the ended session's floor forgotten", func() bool { return floors() == base })
	}
}

// TestOpenAnswersCapability: with FeatureOpenCap a read-only open of a
// file the session holds no lease of answers the read capability OpGrant
// would, so that a cold open + read is the open and the claim, with no
// OpGrant; an open never waits for a recall, so a file another trust
// group holds for writing gets none; and the Go client, which asks for
// the feature, reads a file it never opened with no grant through io,
// even when an earlier open of it closed before reading (the capability
// waits under the kept lease for the next open).
func TestOpenAnswersCapability(t *testing.T) {
	cfg := testConfig(t, t.TempDir(), "mem")
	cfg.Metadata.TrustGroups = "session"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st := startStack(t, cfg)
	t.Cleanup(func() { stopStack(t, st) })
	c := dialStack(t, st)
	for _, n := range []string{"a", "b", "held", "late"} {
		if err := c.WriteFile(n, []byte("contents of "+n), 0o644); err != nil {
			t.Fatal(err) // each write grant's ack reports the size: sized
		}
	}
	counts := func() capCounts {
		m := st.Metadata.Snapshot()
		return capCounts{st.Metadata.Stats.Grants.Load(), m["caps_minted"].(uint64), st.IO.Stats.Claims.Load()}
	}
	delta := func(before capCounts) capCounts {
		a := counts()
		return capCounts{a.grants - before.grants, a.minted - before.minted, a.claims - before.claims}
	}

	s := dialRaw(t, st, capFeatures|proto.FeatureOpenCap)
	before := counts()
	ra := s.open(t, "a")
	if !ra.HasCap || ra.Granted || ra.DataHandle != ra.Handle {
		t.Fatalf("cold open of a: %+v, want a capability for its own handle, not granted", ra)
	}
	if _, err := s.read(t, ra.Handle); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read before the claim: %v, want EBADF", err)
	}
	if err := s.claim(t, ra.Handle, ra.Cap[:]); err != nil {
		t.Fatalf("claim of open's capability: %v", err)
	}
	if got, err := s.read(t, ra.Handle); err != nil || string(got) != "contents of a" {
		t.Fatalf("read after the claim: %q %v", got, err)
	}
	if d := delta(before); d != (capCounts{0, 1, 1}) {
		t.Errorf("open + claim + read: %+v grants through io, capabilities minted, claims; want 0, 1, 1", d)
	}
	// Reopened under the session's kept lease: granted, no capability.
	if comp := bare(t, s.meta, proto.OpClose, ra.Handle); comp.Result < 0 {
		t.Fatal(comp.Err())
	}
	if r := s.open(t, "a"); !r.Granted || r.HasCap || r.DataHandle != ra.Handle {
		t.Fatalf("open of a under its kept lease: %+v, want granted on data handle %d, no capability", r, ra.Handle)
	}

	// A session without the feature gets the old layout and no capability.
	old := dialRaw(t, st, capFeatures)
	if rb := old.open(t, "b"); rb.HasCap || rb.CapRoom || rb.Granted {
		t.Fatalf("open without FeatureOpenCap: %+v", rb)
	}

	// Another trust group writes "held": the open answers no capability
	// (it would have to recall), and the first read's OpGrant recalls.
	w, err := c.OpenFile("held", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt([]byte("C"), 0); err != nil {
		t.Fatal(err)
	}
	rh := s.open(t, "held")
	if rh.HasCap || rh.Granted {
		t.Fatalf("open of a file another group holds for writing: %+v, want neither granted nor a capability", rh)
	}
	comp, capH := s.grantCap(t, rh.Handle, 0)
	if comp.Result != proto.CapSize {
		t.Fatalf("grant of held: %+v", comp)
	}
	if err := s.claim(t, rh.Handle, capH); err != nil {
		t.Fatal(err)
	}
	if got, err := s.read(t, rh.Handle); err != nil || string(got) != "Contents of held" {
		t.Fatalf("read of held after the recall: %q %v", got, err)
	}

	// The Go client: an open closed before its first read leaves its
	// capability for the next open under the lease.
	c2 := dialStack(t, st)
	before = counts()
	f, err := c2.Open("late")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = c2.Open("late")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	f.Close()
	if err != nil || string(got) != "contents of late" {
		t.Fatalf("read of late: %q %v", got, err)
	}
	if d := delta(before); d != (capCounts{0, 1, 1}) {
		t.Errorf("open, close, open + read: %+v grants through io, capabilities minted, claims; want 0, 1, 1", d)
	}
}

// TestOpenWithAShortReplyBuffer: an open whose reply buffer cannot hold
// the answer the session's features make is refused ERANGE before
// anything happens: no file created, no handle, lease or capability left
// behind that the client never heard of (review finding: a client that
// negotiated FeatureOpenCap with the old buffer size leaked one per open).
func TestOpenWithAShortReplyBuffer(t *testing.T) {
	c, st := newFS(t)
	if err := c.WriteFile("old", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := dialRaw(t, st, capFeatures|proto.FeatureOpenCap)
	handles := st.Metadata.Snapshot()["handles"]
	minted := st.Metadata.Snapshot()["caps_minted"]
	for _, tc := range []struct {
		name  string
		flags int
	}{{"new", os.O_RDWR | os.O_CREATE}, {"old", os.O_RDONLY}} {
		req := (&proto.ModePathReq{Path: tc.name, Mode: 0o644}).Append(nil)
		b, err := s.meta.Alloc(context.Background(), proto.OpenRespSize(s.features)-1)
		if err != nil {
			t.Fatal(err)
		}
		b.CopyFrom(req)
		comp, err := s.meta.Do(context.Background(), &ring.Call{Op: proto.OpOpen, Arg: uint32(tc.flags), Handle: proto.RootHandle, Buf: b})
		b.Release()
		if err != nil || !errors.Is(comp.Err(), syscall.ERANGE) {
			t.Fatalf("open %s with a short reply buffer: %+v %v, want ERANGE", tc.name, comp, err)
		}
	}
	if _, err := c.Stat("new"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat of the file a refused open would have created: %v", err)
	}
	m := st.Metadata.Snapshot()
	if m["handles"] != handles || m["caps_minted"] != minted {
		t.Errorf("handles %v → %v, capabilities minted %v → %v: a refused open left state behind", handles, m["handles"], minted, m["caps_minted"])
	}
}
