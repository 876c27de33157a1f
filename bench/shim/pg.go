package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
)

// PGRow is pgbench on one target: the median run by TPS.
type PGRow struct {
	Target string    `json:"target"`
	TPS    float64   `json:"tps"`
	LatMs  float64   `json:"latency_avg_ms"`
	Runs   []float64 `json:"runs_tps"`
}

var (
	tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	latRe = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
)

// runPG runs pgbench against a server on a kernel directory and one on
// weir, alternately; without PostgreSQL it says why in the note.
func runPG(w *weirStack, env []string, dir, so string) ([]PGRow, string, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, "not run: PostgreSQL is not installed (Debian package postgresql)", nil
	}
	bin := filepath.Dir(bins[len(bins)-1])
	cred := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, "not run: as root, with no postgres user to run the server as", nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	pub := filepath.Join(dir, "pg")
	if err := os.Mkdir(pub, 0o755); err != nil {
		return nil, "", err
	}
	if err := os.Chown(pub, int(cred.Uid), int(cred.Gid)); err != nil {
		return nil, "", err
	}
	if err := os.Chmod(so, 0o755); err != nil {
		return nil, "", err
	}
	run := func(shim bool, port int, name string, args ...string) (string, error) {
		c := exec.Command(filepath.Join(bin, name), args...)
		c.Env = append(os.Environ(), "LC_ALL=C", "PGHOST="+pub, fmt.Sprintf("PGPORT=%d", port), "PGDATABASE=postgres")
		if shim {
			c.Env = append(c.Env, env...)
		}
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		c.Dir = pub
		out, err := c.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out), nil
	}
	mkweir := exec.Command("sh", "-c", fmt.Sprintf("mkdir -p /weir/pg && chown %d:%d /weir/pg && chmod 700 /weir/pg", cred.Uid, cred.Gid))
	mkweir.Env = append(os.Environ(), env...)
	if out, err := mkweir.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("making /weir/pg: %v %s", err, out)
	}
	targets := []struct {
		name string
		shim bool
		data string
		port int
	}{{"kernel", false, filepath.Join(pub, "data"), 5491}, {"weir", true, "/weir/pg/data", 5492}}
	for _, tg := range targets {
		if _, err := run(tg.shim, tg.port, "initdb", "-D", tg.data, "-A", "trust", "--no-instructions"); err != nil {
			return nil, "", err
		}
		logf := filepath.Join(pub, tg.name+".log")
		if _, err := run(tg.shim, tg.port, "pg_ctl", "-D", tg.data, "-l", logf, "-w", "-t", "120", "-o",
			fmt.Sprintf("-k %s -p %d -c listen_addresses=''", pub, tg.port), "start"); err != nil {
			return nil, "", err
		}
		defer run(tg.shim, tg.port, "pg_ctl", "-D", tg.data, "-w", "stop")
		if _, err := run(false, tg.port, "pgbench", "-i", "-q", "-s", strconv.Itoa(*pgScale)); err != nil {
			return nil, "", err
		}
	}
	runs := map[string][]PGRow{}
	for r := 0; r < *repeat; r++ {
		for i := range targets {
			tg := targets[(i+r)%2]
			out, err := run(false, tg.port, "pgbench", "-n", "-T", strconv.Itoa(*pgSeconds), "-c", strconv.Itoa(*pgClients))
			if err != nil {
				return nil, "", err
			}
			m, l := tpsRe.FindStringSubmatch(out), latRe.FindStringSubmatch(out)
			if m == nil || l == nil {
				return nil, "", fmt.Errorf("pgbench's output: %s", out)
			}
			tps, _ := strconv.ParseFloat(m[1], 64)
			lat, _ := strconv.ParseFloat(l[1], 64)
			runs[tg.name] = append(runs[tg.name], PGRow{Target: tg.name, TPS: tps, LatMs: lat})
			fmt.Fprintf(os.Stderr, "pgbench %s: %.1f TPS\n", tg.name, tps)
		}
	}
	var rows []PGRow
	for _, tg := range targets {
		m := median(runs[tg.name], func(r PGRow) float64 { return r.TPS })
		for _, r := range runs[tg.name] {
			m.Runs = append(m.Runs, r.TPS)
		}
		rows = append(rows, m)
	}
	note := fmt.Sprintf("pgbench -n -T %d -c %d, scale %d, synchronous_commit on (the default): every commit waits for its WAL fsync",
		*pgSeconds, *pgClients, *pgScale)
	return rows, note, nil
}
