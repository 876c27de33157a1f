package iosvc

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weir-storage/weir/services/io/backend"
)

// lazyBlob stands for a blob that does not exist yet: a file that was
// created but never written. It reads as empty and creates the real blob
// on the first write or growing truncate, so creating and closing an empty
// file costs no backend operation (a file create, or an SPDK metadata
// operation).
type lazyBlob struct {
	be      backend.Backend
	creates *createSync // told of the create, so that the next fsync makes it durable
	id      backend.BlobID
	adopted func(backend.BlobID, error) // told of a create that found the blob existing (nil: nobody)
	created bool                        // this lazy blob's Create succeeded; protected by mu
	mu      sync.Mutex                  // serialises materialize
	b       atomic.Pointer[backendBlob] // nil until materialized
}

// backendBlob boxes the interface for atomic.Pointer.
type backendBlob struct{ backend.Blob }

var (
	_ backend.Blob     = (*lazyBlob)(nil)
	_ backend.Reserver = (*lazyBlob)(nil)
)

func (l *lazyBlob) real() backend.Blob {
	if p := l.b.Load(); p != nil {
		return p.Blob
	}
	return nil
}

// materialize creates and opens the blob once.
func (l *lazyBlob) materialize() (backend.Blob, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.real(); b != nil {
		return b, nil
	}
	// The blob did not exist when the file was opened, and io alone
	// creates blobs, one lazy blob per id at a time: one that exists now
	// is not this file's (another process on the store, or a bug), and is
	// not taken for its data.
	// (An earlier call whose Create succeeded and whose Open failed made
	// the blob itself: it only opens.)
	if !l.created {
		if err := l.be.Create(l.id); errors.Is(err, syscall.EEXIST) {
			err = fmt.Errorf("create blob %d: it exists already: %w", l.id, errAdoption)
			if l.adopted != nil {
				l.adopted(l.id, err)
			}
			return nil, err
		} else if err != nil {
			return nil, err
		}
		l.created = true
		if l.creates != nil {
			l.creates.created()
		}
	}
	b, err := l.be.Open(l.id)
	if err != nil {
		return nil, err
	}
	l.b.Store(&backendBlob{b})
	return b, nil
}

func (l *lazyBlob) ID() backend.BlobID { return l.id }

func (l *lazyBlob) ReadAt(p []byte, off int64) (int, error) {
	if b := l.real(); b != nil {
		return b.ReadAt(p, off)
	}
	if off < 0 {
		return 0, fmt.Errorf("read blob %d: %w", l.id, syscall.EINVAL)
	}
	return 0, io.EOF
}

func (l *lazyBlob) WriteAt(p []byte, off int64) (int, error) {
	b, err := l.materialize()
	if err != nil {
		return 0, err
	}
	return b.WriteAt(p, off)
}

func (l *lazyBlob) Size() int64 {
	if b := l.real(); b != nil {
		return b.Size()
	}
	return 0
}

func (l *lazyBlob) Truncate(size int64) error {
	if b := l.real(); b != nil || size > 0 {
		if b == nil {
			var err error
			if b, err = l.materialize(); err != nil {
				return err
			}
		}
		return b.Truncate(size)
	}
	if size < 0 {
		return fmt.Errorf("truncate blob %d: %w", l.id, syscall.EINVAL)
	}
	return nil
}

func (l *lazyBlob) Sync() error {
	if b := l.real(); b != nil {
		return b.Sync()
	}
	return nil // nothing written: the namespace holds all there is
}

// Reserve creates the blob and reserves its room (backend.Reserver, where
// the backend's blob is one).
func (l *lazyBlob) Reserve(off, n int64) error {
	b, err := l.materialize()
	if err != nil {
		return err
	}
	if rb, ok := b.(backend.Reserver); ok {
		return rb.Reserve(off, n)
	}
	return nil
}

// Dense: a blob not made yet has no byte, and no hole.
func (l *lazyBlob) Dense() bool {
	if rb, ok := l.real().(backend.Reserver); ok {
		return rb.Dense()
	}
	return true
}

func (l *lazyBlob) Trim(end int64) error {
	if rb, ok := l.real().(backend.Reserver); ok {
		return rb.Trim(end)
	}
	return nil
}

func (l *lazyBlob) Close() error {
	if b := l.real(); b != nil {
		return b.Close()
	}
	return nil
}
