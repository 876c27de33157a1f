package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
	iosvc "github.com/weir-storage/weir/services/io"
)

// Targets of the tree rows.
const (
	targetWeir   = "weir"
	targetKernel = "kernel"
	targetExt4   = "ext4"
)

// TargetInfo says where a target's trees are.
type TargetInfo struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
	FS   string `json:"fs"`
}

// target is one side of the tree rows: its trees go in root, one
// directory per repetition; weir's programs run through the shim.
type target struct {
	info TargetInfo
	root string
	shim bool
}

// setUpTargets makes the targets names asks for, in that order: the
// kernel's directory in dir (the file system of weir's data), weir's
// directory under /weir, and an ext4 on a loop device when root with
// e2fsprogs (else a note says what is missing and the run goes on).
func setUpTargets(dir string, w *weirStack, names []string) ([]*target, func(), []string, error) {
	var ts []*target
	var notes []string
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	desc := func(d string) string {
		if f, err := benchutil.DescribeFS(d); err == nil {
			return f.String()
		}
		return "?"
	}
	for _, n := range names {
		switch n {
		case targetWeir:
			ts = append(ts, &target{shim: true, root: "/weir/trees", info: TargetInfo{Name: n, Dir: "/weir/trees",
				FS: "weir through the shim (" + w.so + "); the services on the file backend, their data in " + w.dataDir() + ": " + desc(dir)}})
		case targetKernel:
			d := filepath.Join(dir, "kernel")
			if err := os.Mkdir(d, 0o755); err != nil {
				return nil, cleanup, nil, err
			}
			ts = append(ts, &target{root: d, info: TargetInfo{Name: n, Dir: d, FS: desc(d) + " (weir's data directory's)"}})
		case targetExt4:
			mnt, about, undoMount, err := mountExt4(dir)
			if err != nil {
				notes = append(notes, "ext4 target skipped: "+err.Error())
				fmt.Fprintln(os.Stderr, "trees: ext4 target skipped:", err)
				continue
			}
			undo = append(undo, undoMount)
			ts = append(ts, &target{root: mnt, info: TargetInfo{Name: n, Dir: mnt, FS: about}})
		default:
			return nil, cleanup, nil, fmt.Errorf("-targets: unknown target %q (weir, kernel, ext4)", n)
		}
	}
	if len(ts) == 0 {
		return nil, cleanup, notes, errors.New("no target to run on")
	}
	return ts, cleanup, notes, nil
}

// mountExt4 makes a journaled ext4 (data=ordered, the default) on a loop
// device over a 4 GiB sparse image in parent, and mounts it; it needs
// root, mkfs.ext4 (e2fsprogs), losetup and mount. The loop device does
// direct I/O on the image, so the ext4's pages are cached once.
func mountExt4(parent string) (string, string, func(), error) {
	nothing := func() {}
	if os.Geteuid() != 0 {
		return "", "", nothing, fmt.Errorf("not root (uid %d): making and mounting an ext4 on a loop device needs root", os.Geteuid())
	}
	for _, tool := range []string{"mkfs.ext4", "losetup", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", "", nothing, fmt.Errorf("%s not found (Debian package %s)", tool, map[string]string{"mkfs.ext4": "e2fsprogs", "losetup": "mount", "mount": "mount", "umount": "mount"}[tool])
		}
	}
	img, mnt := filepath.Join(parent, "ext4.img"), filepath.Join(parent, "ext4.mnt")
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	fail := func(err error) (string, string, func(), error) {
		cleanup()
		return "", "", nothing, err
	}
	f, err := os.Create(img)
	if err != nil {
		return fail(err)
	}
	err = f.Truncate(4 << 30)
	f.Close()
	undo = append(undo, func() { os.Remove(img) })
	if err != nil {
		return fail(err)
	}
	mkfs := []string{"mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", img}
	if out, err := exec.Command(mkfs[0], mkfs[1:]...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("%s: %v: %s", strings.Join(mkfs, " "), err, out))
	}
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).Output()
	if err != nil {
		return fail(fmt.Errorf("losetup --find --show --direct-io=on %s: %w", img, err))
	}
	loop := strings.TrimSpace(string(out))
	undo = append(undo, func() { _ = exec.Command("losetup", "-d", loop).Run() })
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return fail(err)
	}
	undo = append(undo, func() { os.Remove(mnt) })
	if out, err := exec.Command("mount", loop, mnt).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mount %s %s: %v: %s", loop, mnt, err, out))
	}
	undo = append(undo, func() { _ = exec.Command("umount", mnt).Run() })
	d, err := benchutil.DescribeFS(mnt)
	if err != nil {
		return fail(err)
	}
	return mnt, fmt.Sprintf("%s, made by `mkfs.ext4 -E lazy_itable_init=0,lazy_journal_init=0` on %s (direct I/O) over a 4 GiB image in the run's directory", d, loop), cleanup, nil
}

