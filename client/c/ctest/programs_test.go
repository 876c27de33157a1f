package ctest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// Real programs through the shim (issue 11). Each test needs its program
// installed (the Debian package is named in the skip message) and skips
// without it.

// shimmed is a stack and the shim, and how to run a program under it.
type shimmed struct {
	t  *testing.T
	st *stack.Stack
	so string
}

func newShimmed(t *testing.T) *shimmed {
	return &shimmed{t: t, st: startStack(t), so: buildShim(t)}
}

func (s *shimmed) env() []string {
	return []string{"LC_ALL=C", "LD_PRELOAD=" + s.so, "WEIR_MOUNT=/weir",
		"WEIR_META_SOCK=" + s.st.Config.Metadata.Socket, "WEIR_IO_SOCK=" + s.st.Config.IO.Socket}
}

// cmd is name with args under the shim.
func (s *shimmed) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, name, args...)
	c.Env = append(os.Environ(), s.env()...)
	return c
}

// sh runs a shell script under the shim and returns its output; a failure
// fails the test.
func (s *shimmed) sh(shell, script string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := s.cmd(ctx, shell, "-c", script).CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s -c %q: %v\n%s", shell, script, err, out)
	}
	return string(out)
}

func need(t *testing.T, prog, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(prog)
	if err != nil {
		t.Skipf("%s is not installed (Debian package %s): this test runs it through the shim", prog, pkg)
	}
	return p
}

// TestShimCoreutils: the coreutils, tar, find, sed and python3 the issue
// names, on weir paths, as on the kernel's: one script per line, output
// compared with the same line run against a kernel directory.
func TestShimCoreutils(t *testing.T) {
	s := newShimmed(t)
	lines := []string{
		`mkdir -p $D/src/a/b && echo x > $D/src/a/b/f && echo y > $D/src/top && printf 'z\n' > $D/src/a/g`,
		`find $D/src | sort; find $D/src -type f -name '[fg]' | sort; touch -d '2020-01-01' $D/src/top && find $D/src -newer $D/src/top -type f | wc -l`,
		`cp -r $D/src $D/cp && find $D/cp -type f | sort && cat $D/cp/a/b/f && cp -p $D/src/top $D/top2 && stat -c '%a %s' $D/top2`,
		`mv $D/cp $D/mv && ls $D && mv $D/mv/top $D/mv/a/ && find $D/mv | sort`,
		`tar -C $D -cf $D/t.tar src && tar -tf $D/t.tar | sort && mkdir $D/x && tar -C $D/x -xf $D/t.tar && diff -r $D/src $D/x/src && echo same`,
		`tar -C $D -czf $D/t.tgz src && tar -tzf $D/t.tgz | sort && tar -xzOf $D/t.tgz src/a/b/f`,
		`printf 'one\ntwo\nthree\n' > $D/s && sed -i 's/two/TWO/' $D/s && cat $D/s && sed -i.bak -e 1d $D/s && cat $D/s $D/s.bak`,
		`dd if=/dev/urandom of=$D/r bs=4k count=33 status=none && dd if=$D/r of=$D/r2 bs=1k skip=3 count=40 status=none && cmp -n 40960 -i 3072:0 $D/r $D/r2 && echo dd-ok && stat -c %s $D/r2`,
		`seq 1 20000 > $D/n && sha256sum < $D/n && md5sum $D/n | cut -c1-32 && wc -c < $D/n && tail -c 6 $D/n`,
		`touch -d '2020-01-02 03:04:05' $D/old && stat -c '%Y %s' $D/old && touch $D/old && [ $D/old -nt $D/top ] && echo newer`,
		`chmod 640 $D/top && stat -c %a $D/top && chmod u+x,g-r $D/top && stat -c %a $D/top && chmod -R go-rwx $D/src && stat -c %a $D/src/a/b/f`,
		`ls -l $D/src/a/b/f $D/top | awk '{print $1, $5, $9}' && ls -1 $D/src/a && ls -R $D/src | head -20`,
		`du -b $D/src/top $D/r && du -k $D/r $D/n && du -ab $D/src | grep -v '/$' | awk '{print $2}' | sort`,
		`rm -r $D/x && ls $D | sort && rm -rf $D/mv $D/src && ls $D | sort && rm $D/r $D/r2; ls $D | wc -l`,
		`mkdir -p $D/deep/1/2/3 && cd $D/deep/1/2 && pwd | sed "s|$D|D|" && echo rel > 3/f && cat ../2/3/f && cd .. && ls 2/3 && cd / && cat $D/deep/1/2/3/f`,
		`cd $D && mkdir rel && cd rel && touch a b && ls && mv a ../a-up && ls .. | grep a-up && rm -r ../rel && ls $D | grep -c rel`,
		`ln -s n $D/link && cat $D/link | wc -l && ln $D/n $D/hard && stat -c '%h %F' $D/n $D/hard $D/link && rm $D/n && wc -l < $D/hard && rm $D/hard $D/link`,
		`mkdir $D/rel2 && cd $D/rel2 && mkdir -p a/b/c && ls -R && (cd a/b; pwd | sed "s|$D|D|") && pwd | sed "s|$D|D|" && rm -r a`,
	}
	if _, err := exec.LookPath("python3"); err == nil {
		lines = append(lines, `python3 -c "
import os, sys
d = os.environ['D']
os.makedirs(d + '/py/a/b', exist_ok=True)
for n in ('py/x', 'py/a/y', 'py/a/b/z'):
    with open(d + '/' + n, 'w') as f: f.write(n * 100)
for root, dirs, files in os.walk(d + '/py'):
    print(root.replace(d, 'D'), sorted(dirs), sorted(files), sum(os.path.getsize(os.path.join(root, f)) for f in files))
with open(d + '/py/x', 'r+b') as f:
    f.seek(10); f.write(b'XY'); f.seek(0); print(f.read(14)); f.truncate(5)
print(os.path.getsize(d + '/py/x'), os.listdir(d + '/py/a'), os.path.exists(d + '/py/none'))
os.rename(d + '/py/a/y', d + '/py/y2'); os.remove(d + '/py/y2'); os.rmdir(d + '/py/a/b') if not os.listdir(d + '/py/a/b') else print('not empty')
print(sorted(os.listdir(d + '/py')))
"`)
	} else {
		t.Log("python3 is not installed: its line is left out")
	}
	if _, err := exec.LookPath("patch"); err == nil {
		// GNU patch exports gnulib's renameat2: the shim's rename must
		// not call it (it renames with a raw system call).
		lines = append(lines, `cd $D && printf 'a\nb\nc\n' > pf && printf 'a\nB\nc\n' > pg && { diff -u pf pg > p.diff; true; } && patch pf p.diff && cat pf && patch -R pf < p.diff && cat pf && rm pf pg p.diff`)
	} else {
		t.Log("patch is not installed (Debian package patch): its line is left out")
	}
	kdir := t.TempDir()
	run := func(dir string, shim bool, line string) string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-c", line)
		cmd.Env = append(os.Environ(), "D="+dir, "LC_ALL=C", "TZ=UTC")
		if shim {
			cmd = s.cmd(ctx, "bash", "-c", line)
			cmd.Env = append(cmd.Env, "D="+dir, "TZ=UTC")
		}
		out, _ := cmd.CombinedOutput()
		return strings.ReplaceAll(string(out), dir, "D")
	}
	need(t, "bash", "bash")
	s.sh("sh", "mkdir /weir/c")
	for _, line := range lines {
		want, got := run(kdir, false, line), run("/weir/c", true, line)
		if got != want {
			t.Errorf("%s\nkernel:\n%s\nweir:\n%s", line, want, got)
		}
	}
}

