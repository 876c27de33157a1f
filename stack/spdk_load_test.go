//go:build spdk

package stack_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

var (
	spdkExeOnce sync.Once
	spdkExe     string
	spdkExeErr  error
)

// spdkWeir builds the weir binary with the spdk tag once per test process:
// each SPDK configuration needs a process of its own.
func spdkWeir(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH: cannot build the weir binary")
	}
	spdkExeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "weir-spdk-exe-")
		if err != nil {
			spdkExeErr = err
			return
		}
		spdkExe = filepath.Join(dir, "weir")
		out, err := exec.Command(gobin, "build", "-tags", "spdk", "-o", spdkExe, "github.com/weir-storage/weir/cmd/weir").CombinedOutput()
		if err != nil {
			spdkExeErr = fmt.Errorf("go build -tags spdk: %v\n%s", err, out)
		}
	})
	if spdkExeErr != nil {
		t.Fatal(spdkExeErr)
	}
	return spdkExe
}

// spdkHost is a sparse file as an aio bdev and weir configurations over
// it: SPDK JSON configs by name and the HCL of data directories.
type spdkHost struct {
	t    *testing.T
	dir  string
	disk string
	exe  string
}

func newSPDKHost(t *testing.T) *spdkHost {
	h := &spdkHost{t: t, dir: t.TempDir(), exe: spdkWeir(t)}
	h.disk = filepath.Join(h.dir, "disk.img")
	if err := os.WriteFile(h.disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(h.disk, 256<<20); err != nil {
		t.Fatal(err)
	}
	return h
}

// errorConfig is the SPDK config of the disk seen through an SPDK error
// bdev (EE_Aio0) that fails the first I/O of ioType ("" for none).
func (h *spdkHost) errorConfig(ioType string) string {
	inject := ""
	if ioType != "" {
		inject = fmt.Sprintf(`,
  {"method": "bdev_error_inject_error", "params": {"name": "EE_Aio0", "io_type": %q, "error_type": "failure", "num": 1}}`, ioType)
	}
	return fmt.Sprintf(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_aio_create", "params": {"name": "Aio0", "filename": %q, "block_size": 4096}},
  {"method": "bdev_error_create", "params": {"base_name": "Aio0"}}%s
]}]}`, h.disk, inject)
}

// config writes a weir configuration of data directory data over SPDK
// config json, bdev EE_Aio0, and returns its path and contents.
func (h *spdkHost) config(name, data, json string) (string, *config.Config) {
	h.t.Helper()
	js := filepath.Join(h.dir, name+".json")
	if err := os.WriteFile(js, []byte(json), 0o644); err != nil {
		h.t.Fatal(err)
	}
	path := filepath.Join(h.dir, name+".hcl")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`data_dir = %q
