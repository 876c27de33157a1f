package iosvc

import (
	"sync"
	"sync/atomic"

	"github.com/weir-storage/weir/services/io/backend"
)

// createSync makes blob creates durable on demand. The backend contract
// splits durability in two: Blob.Sync covers a blob's bytes and size,
// Backend.Sync the creates and deletes so far (on the file backend, an
// fsync of the directory holding the new blob file). An fsync of a file
// must cover both, or a file created, written and fsynced could be gone
// after a power cut although its bytes were flushed. Backend.Sync can cost
// a device flush, so it runs only when a create happened since the last.
type createSync struct {
	be    backend.Backend
	made  atomic.Uint64 // creates that returned, so far
	syncs atomic.Uint64 // Backend.Sync calls made here (counter backend_syncs)

	mu     sync.Mutex
	synced uint64 // made as of the last successful Backend.Sync; protected by mu
}

// created records a create that has returned.
func (c *createSync) created() { c.made.Add(1) }

// sync returns once every create that returned before it was called is
// durable: at once if none happened since the last successful sync.
func (c *createSync) sync() error {
	n := c.made.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.synced >= n {
		return nil
	}
	c.syncs.Add(1)
	if err := c.be.Sync(); err != nil {
		return err
	}
	c.synced = n
	return nil
}
