package ns

import (
	"cmp"
	"slices"
	"strings"
	"syscall"
)

// Stat returns the attributes of path.
func (n *NS) Stat(c Cred, path string) (Attr, error) { return n.StatAt(c, RootIno, path) }

// StatAt is Stat of a path relative to directory dir (RootIno: the root),
// as fstatat(2); a final symbolic link is followed (*FollowError).
func (n *NS) StatAt(c Cred, dir Ino, path string) (Attr, error) { return n.stat(c, dir, path, true) }

// LstatAt is StatAt that answers a final symbolic link itself, as
// fstatat(AT_SYMLINK_NOFOLLOW).
func (n *NS) LstatAt(c Cred, dir Ino, path string) (Attr, error) { return n.stat(c, dir, path, false) }

func (n *NS) stat(c Cred, dir Ino, path string, followLast bool) (Attr, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return Attr{}, errClosed
	}
	start, err := n.st.startDir(dir)
	if err != nil {
		return Attr{}, err
	}
	nd, err := n.st.resolveAt(&c, start, path, followLast)
	if err != nil {
		return Attr{}, err
	}
	return nd.attr, nil
}

// ReadlinkAt returns the target of the symbolic link path (relative to
// dir), as readlinkat(2): EINVAL if it is no link.
func (n *NS) ReadlinkAt(c Cred, dir Ino, path string) (string, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return "", errClosed
	}
	start, err := n.st.startDir(dir)
	if err != nil {
		return "", err
	}
	nd, err := n.st.resolveAt(&c, start, path, false)
	if err != nil {
		return "", err
	}
	if !nd.isLink() {
		return "", syscall.EINVAL
	}
	return nd.target, nil
}

