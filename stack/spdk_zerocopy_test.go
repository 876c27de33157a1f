//go:build spdk

package stack

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/services/io/backend/spdk"
)

// zeroCopyHuge is the huge-page memory TestSPDKZeroCopy needs: a 128 MiB
// malloc bdev, SPDK's pools and the session's ring region.
const zeroCopyHuge = 512 << 20

// TestSPDKZeroCopy runs weir on the SPDK backend on huge pages, as in
// production: the IO service makes each session's ring region of huge
// pages and registers it with SPDK, so a client's aligned payload goes
// from its arena to the device and back with no copy in the IO service;
// only partial edge units bounce. The region is unregistered when the
// session ends.
func TestSPDKZeroCopy(t *testing.T) {
	if free := spdk.HugePagesFree(); free < zeroCopyHuge {
		t.Skipf("needs %d MiB of free huge pages, the host has %d MiB (reserve them: sysctl -w vm.nr_hugepages=512, with a hugetlbfs mounted: mount -t hugetlbfs nodev /dev/hugepages)", zeroCopyHuge>>20, free>>20)
	}
	dir := t.TempDir()
	spdkJSON := filepath.Join(dir, "spdk.json")
	if err := os.WriteFile(spdkJSON, []byte(`{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "MallocZC", "num_blocks": 32768, "block_size": 4096}}
]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	run, err := os.MkdirTemp("", "weir-zc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(run)
	c, err := LocalConfig(filepath.Join(dir, "data"), run)
	if err != nil {
		t.Fatal(err)
	}
	c.IO.Backend, c.IO.SPDKConfig, c.IO.SPDKBdev = "spdk", spdkJSON, "MallocZC"
	// The zero-copy path is that of O_DIRECT opens: with the page cache on
	// (the default), buffered reads and writes meet the cache, direct ones
	// the device.
	st, err := Start(c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Shutdown(context.Background())
	counter := func(k string) uint64 { v, _ := st.IO.Snapshot()[k].(uint64); return v }

	fsys, err := st.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f, err := fsys.OpenFile("/zc", os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter("spdk_registered_regions"); n != 1 {
		t.Fatalf("%d regions registered with one session, want 1 (fallbacks %d, refusals %d)",
			n, counter("ring_hugepage_fallbacks"), counter("mem_register_failures"))
	}
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i*7 + 3)
	}
	// From here: the staging log's writes before (its format at the
	// first start, from io's heap) bounce, and are not this test's.
	d0, b0 := counter("spdk_direct_bytes"), counter("spdk_bounce_bytes")
	if _, err := f.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back differs from what was written")
	}
	if d, b := counter("spdk_direct_bytes")-d0, counter("spdk_bounce_bytes")-b0; d != 2<<20 || b != 0 {
		t.Fatalf("aligned 1 MiB write and read: %d bytes direct, %d bounced; want %d and 0", d, b, 2<<20)
	}
	// At a file offset that is not a multiple of the unit (4 KiB; O_DIRECT
	// asks for 512 bytes) the arena bytes of the whole units are not
	// aligned in memory either (the client's arena blocks are), so the
	// whole write bounces: one copy, in the IO service.
	if _, err := f.WriteAt(want[:3*4096], 512); err != nil {
		t.Fatal(err)
	}
	if b := counter("spdk_bounce_bytes") - b0; b != 3*4096 {
		t.Fatalf("write of 3 units at offset 512: %d bytes bounced, want %d", b, 3*4096)
	}
	// A buffered handle of the file reads what the direct writes wrote.
	copy(want[512:], want[:3*4096])
	bf, err := fsys.OpenFile("/zc", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // the third read is from the client's mapping of the cache
		if _, err := bf.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("buffered read after direct writes: %v, equal %v", err, bytes.Equal(got, want))
		}
	}
	// A direct write over pages the buffered reads cached: the cached
	// copies take its bytes, and it still goes without a copy.
	direct := counter("spdk_direct_bytes")
	for i := range 8192 {
		want[i] ^= 0xff
	}
	if _, err := f.WriteAt(want[:8192], 0); err != nil {
		t.Fatal(err)
	}
	if d := counter("spdk_direct_bytes") - direct; d != 8192 {
		t.Fatalf("aligned direct write over cached pages: %d bytes direct, want 8192", d)
	}
	if _, err := bf.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("buffered read after a direct write over its cached pages: %v, equal %v", err, bytes.Equal(got, want))
	}
	if n := counter("cache_direct_writes"); n == 0 {
		t.Fatal("the direct write met no cache region (cache_direct_writes 0)")
	}
	bf.Close()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Close(); err != nil {
		t.Fatal(err)
	}
	// The session ends asynchronously after the client goes.
	for deadline := time.Now().Add(10 * time.Second); counter("spdk_registered_regions") != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("region still registered 10 s after the client closed (sessions %v)", st.IO.Snapshot()["sessions"])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := counter("mem_unregister_failures"); n != 0 {
		t.Fatalf("%d unregister failures", n)
	}
}
