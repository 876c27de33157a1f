package stack_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/proto"
	"github.com/weir-storage/weir/services/metadata/ns"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// lockedBuffer collects log lines from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// send publishes msg (JSON, or raw bytes) on subj and returns the reply's
// error text.
func send(t *testing.T, nc *nats.Conn, subj string, msg any) string {
	t.Helper()
	data, ok := msg.([]byte)
	if !ok {
		var err error
		if data, err = json.Marshal(msg); err != nil {
			t.Fatal(err)
		}
	}
	m, err := nc.Request(subj, data, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subj, err)
	}
	var reply struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		t.Fatalf("%s: reply %q: %v", subj, m.Data, err)
	}
	return reply.Error
}

// TestControlMessagesValidated: messages on the control plane are checked
// as strictly as ring descriptors, even from a service with the right
// credentials: a malformed body, a grant for a session that is not
// attached or of another incarnation, a blob metadata did not allocate, a
// stale version: each is refused with a clear error, counted by kind,
// logged once per kind, and changes nothing.
func TestControlMessagesValidated(t *testing.T) {
	c := stacktest.Config(t, "")
	c.IO.Backend = "mem"
	var logs lockedBuffer
	st, err := stack.Start(c, hclog.New(&hclog.LoggerOptions{Name: "v", Level: hclog.Warn, Output: &logs}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	raw := rawDial(t, c)
	handle := raw.open(t, "f")
	wb := []byte("intact")
	if comp := rawDo(t, raw.data, proto.OpWrite, handle, 0, wb, nil); comp.Result != int64(len(wb)) {
		t.Fatalf("write: %+v", comp)
	}
	fi, err := os.Stat(c.DataDir) // the data directory is the service user's alone
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data directory %s: %v %v, want mode 0700", c.DataDir, fi.Mode(), err)
	}
	ino := raw.fstat(t, handle).Ino
	md, err := st.Connect(control.RoleMetadata, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	sj := control.SubjectsIn(c.NATS.Namespace)
	inc := st.Metadata.Incarnation()
	other := proto.MakeID(inc, 1<<30) // a session of this incarnation no one has
	grantsBefore := st.IO.Snapshot()["grants"]
	want := map[string]uint64{}
	for _, tc := range []struct {
		name, subj string
		msg        any
		kind       string
	}{
		{"not JSON", sj.Grant, []byte("{not json"), "malformed"},
		{"unknown field", sj.Grant, []byte(`{"session":1,"handle":1,"ino":5,"blob":5,"read":true,"ver":1,"extra":1}`), "malformed"},
		{"two objects", sj.Grant, []byte(`{"session":1} {"session":2}`), "malformed"},
		{"zero handle", sj.Grant, control.Grant{Session: raw.hello.Session, Ino: ino, Blob: ino, Read: true, Ver: 1 << 50}, "malformed"},
		{"blob is not the inode", sj.Grant, control.Grant{Session: raw.hello.Session, Handle: proto.MakeID(inc, 1<<20), Ino: ino, Blob: ino + 1, Read: true, Ver: 1 << 50}, "malformed"},
		{"no access", sj.Grant, control.Grant{Session: raw.hello.Session, Handle: proto.MakeID(inc, 1<<20), Ino: ino, Blob: ino, Ver: 1 << 50}, "malformed"},
		{"unknown session", sj.Grant, control.Grant{Session: other, Handle: proto.MakeID(inc, 1<<20), Ino: ino, Blob: ino, Read: true, Ver: 1 << 50}, "unknown_session"},
		{"another incarnation", sj.Grant, control.Grant{Session: proto.MakeID(inc+1, 1), Handle: proto.MakeID(inc+1, 1), Ino: ino, Blob: ino, Read: true, Ver: 1 << 50}, "stale_incarnation"},
		{"unallocated blob", sj.Grant, control.Grant{Session: raw.hello.Session, Handle: proto.MakeID(inc, 1<<20), Ino: 1 << 40, Blob: 1 << 40, Read: true, Ver: 1 << 50}, "unallocated_blob"},
		{"granted twice", sj.Grant, control.Grant{Session: raw.hello.Session, Handle: handle, Ino: ino, Blob: ino, Read: true, Ver: 1 << 50}, "duplicate"},
		{"stale grant", sj.Grant, control.Grant{Session: raw.hello.Session, Handle: proto.MakeID(inc, 1<<20), Ino: ino, Blob: ino, Read: true, Write: true, Ver: 1}, "stale_version"},
		{"stale revoke", sj.Revoke, control.Revoke{Session: raw.hello.Session, Handle: handle, Blob: ino, Ver: 1}, "stale_version"},
		{"revoke of another blob", sj.Revoke, control.Revoke{Session: raw.hello.Session, Handle: handle, Blob: ino + 7, Ver: 1 << 50}, "malformed"},
		{"revoke without a version", sj.Revoke, control.Revoke{Session: raw.hello.Session, Handle: handle, Blob: ino}, "malformed"},
		{"delete of blob 0", sj.Delete, control.Delete{}, "malformed"},
		{"resync of incarnation 0", sj.Resync, control.Resync{AllocLimit: 1}, "malformed"},
		{"blobs page too large", sj.Blobs, control.BlobsQuery{Max: 1 << 20}, "malformed"},
	} {
		want[tc.kind] += 2
		for range 2 { // the second refusal of a kind is counted, not logged
			got := send(t, md, tc.subj, tc.msg)
			if !strings.HasPrefix(got, tc.kind+": ") {
				t.Errorf("%s: reply %q, want a refusal of kind %s", tc.name, got, tc.kind)
			}
		}
	}
	// A delete of a blob that is open is refused as busy, not applied.
	if got := send(t, md, sj.Delete, control.Delete{Blob: ino}); !strings.Contains(got, "still open") {
		t.Errorf("delete of an open blob: %q", got)
	}
	// Nothing changed: the raw session's handle still reads its bytes,
	// io holds the same grants, and stats counted every refusal.
	out := make([]byte, 64)
	comp := rawDo(t, raw.data, proto.OpRead, handle, 0, nil, out)
	if string(out[:max(comp.Result, 0)]) != "intact" {
		t.Fatalf("after the forged messages the file reads %q (%+v)", out[:max(comp.Result, 0)], comp)
	}
	snap := st.IO.Snapshot()
	if snap["grants"] != grantsBefore {
		t.Errorf("io grants %v, were %v", snap["grants"], grantsBefore)
	}
	for kind, n := range want {
		if got := snap["control_refused_"+kind]; got != n {
			t.Errorf("control_refused_%s = %v, want %d", kind, got, n)
		}
	}
	for _, kind := range []string{"malformed", "unknown_session", "unallocated_blob", "stale_version"} {
		if n := strings.Count(logs.String(), "kind="+kind+" "); n != 1 {
			t.Errorf("refusals of kind %s logged %d times, want once:\n%s", kind, n, logs.String())
		}
	}

	// The metadata side: io's reports and session checks are validated
	// too, and a report older than one applied is ignored (a size never
	// goes backwards).
	ioc, err := st.Connect(control.RoleIO, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		subj string
		msg  any
		kind string
	}{
		{sj.SetLive, []byte("[]"), "malformed"},
		{sj.SetLive, control.SetLive{Ino: ino, Size: -1, DV: 5}, "malformed"},
		{sj.SetLive, control.SetLive{Ino: 1 << 40, Size: 1, DV: 5}, "unknown_file"},
		{sj.SetLive, control.SetLive{Ino: 1, Size: 1, DV: 5}, "unknown_file"}, // the root: a directory
		{sj.Session, control.SessionQuery{Session: raw.hello.Session, Token: []byte("short")}, "malformed"},
		{sj.Session, control.SessionQuery{Session: raw.hello.Session, Token: make([]byte, 32)}, "unknown_session"},
	} {
		if got := send(t, ioc, tc.subj, tc.msg); !strings.HasPrefix(got, tc.kind+": ") {
			t.Errorf("%s %v: reply %q, want a refusal of kind %s", tc.subj, tc.msg, got, tc.kind)
		}
	}
	before := st.Metadata.Stats.StaleReports.Load()
	if got := send(t, ioc, sj.SetLive, control.SetLive{Ino: ino, Size: 1, DV: 1}); got != "" {
		t.Fatalf("stale report: %q", got)
	}
	if st.Metadata.Stats.StaleReports.Load() != before+1 {
		t.Errorf("a report older than the last one applied was not counted as stale")
	}
	if a := raw.fstat(t, handle); a.Size != int64(len(wb)) {
		t.Errorf("after a stale report the size is %d, want %d", a.Size, len(wb))
	}
	if n := st.Metadata.Snapshot()["control_refused"]; n != uint64(6) {
		t.Errorf("metadata control_refused = %v, want 6", n)
	}
}

// memStack runs a stack on the mem backend for the test.
func memStack(t *testing.T) (*config.Config, *stack.Stack) {
	t.Helper()
	c := stacktest.Config(t, "")
	c.IO.Backend = "mem"
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	return c, st
}

// fstat is the attributes of handle of the raw session.
func (s *rawSession) fstat(t *testing.T, handle uint64) proto.Attr {
	t.Helper()
	out := make([]byte, proto.AttrSize)
	comp := rawCall(t, s.meta, proto.OpFStat, 0, handle, nil, out)
	a, err := proto.DecodeAttr(out[:max(comp.Result, 0)])
	if err != nil {
		t.Fatalf("fstat: %+v %v", comp, err)
	}
	return a
}

// TestRevokeEndsItsGrant: versions order the messages of a file, but a
// revoke is checked against the grant it ends, not against the file: a
// revoke sent again late (the retrier, after a grant timed out) still
// ends its grant when other handles of the file were granted since at
// newer versions, and only a revoke older than the grant it names is
// stale. (Checked against the file, the late revoke was refused and the
// grant it was meant to end stayed at io: found in review.)
func TestRevokeEndsItsGrant(t *testing.T) {
	c, st := memStack(t)
	raw := rawDial(t, c)
	handle := raw.open(t, "f")
	a := raw.fstat(t, handle)
	md, err := st.Connect(control.RoleMetadata, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	sj := control.SubjectsIn(c.NATS.Namespace)
	inc := st.Metadata.Incarnation()
	ha, hb := proto.MakeID(inc, 1<<21), proto.MakeID(inc, 1<<21+1)
	const v = 1 << 50
	grant := func(h uint64, ver uint64) control.Grant {
		return control.Grant{Session: raw.hello.Session, Handle: h, Ino: a.Ino, Blob: a.Ino, Read: true, Ver: ver}
	}
	revoke := func(h uint64, ver uint64) control.Revoke {
		return control.Revoke{Session: raw.hello.Session, Handle: h, Blob: a.Ino, Ver: ver}
	}
	for _, step := range []struct {
		subj string
		msg  any
		want string // refusal kind, "" for applied
	}{
		{sj.Grant, grant(ha, v), ""},
		{sj.Grant, grant(hb, v+10), ""},
		{sj.Revoke, revoke(ha, v+5), ""},              // late, but newer than ha's grant
		{sj.Revoke, revoke(hb, v+3), "stale_version"}, // older than hb's grant
		{sj.Grant, grant(ha, v+6), "stale_version"},   // older than the last applied to the file
	} {
		got := send(t, md, step.subj, step.msg)
		if (step.want == "" && got != "") || (step.want != "" && !strings.HasPrefix(got, step.want+": ")) {
			t.Fatalf("%s %+v: reply %q, want %q", step.subj, step.msg, got, step.want)
		}
	}
	if e := raw.readErr(t, ha); e != syscall.EBADF {
		t.Errorf("read on the revoked handle: %v, want EBADF", e)
	}
	if e := raw.readErr(t, hb); e != 0 {
		t.Errorf("read on the handle whose stale revoke was refused: %v", e)
	}
	if e := raw.readErr(t, handle); e != 0 {
		t.Errorf("read on metadata's own handle: %v", e)
	}
}

// TestDataVersions: a size report older than the last one applied is
// ignored also after the file was closed (a report that arrives late, as
// io's reports after a resync can, cannot take the size back), and io's
// data versions stay above the floor metadata gives at a resync, whatever
// io's clock did (they are seeded from it).
func TestDataVersions(t *testing.T) {
	c, st := memStack(t)
	raw := rawDial(t, c)
	handle := raw.open(t, "f")
	wb := []byte("intact")
	if comp := rawDo(t, raw.data, proto.OpWrite, handle, 0, wb, nil); comp.Result != int64(len(wb)) {
		t.Fatalf("write: %+v", comp)
	}
	a := raw.fstat(t, handle)
	if comp := rawDo(t, raw.meta, proto.OpClose, handle, 0, nil, nil); comp.Result != 0 {
		t.Fatalf("close: %+v", comp)
	}
	sj := control.SubjectsIn(c.NATS.Namespace)
	ioc, err := st.Connect(control.RoleIO, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	before := st.Metadata.Stats.StaleReports.Load()
	if got := send(t, ioc, sj.SetLive, control.SetLive{Ino: a.Ino, Size: 1, DV: 1}); got != "" {
		t.Fatalf("late report: %q", got)
	}
	if st.Metadata.Stats.StaleReports.Load() != before+1 {
		t.Error("a late report for a closed file was not ignored as stale")
	}
	if got, err := st.Metadata.NS().GetAttr(ns.Ino(a.Ino)); err != nil || got.Size != int64(len(wb)) {
		t.Errorf("after a late report the closed file's size is %d (%v), want %d", got.Size, err, len(wb))
	}

	// A resync with a floor far above io's clock.
	md, err := st.Connect(control.RoleMetadata, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	const floor = 1 << 62
	inc := st.Metadata.Incarnation()
	if got := send(t, md, sj.Resync, control.Resync{Incarnation: inc, AllocLimit: 1 << 20, DVFloor: floor, Stack: control.FormatStack(st.Metadata.NS().StackID())}); got != "" {
		t.Fatalf("resync: %q", got)
	}
	fresh := rawDial(t, c) // sessions attached before the resync are stale
	data, err := json.Marshal(control.Grant{Session: fresh.hello.Session, Handle: proto.MakeID(inc, 1<<22), Ino: a.Ino, Blob: a.Ino, Read: true, Ver: 1 << 55})
	if err != nil {
		t.Fatal(err)
	}
	m, err := md.Request(sj.Grant, data, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ack control.Ack
	if err := json.Unmarshal(m.Data, &ack); err != nil || ack.Error != "" {
		t.Fatalf("grant: %q %v", m.Data, err)
	}
	if ack.DV <= floor {
		t.Errorf("a blob opened after the resync has data version %d, not above the floor %d", ack.DV, uint64(floor))
	}
}