// SymlinkAt creates the symbolic link path (relative to dir) holding
// target, as symlinkat(2): owned by the caller, mode 0777, in a setgid
// directory of its group. An empty target is ENOENT, one of PATH_MAX
// bytes or more ENAMETOOLONG, a NUL in it EINVAL; an existing path
// (a dangling link too) is EEXIST, a nonexistent one with a trailing
// slash ENOENT.
func (n *NS) SymlinkAt(c Cred, target string, dir Ino, path string) (Attr, error) {
	if err := checkPath(target); err != nil {
		return Attr{}, err
	}
	if err := n.lockMut(); err != nil {
		return Attr{}, err
	}
	var a Attr
	var lsn uint64
	start, err := n.st.startDir(dir)
	if err == nil {
		a, lsn, err = n.symlinkLocked(&c, target, start, path)
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	if err != nil {
		return Attr{}, err
	}
	return a, nil
}

// symlinkLocked is SymlinkAt with mu held for writing, in
// filename_create's and vfs_symlink's order of checks.
func (n *NS) symlinkLocked(c *Cred, target string, start *inode, path string) (Attr, uint64, error) {
	s := n.st
	w, err := s.walkAt(c, start, path)
	if err != nil {
		return Attr{}, 0, err
	}
	if err := s.creatable(c, w); err != nil {
		return Attr{}, 0, err
	}
	rec := &symlinkRec{
		parent: w.dir.attr.Ino, ino: s.nextIno, uid: c.UID, gid: newGID(c, w.dir),
		time: n.now(), name: w.name, target: target,
	}
	lsn, err := n.logLocked(rec)
	if err != nil {
		return Attr{}, 0, err
	}
	return s.inodes[rec.ino].attr, lsn, nil
}

// creatable is filename_create's and may_create's checks of a new name
// at the walked path w: EEXIST for ".", "..", the root or an existing
// entry; ENOENT for a trailing slash; EACCES without write and search
// permission on the directory; ENOENT in a removed one; ENOSPC when no
// inode number is left.
func (s *state) creatable(c *Cred, w walked) error {
	if w.kind != lastNorm {
		return syscall.EEXIST
	}
	switch _, err := s.step(w.dir, w.name); err {
	case nil:
		return syscall.EEXIST
	case syscall.ENOENT:
	default:
		return err
	}
	if w.slash {
		return syscall.ENOENT
	}
	if err := permission(c, &w.dir.attr, mayWrite|mayExec); err != nil {
		return err
	}
	if w.dir.attr.Nlink == 0 {
		return syscall.ENOENT // a removed directory
	}
	if s.nextIno > MaxIno {
		return syscall.ENOSPC // inode numbers are never reused
	}
	return nil
}

// LinkAt gives the file or symbolic link oldpath (relative to olddir) the
// further name newpath (relative to newdir), as linkat(2); a final
// symbolic link of oldpath is followed only with followOld
// (AT_SYMLINK_FOLLOW). Errors in do_linkat's order: oldpath's; EEXIST or
// ENOENT (trailing slash) for newpath; EPERM where
// fs.protected_hardlinks forbids it (see the package comment); EACCES
// without write and search permission on the new directory; EPERM for a
// directory; EMLINK at LinkMax names.
func (n *NS) LinkAt(c Cred, olddir Ino, oldpath string, newdir Ino, newpath string, followOld bool) (Attr, error) {
	if strings.IndexByte(oldpath, 0) >= 0 || strings.IndexByte(newpath, 0) >= 0 {
		return Attr{}, syscall.EINVAL
	}
	if err := n.lockMut(); err != nil {
		return Attr{}, err
	}
	var a Attr
	var lsn uint64
	ostart, err := n.st.startDir(olddir)
	var nstart *inode
	if err == nil {
		nstart, err = n.st.startDir(newdir)
	}
	if err == nil {
		a, lsn, err = n.linkLocked(&c, ostart, oldpath, nstart, newpath, followOld)
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	if err != nil {
		return Attr{}, err
	}
	return a, nil
}

// linkLocked is LinkAt with mu held for writing.
func (n *NS) linkLocked(c *Cred, ostart *inode, oldpath string, nstart *inode, newpath string, followOld bool) (Attr, uint64, error) {
	s := n.st
	src, err := s.resolveAt(c, ostart, oldpath, followOld)
	if err != nil {
		return Attr{}, 0, err
	}
	w, err := s.walkAt(c, nstart, newpath)
	if err != nil {
		return Attr{}, 0, second(err)
	}
	if w.kind != lastNorm {
		return Attr{}, 0, syscall.EEXIST
	}
	switch _, err := s.step(w.dir, w.name); err {
	case nil:
		return Attr{}, 0, syscall.EEXIST
	case syscall.ENOENT:
	default:
		return Attr{}, 0, err
	}
	if w.slash {
		return Attr{}, 0, syscall.ENOENT
	}
	if !isOwner(c, &src.attr) {
		m := src.attr.Mode
		if !src.attr.IsReg() || m&syscall.S_ISUID != 0 || m&(syscall.S_ISGID|syscall.S_IXGRP) == syscall.S_ISGID|syscall.S_IXGRP ||
			permission(c, &src.attr, mayRead|mayWrite) != nil {
			return Attr{}, 0, syscall.EPERM
		}
	}
	if err := permission(c, &w.dir.attr, mayWrite|mayExec); err != nil {
		return Attr{}, 0, err
	}
	if w.dir.attr.Nlink == 0 {
		return Attr{}, 0, syscall.ENOENT // a removed directory
	}
	switch {
	case src.isDir():
		return Attr{}, 0, syscall.EPERM
	case src.attr.Nlink == 0:
		return Attr{}, 0, syscall.ENOENT // unlinked, still open
	case src.attr.Nlink >= LinkMax:
		return Attr{}, 0, syscall.EMLINK
	}
	lsn, err := n.logLocked(&linkRec{parent: w.dir.attr.Ino, ino: src.attr.Ino, time: n.now(), name: w.name})
	if err != nil {
		return Attr{}, 0, err
	}
	return src.attr, lsn, nil
}

// GetAttr returns the attributes of inode ino, named or not (trusted
// callers only: no permission check).
func (n *NS) GetAttr(ino Ino) (Attr, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return Attr{}, errClosed
	}
	nd := n.st.inodes[ino]
	if nd == nil {
		return Attr{}, syscall.ENOENT
	}
	return nd.attr, nil
}

// Open opens path as open(2) does and counts the open until Release.
// flags are O_RDONLY, O_WRONLY or O_RDWR with O_CREAT, O_EXCL, O_TRUNC and
// O_DIRECTORY (other bits are ignored); mode is the permission bits of a
// created file after the client's umask. Reading needs read permission,
// writing or O_TRUNC write permission; creating needs write and search
// permission on the parent; writing a directory is EISDIR. O_TRUNC sets
// Size to 0 (the caller truncates the blob). created reports whether the
// file was created.
func (n *NS) Open(c Cred, path string, flags int, mode uint32) (a Attr, created bool, err error) {
	return n.OpenAt(c, RootIno, path, flags, mode)
}

// OpenAt is Open of a path relative to directory dir, as openat(2).
func (n *NS) OpenAt(c Cred, dir Ino, path string, flags int, mode uint32) (a Attr, created bool, err error) {
	if flags&syscall.O_CREAT != 0 && flags&syscall.O_DIRECTORY != 0 {
		return Attr{}, false, syscall.EINVAL // Linux 6.4 and later
	}
	var lsn uint64
	if flags&(syscall.O_CREAT|syscall.O_TRUNC) != 0 {
		if err := n.lockMut(); err != nil {
			return Attr{}, false, err
		}
	} else {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return Attr{}, false, errClosed
		}
	}
	var start *inode
	if start, err = n.st.startDir(dir); err == nil {
		a, created, lsn, err = n.openLocked(&c, start, path, flags, mode)
	}
	n.mu.Unlock()
	if err != nil {
		return Attr{}, false, err
	}
	if err := n.finish(lsn); err != nil {
		return Attr{}, false, err
	}
	return a, created, nil
}

