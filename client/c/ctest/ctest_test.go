// Package ctest builds libweir (client/c) and its C tests with the
// system compiler and runs them against a stack started here.
package ctest

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// build compiles libweir with the C test main into a binary.
func build(t *testing.T, main string) string { return buildC(t, main, true) }

// buildC compiles the C test main, with libweir or (a program the shim
// serves, which knows nothing of weir) without.
func buildC(t *testing.T, main string, withLib bool) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) on PATH: libweir's C tests need one (Debian: gcc)")
	}
	_, here, _, _ := runtime.Caller(0)
	lib := filepath.Dir(filepath.Dir(here)) // client/c
	top := filepath.Dir(filepath.Dir(lib))
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(main, ".c"))
	args := []string{"-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread",
		"-I", lib, "-I", filepath.Join(top, "proto", "include"), "-I", filepath.Join(top, "ring", "include")}
	if withLib {
		args = append(args, filepath.Join(lib, "weir.c"))
	}
	cmd := exec.Command(cc, append(args, filepath.Join(lib, main), "-o", out)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, b)
	}
	return out
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// TestBasic: libweir's basic test passes against a stack on the file
// backend, and what it left reads the same through the Go client.
func TestBasic(t *testing.T) {
	bin := build(t, "test_basic.c")
	st := startStack(t)
	cfg := st.Config
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(cmd.Environ(), "WEIR_META_SOCK="+cfg.Metadata.Socket, "WEIR_IO_SOCK="+cfg.IO.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := c.ReadFile("c/big")
	if err != nil || len(b) != 3<<20+12345 {
		t.Fatalf("c/big through the Go client: %d bytes, %v", len(b), err)
	}
	for i := range b {
		if want := byte(i*31 + 2 + i>>12); b[i] != want {
			t.Fatalf("c/big byte %d: %#x, want %#x", i, b[i], want)
		}
	}
}

// buildShim compiles libweir-preload.so.
func buildShim(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) on PATH: libweir's C tests need one (Debian: gcc)")
	}
	_, here, _, _ := runtime.Caller(0)
	lib := filepath.Dir(filepath.Dir(here))
	top := filepath.Dir(filepath.Dir(lib))
	out := filepath.Join(t.TempDir(), "libweir-preload.so")
	cmd := exec.Command(cc, "-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-pthread",
		"-I", lib, "-I", filepath.Join(top, "proto", "include"), "-I", filepath.Join(top, "ring", "include"),
		filepath.Join(lib, "weir.c"), filepath.Join(lib, "preload.c"), "-o", out, "-ldl", "-Wl,-Bsymbolic-functions")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, b)
	}
	return out
}

// startStack starts a stack on the file backend for the test.
func startStack(t *testing.T) *stack.Stack { return startStackWith(t, nil) }

