package conformance

import (
	"os"
	"time"
)

// persistCases check that everything survives Restart (a clean stop and
// start of all weir services on the same data; nothing for the kernel).
func persistCases() []Case {
	return []Case{
		{Name: "persist/tree_contents_modes_times", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/e", 0o700))
			t.WriteFile("d/e/f", pattern(7, 70000), 0o600)
			t.WriteFile("x", s("x"), 0o755)
			t.Must(t.Chtimes("x", time.Unix(1_000_000_000, 7), time.Unix(1_000_000_001, 8)))
			f := t.MustOpenFile("sparse", os.O_RDWR|os.O_CREATE, 0o644)
			f.WriteAt(s("far"), 5*gib+1)
			f.Close()
			t.Restart()
			t.ReadDir(".")
			t.ReadDir("d")
			t.Stat("d/e")
			t.Stat("d/e/f")
			b, _ := t.ReadFile("d/e/f")
			t.ExpectData(b, pattern(7, 70000))
			t.Stat("x")
			t.Times("x")
			f = t.MustOpenFile("sparse", os.O_RDONLY, 0)
			b, _ = f.ReadAt(8, 5*gib-4)
			t.ExpectData(b, s("\x00\x00\x00\x00\x00far"))
			f.Close()
		}},
		{Name: "persist/renames_and_removes", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			for _, n := range []string{"a", "b", "c", "d/g"} {
				t.WriteFile(n, s(n), 0o644)
			}
			t.Must(t.Rename("a", "d/a"))
			t.Must(t.Remove("b"))
			t.Must(t.Rename("d/g", "c"))
			t.Must(t.Mkdir("gone", 0o755))
			t.Must(t.Remove("gone"))
			t.Restart()
			t.ReadDir(".")
			t.ReadDir("d")
			b, _ := t.ReadFile("c")
			t.ExpectData(b, s("d/g"))
		}},
		{Name: "persist/truncate_overwrite_twice", Run: func(t *Tester) {
			t.WriteFile("f", pattern(9, 9000), 0o644)
			t.Must(t.Truncate("f", 100))
			t.Must(t.Truncate("f", 5000))
			f := t.MustOpenFile("f", os.O_WRONLY, 0)
			f.WriteAt(s("mid"), 2000)
			f.Close()
			t.Restart()
			b, _ := t.ReadFile("f")
			want := append(pattern(9, 100), make([]byte, 4900)...)
			copy(want[2000:], "mid")
			t.ExpectData(b, want)
			f = t.MustOpenFile("f", os.O_WRONLY|os.O_APPEND, 0)
			f.Write(s("end"))
			f.Close()
			t.Restart()
			b, _ = t.ReadFile("f")
			t.ExpectData(b, append(want, "end"...))
		}},
		{Name: "persist/owner_and_mode", Needs: NeedRoot, Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o640)
			t.Must(t.Chown("f", ChildUID, 4242))
			t.Must(t.Chmod("f", os.ModeSetgid|0o750))
			t.Restart()
			t.Owner("f")
			t.Stat("f")
		}},
	}
}
