package ns

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"syscall"
)

// inode is one file, directory or symbolic link in memory.
type inode struct {
	attr    Attr
	target  string         // symbolic links: what the link holds
	parent  Ino            // directories: the directory that holds this one (the root: itself); 0 for files
	entries map[string]Ino // directories: name -> inode; nil for files; changed only by setEntry, dropEntry
	// sorted caches the directory's names in order, for listings by page
	// (ReadDirAfter): made at the first listing after a change, dropped by
	// every change. Stored under the namespace's read lock by listings
	// (any of them may make it), cleared under its write lock.
	sorted atomic.Pointer[[]string]
	opens  int // open handles (Open minus Release); not persisted
	// held: found without a name by recovery (it was open when the
	// service stopped) and kept for a reopen until ReleaseHeld; not
	// persisted.
	held bool
}

// setEntry makes name in directory n refer to ino.
func (n *inode) setEntry(name string, ino Ino) {
	n.entries[name] = ino
	n.sorted.Store(nil)
}

// dropEntry removes name from directory n.
func (n *inode) dropEntry(name string) {
	delete(n.entries, name)
	n.sorted.Store(nil)
}

// sortedNames returns directory n's names in order (see sorted). The
// caller holds the namespace's lock, shared at least.
func (n *inode) sortedNames() []string {
	if p := n.sorted.Load(); p != nil {
		return *p
	}
	names := slices.Sorted(maps.Keys(n.entries))
	n.sorted.Store(&names)
	return names
}

// isDir reports whether n is a directory.
func (n *inode) isDir() bool { return n.attr.IsDir() }

// isLink reports whether n is a symbolic link.
func (n *inode) isLink() bool { return n.attr.IsLink() }

// state is the whole namespace. It is changed only by apply, which both
// the live operations (after their checks) and recovery use, so the two
// cannot diverge. The caller synchronises access.
type state struct {
	inodes  map[Ino]*inode
	nextIno Ino // the number the next created inode gets
	// allocLimit is the highest allocation limit promised to the IO
	// service (alloc records); every start (boot record) moves nextIno up
	// to it.
	allocLimit Ino
	boot       bootRec
	// dead holds the blobs that await deletion at the IO service: the
	// blob of every freed file until a gone record, and orphans found in
	// the backend (dead records). It is persisted, so a delete that was
	// lost in a crash is retried after the restart.
	dead map[uint64]struct{}
}

// newState returns a namespace holding only the root directory, owned by
// root, mode 0755.
func newState(now int64) *state {
	root := &inode{
		attr:    Attr{Ino: RootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Atime: now, Mtime: now, Ctime: now},
		parent:  RootIno,
		entries: map[string]Ino{},
	}
	return &state{inodes: map[Ino]*inode{RootIno: root}, nextIno: RootIno + 1, dead: map[uint64]struct{}{}}
}

// root returns the root directory.
func (s *state) root() *inode { return s.inodes[RootIno] }

// dirFor returns the live directory ino, or an error naming it.
func (s *state) dirFor(ino Ino) (*inode, error) {
	d := s.inodes[ino]
	if d == nil || !d.isDir() || d.attr.Nlink == 0 {
		return nil, fmt.Errorf("inode %d is not a live directory", ino)
	}
	return d, nil
}

// apply performs one logged change. An error means the record does not
// fit the state: during recovery that is corruption, in the live service a
// bug (the operation's checks passed).
func (s *state) apply(r record) error {
	switch r := r.(type) {
	case *createRec:
		return s.applyCreate(r)
	case *removeRec:
		return s.applyRemove(r)
	case *renameRec:
		return s.applyRename(r)
	case *setAttrRec:
		return s.applySetAttr(r)
	case *freeRec:
		return s.applyFree(r)
	case *bootRec:
		return s.applyBoot(r)
	case *deadRec:
		return s.applyDead(r)
	case *goneRec:
		return s.applyGone(r)
	case *allocRec:
		return s.applyAlloc(r)
	case *symlinkRec:
		return s.applySymlink(r)
	case *linkRec:
		return s.applyLink(r)
	}
	return fmt.Errorf("unknown record %T", r)
}

