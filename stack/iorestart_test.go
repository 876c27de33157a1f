package stack_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weir-storage/weir/client"
)

// TestIORestartUnderLoad: clients write, read and fsync while the IO
// service is killed (SIGKILL) and started again. Every client recovers on
// its own (new IO ring, handles granted again) without closing a file.
// What a kernel crash would lose, writes since the last fsync, is reported
// as Linux reports a writeback error: the next Sync of that file returns
// EIO once, and only a file with such writes gets it. After that the file
// works again; every write acknowledged since, and every one that a
// successful Sync covered, reads back after a clean shutdown and start,
// and `weir check` finds nothing wrong.
func TestIORestartUnderLoad(t *testing.T) {
	cfg := testConfig(t)
	url, md, io := startPair(t, cfg)
	const (
		clients = 4
		blocks  = 32
		bs      = 4096
	)
	type model struct {
		written [blocks]byte // the fill byte of each block's last acknowledged write
		synced  [blocks]byte // and of its last write a Sync covered
	}
	var (
		progress [clients]atomic.Int64
		syncEIO  [clients]atomic.Int64
		models   [clients]model
		killed   atomic.Bool
		stop     atomic.Bool
		wg       sync.WaitGroup
		errs     = make(chan error, clients*4)
		fsyses   [clients]*client.FS
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fill := func(v byte) []byte { return bytes.Repeat([]byte{v}, bs) }
	for i := range clients {
		fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
		if err != nil {
			t.Fatal(err)
		}
		fsyses[i] = fsys
		t.Cleanup(func() { fsys.Close() })
		m := &models[i]
		wg.Go(func() {
			fail := func(format string, a ...any) { errs <- fmt.Errorf("client %d: "+format, append([]any{i}, a...)...) }
			f, err := fsys.OpenFile(fmt.Sprintf("load-%d", i), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				fail("open: %v", err)
				return
			}
			defer f.Close()
			for n := 0; !stop.Load(); n++ {
				blk := n % blocks
				v := byte(n%251 + 1)
				rec := fsys.Recoveries.Load()
				if _, err := f.WriteAt(fill(v), int64(blk)*bs); err != nil {
					fail("write %d: %v", n, err)
					return
				}
				m.written[blk] = v
				got := make([]byte, bs)
				if _, err := f.ReadAt(got, int64(blk)*bs); err != nil {
					fail("read %d: %v", n, err)
					return
				}
				// Unsynced, the write may be gone if io died in between.
				if fsys.Recoveries.Load() == rec && !bytes.Equal(got, fill(v)) {
					fail("read back %d: block %d holds %d, want %d", n, blk, got[0], v)
					return
				}
				if n%8 == 7 {
					switch err := f.Sync(); {
					case err == nil:
						m.synced = m.written
					case errors.Is(err, syscall.EIO) && killed.Load() && syncEIO[i].Add(1) == 1:
						// Writes since the last Sync may be lost: write
						// again each block that has any.
						for b := range blocks {
							if m.written[b] != m.synced[b] {
								if _, err := f.WriteAt(fill(m.written[b]), int64(b)*bs); err != nil {
									fail("rewrite block %d after the lost writes: %v", b, err)
									return
								}
							}
						}
					default:
						fail("sync %d (EIOs so far %d, io killed %v): %v", n, syncEIO[i].Load(), killed.Load(), err)
						return
					}
				}
				progress[i].Add(1)
			}
			if err := f.Sync(); err != nil {
				fail("last sync: %v", err)
				return
			}
			m.synced = m.written
		})
	}
	waitProgress := func(min [clients]int64) {
		t.Helper()
		for i := range clients {
			for progress[i].Load() < min[i] {
				select {
				case err := <-errs:
					t.Fatal(err)
				case <-ctx.Done():
					t.Fatalf("client %d made %d rounds, want %d", i, progress[i].Load(), min[i])
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
	}
	// A quiet file: one write not yet synced when io dies, one synced.
	quiet, err := fsyses[0].Create("quiet")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := quiet.Write([]byte("synced")); err != nil {
		t.Fatal(err)
	}
	if err := quiet.Sync(); err != nil {
		t.Fatal(err)
	}
	synced, err := fsyses[1].Create("quiet-synced")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := synced.Write([]byte("synced")); err != nil {
		t.Fatal(err)
	}
	if err := synced.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := quiet.Write([]byte(", then not")); err != nil {
		t.Fatal(err)
	}
	waitProgress([clients]int64{60, 60, 60, 60})
	killed.Store(true)
	io.kill(t)
	var after [clients]int64
	for i := range clients {
		after[i] = progress[i].Load() + 40
	}
	io = startService(t, buildWeir(t), "io", cfg, url)
	waitProgress(after)
	if err := quiet.Sync(); !errors.Is(err, syscall.EIO) {
		t.Errorf("first Sync of a file with writes io lost: %v, want EIO", err)
	}
	if err := quiet.Sync(); err != nil {
		t.Errorf("second Sync of that file: %v, want nil (EIO is reported once)", err)
	}
	if err := synced.Sync(); err != nil {
		t.Errorf("Sync of a file whose writes were all synced when io died: %v", err)
	}
	if _, err := quiet.WriteAt([]byte(", then not"), 6); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*client.File{quiet, synced} {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	for i, fsys := range fsyses {
		if fsys.Recoveries.Load() == 0 {
			t.Errorf("client %d never recovered", i)
		}
		fsys.Close()
	}
	io.stop()
	md.stop()
	_, md, io = startPair(t, cfg)
	fsys, err := client.Dial(ctx, client.Options{MetadataSocket: cfg.Metadata.Socket, IOSocket: cfg.IO.Socket})
	if err != nil {
		t.Fatal(err)
	}
	for i := range clients {
		b, err := fsys.ReadFile(fmt.Sprintf("load-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != blocks*bs {
			t.Errorf("load-%d is %d bytes, want %d", i, len(b), blocks*bs)
			continue
		}
		for blk := range blocks {
			if got, want := b[blk*bs], models[i].synced[blk]; !bytes.Equal(b[blk*bs:(blk+1)*bs], fill(want)) {
				t.Errorf("load-%d block %d holds %d, want %d (synced)", i, blk, got, want)
			}
		}
		t.Logf("client %d: %d rounds, %d recoveries, %d EIO from Sync", i, progress[i].Load(), fsyses[i].Recoveries.Load(), syncEIO[i].Load())
	}
	for name, want := range map[string]string{"quiet": "synced, then not", "quiet-synced": "synced"} {
		if b, err := fsys.ReadFile(name); err != nil || string(b) != want {
			t.Errorf("%s reads %q, %v; want %q", name, b, err, want)
		}
	}
	fsys.Close()
	io.stop()
	md.stop()
	if code, r, errOut := weirCheck(t, cfg); code != 0 || len(r.Problems) != 0 {
		t.Fatalf("weir check: exit %d %+v %s", code, r, errOut)
	}
}
