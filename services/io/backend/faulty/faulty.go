// Package faulty wraps a backend.Backend to inject faults, in the manner of
// pebble's vfs/errorfs: tests decide, operation by operation, which calls
// fail and with what error, without touching the wrapped backend.
//
//	f := faulty.New(mem.New())
//	f.Inject(faulty.FailNth(faulty.Write, 3, syscall.EIO)) // the 3rd write fails
//	...
//	f.Inject(faulty.OnBlob(7, faulty.Sync, syscall.EIO))    // every Sync of blob 7 fails
//	f.Inject(nil)                                           // no more faults
//
// Before each operation the Faulty calls the injector with an Op describing
// it. A nil result lets the operation through to the wrapped backend; an
// error fails it with that error (wrapped with context, so errors.Is sees
// it) and the wrapped backend never sees the call. The special error Drop
// instead makes a Write, Truncate, Sync or SyncMeta report success without
// doing anything: a lost write, as from a disk that lies. Close, ID and Size
// are never injected.
//
// The injector is called concurrently when the Faulty is used concurrently;
// the helpers here are safe for that.
package faulty

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/weir-storage/weir/services/io/backend"
)

// Kind is the kind of an operation.
type Kind uint8

const (
	// Create is Backend.Create.
	Create Kind = iota + 1
	// Open is Backend.Open.
	Open
	// Delete is Backend.Delete.
	Delete
	// List is Backend.List.
	List
	// SyncMeta is Backend.Sync (creates and deletes made durable).
	SyncMeta
	// Read is Blob.ReadAt.
	Read
	// Write is Blob.WriteAt.
	Write
	// Truncate is Blob.Truncate.
	Truncate
	// Sync is Blob.Sync.
	Sync
)

var kindNames = [...]string{
	Create: "create", Open: "open", Delete: "delete", List: "list", SyncMeta: "sync-meta",
	Read: "read", Write: "write", Truncate: "truncate", Sync: "sync",
}

// String returns the kind's name, as used in error messages ("write").
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Op describes one operation about to run.
type Op struct {
	Kind Kind
	// Blob is the blob operated on; 0 for List and SyncMeta.
	Blob backend.BlobID
	// Off is the offset of a Read or Write, and the new size of a Truncate.
	Off int64
	// Len is the length of a Read or Write.
	Len int
}

// String formats op for messages: "write blob 3 [4096, +100)".
func (op Op) String() string {
	switch op.Kind {
	case Read, Write:
		return fmt.Sprintf("%s blob %d [%d, +%d)", op.Kind, op.Blob, op.Off, op.Len)
	case Truncate:
		return fmt.Sprintf("%s blob %d to %d", op.Kind, op.Blob, op.Off)
	case List, SyncMeta:
		return op.Kind.String()
	}
	return fmt.Sprintf("%s blob %d", op.Kind, op.Blob)
}

// Drop, returned by an injector for a Write, Truncate, Sync or SyncMeta,
// makes the operation report success without reaching the wrapped backend.
// For other kinds it is an ordinary error.
var Drop = errors.New("faulty: drop")

// injector decides the fate of one operation: nil lets it through.
type injector func(op Op) error

// Faulty is a Backend that passes every operation to an inner Backend unless
// its injector fails it. Use New.
type Faulty struct {
	inner  backend.Backend          // immutable
	inject atomic.Pointer[injector] // nil: no faults
}

var _ backend.Backend = (*Faulty)(nil)

// New wraps inner; until Inject is called no operation fails.
func New(inner backend.Backend) *Faulty { return &Faulty{inner: inner} }

// Inject replaces the injector; nil removes it. It takes effect for
// operations that start after it returns.
func (f *Faulty) Inject(fn func(op Op) error) {
	if fn == nil {
		f.inject.Store(nil)
		return
	}
	inj := injector(fn)
	f.inject.Store(&inj)
}

// Inner returns the wrapped backend.
func (f *Faulty) Inner() backend.Backend { return f.inner }

// check asks the injector about op. It returns (true, nil) for a dropped
// operation, (false, err) for a failed one and (false, nil) to go ahead.
func (f *Faulty) check(op Op) (dropped bool, err error) {
	inj := f.inject.Load()
	if inj == nil {
		return false, nil
	}
	err = (*inj)(op)
	if err == nil {
		return false, nil
	}
	if errors.Is(err, Drop) {
		switch op.Kind {
		case Write, Truncate, Sync, SyncMeta:
			return true, nil
		}
	}
	return false, fmt.Errorf("backend faulty: %s: %w", op, err)
}