io {
  backend      = "spdk"
  spdk_config  = %q
  spdk_bdev    = "EE_Aio0"
  spdk_no_huge = true
  spdk_mem_mb  = 1024
}
`, data, js)), 0o644); err != nil {
		h.t.Fatal(err)
	}
	c, err := config.Load(path)
	if err != nil {
		h.t.Fatal(err)
	}
	return path, c
}

// digest is the disk's SHA-256.
func (h *spdkHost) digest() [32]byte {
	h.t.Helper()
	f, err := os.Open(h.disk)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	d := sha256.New()
	if _, err := io.Copy(d, f); err != nil {
		h.t.Fatal(err)
	}
	return [32]byte(d.Sum(nil))
}

// weir runs the weir binary and returns its exit code and output.
func (h *spdkHost) weir(args ...string) (int, string) {
	h.t.Helper()
	cmd := exec.Command(h.exe, args...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	h.t.Fatalf("weir %v: %v", args, err)
	return 0, ""
}

// up starts the services of cfgPath in their own processes.
func (h *spdkHost) up(cfgPath string, c *config.Config) (*stack.Supervisor, error) {
	s := &stack.Supervisor{Config: c, ConfigPath: cfgPath, Exe: h.exe, Log: hclog.NewNullLogger(), Out: testOut{h.t}}
	if err := s.Start(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func dialConfig(t *testing.T, c *config.Config) *client.FS {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: c.Metadata.Socket, IOSocket: c.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

// writeFiles writes and fsyncs files f<from> .. f<from+n-1>.
func writeFiles(t *testing.T, fsys *client.FS, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		f, err := fsys.Create(fmt.Sprintf("f%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(fileData(i)); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func fileData(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("file %d, fsynced. ", i)), 500+i*997)
}

func readFiles(t *testing.T, fsys *client.FS, n int) {
	t.Helper()
	for i := range n {
		b, err := fsys.ReadFile(fmt.Sprintf("f%d", i))
		if err != nil || !bytes.Equal(b, fileData(i)) {
			t.Fatalf("f%d reads back %d bytes, %v", i, len(b), err)
		}
	}
}

// TestSPDKErrorBdevLoadChangesNothing is finding 1 of issue 12 as a user
// meets it: five fsynced files on an aio bdev; weir check and the IO
// service through an SPDK error bdev that fails exactly one read refuse
// with an error naming the I/O error and leave the disk byte for byte as
// it was; so does an IO service whose recovery of a killed blobstore meets
// one failed write. With the error gone every file is there.
func TestSPDKErrorBdevLoadChangesNothing(t *testing.T) {
	h := newSPDKHost(t)
	data := filepath.Join(h.dir, "data")
	okPath, okCfg := h.config("ok", data, h.errorConfig(""))
	readPath, readCfg := h.config("read", data, h.errorConfig("read"))
	writePath, writeCfg := h.config("write", data, h.errorConfig("write"))

	s, err := h.up(okPath, okCfg)
	if err != nil {
		t.Fatal(err)
	}
	fsys := dialConfig(t, okCfg)
	writeFiles(t, fsys, 0, 5)
	fsys.Close()
	s.Stop()
	if code, out := h.weir("check", "--config", okPath); code != 0 || !strings.Contains(out, "5 files in the namespace, 5 blobs in the backend") {
		t.Fatalf("weir check: exit %d\n%s", code, out)
	}

	clean := h.digest()
	code, out := h.weir("check", "--config", readPath)
	if code == 0 || !strings.Contains(out, "input/output error") {
		t.Errorf("weir check with one failed read: exit %d, want a failure naming the I/O error:\n%s", code, out)
	}
	if h.digest() != clean {
		t.Fatal("weir check with one failed read changed the disk")
	}
	if s, err := h.up(readPath, readCfg); err == nil {
		s.Stop()
		t.Error("the services started on a bdev whose first read fails")
	}
	if h.digest() != clean {
		t.Fatal("an IO service whose load met a failed read changed the disk")
	}

	// A killed IO service leaves a blobstore that needs recovery, which
	// writes.
	s, err = h.up(okPath, okCfg)
	if err != nil {
		t.Fatal(err)
	}
	fsys = dialConfig(t, okCfg)
	writeFiles(t, fsys, 5, 1)
	if err := syscall.Kill(s.PIDs()["io"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.Wait()
	fsys.Close()
	s.Stop()
	unclean := h.digest()
	if unclean == clean {
		t.Fatal("the killed IO service left the disk as it was")
	}
	// Read-only, the recovery stays in memory: no write, nothing fails.
	if code, out := h.weir("check", "--config", writePath); code != 0 || !strings.Contains(out, "6 files in the namespace, 6 blobs in the backend") {
		t.Errorf("weir check of the killed blobstore: exit %d\n%s", code, out)
	}
	if h.digest() != unclean {
		t.Fatal("weir check of the killed blobstore changed the disk")
	}
	if s, err := h.up(writePath, writeCfg); err == nil {
		s.Stop()
		t.Error("the services started on a bdev whose first write fails, with a recovery to write")
	}
	if h.digest() != unclean {
		t.Fatal("an IO service whose recovery met a failed write changed the disk")
	}

	s, err = h.up(okPath, okCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	fsys = dialConfig(t, okCfg)
	defer fsys.Close()
	readFiles(t, fsys, 6)
}

// TestSPDKStoreBelongsToOneNamespace is finding 2 of issue 12 on SPDK: a
// new data directory over a bdev that holds another namespace's
// blobstore is refused (the services do not start, weir check says
// wrong-store, the disk is unchanged) and no file of the new namespace
// reads the old one's data; weir format makes the bdev the new
// namespace's, after which the old namespace is refused in turn.
func TestSPDKStoreBelongsToOneNamespace(t *testing.T) {
	h := newSPDKHost(t)
	json := h.errorConfig("")
	aPath, aCfg := h.config("a", filepath.Join(h.dir, "a"), json)
	bPath, bCfg := h.config("b", filepath.Join(h.dir, "b"), json)

	s, err := h.up(aPath, aCfg)
	if err != nil {
		t.Fatal(err)
	}
	fsys := dialConfig(t, aCfg)
	if err := fsys.WriteFile("secret", []byte("user A's secret data"), 0o600); err != nil {
		t.Fatal(err)
	}
	// While its IO service runs, the store is neither formatted, nor
	// checked, nor loaded by another process: not through A's data
	// directory (DATA/spdk.LOCK), nor through B's (the aio file's lock).
	if code, out := h.weir("check", "--config", aPath); code != 2 || !strings.Contains(out, "in use") {
		t.Errorf("weir check of a running stack: exit %d, want 2 and in use:\n%s", code, out)
	}
	if code, out := h.weir("check", "--config", bPath); code != 2 || !strings.Contains(out, "the file under bdev") {
		t.Errorf("weir check of another data directory over the running stack's bdev: exit %d, want 2 and in use:\n%s", code, out)
	}
	if code, out := h.weir("format", "--yes", "--config", bPath); code != 1 || !strings.Contains(out, "the file under bdev") {
		t.Errorf("weir format of another data directory over the running stack's bdev: exit %d, want 1 and in use:\n%s", code, out)
	}
	if sb, err := h.up(bPath, bCfg); err == nil {
		sb.Stop()
		t.Error("a second IO service loaded the running stack's blobstore")
	}
	if b, err := fsys.ReadFile("secret"); err != nil || string(b) != "user A's secret data" {
		t.Fatalf("after weir format was refused: %q, %v", b, err)
	}
	fsys.Close()
	s.Stop()

	before := h.digest()
	if s, err := h.up(bPath, bCfg); err == nil {
		s.Stop()
		t.Fatal("a new namespace started over another namespace's blobstore")
	}
	if h.digest() != before {
		t.Fatal("the refused IO service changed the disk")
	}
	if code, out := h.weir("check", "--config", bPath); code != 1 || !strings.Contains(out, "wrong-store") {
		t.Errorf("weir check of the new namespace: exit %d, want 1 and wrong-store:\n%s", code, out)
	}
	if code, out := h.weir("format", "--config", bPath); code != 2 || !strings.Contains(out, "--yes") {
		t.Errorf("weir format without --yes: exit %d\n%s", code, out)
	}
	if h.digest() != before {
		t.Fatal("weir format without --yes changed the disk")
	}
	if code, out := h.weir("format", "--yes", "--config", bPath); code != 0 {
		t.Fatalf("weir format --yes: exit %d\n%s", code, out)
	}
	s, err = h.up(bPath, bCfg)
	if err != nil {
		t.Fatalf("the new namespace after weir format: %v", err)
	}
	fsys = dialConfig(t, bCfg)
	f, err := fsys.OpenFile("secret", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != 0 {
		t.Fatalf("a new file of the new namespace: %v, %v, want 0 bytes", st, err)
	}
	f.Close()
	fsys.Close()
	s.Stop()
	if s, err := h.up(aPath, aCfg); err == nil {
		s.Stop()
		t.Fatal("the old namespace started over the store weir format gave the new one")
	}
}
