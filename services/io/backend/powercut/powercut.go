// Package powercut wraps a backend.Backend and keeps, beside it, what a
// power cut would leave on a device with a volatile write cache: tests run
// a service on the wrapper, cut the power at any moment with Cut, and check
// that everything the service acknowledged as durable is in what remains.
//
// The model is the backend contract, taken literally:
//   - a blob exists after a cut only if a Backend.Sync returned after its
//     Create (and no Backend.Sync returned after its Delete);
//   - its bytes and size are those of its last Blob.Sync that returned; a
//     blob that exists but was never synced is empty.
//
// Writes and truncates not followed by a Blob.Sync are lost whole, the
// worst a device may do. Real devices often keep more; a test that passes
// here passes there.
package powercut

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"

	"github.com/weir-storage/weir/services/io/backend"
)

// Backend is the wrapper. Its methods pass every call to the wrapped
// backend and record what became durable.
type Backend struct {
	inner backend.Backend
	// AfterSync, when set (before the backend is used), runs after every
	// sync that made something durable (of a blob or of the backend),
	// on the syncing goroutine: a test takes the image of a cut at each
	// such point (Cut), enumerating every point a power cut can leave.
	AfterSync func()

	mu      sync.Mutex
	seq     uint64                     // numbers every create, delete and blob sync, in call order
	pending map[backend.BlobID]change  // creates and deletes since the last Sync
	exists  map[backend.BlobID]change  // existence as of the last Sync
	content map[backend.BlobID]durable // bytes as of each blob's last Sync
}

// change is a create (true) or a delete, numbered. Syncs may overlap and
// return out of order: a sync that returns records only what is newer than
// what is recorded, as a device that completed the later flush keeps what
// it covered whatever an earlier one covered.
type change struct {
	created bool
	seq     uint64
}

// durable is a blob's bytes as of the sync numbered seq.
type durable struct {
	data []byte
	seq  uint64
}

var _ backend.Backend = (*Backend)(nil)

// New wraps inner.
func New(inner backend.Backend) *Backend {
	return &Backend{inner: inner, pending: map[backend.BlobID]change{},
		exists: map[backend.BlobID]change{}, content: map[backend.BlobID]durable{}}
}

// Cut returns what a power cut now would leave: every blob that exists
// durably, with its durable bytes. The wrapped backend goes on unchanged.
func (b *Backend) Cut() map[backend.BlobID][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[backend.BlobID][]byte)
	for id, c := range b.exists {
		if c.created {
			d := b.content[id]
			if d.seq < c.seq {
				d.data = nil // synced before its create: a blob of that id deleted since
			}
			out[id] = append([]byte(nil), d.data...)
		}
	}
	return out
}

// Restore writes state (from Cut) into an empty backend and syncs it: the
// device as found after the cut.
func Restore(be backend.Backend, state map[backend.BlobID][]byte) error {
	for _, id := range slices.Sorted(maps.Keys(state)) {
		if err := be.Create(id); err != nil {
			return fmt.Errorf("restore blob %d: %w", id, err)
		}
		h, err := be.Open(id)
		if err != nil {
			return fmt.Errorf("restore blob %d: %w", id, err)
		}
		if _, err := h.WriteAt(state[id], 0); err != nil {
			h.Close()
			return fmt.Errorf("restore blob %d: %w", id, err)
		}
		if err := h.Sync(); err != nil {
			h.Close()
			return fmt.Errorf("restore blob %d: %w", id, err)
		}
		if err := h.Close(); err != nil {
			return fmt.Errorf("restore blob %d: %w", id, err)
		}
	}
	return be.Sync()
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "powercut/" + b.inner.Name() }

// Create implements backend.Backend.
func (b *Backend) Create(id backend.BlobID) error {
	if err := b.inner.Create(id); err != nil {
		return err
	}
	b.mu.Lock()
	b.seq++
	b.pending[id] = change{created: true, seq: b.seq}
	b.mu.Unlock()
	return nil
}

// Open implements backend.Backend.
func (b *Backend) Open(id backend.BlobID) (backend.Blob, error) {
	h, err := b.inner.Open(id)
	if err != nil {
		return nil, err
	}
	return &blob{Blob: h, be: b}, nil
}

// Delete implements backend.Backend.
func (b *Backend) Delete(id backend.BlobID) error {
	if err := b.inner.Delete(id); err != nil {
		return err
	}
	b.mu.Lock()
	b.seq++
	b.pending[id] = change{seq: b.seq}
	b.mu.Unlock()
	return nil
}

// List implements backend.Backend.
func (b *Backend) List() ([]backend.BlobID, error) { return b.inner.List() }

// Sync implements backend.Backend: the creates and deletes that returned
// before it become durable when it returns.
func (b *Backend) Sync() error {
	b.mu.Lock()
	snap := maps.Clone(b.pending)
	b.mu.Unlock()
	if err := b.inner.Sync(); err != nil {
		return err
	}
	b.mu.Lock()
	for id, c := range snap {
		if b.pending[id] == c {
			delete(b.pending, id)
		}
		if c.seq > b.exists[id].seq {
			b.exists[id] = c
		}
	}
	b.mu.Unlock()
	if b.AfterSync != nil {
		b.AfterSync()
	}
	return nil
}

// Close implements backend.Backend.
func (b *Backend) Close() error { return b.inner.Close() }

// Identity implements backend.Backend (not part of the model: an identity
// is durable when SetIdentity returns).
func (b *Backend) Identity() (backend.Identity, bool, error) { return b.inner.Identity() }

// SetIdentity implements backend.Backend.
func (b *Backend) SetIdentity(id backend.Identity) error { return b.inner.SetIdentity(id) }

// blob records its bytes at every Sync.
type blob struct {
	backend.Blob
	be *Backend
}

// Sync implements backend.Blob: the bytes as they are when it is called
// become the blob's durable bytes when it returns.
func (h *blob) Sync() error {
	// The number and the copy together: a later number holds later bytes.
	h.be.mu.Lock()
	h.be.seq++
	seq := h.be.seq
	data := make([]byte, h.Size())
	n, err := h.ReadAt(data, 0)
	h.be.mu.Unlock()
	if err != nil && err != io.EOF {
		return fmt.Errorf("powercut: read blob %d for its durable copy: %w", h.ID(), err)
	}
	data = data[:n]
	if err := h.Blob.Sync(); err != nil {
		return err
	}
	h.be.mu.Lock()
	if seq > h.be.content[h.ID()].seq {
		h.be.content[h.ID()] = durable{data: data, seq: seq}
	}
	h.be.mu.Unlock()
	if h.be.AfterSync != nil {
		h.be.AfterSync()
	}
	return nil
}
