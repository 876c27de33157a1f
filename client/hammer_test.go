package client_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
)

// The conflict hammer (issue 13): two writer processes and a reader
// process, each its own trust group (trust_groups = "process"), on one
// file of hammerBlocks blocks. A writer takes the file's exclusive lease
// (its grant), learns the lease epoch, and stamps every block it writes
// with {writer, epoch, seq} at the block's head and tail, until io
// refuses a write (EBADF: the other writer's grant, or the reader's,
// recalled it; the client's regrant is off, so that a stamp always names
// the tenure the write was made in); then it opens the file again. The
// reader reads the whole file again and again and checks that every
// block it sees is consistent with leases that were valid:
//   - an epoch is only ever stamped by one writer (two groups never hold
//     the exclusive lease in one tenure);
//   - a block's stamp never goes back to an earlier tenure, or within one
//     to an earlier write (a write io took under a revoked grant would
//     land after the next tenure's);
//   - at the end, every epoch the reader saw for a writer is one the
//     writer was granted.
const (
	envHammer     = "WEIR_CLIENT_TEST_HAMMER" // "writer:N" or "reader"
	hammerBlocks  = 8
	hammerBlock   = 4096
	hammerWrites  = 2000 // per writer, at least
	hammerTenures = 8    // per writer, at least (the reader's reads recall too)
	hammerMost    = 200000
	hammerMagic   = 0x7765697268616d72
	hammerStampSz = 32
)

func hammerStamp(w, epoch, seq uint64) []byte {
	b := make([]byte, hammerBlock)
	for _, at := range []int{0, hammerBlock - hammerStampSz} {
		binary.LittleEndian.PutUint64(b[at:], hammerMagic)
		binary.LittleEndian.PutUint64(b[at+8:], w)
		binary.LittleEndian.PutUint64(b[at+16:], epoch)
		binary.LittleEndian.PutUint64(b[at+24:], seq)
	}
	return b
}

func hammerDial() (*client.FS, error) {
	return client.Dial(context.Background(), client.Options{
		MetadataSocket: os.Getenv(envMetaSock), IOSocket: os.Getenv(envIOSock)})
}

// hammerChild is the test binary as one of the hammer's processes.
func hammerChild() int {
	role := os.Getenv(envHammer)
	c, err := hammerDial()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	if w, ok := strings.CutPrefix(role, "writer:"); ok {
		n, _ := strconv.ParseUint(w, 10, 64)
		return hammerWriter(c, n)
	}
	return hammerReader(c)
}

type noCleanup struct{}

func (noCleanup) Cleanup(func()) {}

func hammerWriter(c *client.FS, w uint64) int {
	client.NoRegrant(noCleanup{})
	var epochs []string
	var seq uint64
	tenures := 0
	more := func() bool { return seq < hammerWrites || (tenures < hammerTenures && seq < hammerMost) }
	for more() {
		f, err := c.OpenFile("hammer", os.O_RDWR, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "writer open:", err)
			return 1
		}
		// The grant, and with it the epoch, comes with the first request.
		if _, err := f.ReadAt(make([]byte, 1), 0); err != nil && !errors.Is(err, io.EOF) {
			f.Close()
			if errors.Is(err, syscall.EBADF) {
				continue // recalled before it was used
			}
			fmt.Fprintln(os.Stderr, "writer read:", err)
			return 1
		}
		e := client.Tenure(f)
		if e == 0 {
			fmt.Fprintln(os.Stderr, "writer: no lease epoch after the grant")
			return 1
		}
		epochs = append(epochs, strconv.FormatUint(e, 10))
		tenures++
		for more() {
			seq++
			_, err := f.WriteAt(hammerStamp(w, e, seq), int64(seq%hammerBlocks)*hammerBlock)
			if errors.Is(err, syscall.EBADF) {
				break // recalled: this write was refused, the next tenure writes it again
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "writer write:", err)
				return 1
			}
		}
		f.Close()
	}
	fmt.Printf("epochs %s\n", strings.Join(epochs, " "))
	return 0
}

