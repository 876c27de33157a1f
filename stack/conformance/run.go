package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Reference is the target every other target is compared with.
const Reference = "kernel"

// Difference is a known, justified mismatch between the kernel and the other
// targets in one case. Its mismatching lines and failed expectations on
// targets other than the kernel are logged instead of failing the test; the
// kernel's own expectations still hold. Each entry must also be described in
// docs/posix-differences.md.
type Difference struct {
	Case   string // Case.Name
	Reason string // one line; the details are in docs/posix-differences.md
}

// Differences lists the known, justified differences between weir and the
// kernel; docs/posix-differences.md explains each.
var Differences = []Difference{
	{Case: "attr/chtimes_before_epoch_and_far_future",
		Reason: "the kernel target's file system (ext4, tmpfs, ...) clamps timestamps to its own on-disk range; weir stores any int64 nanosecond time as given"},
}

func knownDifference(name string) (Difference, bool) {
	for _, d := range Differences {
		if d.Case == name {
			return d, true
		}
	}
	return Difference{}, false
}

// The identity of the child process of NeedNonRoot cases.
const (
	ChildUID = 65534
	ChildGID = 65534
)

const (
	skipNonRoot = "needs root to switch to uid 65534 for permission cases"
	skipRoot    = "needs to run as root (uid 0) for root-override cases"
)

// outcome is what one case produced on one target.
type outcome struct {
	Obs   []string `json:"obs"`
	Fails []string `json:"fails"`
}

// Run runs every case on every target, each on a fresh root from the
// target's function, and then compares each target's observations with
// those of the "kernel" target (Reference) line by line. Cases of
// Differences are logged rather than failed. Without a "kernel" target the
// cases run with their expectations only.
//
// MainHook must have been called from TestMain. NeedNonRoot cases need the
// FS of every target to implement Reopener with a factory registered by
// RegisterFactory.
func Run(t *testing.T, targets map[string]func(t *testing.T) FS, cases []Case) {
	t.Helper()
	if !hooked {
		t.Fatal("conformance: call conformance.MainHook() from TestMain before m.Run")
	}
	if len(targets) == 0 {
		t.Fatal("conformance: no targets")
	}
	seen := make(map[string]bool)
	for _, c := range cases {
		if c.Name == "" || c.Run == nil || seen[c.Name] {
			t.Fatalf("conformance: case %q: empty or duplicate name, or no Run", c.Name)
		}
		seen[c.Name] = true
	}
	names := make([]string, 0, len(targets))
	for name := range targets {
		if name != Reference {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if _, ok := targets[Reference]; ok {
		names = slices.Insert(names, 0, Reference)
	}

	var exe childExe
	defer exe.remove()

	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Needs {
			case NeedNonRoot:
				if os.Geteuid() != 0 {
					t.Skip(skipNonRoot)
				}
			case NeedRoot:
				if os.Geteuid() != 0 {
					t.Skip(skipRoot)
				}
			}
			results := make([]outcome, len(names))
			for i, name := range names {
				fsys := targets[name](t)
				switch {
				case c.Needs == NeedNonRoot:
					results[i] = runWithChild(t, &exe, fsys, c)
				case c.Peer != nil:
					results[i] = runWithPeer(t, &exe, fsys, c)
				default:
					results[i] = runInProcess(fsys, c)
				}
			}
			report(t, c.Name, names, results)
		})
	}
}

// report fails t for the failed expectations and the mismatches with the
// reference, except the known differences.
func report(t *testing.T, name string, targets []string, results []outcome) {
	t.Helper()
	diff, known := knownDifference(name)
	for i, target := range targets {
		f := t.Errorf
		if known && target != Reference {
			f = t.Logf
		}
		for _, msg := range results[i].Fails {
			f("%s: %s", target, msg)
		}
	}
	if targets[0] != Reference {
		return
	}
	for i := 1; i < len(targets); i++ {
		d := compare(results[0].Obs, results[i].Obs)
		if d == "" {
			continue
		}
		if known {
			t.Logf("%s differs from %s (known: %s):\n%s", targets[i], Reference, diff.Reason, d)
		} else {
			t.Errorf("%s differs from %s:\n%s", targets[i], Reference, d)
		}
	}
	if t.Failed() || testing.Verbose() {
		for i, target := range targets {
			t.Logf("%s observations:\n\t%s", target, strings.Join(results[i].Obs, "\n\t"))
		}
	}
}

