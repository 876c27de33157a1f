//go:build spdk

package spdk

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
)

// aioOptions are options for Aio0, the bdev over the file aioDisk, whose
// bytes the tests compare.
func aioOptions(format bool) Options {
	o := options(format)
	o.Bdev = "Aio0"
	return o
}

// loadFiles is what the load tests store: five files' worth of blobs.
var loadFiles = map[backend.BlobID][]byte{}

func init() {
	for id := backend.BlobID(2); id <= 6; id++ {
		loadFiles[id] = bytes.Repeat([]byte(fmt.Sprintf("file %d, fsynced. ", id)), 1000+int(id)*300)
	}
}

// storeImages makes a blobstore on Aio0 holding loadFiles and returns two
// images of the device: unclean, taken after the files were synced while
// the blobstore was loaded (what a crash leaves), and clean, after it was
// unloaded.
func storeImages(t *testing.T) (clean, unclean []byte) {
	t.Helper()
	be, err := New(aioOptions(true))
	if err != nil {
		t.Fatal(err)
	}
	for id, data := range loadFiles {
		if err := be.Create(id); err != nil {
			t.Fatal(err)
		}
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.Sync(); err != nil {
		t.Fatal(err)
	}
	unclean = readDisk(t)
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	clean = readDisk(t)
	if bytes.Equal(clean, unclean) {
		t.Fatal("the clean and the unclean image are the same: the unclean one is no crash image")
	}
	return clean, unclean
}

func readDisk(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(aioDisk)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// putDisk makes Aio0 hold img (no blobstore is loaded on it).
func putDisk(t *testing.T, img []byte) {
	t.Helper()
	if bytes.Equal(readDisk(t), img) {
		return
	}
	if err := os.WriteFile(aioDisk, img, 0o600); err != nil {
		t.Fatal(err)
	}
}

// sameDisk fails the test unless Aio0 holds img, naming the first block
// that differs.
func sameDisk(t *testing.T, img []byte, what string) {
	t.Helper()
	now := readDisk(t)
	if bytes.Equal(now, img) {
		return
	}
	i := 0
	for i < len(now) && i < len(img) && now[i] == img[i] {
		i++
	}
	t.Fatalf("%s changed the device: first difference in 4 KiB block %d", what, i/4096)
}

// checkFiles fails the test unless be holds exactly loadFiles.
func checkFiles(t *testing.T, be *Backend) {
	t.Helper()
	ids, err := be.List()
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(func(yield func(backend.BlobID) bool) {
		for id := range loadFiles {
			if !yield(id) {
				return
			}
		}
	})
	if !slices.Equal(ids, want) {
		t.Fatalf("List = %v, want %v", ids, want)
	}
	for id, data := range loadFiles {
		b, err := be.Open(id)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data))
		if _, err := b.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		b.Close()
		if !bytes.Equal(got, data) {
			t.Fatalf("blob %d reads back other data", id)
		}
	}
}

// faulty returns aioOptions that inject f.
func faulty(f loadFault) Options {
	o := aioOptions(false)
	o.fault = f
	return o
}

