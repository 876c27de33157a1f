// Package mem is an in-memory, sparse blob backend for tests. A blob keeps
// its data in 4 KiB pages held in a map, allocated on first write, so a blob
// with 10 bytes at offset 6 GiB costs one page. Nothing survives Close: the
// conformance suite runs it without Reopen.
package mem

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weir-storage/weir/services/io/backend"
)

// pageSize is the allocation unit of blob data.
const pageSize = 4096

type page = [pageSize]byte

// Backend is the in-memory backend. Use New.
type Backend struct {
	mu     sync.Mutex
	blobs  map[backend.BlobID]*blob // protected by mu
	id     *backend.Identity        // protected by mu
	closed atomic.Bool              // written under mu, read anywhere
}

var _ backend.Backend = (*Backend)(nil)

// blob is the shared state of one blob; every handle of it points here.
type blob struct {
	id   backend.BlobID // immutable
	refs int            // open handles; protected by Backend.mu

	mu    sync.RWMutex
	size  int64           // protected by mu
	pages map[int64]*page // page index -> data; protected by mu
}

// handle is one Blob returned by Open.
type handle struct {
	be     *Backend // immutable
	b      *blob    // immutable
	closed atomic.Bool
}

var _ backend.Blob = (*handle)(nil)

// New returns an empty in-memory backend.
func New() backend.Backend {
	return &Backend{blobs: make(map[backend.BlobID]*blob)}
}

func errorf(op string, id backend.BlobID, err error) error {
	return fmt.Errorf("backend mem: %s blob %d: %w", op, id, err)
}

// Name returns "mem".
func (m *Backend) Name() string { return "mem" }

// Create adds an empty blob.
func (m *Backend) Create(id backend.BlobID) error {
	if err := backend.CheckID(id); err != nil {
		return errorf("create", id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return errorf("create", id, syscall.EBADF)
	}
	if _, ok := m.blobs[id]; ok {
		return errorf("create", id, syscall.EEXIST)
	}
	m.blobs[id] = &blob{id: id, pages: make(map[int64]*page)}
	return nil
}

// Open returns a new handle to blob id.
func (m *Backend) Open(id backend.BlobID) (backend.Blob, error) {
	if err := backend.CheckID(id); err != nil {
		return nil, errorf("open", id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return nil, errorf("open", id, syscall.EBADF)
	}
	b, ok := m.blobs[id]
	if !ok {
		return nil, errorf("open", id, syscall.ENOENT)
	}
	b.refs++
	return &handle{be: m, b: b}, nil
}

// Delete removes blob id unless a handle of it is open.
func (m *Backend) Delete(id backend.BlobID) error {
	if err := backend.CheckID(id); err != nil {
		return errorf("delete", id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return errorf("delete", id, syscall.EBADF)
	}
	b, ok := m.blobs[id]
	if !ok {
		return errorf("delete", id, syscall.ENOENT)
	}
	if b.refs > 0 {
		return errorf("delete", id, syscall.EBUSY)
	}
	delete(m.blobs, id)
	return nil
}

// List returns every blob id in ascending order.
func (m *Backend) List() ([]backend.BlobID, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return nil, fmt.Errorf("backend mem: list: %w", syscall.EBADF)
	}
	ids := make([]backend.BlobID, 0, len(m.blobs))
	for id := range m.blobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Sync does nothing: memory is as durable as it gets.
func (m *Backend) Sync() error {
	if m.closed.Load() {
		return fmt.Errorf("backend mem: sync: %w", syscall.EBADF)
	}
	return nil
}

// Close drops every blob; open handles return EBADF from then on.
func (m *Backend) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return fmt.Errorf("backend mem: close: %w", syscall.EBADF)
	}
	m.closed.Store(true)
	m.blobs = nil
	return nil
}

// Identity returns the identity SetIdentity recorded.
func (m *Backend) Identity() (backend.Identity, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return backend.Identity{}, false, fmt.Errorf("backend mem: identity: %w", syscall.EBADF)
	}
	if m.id == nil {
		return backend.Identity{}, false, nil
	}
	return *m.id, true, nil
}

// SetIdentity records id; EEXIST if another is recorded.
func (m *Backend) SetIdentity(id backend.Identity) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed.Load():
		return fmt.Errorf("backend mem: set identity: %w", syscall.EBADF)
	case m.id != nil && *m.id != id:
		return fmt.Errorf("backend mem: set identity %s: the store belongs to %s: %w", id, *m.id, syscall.EEXIST)
	}
	m.id = &id
	return nil
}

// usable returns EBADF, wrapped for op, once h or its backend is closed.
func (h *handle) usable(op string) error {
	if h.closed.Load() || h.be.closed.Load() {
		return errorf(op, h.b.id, syscall.EBADF)
	}
	return nil
}

func (h *handle) ID() backend.BlobID { return h.b.id }

func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	if err := h.usable("read"); err != nil {
		return 0, err
	}
	if err := backend.CheckRange(off, len(p)); err != nil {
		return 0, errorf("read", h.b.id, err)
	}
	if len(p) == 0 {
		return 0, nil
	}
	b := h.b
	b.mu.RLock()
	defer b.mu.RUnlock()
	if off >= b.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), b.size-off))
	for done := 0; done < n; {
		pos := off + int64(done)
		idx, in := pos/pageSize, int(pos%pageSize)
		m := min(n-done, pageSize-in)
		if pg := b.pages[idx]; pg != nil {
			copy(p[done:done+m], pg[in:])
		} else {
			clear(p[done : done+m])
		}
		done += m
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	if err := h.usable("write"); err != nil {
		return 0, err
	}
	if err := backend.CheckRange(off, len(p)); err != nil {
		return 0, errorf("write", h.b.id, err)
	}
	if len(p) == 0 {
		return 0, nil
	}
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for done := 0; done < len(p); {
		pos := off + int64(done)
		idx, in := pos/pageSize, int(pos%pageSize)
		pg := b.pages[idx]
		if pg == nil {
			pg = new(page)
			b.pages[idx] = pg
		}
		done += copy(pg[in:], p[done:])
	}
	b.size = max(b.size, off+int64(len(p)))
	return len(p), nil
}

func (h *handle) Size() int64 {
	h.b.mu.RLock()
	defer h.b.mu.RUnlock()
	return h.b.size
}

func (h *handle) Truncate(size int64) error {
	if err := h.usable("truncate"); err != nil {
		return err
	}
	if err := backend.CheckSize(size); err != nil {
		return errorf("truncate", h.b.id, err)
	}
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if size < b.size {
		// Drop whole pages past the new end and zero the tail of the
		// last one, so growing again reads zeros.
		keep := (size + pageSize - 1) / pageSize
		for idx := range b.pages {
			if idx >= keep {
				delete(b.pages, idx)
			}
		}
		if in := size % pageSize; in != 0 {
			if pg := b.pages[size/pageSize]; pg != nil {
				clear(pg[in:])
			}
		}
	}
	b.size = size
	return nil
}

// Sync has nothing to flush; it only checks the handle is open.
func (h *handle) Sync() error { return h.usable("sync") }

func (h *handle) Close() error {
	if h.closed.Swap(true) {
		return errorf("close", h.b.id, syscall.EBADF)
	}
	h.be.mu.Lock()
	h.b.refs--
	h.be.mu.Unlock()
	return nil
}