// applyCreate adds a file or directory; the parent's mtime and ctime
// become the record's time.
func (s *state) applyCreate(r *createRec) error {
	p, err := s.dirFor(r.parent)
	if err != nil {
		return err
	}
	if !validName(r.name) {
		return fmt.Errorf("invalid name %q", r.name)
	}
	if _, ok := p.entries[r.name]; ok {
		return fmt.Errorf("create %q in %d: exists", r.name, r.parent)
	}
	if r.ino != s.nextIno || r.ino > MaxIno {
		return fmt.Errorf("create inode %d, want %d (at most %d)", r.ino, s.nextIno, MaxIno)
	}
	if !modeValid(r.mode) || r.mode&syscall.S_IFMT == syscall.S_IFLNK {
		return fmt.Errorf("invalid mode %#o", r.mode)
	}
	n := &inode{attr: Attr{Ino: r.ino, Mode: r.mode, UID: r.uid, GID: r.gid, Nlink: 1, Atime: r.time, Mtime: r.time, Ctime: r.time}}
	if n.isDir() {
		n.attr.Nlink = 2
		n.parent = r.parent
		n.entries = map[string]Ino{}
		p.attr.Nlink++
	} else {
		n.attr.Blob = uint64(r.ino)
	}
	p.setEntry(r.name, r.ino)
	p.attr.Mtime, p.attr.Ctime = r.time, r.time
	s.inodes[r.ino] = n
	s.nextIno++
	return nil
}

// applySymlink adds a symbolic link; the parent's mtime and ctime become
// the record's time.
func (s *state) applySymlink(r *symlinkRec) error {
	p, err := s.dirFor(r.parent)
	if err != nil {
		return err
	}
	if !validName(r.name) || !validTarget(r.target) {
		return fmt.Errorf("symlink: invalid name %q or target %q", r.name, r.target)
	}
	if _, ok := p.entries[r.name]; ok {
		return fmt.Errorf("symlink %q in %d: exists", r.name, r.parent)
	}
	if r.ino != s.nextIno || r.ino > MaxIno {
		return fmt.Errorf("symlink inode %d, want %d (at most %d)", r.ino, s.nextIno, MaxIno)
	}
	s.inodes[r.ino] = &inode{
		attr: Attr{Ino: r.ino, Mode: syscall.S_IFLNK | 0o777, UID: r.uid, GID: r.gid, Nlink: 1,
			Size: int64(len(r.target)), Atime: r.time, Mtime: r.time, Ctime: r.time},
		target: r.target,
	}
	p.setEntry(r.name, r.ino)
	p.attr.Mtime, p.attr.Ctime = r.time, r.time
	s.nextIno++
	return nil
}

// applyLink gives a file or symbolic link one more name (a hard link).
func (s *state) applyLink(r *linkRec) error {
	p, err := s.dirFor(r.parent)
	if err != nil {
		return err
	}
	if !validName(r.name) {
		return fmt.Errorf("link: invalid name %q", r.name)
	}
	if _, ok := p.entries[r.name]; ok {
		return fmt.Errorf("link %q in %d: exists", r.name, r.parent)
	}
	n := s.inodes[r.ino]
	if n == nil || n.isDir() || n.attr.Nlink == 0 || n.attr.Nlink >= LinkMax {
		return fmt.Errorf("link: inode %d missing, a directory, nameless or at the link limit", r.ino)
	}
	p.setEntry(r.name, r.ino)
	n.attr.Nlink++
	n.attr.Ctime = r.time
	p.attr.Mtime, p.attr.Ctime = r.time, r.time
	return nil
}

// unlinkInode drops one name of n from directory p (the entry itself is
// removed by the caller) and updates link counts and ctime.
func unlinkInode(p, n *inode, t int64) {
	if n.isDir() {
		p.attr.Nlink--
		n.attr.Nlink = 0
	} else {
		n.attr.Nlink--
	}
	n.attr.Ctime = t
}