// TestShimBash: bash's redirections and descriptor juggling on weir
// files: exec 3<>, exec 6>&5, here-documents, and >> appends from two
// processes at once, which O_APPEND makes whole lines.
func TestShimBash(t *testing.T) {
	need(t, "bash", "bash")
	s := newShimmed(t)
	out := s.sh("bash", `set -e
cd /weir
exec 3<>rw
echo first >&3
exec 5>&3
exec 6>&5
echo second >&6
exec 3>&- 5>&- 6>&-
cat rw
cat <<EOF >here
a $((1+2))
EOF
cat here
exec 4<rw
read -r line <&4; echo "read: $line"
read -r line <&4; echo "read: $line"
exec 4<&-
{ echo g1; echo g2; } > grouped; cat grouped
for w in a b; do (for i in $(seq 1 200); do echo "$w$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; done >> ap) & done; wait
wc -l < ap; grep -c '^a[0-9]*-x\{40\}$' ap; grep -c '^b[0-9]*-x\{40\}$' ap
echo tail >> ap; tail -n 1 ap
cat < rw > copy 2>/dev/null; cmp rw copy && echo copied
ls > listing; grep -c . listing
`)
	want := "first\nsecond\na 3\nread: first\nread: second\ng1\ng2\n400\n200\n200\ntail\ncopied\n6\n"
	if out != want {
		t.Fatalf("bash on weir:\n%s\nwant:\n%s", out, want)
	}
}

// TestShimMake: make builds a small C project whose sources live on
// weir, runs the program (exec of a file on weir), and rebuilds what a
// changed header needs.
func TestShimMake(t *testing.T) {
	need(t, "make", "make")
	need(t, "cc", "gcc")
	s := newShimmed(t)
	out := s.sh("sh", `set -e
mkdir -p /weir/proj && cd /weir/proj
printf '#include <stdio.h>\n#include "v.h"\nint f(void);\nint main(void) { printf("%%d %%d\\n", V, f()); return 0; }\n' > main.c
printf '#include "v.h"\nint f(void) { return V * 2; }\n' > f.c
echo '#define V 1' > v.h
printf 'prog: main.o f.o\n\t$(CC) -o $@ main.o f.o\n%%.o: %%.c v.h\n\t$(CC) -c $<\n' > Makefile
make -s && ./prog
make -s && echo up-to-date
sleep 1.1; echo '#define V 5' > v.h
make -s && ./prog && ls *.o | wc -l`)
	if want := "1 2\nup-to-date\n5 10\n2\n"; out != want {
		t.Fatalf("make on weir:\n%s\nwant:\n%s", out, want)
	}
}

