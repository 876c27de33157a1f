package conformance

import (
	"io"
	"os"
	"syscall"
)

func unlinkCases() []Case {
	return []Case{
		{Name: "unlink/open_file_stays_readable", Run: func(t *Tester) {
			t.WriteFile("a", s("still here"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			t.ExpectOK(t.Remove("a"))
			_, err := t.Stat("a")
			t.ExpectErr(err, syscall.ENOENT)
			b, _ := f.Read(100)
			t.ExpectData(b, s("still here"))
			b, _ = f.ReadAt(4, 6)
			t.ExpectData(b, s("here"))
			f.Stat()
			t.ReadDir(".")
			f.Close()
			_, err = t.Stat("a")
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "unlink/open_file_stays_writable", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.Write(s("before"))
			t.ExpectOK(t.Remove("a"))
			_, err := f.Write(s(" after"))
			t.ExpectOK(err)
			f.WriteAt(pattern(5, 10000), 70000)
			t.ExpectOK(f.Truncate(80000))
			b, _ := f.ReadAt(12, 0)
			t.ExpectData(b, s("before after"))
			b, _ = f.ReadAt(10000, 70000)
			t.ExpectData(b, pattern(5, 10000))
			t.ExpectOK(f.Sync())
			f.Stat()
			f.Close()
			t.ReadDir(".")
		}},
		{Name: "unlink/recreate_same_name", Run: func(t *Tester) {
			t.WriteFile("a", s("old"), 0o644)
			f := t.MustOpenFile("a", os.O_RDWR, 0)
			t.ExpectOK(t.Remove("a"))
			t.WriteFile("a", s("new file"), 0o600)
			f.WriteAt(s("OLD"), 0)
			b, _ := f.ReadAt(10, 0)
			t.ExpectData(b, s("OLD"))
			f.Close()
			b, _ = t.ReadFile("a")
			t.ExpectData(b, s("new file"))
			t.Stat("a")
		}},
		{Name: "unlink/two_handles_last_close", Run: func(t *Tester) {
			t.WriteFile("a", s("shared"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			g := t.MustOpenFile("a", os.O_RDWR, 0)
			t.ExpectOK(t.Remove("a"))
			f.Close()
			g.WriteAt(s("S"), 0)
			b, _ := g.ReadAt(10, 0)
			t.ExpectData(b, s("Shared"))
			_, err := g.ReadAt(1, 6)
			t.ExpectErr(err, io.EOF)
			g.Close()
		}},
		{Name: "unlink/renamed_over_while_open", Run: func(t *Tester) {
			t.WriteFile("a", s("a-data"), 0o644)
			t.WriteFile("b", s("b-data"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			t.ExpectOK(t.Rename("b", "a"))
			b, _ := f.Read(10)
			t.ExpectData(b, s("a-data"))
			f.Stat()
			f.Close()
			b, _ = t.ReadFile("a")
			t.ExpectData(b, s("b-data"))
		}},
		{Name: "unlink/large_sparse_open_after_remove", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.WriteAt(s("far"), 5*gib)
			t.ExpectOK(t.Remove("a"))
			b, _ := f.ReadAt(6, 5*gib-3)
			t.ExpectData(b, s("\x00\x00\x00far"))
			f.Stat()
			f.Close()
		}},
	}
}