// applyRemove removes an entry (unlink or rmdir).
func (s *state) applyRemove(r *removeRec) error {
	p, err := s.dirFor(r.parent)
	if err != nil {
		return err
	}
	ino, ok := p.entries[r.name]
	if !ok || ino != r.ino {
		return fmt.Errorf("remove %q from %d: entry is %d, want %d", r.name, r.parent, ino, r.ino)
	}
	n := s.inodes[ino]
	if n == nil {
		return fmt.Errorf("remove %q: inode %d missing", r.name, ino)
	}
	if n.isDir() && len(n.entries) != 0 {
		return fmt.Errorf("remove directory %d: not empty", ino)
	}
	p.dropEntry(r.name)
	unlinkInode(p, n, r.time)
	p.attr.Mtime, p.attr.Ctime = r.time, r.time
	if r.flags&flagFree != 0 {
		return s.drop(n)
	}
	return nil
}

// drop removes an inode that has no name left; a file's blob joins the
// blobs awaiting deletion.
func (s *state) drop(n *inode) error {
	if n.attr.Nlink != 0 || n.attr.Ino == RootIno {
		return fmt.Errorf("free inode %d with nlink %d", n.attr.Ino, n.attr.Nlink)
	}
	delete(s.inodes, n.attr.Ino)
	if n.attr.Blob != 0 {
		s.dead[n.attr.Blob] = struct{}{}
	}
	return nil
}

// isAncestor reports whether a is d or one of d's ancestors.
func (s *state) isAncestor(a, d *inode) bool {
	for {
		if d == a {
			return true
		}
		if d.attr.Ino == RootIno {
			return false
		}
		d = s.inodes[d.parent]
	}
}

// applyRename moves an entry, replacing the target if the record names
// one; it refuses a directory moving under itself.
func (s *state) applyRename(r *renameRec) error {
	op, err := s.dirFor(r.oldParent)
	if err != nil {
		return err
	}
	np, err := s.dirFor(r.newParent)
	if err != nil {
		return err
	}
	if !validName(r.oldName) || !validName(r.newName) {
		return fmt.Errorf("rename: invalid name %q or %q", r.oldName, r.newName)
	}
	if ino, ok := op.entries[r.oldName]; !ok || ino != r.ino {
		return fmt.Errorf("rename %q in %d: entry is %d, want %d", r.oldName, r.oldParent, ino, r.ino)
	}
	src := s.inodes[r.ino]
	if src == nil {
		return fmt.Errorf("rename: inode %d missing", r.ino)
	}
	if src.isDir() && s.isAncestor(src, np) {
		return fmt.Errorf("rename directory %d under itself", r.ino)
	}
	tino, exists := np.entries[r.newName]
	if tino != r.replaced {
		return fmt.Errorf("rename onto %q in %d: entry is %d, want %d", r.newName, r.newParent, tino, r.replaced)
	}
	var tgt *inode
	if exists {
		if tgt = s.inodes[tino]; tgt == nil || tgt == src {
			return fmt.Errorf("rename onto inode %d: missing or the source", tino)
		}
		if tgt.isDir() != src.isDir() || (tgt.isDir() && len(tgt.entries) != 0) {
			return fmt.Errorf("rename %d onto %d: incompatible target", r.ino, tino)
		}
	} else if r.flags&flagFree != 0 {
		return fmt.Errorf("rename frees a target that does not exist")
	}
	if tgt != nil {
		unlinkInode(np, tgt, r.time)
	}
	op.dropEntry(r.oldName)
	np.setEntry(r.newName, r.ino)
	if src.isDir() && op != np {
		op.attr.Nlink--
		np.attr.Nlink++
		src.parent = np.attr.Ino
	}
	op.attr.Mtime, op.attr.Ctime = r.time, r.time
	np.attr.Mtime, np.attr.Ctime = r.time, r.time
	src.attr.Ctime = r.time
	if tgt != nil && r.flags&flagFree != 0 {
		return s.drop(tgt)
	}
	return nil
}

