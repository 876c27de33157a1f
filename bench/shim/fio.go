package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// FioRow is one workload on one target: the median of its runs by IOPS.
type FioRow struct {
	Workload string  `json:"workload"`
	Direct   bool    `json:"direct"`
	Target   string  `json:"target"` // "kernel" or "weir"
	IOPS     float64 `json:"iops"`
	MiBps    float64 `json:"mib_per_s"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	UsrPct   float64 `json:"fio_usr_pct"`
	SysPct   float64 `json:"fio_sys_pct"`
	// ServiceCPUusPerOp: weir's services' CPU per operation (the
	// kernel's file system work runs in fio's sys time instead).
	ServiceCPUusPerOp float64   `json:"service_cpu_us_per_op,omitempty"`
	Runs              []float64 `json:"runs_iops"`
}

type workload struct {
	name, rw, bs string
}

var workloads = []workload{
	{"4 KiB random read", "randread", "4k"},
	{"4 KiB random write", "randwrite", "4k"},
	{"128 KiB sequential read", "read", "128k"},
	{"128 KiB sequential write", "write", "128k"},
}

// fioJSON is the part of fio's JSON output read here.
type fioJSON struct {
	Jobs []struct {
		Error int     `json:"error"`
		Usr   float64 `json:"usr_cpu"`
		Sys   float64 `json:"sys_cpu"`
		Read  fioDir  `json:"read"`
		Write fioDir  `json:"write"`
	} `json:"jobs"`
}

type fioDir struct {
	IOPS  float64 `json:"iops"`
	BW    float64 `json:"bw"` // KiB/s
	Total int64   `json:"total_ios"`
	Clat  struct {
		Pct map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

// fioOnce runs one fio job on file (through the shim when env is set).
func fioOnce(env []string, file string, wl workload, direct bool) (FioRow, int64, error) {
	d := "0"
	if direct {
		d = "1"
	}
	args := []string{"--name=bench", "--filename=" + file, fmt.Sprintf("--size=%dm", *sizeMiB), "--rw=" + wl.rw,
		"--bs=" + wl.bs, "--ioengine=psync", "--iodepth=1", "--direct=" + d, "--time_based",
		fmt.Sprintf("--runtime=%d", *runtimeS), "--ramp_time=1", "--output-format=json", "--randrepeat=0",
		// Buffered runs start with the file cached, on both sides (fio
		// would otherwise drop the kernel's page cache of it first): the
		// page cache is the competitor.
		"--invalidate=0"}
	cmd := exec.Command("fio", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return FioRow{}, 0, fmt.Errorf("fio %v: %v\n%s", args, err, out)
	}
	var j fioJSON
	if err := json.Unmarshal(out, &j); err != nil || len(j.Jobs) != 1 {
		return FioRow{}, 0, fmt.Errorf("fio's output: %v\n%s", err, out)
	}
	job := j.Jobs[0]
	if job.Error != 0 {
		return FioRow{}, 0, fmt.Errorf("fio %v: error %d", args, job.Error)
	}
	dir := job.Read
	if wl.rw == "randwrite" || wl.rw == "write" {
		dir = job.Write
	}
	return FioRow{Workload: wl.name, Direct: direct, IOPS: dir.IOPS, MiBps: dir.BW / 1024,
		P50us: dir.Clat.Pct["50.000000"] / 1e3, P99us: dir.Clat.Pct["99.000000"] / 1e3,
		UsrPct: job.Usr, SysPct: job.Sys}, dir.Total, nil
}

// runFio runs every workload, buffered and direct, on both targets,
// alternating them run by run.
func runFio(w *weirStack, env []string, kdir string) ([]FioRow, error) {
	var rows []FioRow
	kfile, wfile := filepath.Join(kdir, "fio.dat"), "/weir/fio.dat"
	for _, direct := range []bool{false, true} {
		for _, wl := range workloads {
			runs := map[string][]FioRow{}
			for r := 0; r < *repeat; r++ {
				order := []string{"kernel", "weir"}
				if r%2 == 1 {
					order = []string{"weir", "kernel"}
				}
				for _, target := range order {
					var row FioRow
					var ops int64
					var err error
					if target == "kernel" {
						row, ops, err = fioOnce(nil, kfile, wl, direct)
					} else {
						c0 := w.cpu()
						row, ops, err = fioOnce(env, wfile, wl, direct)
						if ops > 0 {
							// (the services' CPU over the whole run, layout and ramp included: an upper bound)
							row.ServiceCPUusPerOp = float64(w.cpu()-c0) / 1e3 / float64(ops)
						}
					}
					if err != nil {
						return nil, err
					}
					row.Target = target
					runs[target] = append(runs[target], row)
					fmt.Fprintf(os.Stderr, "fio %s direct=%v %s: %.0f IOPS p50 %.1f µs\n", wl.name, direct, target, row.IOPS, row.P50us)
				}
			}
			for _, target := range []string{"kernel", "weir"} {
				m := median(runs[target], func(r FioRow) float64 { return r.IOPS })
				for _, r := range runs[target] {
					m.Runs = append(m.Runs, r.IOPS)
				}
				rows = append(rows, m)
			}
		}
	}
	return rows, nil
}

// CallRow is one call's cost: without the shim, and with it.
type CallRow struct {
	Call     string  `json:"call"`
	BareNs   float64 `json:"bare_ns,omitempty"` // no shim loaded (kernel rows)
	ShimNs   float64 `json:"shim_ns"`
	Overhead float64 `json:"overhead_ns,omitempty"`
}

// runCalls times the probe without and with the shim.
func runCalls(probe string, env []string, kdir string) ([]CallRow, error) {
	kfile := filepath.Join(kdir, "calls.dat")
	if err := os.WriteFile(kfile, make([]byte, 1<<20), 0o644); err != nil {
		return nil, err
	}
	mk := exec.Command("dd", "if=/dev/zero", "of=/weir/calls.dat", "bs=1M", "count=1", "status=none")
	mk.Env = append(os.Environ(), env...)
	if out, err := mk.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dd onto weir: %v %s", err, out)
	}
	parse := func(out []byte) map[string]float64 {
		m := map[string]float64{}
		for _, line := range splitLines(string(out)) {
			i := lastSpace(line)
			if i > 0 {
				v, _ := strconv.ParseFloat(line[i+1:], 64)
				m[line[:i]] = v
			}
		}
		return m
	}
	var order []string
	bare, shim := map[string]float64{}, map[string]float64{}
	for r := 0; r < 3; r++ {
		for _, withShim := range []bool{false, true} {
			cmd := exec.Command(probe)
			cmd.Env = append(os.Environ(), "KERNEL_FILE="+kfile)
			if withShim {
				cmd.Env = append(cmd.Env, env...)
				cmd.Env = append(cmd.Env, "WEIR_FILE=/weir/calls.dat")
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("%s: %v\n%s", probe, err, out)
			}
			m := parse(out)
			if withShim && len(order) == 0 {
				for _, line := range splitLines(string(out)) {
					if i := lastSpace(line); i > 0 {
						order = append(order, line[:i])
					}
				}
			}
			dst := bare
			if withShim {
				dst = shim
			}
			for k, v := range m {
				if dst[k] == 0 || v < dst[k] {
					dst[k] = v // the best of three: the machine's noise only adds
				}
			}
		}
	}
	var rows []CallRow
	for _, k := range order {
		row := CallRow{Call: k, ShimNs: shim[k], BareNs: bare[k]}
		if bare[k] > 0 {
			row.Overhead = shim[k] - bare[k]
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		if i > 0 {
			out = append(out, s[:i])
		}
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return out
}

func lastSpace(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ' ' {
			return i
		}
	}
	return -1
}