// openLocked is Open with mu held for writing; it returns the LSN of the
// logged record (0 if nothing was logged).
func (n *NS) openLocked(c *Cred, start *inode, path string, flags int, mode uint32) (Attr, bool, uint64, error) {
	s := n.st
	w, err := s.walkAt(c, start, path)
	if err != nil {
		return Attr{}, false, 0, err
	}
	var nd *inode
	if flags&syscall.O_CREAT != 0 {
		if w.kind != lastNorm {
			if flags&syscall.O_EXCL != 0 {
				return Attr{}, false, 0, syscall.EEXIST
			}
			return Attr{}, false, 0, syscall.EISDIR
		}
		if w.slash {
			return Attr{}, false, 0, syscall.EISDIR
		}
		nd, err = s.step(w.dir, w.name)
		if err == nil && nd.isLink() {
			switch {
			case flags&syscall.O_EXCL != 0:
				return Attr{}, false, 0, syscall.EEXIST
			case flags&syscall.O_NOFOLLOW != 0:
				return Attr{}, false, 0, syscall.ELOOP
			}
			// O_CREAT through a link: its target is opened or created.
			return Attr{}, false, 0, follow(c, w.dir, nd, w.at, w.at+len(w.name))
		}
		switch {
		case err == syscall.ENOENT:
			if err := permission(c, &w.dir.attr, mayWrite|mayExec); err != nil {
				return Attr{}, false, 0, err
			}
			if w.dir.attr.Nlink == 0 {
				return Attr{}, false, 0, syscall.ENOENT // a removed directory
			}
			if s.nextIno > MaxIno {
				return Attr{}, false, 0, syscall.ENOSPC // inode numbers are never reused
			}
			rec := &createRec{
				parent: w.dir.attr.Ino, ino: s.nextIno,
				mode: syscall.S_IFREG | newFileMode(c, w.dir, mode),
				uid:  c.UID, gid: newGID(c, w.dir), time: n.now(), name: w.name,
			}
			lsn, err := n.logLocked(rec)
			if err != nil {
				return Attr{}, false, 0, err
			}
			nd = s.inodes[rec.ino]
			nd.opens++
			return nd.attr, true, lsn, nil
		case err != nil:
			return Attr{}, false, 0, err
		case flags&syscall.O_EXCL != 0:
			return Attr{}, false, 0, syscall.EEXIST
		case nd.isDir():
			return Attr{}, false, 0, syscall.EISDIR
		}
	} else if nd, err = s.final(c, w, flags&syscall.O_NOFOLLOW == 0); err != nil {
		return Attr{}, false, 0, err
	} else if nd.isLink() {
		return Attr{}, false, 0, syscall.ELOOP // O_NOFOLLOW
	}
	if flags&syscall.O_DIRECTORY != 0 && !nd.isDir() {
		return Attr{}, false, 0, syscall.ENOTDIR
	}
	var mask uint32
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		mask = mayRead
	case syscall.O_WRONLY:
		mask = mayWrite
	default: // O_RDWR, and 3, which Linux checks as read and write
		mask = mayRead | mayWrite
	}
	if flags&syscall.O_TRUNC != 0 {
		mask |= mayWrite
	}
	if nd.isDir() && mask&mayWrite != 0 {
		return Attr{}, false, 0, syscall.EISDIR
	}
	if err := permission(c, &nd.attr, mask); err != nil {
		return Attr{}, false, 0, err
	}
	var lsn uint64
	if flags&syscall.O_TRUNC != 0 {
		t := n.now()
		rec := &setAttrRec{ino: nd.attr.Ino, mask: setSize | setMtime | setCtime, mtime: t, ctime: t}
		if m, changed := killPrivOnTruncate(c, &nd.attr); changed {
			rec.mask |= setMode
			rec.mode = m
		}
		if lsn, err = n.logLocked(rec); err != nil {
			return Attr{}, false, 0, err
		}
	}
	nd.opens++
	return nd.attr, false, lsn, nil
}

// newFileMode is the mode of a regular file created by c in dir with
// requested permission bits mode: the kernel's mode_strip_sgid drops a
// real setgid bit when dir is setgid and c is not in its group.
func newFileMode(c *Cred, dir *inode, mode uint32) uint32 {
	mode &= 0o7777
	const real = syscall.S_ISGID | syscall.S_IXGRP
	if mode&real == real && dir.attr.Mode&syscall.S_ISGID != 0 && !c.isRoot() && !c.inGroup(dir.attr.GID) {
		mode &^= syscall.S_ISGID
	}
	return mode
}

// newGID is the group of an inode created by c in dir: dir's group if dir
// is setgid, else c's.
func newGID(c *Cred, dir *inode) uint32 {
	if dir.attr.Mode&syscall.S_ISGID != 0 {
		return dir.attr.GID
	}
	return c.GID
}

// Release ends one open of ino. If that was the last open of an inode with
// no name left, the inode is removed and its blob returned for the caller
// to delete (0 if it has none). An inode that is not open gives EBADF.
func (n *NS) Release(ino Ino) (freeBlob uint64, err error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return 0, errClosed
	}
	nd := n.st.inodes[ino]
	switch {
	case nd == nil:
		n.mu.Unlock()
		return 0, syscall.ENOENT
	case nd.opens == 0:
		n.mu.Unlock()
		return 0, syscall.EBADF
	}
	nd.opens--
	var lsn uint64
	if nd.opens == 0 && nd.attr.Nlink == 0 {
		freeBlob = nd.attr.Blob
		lsn, err = n.logLocked(&freeRec{ino: ino})
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	if err != nil {
		return 0, err
	}
	return freeBlob, nil
}

// Mkdir creates directory path with permission bits mode & 01777 (after
// the client's umask). In a setgid directory the new directory takes the
// parent's group and is setgid too.
func (n *NS) Mkdir(c Cred, path string, mode uint32) (Attr, error) {
	return n.MkdirAt(c, RootIno, path, mode)
}

