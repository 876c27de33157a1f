package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// PGRow is pgbench on one target: the median run by TPS.
type PGRow struct {
	Target string    `json:"target"`
	TPS    float64   `json:"tps"`
	LatMs  float64   `json:"latency_avg_ms"`
	Runs   []float64 `json:"runs_tps"`
	// WAL syncs as the server counts them (pg_stat_wal with
	// track_wal_io_timing on): per transaction, and the mean time of one
	// (the fdatasync of a WAL segment, through the shim on weir), in the
	// median run.
	SyncsPerTxn float64 `json:"wal_syncs_per_txn"`
	SyncUs      float64 `json:"wal_sync_avg_us"`
	WriteUs     float64 `json:"wal_write_avg_us"`
}

var (
	tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	latRe = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
	txnRe = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)
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
			fmt.Sprintf("-k %s -p %d -c listen_addresses='' -c track_wal_io_timing=on", pub, tg.port), "start"); err != nil {
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
			if _, err := run(false, tg.port, "psql", "-Atqc", "SELECT pg_stat_reset_shared('wal')"); err != nil {
				return nil, "", err
			}
			out, err := run(false, tg.port, "pgbench", "-n", "-T", strconv.Itoa(*pgSeconds), "-c", strconv.Itoa(*pgClients))
			if err != nil {
				return nil, "", err
			}
			m, l, n := tpsRe.FindStringSubmatch(out), latRe.FindStringSubmatch(out), txnRe.FindStringSubmatch(out)
			if m == nil || l == nil || n == nil {
				return nil, "", fmt.Errorf("pgbench's output: %s", out)
			}
			tps, _ := strconv.ParseFloat(m[1], 64)
			lat, _ := strconv.ParseFloat(l[1], 64)
			txns, _ := strconv.ParseFloat(n[1], 64)
			row := PGRow{Target: tg.name, TPS: tps, LatMs: lat}
			wal, err := run(false, tg.port, "psql", "-Atqc", "SELECT wal_sync, wal_sync_time, wal_write, wal_write_time FROM pg_stat_wal")
			if err != nil {
				return nil, "", err
			}
			var syncs, syncMs, writes, writeMs float64
			if _, err := fmt.Sscanf(strings.TrimSpace(wal), "%g|%g|%g|%g", &syncs, &syncMs, &writes, &writeMs); err != nil {
				return nil, "", fmt.Errorf("pg_stat_wal: %q: %w", wal, err)
			}
			if syncs > 0 && txns > 0 {
				row.SyncsPerTxn, row.SyncUs = syncs/txns, syncMs*1000/syncs
			}
			if writes > 0 {
				row.WriteUs = writeMs * 1000 / writes
			}
			runs[tg.name] = append(runs[tg.name], row)
			fmt.Fprintf(os.Stderr, "pgbench %s: %.1f TPS, %.2f WAL syncs per transaction, %.0f µs per sync, %.1f µs per WAL write\n",
				tg.name, tps, row.SyncsPerTxn, row.SyncUs, row.WriteUs)
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