func hammerReader(c *client.FS) int {
	type seen struct{ epoch, seq uint64 }
	var last [hammerBlocks]seen
	owner := map[uint64]uint64{} // epoch -> writer
	buf := make([]byte, hammerBlocks*hammerBlock)
	reads, torn := 0, 0
	stdin := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdin) }() // the test closes stdin: stop
	for done := false; !done; {
		select {
		case <-stdin:
			done = true // one read more, after the writers ended
		default:
		}
		f, err := c.Open("hammer")
		if err != nil {
			fmt.Fprintln(os.Stderr, "reader open:", err)
			return 1
		}
		n, err := f.(*client.File).ReadAt(buf, 0)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(os.Stderr, "reader read:", err)
			return 1
		}
		reads++
		for b := 0; b < n/hammerBlock; b++ {
			blk := buf[b*hammerBlock : (b+1)*hammerBlock]
			head, tail := blk[:hammerStampSz], blk[hammerBlock-hammerStampSz:]
			if binary.LittleEndian.Uint64(head) != hammerMagic {
				continue // not written yet
			}
			if string(head) != string(tail) {
				torn++ // read while a write copied it: no stamp to check
				continue
			}
			w := binary.LittleEndian.Uint64(head[8:])
			s := seen{binary.LittleEndian.Uint64(head[16:]), binary.LittleEndian.Uint64(head[24:])}
			if o, ok := owner[s.epoch]; ok && o != w {
				fmt.Printf("FAIL block %d: epoch %d stamped by writers %d and %d\n", b, s.epoch, o, w)
				return 0
			}
			owner[s.epoch] = w
			if p := last[b]; s.epoch < p.epoch || (s.epoch == p.epoch && s.seq < p.seq) {
				fmt.Printf("FAIL block %d went back from epoch %d seq %d to epoch %d seq %d (writer %d)\n", b, p.epoch, p.seq, s.epoch, s.seq, w)
				return 0
			}
			last[b] = s
		}
	}
	var pairs []string
	for e, w := range owner {
		pairs = append(pairs, fmt.Sprintf("%d:%d", e, w))
	}
	fmt.Printf("ok %d %d %s\n", reads, torn, strings.Join(pairs, " "))
	return 0
}

// TestConflictHammer runs the hammer (above) across three processes.
func TestConflictHammer(t *testing.T) {
	st := groupStack(t, "process")
	c := dialStack(t, st)
	if err := c.WriteFile("hammer", nil, 0o666); err != nil {
		t.Fatal(err)
	}
	start := func(role string) (*exec.Cmd, *bufio.Reader, io.WriteCloser) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envHammer+"="+role,
			envMetaSock+"="+st.Config.Metadata.Socket, envIOSock+"="+st.Config.IO.Socket)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewReader(out), in
	}
	rd, rout, rin := start("reader")
	w1, w1out, _ := start("writer:1")
	w2, w2out, _ := start("writer:2")
	granted := map[uint64]uint64{}
	for w, out := range map[uint64]*bufio.Reader{1: w1out, 2: w2out} {
		line, _ := out.ReadString('\n')
		es, ok := strings.CutPrefix(strings.TrimSpace(line), "epochs ")
		if !ok {
			t.Fatalf("writer %d: %q", w, line)
		}
		for _, e := range strings.Fields(es) {
			n, _ := strconv.ParseUint(e, 10, 64)
			granted[n] = w
		}
	}
	for _, cmd := range []*exec.Cmd{w1, w2} {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	rin.Close()
	line, _ := rout.ReadString('\n')
	if err := rd.Wait(); err != nil {
		t.Fatalf("reader: %v", err)
	}
	fields := strings.Fields(line)
	if len(fields) < 3 || fields[0] != "ok" {
		t.Fatalf("reader: %q", line)
	}
	for _, p := range fields[3:] {
		e, w, _ := strings.Cut(p, ":")
		en, _ := strconv.ParseUint(e, 10, 64)
		wn, _ := strconv.ParseUint(w, 10, 64)
		if granted[en] != wn {
			t.Fatalf("the reader saw epoch %d stamped by writer %d, an epoch granted to writer %d (0: to none)", en, wn, granted[en])
		}
	}
	t.Logf("%d tenures granted, %d recalls; the reader checked %s reads (%s torn) and saw %d epochs",
		len(granted), recalls(st), fields[1], fields[2], len(fields)-3)
	if len(granted) < 2*hammerTenures {
		t.Fatalf("%d tenures in all: the writers never took the lease from each other", len(granted))
	}
}

