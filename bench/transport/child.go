package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	readyTimeout = 10 * time.Second
	// exitTimeout is how long a server child gets to exit after its stdin
	// closes before it is killed.
	exitTimeout = 3 * time.Second
	// settleTimeout is how long a failed configuration waits to see
	// whether the child died.
	settleTimeout = 200 * time.Millisecond
)

// child is the parent's handle on one server process.
type child struct {
	transport string
	cmd       *exec.Cmd
	sock      string      // socket path (ring, uds)
	pipes     []*pipeLink // client ends of the pipe pairs (pipe)
	stdin     *os.File    // closing it tells the child to exit
	exited    chan struct{}
	waitErr   error // set before exited is closed
}

// Pid is the server process id.
func (c *child) Pid() int { return c.cmd.Process.Pid }

// startChild re-executes this program as the server of transport and waits
// for it to report ready. Sockets go in dir; for the pipe transport it
// passes maxThreads pipe pairs.
func startChild(transport, dir string, maxThreads int) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	c := &child{transport: transport, exited: make(chan struct{})}
	args := []string{serverRoleArg, "-transport=" + transport}

	// Every pipe has one end for each process; the parent closes its copies
	// of the child's ends once the child has them.
	var parentEnds, childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			_ = f.Close()
		}
	}
	fail := func(err error) (*child, error) {
		closeAll(parentEnds)
		closeAll(childEnds)
		return nil, err
	}
	// pipe returns a pipe whose read end goes to the child if childReads.
	pipe := func(childReads bool) (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("create pipe: %w", err)
		}
		if childReads {
			childEnds, parentEnds = append(childEnds, r), append(parentEnds, w)
		} else {
			childEnds, parentEnds = append(childEnds, w), append(parentEnds, r)
		}
		return r, w, nil
	}

	var extra []*os.File
	switch transport {
	case transportRingBusyPoll, transportRingAdaptive, transportUDS, transportUDSBlocking:
		c.sock = filepath.Join(dir, transport+".sock")
		args = append(args, "-sock="+c.sock)
	case transportPipe:
		for range maxThreads {
			reqR, reqW, err := pipe(true)
			if err != nil {
				return fail(err)
			}
			respR, respW, err := pipe(false)
			if err != nil {
				return fail(err)
			}
			extra = append(extra, reqR, respW)
			c.pipes = append(c.pipes, newPipeLink(respR, reqW))
		}
		args = append(args, "-pipes="+strconv.Itoa(maxThreads))
	default:
		return nil, fmt.Errorf("unknown transport %q", transport)
	}
	stdinR, stdinW, err := pipe(true)
	if err != nil {
		return fail(err)
	}
	c.stdin = stdinW
	readyR, readyW, err := pipe(false)
	if err != nil {
		return fail(err)
	}

	c.cmd = exec.Command(exe, args...)
	c.cmd.Stdin = stdinR
	c.cmd.Stdout = readyW
	c.cmd.Stderr = os.Stderr
	c.cmd.ExtraFiles = extra
	// If this process dies without closing stdin, the kernel kills the child.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return fail(fmt.Errorf("start %s server: %w", transport, err))
	}
	closeAll(childEnds)
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()

	err = awaitReady(readyR)
	_ = readyR.Close()
	if err != nil {
		_ = c.stop()
		return nil, fmt.Errorf("%s server (pid %d): %w", transport, c.Pid(), err)
	}
	return c, nil
}

// awaitReady reads the child's first stdout line.
func awaitReady(r *os.File) error {
	if err := r.SetReadDeadline(time.Now().Add(readyTimeout)); err != nil {
		return fmt.Errorf("set ready deadline: %w", err)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("not ready after %v", readyTimeout)
	case err != nil:
		return fmt.Errorf("exited before it was ready (%w)", err)
	case strings.TrimSpace(line) != readyLine:
		return fmt.Errorf("unexpected first line %q", line)
	}
	return nil
}

// stop closes the child's stdin, waits for it to exit and kills it if it
// does not. It reports an unclean exit.
func (c *child) stop() error {
	for _, p := range c.pipes {
		_ = p.Close()
	}
	_ = c.stdin.Close()
	select {
	case <-c.exited:
		if c.waitErr != nil {
			return fmt.Errorf("%s server (pid %d): %w", c.transport, c.Pid(), c.waitErr)
		}
		return nil
	case <-time.After(exitTimeout):
	}
	_ = c.cmd.Process.Kill()
	<-c.exited
	return fmt.Errorf("%s server (pid %d) did not exit within %v of stdin closing; killed", c.transport, c.Pid(), exitTimeout)
}

// settle gives a child that may be dying a moment to be reaped, so that
// alive blames later failures on its exit rather than on a refused dial.
func (c *child) settle() {
	select {
	case <-c.exited:
	case <-time.After(settleTimeout):
	}
}

// alive reports an error if the child has exited.
func (c *child) alive() error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s server (pid %d) exited: %v", c.transport, c.Pid(), c.waitErr)
	default:
		return nil
	}
}
