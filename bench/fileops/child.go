package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// driverProc is the orchestrator's handle on one driver process.
type driverProc struct {
	target string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	enc    *json.Encoder
	dec    *json.Decoder
	exited chan struct{}
	err    error // cmd.Wait's result; read after exited is closed
}

// driverTimeout bounds one request: a workload that hangs (a lost
// completion, a dead service) fails its row instead of the whole run.
const driverTimeout = 10 * time.Minute

// startDriver re-executes this program as the driver of target with args,
// and waits for its hello.
func startDriver(target string, args []string, stderr io.Writer) (*driverProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	return startDriverAs(exe, nil, target, args, stderr)
}

// startDriverAs starts exe as a driver, with the credentials cred (nil:
// this process's).
func startDriverAs(exe string, cred *syscall.Credential, target string, args []string, stderr io.Writer) (*driverProc, error) {
	cmd := exec.Command(exe, append([]string{driverRoleArg, "-target", target}, args...)...)
	cmd.Stderr = stderr
	// If the orchestrator dies, so do its drivers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s driver: %w", target, err)
	}
	p := &driverProc{target: target, cmd: cmd, stdin: stdin, enc: json.NewEncoder(stdin),
		dec: json.NewDecoder(bufio.NewReader(stdout)), exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	hello, err := p.read(time.Minute)
	if err == nil && hello.Error != "" {
		err = errors.New(hello.Error)
	}
	if err != nil {
		p.kill()
		return nil, fmt.Errorf("%s driver: %w", target, err)
	}
	return p, nil
}

// Pid is the driver's process id.
func (p *driverProc) Pid() int { return p.cmd.Process.Pid }

// call sends one request and waits for its result.
func (p *driverProc) call(q request) (result, error) {
	if err := p.enc.Encode(q); err != nil {
		return result{}, fmt.Errorf("%s driver: send %s: %w", p.target, q.Op, err)
	}
	r, err := p.read(driverTimeout)
	if err != nil {
		p.kill()
		return result{}, fmt.Errorf("%s driver: %s: %w", p.target, q.Op, err)
	}
	return r, nil
}

func (p *driverProc) read(timeout time.Duration) (result, error) {
	type answer struct {
		r   result
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		var r result
		err := p.dec.Decode(&r)
		ch <- answer{r, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			<-p.exited
			return result{}, fmt.Errorf("no answer (%v): driver exited: %v", a.err, p.err)
		}
		return a.r, nil
	case <-time.After(timeout):
		return result{}, fmt.Errorf("no answer after %v", timeout)
	}
}

// stop closes the driver's stdin and waits for it to exit.
func (p *driverProc) stop() error {
	_ = p.stdin.Close()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(30 * time.Second):
		p.kill()
		return fmt.Errorf("%s driver did not exit; killed", p.target)
	}
}

func (p *driverProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}
