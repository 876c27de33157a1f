package conformance

import (
	"os"
	"syscall"
)

// rootCases check that root overrides permission bits (CAP_DAC_OVERRIDE,
// CAP_FOWNER, CAP_CHOWN) as on Linux.
func rootCases() []Case {
	return []Case{
		{Name: "root/reads_and_writes_mode_0000", Needs: NeedRoot, Run: func(t *Tester) {
			t.WriteFile("f", s("secret"), 0o000)
			f, err := t.OpenFile("f", os.O_RDWR, 0)
			t.ExpectOK(err)
			if f != nil {
				b, _ := f.Read(10)
				t.ExpectData(b, s("secret"))
				f.Close()
			}
			t.ExpectOK(t.Truncate("f", 3))
		}},
		{Name: "root/creates_in_0555_and_searches_0000", Needs: NeedRoot, Run: func(t *Tester) {
			t.Must(t.Mkdir("ro", 0o555))
			t.WriteFile("ro/f", s("x"), 0o644)
			t.ExpectOK(t.Rename("ro/f", "ro/g"))
			t.Must(t.Mkdir("closed", 0o755))
			t.WriteFile("closed/f", s("x"), 0o644)
			t.Must(t.Chmod("closed", 0o000))
			t.Stat("closed/f")
			t.ReadDir("closed")
			t.ExpectOK(t.Remove("ro/g"))
		}},
		{Name: "root/chown_and_chgrp", Needs: NeedRoot, Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.Must(t.Mkdir("d", 0o755))
			t.ExpectOK(t.Chown("f", ChildUID, ChildGID))
			uid, gid := t.Owner("f")
			t.Check(uid == ChildUID && gid == ChildGID, "owner %d:%d", uid, gid)
			t.ExpectOK(t.Chown("f", -1, 4242))
			t.Owner("f")
			t.ExpectOK(t.Chown("f", 1000, -1))
			t.Owner("f")
			t.ExpectOK(t.Chown("d", 1000, 1000))
			t.Owner("d")
		}},
		{Name: "root/chmod_and_chtimes_of_others_files", Needs: NeedRoot, Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o644)
			t.Must(t.Chown("f", 1000, 1000))
			t.ExpectOK(t.Chmod("f", 0o600))
			t.ExpectOK(t.Chtimes("f", past, past))
			t.Stat("f")
			t.Times("f")
		}},
		{Name: "root/chown_clears_setuid", Needs: NeedRoot, Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o755)
			t.Must(t.Chmod("f", os.ModeSetuid|os.ModeSetgid|0o755))
			t.ExpectOK(t.Chown("f", ChildUID, ChildGID))
			t.Stat("f")
			t.Must(t.Chmod("f", os.ModeSetuid|0o755))
			t.ExpectOK(t.Chown("f", -1, -1))
			t.Stat("f")
		}},
		{Name: "root/write_keeps_setuid", Needs: NeedRoot, Run: func(t *Tester) {
			t.WriteFile("f", s("x"), 0o755)
			t.Must(t.Chmod("f", os.ModeSetuid|0o755))
			f := t.MustOpenFile("f", os.O_WRONLY, 0)
			f.Write(s("y"))
			f.Close()
			t.Stat("f")
		}},
		{Name: "root/sticky_dir_no_restriction", Needs: NeedRoot, Run: func(t *Tester) {
			t.Must(t.Mkdir("tmp", 0o777))
			t.Must(t.Chmod("tmp", os.ModeSticky|0o777))
			t.WriteFile("tmp/other", s("x"), 0o644)
			t.Must(t.Chown("tmp/other", 1000, 1000))
			t.ExpectOK(t.Rename("tmp/other", "tmp/moved"))
			t.ExpectOK(t.Remove("tmp/moved"))
			_, err := t.Stat("tmp/moved")
			t.ExpectErr(err, syscall.ENOENT)
		}},
	}
}
