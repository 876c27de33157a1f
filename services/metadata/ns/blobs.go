package ns

import (
	"cmp"
	"slices"
	"syscall"
)

// Blob lifecycle and reopening after a restart.
//
// A file's blob outlives its inode until the IO service has deleted it:
// freeing the inode (last name and last open gone) puts the blob in the
// set of blobs awaiting deletion, persisted with the namespace, and
// BlobGone takes it out once io confirmed. So a delete lost in a crash of
// any service is retried after the restart, and `weir check` can tell a
// pending delete from a leak. Orphans that the metadata service finds in
// the backend (blobs of no inode: a create that raced a crash) join the set
// with MarkDead.

// PendingDeletes returns the blobs awaiting deletion, ascending.
func (n *NS) PendingDeletes() []uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make([]uint64, 0, len(n.st.dead))
	for b := range n.st.dead {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// PendingDelete reports whether blob awaits deletion.
func (n *NS) PendingDelete(blob uint64) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	_, ok := n.st.dead[blob]
	return ok
}

// BlobGone records that the IO service deleted blob, which awaited
// deletion. A blob that does not await deletion is ENOENT (nothing is
// logged). The record need not be durable at once: a crash before it is
// only a retried delete.
func (n *NS) BlobGone(blob uint64) error {
	if err := n.lockMut(); err != nil {
		return err
	}
	var lsn uint64
	var err error
	if _, ok := n.st.dead[blob]; !ok {
		err = syscall.ENOENT
	} else {
		lsn, err = n.logLocked(&goneRec{blob: blob})
	}
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return n.finish(lsn)
}

// PromiseAlloc records, durably, that the IO service is about to be told
// that blob ids below limit are allocated; the caller tells it only after
// PromiseAlloc returned. Every later start numbers new inodes from the
// highest limit promised (see allocRec). A limit not above the last one
// promised costs nothing; one of 0 or past MaxIno+1 is EINVAL.
func (n *NS) PromiseAlloc(limit uint64) error {
	if limit == 0 || Ino(limit) > MaxIno+1 {
		return syscall.EINVAL
	}
	if err := n.lockMut(); err != nil {
		return err
	}
	var lsn uint64
	var err error
	if Ino(limit) > n.st.allocLimit {
		lsn, err = n.logLocked(&allocRec{limit: Ino(limit)})
	}
	n.mu.Unlock()
	if err != nil || lsn == 0 {
		return err
	}
	if err := n.finish(lsn); err != nil {
		return err
	}
	if err := n.w.WaitDurable(lsn); err != nil {
		return &IOError{Op: "flush WAL", Err: err}
	}
	return nil
}

// AllocLimit is the highest allocation limit promised (PromiseAlloc), in
// this life or an earlier one (0: none).
func (n *NS) AllocLimit() uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return uint64(n.st.allocLimit)
}

// MarkDead makes blob, which the backend holds but no inode owns, await
// deletion. Blob 0 or one past MaxIno is EINVAL; a blob that some inode
// owns is EEXIST (it is no orphan); one at or past the allocation counter
// moves the counter past it, so that no new inode ever claims it; one
// already awaiting deletion is a no-op.
func (n *NS) MarkDead(blob uint64) error {
	if blob == 0 || Ino(blob) > MaxIno {
		return syscall.EINVAL
	}
	if err := n.lockMut(); err != nil {
		return err
	}
	var lsn uint64
	var err error
	_, dead := n.st.dead[blob]
	switch nd := n.st.inodes[Ino(blob)]; {
	case nd != nil && nd.attr.Blob == blob:
		err = syscall.EEXIST
	case !dead:
		lsn, err = n.logLocked(&deadRec{blob: blob})
	}
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return n.finish(lsn)
}

// Held returns the inodes recovery found without a name that are still
// held for a reopen, ascending.
func (n *NS) Held() []Ino {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []Ino
	for ino, nd := range n.st.inodes {
		if nd.held {
			out = append(out, ino)
		}
	}
	slices.Sort(out)
	return out
}

// ReleaseHeld frees every inode recovery found without a name that
// nobody reopened since, and returns their blobs (now awaiting deletion),
// ascending. The metadata service calls it once its clients have had time
// to reopen their files.
func (n *NS) ReleaseHeld() ([]uint64, error) {
	if err := n.lockMut(); err != nil {
		return nil, err
	}
	var held []*inode
	for _, nd := range n.st.inodes {
		if nd.held && nd.opens == 0 {
			held = append(held, nd)
		}
	}
	slices.SortFunc(held, func(a, b *inode) int { return cmp.Compare(a.attr.Ino, b.attr.Ino) })
	var blobs []uint64
	var lsn uint64
	var err error
	for _, nd := range held {
		blob := nd.attr.Blob
		if lsn, err = n.logLocked(&freeRec{ino: nd.attr.Ino}); err != nil {
			break
		}
		if blob != 0 {
			blobs = append(blobs, blob)
		}
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	return blobs, err
}

// Reopen opens inode ino again, by number, for c with open flags: the
// metadata service does so for a client that held it open before a
// restart and proves it with a ticket. A file that still has a name must
// still allow c the access unless c owns it (EACCES otherwise): a ticket
// outlives the handle it was issued for, so it is not let past a chmod of
// another's file; an owner can chmod anyway, and a file created 0444 and
// written through its creating handle keeps working. A file
// unlinked while open (held) is checked for nothing but existence, as an
// open file descriptor keeps working, and stops being held. The open
// counts until Release, as Open's does.
func (n *NS) Reopen(c Cred, ino Ino, flags int) (Attr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return Attr{}, errClosed
	}
	nd := n.st.inodes[ino]
	if nd == nil {
		return Attr{}, syscall.ENOENT
	}
	if nd.attr.Nlink != 0 && c.UID != nd.attr.UID {
		mask := mayRead
		switch flags & syscall.O_ACCMODE {
		case syscall.O_WRONLY:
			mask = mayWrite
		case syscall.O_RDWR:
			mask = mayRead | mayWrite
		}
		if err := permission(&c, &nd.attr, mask); err != nil {
			return Attr{}, err
		}
	}
	nd.opens++
	nd.held = false
	return nd.attr, nil
}

// NextIno is the number the next created inode will get: every blob id
// below it may belong to a file.
func (n *NS) NextIno() uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return uint64(n.st.nextIno)
}