// TestFailedLoadChangesNothing fails, one at a time, every read a load of
// a clean and of an unclean (crashed) blobstore issues, and every device
// write (the unclean one's recovery): each load fails with an error that
// names EIO, the device is byte for byte what it was, and a load afterwards
// finds every file. A device that fails every write from some point on
// cannot be put back: the partial recovery is redone by the next load.
// Finding 1 of issue 12: a load error used to format the device.
func TestFailedLoadChangesNothing(t *testing.T) {
	clean, unclean := storeImages(t)
	for _, c := range []struct {
		name string
		img  []byte
	}{{"clean", clean}, {"unclean", unclean}} {
		t.Run(c.name, func(t *testing.T) {
			// Count the reads and device writes of a load.
			putDisk(t, c.img)
			be, err := New(faulty(loadFault{readAt: 1 << 30}))
			if err != nil {
				t.Fatal(err)
			}
			reads, writes := devStateAt(be.devState, wReads), devStateAt(be.devState, wWrites)
			checkFiles(t, be)
			if err := be.Close(); err != nil {
				t.Fatal(err)
			}
			t.Logf("a load of the %s image reads %d times and writes %d times", c.name, reads, writes)
			if c.name == "clean" && writes != 0 {
				t.Errorf("loading a clean blobstore wrote %d times", writes)
			}
			if c.name == "unclean" && writes == 0 {
				t.Fatal("loading an unclean blobstore wrote nothing: it was not recovered")
			}
			for k := 1; k <= reads; k++ {
				putDisk(t, c.img)
				be, err := New(faulty(loadFault{readAt: k}))
				if err == nil {
					be.Close()
					t.Fatalf("read %d of %d failed and the load succeeded", k, reads)
				}
				if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "input/output error") {
					t.Fatalf("read %d failed; the load's error does not name EIO: %v", k, err)
				}
				sameDisk(t, c.img, fmt.Sprintf("a load whose read %d failed", k))
			}
			// Each device write of the recovery failed alone: what was
			// written is put back, so the device is as it was.
			for k := 1; k <= writes; k++ {
				putDisk(t, c.img)
				_, err := New(faulty(loadFault{writeAt: k}))
				if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "nothing on the device was changed") {
					t.Fatalf("write %d of %d of the recovery failed; the load's error is %v, want EIO and nothing changed", k, writes, err)
				}
				sameDisk(t, c.img, fmt.Sprintf("a load whose write %d failed", k))
				// The same write reaches the device, and then the device
				// reports it failed: it is put back too.
				putDisk(t, c.img)
				_, err = New(faulty(loadFault{landedAt: k}))
				if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "nothing on the device was changed") {
					t.Fatalf("write %d of %d of the recovery landed and failed; the load's error is %v, want EIO and nothing changed", k, writes, err)
				}
				sameDisk(t, c.img, fmt.Sprintf("a load whose write %d landed and failed", k))
			}
			// The device fails every write from the k-th on: the first
			// leaves the device as it was; a later one cannot be put back,
			// which leaves a partial recovery that the next load redoes.
			for k := 1; k <= writes; k++ {
				putDisk(t, c.img)
				_, err := New(faulty(loadFault{writeFrom: k}))
				if !errors.Is(err, syscall.EIO) {
					t.Fatalf("writes from %d on failed; the load's error is %v, want EIO", k, err)
				}
				if k == 1 {
					sameDisk(t, c.img, "a load whose writes all failed")
					continue
				}
				if !strings.Contains(err.Error(), "partly updated") {
					t.Fatalf("writes from %d on failed, and nothing could be put back; the error does not say so: %v", k, err)
				}
				be, err := New(aioOptions(false))
				if err != nil {
					t.Fatalf("after writes from %d of a recovery failed: %v", k, err)
				}
				checkFiles(t, be)
				if err := be.Close(); err != nil {
					t.Fatal(err)
				}
			}
			putDisk(t, c.img)
			be, err = New(aioOptions(false))
			if err != nil {
				t.Fatal(err)
			}
			checkFiles(t, be)
			if err := be.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReadOnlyLoadWritesNothing: weir check's read-only load, of a clean
// and of an unclean blobstore (recovered in memory only), serves every
// file, refuses changes, and leaves the device byte for byte as it was.
func TestReadOnlyLoadWritesNothing(t *testing.T) {
	clean, unclean := storeImages(t)
	for _, img := range [][]byte{clean, unclean} {
		putDisk(t, img)
		o := aioOptions(false)
		o.ReadOnly = true
		be, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		checkFiles(t, be)
		if err := be.Create(40); !errors.Is(err, syscall.EROFS) {
			t.Errorf("Create on a read-only backend: %v, want EROFS", err)
		}
		if err := be.Close(); err != nil {
			t.Fatal(err)
		}
		sameDisk(t, img, "a read-only load")
	}
}

// TestSecondConfigurationIsAnError: SPDK's environment is set up once per
// process; a backend asking for another configuration (another JSON
// config, no-huge setting or memory size) is refused with EINVAL instead
// of silently getting the first one's bdevs (finding 4 of issue 12).
func TestSecondConfigurationIsAnError(t *testing.T) {
	be, err := New(options(true)) // the process's configuration
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	other := []func(*Options){
		func(o *Options) {
			o.ConfigJSON = []byte(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "Malloc1", "num_blocks": 4096, "block_size": 4096}}]}]}`)
			o.Bdev = "Malloc1"
		},
		func(o *Options) { o.NoHuge = !o.NoHuge },
		func(o *Options) { o.MemMB += 512 },
	}
	for i, change := range other {
		o := options(false)
		change(&o)
		be2, err := New(o)
		if err == nil {
			be2.Close()
			t.Fatalf("change %d: a second SPDK configuration in one process was accepted", i)
		}
		if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "another configuration") {
			t.Errorf("change %d: %v, want EINVAL saying the process runs another configuration", i, err)
		}
	}
}