// TestShimSQLite: two sqlite3 processes write one database on weir in
// transactions, under its POSIX locks; one is killed mid-run; the
// database is whole (integrity_check) and holds whole transactions only.
func TestShimSQLite(t *testing.T) {
	need(t, "sqlite3", "sqlite3")
	s := newShimmed(t)
	s.sh("sh", `sqlite3 /weir/db 'create table t(id integer primary key, who text, tx integer, pad text)'`)
	script := func(who string, n int) string {
		var b strings.Builder
		b.WriteString(".timeout 60000\n")
		for i := 0; i < n; i++ {
			b.WriteString("begin immediate;\n")
			for j := 0; j < 10; j++ {
				fmt.Fprintf(&b, "insert into t(who, tx, pad) values('%s', %d, hex(randomblob(100)));\n", who, i)
			}
			b.WriteString("commit;\n")
		}
		return b.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func(who string, n int) *exec.Cmd {
		c := s.cmd(ctx, "sqlite3", "/weir/db")
		c.Stdin = strings.NewReader(script(who, n))
		c.Stdout, c.Stderr = io.Discard, os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	victim := start("victim", 1000000)
	// Once the victim has committed, the survivor writes alongside it.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		n := strings.TrimSpace(s.sh("sh", `sqlite3 /weir/db '.timeout 60000' "select count(*) from t where who = 'victim'"`))
		if c, _ := strconv.Atoi(n); c >= 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the victim committed %s rows in a minute", n)
		}
	}
	survivor := start("survivor", 100)
	if err := survivor.Wait(); err != nil {
		t.Fatalf("the surviving writer: %v", err)
	}
	// The victim is committing all the while: kill it, mid-transaction.
	victim.Process.Signal(syscall.SIGKILL)
	victim.Wait()
	out := s.sh("sh", `sqlite3 /weir/db 'pragma integrity_check; select who, count(*) % 10, count(distinct tx) from t group by who order by who'`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "ok" || lines[1] != "survivor|0|100" || !strings.HasPrefix(lines[2], "victim|0|") {
		t.Fatalf("after the kill: %q (want ok, whole transactions of both, all 100 of the survivor's)", out)
	}
}

// TestShimFio: fio's own verification (crc32c, verify_fatal) of 4 KiB
// random writes and 128 KiB sequential ones through psync, libaio (its
// io_submit is the shim's for weir files), O_DIRECT and pvsync2.
func TestShimFio(t *testing.T) {
	need(t, "fio", "fio")
	s := newShimmed(t)
	for i, job := range [][]string{
		{"--rw=randwrite", "--bs=4k", "--ioengine=psync"},
		{"--rw=randwrite", "--bs=4k", "--ioengine=libaio", "--iodepth=8"},
		{"--rw=write", "--bs=128k", "--ioengine=psync", "--direct=1"},
		{"--rw=randrw", "--bs=16k", "--ioengine=pvsync2", "--fsync=7"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		args := append([]string{"--name=v", fmt.Sprintf("--filename=/weir/fio%d", i), "--size=8m",
			"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=terse"}, job...)
		c := s.cmd(ctx, "fio", args...)
		c.Dir = t.TempDir() // fio leaves its verify state (local-v-0-verify.state) there
		out, err := c.CombinedOutput()
		cancel()
		// terse: field 5 is the job's error code.
		f := strings.Split(strings.TrimSpace(string(out)), ";")
		if err != nil || len(f) < 5 || f[4] != "0" {
			t.Fatalf("fio %v: %v\n%s", job, err, out)
		}
	}
}

// TestShimPostgreSQL: initdb with its data directory on weir, the server
// started, pgbench -i and a fixed number of transactions, a clean stop
// and start, pgbench again, then a SIGKILL of every server process and a
// start that recovers from the WAL; pg_amcheck and the balance sums
// agree each time.
func TestShimPostgreSQL(t *testing.T) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Skip("PostgreSQL is not installed (Debian package postgresql): this test runs initdb, postgres and pgbench through the shim")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	cred := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	if os.Getuid() == 0 {
		// The server refuses to run as root: as the package's user.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root and there is no postgres user (the Debian package makes one): the server refuses root")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	s := newShimmed(t)
	// That uid reaches the sockets and the shim.
	pub, err := os.MkdirTemp("", "weir-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pub) })
	for _, d := range []string{pub, filepath.Dir(s.st.Config.Metadata.Socket)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(pub, int(cred.Uid), int(cred.Gid)); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(pub, "libweir-preload.so")
	if b, err := os.ReadFile(s.so); err != nil || os.WriteFile(so, b, 0o755) != nil {
		t.Fatal("copying the shim", err)
	}
	s.so = so
	sock := filepath.Join(pub, "sock")
	if err := os.Mkdir(sock, 0o777); err != nil || os.Chmod(sock, 0o777) != nil {
		t.Fatal(err)
	}
	s.sh("sh", fmt.Sprintf("mkdir /weir/pg && chown %d:%d /weir/pg && chmod 700 /weir/pg", cred.Uid, cred.Gid))
	logf := filepath.Join(pub, "pg.log")
	run := func(shim bool, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		c.Env = append(os.Environ(), "LC_ALL=C", "PGHOST="+sock, "PGPORT=5499", "PGDATABASE=postgres")
		if shim {
			c.Env = append(c.Env, s.env()...)
		}
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		c.Dir = pub
		out, err := c.CombinedOutput()
		if err != nil {
			lg, _ := os.ReadFile(logf)
			t.Fatalf("%s %v: %v\n%s\nserver log:\n%s", name, args, err, out, lg)
		}
		return string(out)
	}
	data := "/weir/pg/data"
	startServer := func() {
		run(true, "pg_ctl", "-D", data, "-l", logf, "-w", "-t", "120", "-o", "-k "+sock+" -p 5499 -c listen_addresses=''", "start")
	}
	check := func(when string) {
		t.Helper()
		run(false, "pg_amcheck", "--heapallindexed", "--install-missing")
		out := run(false, "psql", "-Atc", "select (select sum(abalance) from pgbench_accounts) = (select sum(bbalance) from pgbench_branches) and (select sum(bbalance) from pgbench_branches) = (select sum(tbalance) from pgbench_tellers)")
		if strings.TrimSpace(out) != "t" {
			t.Fatalf("%s: the balances of accounts, branches and tellers disagree: %q", when, out)
		}
	}
	run(true, "initdb", "-D", data, "-A", "trust", "--no-instructions")
	startServer()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop").Run()
		}
	})
	run(false, "pgbench", "-i", "-s", "2")
	if out := run(false, "pgbench", "-t", "200", "-c", "2"); !strings.Contains(out, "number of transactions actually processed: 400/400") {
		t.Fatalf("pgbench: %s", out)
	}
	check("after pgbench")
	run(true, "pg_ctl", "-D", data, "-w", "stop")
	startServer()
	if out := run(false, "pgbench", "-n", "-t", "200", "-c", "2"); !strings.Contains(out, "400/400") {
		t.Fatalf("pgbench after the restart: %s", out)
	}
	check("after a clean restart")
	// A crash: every server process killed with SIGKILL, then recovery.
	pidb := s.sh("sh", "head -1 "+data+"/postmaster.pid")
	pid, err := strconv.Atoi(strings.TrimSpace(pidb))
	if err != nil {
		t.Fatalf("postmaster.pid: %q", pidb)
	}
	killAll(t, pid)
	startServer()
	if lg, _ := os.ReadFile(logf); !strings.Contains(string(lg), "automatic recovery in progress") {
		t.Fatalf("no recovery after the kill:\n%s", lg)
	}
	check("after recovery from SIGKILL")
	run(true, "pg_ctl", "-D", data, "-w", "stop")
	stopped = true
}

// killAll kills the process pid and its children with SIGKILL and waits
// until they are gone and reaped.
func killAll(t *testing.T, pid int) {
	t.Helper()
	kids := func() []int {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		var out []int
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return out
	}
	all := append(kids(), pid)
	for _, p := range all {
		syscall.Kill(p, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		alive := 0
		for _, p := range all {
			// Until it is reaped: a zombie postmaster still answers
			// kill(pid, 0), and the next one would take it as running.
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err == nil {
				alive++
			}
		}
		if alive == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d server processes outlived SIGKILL", alive)
		}
	}
}

// TestShimReadsSeeWrites: a reader that maps the file's cache region (its
// third read on) sees what another process writes and truncates, at once,
// in its reads and in lseek's SEEK_END, SEEK_HOLE and SEEK_DATA (which take
// the size from the region).
func TestShimReadsSeeWrites(t *testing.T) {
	need(t, "python3", "python3")
	s := newShimmed(t)
	out := s.sh("python3", `
import errno, os, subprocess
open('/weir/cc', 'w').write('a' * 10000)
fd = os.open('/weir/cc', os.O_RDONLY)
for i in range(4):
    assert os.pread(fd, 5, 9000) == b'aaaaa'
subprocess.run(['sh', '-c', 'printf XYZ | dd of=/weir/cc bs=1 seek=9001 conv=notrunc status=none'], check=True)
print(os.pread(fd, 5, 9000))
subprocess.run(['truncate', '-s', '9002', '/weir/cc'], check=True)
print(os.pread(fd, 5, 9000), os.fstat(fd).st_size, os.lseek(fd, 0, os.SEEK_END))
subprocess.run(['sh', '-c', 'printf tail >> /weir/cc'], check=True)
print(os.pread(fd, 10, 9000), os.lseek(fd, 0, os.SEEK_END), os.lseek(fd, 9005, os.SEEK_HOLE))
try:
    os.lseek(fd, 9006, os.SEEK_DATA)
except OSError as e:
    print(e.errno == errno.ENXIO)
`)
	if want := "b'aXYZa'\nb'aX' 9002 9002\nb'aXtail' 9006 9006\nTrue\n"; out != want {
		t.Fatalf("reads after other processes' writes: %q, want %q", out, want)
	}
}

// TestShimExportsOnlyEntryPoints: every symbol the shim defines is an
// entry point of the C library (or libaio's, or libweir's own weir_*):
// a helper left global would take the place of a program's own function
// of that name.
func TestShimExportsOnlyEntryPoints(t *testing.T) {
	need(t, "nm", "binutils")
	so := buildShim(t)
	defined := func(path string) map[string]bool {
		out, err := exec.Command("nm", "-D", "--defined-only", path).Output()
		if err != nil {
			t.Fatalf("nm %s: %v", path, err)
		}
		m := map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 3 {
				m[strings.SplitN(f[2], "@", 2)[0]] = true
			}
		}
		return m
	}
	libcPath, _ := filepath.Glob("/lib/*-linux-gnu/libc.so.6")
	if len(libcPath) == 0 {
		t.Skip("no /lib/*-linux-gnu/libc.so.6 (a Debian multiarch glibc) to compare the shim's symbols with")
	}
	libc := defined(libcPath[0])
	libaio := map[string]bool{"io_submit": true, "io_getevents": true, "io_cancel": true, "io_destroy": true}
	for sym := range defined(so) {
		if !libc[sym] && !libaio[sym] && !strings.HasPrefix(sym, "weir_") {
			t.Errorf("the shim exports %s, which is no libc or libaio entry point", sym)
		}
	}
}