// Name returns "faulty/" and the inner backend's name.
func (f *Faulty) Name() string { return "faulty/" + f.inner.Name() }

// Create creates blob id in the inner backend unless injected.
func (f *Faulty) Create(id backend.BlobID) error {
	if _, err := f.check(Op{Kind: Create, Blob: id}); err != nil {
		return err
	}
	return f.inner.Create(id)
}

// Open opens blob id in the inner backend unless injected; the handle
// injects faults too.
func (f *Faulty) Open(id backend.BlobID) (backend.Blob, error) {
	if _, err := f.check(Op{Kind: Open, Blob: id}); err != nil {
		return nil, err
	}
	b, err := f.inner.Open(id)
	if err != nil {
		return nil, err
	}
	return &blob{f: f, inner: b}, nil
}

// Delete deletes blob id in the inner backend unless injected.
func (f *Faulty) Delete(id backend.BlobID) error {
	if _, err := f.check(Op{Kind: Delete, Blob: id}); err != nil {
		return err
	}
	return f.inner.Delete(id)
}

// List lists the inner backend unless injected.
func (f *Faulty) List() ([]backend.BlobID, error) {
	if _, err := f.check(Op{Kind: List}); err != nil {
		return nil, err
	}
	return f.inner.List()
}

// Sync syncs the inner backend unless injected (kind SyncMeta).
func (f *Faulty) Sync() error {
	if dropped, err := f.check(Op{Kind: SyncMeta}); dropped || err != nil {
		return err
	}
	return f.inner.Sync()
}

// Close closes the inner backend; it is never injected.
func (f *Faulty) Close() error { return f.inner.Close() }

// Identity returns the inner backend's identity.
func (f *Faulty) Identity() (backend.Identity, bool, error) { return f.inner.Identity() }

// SetIdentity records id in the inner backend.
func (f *Faulty) SetIdentity(id backend.Identity) error { return f.inner.SetIdentity(id) }

// blob wraps an inner Blob handle.
type blob struct {
	f     *Faulty      // immutable
	inner backend.Blob // immutable
}

func (b *blob) ID() backend.BlobID { return b.inner.ID() }

func (b *blob) Size() int64 { return b.inner.Size() }

func (b *blob) Close() error { return b.inner.Close() }

func (b *blob) ReadAt(p []byte, off int64) (int, error) {
	if _, err := b.f.check(Op{Kind: Read, Blob: b.inner.ID(), Off: off, Len: len(p)}); err != nil {
		return 0, err
	}
	return b.inner.ReadAt(p, off)
}

func (b *blob) WriteAt(p []byte, off int64) (int, error) {
	dropped, err := b.f.check(Op{Kind: Write, Blob: b.inner.ID(), Off: off, Len: len(p)})
	if err != nil {
		return 0, err
	}
	if dropped {
		return len(p), nil
	}
	return b.inner.WriteAt(p, off)
}

func (b *blob) Truncate(size int64) error {
	if dropped, err := b.f.check(Op{Kind: Truncate, Blob: b.inner.ID(), Off: size}); dropped || err != nil {
		return err
	}
	return b.inner.Truncate(size)
}

func (b *blob) Sync() error {
	if dropped, err := b.f.check(Op{Kind: Sync, Blob: b.inner.ID()}); dropped || err != nil {
		return err
	}
	return b.inner.Sync()
}

// FailNth returns an injector that fails the nth operation of kind
// (counting from 1, over all blobs) with err and lets every other through.
func FailNth(kind Kind, n int, err error) func(Op) error {
	var seen atomic.Int64
	return func(op Op) error {
		if op.Kind == kind && seen.Add(1) == int64(n) {
			return err
		}
		return nil
	}
}

// OnBlob returns an injector that fails every operation of kind on blob id
// with err.
func OnBlob(id backend.BlobID, kind Kind, err error) func(Op) error {
	return func(op Op) error {
		if op.Kind == kind && op.Blob == id {
			return err
		}
		return nil
	}
}

// Any returns an injector that asks each of fns in turn and returns the
// first error.
func Any(fns ...func(Op) error) func(Op) error {
	return func(op Op) error {
		for _, fn := range fns {
			if err := fn(op); err != nil {
				return err
			}
		}
		return nil
	}
}
