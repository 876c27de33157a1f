package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// Two-process cases (Case.Peer): the case runs here while a second process
// (a child, with the test's own identity) opens the same root and runs the
// peer steps the case asks for (Tester.Peer), so that what one process
// writes is checked from another, as processes share the kernel's page
// cache. The child's observations follow the case's, prefixed "peer: ".
//
// Protocol on the child's stdin and stdout, one line each way per step:
//
//	parent -> child  "<step name>\n"
//	child -> parent  "done\n"
//
// and, once stdin is closed, the child prints "result <outcome JSON>\n".

const peerEnv = "WEIR_CONFORMANCE_PEER"

// peerConn is the parent's end of a running peer.
type peerConn struct {
	in      io.WriteCloser
	out     *bufio.Reader
	pending int // steps started and not yet waited for
}

// Peer runs step in the peer process and waits until it is done.
func (t *Tester) Peer(step string) {
	t.PeerStart(step)
	t.PeerWait()
}

// PeerStart starts step in the peer process and returns at once: the case
// runs concurrently with it until PeerWait.
func (t *Tester) PeerStart(step string) {
	p := t.peer
	if p == nil {
		t.fail(2, "Peer called in a case without Peer steps")
		return
	}
	if _, err := fmt.Fprintf(p.in, "%s\n", step); err != nil {
		t.fail(2, fmt.Sprintf("start peer step %q: %v", step, err))
		return
	}
	p.pending++
}

// PeerWait waits for the peer steps started and not yet waited for.
func (t *Tester) PeerWait() {
	p := t.peer
	for p != nil && p.pending > 0 {
		line, err := p.out.ReadString('\n')
		if err != nil || line != "done\n" {
			t.fail(2, fmt.Sprintf("peer step: %q %v", line, err))
			p.pending = 0
			return
		}
		p.pending--
	}
}

// runWithPeer runs c.Setup and c.Run here, with a peer process on the same
// root for the steps c.Run asks for.
func runWithPeer(t *testing.T, exe *childExe, fsys FS, c Case) outcome {
	t.Helper()
	pt := newTester(fsys)
	fail := func(format string, args ...any) outcome {
		o := pt.finish(false)
		o.Fails = append(o.Fails, fmt.Sprintf(format, args...))
		return o
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd, err := childCommand(ctx, exe, fsys, c, peerEnv)
	if err != nil {
		return fail("peer: %v", err)
	}
	if !runPhase(pt, "setup: ", c.Setup) {
		return pt.finish(false)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return fail("peer: %v", err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return fail("peer: %v", err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fail("start peer: %v", err)
	}
	pt.peer = &peerConn{in: in, out: bufio.NewReader(outPipe)}
	ok := runPhase(pt, "", c.Run)
	pt.PeerWait()
	in.Close()
	line, rerr := pt.peer.out.ReadString('\n')
	werr := cmd.Wait()
	res := pt.finish(ok)
	var peer outcome
	rest, found := strings.CutPrefix(line, "result ")
	if rerr != nil || !found || json.Unmarshal([]byte(rest), &peer) != nil {
		res.Fails = append(res.Fails, fmt.Sprintf("peer: no result (%q, %v, %v)\n%s", line, rerr, werr, stderr.String()))
		return res
	}
	for _, o := range peer.Obs {
		res.Obs = append(res.Obs, "peer: "+o)
	}
	res.Fails = append(res.Fails, peer.Fails...)
	return res
}

// runPeer is the peer process: it runs the steps named on stdin.
func runPeer(reqJSON string) error {
	c, fsys, err := childCase(reqJSON)
	if err != nil {
		return err
	}
	t := newTester(fsys)
	completed := true
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		step := c.Peer[sc.Text()]
		if step == nil {
			t.fail(1, fmt.Sprintf("no peer step %q", sc.Text()))
		} else if completed {
			completed = runPhase(t, "", step)
		}
		if _, err := os.Stdout.WriteString("done\n"); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	res, err := json.Marshal(t.finishPeer(completed))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(os.Stdout, "result %s\n", res)
	return err
}

// finishPeer is finish for a peer, whose steps may leave files open for
// later steps: they are closed here without failing the case.
func (t *Tester) finishPeer(completed bool) outcome {
	t.mu.Lock()
	for f := range t.open {
		_ = f.f.Close()
	}
	t.open = make(map[*TFile]bool)
	t.mu.Unlock()
	return t.finish(completed)
}
