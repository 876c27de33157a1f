package benchutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Filesystem describes the file system holding a directory.
type Filesystem struct {
	// StatType is what `stat -f -c %T DIR` prints (for ext4 that is
	// "ext2/ext3": the three share one magic number), or the statfs magic
	// in hex when the stat command is missing.
	StatType string `json:"stat_type"`
	// MountType, Source and MountPoint come from the /proc/self/mountinfo
	// entry of the mount holding the directory: the kernel's name of the
	// type ("ext4"), the device and where it is mounted.
	MountType  string `json:"mount_type,omitempty"`
	Source     string `json:"source,omitempty"`
	MountPoint string `json:"mount_point,omitempty"`
	Options    string `json:"options,omitempty"`
	// Journal says, for ext3 and ext4, whether the file system has a jbd2
	// journal (an entry for its device in /proc/fs/jbd2). Without one,
	// fsync commits nothing to a journal, and inode allocation skips
	// inodes deleted in the last minute or more, which makes creating
	// files slow after many deletions.
	Journal string `json:"journal,omitempty"`
}

// String is a one-line description, e.g.
// "ext2/ext3 (stat -f -c %T); mount: ext4 /dev/vda on / (rw,relatime)".
func (f Filesystem) String() string {
	s := f.StatType + " (stat -f -c %T)"
	if f.MountType != "" {
		s += fmt.Sprintf("; mount: %s %s on %s", f.MountType, f.Source, f.MountPoint)
		if f.Options != "" {
			s += " (" + f.Options + ")"
		}
	}
	if f.Journal != "" {
		s += "; " + f.Journal
	}
	return s
}

// DescribeFS describes the file system holding dir.
func DescribeFS(dir string) (Filesystem, error) {
	var f Filesystem
	abs, err := filepath.Abs(dir)
	if err != nil {
		return f, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	out, err := exec.Command("stat", "-f", "-c", "%T", abs).Output()
	if err == nil {
		f.StatType = strings.TrimSpace(string(out))
	} else {
		var st unix.Statfs_t
		if serr := unix.Statfs(abs, &st); serr != nil {
			return f, fmt.Errorf("statfs %s: %w", abs, serr)
		}
		f.StatType = fmt.Sprintf("magic 0x%x (stat command: %v)", st.Type, err)
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return f, nil // the stat type alone still says what was measured
	}
	defer mi.Close()
	sc := bufio.NewScanner(mi)
	best := -1
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - type source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 6 || len(b) < 2 {
			continue
		}
		mp := unescapeMount(a[4])
		if !within(abs, mp) || len(mp) <= best {
			continue
		}
		best = len(mp)
		f.MountPoint, f.Options, f.MountType, f.Source = mp, a[5], b[0], b[1]
	}
	f.Journal = jbd2Journal(f.MountType, f.Source)
	return f, nil
}

// jbd2Journal describes the journal of an ext3 or ext4 file system on
// device source from /proc/fs/jbd2, which holds a "<device>-<n>" entry per
// mounted journal; "" for other file systems or when it cannot tell.
func jbd2Journal(fsType, source string) string {
	if fsType != "ext3" && fsType != "ext4" || !strings.HasPrefix(source, "/dev/") {
		return ""
	}
	if _, err := os.Stat("/proc/fs/jbd2"); err != nil {
		return ""
	}
	m, err := filepath.Glob(filepath.Join("/proc/fs/jbd2", filepath.Base(source)+"-*"))
	if err != nil {
		return ""
	}
	if len(m) == 0 {
		return "no journal (no " + filepath.Base(source) + " entry in /proc/fs/jbd2)"
	}
	return "jbd2 journal"
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	if dir == "/" {
		return true
	}
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// unescapeMount undoes the octal escapes (\040 for a space) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
