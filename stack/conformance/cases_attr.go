package conformance

import (
	"os"
	"syscall"
	"time"
)

func attrCases() []Case {
	t1 := time.Unix(1_234_567_890, 123_456_789)
	t2 := time.Unix(1_500_000_000, 987_654_321)
	return []Case{
		{Name: "attr/stat_file_and_dir", Run: func(t *Tester) {
			t.WriteFile("f", pattern(1, 12345), 0o640)
			t.Must(t.Mkdir("d", 0o750))
			fi, _ := t.Stat("f")
			t.Check(fi != nil && fi.Size() == 12345 && fi.Mode() == 0o640 && !fi.IsDir(), "file: %v", fi)
			fi, _ = t.Stat("d")
			t.Check(fi != nil && fi.IsDir() && fi.Mode() == os.ModeDir|0o750, "dir: %v", fi)
		}},
		{Name: "attr/stat_root", Run: func(t *Tester) {
			// A fresh root is an empty directory with mode 0755.
			fi, _ := t.Stat(".")
			t.Check(fi != nil && fi.Mode() == os.ModeDir|0o755, "root: %v", fi)
			t.ReadDir(".")
		}},
		{Name: "attr/stat_missing_enoent", Run: func(t *Tester) {
			_, err := t.Stat("missing")
			t.ExpectErr(err, syscall.ENOENT)
			_, err = t.Stat("missing/x")
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "attr/fileinfo_name_is_base", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/e", 0o755))
			t.WriteFile("d/e/f", nil, 0o644)
			for _, n := range []string{"d/e/f", "d/e/", "d/e//", "./d", "d/e/.."} {
				t.Stat(n)
			}
			f := t.MustOpenFile("d/e/f", os.O_RDONLY, 0)
			f.Stat()
			f.Close()
		}},
		{Name: "attr/fstat_matches_stat", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o711))
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o604)
			f.WriteAt(s("abc"), 7000)
			ffi, _ := f.Stat()
			pfi, _ := t.Stat("a")
			t.Check(ffi != nil && pfi != nil && ffi.Size() == pfi.Size() && ffi.Mode() == pfi.Mode(), "File.Stat %v, Stat %v", ffi, pfi)
			t.Must(t.Chmod("a", 0o600))
			f.Stat()
			f.Close()
			g := t.MustOpenFile("d", os.O_RDONLY, 0)
			g.Stat()
			g.Close()
		}},
		// utimensat on a file open for writing, after a write: the times
		// set stand, while it is open and after it is closed.
		{Name: "attr/chtimes_after_write_while_open", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.Write(s("data"))
			set := time.Unix(1_500_000_000, 0)
			t.Chtimes("a", set, set)
			_, mt := t.Times("a")
			t.Check(mt.Equal(set), "mtime %v while open, want %v", mt, set)
			f.Close()
			_, mt = t.Times("a")
			t.Check(mt.Equal(set), "mtime %v after close, want %v", mt, set)
		}},
		{Name: "attr/chmod_file", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			for _, m := range []os.FileMode{0o600, 0o000, 0o777, 0o421, 0o644} {
				t.ExpectOK(t.Chmod("f", m))
				fi, _ := t.Stat("f")
				t.Check(fi != nil && fi.Mode() == m, "after chmod %v: %v", m, fi)
			}
		}},
		{Name: "attr/chmod_dir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectOK(t.Chmod("d", 0o700))
			t.Stat("d")
			t.ExpectOK(t.Chmod("d", 0o777))
			t.Stat("d")
			t.ExpectOK(t.Chmod(".", 0o750))
			t.Stat(".")
			t.ExpectOK(t.Chmod(".", 0o755))
		}},
		{Name: "attr/chmod_special_bits", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o755)
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectOK(t.Chmod("f", os.ModeSetuid|os.ModeSetgid|0o755))
			fi, _ := t.Stat("f")
			t.Check(fi != nil && fi.Mode() == os.ModeSetuid|os.ModeSetgid|0o755, "setuid/setgid: %v", fi)
			t.ExpectOK(t.Chmod("d", os.ModeSticky|0o777))
			fi, _ = t.Stat("d")
			t.Check(fi != nil && fi.Mode() == os.ModeDir|os.ModeSticky|0o777, "sticky: %v", fi)
			t.ExpectOK(t.Chmod("f", 0o644))
			t.Stat("f")
		}},
		{Name: "attr/chmod_keeps_mtime_and_data", Run: func(t *Tester) {
			t.WriteFile("f", s("data"), 0o644)
			t.Must(t.Chtimes("f", past, past))
			t.ExpectOK(t.Chmod("f", 0o600))
			t.Check(!t.MtimeAfter("f", past), "chmod changed mtime")
			b, _ := t.ReadFile("f")
			t.ExpectData(b, s("data"))
		}},
		{Name: "attr/chmod_missing_enoent", Run: func(t *Tester) {
			t.ExpectErr(t.Chmod("missing", 0o644), syscall.ENOENT)
		}},
		{Name: "attr/chown_to_self", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			uid, gid := t.Owner("f")
			t.ExpectOK(t.Chown("f", -1, -1))
			t.ExpectOK(t.Chown("f", uid, gid))
			t.ExpectOK(t.Chown("f", uid, -1))
			u2, g2 := t.Owner("f")
			t.Check(u2 == uid && g2 == gid, "owner changed to %d:%d", u2, g2)
			t.Stat("f")
		}},
		{Name: "attr/chown_missing_enoent", Run: func(t *Tester) {
			t.ExpectErr(t.Chown("missing", -1, -1), syscall.ENOENT)
		}},
		{Name: "attr/new_file_owned_by_caller", Run: func(t *Tester) {
			t.WriteFile("f", nil, 0o644)
			t.Must(t.Mkdir("d", 0o755))
			uid, gid := t.Owner("f")
			t.Check(uid == os.Geteuid() && gid == os.Getegid(), "file owned by %d:%d", uid, gid)
			uid, gid = t.Owner("d")
			t.Check(uid == os.Geteuid() && gid == os.Getegid(), "dir owned by %d:%d", uid, gid)
		}},
		{Name: "attr/chtimes_exact", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectOK(t.Chtimes("f", t1, t2))
			a, m := t.Times("f")
			t.Check(a.Equal(t1) && m.Equal(t2), "times %v %v", a, m)
			fi, _ := t.Stat("f")
			t.Check(fi != nil && fi.ModTime().Equal(t2), "ModTime %v", fi)
		}},
		{Name: "attr/chtimes_zero_leaves_unchanged", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.Must(t.Chtimes("f", t1, t1))
			t.ExpectOK(t.Chtimes("f", time.Time{}, t2))
			a, m := t.Times("f")
			t.Check(a.Equal(t1) && m.Equal(t2), "times %v %v", a, m)
			t.ExpectOK(t.Chtimes("f", t2, time.Time{}))
			a, m = t.Times("f")
			t.Check(a.Equal(t2) && m.Equal(t2), "times %v %v", a, m)
		}},
		{Name: "attr/chtimes_dir", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectOK(t.Chtimes("d", t2, t1))
			t.Times("d")
		}},
		{Name: "attr/chtimes_before_epoch_and_far_future", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.ExpectOK(t.Chtimes("f", time.Unix(-1_000_000, 5), time.Unix(-86400*365*30, 999_999_999)))
			t.Times("f")
			t.ExpectOK(t.Chtimes("f", time.Unix(10_000_000_000, 1), time.Unix(10_000_000_000, 2)))
			t.Times("f")
		}},
		{Name: "attr/chtimes_missing_enoent", Run: func(t *Tester) {
			t.ExpectErr(t.Chtimes("missing", t1, t1), syscall.ENOENT)
		}},
	}
}
