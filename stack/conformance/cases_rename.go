package conformance

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

func renameCases() []Case {
	return []Case{
		{Name: "rename/within_dir", Run: func(t *Tester) {
			t.WriteFile("a", s("A"), 0o644)
			t.ExpectOK(t.Rename("a", "b"))
			_, err := t.Stat("a")
			t.ExpectErr(err, syscall.ENOENT)
			b, _ := t.ReadFile("b")
			t.ExpectData(b, s("A"))
			t.ReadDir(".")
		}},
		{Name: "rename/across_dirs", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d1/x", 0o755))
			t.Must(t.Mkdir("d2", 0o755))
			t.WriteFile("d1/x/a", s("A"), 0o600)
			t.ExpectOK(t.Rename("d1/x/a", "d2/b"))
			t.ReadDir("d1/x")
			t.ReadDir("d2")
			t.Stat("d2/b")
			b, _ := t.ReadFile("d2/b")
			t.ExpectData(b, s("A"))
		}},
		{Name: "rename/replace_file", Run: func(t *Tester) {
			t.WriteFile("a", s("new"), 0o600)
			t.WriteFile("b", s("old contents"), 0o644)
			t.ExpectOK(t.Rename("a", "b"))
			b, _ := t.ReadFile("b")
			t.ExpectData(b, s("new"))
			fi, _ := t.Stat("b")
			t.Check(fi != nil && fi.Mode() == 0o600, "replaced file has mode %v", fi)
			t.ReadDir(".")
		}},
		{Name: "rename/replace_across_dirs", Run: func(t *Tester) {
			t.Must(t.Mkdir("d1", 0o755))
			t.Must(t.Mkdir("d2", 0o755))
			t.WriteFile("d1/a", s("new"), 0o644)
			t.WriteFile("d2/a", s("old"), 0o644)
			t.ExpectOK(t.Rename("d1/a", "d2/a"))
			t.ReadDir("d1")
			b, _ := t.ReadFile("d2/a")
			t.ExpectData(b, s("new"))
		}},
		{Name: "rename/replace_is_atomic_for_readers", Run: renameAtomic},
		{Name: "rename/replace_open_target_keeps_old_data", Run: func(t *Tester) {
			t.WriteFile("a", s("new"), 0o644)
			t.WriteFile("b", s("old"), 0o644)
			f := t.MustOpenFile("b", os.O_RDWR, 0)
			t.ExpectOK(t.Rename("a", "b"))
			b, _ := f.Read(10)
			t.ExpectData(b, s("old"))
			f.Write(s("!"))
			f.Stat()
			f.Close()
			b, _ = t.ReadFile("b")
			t.ExpectData(b, s("new"))
		}},
		{Name: "rename/open_source_handle_follows", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.Write(s("one"))
			t.ExpectOK(t.Rename("a", "d/b"))
			f.Write(s(" two"))
			f.Close()
			b, _ := t.ReadFile("d/b")
			t.ExpectData(b, s("one two"))
		}},
		{Name: "rename/dir_onto_empty_dir", Run: func(t *Tester) {
			t.Must(t.MkdirAll("a/sub", 0o755))
			t.Must(t.Mkdir("b", 0o700))
			t.ExpectOK(t.Rename("a", "b"))
			t.Stat("b")
			t.ReadDir("b")
			_, err := t.Stat("a")
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "rename/dir_onto_nonempty_dir", Run: func(t *Tester) {
			t.Must(t.Mkdir("a", 0o755))
			t.Must(t.Mkdir("b", 0o755))
			t.WriteFile("b/f", nil, 0o644)
			// POSIX allows EEXIST or ENOTEMPTY; Linux says ENOTEMPTY.
			t.ExpectErr(t.Rename("a", "b"), syscall.ENOTEMPTY)
			t.ReadDir(".")
		}},
		{Name: "rename/dir_onto_file_enotdir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectErr(t.Rename("d", "f"), syscall.ENOTDIR)
			t.Stat("f")
			t.Stat("d")
		}},
		{Name: "rename/file_onto_dir_eisdir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectErr(t.Rename("f", "d"), syscall.EISDIR)
			t.Must(t.Mkdir("e", 0o755))
			t.WriteFile("e/x", nil, 0o644)
			t.Rename("f", "e")
			t.Stat("f")
		}},
		{Name: "rename/dir_into_own_subtree_einval", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/sub/deeper", 0o755))
			t.ExpectErr(t.Rename("d", "d/x"), syscall.EINVAL)
			t.ExpectErr(t.Rename("d", "d/sub/x"), syscall.EINVAL)
			t.ExpectErr(t.Rename("d", "d/sub/deeper"), syscall.EINVAL)
			t.ExpectErr(t.Rename("d/sub", "d/sub/deeper/x"), syscall.EINVAL)
			t.ReadDir("d")
		}},
		{Name: "rename/dir_onto_own_ancestor", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/sub", 0o755))
			t.Rename("d/sub", "d")
			t.Rename("d/sub", ".")
			t.ReadDir("d")
		}},
		{Name: "rename/missing_enoent", Run: func(t *Tester) {
			t.ExpectErr(t.Rename("missing", "b"), syscall.ENOENT)
			t.WriteFile("a", s("x"), 0o644)
			t.ExpectErr(t.Rename("a", "nodir/b"), syscall.ENOENT)
			t.ExpectErr(t.Rename("nodir/a", "b"), syscall.ENOENT)
			t.ExpectErr(t.Rename("a", "a/b"), syscall.ENOTDIR)
			t.ReadDir(".")
		}},
		{Name: "rename/to_itself", Run: func(t *Tester) {
			t.WriteFile("a", s("keep"), 0o644)
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectOK(t.Rename("a", "a"))
			t.ExpectOK(t.Rename("d", "d"))
			t.ExpectOK(t.Rename("a", "./a"))
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("keep"))
			t.ReadDir(".")
		}},
		{Name: "rename/dir_with_contents_across", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d1/sub/deep", 0o755))
			t.Must(t.Mkdir("d2", 0o755))
			t.WriteFile("d1/sub/f", s("f"), 0o644)
			t.WriteFile("d1/sub/deep/g", s("g"), 0o644)
			t.ExpectOK(t.Rename("d1/sub", "d2/moved"))
			t.ReadDir("d1")
			t.ReadDir("d2/moved")
			b, _ := t.ReadFile("d2/moved/deep/g")
			t.ExpectData(b, s("g"))
			_, err := t.Stat("d1/sub/f")
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "rename/trailing_slash", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectErr(t.Rename("f/", "g"), syscall.ENOTDIR)
			t.ExpectErr(t.Rename("f", "g/"), syscall.ENOTDIR)
			t.ExpectOK(t.Rename("d/", "e/"))
			t.ExpectOK(t.Rename("e", "d/"))
			t.ReadDir(".")
		}},
		{Name: "rename/dot_and_dotdot", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/e", 0o755))
			t.Rename(".", "x")
			t.Rename("d/.", "x")
			t.Rename("d/e/..", "x")
			t.Rename("d/e", "d/.")
			t.Rename("d/e", "..")
			t.ReadDir(".")
		}},
		{Name: "rename/swap_chain", Run: func(t *Tester) {
			t.WriteFile("a", s("A"), 0o644)
			t.WriteFile("b", s("B"), 0o644)
			t.Must(t.Rename("a", "tmp"))
			t.Must(t.Rename("b", "a"))
			t.Must(t.Rename("tmp", "b"))
			a, _ := t.ReadFile("a")
			b, _ := t.ReadFile("b")
			t.ExpectData(a, s("B"))
			t.ExpectData(b, s("A"))
			t.ReadDir(".")
		}},
		{Name: "rename/keeps_times", Run: func(t *Tester) {
			t.WriteFile("a", s("x"), 0o644)
			t.Must(t.Chtimes("a", past, past))
			t.Must(t.Rename("a", "b"))
			t.Check(!t.MtimeAfter("b", past), "rename changed the file's mtime")
		}},
	}
}

