package ns

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/vfs"
)

const killChildEnv = "WEIR_NS_KILL_CHILD" // "dir:seed"

// killOpts are the options both the killed child and the model use; the
// fake clock and inline checkpoints make the two runs identical.
func killOpts(dir string) (Options, config, *fakeClock) {
	clk := newClock()
	return Options{Dir: dir, Now: clk.Now, SyncEveryOp: true, CheckpointEvery: 17, SyncInterval: time.Hour},
		config{inlineCheckpoint: true, segmentSize: 3000}, clk
}

// killChild runs random operations forever, printing the number of
// operations completed after each one.
func killChild(arg string) int {
	dir, s, _ := strings.Cut(arg, ":")
	seed, _ := strconv.ParseUint(s, 10, 64)
	o, cfg, _ := killOpts(dir)
	cfg.fs = vfs.OS{}
	n, err := open(o, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g := newGen(seed, "")
	for i := 1; i < 1_000_000; i++ {
		g.step(n)
		fmt.Println(i)
	}
	return 0
}

// TestSIGKILL kills a process that is writing (SyncEveryOp) with SIGKILL
// at a random moment and checks that recovery yields the state after the
// last operation it acknowledged, or after the one in flight.
func TestSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 4))
	for round := 0; round < 3; round++ {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", killChildEnv, dir, seed+uint64(round)))
		out, err := cmd.StdoutPipe()
		must(t, err)
		cmd.Stderr = os.Stderr
		must(t, cmd.Start())
		sc := bufio.NewScanner(out)
		killAt := 50 + rng.IntN(400)
		acked := 0
		for sc.Scan() {
			acked, _ = strconv.Atoi(sc.Text())
			if acked == killAt {
				must(t, cmd.Process.Signal(syscall.SIGKILL))
			}
		}
		cmd.Wait()
		if acked < killAt {
			t.Fatalf("child stopped after %d operations", acked)
		}
		// The model: the same operations in memory.
		o, cfg, _ := killOpts("/model")
		cfg.fs = vfs.NewMem()
		m, err := open(o, cfg)
		must(t, err)
		g := newGen(seed+uint64(round), "")
		var dumps []string
		var orphans [][]uint64
		for i := 1; i <= acked+1; i++ {
			g.step(m)
			if i >= acked {
				dumps = append(dumps, dump(m))
				orphans = append(orphans, unnamedBlobs(m))
			}
		}
		must(t, m.Close())
		r, err := openDir(t, dir)
		if err != nil {
			t.Fatalf("round %d (seed %d): recovery after SIGKILL at %d: %v", round, seed, acked, err)
		}
		got := dump(r)
		i := slices.IndexFunc(dumps, func(d string) bool { return d == got })
		if i == 0 && !slices.Equal(r.Orphans(), orphans[0]) && dumps[1] == got {
			i = 1 // same tree; the next operation only freed an orphan
		}
		if i < 0 {
			t.Fatalf("round %d (seed %d): killed after %d acknowledged operations; recovered state is neither that nor the next:\n%s", round, seed, acked, diff(dumps[0], got))
		}
		if !slices.Equal(r.Orphans(), orphans[i]) {
			t.Fatalf("round %d (seed %d): orphans %v, want %v", round, seed, r.Orphans(), orphans[i])
		}
		must(t, r.Check())
		must(t, r.Close())
		t.Logf("round %d: killed after %d acknowledged operations, recovered %d", round, acked, acked+i)
	}
}
