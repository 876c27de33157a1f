package file

import (
	"golang.org/x/sys/unix"

	"github.com/weir-storage/weir/services/io/backend"
)

// SetSyncHook makes every blob sync of b call fn first; an error from fn
// becomes the sync's result. nil removes the hook.
func SetSyncHook(b backend.Backend, fn func(backend.BlobID) error) {
	be := b.(*Backend)
	if fn == nil {
		be.syncHook.Store(nil)
		return
	}
	be.syncHook.Store(&fn)
}

// RefuseDirect returns opts with the O_DIRECT probe made to fail with
// EINVAL, as on a file system without direct I/O.
func RefuseDirect(opts Options) Options {
	opts.refuseDirect = true
	return opts
}

// SetAfterWriteHook makes every device write of a direct-mode write call
// fn with the blob file's size on disk right after it; nil removes it.
func SetAfterWriteHook(fn func(onDisk int64)) {
	if fn == nil {
		testAfterWrite.Store(nil)
		return
	}
	testAfterWrite.Store(&fn)
}

// OpenFlags returns the status flags (F_GETFL) of the descriptor behind
// blob handle b.
func OpenFlags(b backend.Blob) (int, error) {
	h := b.(*handle)
	h.b.mu.RLock()
	defer h.b.mu.RUnlock()
	return unix.FcntlInt(uintptr(h.b.fd), unix.F_GETFL, 0)
}

// SetMaxIdleFiles sets how many blobs without a handle the backend keeps
// open, until cleanup restores it.
func SetMaxIdleFiles(t interface{ Cleanup(func()) }, n int) {
	old := maxIdleFiles
	maxIdleFiles = n
	t.Cleanup(func() { maxIdleFiles = old })
}

// Idle returns how many blobs without a handle b keeps open.
func Idle(b backend.Backend) int {
	be := b.(*Backend)
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.idle.Len()
}