// TestShimMmapPrivate: a MAP_PRIVATE mapping of a weir file holds its
// bytes, takes private writes that never reach the file, and reads zeros
// past its end.
func TestShimMmapPrivate(t *testing.T) {
	need(t, "python3", "python3")
	s := newShimmed(t)
	out := s.sh("python3", `
import mmap, os
open('/weir/mm', 'wb').write(b'0123456789' * 1000)
fd = os.open('/weir/mm', os.O_RDONLY)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
print(len(m), m[9995:10000], m[:4])
m[:4] = b'abcd'
print(m[:6], open('/weir/mm', 'rb').read(6))
tail = mmap.mmap(fd, 10000 - 8192, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ, offset=8192)
print(tail[:3], tail[-2:])
`)
	if want := "10000 b'56789' b'0123'\nb'abcd45' b'012345'\nb'234' b'89'\n"; out != want {
		t.Fatalf("mmap of a weir file: %q, want %q", out, want)
	}
}

// TestShimStatFS: df and stat -f of a weir path give the store's size,
// the file system's that holds the file backend's data.
func TestShimStatFS(t *testing.T) {
	s := newShimmed(t)
	got := s.sh("sh", "df -B4096 --output=size /weir | tail -1; stat -f -c '%T %S %l' /weir")
	out, err := exec.Command("df", "-B4096", "--output=size", s.st.Config.DataDir).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := strings.TrimSpace(lines[len(lines)-1]) + "\nUNKNOWN (0x72696577) 4096 255\n"
	if strings.TrimLeft(got, " ") != want {
		t.Fatalf("df and stat -f of /weir: %q, want %q", got, want)
	}
}