// compare lists the lines where got differs from ref, or returns "".
func compare(ref, got []string) string {
	var b strings.Builder
	for i := range max(len(ref), len(got)) {
		r, g := "(none)", "(none)"
		if i < len(ref) {
			r = ref[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if r != g {
			fmt.Fprintf(&b, "  line %d:\n    want %s\n    got  %s\n", i+1, r, g)
		}
	}
	return b.String()
}

// runPhase runs f on t in its own goroutine, so that Fatalf (runtime.Goexit)
// ends only the case. It reports whether f returned normally.
func runPhase(t *Tester, prefix string, f func(*Tester)) (completed bool) {
	if f == nil {
		return true
	}
	t.mu.Lock()
	t.prefix = prefix
	t.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(t)
		completed = true
	}()
	<-done
	return completed
}

// finish closes the files a case left open (failing it if it completed)
// and returns its outcome.
func (t *Tester) finish(completed bool) outcome {
	t.mu.Lock()
	left := make([]*TFile, 0, len(t.open))
	for f := range t.open {
		left = append(left, f)
	}
	t.open = make(map[*TFile]bool)
	t.mu.Unlock()
	for _, f := range left {
		_ = f.f.Close()
	}
	if completed && len(left) > 0 {
		t.mu.Lock()
		t.fails = append(t.fails, fmt.Sprintf("case left %d files open", len(left)))
		t.mu.Unlock()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return outcome{Obs: t.obs, Fails: t.fails}
}

func runInProcess(fsys FS, c Case) outcome {
	t := newTester(fsys)
	ok := runPhase(t, "setup: ", c.Setup)
	if ok {
		ok = runPhase(t, "", c.Run)
	}
	return t.finish(ok)
}

// childRequest is what the parent passes to the child in childEnv.
type childRequest struct {
	Case    string `json:"case"`
	Factory string `json:"factory"`
	Arg     string `json:"arg"`
}

const childEnv = "WEIR_CONFORMANCE_CHILD"

// runWithChild runs c.Setup here (as root) and c.Run in a child process as
// ChildUID/ChildGID with c.Groups, on the same root.
func runWithChild(t *testing.T, exe *childExe, fsys FS, c Case) outcome {
	t.Helper()
	pt := newTester(fsys)
	ok := runPhase(pt, "setup: ", c.Setup)
	setup := pt.finish(ok)
	if !ok || len(setup.Fails) > 0 {
		return setup
	}
	fail := func(format string, args ...any) outcome {
		setup.Fails = append(setup.Fails, fmt.Sprintf(format, args...))
		return setup
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd, err := childCommand(ctx, exe, fsys, c, childEnv)
	if err != nil {
		return fail("%v", err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
		Uid: ChildUID, Gid: ChildGID, Groups: c.Groups,
	}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fail("child as uid %d: %v\n%s", ChildUID, err, stderr.String())
	}
	var res outcome
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return fail("child output: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	setup.Obs = append(setup.Obs, res.Obs...)
	setup.Fails = append(setup.Fails, res.Fails...)
	return setup
}

// childExe is a copy of the test binary that ChildUID can execute: the one
// go test builds lives in a private (0700) directory.
type childExe struct {
	once sync.Once
	dir  string // written once
	path string // written once
	err  error  // written once
}

func (e *childExe) get() (string, error) {
	e.once.Do(func() { e.path, e.err = e.copy() })
	return e.path, e.err
}

func (e *childExe) copy() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	e.dir, err = os.MkdirTemp("", "weir-conformance-bin-*")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(e.dir, 0o755); err != nil {
		return "", err
	}
	src, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer src.Close()
	path := filepath.Join(e.dir, filepath.Base(self))
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return "", err
	}
	if err := dst.Close(); err != nil {
		return "", err
	}
	return path, os.Chmod(path, 0o755) // whatever the umask
}

func (e *childExe) remove() {
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}

// hooked records that MainHook ran; written before m.Run.
var hooked bool

// MainHook must be called from TestMain before m.Run in every package that
// calls Run:
//
//	func TestMain(m *testing.M) {
//		conformance.MainHook()
//		os.Exit(m.Run())
//	}
//
// It pins the umask to 022 so that modes are the same everywhere. In the
// child process of a NeedNonRoot case (the test binary re-executed as
// ChildUID), it runs that case on the root the parent prepared, prints the
// observations as JSON on stdout and exits: m.Run is never reached.
// RegisterFactory calls must come before it.
func MainHook() {
	hooked = true
	syscall.Umask(0o022)
	if req := os.Getenv(peerEnv); req != "" {
		if err := runPeer(req); err != nil {
			fmt.Fprintf(os.Stderr, "conformance peer: %v\n", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	req := os.Getenv(childEnv)
	if req == "" {
		return
	}
	res, err := runChild(req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance child: %v\n", err)
		os.Exit(3)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintf(os.Stderr, "conformance child: %v\n", err)
		os.Exit(3)
	}
	os.Exit(0)
}

// childCommand is the command that runs case c in a child process on
// fsys's root, the request in the environment variable env (childEnv or
// peerEnv); the caller sets its identity and pipes.
func childCommand(ctx context.Context, exe *childExe, fsys FS, c Case, env string) (*exec.Cmd, error) {
	r, isR := fsys.(Reopener)
	if !isR {
		return nil, fmt.Errorf("%T does not implement Reopener: cannot reach the root from a child process", fsys)
	}
	factory, arg := r.Reopen()
	if factory == "" {
		return nil, fmt.Errorf("%T has no factory for a child process", fsys)
	}
	path, err := exe.get()
	if err != nil {
		return nil, fmt.Errorf("child binary: %v", err)
	}
	req, err := json.Marshal(childRequest{Case: c.Name, Factory: factory, Arg: arg})
	if err != nil {
		return nil, fmt.Errorf("child request: %v", err)
	}
	cmd := exec.CommandContext(ctx, path, "-test.run=^$")
	cmd.Dir = filepath.Dir(path)
	// Under -race the child would sleep 1 s at exit (atexit_sleep_ms);
	// later GORACE options win.
	gorace := strings.TrimSpace("atexit_sleep_ms=0 " + os.Getenv("GORACE"))
	cmd.Env = append(os.Environ(), env+"="+string(req), "GORACE="+gorace)
	return cmd, nil
}

// childCase is the child's side of childCommand: the case and the root
// the request names.
func childCase(reqJSON string) (Case, FS, error) {
	var req childRequest
	if err := json.Unmarshal([]byte(reqJSON), &req); err != nil {
		return Case{}, nil, fmt.Errorf("request %q: %v", reqJSON, err)
	}
	i := slices.IndexFunc(Cases(), func(c Case) bool { return c.Name == req.Case })
	if i < 0 {
		return Case{}, nil, fmt.Errorf("no case %q in Cases()", req.Case)
	}
	open, ok := lookupFactory(req.Factory)
	if !ok {
		return Case{}, nil, fmt.Errorf("no factory %q: call RegisterFactory before MainHook", req.Factory)
	}
	fsys, err := open(req.Arg)
	if err != nil {
		return Case{}, nil, fmt.Errorf("factory %q(%q): %v", req.Factory, req.Arg, err)
	}
	return Cases()[i], fsys, nil
}

func runChild(reqJSON string) (outcome, error) {
	c, fsys, err := childCase(reqJSON)
	if err != nil {
		return outcome{}, err
	}
	if uid := os.Getuid(); uid == 0 {
		return outcome{}, fmt.Errorf("child runs as uid 0")
	}
	t := newTester(fsys)
	return t.finish(runPhase(t, "", c.Run)), nil
}