// MkdirAt is Mkdir of a path relative to directory dir, as mkdirat(2).
func (n *NS) MkdirAt(c Cred, dir Ino, path string, mode uint32) (Attr, error) {
	if err := n.lockMut(); err != nil {
		return Attr{}, err
	}
	var a Attr
	var lsn uint64
	start, err := n.st.startDir(dir)
	if err == nil {
		a, lsn, err = n.mkdirLocked(&c, start, path, mode)
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	if err != nil {
		return Attr{}, err
	}
	return a, nil
}

// mkdirLocked is Mkdir with mu held for writing.
func (n *NS) mkdirLocked(c *Cred, start *inode, path string, mode uint32) (Attr, uint64, error) {
	s := n.st
	w, err := s.walkAt(c, start, path)
	if err != nil {
		return Attr{}, 0, err
	}
	if w.kind != lastNorm {
		return Attr{}, 0, syscall.EEXIST
	}
	switch _, err := s.step(w.dir, w.name); err {
	case nil:
		return Attr{}, 0, syscall.EEXIST
	case syscall.ENOENT:
	default:
		return Attr{}, 0, err
	}
	if err := permission(c, &w.dir.attr, mayWrite|mayExec); err != nil {
		return Attr{}, 0, err
	}
	if w.dir.attr.Nlink == 0 {
		return Attr{}, 0, syscall.ENOENT // a removed directory
	}
	if s.nextIno > MaxIno {
		return Attr{}, 0, syscall.ENOSPC // inode numbers are never reused
	}
	mode &= 0o1777
	if w.dir.attr.Mode&syscall.S_ISGID != 0 {
		mode |= syscall.S_ISGID
	}
	rec := &createRec{
		parent: w.dir.attr.Ino, ino: s.nextIno, mode: syscall.S_IFDIR | mode,
		uid: c.UID, gid: newGID(c, w.dir), time: n.now(), name: w.name,
	}
	lsn, err := n.logLocked(rec)
	if err != nil {
		return Attr{}, 0, err
	}
	return s.inodes[rec.ino].attr, lsn, nil
}

// Rmdir removes the empty directory path. An open directory lives on,
// nameless, until its last Release.
func (n *NS) Rmdir(c Cred, path string) error { return n.RmdirAt(c, RootIno, path) }

// RmdirAt is Rmdir of a path relative to directory dir, as
// unlinkat(AT_REMOVEDIR).
func (n *NS) RmdirAt(c Cred, dir Ino, path string) error {
	if err := n.lockMut(); err != nil {
		return err
	}
	var lsn uint64
	start, err := n.st.startDir(dir)
	if err == nil {
		lsn, err = n.rmdirLocked(&c, start, path)
	}
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return n.finish(lsn)
}

// rmdirLocked is Rmdir with mu held for writing, in do_rmdir's order of
// checks.
func (n *NS) rmdirLocked(c *Cred, start *inode, path string) (uint64, error) {
	s := n.st
	w, err := s.walkAt(c, start, path)
	if err != nil {
		return 0, err
	}
	switch w.kind {
	case lastDotDot:
		return 0, syscall.ENOTEMPTY
	case lastDot:
		return 0, syscall.EINVAL
	case lastRoot:
		return 0, syscall.EBUSY
	}
	child, err := s.step(w.dir, w.name)
	if err != nil {
		return 0, err
	}
	if err := mayDelete(c, w.dir, child, true); err != nil {
		return 0, err
	}
	if len(child.entries) != 0 {
		return 0, syscall.ENOTEMPTY
	}
	rec := &removeRec{parent: w.dir.attr.Ino, ino: child.attr.Ino, time: n.now(), name: w.name}
	if child.opens == 0 {
		rec.flags = flagFree
	}
	return n.logLocked(rec)
}

// Unlink removes the file path. If nobody has it open its blob is returned
// for the caller to delete; otherwise the inode lives on, nameless, and
// the last Release returns the blob.
func (n *NS) Unlink(c Cred, path string) (freeBlob uint64, err error) {
	return n.UnlinkAt(c, RootIno, path)
}

// UnlinkAt is Unlink of a path relative to directory dir, as unlinkat(2).
func (n *NS) UnlinkAt(c Cred, dir Ino, path string) (freeBlob uint64, err error) {
	if err := n.lockMut(); err != nil {
		return 0, err
	}
	var lsn uint64
	start, err := n.st.startDir(dir)
	if err == nil {
		freeBlob, lsn, err = n.unlinkLocked(&c, start, path)
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	if err != nil {
		return 0, err
	}
	return freeBlob, nil
}

// unlinkLocked is Unlink with mu held for writing, in do_unlinkat's order
// of checks (a trailing slash is judged before permissions).
func (n *NS) unlinkLocked(c *Cred, start *inode, path string) (uint64, uint64, error) {
	s := n.st
	w, err := s.walkAt(c, start, path)
	if err != nil {
		return 0, 0, err
	}
	if w.kind != lastNorm {
		return 0, 0, syscall.EISDIR
	}
	child, err := s.step(w.dir, w.name)
	if err != nil {
		return 0, 0, err
	}
	if w.slash {
		if child.isDir() {
			return 0, 0, syscall.EISDIR
		}
		return 0, 0, syscall.ENOTDIR
	}
	if err := mayDelete(c, w.dir, child, false); err != nil {
		return 0, 0, err
	}
	rec := &removeRec{parent: w.dir.attr.Ino, ino: child.attr.Ino, time: n.now(), name: w.name}
	var blob uint64
	if child.opens == 0 && child.attr.Nlink == 1 {
		rec.flags = flagFree
		blob = child.attr.Blob
	}
	lsn, err := n.logLocked(rec)
	if err != nil {
		return 0, 0, err
	}
	return blob, lsn, nil
}

// Rename renames oldpath to newpath with rename(2) semantics, replacing an
// existing newpath of the same kind (a directory only if empty). When the
// replaced file is not open its blob is returned for the caller to delete.
func (n *NS) Rename(c Cred, oldpath, newpath string) (freeBlob uint64, err error) {
	return n.RenameAt(c, RootIno, oldpath, RootIno, newpath)
}

// RenameAt is Rename with each path relative to its own directory, as
// renameat(2).
func (n *NS) RenameAt(c Cred, olddir Ino, oldpath string, newdir Ino, newpath string) (freeBlob uint64, err error) {
	if strings.IndexByte(oldpath, 0) >= 0 || strings.IndexByte(newpath, 0) >= 0 {
		return 0, syscall.EINVAL
	}
	if err := n.lockMut(); err != nil {
		return 0, err
	}
	var lsn uint64
	ostart, err := n.st.startDir(olddir)
	var nstart *inode
	if err == nil {
		nstart, err = n.st.startDir(newdir)
	}
	if err == nil {
		freeBlob, lsn, err = n.renameLocked(&c, ostart, oldpath, nstart, newpath)
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	if err != nil {
		return 0, err
	}
	return freeBlob, nil
}

// renameLocked follows the kernel's do_renameat2 and vfs_rename, check by
// check, so that the first failing check gives the errno Linux gives.
func (n *NS) renameLocked(c *Cred, ostart *inode, oldpath string, nstart *inode, newpath string) (uint64, uint64, error) {
	s := n.st
	ow, err := s.walkAt(c, ostart, oldpath)
	if err != nil {
		return 0, 0, err
	}
	nw, err := s.walkAt(c, nstart, newpath)
	if err != nil {
		return 0, 0, second(err)
	}
	if ow.kind != lastNorm || nw.kind != lastNorm {
		return 0, 0, syscall.EBUSY
	}
	src, err := s.step(ow.dir, ow.name)
	if err != nil {
		return 0, 0, err
	}
	tgt, err := s.step(nw.dir, nw.name)
	switch err {
	case nil:
	case syscall.ENOENT:
		tgt = nil
	default:
		return 0, 0, err
	}
	if !src.isDir() && (ow.slash || nw.slash) {
		return 0, 0, syscall.ENOTDIR
	}
	if trap := s.trap(nw.dir, ow.dir); trap != nil {
		if src == trap {
			return 0, 0, syscall.EINVAL
		}
		if tgt == trap {
			return 0, 0, syscall.ENOTEMPTY
		}
	}
	if src == tgt {
		return 0, 0, nil
	}
	if err := mayDelete(c, ow.dir, src, src.isDir()); err != nil {
		return 0, 0, err
	}
	if tgt == nil {
		err = permission(c, &nw.dir.attr, mayWrite|mayExec)
		if err == nil && nw.dir.attr.Nlink == 0 {
			err = syscall.ENOENT // a removed directory
		}
	} else {
		err = mayDelete(c, nw.dir, tgt, src.isDir())
	}
	if err != nil {
		return 0, 0, err
	}
	if ow.dir != nw.dir && src.isDir() {
		// The directory's ".." changes: that needs write permission on it.
		if err := permission(c, &src.attr, mayWrite); err != nil {
			return 0, 0, err
		}
	}
	if tgt != nil && tgt.isDir() && len(tgt.entries) != 0 {
		return 0, 0, syscall.ENOTEMPTY
	}
	rec := &renameRec{
		oldParent: ow.dir.attr.Ino, newParent: nw.dir.attr.Ino, ino: src.attr.Ino,
		time: n.now(), oldName: ow.name, newName: nw.name,
	}
	var blob uint64
	if tgt != nil {
		rec.replaced = tgt.attr.Ino
		if tgt.opens == 0 && (tgt.isDir() || tgt.attr.Nlink == 1) {
			rec.flags = flagFree
			blob = tgt.attr.Blob
		}
	}
	lsn, err := n.logLocked(rec)
	if err != nil {
		return 0, 0, err
	}
	return blob, lsn, nil
}

// setAttr runs a change of attributes on path: check resolves the inode
// and returns the record to log (nil: nothing to change).
func (n *NS) setAttr(c *Cred, at target, check func(nd *inode) (*setAttrRec, error)) (Attr, error) {
	if err := n.lockMut(); err != nil {
		return Attr{}, err
	}
	nd, err := at.resolve(n.st, c)
	var rec *setAttrRec
	if err == nil {
		rec, err = check(nd)
	}
	var lsn uint64
	if err == nil && rec != nil {
		lsn, err = n.logLocked(rec)
	}
	var a Attr
	if err == nil {
		a = nd.attr
	}
	n.mu.Unlock()
	if err == nil {
		err = n.finish(lsn)
	}
	if err != nil {
		return Attr{}, err
	}
	return a, nil
}

// target is what an attribute change applies to: a path from a
// directory, or an open inode (fchmod and friends).
type target struct {
	dir      Ino
	path     string
	ino      Ino
	byIno    bool
	nofollow bool // a final symbolic link is the target (lchown, AT_SYMLINK_NOFOLLOW)
}

// pathAt is the target path in directory dir.
func pathAt(dir Ino, path string) target { return target{dir: dir, path: path} }

// inodeTarget is the open inode ino.
func inodeTarget(ino Ino) target { return target{ino: ino, byIno: true} }

func (t target) resolve(s *state, c *Cred) (*inode, error) {
	if t.byIno {
		nd := s.inodes[t.ino]
		if nd == nil {
			return nil, syscall.EBADF
		}
		return nd, nil
	}
	start, err := s.startDir(t.dir)
	if err != nil {
		return nil, err
	}
	return s.resolveAt(c, start, t.path, !t.nofollow)
}

// Chmod sets the permission bits of path to mode & 07777. Only the owner
// and root may; a caller that is neither root nor in the file's group
// loses the setgid bit (as on Linux). ctime is updated.
func (n *NS) Chmod(c Cred, path string, mode uint32) error {
	_, err := n.chmod(c, pathAt(RootIno, path), mode)
	return err
}

// ChmodAt is Chmod of a path relative to directory dir, as fchmodat(2);
// it returns the inode it changed.
func (n *NS) ChmodAt(c Cred, dir Ino, path string, mode uint32) (Ino, error) {
	return n.chmod(c, pathAt(dir, path), mode)
}

// FChmod is Chmod of the open inode ino, as fchmod(2).
func (n *NS) FChmod(c Cred, ino Ino, mode uint32) error {
	_, err := n.chmod(c, inodeTarget(ino), mode)
	return err
}

func (n *NS) chmod(c Cred, at target, mode uint32) (Ino, error) {
	a, err := n.setAttr(&c, at, func(nd *inode) (*setAttrRec, error) {
		if !isOwner(&c, &nd.attr) {
			return nil, syscall.EPERM
		}
		m := nd.attr.Mode&syscall.S_IFMT | mode&0o7777
		if !c.isRoot() && !c.inGroup(nd.attr.GID) {
			m &^= syscall.S_ISGID
		}
		return &setAttrRec{ino: nd.attr.Ino, mask: setMode | setCtime, mode: m, ctime: n.now()}, nil
	})
	return a.Ino, err
}

// Chown changes the owner and group of path. uid and gid are taken as
// uid_t and gid_t (32 bits, as the system call does); -1 (0xffffffff)
// leaves one unchanged. Only root changes the owner (the owner may
// "change" it to itself); the owner may change the group to one it belongs
// to. On a regular file the change drops setuid, and setgid when group
// execute is set or the caller is neither root nor in the file's group,
// for root too (Linux since 2.2.13); a non-owner's no-op chown of such a
// file is therefore EPERM. ctime is updated even when nothing else changes.
func (n *NS) Chown(c Cred, path string, uid, gid int) error {
	_, err := n.chown(c, pathAt(RootIno, path), uid, gid)
	return err
}

// ChownAt is Chown of a path relative to directory dir, as fchownat(2);
// it returns the inode it changed.
func (n *NS) ChownAt(c Cred, dir Ino, path string, uid, gid int) (Ino, error) {
	return n.chown(c, pathAt(dir, path), uid, gid)
}

// LchownAt is ChownAt that changes a final symbolic link itself, as
// fchownat(AT_SYMLINK_NOFOLLOW) and lchown(2).
func (n *NS) LchownAt(c Cred, dir Ino, path string, uid, gid int) (Ino, error) {
	t := pathAt(dir, path)
	t.nofollow = true
	return n.chown(c, t, uid, gid)
}

// FChown is Chown of the open inode ino, as fchown(2).
func (n *NS) FChown(c Cred, ino Ino, uid, gid int) error {
	_, err := n.chown(c, inodeTarget(ino), uid, gid)
	return err
}

func (n *NS) chown(c Cred, at target, uid, gid int) (Ino, error) {
	const unchanged = 1<<32 - 1
	u, g := uint32(uid), uint32(gid)
	got, err := n.setAttr(&c, at, func(nd *inode) (*setAttrRec, error) {
		a := &nd.attr
		rec := &setAttrRec{ino: a.Ino, mask: setCtime, ctime: n.now()}
		if u != unchanged {
			if !c.isRoot() && !(a.UID == c.UID && u == a.UID) {
				return nil, syscall.EPERM
			}
			rec.mask |= setUID
			rec.uid = u
		}
		if g != unchanged {
			if !c.isRoot() && !(a.UID == c.UID && (g == a.GID || c.inGroup(g))) {
				return nil, syscall.EPERM
			}
			rec.mask |= setGID
			rec.gid = g
		}
		if !nd.isDir() {
			if m, changed := dropSuidSgid(&c, a); changed {
				if !isOwner(&c, a) {
					return nil, syscall.EPERM
				}
				rec.mask |= setMode
				rec.mode = m
			}
		}
		return rec, nil
	})
	return got.Ino, err
}

// Chtimes sets the access and modification times of path (Unix
// nanoseconds; TimeOmit leaves one unchanged, TimeNow sets it to the
// clock), as utimensat: the owner or root may set any times, a caller
// with write permission both to now (Linux's ATTR_TOUCH; else EACCES);
// anything else by another is EPERM, one time now and the other omitted
// included, as Linux's vfs_utimes counts it as explicit. With both omitted
// it succeeds at once without looking at path, as Linux does. ctime is
// updated.
func (n *NS) Chtimes(c Cred, path string, atime, mtime int64) error {
	return n.ChtimesAt(c, RootIno, path, atime, mtime)
}

// ChtimesAt is Chtimes of a path relative to directory dir, as
// utimensat(2).
func (n *NS) ChtimesAt(c Cred, dir Ino, path string, atime, mtime int64) error {
	if strings.IndexByte(path, 0) >= 0 {
		return syscall.EINVAL
	}
	return n.chtimes(c, pathAt(dir, path), atime, mtime)
}

// LchtimesAt is ChtimesAt that changes a final symbolic link itself, as
// utimensat(AT_SYMLINK_NOFOLLOW).
func (n *NS) LchtimesAt(c Cred, dir Ino, path string, atime, mtime int64) error {
	if strings.IndexByte(path, 0) >= 0 {
		return syscall.EINVAL
	}
	t := pathAt(dir, path)
	t.nofollow = true
	return n.chtimes(c, t, atime, mtime)
}

// FChtimes is Chtimes of the open inode ino, as futimens(2).
func (n *NS) FChtimes(c Cred, ino Ino, atime, mtime int64) error {
	return n.chtimes(c, inodeTarget(ino), atime, mtime)
}

func (n *NS) chtimes(c Cred, at target, atime, mtime int64) error {
	if atime == TimeOmit && mtime == TimeOmit {
		return nil
	}
	// Both now is Linux's touch (ATTR_TOUCH); any other form, one time
	// now and one omitted included, counts as explicit (ATTR_TIMES_SET).
	explicit := atime != TimeNow || mtime != TimeNow
	_, err := n.setAttr(&c, at, func(nd *inode) (*setAttrRec, error) {
		if !isOwner(&c, &nd.attr) {
			if explicit {
				return nil, syscall.EPERM
			}
			if err := permission(&c, &nd.attr, mayWrite); err != nil {
				return nil, err
			}
		}
		t := n.now()
		rec := &setAttrRec{ino: nd.attr.Ino, mask: setCtime, ctime: t}
		if atime != TimeOmit {
			rec.mask |= setAtime
			rec.atime = nowOr(atime, t)
		}
		if mtime != TimeOmit {
			rec.mask |= setMtime
			rec.mtime = nowOr(mtime, t)
		}
		return rec, nil
	})
	return err
}

// nowOr is t for TimeNow, else v.
func nowOr(v, t int64) int64 {
	if v == TimeNow {
		return t
	}
	return v
}

// Truncate sets the size of the regular file path, as truncate(2): a
// negative size is EINVAL, a directory EISDIR, and it needs write
// permission. mtime and ctime change when the size does; a non-root
// caller drops setuid/setgid as Linux does. The caller resizes the blob.
func (n *NS) Truncate(c Cred, path string, size int64) (Attr, error) {
	if strings.IndexByte(path, 0) >= 0 || size < 0 {
		return Attr{}, syscall.EINVAL
	}
	return n.setAttr(&c, pathAt(RootIno, path), func(nd *inode) (*setAttrRec, error) {
		if nd.isDir() {
			return nil, syscall.EISDIR
		}
		if err := permission(&c, &nd.attr, mayWrite); err != nil {
			return nil, err
		}
		rec := &setAttrRec{ino: nd.attr.Ino}
		t := n.now()
		if size != nd.attr.Size {
			rec.mask |= setSize | setMtime | setCtime
			rec.size, rec.mtime, rec.ctime = size, t, t
		}
		if m, changed := killPrivOnTruncate(&c, &nd.attr); changed {
			rec.mask |= setMode | setCtime
			rec.mode, rec.ctime = m, t
		}
		if rec.mask == 0 {
			return nil, nil
		}
		return rec, nil
	})
}

// ReadDir lists directory path, sorted by name, without "." and "..". It
// needs read permission on the directory.
func (n *NS) ReadDir(c Cred, path string) ([]Dirent, error) { return n.ReadDirAt(c, RootIno, path) }

// ReadDirAt is ReadDir of a path relative to directory dir.
func (n *NS) ReadDirAt(c Cred, dir Ino, path string) ([]Dirent, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	nd, err := n.listableLocked(&c, dir, path, mayRead)
	if err != nil {
		return nil, err
	}
	out := make([]Dirent, 0, len(nd.entries))
	for name, ino := range nd.entries {
		out = append(out, Dirent{Name: name, Ino: ino, Mode: n.st.inodes[ino].attr.Mode & syscall.S_IFMT})
	}
	slices.SortFunc(out, func(a, b Dirent) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ReadDirAfter returns, in name order, up to max entries of directory path
// (relative to dir) whose names sort after after, and whether more
// follow: one page of a listing. It costs a lookup and the page, not the
// directory: the directory keeps its names sorted between changes
// (inode.sorted).
func (n *NS) ReadDirAfter(c Cred, dir Ino, path, after string, limit int) ([]Dirent, bool, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	nd, err := n.listableLocked(&c, dir, path, mayRead)
	if err != nil {
		return nil, false, err
	}
	names := nd.sortedNames()
	i, found := slices.BinarySearch(names, after)
	if found {
		i++
	}
	j := min(i+max(limit, 1), len(names))
	out := make([]Dirent, 0, j-i)
	for _, name := range names[i:j] {
		ino := nd.entries[name]
		out = append(out, Dirent{Name: name, Ino: ino, Mode: n.st.inodes[ino].attr.Mode & syscall.S_IFMT})
	}
	return out, j < len(names), nil
}

// listableLocked resolves directory path (relative to dir) for a listing
// that needs mask on it; n.mu is held.
func (n *NS) listableLocked(c *Cred, dir Ino, path string, mask uint32) (*inode, error) {
	if n.closed {
		return nil, errClosed
	}
	start, err := n.st.startDir(dir)
	if err != nil {
		return nil, err
	}
	nd, err := n.st.resolveAt(c, start, path, true)
	if err != nil {
		return nil, err
	}
	if !nd.isDir() {
		return nil, syscall.ENOTDIR
	}
	if err := permission(c, &nd.attr, mask); err != nil {
		return nil, err
	}
	if nd.attr.Nlink == 0 {
		return nil, syscall.ENOENT // a removed directory, still open: getdents says ENOENT
	}
	return nd, nil
}

// Openable is a regular file of a directory that a caller may open for
// reading, as Snapshot lists them.
type Openable struct {
	Name string
	Ino  Ino
	Blob uint64
	Mode uint32
}

// SnapshotAt lists, sorted by name, the regular files of directory path
// (relative to dir) that c may open read-only by their name in it: c
// may search every directory of the path and read and search the
// directory itself (it learns every name), and may read the file. The
// caller must keep the answer from outliving a change of the namespace
// (the metadata service's directory generation does).
func (n *NS) SnapshotAt(c Cred, dir Ino, path string) ([]Openable, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	nd, err := n.listableLocked(&c, dir, path, mayRead|mayExec)
	if err != nil {
		return nil, err
	}
	out := make([]Openable, 0, len(nd.entries))
	for name, ino := range nd.entries {
		e := n.st.inodes[ino]
		if e == nil || e.attr.Mode&syscall.S_IFMT != syscall.S_IFREG || permission(&c, &e.attr, mayRead) != nil {
			continue
		}
		out = append(out, Openable{Name: name, Ino: ino, Blob: e.attr.Blob, Mode: e.attr.Mode})
	}
	slices.SortFunc(out, func(a, b Openable) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// SetLive records the size and mtime the IO service reports for a regular
// file after writes (trusted: no permission check). ctime becomes mtime
// if that is later. ENOENT if the inode is gone.
func (n *NS) SetLive(ino Ino, size int64, mtime int64) error {
	if err := n.lockMut(); err != nil {
		return err
	}
	lsn, err := n.setLiveLocked(ino, size, mtime)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return n.finish(lsn)
}

// setLiveLocked is SetLive with mu held for writing.
func (n *NS) setLiveLocked(ino Ino, size, mtime int64) (uint64, error) {
	nd := n.st.inodes[ino]
	switch {
	case nd == nil:
		return 0, syscall.ENOENT
	case nd.isDir():
		return 0, syscall.EISDIR
	case !nd.attr.IsReg():
		return 0, syscall.EINVAL
	case size < 0:
		return 0, syscall.EINVAL
	}
	return n.logLocked(&setAttrRec{
		ino: ino, mask: setSize | setMtime | setCtime,
		size: size, mtime: mtime, ctime: max(nd.attr.Ctime, mtime),
	})
}

// Files returns the attributes of every regular file, named or still open
// after an unlink, sorted by inode number: the blob map (each file's blob
// is its Blob). Trusted callers only, such as `weir check`.
func (n *NS) Files() []Attr {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []Attr
	for _, nd := range n.st.inodes {
		if nd.attr.IsReg() {
			out = append(out, nd.attr)
		}
	}
	slices.SortFunc(out, func(a, b Attr) int { return cmp.Compare(a.Ino, b.Ino) })
	return out
}

// KillPriv drops setuid, and setgid when group execute is set, from a
// regular file that a process other than root wrote, as Linux does on
// write. Trusted: the metadata service calls it when the IO service
// reports a write through a handle a non-root session opened. Nothing is
// logged when no bit needs clearing.
func (n *NS) KillPriv(ino Ino) error {
	if err := n.lockMut(); err != nil {
		return err
	}
	var lsn uint64
	var err error
	switch nd := n.st.inodes[ino]; {
	case nd == nil:
		err = syscall.ENOENT
	case nd.isDir():
		err = syscall.EISDIR
	case !nd.attr.IsReg():
		err = syscall.EINVAL
	default:
		m := nd.attr.Mode
		kill := m & syscall.S_ISUID
		if m&syscall.S_IXGRP != 0 {
			kill |= m & syscall.S_ISGID
		}
		if kill != 0 {
			lsn, err = n.logLocked(&setAttrRec{ino: ino, mask: setMode | setCtime, mode: m &^ kill, ctime: n.now()})
		}
	}
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return n.finish(lsn)
}