// applySetAttr sets the fields the mask selects; the type bits of the
// mode and the size of a directory cannot change.
func (s *state) applySetAttr(r *setAttrRec) error {
	n := s.inodes[r.ino]
	if n == nil {
		return fmt.Errorf("setattr: inode %d missing", r.ino)
	}
	if r.mask&^setAll != 0 {
		return fmt.Errorf("setattr: unknown mask bits %#x", r.mask)
	}
	if r.mask&setMode != 0 && (!modeValid(r.mode) || r.mode&syscall.S_IFMT != n.attr.Mode&syscall.S_IFMT) {
		return fmt.Errorf("setattr: mode %#o does not fit inode %d (%#o)", r.mode, r.ino, n.attr.Mode)
	}
	if r.mask&setSize != 0 && (r.size < 0 || !n.attr.IsReg()) {
		return fmt.Errorf("setattr: size %d on inode %d", r.size, r.ino)
	}
	a := &n.attr
	if r.mask&setMode != 0 {
		a.Mode = r.mode
	}
	if r.mask&setUID != 0 {
		a.UID = r.uid
	}
	if r.mask&setGID != 0 {
		a.GID = r.gid
	}
	if r.mask&setSize != 0 {
		a.Size = r.size
	}
	if r.mask&setAtime != 0 {
		a.Atime = r.atime
	}
	if r.mask&setMtime != 0 {
		a.Mtime = r.mtime
	}
	if r.mask&setCtime != 0 {
		a.Ctime = r.ctime
	}
	return nil
}

// applyFree drops an inode with no name left.
func (s *state) applyFree(r *freeRec) error {
	n := s.inodes[r.ino]
	if n == nil {
		return fmt.Errorf("free: inode %d missing", r.ino)
	}
	return s.drop(n)
}

// applyBoot starts an incarnation: it must be newer than the last, and
// the stack id and ticket key may be chosen only once.
func (s *state) applyBoot(r *bootRec) error {
	if r.incarnation <= s.boot.incarnation || r.incarnation > MaxIncarnation {
		return fmt.Errorf("boot: incarnation %d after %d", r.incarnation, s.boot.incarnation)
	}
	if r.stackID == ([16]byte{}) || r.key == ([32]byte{}) {
		return fmt.Errorf("boot: zero stack id or key")
	}
	if s.boot.incarnation != 0 && (r.stackID != s.boot.stackID || r.key != s.boot.key) {
		return fmt.Errorf("boot: stack id or ticket key changed")
	}
	s.boot = *r
	// Blobs below the limit promised before may exist without a create
	// record (lost in a power cut): this incarnation's files start above.
	s.nextIno = max(s.nextIno, s.allocLimit)
	return nil
}

// MaxIno is the largest inode (and blob) number. A create past it is
// ENOSPC; a blob past it is never an inode's, so it cannot move the
// allocation counter (which it would wrap).
const MaxIno Ino = 1<<48 - 1

// applyDead adds an orphan blob (one that belongs to no inode) to the
// blobs awaiting deletion.
func (s *state) applyDead(r *deadRec) error {
	if r.blob == 0 || Ino(r.blob) > MaxIno {
		return fmt.Errorf("dead: blob %d outside [1, %d]", r.blob, MaxIno)
	}
	if n := s.inodes[Ino(r.blob)]; n != nil && n.attr.Blob == r.blob {
		return fmt.Errorf("dead: blob %d belongs to inode %d", r.blob, r.blob)
	}
	if _, ok := s.dead[r.blob]; ok {
		return fmt.Errorf("dead: blob %d already awaits deletion", r.blob)
	}
	s.dead[r.blob] = struct{}{}
	// An orphan at or past the allocation counter (left by a create whose
	// record a power cut lost) must never be claimed by a new inode.
	if Ino(r.blob) >= s.nextIno {
		s.nextIno = Ino(r.blob) + 1
	}
	return nil
}

// applyAlloc raises the allocation limit promised to the IO service.
func (s *state) applyAlloc(r *allocRec) error {
	if r.limit == 0 || r.limit > MaxIno+1 {
		return fmt.Errorf("alloc: limit %d outside [1, %d]", r.limit, MaxIno+1)
	}
	s.allocLimit = max(s.allocLimit, r.limit)
	return nil
}

// applyGone records that a blob awaiting deletion was deleted.
func (s *state) applyGone(r *goneRec) error {
	if _, ok := s.dead[r.blob]; !ok {
		return fmt.Errorf("gone: blob %d does not await deletion", r.blob)
	}
	delete(s.dead, r.blob)
	return nil
}
