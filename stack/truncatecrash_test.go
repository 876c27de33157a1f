package stack_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
)

// TestTruncateSurvivesMetadataKill: without the staging log, a file
// fsynced at 100,000 bytes and cut to 50,000 with no fsync after, then a
// SIGKILL of the metadata service: after its restart the size it records
// and the bytes io holds agree (Linux after a crash gives one or the
// other: the old 100,000 bytes or the cut), through the client and for
// `weir check` of the stopped directory. Once with the file still open at
// the kill, once closed.
func TestTruncateSurvivesMetadataKill(t *testing.T) {
	for _, closed := range []bool{false, true} {
		for _, ioAfter := range []string{"", "stop", "kill"} {
			name := "open"
			if closed {
				name = "closed"
			}
			t.Run(name+"/io="+ioAfter, func(t *testing.T) { truncateThenKill(t, closed, ioAfter) })
		}
	}
}

func truncateThenKill(t *testing.T, closed bool, ioAfter string) {
	cfg := testConfig(t)
	cfg.IO.StagingSize = 0
	path := filepath.Join(t.TempDir(), "weir.hcl")
	if err := os.WriteFile(path, []byte("io {\n  staging_size = 0\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	url, md, io := startPair(t, cfg, "--config", path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	data := bytes.Repeat([]byte("0123456789"), 10000)
	f, err := fsys.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(50000); err != nil {
		t.Fatal(err)
	}
	if closed {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	md.kill(t)
	switch ioAfter {
	case "stop":
		io.stop()
	case "kill":
		io.kill(t)
	}
	md = startService(t, buildWeir(t), "metadata", cfg, url, "--config", path)
	if ioAfter != "" {
		io = startService(t, buildWeir(t), "io", cfg, url, "--config", path)
	}

	fi, err := fsys.Stat("f")
	if err != nil {
		t.Fatalf("stat after the restart: %v", err)
	}
	got, err := fsys.ReadFile("f")
	if err != nil {
		t.Fatalf("read after the restart: %v", err)
	}
	if int64(len(got)) != fi.Size() || (len(got) != 50000 && len(got) != len(data)) || !bytes.Equal(got, data[:len(got)]) {
		t.Errorf("after the restart stat says %d bytes and the file reads %d; want both 50000 or both %d, of the data written", fi.Size(), len(got), len(data))
	}
	if !closed {
		if err := f.Close(); err != nil {
			t.Fatalf("close after the restart: %v", err)
		}
	}
	fsys.Close()
	md.stop()
	io.stop()
	code, r, errOut := weirCheck(t, cfg)
	if code != 0 || len(r.Problems) != 0 {
		t.Errorf("weir check after the restart: exit %d %+v %s", code, r, errOut)
	}
}
