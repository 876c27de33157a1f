package ns

import "syscall"

// Access bits, as the kernel's MAY_EXEC, MAY_WRITE, MAY_READ.
const (
	mayExec  uint32 = 1
	mayWrite uint32 = 2
	mayRead  uint32 = 4
)

// permission is the kernel's generic_permission without ACLs: the owner
// class if the caller owns the inode, else the group class if the caller is
// in its group (primary or supplementary), else the other class. Root
// overrides read and write always, search on directories always, and
// execute on files only if some execute bit is set.
func permission(c *Cred, a *Attr, mask uint32) error {
	var bits uint32
	switch {
	case a.UID == c.UID:
		bits = a.Mode >> 6 & 7
	case c.inGroup(a.GID):
		bits = a.Mode >> 3 & 7
	default:
		bits = a.Mode & 7
	}
	if mask&^bits == 0 {
		return nil
	}
	if c.isRoot() && (a.IsDir() || mask&mayExec == 0 || a.Mode&0o111 != 0) {
		return nil
	}
	return syscall.EACCES
}

// isOwner reports whether c owns a or is root (inode_owner_or_capable).
func isOwner(c *Cred, a *Attr) bool { return c.isRoot() || a.UID == c.UID }

// stickyDenied is the kernel's check_sticky: in a sticky directory only
// the owner of the entry, the owner of the directory and root may remove
// or rename the entry.
func stickyDenied(c *Cred, dir, victim *Attr) bool {
	return dir.Mode&syscall.S_ISVTX != 0 && victim.UID != c.UID && dir.UID != c.UID && !c.isRoot()
}

// mayDelete is the kernel's may_delete: write and search permission on the
// directory (EACCES), the sticky rule (EPERM), then the type the caller
// expects (ENOTDIR when removing a directory, EISDIR when removing a file;
// the root is EBUSY).
func mayDelete(c *Cred, dir, victim *inode, isDir bool) error {
	if err := permission(c, &dir.attr, mayWrite|mayExec); err != nil {
		return err
	}
	if stickyDenied(c, &dir.attr, &victim.attr) {
		return syscall.EPERM
	}
	switch {
	case isDir && !victim.isDir():
		return syscall.ENOTDIR
	case isDir && victim.attr.Ino == RootIno:
		return syscall.EBUSY
	case !isDir && victim.isDir():
		return syscall.EISDIR
	}
	return nil
}

// killPrivOnTruncate is setattr_should_drop_suidgid for a truncation by c:
// a non-root truncation of a regular file drops setuid, and setgid when
// it is a real setgid (group execute set) or the caller is not in the
// file's group. It returns the new mode and whether it changed.
func killPrivOnTruncate(c *Cred, a *Attr) (uint32, bool) {
	if c.isRoot() || a.IsDir() {
		return a.Mode, false
	}
	return dropSuidSgid(c, a)
}

// dropSuidSgid clears setuid, and setgid when group execute is set or c is
// neither root nor in the file's group.
func dropSuidSgid(c *Cred, a *Attr) (uint32, bool) {
	m := a.Mode &^ syscall.S_ISUID
	if m&syscall.S_ISGID != 0 && (m&syscall.S_IXGRP != 0 || !(c.isRoot() || c.inGroup(a.GID))) {
		m &^= syscall.S_ISGID
	}
	return m, m != a.Mode
}
