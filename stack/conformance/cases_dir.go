package conformance

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

func dirCases() []Case {
	return []Case{
		{Name: "dir/mkdir_modes", Run: func(t *Tester) {
			for _, c := range []struct {
				name string
				perm os.FileMode
			}{{"a", 0o755}, {"b", 0o777}, {"c", 0o700}, {"d", 0o000}} {
				t.ExpectOK(t.Mkdir(c.name, c.perm))
				fi, _ := t.Stat(c.name)
				t.Check(fi != nil && fi.Mode() == os.ModeDir|c.perm&^0o022, "%s: %v", c.name, fi)
			}
		}},
		{Name: "dir/mkdir_existing_eexist", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectErr(t.Mkdir("d", 0o755), syscall.EEXIST)
			t.ExpectErr(t.Mkdir("f", 0o755), syscall.EEXIST)
			t.ExpectErr(t.Mkdir(".", 0o755), syscall.EEXIST)
			t.Stat("f")
		}},
		{Name: "dir/mkdir_missing_parent_enoent", Run: func(t *Tester) {
			t.ExpectErr(t.Mkdir("no/d", 0o755), syscall.ENOENT)
			t.ExpectErr(t.Mkdir("no/such/d", 0o755), syscall.ENOENT)
			t.Stat("no")
		}},
		{Name: "dir/mkdir_parent_is_file_enotdir", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectErr(t.Mkdir("f/d", 0o755), syscall.ENOTDIR)
			t.ExpectErr(t.Mkdir("f/d/e", 0o755), syscall.ENOTDIR)
		}},
		{Name: "dir/mkdir_trailing_slash", Run: func(t *Tester) {
			t.ExpectOK(t.Mkdir("d/", 0o755))
			t.ExpectOK(t.Mkdir("d/e//", 0o755))
			t.ReadDir("d")
		}},
		{Name: "dir/mkdirall", Run: func(t *Tester) {
			t.ExpectOK(t.MkdirAll("a/b/c/d", 0o750))
			t.Stat("a")
			t.Stat("a/b/c/d")
			t.ExpectOK(t.MkdirAll("a/b/c/d", 0o755))
			t.ExpectOK(t.MkdirAll("a/b", 0o755))
			t.ExpectOK(t.MkdirAll("a/x/", 0o755))
			t.ReadDir("a")
		}},
		{Name: "dir/mkdirall_through_file_enotdir", Run: func(t *Tester) {
			t.Must(t.MkdirAll("a", 0o755))
			t.WriteFile("a/f", s("x"), 0o644)
			t.ExpectErr(t.MkdirAll("a/f", 0o755), syscall.ENOTDIR)
			t.ExpectErr(t.MkdirAll("a/f/g/h", 0o755), syscall.ENOTDIR)
			t.ReadDir("a")
		}},
		{Name: "dir/readdir_sorted_with_types", Run: func(t *Tester) {
			for _, n := range []string{"c", "a", "B", "z z", "_", "0"} {
				t.WriteFile(n, s(n), 0o644)
			}
			t.Must(t.Mkdir("b", 0o755))
			t.Must(t.Mkdir("A", 0o755))
			des, err := t.ReadDir(".")
			t.ExpectOK(err)
			var got []string
			for _, de := range des {
				got = append(got, de.Name())
			}
			t.Check(strings.Join(got, ",") == "0,A,B,_,a,b,c,z z", "order %v", got)
			for _, de := range des {
				t.Check(de.IsDir() == (de.Name() == "A" || de.Name() == "b"), "%s: type %v", de.Name(), de.Type())
			}
		}},
		{Name: "dir/readdir_empty_and_nested", Run: func(t *Tester) {
			t.ReadDir(".")
			t.Must(t.MkdirAll("d/e", 0o755))
			t.WriteFile("d/e/f", s("x"), 0o644)
			des, err := t.ReadDir("d/e")
			t.ExpectOK(err)
			t.Check(len(des) == 1, "%d entries", len(des))
			t.ReadDir("d")
			t.ReadDir("d/e/")
		}},
		{Name: "dir/readdir_errors", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			_, err := t.ReadDir("missing")
			t.ExpectErr(err, syscall.ENOENT)
			_, err = t.ReadDir("f")
			t.ExpectErr(err, syscall.ENOTDIR)
		}},
		{Name: "dir/file_readdir_paging", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			for i := range 5 {
				t.WriteFile(fmt.Sprintf("d/f%d", i), nil, 0o644)
			}
			f := t.MustOpenFile("d", os.O_RDONLY, 0)
			var all []os.DirEntry
			for range 3 {
				des, err := f.ReadDir(2)
				t.ExpectOK(err)
				all = append(all, des...)
			}
			des, err := f.ReadDir(2)
			t.ExpectErr(err, io.EOF)
			t.Check(len(des) == 0, "%d entries after EOF", len(des))
			got := dirNames(all)
			t.Logf("pages hold %v", got)
			expectNames(t, got, "f0", "f1", "f2", "f3", "f4")
			f.Close()
		}},
		{Name: "dir/file_readdir_all", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.Must(t.Mkdir("d/sub", 0o755))
			t.WriteFile("d/f", nil, 0o644)
			f := t.MustOpenFile("d", os.O_RDONLY, 0)
			des, err := f.ReadDir(-1)
			t.ExpectOK(err)
			t.Logf("entries %v", dirNames(des))
			for _, de := range des {
				t.Check(de.IsDir() == (de.Name() == "sub"), "%s: type %v", de.Name(), de.Type())
			}
			des, err = f.ReadDir(0)
			t.ExpectOK(err)
			t.Check(len(des) == 0, "second ReadDir(0) gave %d entries", len(des))
			f.Close()
		}},
		{Name: "dir/file_readdir_on_file_enotdir", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			f := t.MustOpenFile("f", os.O_RDONLY, 0)
			_, err := f.ReadDir(-1)
			t.ExpectErr(err, syscall.ENOTDIR)
			f.Close()
		}},
		{Name: "dir/remove_file", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectOK(t.Remove("f"))
			_, err := t.Stat("f")
			t.ExpectErr(err, syscall.ENOENT)
			t.ReadDir(".")
		}},
		{Name: "dir/remove_empty_dir", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/e", 0o755))
			t.ExpectOK(t.Remove("d/e"))
			t.ExpectOK(t.Remove("d/"))
			_, err := t.Stat("d")
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "dir/remove_nonempty_enotempty", Run: func(t *Tester) {
			// unlink says EISDIR, rmdir ENOTEMPTY; os.Remove reports the
			// rmdir error unless it is ENOTDIR.
			t.Must(t.MkdirAll("d/e", 0o755))
			t.ExpectErr(t.Remove("d"), syscall.ENOTEMPTY)
			t.WriteFile("d/e/f", nil, 0o644)
			t.ExpectErr(t.Remove("d/e"), syscall.ENOTEMPTY)
			t.ReadDir("d/e")
		}},
		{Name: "dir/remove_missing_enoent", Run: func(t *Tester) {
			t.ExpectErr(t.Remove("missing"), syscall.ENOENT)
			t.ExpectErr(t.Remove("missing/x"), syscall.ENOENT)
			t.WriteFile("f", nil, 0o644)
			t.ExpectErr(t.Remove("f/x"), syscall.ENOTDIR)
		}},
		{Name: "dir/remove_dot_and_dotdot", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/e", 0o755))
			t.ExpectErr(t.Remove("."), syscall.EINVAL)
			t.ExpectErr(t.Remove("d/."), syscall.EINVAL)
			t.Remove("d/e/..")
			t.Remove("..")
			t.Remove("./")
			t.ReadDir("d")
		}},
		{Name: "dir/removeall_deep_tree", Run: func(t *Tester) {
			path := "top"
			for depth := range 12 {
				t.Must(t.FS().MkdirAll(path, 0o755))
				for i := range 3 {
					t.Must(writeRaw(t.FS(), fmt.Sprintf("%s/f%d", path, i), pattern(uint64(depth*3+i), 100+depth)))
				}
				t.Must(t.FS().Mkdir(fmt.Sprintf("%s/empty", path), 0o755))
				path += fmt.Sprintf("/d%d", depth)
			}
			t.ExpectOK(t.RemoveAll("top"))
			_, err := t.Stat("top")
			t.ExpectErr(err, syscall.ENOENT)
			t.ReadDir(".")
		}},
		{Name: "dir/removeall_missing_file_and_dot", Run: func(t *Tester) {
			t.ExpectOK(t.RemoveAll("missing"))
			t.ExpectOK(t.RemoveAll("missing/x"))
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectOK(t.RemoveAll("f"))
			t.Must(t.MkdirAll("d/e", 0o755))
			t.ExpectErr(t.RemoveAll("."), syscall.EINVAL)
			t.ExpectErr(t.RemoveAll("d/."), syscall.EINVAL)
			t.ReadDir("d")
		}},
		{Name: "dir/mtime_of_parent", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.Must(t.Mkdir("e", 0o755))
			step := func(what string, op func()) {
				t.Must(t.Chtimes("d", past, past))
				op()
				t.Check(t.MtimeAfter("d", past), "%s did not change the directory's mtime", what)
			}
			step("create", func() { t.WriteFile("d/f", s("x"), 0o644) })
			step("mkdir", func() { t.Must(t.Mkdir("d/sub", 0o755)) })
			step("rename within", func() { t.Must(t.Rename("d/f", "d/g")) })
			step("rename out", func() { t.Must(t.Rename("d/g", "e/g")) })
			step("rename in", func() { t.Must(t.Rename("e/g", "d/h")) })
			step("remove", func() { t.Must(t.Remove("d/h")) })
			step("rmdir", func() { t.Must(t.Remove("d/sub")) })
			t.Must(t.Chtimes("d", past, past))
			t.WriteFile("d2", nil, 0o644)
			t.Stat("d")
			t.Check(!t.MtimeAfter("d", past), "a change elsewhere changed the directory's mtime")
		}},
		{Name: "dir/readdir_reflects_changes", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.WriteFile("d/a", nil, 0o644)
			t.WriteFile("d/b", nil, 0o644)
			t.ReadDir("d")
			t.Must(t.Rename("d/a", "d/c"))
			t.Must(t.Remove("d/b"))
			t.Must(t.Mkdir("d/e", 0o755))
			des, _ := t.ReadDir("d")
			expectNames(t, dirNames(des), "c", "e")
		}},
		{Name: "dir/open_handle_of_removed_dir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			f := t.MustOpenFile("d", os.O_RDONLY, 0)
			t.ExpectOK(t.Remove("d"))
			_, err := t.Stat("d")
			t.ExpectErr(err, syscall.ENOENT)
			// Linux: getdents on a removed directory fails with ENOENT.
			des, _ := f.ReadDir(-1)
			t.Check(len(des) == 0, "removed directory lists %d entries", len(des))
			f.Stat()
			f.Close()
		}},
	}
}

// writeRaw creates name with content, without recording.
func writeRaw(fsys FS, name string, content []byte) error {
	f, err := fsys.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