// startStackWith is startStack with edit applied to the configuration.
func startStackWith(t *testing.T, edit func(*config.Config)) *stack.Stack {
	t.Helper()
	cfg := stacktest.Config(t, t.TempDir())
	cfg.IO.Backend = "file"
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st, err := stack.Start(cfg, hclog.New(&hclog.LoggerOptions{Name: "ctest", Level: hclog.Warn, Output: logWriter{t}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return st
}

// restartable is a shim over a stack on the file backend that a test
// shuts down and starts again on the same configuration (a restart: what
// is durable is what the services find): restart stops the current stack
// and starts a new one in s.st, which the test's end shuts down.
func restartable(t *testing.T) (s *shimmed, restart func()) {
	t.Helper()
	cfg := stacktest.Config(t, t.TempDir())
	cfg.IO.Backend = "file"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	start := func() *stack.Stack {
		st, err := stack.Start(cfg, hclog.New(&hclog.LoggerOptions{Name: "ctest", Level: hclog.Warn, Output: logWriter{t}}))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	stop := func(st *stack.Stack) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	s = &shimmed{t: t, st: start(), so: buildShim(t)}
	t.Cleanup(func() { stop(s.st) })
	return s, func() {
		stop(s.st)
		s.st = start()
	}
}

// shimScript is run by sh against a kernel directory and a weir one ($D);
// each line's output, with $D written as D, must be the same.
var shimScript = []string{
	`echo hello > $D/x && cat $D/x`,
	`printf 'a\nb\nc\n' > $D/y; wc -l $D/y; head -n 2 $D/y; tail -n 1 $D/y`,
	`echo more >> $D/x; cat $D/x; echo more >> $D/x; wc -l $D/x`,
	`exec 3>$D/fd3; echo one >&3; echo two >&3; exec 3>&-; cat $D/fd3`,
	`mkdir $D/d && echo in > $D/d/f && cat $D/d/f && rm $D/d/f; cat $D/d/f; rmdir $D/d; stat -c %F $D/d`,
	`dd if=/dev/zero of=$D/z bs=64k count=16 status=none && sha256sum $D/z && cat $D/z | sha256sum`,
	`cp $D/x $D/x2 && cat $D/x2 && cmp $D/x $D/x2 && echo same`,
	`stat -c '%s %a %F' $D/x $D/y; touch $D/t; stat -c '%s %a' $D/t`,
	`cat $D/none; echo "status $?"`,
	`mkdir $D/l && touch $D/l/b $D/l/a && ls $D/l && echo $D/l/* && ls -a $D/l`,
	`mv $D/l/a $D/l/c && ls $D/l && mv $D/l/b $D/l/c && ls $D/l && cat $D/l/c`,
	`[ -r $D/x ] && echo r; [ -w $D/x ] && echo w; [ -x $D/x ] || echo notx; [ -e $D/none ] || echo none; [ -d $D/l ] && echo dir`,
	`printf '%s\n' one two three > $D/v && sort -r $D/v && grep -c o $D/v && sed -n 2p $D/v`,
	`(echo sub > $D/s; echo more >> $D/s; cat $D/s) && cat $D/s && (mkdir $D/fk; echo x > $D/fk/y) && ls $D/fk`,
}

// TestShimDifferential: unmodified programs (sh, coreutils, python3 if
// installed) under LD_PRELOAD=libweir-preload.so give the same output on
// a weir directory as on a kernel one.
func TestShimDifferential(t *testing.T) {
	so := buildShim(t)
	st := startStack(t)
	script := append([]string(nil), shimScript...)
	if _, err := exec.LookPath("python3"); err == nil {
		script = append(script, `python3 -c "import os; open(os.environ['D']+'/p','w').write('py\n'); print(open(os.environ['D']+'/p').read(), end='')"`,
			// fstat and fsync of a read-only descriptor whose name was
			// removed, or renamed, since the open.
			`python3 -c "import os; d=os.environ['D']; open(d+'/u','w').write('12345'); fd=os.open(d+'/u',os.O_RDONLY); os.unlink(d+'/u'); s=os.fstat(fd); print(s.st_size, s.st_nlink); os.fsync(fd); os.fdatasync(fd); print(os.read(fd,9))"`,
			`python3 -c "import os; d=os.environ['D']; open(d+'/w','w').write('123'); fd=os.open(d+'/w',os.O_RDONLY); os.rename(d+'/w',d+'/w2'); s=os.fstat(fd); print(s.st_size, s.st_nlink); os.fsync(fd); print(os.read(fd,9))"`,
			// lseek and pwrite agree on the largest file (s_maxbytes: ext4's
			// is below 2^62, tmpfs's above; weir's, 64 TiB, below).
			`python3 - <<'EOF'
import errno, os
fd = os.open(os.environ['D'] + '/big', os.O_RDWR | os.O_CREAT, 0o644)
def res(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
s = res(lambda: os.lseek(fd, 1 << 62, os.SEEK_SET))
w = res(lambda: os.pwrite(fd, b'x', 1 << 62))
print((s == 'ok') == (w == 'ok'), s in ('ok', 'EINVAL'), w in ('ok', 'EFBIG'), os.lseek(fd, 0, os.SEEK_CUR) == (1 << 62 if s == 'ok' else 0))
os.ftruncate(fd, 0)
EOF`)
	} else {
		t.Log("python3 is not installed: its line is left out")
	}
	kdir := t.TempDir()
	run := func(dir string, shim bool, line string) string {
		cmd := exec.Command("sh", "-c", line)
		cmd.Env = append(cmd.Environ(), "D="+dir, "LC_ALL=C")
		if shim {
			cmd.Env = append(cmd.Env, "LD_PRELOAD="+so, "WEIR_MOUNT=/weir",
				"WEIR_META_SOCK="+st.Config.Metadata.Socket, "WEIR_IO_SOCK="+st.Config.IO.Socket)
		}
		out, _ := cmd.CombinedOutput()
		return strings.ReplaceAll(string(out), dir, "D")
	}
	if out := run("/weir/t", true, "mkdir /weir/t"); out != "" {
		t.Fatalf("mkdir /weir/t through the shim: %s", out)
	}
	for _, line := range script {
		want, got := run(kdir, false, line), run("/weir/t", true, line)
		if got != want {
			t.Errorf("%s\nkernel:\n%s\nweir:\n%s", line, want, got)
		}
	}
	// And the Go client sees what the programs wrote.
	c, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, err := c.ReadFile("t/x"); err != nil || string(b) != "hello\nmore\nmore\n" {
		t.Errorf("t/x through the Go client: %q %v", b, err)
	}
}

// TestShimExecKeepsDescriptors: a weir descriptor survives exec (sh's
// redirection of a weir file into a program it runs).
func TestShimExecKeepsDescriptors(t *testing.T) {
	so := buildShim(t)
	st := startStack(t)
	cmd := exec.Command("sh", "-c", `echo data > /weir/f; wc -c < /weir/f; cat /weir/f > /weir/g; cat < /weir/g`)
	cmd.Env = append(cmd.Environ(), "LC_ALL=C", "LD_PRELOAD="+so, "WEIR_MOUNT=/weir",
		"WEIR_META_SOCK="+st.Config.Metadata.Socket, "WEIR_IO_SOCK="+st.Config.IO.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "5\ndata\n" {
		t.Fatalf("wc -c < a weir file, cat > one: %v %q", err, out)
	}
}

// TestShimExecLosesNothingLoudly: a program the shim does not serve
// (LD_PRELOAD dropped) that inherits a weir descriptor fails its reads
// with EBADF; it does not read as an empty file.
func TestShimExecLosesNothingLoudly(t *testing.T) {
	so := buildShim(t)
	st := startStack(t)
	cmd := exec.Command("sh", "-c", `echo data > /weir/f; exec 3</weir/f; env -u LD_PRELOAD cat <&3`)
	cmd.Env = append(cmd.Environ(), "LC_ALL=C", "LD_PRELOAD="+so, "WEIR_MOUNT=/weir",
		"WEIR_META_SOCK="+st.Config.Metadata.Socket, "WEIR_IO_SOCK="+st.Config.IO.Socket)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Bad file descriptor") {
		t.Fatalf("cat without the shim < a weir file: %v %q; want its failure with EBADF", err, out)
	}
}

// TestShimFork: fork and exec share open file descriptions as the
// kernel's do (test_fork.c).
func TestShimFork(t *testing.T) {
	so := buildShim(t)
	bin := buildC(t, "test_fork.c", false)
	st := startStack(t)
	cmd := exec.Command(bin)
	// (no tcache: a stream freed twice aborts at once)
	cmd.Env = append(cmd.Environ(), "LD_PRELOAD="+so, "WEIR_MOUNT=/weir", "GLIBC_TUNABLES=glibc.malloc.tcache_count=0",
		"WEIR_META_SOCK="+st.Config.Metadata.Socket, "WEIR_IO_SOCK="+st.Config.IO.Socket)
	out, err := cmd.Output()
	if err != nil || string(out) != "ok\nbefore\nok\n" /* (the exec'd child's, then the parent's) */ {
		t.Fatalf("%s: %v\n%q", bin, err, out)
	}
}
