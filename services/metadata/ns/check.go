package ns

import (
	"errors"
	"fmt"
	"syscall"
)

// Check verifies the in-memory namespace (an fsck): the tree is connected
// from the root; every entry has a valid, unique name and points at a live
// inode; a directory has exactly one name and its parent link matches it;
// link counts are right (a directory: 2 + its subdirectories; a file or
// symbolic link: its number of names); a symbolic link has a valid
// target, its length as size, no blob and no entries; an inode without a name has nlink 0 and is still open;
// every regular file's Blob equals its inode number and directories have
// none; no inode number is at or beyond the allocation counter.
func (n *NS) Check() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.st.check(true)
}

// maxCheckErrors bounds the problems one check reports.
const maxCheckErrors = 20

// check is Check on s. With strictOrphans an unnamed inode must be open
// (recovery frees the others before the first strict check).
func (s *state) check(strictOrphans bool) error {
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < maxCheckErrors {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	root := s.inodes[RootIno]
	if root == nil || !root.isDir() {
		return errors.New("check: root directory missing")
	}
	if root.parent != RootIno {
		bad("root's parent is %d", root.parent)
	}
	names := map[Ino]uint32{}
	queue := []*inode{root}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		var subdirs uint32
		for name, ino := range d.entries {
			if !validName(name) {
				bad("directory %d: invalid name %q", d.attr.Ino, name)
			}
			c := s.inodes[ino]
			if c == nil {
				bad("directory %d: entry %q points at missing inode %d", d.attr.Ino, name, ino)
				continue
			}
			names[ino]++
			if !c.isDir() {
				continue
			}
			subdirs++
			if ino == RootIno || names[ino] > 1 {
				bad("directory %d has more than one name (%q in %d)", ino, name, d.attr.Ino)
				continue
			}
			if c.parent != d.attr.Ino {
				bad("directory %d is in %d but its parent link is %d", ino, d.attr.Ino, c.parent)
			}
			queue = append(queue, c)
		}
		if d.attr.Nlink != 2+subdirs {
			bad("directory %d: nlink %d, want %d", d.attr.Ino, d.attr.Nlink, 2+subdirs)
		}
	}
	for ino, n := range s.inodes {
		a := &n.attr
		if a.Ino != ino {
			bad("inode %d is filed under %d", a.Ino, ino)
		}
		if ino == 0 || ino >= s.nextIno {
			bad("inode %d outside the allocated range [1, %d)", ino, s.nextIno)
		}
		if !modeValid(a.Mode) {
			bad("inode %d: invalid mode %#o", ino, a.Mode)
			continue
		}
		if a.Mode&syscall.S_IFMT == syscall.S_IFREG {
			if a.Blob != uint64(ino) {
				bad("file %d: blob %d", ino, a.Blob)
			}
			if n.entries != nil {
				bad("file %d has directory entries", ino)
			}
			if a.Nlink != names[ino] {
				bad("file %d: nlink %d, %d names", ino, a.Nlink, names[ino])
			}
			if a.Size < 0 {
				bad("file %d: size %d", ino, a.Size)
			}
		} else if n.isLink() {
			if !validTarget(n.target) || a.Size != int64(len(n.target)) {
				bad("symbolic link %d: target of %d bytes, size %d", ino, len(n.target), a.Size)
			}
			if a.Blob != 0 || n.entries != nil {
				bad("symbolic link %d: blob %d or directory entries", ino, a.Blob)
			}
			if a.Nlink != names[ino] {
				bad("symbolic link %d: nlink %d, %d names", ino, a.Nlink, names[ino])
			}
		} else {
			if a.Blob != 0 {
				bad("directory %d: blob %d", ino, a.Blob)
			}
			if names[ino] == 0 && ino != RootIno {
				if a.Nlink != 0 {
					bad("directory %d is unreachable with nlink %d", ino, a.Nlink)
				}
				if len(n.entries) != 0 {
					bad("removed directory %d still has entries", ino)
				}
			}
		}
		if names[ino] == 0 && ino != RootIno && strictOrphans && n.opens == 0 && !n.held {
			bad("inode %d has no name and is not open", ino)
		}
		if _, dead := s.dead[a.Blob]; dead && a.Blob != 0 {
			bad("file %d: its blob %d awaits deletion", ino, a.Blob)
		}
	}
	for blob := range s.dead {
		if blob == 0 {
			bad("blob 0 awaits deletion")
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("check: %w", errors.Join(errs...))
	}
	return nil
}