// weirStack is the services, as `weir up` runs them, with their data in
// the run's directory; a service that dies is reported and the stack
// started again on the same data.
type weirStack struct {
	exe, dir, so string
	*benchutil.WeirStack
	restarts []string // what died, and when
}

func startWeir(exe, dir, so string) (*weirStack, error) {
	w := &weirStack{exe: exe, dir: dir, so: so}
	return w, w.start()
}

func (w *weirStack) dataDir() string { return filepath.Join(w.dir, "weir-data") }

func (w *weirStack) start() error {
	s, err := benchutil.StartWeir(w.exe, w.dir, w.dataDir(), "bench/trees", "", "")
	if err != nil {
		return err
	}
	w.WeirStack = s
	return nil
}

func (w *weirStack) stop() {
	if w.WeirStack != nil {
		w.Stop()
	}
}

// env is what a program needs to reach weir at /weir through the shim.
func (w *weirStack) env() []string {
	return []string{"LD_PRELOAD=" + w.so, "WEIR_MOUNT=/weir",
		"WEIR_META_SOCK=" + w.Cfg.Metadata.Socket, "WEIR_IO_SOCK=" + w.Cfg.IO.Socket}
}

// ensure starts the stack again when a service has died (after says
// what ran last) and reports whether it had to.
func (w *weirStack) ensure(after string) bool {
	var dead []string
	for name, pid := range w.Sup.PIDs() {
		if syscall.Kill(pid, 0) != nil {
			dead = append(dead, fmt.Sprintf("%s (pid %d)", name, pid))
		}
	}
	if len(dead) == 0 {
		return false
	}
	note := fmt.Sprintf("weir: %s gone after %s; the stack was started again on the same data", strings.Join(dead, ", "), after)
	fmt.Fprintln(os.Stderr, "trees:", note)
	w.Stop()
	if err := w.start(); err != nil {
		note += ", and did not start: " + err.Error()
	}
	w.restarts = append(w.restarts, note)
	return true
}

// cpu is the CPU time the service processes have used.
func (w *weirStack) cpu() time.Duration {
	var sum time.Duration
	for _, pid := range w.Sup.PIDs() {
		if c, err := benchutil.ProcCPU(pid); err == nil {
			sum += c
		}
	}
	return sum
}

// dropCaches has io evict its clean pages (weir drop-caches).
func (w *weirStack) dropCaches() error {
	out, err := exec.Command(w.exe, "drop-caches", "--config", w.Sup.ConfigPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("weir drop-caches: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// ioStats is the IO service's counters, as weir status --json prints
// them (it exits 1 when a service is unhealthy, and still prints them).
func (w *weirStack) ioStats() (map[string]any, error) {
	out, err := exec.Command(w.exe, "status", "--json", "--config", w.Sup.ConfigPath).Output()
	var st []struct {
		Name  string         `json:"name"`
		Stats map[string]any `json:"stats"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if jerr := dec.Decode(&st); jerr != nil {
		return nil, fmt.Errorf("weir status --json: %v %v", err, jerr)
	}
	for _, s := range st {
		if s.Name == iosvc.ServiceName {
			return s.Stats, nil
		}
	}
	return nil, fmt.Errorf("weir status --json: no %s service answered (%v)", iosvc.ServiceName, err)
}

// ServiceSample is the services' descriptors and memory at one moment.
type ServiceSample struct {
	When       string `json:"when"`
	IOFDs      int    `json:"io_fds"`
	IORSSKiB   int64  `json:"io_rss_kib"`
	IOShmemKiB int64  `json:"io_rss_shmem_kib"`
	// CacheMemoryBytes is what io's cache memfds hold (weir status's
	// cache_memory_bytes).
	CacheMemoryBytes int64  `json:"cache_memory_bytes"`
	MetaFDs          int    `json:"metadata_fds"`
	MetaRSSKiB       int64  `json:"metadata_rss_kib"`
	Err              string `json:"error,omitempty"`
}

func (w *weirStack) sample(when string) ServiceSample {
	s := ServiceSample{When: when}
	pids := w.Sup.PIDs()
	var errs []string
	note := func(err error) {
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	var err error
	s.IOFDs, err = countFDs(pids["io"])
	note(err)
	s.IORSSKiB, s.IOShmemKiB, err = benchutil.ProcMem(pids["io"])
	note(err)
	s.MetaFDs, err = countFDs(pids["metadata"])
	note(err)
	s.MetaRSSKiB, _, err = benchutil.ProcMem(pids["metadata"])
	note(err)
	st, err := w.ioStats()
	note(err)
	if v, ok := st["cache_memory_bytes"]; ok {
		s.CacheMemoryBytes, _ = strconv.ParseInt(fmt.Sprint(v), 10, 64)
	}
	s.Err = strings.Join(errs, "; ")
	return s
}

// countFDs is the number of descriptors process pid has open.
func countFDs(pid int) (int, error) {
	if pid == 0 {
		return 0, errors.New("no such service")
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

// dropKernelCaches writes back and drops the kernel's clean page cache,
// dentries and inodes (root only).
func dropKernelCaches() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}