// renameAtomic replaces "target" 200 times by renaming freshly written files
// onto it while a reader opens and reads it in a loop: the reader must never
// miss the name nor see a partial version. Only counts that do not depend on
// timing are recorded.
func renameAtomic(t *Tester) {
	const renames = 200
	version := func(i int) []byte { return []byte(fmt.Sprintf("version %03d %s", i, strings.Repeat("x", i))) }
	t.WriteFile("target", version(0), 0o644)
	fsys := t.FS()
	var stop atomic.Bool
	var missing, torn atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	wg.Go(func() {
		for first := true; first || !stop.Load(); first = false {
			if _, err := fsys.Stat("target"); err != nil {
				missing.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				continue
			}
			f, err := fsys.OpenFile("target", os.O_RDONLY, 0)
			if err != nil {
				missing.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				continue
			}
			b, err := io.ReadAll(f)
			f.Close()
			var n int
			if _, serr := fmt.Sscanf(string(b), "version %d", &n); err != nil || serr != nil || !bytes.Equal(b, version(n)) {
				torn.Add(1)
			}
		}
	})
	var renameErrs int
	for i := 1; i <= renames; i++ {
		tmp := fmt.Sprintf("tmp%d", i)
		if err := writeRaw(fsys, tmp, version(i)); err != nil {
			renameErrs++
			continue
		}
		if err := fsys.Rename(tmp, "target"); err != nil {
			renameErrs++
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("renames failed: %d", renameErrs)
	t.Logf("reader: target missing %d times, torn %d times", missing.Load(), torn.Load())
	t.Check(renameErrs == 0, "%d renames failed", renameErrs)
	t.Check(missing.Load() == 0, "target was missing %d times (first: %v)", missing.Load(), firstErr.Load())
	t.Check(torn.Load() == 0, "reader saw %d partial versions", torn.Load())
	b, _ := t.ReadFile("target")
	t.ExpectData(b, version(renames))
	t.ReadDir(".")
}