// TestShimLinksIntoTheMount: a kernel symbolic link that points into the
// mount (absolute, or relative through another link) leads to weir, for
// open, stat, opendir, chdir, realpath and exec; lstat sees the link.
func TestShimLinksIntoTheMount(t *testing.T) {
	s := newShimmed(t)
	k := t.TempDir()
	if err := os.Symlink("/weir/target", filepath.Join(k, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("abs/sub", filepath.Join(k, "rel")); err != nil {
		t.Fatal(err)
	}
	out := s.sh("sh", `set -e
K=`+k+`
mkdir -p /weir/target/sub
echo through > $K/abs/f
printf '#!/bin/sh\necho ran\n' > $K/rel/run.sh; chmod +x $K/rel/run.sh
cat /weir/target/f
stat -c %s $K/abs/f
ls $K/abs
cd $K/rel && ls && cd /
realpath $K/rel/run.sh
$K/rel/run.sh
stat -c %F $K/abs; stat -L -c %F $K/abs
mv $K/abs/f $K/abs/moved && ln $K/abs/moved $K/rel/../hard && ls /weir/target && stat -c %h /weir/target/moved
mv $K/abs/hard $K/ && cat $K/hard
ls $K/missing 2>&1 || true; mkdir $K/missing/b 2>&1 || true; rm $K/missing 2>&1 || true
stat -c %F $K/missing 2>&1 || true; touch -h $K/missing/x 2>&1 | sed "s|$K|K|" || true`)
	out = strings.ReplaceAll(out, k, "K")
	want := "through\n8\nf\nsub\nrun.sh\n/weir/target/sub/run.sh\nran\nsymbolic link\ndirectory\n" +
		// rename and link through a kernel link into weir are weir's.
		"hard\nmoved\nsub\n2\nthrough\n" +
		// A kernel path the walk finds no way into weir from keeps the kernel's errno.
		"ls: cannot access 'K/missing': No such file or directory\nmkdir: cannot create directory 'K/missing/b': No such file or directory\n" +
		"rm: cannot remove 'K/missing': No such file or directory\nstat: cannot statx 'K/missing': No such file or directory\n" +
		"touch: setting times of 'K/missing/x': No such file or directory\n"
	if out != want {
		t.Fatalf("links into the mount:\n%s\nwant:\n%s", out, want)
	}
}

// shimLinkLines exercise weir's own symbolic and hard links through the
// shim ($D: the directory under test; $H: a host directory holding hf,
// which links lead out to): ln, readlink, stat and lstat, dangling links
// and creation through them, loops (ELOOP), links to directories and cd
// into them, links out of weir by absolute path and by "..", rename and
// hard link across the boundary (EXDEV, mv copies), tar -h, cp -P/-L, find
// -L, sed -i, chmod through a link, chown -h, touch -h, python3's os.
var shimLinkLines = []string{
	`mkdir $D/lk && cd $D/lk && echo data > f && ln -s f sl && ln -s ../lk/f rel && ln -s $D/lk/f abs && ln -s nowhere dangling && ln f hard && cat sl rel abs hard && readlink sl rel && readlink abs && ls -l | awk '{print $1, $2, $9, $10, $11}'`,
	`cd $D/lk && stat -c '%F %s %h' sl f hard dangling && stat -L -c '%F %s' sl; cat dangling; echo "cat dangling: $?"; [ -L sl ] && echo islink; [ -e dangling ] || echo dangling-missing; [ -h dangling ] && echo dangling-link`,
	`cd $D/lk && mkdir sub && echo inner > sub/g && ln -s sub dl && cat dl/g && ls dl && cd dl && pwd -P && cat g && cd .. && echo new > dangling && cat nowhere && rm sl && ls && rm hard && stat -c %h f`,
	`cd $D/lk && ln -s /etc/passwd out && head -c 5 out && echo && readlink -f out; ln -s sub/../f dots && cat dots; ln sl2 x`,
	`cd $D/lk && ln -s dl/g viadir && cat viadir && mv viadir renamed && cat renamed && cp -P renamed copied && readlink copied && cp -L renamed deref && stat -c %F deref && find . -type l | sort && find -L . -name g | sort`,
	`cd $D/lk && tar -cf ../l.tar . && mkdir ../lx && tar -C ../lx -xf ../l.tar && ls -l ../lx | awk '{print $1, $9, $10, $11}' && rm -r ../lx ../l.tar`,
	`cd $D/lk && ln f h1 && ln h1 h2 && stat -c %h f && echo more >> h2 && cat f && rm f h1 && cat h2 && stat -c %h h2 && ln sub nosub; echo "ln dir: $?"`,
	`cd $D/lk && ln -s h2 s3 && chmod 640 s3 && stat -c %a h2 s3 && chown -h $(id -u) s3 && echo chown-h && touch -h s3 && echo touch-h && readlink -f dl/g`,
	`cd $D && rm -r lk && ls`,
	`cd $D && ln -s $H/hf tohost && cat tohost && echo app >> tohost && cat $H/hf && ln -s $H hd && ls hd && cat hd/hf && echo new > hd/nf && cat $H/nf && rm hd/nf && stat -c %F hd hd/ && readlink hd`,
	`cd $D && echo mv > mvf && mv mvf hd/ && cat $H/mvf && rm $H/mvf && ls mvf`,
	`cd $D && ln -s loop1 loop2 && ln -s loop2 loop1 && cat loop1; echo "loop: $?"; stat -L loop1 2>&1 | head -1; ln -s self self && cat self/x; echo "self: $?"`,
	`cd $D && mkdir -p dd/e && ln -s dd/e de && mkdir -p de/f/g && ls dd/e/f && ln -s ../.. up && ls up >/dev/null && echo up-ok`,
	`cd $D && ln -s ../../../../../../../../..$H/hf climb && cat climb && cd de && cat ../climb; cd .. && pwd && cd -P de && pwd && cd .. && pwd`,
	`cd $D && rm -r dd de up tohost hd climb && ls $H && ls`,
	`cd $D && echo x > sf && ln -s sf sl && sed -i s/x/y/ sl && stat -c %F sl sf && cat sf sl`,
	`cd $D && ln -s nope/x dn && echo hi > dn; echo "through missing dir: $?"; touch dn2 && ln -s dn2 dn3 && ln -sf sf dn3 && readlink dn3 && ln -sfn sub2 dn3 && readlink dn3`,
	`cd $D && mkdir m && ln -s m ml && mv ml m2 && ls -d m2/ && cp -a m2 m3 && readlink m3 && rm m2 && ls && rm -r m3 m && rm -f loop1 loop2 self dn dn2 dn3 sl sf mvf`,
	`cd $D && mkdir -p q/r && echo z > q/r/z && ln -s q/r qr && tar -chf t.tar qr && tar -tf t.tar && rm t.tar && du -sL qr | cut -f2 && find qr -maxdepth 0 -type l && find -L qr -type f && rm qr && rm -r q && ls`,
	`cd $D && mkdir -p p/q && echo pq > p/pf && ln -s p/q pl && cat pl/../pf && ls pl/.. | sort && mkdir pl/../made && ls p | sort && cd pl/.. && pwd -P && cat pf && cd $D && rm -r p pl`,
	`head -c 5 $D/../../../../../../../../etc/passwd && echo && cd $D/../../../../../../../.. && pwd && ls -d etc`,
	`cd $D && mkdir -p r/s && ln -s ../../.. r/s/up3 && ls -d r/s/up3/ >/dev/null && echo up3 && cd r/s && cat ../../missing/../r 2>&1 | sed 's/.*: //'; cd $D && rm -r r`,
	`python3 -c "import os;d=os.environ['D'];os.symlink('pyt', d+'/pl');print(os.readlink(d+'/pl'), os.path.islink(d+'/pl'), os.path.exists(d+'/pl'));open(d+'/pyt','w').write('t');print(os.path.exists(d+'/pl'), os.path.realpath(d+'/pl'), os.lstat(d+'/pl').st_size);os.link(d+'/pyt', d+'/pyh');print(os.stat(d+'/pyh').st_nlink);os.remove(d+'/pl');os.remove(d+'/pyt');os.remove(d+'/pyh')"`,
}

// TestShimSymlinks: weir's namespace holds symbolic and hard links, which
// the shim follows as the kernel does (shimLinkLines, each compared with
// the same line run on a kernel directory); one that leads out of weir
// goes on in the host's file system.
func TestShimSymlinks(t *testing.T) {
	need(t, "bash", "bash")
	need(t, "python3", "python3")
	s := newShimmed(t)
	kdir, host := t.TempDir(), t.TempDir()
	run := func(dir string, shim bool, line string) string {
		if err := os.WriteFile(filepath.Join(host, "hf"), []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-c", line)
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		if shim {
			cmd = s.cmd(ctx, "bash", "-c", line)
		}
		cmd.Dir = "/"
		cmd.Env = append(cmd.Env, "D="+dir, "H="+host)
		out, _ := cmd.CombinedOutput()
		return strings.ReplaceAll(strings.ReplaceAll(string(out), dir, "D"), host, "H")
	}
	s.sh("sh", "mkdir /weir/links")
	for _, line := range shimLinkLines {
		want, got := run(kdir, false, line), run("/weir/links", true, line)
		if got != want {
			t.Errorf("%s\nkernel:\n%s\nweir:\n%s", line, want, got)
		}
	}
	// The links are the namespace's: the Go client sees them, and weir
	// check finds the namespace sound (the stack's shutdown checks it).
	c, err := s.st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s.sh("sh", "ln -s target /weir/links/fromc && ln /weir/c-none /weir/links/x 2>/dev/null; true")
	fi, err := c.Lstat("links/fromc")
	if err != nil || fi.Mode()&os.ModeSymlink == 0 || fi.Size() != 6 {
		t.Fatalf("lstat of a link through the Go client: %v %v", fi, err)
	}
}

// TestShimMmapShared: a MAP_SHARED mapping of a weir file (read-only) is
// io's cache pages in place: it sees at once what other processes write
// through write(2), across the region's 4 MiB chunks, after its
// descriptor's close; io keeps the pages resident while they are mapped,
// so a cache too small for the other files read meanwhile evicts none of
// them (the cache here is 8 MiB); a forked child keeps them pinned after
// its parent unmapped them; munmap gives the pins back (a hundred maps of
// 1 MiB in turn, where one session may pin 2 MiB at once: a leak would be
// ENOMEM); past a session's pin limit the map is ENOMEM; PROT_WRITE on a
// read-only descriptor is EACCES (TestShimMmapWritable: on a writable one).
func TestShimMmapShared(t *testing.T) {
	need(t, "python3", "python3")
	s := &shimmed{t: t, st: startStackWith(t, func(c *config.Config) { c.IO.CacheSize = 16 << 20 }), so: buildShim(t)}
	out := s.sh("python3", `
import mmap, os, subprocess, sys
def pattern(n, seed):
    return bytes((i * 7 + seed + i // 4096) & 0xff for i in range(n))
want = pattern(5 << 20, 1)
with open('/weir/big', 'wb') as f:
    f.write(want)
fd = os.open('/weir/big', os.O_RDONLY)
M = 3 << 20  # the mapping: bytes [3 MiB, 5 MiB), across the region's 4 MiB chunks
m = mmap.mmap(fd, 2 << 20, mmap.MAP_SHARED, mmap.PROT_READ, offset=M)
os.close(fd)
print(len(m), m[:] == want[M:])
subprocess.run(['sh', '-c', 'printf XYZW | dd of=/weir/big bs=1 seek=4194302 conv=notrunc status=none'], check=True)
at = 4194302 - M
print(m[at:at + 4], m[at - 2:at] == want[M + at - 2:M + at], m[at + 4:at + 8] == want[M + at + 4:M + at + 8])
# Other files read through a cache smaller than they are: the mapped pages stay.
for i in range(3):
    with open('/weir/other%d' % i, 'wb') as f:
        f.write(pattern(6 << 20, i + 2))
for i in range(3):
    with open('/weir/other%d' % i, 'rb') as f:
        assert f.read() == pattern(6 << 20, i + 2)
cur = bytearray(want); cur[4194302:4194306] = b'XYZW'
print('after pressure', m[:] == bytes(cur[M:]))
m.close()
fd = os.open('/weir/big', os.O_RDONLY)
small = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ)
pid = os.fork()
if pid == 0:
    os.close(fd)
    import time
    time.sleep(0.5)
    for i in range(3):
        with open('/weir/other%d' % i, 'rb') as f:
            f.read()
    os._exit(0 if small[:] == bytes(cur[:1 << 20]) else 1)
small.close()
_, st = os.waitpid(pid, 0)
print('child', os.WEXITSTATUS(st))
for i in range(100):
    x = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ, offset=(i % 4) << 20)
    assert x[0] == cur[(i % 4) << 20]
    x.close()
print('hundred maps')
try:
    mmap.mmap(fd, 5 << 20, mmap.MAP_SHARED, mmap.PROT_READ)
except OSError as e:
    print('over the pin limit', e.errno == 12)
import ctypes  # (python's mmap refuses an offset past the end itself: mmap(2) as C calls it)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
near = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 8 << 20)
far = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 8 << 30)
print('past the end', near != ctypes.c_void_p(-1).value, far == ctypes.c_void_p(-1).value and ctypes.get_errno() == 12)
try:
    mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
except OSError as e:
    print('write on O_RDONLY', e.errno == 13)
`)
	want := "2097152 True\nb'XYZW' True True\nafter pressure True\nchild 0\nhundred maps\nover the pin limit True\npast the end True True\nwrite on O_RDONLY True\n"
	if out != want {
		t.Fatalf("MAP_SHARED of a weir file:\n%s\nwant:\n%s", out, want)
	}
}

// TestShimOpenat2: openat2(2) through syscall(3), with RESOLVE_* flags,
// answers on a weir directory as on a kernel one (test_openat2.c).
func TestShimOpenat2(t *testing.T) {
	bin := buildC(t, "test_openat2.c", false)
	s := newShimmed(t)
	kdir := filepath.Join(t.TempDir(), "k")
	if err := os.Mkdir(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	want, err := exec.Command(bin, kdir).CombinedOutput()
	if err != nil {
		t.Fatalf("%s on the kernel: %v\n%s", bin, err, want)
	}
	got := s.sh("sh", "mkdir /weir/o2 && "+bin+" /weir/o2")
	if got != string(want) {
		t.Fatalf("openat2 on weir:\n%s\nkernel:\n%s", got, want)
	}
}

// TestShimScandirGlob: scandir(3) and glob(3), whose glibc versions use
// internal directory calls the shim cannot see, list a weir directory as
// they list a kernel one (test_dirscan.c), relative patterns after chdir
// into weir included.
func TestShimScandirGlob(t *testing.T) {
	bin := buildC(t, "test_dirscan.c", false)
	s := newShimmed(t)
	kdir := t.TempDir()
	setup := func(d string) string {
		return "mkdir -p " + d + "/sub && touch " + d + "/a.txt " + d + "/b.txt " + d + "/c.dat " + d + "/sub/x && " + bin + " " + d
	}
	want, err := exec.Command("sh", "-c", setup(kdir)).CombinedOutput()
	if err != nil {
		t.Fatalf("on the kernel: %v\n%s", err, want)
	}
	if got := s.sh("sh", setup("/weir/ds")); got != string(want) {
		t.Fatalf("scandir and glob on weir:\n%s\nkernel:\n%s", got, want)
	}
}

// TestShimFtw: nftw(3) and ftw(3) walk a weir directory as they walk a
// kernel one (test_ftw.c): types, levels, names, links physical or
// followed, FTW_DEPTH, FTW_CHDIR (relative too), FTW_ACTIONRETVAL.
func TestShimFtw(t *testing.T) {
	bin := buildC(t, "test_ftw.c", false)
	s := newShimmed(t)
	kdir := filepath.Join(t.TempDir(), "w")
	setup := func(d string) string {
		return "mkdir -p " + d + "/sub/deep && touch " + d + "/a " + d + "/sub/b " + d + "/sub/deep/c && ln -s sub/b " + d +
			"/link && ln -s nowhere " + d + "/dangling && " + bin + " " + d
	}
	want, err := exec.Command("sh", "-c", setup(kdir)).CombinedOutput()
	if err != nil {
		t.Fatalf("on the kernel: %v\n%s", err, want)
	}
	if got := s.sh("sh", setup("/weir/w")); got != string(want) {
		t.Fatalf("nftw and ftw on weir:\n%s\nkernel:\n%s", got, want)
	}
}

// TestShimReportsGoPrograms: a Go program makes its system calls itself,
// past LD_PRELOAD; run with a weir path in its arguments, or from a weir
// cwd, the shim says so on stderr at exec instead of letting it fail
// silently.
func TestShimReportsGoPrograms(t *testing.T) {
	goBin := need(t, "go", "golang")
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport (\"fmt\"; \"os\")\n\nfunc main() { _, err := os.Stat(os.Args[len(os.Args)-1]); fmt.Println(err != nil) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gostat")
	build := exec.Command(goBin, "build", "-o", bin, src)
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	s := newShimmed(t)
	out := s.sh("sh", bin+" /etc/passwd 2>&1 | grep -c weir; mkdir /weir/g && echo x > /weir/g/f && "+bin+" /weir/g/f 2>&1; cd /weir/g && "+bin+" f 2>&1")
	out = strings.ReplaceAll(out, bin, "BIN")
	want := "0\n" + // (no weir path, no weir state: nothing to say)
		"weir: BIN is a Go program: it makes its system calls itself, past LD_PRELOAD, so it cannot use the weir paths in its arguments (the kernel has no such paths; a Go program can use weir's Go client)\ntrue\n" +
		"weir: BIN is a Go program: it makes its system calls itself, past LD_PRELOAD, so it cannot use the weir descriptors or the weir cwd it inherits (they answer EBADF; its cwd is /proc)\ntrue\n"
	if out != want {
		t.Fatalf("a Go program under the shim:\n%s\nwant:\n%s", out, want)
	}
}

// TestShimSpecialFiles: weir keeps no FIFOs, sockets or device nodes.
// mkfifo and mknod of one on a weir path fail with EPERM (a Linux file
// system without them, vfat, says the same) after the checks Linux makes
// first (EEXIST, the parent's ENOENT), where the kernel's call would have
// said ENOENT of a path it does not have; mknod of a regular file creates
// it, with the mode less the umask. A kernel path keeps the kernel's FIFO.
func TestShimSpecialFiles(t *testing.T) {
	need(t, "python3", "python3")
	s := newShimmed(t)
	k := t.TempDir()
	got := s.sh("python3", `
import os, stat, errno
os.umask(0o022)
os.mkdir("/weir/sp")
def try_(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
try_("mkfifo", lambda: os.mkfifo("/weir/sp/f"))
try_("mknod fifo", lambda: os.mknod("/weir/sp/f2", 0o644 | stat.S_IFIFO))
try_("mknod sock", lambda: os.mknod("/weir/sp/s", 0o644 | stat.S_IFSOCK))
try_("mknod chr", lambda: os.mknod("/weir/sp/c", 0o644 | stat.S_IFCHR, os.makedev(1, 3)))
try_("mknod dir", lambda: os.mknod("/weir/sp/d", 0o755 | stat.S_IFDIR))
try_("mknod bad type", lambda: os.mknod("/weir/sp/b", 0o644 | 0o170000))
try_("mkfifo no parent", lambda: os.mkfifo("/weir/sp/none/f"))
try_("mknod reg", lambda: os.mknod("/weir/sp/r", 0o666 | stat.S_IFREG))
print(oct(os.stat("/weir/sp/r").st_mode), os.stat("/weir/sp/r").st_size)
try_("mkfifo over a file", lambda: os.mkfifo("/weir/sp/r"))
try_("mknod reg again", lambda: os.mknod("/weir/sp/r"))
os.chdir("/weir/sp")
try_("mkfifo relative", lambda: os.mkfifo("rel"))
try_("mkfifo in a file", lambda: os.mkfifo("r/x"))
print(sorted(os.listdir(".")))
os.mkfifo("`+k+`/kf")
print(stat.S_ISFIFO(os.stat("`+k+`/kf").st_mode))
`)
	want := `mkfifo EPERM
mknod fifo EPERM
mknod sock EPERM
mknod chr EPERM
mknod dir EPERM
mknod bad type EINVAL
mkfifo no parent ENOENT
mknod reg ok
0o100644 0
mkfifo over a file EEXIST
mknod reg again EEXIST
mkfifo relative EPERM
mkfifo in a file ENOTDIR
['r']
True
`
	if got != want {
		t.Fatalf("special files on weir:\n%s\nwant:\n%s", got, want)
	}
}

// copiesScript exercises copy_file_range, sendfile and splice between
// files of directory D (and pipes, and a socket pair), printing results
// and errnos; TestShimCopies runs it on a kernel directory and on weir.
const copiesScript = `
import os, errno, socket, threading, shutil
os.chdir(os.environ["D"])
data = bytes((i * 7 + i // 4096) % 251 for i in range(700000))
open("src", "wb").write(data)
def e(f):
    try: return f()
    except OSError as x: return errno.errorcode[x.errno]
a = os.open("src", os.O_RDONLY)
b = os.open("dst", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
print("cfr", e(lambda: os.copy_file_range(a, b, 1000000)), os.lseek(a, 0, 1), os.lseek(b, 0, 1))
os.close(b)
print("cfr same", open("dst", "rb").read() == data)
b = os.open("dst", os.O_RDWR)
print("cfr offsets", e(lambda: os.copy_file_range(a, b, 10, 100, 200)), os.lseek(a, 0, 1), os.lseek(b, 0, 1))
print("cfr past the end", e(lambda: os.copy_file_range(a, b, 10)))
print("cfr overlap", e(lambda: os.copy_file_range(b, b, 100, 0, 50)))
print("cfr overlap past the end", e(lambda: os.copy_file_range(b, b, 100, 699990, 699995)))
print("cfr append", e(lambda: os.copy_file_range(a, os.open("dst", os.O_WRONLY | os.O_APPEND), 10)))
print("cfr read-only out", e(lambda: os.copy_file_range(a, a, 10)))
print("cfr directory", e(lambda: os.copy_file_range(os.open(".", os.O_RDONLY), b, 10)))
os.lseek(a, 0, 0)
c = os.open("dst2", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
print("sendfile", e(lambda: os.sendfile(c, a, None, 300000)), os.lseek(a, 0, 1))
print("sendfile at", e(lambda: os.sendfile(c, a, 300000, 500000)), os.lseek(a, 0, 1))
os.close(c)
print("sendfile same", open("dst2", "rb").read() == data)
print("sendfile append", e(lambda: os.sendfile(os.open("dst2", os.O_WRONLY | os.O_APPEND), a, 0, 10)))
r, w = os.pipe()
print("splice into a pipe", e(lambda: os.splice(a, w, 1000000, offset_src=5)), os.lseek(a, 0, 1))
got = os.read(r, 1000000)
print("from the pipe", len(got), got == data[5:5 + len(got)])
os.write(w, b"hello pipe")
c = os.open("dst3", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
print("splice from a pipe", e(lambda: os.splice(r, c, 1000)), open("dst3", "rb").read())
print("splice file to file", e(lambda: os.splice(a, c, 10)))
print("splice offset of a pipe", e(lambda: os.splice(r, c, 10, offset_src=0)))
print("splice from an empty pipe, nonblocking", e(lambda: os.splice(r, c, 10, flags=os.SPLICE_F_NONBLOCK)))
print("splice with an unknown flag", e(lambda: os.splice(r, c, 10, flags=0x100)))
os.write(w, b"x" * 60000)
print("splice from a pipe, what it holds", e(lambda: os.splice(r, c, 100000)), os.lseek(c, 0, 1))
shutil.copyfile("src", "sh")
print("shutil.copyfile", open("sh", "rb").read() == data)
s1, s2 = socket.socketpair()
buf = bytearray()
def rd():
    while True:
        x = s2.recv(65536)
        if not x: break
        buf.extend(x)
t = threading.Thread(target=rd); t.start()
with open("src", "rb") as f:
    n = s1.sendfile(f)
s1.close(); t.join()
print("socket.sendfile", n, bytes(buf) == data)
`

// TestShimCopies: copy_file_range, sendfile and splice with weir
// descriptors copy the bytes and fail as Linux's do (the kernel's calls on
// weir's placeholder descriptors said EBADF): the same script on a kernel
// directory and on weir prints the same; copy_file_range between weir and
// the kernel is EXDEV (two file systems), sendfile between them copies.
func TestShimCopies(t *testing.T) {
	need(t, "python3", "python3")
	s := newShimmed(t)
	k := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc := exec.CommandContext(ctx, "python3", "-c", copiesScript)
	kc.Env = append(os.Environ(), "D="+k)
	want, err := kc.CombinedOutput()
	if err != nil {
		t.Fatalf("on the kernel: %v\n%s", err, want)
	}
	s.sh("sh", "mkdir /weir/copies")
	wc := s.cmd(ctx, "python3", "-c", copiesScript)
	wc.Env = append(wc.Env, "D=/weir/copies")
	got, err := wc.CombinedOutput()
	if err != nil || string(got) != string(want) {
		t.Fatalf("on weir (%v):\n%s\non the kernel:\n%s", err, got, want)
	}
	mixed := s.sh("python3", `
import os, errno
w = os.open("/weir/copies/src", os.O_RDONLY)
k = os.open("`+k+`/mixed", os.O_RDWR | os.O_CREAT, 0o644)
try:
    os.copy_file_range(w, k, 10)
except OSError as x:
    print(errno.errorcode[x.errno])
print(os.sendfile(k, w, 0, 1000000))
os.lseek(k, 0, 0)
o = os.open("/weir/copies/back", os.O_WRONLY | os.O_CREAT, 0o644)
print(os.sendfile(o, k, None, 1000000))
os.close(o)
print(open("/weir/copies/back", "rb").read() == open("/weir/copies/src", "rb").read())
`)
	if mixed != "EXDEV\n700000\n700000\nTrue\n" {
		t.Fatalf("between weir and the kernel: %q", mixed)
	}
}

// TestShimSyncfs: syncfs(2) of a weir descriptor (sync -f) and sync(2)
// (sync) reach io's whole-store sync (OpSyncFS; what it makes durable is
// TestPowerCut's, package stack); a kernel descriptor's syncfs is the
// kernel's.
func TestShimSyncfs(t *testing.T) {
	need(t, "sync", "coreutils")
	s := newShimmed(t)
	k := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(k, []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := s.st.IO.Stats.SyncFSs.Load()
	got := s.sh("sh", "echo x > /weir/sf; sync -f /weir/sf; echo rc $?; sync -f "+k+"; echo rc $?; sync; echo rc $?")
	if want := "rc 0\nrc 0\nrc 0\n"; got != want {
		t.Fatalf("sync -f of a weir file and a kernel one, then sync: %q, want %q", got, want)
	}
	if n := s.st.IO.Stats.SyncFSs.Load() - before; n != 2 {
		t.Fatalf("io served %d syncfs requests, want 2 (sync -f of the weir file, sync)", n)
	}
}

// TestShimSyscalls: renameat2, statx, copy_file_range and getdents64
// made through syscall(3), as gnulib's renameat2 makes its call, reach
// the shim's entry points on weir paths (before, the kernel said ENOENT).
func TestShimSyscalls(t *testing.T) {
	need(t, "python3", "python3")
	if runtime.GOARCH != "amd64" {
		t.Skipf("the test names x86_64 system call numbers; this is %s", runtime.GOARCH)
	}
	s := newShimmed(t)
	got := s.sh("python3", `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
os.mkdir("/weir/sc"); open("/weir/sc/a", "w").write("hello")
AT_FDCWD = -100
r = libc.syscall(316, AT_FDCWD, b"/weir/sc/a", AT_FDCWD, b"/weir/sc/b", 0)  # renameat2
print("renameat2", r, ctypes.get_errno() if r else 0, sorted(os.listdir("/weir/sc")))
buf = ctypes.create_string_buffer(256)
r = libc.syscall(332, AT_FDCWD, b"/weir/sc/b", 0, 0x7ff, buf)  # statx
print("statx", r, int.from_bytes(buf.raw[40:48], "little"))  # stx_size
fi = os.open("/weir/sc/b", os.O_RDONLY); fo = os.open("/weir/sc/c", os.O_WRONLY | os.O_CREAT, 0o644)
r = libc.syscall(326, fi, None, fo, None, ctypes.c_size_t(100), 0)  # copy_file_range
os.close(fo); print("copy_file_range", r, open("/weir/sc/c").read())
d = os.open("/weir/sc", os.O_RDONLY | os.O_DIRECTORY)
r = libc.syscall(217, d, buf, ctypes.c_size_t(256))  # getdents64
print("getdents64", r > 0)
`)
	want := "renameat2 0 0 ['b']\nstatx 0 5\ncopy_file_range 5 hello\ngetdents64 True\n"
	if got != want {
		t.Fatalf("system calls through syscall(3) on weir paths:\n%s\nwant:\n%s", got, want)
	}
}

// TestShimRecordsCuts: with io.staging_size = 0 the shim's ftruncate and
// truncate record a smaller size at metadata before io cuts the blob
// (proto.FeatureRecordCuts; stack.TestTruncateSurvivesMetadataKill is
// the crash), and a larger one needs no record.
func TestShimRecordsCuts(t *testing.T) {
	need(t, "python3", "python3")
	need(t, "truncate", "coreutils")
	st := startStackWith(t, func(c *config.Config) { c.IO.StagingSize = 0 })
	s := &shimmed{t: t, st: st, so: buildShim(t)}
	out := s.sh("sh", `printf 0123456789 > /weir/f && truncate -s 4 /weir/f && truncate -s 6 /weir/f && `+
		`python3 -c "import os; fd=os.open('/weir/f',os.O_RDWR); os.ftruncate(fd,2); os.ftruncate(fd,3); os.close(fd)" && wc -c < /weir/f`)
	if strings.TrimSpace(out) != "3" {
		t.Fatalf("the file after its truncates: %q bytes, want 3", out)
	}
	if n := st.Metadata.Stats.CutsRecorded.Load(); n != 2 {
		t.Errorf("%d cuts recorded before io made them, want 2 (to 4 and to 2 bytes; the growths need none)", n)
	}
}
