package ns

import (
	"strings"
	"syscall"
)

// Linux limits.
const (
	nameMax = 255  // NAME_MAX: bytes in one component
	pathMax = 4096 // PATH_MAX: bytes in a path including its NUL
)

// lastKind is the kind of a path's final component, as the kernel's
// last_type.
type lastKind uint8

const (
	lastNorm   lastKind = iota // a name
	lastDot                    // "."
	lastDotDot                 // ".."
	lastRoot                   // the path was only slashes
)

// walked is a path resolved up to its final component, like the kernel's
// nameidata after link_path_walk.
type walked struct {
	dir   *inode   // directory holding the final component (for lastRoot: the root)
	name  string   // the final component
	at    int      // where name starts in the path
	kind  lastKind // what the final component is
	slash bool     // the path ended in one or more slashes
}

// checkPath applies the checks made before any lookup: Go's syscall
// package refuses a NUL byte (EINVAL), then getname refuses an empty path
// (ENOENT) and one of PATH_MAX bytes or more (ENAMETOOLONG).
func checkPath(p string) error {
	switch {
	case strings.IndexByte(p, 0) >= 0:
		return syscall.EINVAL
	case p == "":
		return syscall.ENOENT
	case len(p) >= pathMax:
		return syscall.ENAMETOOLONG
	}
	return nil
}

// walk resolves every component of p but the last, from the root, as
// link_path_walk does: before each component, including the last, the
// current directory must be searchable (EACCES); each intermediate
// component must exist (ENOENT), fit NAME_MAX (ENAMETOOLONG) and be a
// directory (ENOTDIR). "." and ".." resolve physically; ".." of the root
// is the root. An intermediate component that is a symbolic link ends
// the walk with a *FollowError (mayFollow permitting).
func (s *state) walk(c *Cred, p string) (walked, error) { return s.walkAt(c, s.root(), p) }

// walkAt is walk starting in directory start for a relative path (an
// absolute one starts at the root), as the *at() system calls resolve
// from their directory file descriptor.
func (s *state) walkAt(c *Cred, start *inode, p string) (walked, error) {
	if err := checkPath(p); err != nil {
		return walked{}, err
	}
	cur := start
	if p[0] == '/' {
		cur = s.root()
	}
	i := 0
	for i < len(p) && p[i] == '/' {
		i++
	}
	if i == len(p) {
		return walked{dir: cur, kind: lastRoot}, nil
	}
	for {
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			j = len(p)
		} else {
			j += i
		}
		comp := p[i:j]
		k := j
		for k < len(p) && p[k] == '/' {
			k++
		}
		if err := permission(c, &cur.attr, mayExec); err != nil {
			return walked{}, err
		}
		if comp == ".." && c != nil && c.Mounted && cur.attr.Ino == RootIno {
			return walked{}, &FollowError{Start: i, End: j, Above: true}
		}
		if k == len(p) {
			w := walked{dir: cur, name: comp, at: i, slash: j < len(p)}
			switch comp {
			case ".":
				w.kind = lastDot
			case "..":
				w.kind = lastDotDot
			}
			return w, nil
		}
		next, err := s.step(cur, comp)
		if err != nil {
			return walked{}, err
		}
		if next.isLink() {
			return walked{}, follow(c, cur, next, i, j)
		}
		if !next.isDir() {
			return walked{}, syscall.ENOTDIR
		}
		cur, i = next, k
	}
}

// step looks up one component in directory dir (whose search permission
// the caller checked).
func (s *state) step(dir *inode, comp string) (*inode, error) {
	switch comp {
	case ".":
		return dir, nil
	case "..":
		return s.parentOf(dir)
	}
	if len(comp) > nameMax {
		return nil, syscall.ENAMETOOLONG
	}
	ino, ok := dir.entries[comp]
	if !ok {
		return nil, syscall.ENOENT
	}
	return s.inodes[ino], nil
}