// TestStoppedHolderDelaysLittle: a holder that never answers (a process
// stopped with SIGSTOP while it holds the file's write grant) delays
// another group's write by io's revoke alone, which needs nothing from
// the holder; and a holder that dies (SIGKILL) is released at once.
func TestStoppedHolderDelaysLittle(t *testing.T) {
	st := groupStack(t, "process")
	c := dialStack(t, st)
	for _, kill := range []bool{false, true} {
		name := fmt.Sprintf("held-%v", kill)
		if err := c.WriteFile(name, nil, 0o666); err != nil {
			t.Fatal(err)
		}
		cmd := startChild(t, os.Args[0], nil, st.Config, "holding", envHolder+"="+name)
		sig := syscall.SIGSTOP
		if kill {
			sig = syscall.SIGKILL
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		f, err := c.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		before := recalls(st)
		t0 := time.Now()
		if _, err := f.WriteAt([]byte("mine"), 0); err != nil {
			t.Fatalf("write while the holder is %v: %v", sig, err)
		}
		took := time.Since(t0)
		f.Close()
		got, err := c.ReadFile(name)
		if err != nil || string(got) != "mine" {
			t.Fatalf("read %q %v", got, err)
		}
		if !kill && recalls(st) == before {
			t.Fatal("the stopped holder's grant was not recalled")
		}
		t.Logf("holder %v: the other group's open+write took %v (recalls %d)", sig, took, recalls(st)-before)
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// envHolder makes the test binary TestStoppedHolderDelaysLittle's holder:
// it opens the file named for writing, writes and waits to be stopped.
const envHolder = "WEIR_CLIENT_TEST_HOLDER"

func holderChild() int {
	c, err := hammerDial()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := c.OpenFile(os.Getenv(envHolder), os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := f.WriteAt([]byte("held"), 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("holding")
	select {}
}

// TestUIDGroups: under the default trust groups (one per uid), a process
// of another uid (otherUID) holding a file's write grant is recalled by root's
// write, and a process of root's own uid is not: it shares root's lease.
func TestUIDGroups(t *testing.T) {
	st := otherUIDStack(t)
	c := dialStack(t, st)
	bin := copyTestBinary(t)
	for _, other := range []bool{true, false} {
		name := fmt.Sprintf("shared-%v", other)
		if err := c.WriteFile(name, nil, 0o666); err != nil {
			t.Fatal(err)
		}
		if err := c.Chmod(name, 0o666); err != nil { // (past the umask)
			t.Fatal(err)
		}
		var cred *syscall.Credential
		if other {
			cred = &syscall.Credential{Uid: otherUID, Gid: otherUID}
		}
		cmd := startChild(t, bin, cred, st.Config, "holding", envHolder+"="+name)
		before := recalls(st)
		f, err := c.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("root"), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		n := recalls(st) - before
		cmd.Process.Kill()
		cmd.Wait()
		if other && n == 0 {
			t.Errorf("root's write recalled nothing from uid %d's write grant", otherUID)
		}
		if !other && n != 0 {
			t.Errorf("root's write recalled %d grants of a process of its own uid (one trust group)", n)
		}
	}
}
