package stack_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/internal/host"
	"github.com/weir-storage/weir/internal/journalproto"
	"github.com/weir-storage/weir/ring"
	"github.com/weir-storage/weir/services/journal"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// journalStack starts a stack of stacktest.Config, as edit changes it,
// stopped when the test ends, and waits for its journal service's
// session with io.
func journalStack(t *testing.T, edit func(*config.Config)) (*stack.Stack, *config.Config) {
	t.Helper()
	c := stacktest.Config(t, "")
	if edit != nil {
		edit(c)
	}
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Shutdown(context.Background()) })
	waitFor(t, "the journal service's session", func() bool { return st.IO.Snapshot()["journal_connected"] == true })
	return st, c
}

// startJournal starts a journal service for st in this process; st's
// Shutdown stops it.
func startJournal(t *testing.T, st *stack.Stack) *journal.Service {
	t.Helper()
	nc, err := st.Connect(control.RoleJournal, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	j, err := journal.New(stack.JournalOptions(st.Config, nc, hclog.NewNullLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Start(); err != nil {
		t.Fatal(err)
	}
	st.Journal = j
	return j
}

// stopJournal stops st's journal service and waits until io knows.
func stopJournal(t *testing.T, st *stack.Stack) {
	t.Helper()
	if err := st.Journal.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	st.Journal = nil
	waitFor(t, "io to see the journal service gone", func() bool { return st.IO.Snapshot()["journal_connected"] == false })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestJournalDownBackpressure: with the journal service down, fsync goes
// on until the staging log is full, then waits, and io's status says why;
// a journal service that comes back catches up: the waiting fsync
// returns, the log empties, every byte reads back, and the sizes reached
// the metadata service.
func TestJournalDownBackpressure(t *testing.T) {
	st, _ := journalStack(t, func(c *config.Config) {
		c.IO.StagingSize = 1 << 20 // the smallest: fills after a few fsyncs
	})
	stopJournal(t, st)

	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenFile("log", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 64<<10) }
	// Each fsync stages 64 KiB (17 blocks): the 1 MiB ring holds under
	// 16 of them; the rest must wait.
	const total = 24
	done := make(chan error, 1)
	acked := make(chan int, total)
	go func() {
		for i := range total {
			if _, err := f.Write(chunk(i)); err != nil {
				done <- err
				return
			}
			if err := f.Sync(); err != nil {
				done <- fmt.Errorf("fsync %d: %w", i, err)
				return
			}
			acked <- i
		}
		done <- nil
	}()
	waitFor(t, "an fsync waiting for room", func() bool {
		m := st.IO.Snapshot()
		return toUint(m["staging_waiting"]) > 0
	})
	m := st.IO.Snapshot()
	if m["staging_backpressure"] == nil {
		t.Errorf("io's status while fsync waits does not say why: %v", m)
	} else {
		t.Logf("staging_backpressure: %v", m["staging_backpressure"])
	}
	if n := len(acked); n == 0 || n >= total {
		t.Fatalf("%d fsyncs acknowledged before the log filled; want some, not all", n)
	}
	select {
	case err := <-done:
		t.Fatalf("the fsyncs ended with the journal service down: %v", err)
	case <-time.After(200 * time.Millisecond): // still waiting
	}

	startJournal(t, st)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fsyncs did not go on once the journal service was back")
	}
	waitFor(t, "the journal service to empty the log", func() bool {
		return toUint(st.IO.Snapshot()["staging_live_records"]) == 0
	})
	if n := toUint(st.IO.Snapshot()["staging_full_waits"]); n == 0 {
		t.Error("staging_full_waits is 0")
	}
	got, err := fsys.ReadFile("log")
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range total {
		want = append(want, chunk(i)...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes, want %d as written", len(got), len(want))
	}
	if js := st.Journal.Snapshot(); toUint(js["passes"]) == 0 || toUint(js["files"]) == 0 {
		t.Errorf("journal service stats after catching up: %v", js)
	}
	if toUint(st.Metadata.Snapshot()["live_batches"]) == 0 {
		t.Error("the metadata service committed no batch of the journal service")
	}
}

// TestJournalForeground: with journal.foreground (the ablation without
// background journaling) an fsync returns only once its record is
// checkpointed: the log holds none after it.
func TestJournalForeground(t *testing.T) {
	st, _ := journalStack(t, func(c *config.Config) {
		c.Journal.Foreground = true
	})
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 5 {
		if _, err := f.Write([]byte("some bytes")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		m := st.IO.Snapshot()
		if toUint(m["staging_live_records"]) != 0 || toUint(m["staging_records"]) != uint64(i+1) {
			t.Fatalf("after fsync %d: %d live records of %d: want every record checkpointed", i, m["staging_live_records"], m["staging_records"])
		}
	}
}

// journalSession is a hand-driven session on io's journal socket.
type journalSession struct {
	t *testing.T
	c *ring.Client
}

func dialJournal(t *testing.T, sock string, hello string) (*journalSession, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ring.Dial(ctx, sock, ring.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := &journalSession{t: t, c: c}
	if hello == "" {
		return s, 0
	}
	comp := s.do(&ring.Call{Op: host.OpPeerHello}, []byte(hello), 0)
	return s, comp.Result
}

// do runs call with in as its payload, or an out buffer of out bytes.
func (s *journalSession) do(call *ring.Call, in []byte, out int) ring.Completion {
	s.t.Helper()
	c, _ := s.doOut(call, in, out)
	return c
}

// doOut is do that also returns the out buffer's bytes.
func (s *journalSession) doOut(call *ring.Call, in []byte, out int) (ring.Completion, []byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := max(len(in), out)
	if n > 0 {
		b, err := s.c.Alloc(ctx, n)
		if err != nil {
			s.t.Fatal(err)
		}
		defer b.Release()
		b.CopyFrom(in)
		call.Buf = b
	}
	comp, err := s.c.Do(ctx, call)
	if err != nil {
		s.t.Fatal(err)
	}
	got := make([]byte, n)
	if call.Buf != nil {
		call.Buf.CopyTo(got)
	}
	return comp, got
}

// TestJournalSessionHostile: io checks everything a journal session
// sends: requests before the hello, a second journal session, unknown
// batches, blobs not in the batch, commits before every file is
// checkpointed, bad buffers; each gets its errno, and io serves on. A
// journal service started afterwards empties the log.
func TestJournalSessionHostile(t *testing.T) {
	st, c := journalStack(t, func(c *config.Config) {
		c.IO.Backend = "mem"
	})
	if _, r := dialJournal(t, c.Journal.Socket, "journal"); r != -int64(syscall.EBUSY) {
		t.Errorf("a second journal session's hello: %d, want -EBUSY", r)
	}
	if _, r := dialJournal(t, c.Journal.Socket, "io"); r != -int64(syscall.EPERM) {
		t.Errorf("hello as io on the journal socket: %d, want -EPERM", r)
	}
	stopJournal(t, st)

	// Something to checkpoint: a file with a staged fsync.
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("staged")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	pre, _ := dialJournal(t, c.Journal.Socket, "")
	if r := pre.do(&ring.Call{Op: journalproto.OpNext}, nil, 4096).Result; r != -int64(syscall.EPERM) {
		t.Errorf("OpNext before the hello: %d, want -EPERM", r)
	}
	s, r := dialJournal(t, c.Journal.Socket, "journal")
	if r != 0 {
		t.Fatalf("hello: %d", r)
	}
	errno := func(what string, comp ring.Completion, want syscall.Errno) {
		t.Helper()
		if comp.Result != -int64(want) {
			t.Errorf("%s: result %d, want -%v", what, comp.Result, want)
		}
	}
	errno("OpNext without a buffer", s.do(&ring.Call{Op: journalproto.OpNext}, nil, 0), syscall.EINVAL)
	errno("OpNext with a short buffer", s.do(&ring.Call{Op: journalproto.OpNext}, nil, 16), syscall.EINVAL)
	errno("OpNext waiting too long", s.do(&ring.Call{Op: journalproto.OpNext, Arg: 1 << 31}, nil, 4096), syscall.EINVAL)
	errno("OpCheckpoint of no batch", s.do(&ring.Call{Op: journalproto.OpCheckpoint, Handle: 1, Offset: 77}, nil, journalproto.ReportSize), syscall.ENOENT)
	errno("OpCommit of no batch", s.do(&ring.Call{Op: journalproto.OpCommit, Offset: 77}, nil, 0), syscall.ENOENT)
	errno("OpCommit with a ragged list", s.do(&ring.Call{Op: journalproto.OpCommit, Offset: 77}, []byte{1, 2, 3}, 0), syscall.EINVAL)

	comp := s.do(&ring.Call{Op: journalproto.OpNext}, nil, 4096)
	if comp.Result != 1 {
		t.Fatalf("OpNext: %d files, want the one staged", comp.Result)
	}
	id := comp.Aux
	errno("OpCheckpoint of a blob not in the batch", s.do(&ring.Call{Op: journalproto.OpCheckpoint, Handle: 1 << 40, Offset: id}, nil, journalproto.ReportSize), syscall.ENOENT)
	errno("OpCheckpoint with a bad buffer", s.do(&ring.Call{Op: journalproto.OpCheckpoint, Handle: 1, Offset: id}, nil, 8), syscall.EINVAL)
	errno("OpCommit before the checkpoint", s.do(&ring.Call{Op: journalproto.OpCommit, Offset: id}, nil, 0), syscall.EINVAL)
	errno("OpCommit of another batch", s.do(&ring.Call{Op: journalproto.OpCommit, Offset: id + 1}, nil, 0), syscall.ENOENT)
	if err := st.IO.Health(); err != nil {
		t.Fatalf("io after the hostile requests: %v", err)
	}
	if n := toUint(st.IO.Snapshot()["staging_live_records"]); n != 1 {
		t.Fatalf("%d live records after the hostile requests, want the 1 staged", n)
	}
	s.c.Close()
	waitFor(t, "io to see the hand-driven session gone", func() bool { return st.IO.Snapshot()["journal_connected"] == false })

	startJournal(t, st)
	waitFor(t, "the journal service to empty the log", func() bool {
		return toUint(st.IO.Snapshot()["staging_live_records"]) == 0
	})
	if got, err := fsys.ReadFile("f"); err != nil || string(got) != "staged" {
		t.Fatalf("read back %q, %v", got, err)
	}
}

// TestSetLiveBatchRefusal: the metadata service refuses a malformed
// checkpoint batch with an error the journal sees (not an empty success,
// after which io would trim sizes metadata never took), and names the
// files of a batch that are gone while it applies the others.
func TestSetLiveBatchRefusal(t *testing.T) {
	st, c := journalStack(t, func(c *config.Config) {
		c.IO.Backend = "mem"
	})
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if err := fsys.WriteFile("f", []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := fsys.Stat("f")
	if err != nil {
		t.Fatal(err)
	}
	ino := fi.Sys().(*syscall.Stat_t).Ino
	nc, err := st.Connect(control.RoleJournal, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	subj := control.SubjectsIn(c.NATS.Namespace).SetLiveBatch
	var reply control.SetLiveBatchReply
	err = control.Request(nc, subj, control.SetLiveBatch{Live: []control.SetLive{{Ino: ino, Size: 1, Mtime: -1, DV: 1 << 62}}}, &reply, 5*time.Second)
	if err != nil || reply.Err() == nil {
		t.Fatalf("a batch with a negative mtime: %v, reply %+v; want a refusal", err, reply)
	}
	reply = control.SetLiveBatchReply{}
	err = control.Request(nc, subj, control.SetLiveBatch{Live: []control.SetLive{
		{Ino: ino, Size: 2, DV: 1 << 62}, {Ino: 1 << 40, Size: 5, DV: 1 << 62},
	}}, &reply, 5*time.Second)
	if err != nil || reply.Err() != nil || len(reply.Gone) != 1 || reply.Gone[0] != 1<<40 {
		t.Fatalf("a batch with a gone file: %v, reply %+v; want inode %d gone", err, reply, uint64(1<<40))
	}
	if fi, err := fsys.Stat("f"); err != nil || fi.Size() != 2 {
		t.Fatalf("after the batch: %v, %v; want size 2 applied", fi, err)
	}
}

// TestJournalCommitKeepsLaterRecordSize: a file staged again while its
// batch is between checkpoint and commit (a shrinking truncate: a
// truncate record) keeps that record's size as the size of its last
// record: the commit does not put the batch's older size back, so the
// next fsync after the file grows again writes a record, and its
// acknowledged size does not rest on a record that replay would cut.
func TestJournalCommitKeepsLaterRecordSize(t *testing.T) {
	st, c := journalStack(t, func(c *config.Config) {
		c.IO.Backend = "mem"
	})
	stopJournal(t, st)
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Repeat([]byte{'x'}, 100)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	s, r := dialJournal(t, c.Journal.Socket, "journal")
	if r != 0 {
		t.Fatalf("hello: %d", r)
	}
	comp, raw := s.doOut(&ring.Call{Op: journalproto.OpNext}, nil, 4096)
	b, err := journalproto.DecodeBatch(raw, int(comp.Result))
	if err != nil || len(b.Files) != 1 {
		t.Fatalf("OpNext: %d, %v", comp.Result, err)
	}
	comp, raw = s.doOut(&ring.Call{Op: journalproto.OpCheckpoint, Handle: b.Files[0].Blob, Offset: b.ID}, nil, journalproto.ReportSize)
	rep, err := journalproto.DecodeReport(raw)
	if comp.Result != 1 || err != nil || rep.Size != 100 {
		t.Fatalf("OpCheckpoint: %d, %+v, %v", comp.Result, rep, err)
	}
	// Between the checkpoint and the commit: cut to 50 (a truncate
	// record), grow back to 100 (no record).
	if err := f.Truncate(50); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100); err != nil {
		t.Fatal(err)
	}
	nc, err := st.Connect(control.RoleJournal, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	var reply control.SetLiveBatchReply
	if err := control.Request(nc, control.SubjectsIn(c.NATS.Namespace).SetLiveBatch,
		control.SetLiveBatch{Live: []control.SetLive{{Ino: b.Files[0].Ino, Size: rep.Size, Mtime: rep.Mtime, DV: rep.DV}}}, &reply, 5*time.Second); err != nil || reply.Err() != nil {
		t.Fatalf("SetLiveBatch: %v %v", err, reply.Err())
	}
	if r := s.do(&ring.Call{Op: journalproto.OpCommit, Offset: b.ID}, nil, 0).Result; r != 0 {
		t.Fatalf("OpCommit: %d", r)
	}
	before := st.IO.Snapshot()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	after := st.IO.Snapshot()
	if toUint(after["staging_records"]) != toUint(before["staging_records"])+1 || toUint(after["staging_empty_fsyncs"]) != toUint(before["staging_empty_fsyncs"]) {
		t.Fatalf("the fsync after the file grew back wrote no record (records %v -> %v, empty fsyncs %v -> %v): its size 100 rests on the truncate record's 50",
			before["staging_records"], after["staging_records"], before["staging_empty_fsyncs"], after["staging_empty_fsyncs"])
	}
}

// TestJournalShutdownWithFsyncWaiting: io stops cleanly while an fsync
// waits for room with no journal service: the fsync fails (it was never
// acknowledged), and Shutdown does not wait for it until its deadline.
func TestJournalShutdownWithFsyncWaiting(t *testing.T) {
	st, _ := journalStack(t, func(c *config.Config) {
		c.IO.StagingSize = 1 << 20
	})
	stopJournal(t, st)
	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenFile("log", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := f.Write(make([]byte, 64<<10)); err != nil {
				done <- err
				return
			}
			if err := f.Sync(); err != nil {
				done <- err
				return
			}
		}
	}()
	waitFor(t, "an fsync waiting for room", func() bool { return toUint(st.IO.Snapshot()["staging_waiting"]) > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := st.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with an fsync waiting for room: %v", err)
	}
	if err := guardErr(t, done); err == nil {
		t.Fatal("the waiting fsync succeeded")
	}
}

func guardErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the fsync loop did not end")
		return nil
	}
}
