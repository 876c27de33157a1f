package conformance

import (
	"os"
	"strings"
	"syscall"
)

func nameCases() []Case {
	long255 := strings.Repeat("n", 255)
	long256 := strings.Repeat("n", 256)
	return []Case{
		{Name: "names/empty_enoent", Run: func(t *Tester) {
			_, err := t.Open("")
			t.ExpectErr(err, syscall.ENOENT)
			_, err = t.OpenFile("", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.ENOENT)
			_, err = t.Stat("")
			t.ExpectErr(err, syscall.ENOENT)
			t.ExpectErr(t.Mkdir("", 0o755), syscall.ENOENT)
			t.ExpectErr(t.MkdirAll("", 0o755), syscall.ENOENT)
			t.ExpectErr(t.Remove(""), syscall.ENOENT)
			t.WriteFile("a", nil, 0o644)
			t.ExpectErr(t.Rename("a", ""), syscall.ENOENT)
			t.ExpectErr(t.Rename("", "b"), syscall.ENOENT)
			t.ExpectErr(t.Chmod("", 0o644), syscall.ENOENT)
			t.ExpectErr(t.Chtimes("", past, past), syscall.ENOENT)
			t.ExpectErr(t.Truncate("", 0), syscall.ENOENT)
			_, err = t.ReadDir("")
			t.ExpectErr(err, syscall.ENOENT)
			t.ReadDir(".")
		}},
		{Name: "names/removeall_empty_is_noop", Run: func(t *Tester) {
			// os.RemoveAll("") returns nil without asking the kernel.
			t.WriteFile("a", nil, 0o644)
			t.ExpectOK(t.RemoveAll(""))
			t.ReadDir(".")
		}},
		{Name: "names/nul_einval", Run: func(t *Tester) {
			t.WriteFile("a", nil, 0o644)
			_, err := t.OpenFile("b\x00c", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EINVAL)
			_, err = t.Stat("a\x00")
			t.ExpectErr(err, syscall.EINVAL)
			t.ExpectErr(t.Mkdir("d\x00", 0o755), syscall.EINVAL)
			t.ExpectErr(t.Rename("a", "b\x00"), syscall.EINVAL)
			t.ExpectErr(t.Remove("a\x00b"), syscall.EINVAL)
			t.ExpectErr(t.Chmod("a\x00", 0o600), syscall.EINVAL)
			t.ReadDir(".")
		}},
		{Name: "names/component_255_ok", Run: func(t *Tester) {
			other := strings.Repeat("m", 255)
			f, err := t.OpenFile(long255, os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectOK(err)
			if f != nil {
				f.Write(s("long"))
				f.Close()
			}
			t.Stat(long255)
			t.ExpectOK(t.Rename(long255, other))
			t.ExpectOK(t.Mkdir(long255, 0o755))
			t.ExpectOK(t.Rename(other, long255+"/"+other))
			t.ReadDir(".")
			b, _ := t.ReadFile(long255 + "/" + other)
			t.ExpectData(b, s("long"))
		}},
		{Name: "names/component_256_enametoolong", Run: func(t *Tester) {
			t.WriteFile("a", nil, 0o644)
			_, err := t.OpenFile(long256, os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.ENAMETOOLONG)
			_, err = t.Stat(long256)
			t.ExpectErr(err, syscall.ENAMETOOLONG)
			t.ExpectErr(t.Mkdir(long256, 0o755), syscall.ENAMETOOLONG)
			t.ExpectErr(t.Rename("a", long256), syscall.ENAMETOOLONG)
			t.ExpectErr(t.Rename(long256, "b"), syscall.ENAMETOOLONG)
			_, err = t.Stat(long256 + "/x")
			t.ExpectErr(err, syscall.ENAMETOOLONG)
			t.ReadDir(".")
		}},
		{Name: "names/path_too_long", Run: func(t *Tester) {
			// Far beyond PATH_MAX (4096), so the kernel target's own
			// directory prefix does not matter.
			long := strings.Repeat("abcdefgh/", 700)
			_, err := t.Stat(long)
			t.ExpectErr(err, syscall.ENAMETOOLONG)
			_, err = t.OpenFile(long+"f", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.ENAMETOOLONG)
		}},
		{Name: "names/deep_path_ok", Run: func(t *Tester) {
			deep := strings.TrimSuffix(strings.Repeat(strings.Repeat("d", 49)+"/", 40), "/")
			t.ExpectOK(t.MkdirAll(deep, 0o755))
			t.WriteFile(deep+"/f", s("deep"), 0o644)
			t.Stat(deep + "/f")
			t.ExpectOK(t.RemoveAll(strings.Repeat("d", 49)))
			t.ReadDir(".")
		}},
		{Name: "names/parent_is_file_enotdir", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			_, err := t.Open("f/x")
			t.ExpectErr(err, syscall.ENOTDIR)
			_, err = t.OpenFile("f/x", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.ENOTDIR)
			_, err = t.Stat("f/x")
			t.ExpectErr(err, syscall.ENOTDIR)
			_, err = t.Stat("f/x/y")
			t.ExpectErr(err, syscall.ENOTDIR)
			t.ExpectErr(t.Chmod("f/x", 0o644), syscall.ENOTDIR)
		}},
		{Name: "names/dotdot_inside", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d/sub", 0o755))
			t.WriteFile("f", s("top"), 0o644)
			b, _ := t.ReadFile("d/../f")
			t.ExpectData(b, s("top"))
			b, _ = t.ReadFile("d/sub/../../f")
			t.ExpectData(b, s("top"))
			t.WriteFile("d/sub/../g", s("in d"), 0o644)
			t.ReadDir("d")
			t.Stat("d/sub/..")
			t.ExpectOK(t.Rename("d/../f", "d/sub/../../h"))
			t.ReadDir(".")
		}},
		{Name: "names/dotdot_missing_component_enoent", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			_, err := t.Stat("nope/../f")
			t.ExpectErr(err, syscall.ENOENT)
			_, err = t.Open("nope/../f")
			t.ExpectErr(err, syscall.ENOENT)
		}},
		{Name: "names/dotdot_through_file_enotdir", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			_, err := t.Stat("f/../f")
			t.ExpectErr(err, syscall.ENOTDIR)
			_, err = t.OpenFile("f/../g", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.ENOTDIR)
			t.ExpectErr(t.Mkdir("f/../e", 0o755), syscall.ENOTDIR)
		}},
		{Name: "names/dot_components", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.WriteFile("./f", s("x"), 0o644)
			t.WriteFile("./d/./g", s("y"), 0o644)
			t.Stat("f")
			t.Stat(".//f")
			t.Stat("d/./././g")
			t.Stat("d/.")
			t.Stat(".")
			t.ReadDir("./d/.")
		}},
		{Name: "names/dir_dot_as_last_component", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectErr(t.Mkdir("d/.", 0o755), syscall.EEXIST)
			_, err := t.OpenFile("d/.", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EISDIR)
			t.ExpectErr(t.Remove("d/."), syscall.EINVAL)
			t.ExpectErr(t.Mkdir("d/..", 0o755), syscall.EEXIST)
			t.Stat("d/.")
			t.Stat("d/..")
		}},
		{Name: "names/dotdot_at_root_stays_at_root", Run: func(t *Tester) {
			t.WriteFile("f", s("in root"), 0o644)
			t.Must(t.Mkdir("d", 0o755))
			t.Stat("..")
			t.Stat("../..")
			b, _ := t.ReadFile("../f")
			t.ExpectData(b, s("in root"))
			b, _ = t.ReadFile("../../../f")
			t.ExpectData(b, s("in root"))
			b, _ = t.ReadFile("d/../../f")
			t.ExpectData(b, s("in root"))
			t.WriteFile("../x", s("x"), 0o644)
			t.ExpectOK(t.Mkdir("../../e", 0o755))
			t.ExpectOK(t.Rename("../x", "d/../../y"))
			des, _ := t.ReadDir("..")
			expectNames(t, dirNames(des), "d", "e", "f", "y")
			t.ReadDir("../d/..")
		}},
		{Name: "names/dotdot_at_root_last_component", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectErr(t.Mkdir("..", 0o755), syscall.EEXIST)
			_, err := t.OpenFile("..", os.O_RDWR|os.O_CREATE, 0o644)
			t.ExpectErr(err, syscall.EISDIR)
			_, err = t.OpenFile("..", os.O_RDWR, 0)
			t.ExpectErr(err, syscall.EISDIR)
			t.Remove("..")
			t.Remove("../")
			t.Rename("..", "x")
			t.Rename("d", "..")
			t.ReadDir(".")
		}},
		{Name: "names/leading_slash_is_root", Run: func(t *Tester) {
			t.WriteFile("/a", s("A"), 0o644)
			t.Stat("a")
			t.Stat("/a")
			t.Stat("//a")
			t.Must(t.Mkdir("/d", 0o755))
			t.ExpectOK(t.Rename("/a", "/d/b"))
			t.Stat("/")
			t.ReadDir("/")
			t.ReadDir("/d")
			t.Stat("/..")
		}},
		{Name: "names/trailing_slash_on_file_enotdir", Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			_, err := t.Stat("f/")
			t.ExpectErr(err, syscall.ENOTDIR)
			_, err = t.Stat("f//")
			t.ExpectErr(err, syscall.ENOTDIR)
			t.ExpectErr(t.Chmod("f/", 0o600), syscall.ENOTDIR)
			t.ExpectErr(t.Truncate("f/", 0), syscall.ENOTDIR)
			t.ExpectErr(t.Remove("f/"), syscall.ENOTDIR)
			t.Stat("f")
		}},
		{Name: "names/trailing_slash_on_dir_ok", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.WriteFile("d/f", nil, 0o644)
			t.Stat("d/")
			t.Stat("d//")
			t.ReadDir("d/")
			t.ExpectOK(t.Chmod("d/", 0o700))
			t.Stat("d")
		}},
		{Name: "names/double_slashes", Run: func(t *Tester) {
			t.Must(t.MkdirAll("d//e", 0o755))
			t.WriteFile("d//e///f", s("x"), 0o644)
			t.Stat("d/e/f")
			t.ReadDir("d//e")
			t.ExpectOK(t.Rename("d//e//f", "d///g"))
			t.ReadDir("d")
		}},
		{Name: "names/any_bytes_but_slash_and_nul", Run: func(t *Tester) {
			names := []string{"sp ace", "new\nline", "tab\t", "ütf8-名前", "\xff\xfe", "-dash", "...", ".hidden", "back\\slash", "*?[", "A", "a"}
			for _, n := range names {
				t.WriteFile(n, s(n), 0o644)
			}
			des, _ := t.ReadDir(".")
			expectNames(t, dirNames(des), names...)
			for _, n := range names {
				b, _ := t.ReadFile(n)
				t.ExpectData(b, s(n))
			}
		}},
	}
}
