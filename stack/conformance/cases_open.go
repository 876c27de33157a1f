package conformance

import (
	"io"
	"os"
	"syscall"
)

func openCases() []Case {
	return []Case{
		{Name: "open/create_new", Run: func(t *Tester) {
			f, err := t.OpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			t.Must(err)
			fi, err := f.Stat()
			t.ExpectOK(err)
			t.Check(fi != nil && fi.Size() == 0 && fi.Mode() == 0o644, "new file: %v", fi)
			t.Must(f.Close())
			t.Stat("a")
		}},
		{Name: "open/create_existing_keeps_content_and_mode", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f, err := t.OpenFile("a", os.O_RDWR|os.O_CREATE, 0o600)
			t.Must(err)
			t.Must(f.Close())
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("hello"))
			fi, _ := t.Stat("a")
			t.Check(fi != nil && fi.Mode() == 0o644, "perm of an existing file changed: %v", fi)
		}},
		{Name: "open/excl_existing_eexist", Run: func(t *Tester) {
			t.WriteFile("a", s("x"), 0o644)
			_, err := t.OpenFile("a", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			t.ExpectErr(err, syscall.EEXIST)
			_, err = t.OpenFile("a", os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_TRUNC, 0o644)
			t.ExpectErr(err, syscall.EEXIST)
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("x"))
		}},
		{Name: "open/excl_existing_dir_eexist", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			_, err := t.OpenFile("d", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			t.ExpectErr(err, syscall.EEXIST)
		}},
		{Name: "open/excl_new", Run: func(t *Tester) {
			f, err := t.OpenFile("a", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			t.ExpectOK(err)
			if f != nil {
				f.Write(s("new"))
				f.Close()
			}
			t.Stat("a")
		}},
		{Name: "open/trunc", Run: func(t *Tester) {
			t.WriteFile("a", s("hello world"), 0o644)
			f := t.MustOpenFile("a", os.O_RDWR|os.O_TRUNC, 0)
			fi, _ := f.Stat()
			t.Check(fi != nil && fi.Size() == 0, "O_TRUNC left %v", fi)
			f.Write(s("hi"))
			f.Close()
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("hi"))
		}},
		{Name: "open/trunc_rdonly", Run: func(t *Tester) {
			// POSIX leaves O_RDONLY|O_TRUNC unspecified; Linux truncates.
			t.WriteFile("a", s("hello"), 0o644)
			f, err := t.OpenFile("a", os.O_RDONLY|os.O_TRUNC, 0)
			if err == nil {
				f.Close()
			}
			t.Stat("a")
		}},
		{Name: "open/trunc_missing_without_create_enoent", Run: func(t *Tester) {
			_, err := t.OpenFile("a", os.O_WRONLY|os.O_TRUNC, 0)
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "open/append_writes_at_end_after_seek", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f := t.MustOpenFile("a", os.O_WRONLY|os.O_APPEND, 0)
			f.Write(s(" abc"))
			f.Seek(0, io.SeekStart)
			f.Write(s(" def"))
			pos, _ := f.Seek(0, io.SeekCurrent)
			t.Check(pos == 13, "offset after append is %d, want 13", pos)
			f.Close()
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("hello abc def"))
		}},
		{Name: "open/append_rdwr_reads_from_start", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f := t.MustOpenFile("a", os.O_RDWR|os.O_APPEND, 0)
			b, _ := f.Read(3)
			t.ExpectData(b, s("hel"))
			f.Write(s("!"))
			f.Seek(1, io.SeekStart)
			b, _ = f.Read(10)
			t.ExpectData(b, s("ello!"))
			f.Close()
		}},
		{Name: "open/append_create", Run: func(t *Tester) {
			for range 3 {
				f := t.MustOpenFile("log", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
				f.Write(s("line\n"))
				f.Close()
			}
			b, _ := t.ReadFile("log")
			t.ExpectData(b, s("line\nline\nline\n"))
		}},
		{Name: "open/rdonly_write_ebadf", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			_, err := f.Write(s("x"))
			t.ExpectErr(err, syscall.EBADF)
			_, err = f.WriteAt(s("x"), 1)
			t.ExpectErr(err, syscall.EBADF)
			f.Close()
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("hello"))
		}},
		{Name: "open/wronly_read_ebadf", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f := t.MustOpenFile("a", os.O_WRONLY, 0)
			_, err := f.Read(5)
			t.ExpectErr(err, syscall.EBADF)
			_, err = f.ReadAt(5, 0)
			t.ExpectErr(err, syscall.EBADF)
			f.Close()
		}},
		{Name: "open/missing_enoent", Run: func(t *Tester) {
			_, err := t.Open("nope")
			t.ExpectErr(err, syscall.ENOENT)
			_, err = t.OpenFile("nope", os.O_RDWR, 0)
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "open/create_in_missing_dir_enoent", Run: func(t *Tester) {
			_, err := t.OpenFile("nodir/a", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.ENOENT)
			_, err = t.OpenFile("nodir/sub/a", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "open/dir_for_write_eisdir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			_, err := t.OpenFile("d", os.O_WRONLY, 0)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = t.OpenFile("d", os.O_RDWR, 0)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = t.OpenFile("d", os.O_WRONLY|os.O_TRUNC, 0)
			t.ExpectErr(err, syscall.EISDIR)
		}},
		{Name: "open/dir_rdonly_read_eisdir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			f := t.MustOpenFile("d", os.O_RDONLY, 0)
			_, err := f.Read(10)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = f.ReadAt(10, 0)
			t.ExpectErr(err, syscall.EISDIR)
			f.Stat()
			f.Close()
		}},
		{Name: "open/create_dir_eisdir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			_, err := t.OpenFile("d", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = t.OpenFile("d/", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = t.OpenFile("d/", os.O_RDONLY|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = t.OpenFile("new/", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EISDIR)
			t.Stat("new")
		}},
		{Name: "open/file_trailing_slash_enotdir", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			_, err := t.Open("f/")
			t.ExpectErr(err, syscall.ENOTDIR)
			_, err = t.OpenFile("f/", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = t.Open("f/.")
			t.ExpectErr(err, syscall.ENOTDIR)
		}},
		{Name: "open/create_perm_umask", Run: func(t *Tester) {
			// The suite runs with umask 022 (MainHook).
			for _, c := range []struct {
				name string
				perm os.FileMode
			}{{"a", 0o777}, {"b", 0o666}, {"c", 0o600}, {"d", 0o640}, {"e", 0o000}} {
				f := t.MustOpenFile(c.name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, c.perm)
				f.Close()
				fi, _ := t.Stat(c.name)
				t.Check(fi != nil && fi.Mode() == c.perm&^0o022, "%s: mode %v", c.name, fi)
			}
		}},
		{Name: "open/create_readonly_mode_fd_writable", Run: func(t *Tester) {
			// The new file's mode applies to later opens, not this one.
			f, err := t.OpenFile("a", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o444)
			t.Must(err)
			_, err = f.Write(s("still writable"))
			t.ExpectOK(err)
			f.Close()
			t.Stat("a")
		}},
		{Name: "open/name_is_given_name", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			f := t.MustOpenFile("d/./a", os.O_RDWR|os.O_CREATE, 0o644)
			t.Check(f.Name() == "d/./a", "File.Name is not the name given")
			f.Stat()
			f.Close()
		}},
		{Name: "open/closed_file_errclosed", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectOK(f.Close())
			t.ExpectErr(f.Close(), os.ErrClosed)
			_, err := f.Read(1)
			t.ExpectErr(err, os.ErrClosed)
			_, err = f.Write(s("x"))
			t.ExpectErr(err, os.ErrClosed)
			_, err = f.Stat()
			t.ExpectErr(err, os.ErrClosed)
		}},
		{Name: "open/two_handles_share_data_not_offset", Run: func(t *Tester) {
			t.WriteFile("a", s("0123456789"), 0o644)
			f := t.MustOpenFile("a", os.O_RDWR, 0)
			g := t.MustOpenFile("a", os.O_RDWR, 0)
			f.Read(4)
			f.Write(s("XY"))
			b, _ := g.Read(8)
			t.ExpectData(b, s("0123XY67"))
			g.Write(s("Z"))
			b, _ = f.Read(10)
			t.ExpectData(b, s("67Z9"))
			f.Close()
			g.Close()
		}},
	}
}
