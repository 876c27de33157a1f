package conformance

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"
)

// Sub is an FS whose names resolve under Dir of a base FS as if Dir were the
// process root (see Within).
type Sub struct {
	base FS     // immutable after Within
	dir  string // immutable after Within

	// Factory and Arg, if Factory is set, name how a child process reaches
	// the same root: it calls the factory registered under Factory with Arg.
	Factory, Arg string
}

var (
	_ FS        = (*Sub)(nil)
	_ Reopener  = (*Sub)(nil)
	_ Restarter = (*Sub)(nil)
)

// Within returns an FS whose names resolve under dir of base, as if dir were
// the root of a chroot:
//
//   - a leading "/" is dropped, so "/x" is "x"; a name made only of slashes
//     is "." (so Remove("/") behaves like Remove("."), EINVAL, where a chroot
//     would give EBUSY; the suite does not rely on it);
//   - a ".." component that would climb above dir is replaced by ".", which
//     is what the kernel does with ".." at a process root;
//   - everything else is handed to base unchanged, so base (the kernel or
//     weir) still resolves every component itself: existence, ENOTDIR,
//     search permission, trailing slashes, "." and ".." below the root.
//
// The depth of a component is counted lexically. That equals the real depth
// because the suite creates no symbolic links.
//
// The only call where ".." and "." differ at the root is rmdir (ENOTEMPTY for
// "..", EINVAL for "."), and rmdir never looks its last component up, so
// Remove keeps a final ".." as it is. RemoveAll of a name ending in ".." is not
// used by the suite: os.RemoveAll would empty the directory above.
//
// The FileInfo names, File names and error paths Sub returns use the name the
// caller gave, not the name handed to base.
func Within(base FS, dir string) *Sub {
	return &Sub{base: base, dir: strings.TrimRight(dir, "/")}
}

// clamp rewrites name as described at Within. keepFinalDotDot keeps a
// ".." that is the last non-empty component.
func clamp(name string, keepFinalDotDot bool) string {
	if name == "" {
		return ""
	}
	rel := strings.TrimLeft(name, "/")
	if rel == "" {
		return "."
	}
	parts := strings.Split(rel, "/")
	last := len(parts) - 1
	for last > 0 && parts[last] == "" {
		last--
	}
	depth := 0
	for i, p := range parts {
		switch p {
		case "", ".":
		case "..":
			if depth > 0 {
				depth--
			} else if !(keepFinalDotDot && i == last) {
				parts[i] = "."
			}
		default:
			depth++
		}
	}
	return strings.Join(parts, "/")
}

func (s *Sub) path(name string) string { return s.join(clamp(name, false)) }

func (s *Sub) join(rel string) string {
	if rel == "" {
		return "" // the empty name stays empty: ENOENT from base
	}
	if s.dir == "" {
		return rel
	}
	return s.dir + "/" + rel
}

// basename is the Name of a FileInfo for name, as os computes it.
func basename(name string) string {
	i := len(name) - 1
	for ; i > 0 && name[i] == '/'; i-- {
		name = name[:i]
	}
	for i--; i >= 0; i-- {
		if name[i] == '/' {
			name = name[i+1:]
			break
		}
	}
	return name
}

// pathErr restores the caller's name in err.
func pathErr(err error, name string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return &fs.PathError{Op: pe.Op, Path: name, Err: pe.Err}
	}
	return err
}

func linkErr(err error, oldname, newname string) error {
	var le *os.LinkError
	if errors.As(err, &le) {
		return &os.LinkError{Op: le.Op, Old: oldname, New: newname, Err: le.Err}
	}
	return pathErr(err, oldname)
}

// namedInfo is a FileInfo that reports the caller's name.
type namedInfo struct {
	fs.FileInfo
	name string
}

func (i namedInfo) Name() string { return i.name }

