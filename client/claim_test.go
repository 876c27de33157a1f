package client_test

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/weir-storage/weir/internal/config"
)

// TestColdFirstReadsDoNotStarve: the claim of an open's capability stands
// aside on the IO ring while the first read goes (ring.StartAside), one
// at a time and only with room left: many goroutines reading cold files
// at once on a ring of 4 slots, and a first read as large as a request
// may be in an arena it fills whole, all complete with the right bytes.
func TestColdFirstReadsDoNotStarve(t *testing.T) {
	for _, tc := range []struct {
		name      string
		arena     int
		readers   int
		fileBytes int
	}{
		{"32 readers, 4 slots", 4 << 20, 32, 4096},
		{"a read the size of the arena", 1 << 20, 1, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir(), "mem")
			cfg.Ring.SQEntries, cfg.Ring.ArenaSize = 4, config.Size(tc.arena)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			st := startStack(t, cfg)
			t.Cleanup(func() { stopStack(t, st) })
			w := dialStack(t, st)
			content := func(i int) []byte {
				return bytes.Repeat([]byte{byte(i + 1)}, tc.fileBytes)
			}
			for i := range tc.readers * 2 {
				if err := w.WriteFile(fmt.Sprintf("f%d", i), content(i), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r := dialStack(t, st)
			minted := st.Metadata.Snapshot()["caps_minted"].(uint64)
			done := make(chan error, 1)
			go func() {
				var wg sync.WaitGroup
				errs := make(chan error, tc.readers*2)
				for g := range tc.readers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for _, i := range []int{g, g + tc.readers} {
							f, err := r.OpenFile(fmt.Sprintf("f%d", i), os.O_RDONLY, 0)
							if err != nil {
								errs <- err
								return
							}
							got := make([]byte, tc.fileBytes)
							n, err := f.ReadAt(got, 0)
							f.Close()
							if err != nil || n != tc.fileBytes || !bytes.Equal(got, content(i)) {
								errs <- fmt.Errorf("f%d: %d bytes, %v, or other bytes", i, n, err)
								return
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				done <- <-errs
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("cold first reads still waiting after 60 s: the claims starved them")
			}
			if n := st.Metadata.Snapshot()["caps_minted"].(uint64) - minted; n == 0 {
				t.Error("no capability was minted: the claims were not exercised")
			}
		})
	}
}