// parentOf returns directory dir's parent. A removed directory (still
// open, so a valid start) keeps the parent it was removed from, as a
// removed directory's ".." does on Linux; once that parent is freed too
// (Linux keeps it while a child pins it) it is ENOENT.
func (s *state) parentOf(dir *inode) (*inode, error) {
	p := s.inodes[dir.parent]
	if p == nil {
		return nil, syscall.ENOENT
	}
	return p, nil
}

// follow is the answer for a symbolic link at path[start:end] in
// directory dir: a *FollowError, or EACCES where fs.protected_symlinks
// (1, the default of Debian and most distributions) forbids following
// it: in a sticky world-writable directory only a link the caller or the
// directory's owner owns is followed, by root too (may_follow_link).
func follow(c *Cred, dir, link *inode, start, end int) error {
	d := &dir.attr
	if d.Mode&syscall.S_ISVTX != 0 && d.Mode&0o002 != 0 && link.attr.UID != c.UID && link.attr.UID != d.UID {
		return syscall.EACCES
	}
	return &FollowError{Start: start, End: end, Target: link.target}
}

// final looks up the last component of a walked path; a trailing slash
// demands a directory (ENOTDIR). A symbolic link is followed (a
// *FollowError) if follow is set or the path ends in a slash; otherwise
// it is the answer.
func (s *state) final(c *Cred, w walked, followLast bool) (*inode, error) {
	switch w.kind {
	case lastRoot, lastDot:
		return w.dir, nil
	case lastDotDot:
		if c != nil && c.Mounted && w.dir.attr.Ino == RootIno {
			return nil, &FollowError{Start: w.at, End: w.at + 2, Above: true}
		}
		return s.parentOf(w.dir)
	}
	n, err := s.step(w.dir, w.name)
	if err != nil {
		return nil, err
	}
	if n.isLink() && (followLast || w.slash) {
		return nil, follow(c, w.dir, n, w.at, w.at+len(w.name))
	}
	if w.slash && !n.isDir() {
		return nil, syscall.ENOTDIR
	}
	return n, nil
}

// resolve looks up a whole path, following a final symbolic link.
func (s *state) resolve(c *Cred, p string) (*inode, error) { return s.resolveAt(c, s.root(), p, true) }

// resolveAt looks up a whole path from directory start; a final symbolic
// link is followed if followLast is set (stat, not lstat).
func (s *state) resolveAt(c *Cred, start *inode, p string, followLast bool) (*inode, error) {
	w, err := s.walkAt(c, start, p)
	if err != nil {
		return nil, err
	}
	return s.final(c, w, followLast)
}

// startDir returns the directory a path operation at dir starts from: the
// root for RootIno (and 0), else the inode dir, which must be a directory
// (ENOTDIR) that exists (EBADF: the caller's handle names nothing). A
// removed directory that is still open is a valid start: lookups in it
// find nothing (it has no entries) and creating in it is ENOENT, as in
// Linux.
func (s *state) startDir(dir Ino) (*inode, error) {
	if dir == 0 || dir == RootIno {
		return s.root(), nil
	}
	d := s.inodes[dir]
	switch {
	case d == nil:
		return nil, syscall.EBADF
	case !d.isDir():
		return nil, syscall.ENOTDIR
	}
	return d, nil
}

// trap is the kernel's lock_rename result for a rename from directory
// oldDir to directory newDir: when one is a proper ancestor of the other,
// the child of the ancestor on the path to the other; else nil. The
// source being the trap means a directory would move under itself
// (EINVAL); the target being the trap means the target is an ancestor of
// the source, hence not empty (ENOTEMPTY).
func (s *state) trap(newDir, oldDir *inode) *inode {
	if newDir == oldDir {
		return nil
	}
	// Removed directories have no ancestors (their callers refuse them
	// before the rename does anything); the walks stop at them.
	for p := newDir; p != nil && p.attr.Ino != RootIno && p.attr.Nlink != 0; p = s.inodes[p.parent] {
		if p.parent == oldDir.attr.Ino {
			return p
		}
	}
	for q := oldDir; q != nil && q.attr.Ino != RootIno && q.attr.Nlink != 0; q = s.inodes[q.parent] {
		if q.parent == newDir.attr.Ino {
			return q
		}
	}
	return nil
}