func (s *Sub) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := s.base.OpenFile(s.path(name), flag, perm)
	if err != nil {
		return nil, pathErr(err, name)
	}
	return &subFile{f: f, name: name}, nil
}

func (s *Sub) Mkdir(name string, perm fs.FileMode) error {
	return pathErr(s.base.Mkdir(s.path(name), perm), name)
}

func (s *Sub) MkdirAll(name string, perm fs.FileMode) error {
	return pathErr(s.base.MkdirAll(s.path(name), perm), name)
}

func (s *Sub) Remove(name string) error {
	return pathErr(s.base.Remove(s.join(clamp(name, true))), name)
}

func (s *Sub) RemoveAll(name string) error {
	return pathErr(s.base.RemoveAll(s.path(name)), name)
}

func (s *Sub) Rename(oldname, newname string) error {
	return linkErr(s.base.Rename(s.path(oldname), s.path(newname)), oldname, newname)
}

func (s *Sub) Stat(name string) (fs.FileInfo, error) {
	fi, err := s.base.Stat(s.path(name))
	if err != nil {
		return nil, pathErr(err, name)
	}
	return namedInfo{fi, basename(name)}, nil
}

func (s *Sub) Chmod(name string, mode fs.FileMode) error {
	return pathErr(s.base.Chmod(s.path(name), mode), name)
}

func (s *Sub) Chown(name string, uid, gid int) error {
	return pathErr(s.base.Chown(s.path(name), uid, gid), name)
}

func (s *Sub) Chtimes(name string, atime, mtime time.Time) error {
	return pathErr(s.base.Chtimes(s.path(name), atime, mtime), name)
}

func (s *Sub) Touch(name string) error { return pathErr(s.base.Touch(s.path(name)), name) }

func (s *Sub) ReadDir(name string) ([]fs.DirEntry, error) {
	des, err := s.base.ReadDir(s.path(name))
	return des, pathErr(err, name)
}

func (s *Sub) Truncate(name string, size int64) error {
	return pathErr(s.base.Truncate(s.path(name), size), name)
}

// Reopen implements Reopener with Factory and Arg.
func (s *Sub) Reopen() (factory, arg string) { return s.Factory, s.Arg }

// Restart restarts base if it is a Restarter.
func (s *Sub) Restart() error {
	r, ok := s.base.(Restarter)
	if !ok {
		return fmt.Errorf("conformance: %T cannot restart", s.base)
	}
	return r.Restart()
}

// subFile reports the caller's name for an open file.
type subFile struct {
	f    File   // immutable
	name string // immutable
}

func (f *subFile) Read(p []byte) (int, error) {
	n, err := f.f.Read(p)
	return n, pathErr(err, f.name)
}

func (f *subFile) Write(p []byte) (int, error) {
	n, err := f.f.Write(p)
	return n, pathErr(err, f.name)
}

func (f *subFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.f.ReadAt(p, off)
	return n, pathErr(err, f.name)
}

func (f *subFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.f.WriteAt(p, off)
	return n, pathErr(err, f.name)
}

func (f *subFile) Seek(off int64, whence int) (int64, error) {
	n, err := f.f.Seek(off, whence)
	return n, pathErr(err, f.name)
}

func (f *subFile) Close() error              { return pathErr(f.f.Close(), f.name) }
func (f *subFile) Truncate(size int64) error { return pathErr(f.f.Truncate(size), f.name) }
func (f *subFile) Sync() error               { return pathErr(f.f.Sync(), f.name) }
func (f *subFile) Name() string              { return f.name }

func (f *subFile) Stat() (fs.FileInfo, error) {
	fi, err := f.f.Stat()
	if err != nil {
		return nil, pathErr(err, f.name)
	}
	return namedInfo{fi, basename(f.name)}, nil
}

func (f *subFile) ReadDir(n int) ([]fs.DirEntry, error) {
	des, err := f.f.ReadDir(n)
	return des, pathErr(err, f.name)
}
