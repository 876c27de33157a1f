package conformance

import (
	"os"
	"syscall"
)

// supplementary is a group the child of some permission cases belongs to.
const supplementary = 4242

// own gives name to the child's uid and gid (in Setup, as root).
func own(t *Tester, name string) { t.Must(t.Chown(name, ChildUID, ChildGID)) }

// permCases run as uid 65534 in a child process after a Setup as root. The
// root directory belongs to root (mode 0755) unless Setup gives it away.
func permCases() []Case {
	return []Case{
		{Name: "perm/open_mode_0000_eacces", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("f", s("secret"), 0o644)
				own(t, "f")
				t.Must(t.Chmod("f", 0o000))
			},
			Run: func(t *Tester) {
				_, err := t.Open("f")
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("f", os.O_WRONLY, 0)
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("f", os.O_RDWR, 0)
				t.ExpectErr(err, syscall.EACCES)
				t.Stat("f")
			}},
		{Name: "perm/write_mode_0444_eacces", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("f", s("read only"), 0o444)
				own(t, "f")
			},
			Run: func(t *Tester) {
				_, err := t.OpenFile("f", os.O_WRONLY, 0)
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("f", os.O_RDWR, 0)
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("f", os.O_WRONLY|os.O_APPEND, 0)
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("f", os.O_RDONLY|os.O_TRUNC, 0)
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("f", os.O_WRONLY|os.O_CREATE, 0o644)
				t.ExpectErr(err, syscall.EACCES)
				t.ExpectErr(t.Truncate("f", 0), syscall.EACCES)
				b, _ := t.ReadFile("f")
				t.ExpectData(b, s("read only"))
			}},
		{Name: "perm/create_in_0555_dir_eacces", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				own(t, ".")
				t.Must(t.Mkdir("d", 0o755))
				t.WriteFile("d/f", s("x"), 0o644)
				t.Must(t.Mkdir("d/sub", 0o755))
				own(t, "d/f")
				own(t, "d/sub")
				own(t, "d")
				t.Must(t.Chmod("d", 0o555))
			},
			Run: func(t *Tester) {
				_, err := t.OpenFile("d/x", os.O_RDWR|os.O_CREATE, 0o644)
				t.ExpectErr(err, syscall.EACCES)
				t.ExpectErr(t.Mkdir("d/y", 0o755), syscall.EACCES)
				t.ExpectErr(t.Remove("d/f"), syscall.EACCES)
				t.ExpectErr(t.Remove("d/sub"), syscall.EACCES)
				t.ExpectErr(t.Rename("d/f", "d/g"), syscall.EACCES)
				t.ExpectErr(t.Rename("d/f", "moved"), syscall.EACCES)
				t.WriteFile("other", nil, 0o644)
				t.ExpectErr(t.Rename("other", "d/other"), syscall.EACCES)
				f, err := t.OpenFile("d/f", os.O_WRONLY, 0)
				t.ExpectOK(err)
				if f != nil {
					f.Write(s("y"))
					f.Close()
				}
				t.ReadDir("d")
			}},
		{Name: "perm/search_denied_0600_dir_eacces", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.Must(t.Mkdir("d", 0o755))
				t.WriteFile("d/f", s("x"), 0o644)
				own(t, "d")
				t.Must(t.Chmod("d", 0o600))
			},
			Run: func(t *Tester) {
				_, err := t.Stat("d/f")
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.Open("d/f")
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("d/g", os.O_RDWR|os.O_CREATE, 0o644)
				t.ExpectErr(err, syscall.EACCES)
				t.ExpectErr(t.Mkdir("d/e", 0o755), syscall.EACCES)
				t.Stat("d")
				t.ReadDir("d")
				t.ExpectOK(t.Chmod("d", 0o700))
				t.Stat("d/f")
			}},
		{Name: "perm/list_denied_0300_dir_eacces", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.Must(t.Mkdir("d", 0o755))
				t.WriteFile("d/f", s("x"), 0o644)
				own(t, "d")
				t.Must(t.Chmod("d", 0o300))
			},
			Run: func(t *Tester) {
				_, err := t.ReadDir("d")
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.Open("d")
				t.ExpectErr(err, syscall.EACCES)
				t.Stat("d/f")
				t.WriteFile("d/g", s("g"), 0o644)
				t.ExpectOK(t.Remove("d/g"))
			}},
		{Name: "perm/search_only_0111_dir", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.Must(t.Mkdir("d", 0o755))
				t.WriteFile("d/f", s("reachable"), 0o644)
				t.Must(t.Chmod("d", 0o111))
			},
			Run: func(t *Tester) {
				b, _ := t.ReadFile("d/f")
				t.ExpectData(b, s("reachable"))
				_, err := t.ReadDir("d")
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.OpenFile("d/g", os.O_RDWR|os.O_CREATE, 0o644)
				t.ExpectErr(err, syscall.EACCES)
			}},
		{Name: "perm/others_root_dir_not_writable", Needs: NeedNonRoot,
			Run: func(t *Tester) {
				_, err := t.OpenFile("x", os.O_RDWR|os.O_CREATE, 0o644)
				t.ExpectErr(err, syscall.EACCES)
				t.ExpectErr(t.Mkdir("d", 0o755), syscall.EACCES)
				t.ExpectErr(t.Chmod(".", 0o777), syscall.EPERM)
				t.Stat(".")
				t.ReadDir(".")
			}},
		{Name: "perm/chmod_others_file_eperm", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				own(t, ".")
				t.WriteFile("f", s("x"), 0o666)
				t.Must(t.Mkdir("d", 0o777))
			},
			Run: func(t *Tester) {
				t.ExpectErr(t.Chmod("f", 0o600), syscall.EPERM)
				t.ExpectErr(t.Chmod("d", 0o700), syscall.EPERM)
				t.Stat("f")
			}},
		{Name: "perm/chown_eperm", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				own(t, ".")
				t.WriteFile("mine", s("x"), 0o644)
				own(t, "mine")
				t.WriteFile("roots", s("x"), 0o666)
			},
			Run: func(t *Tester) {
				t.ExpectErr(t.Chown("mine", 0, -1), syscall.EPERM)
				t.ExpectErr(t.Chown("mine", 1000, 1000), syscall.EPERM)
				t.ExpectErr(t.Chown("mine", -1, 0), syscall.EPERM)
				t.ExpectErr(t.Chown("roots", ChildUID, -1), syscall.EPERM)
				t.ExpectOK(t.Chown("mine", ChildUID, ChildGID))
				t.ExpectOK(t.Chown("mine", -1, -1))
				t.Owner("mine")
				t.Owner("roots")
			}},
		{Name: "perm/chgrp_to_supplementary_group", Needs: NeedNonRoot, Groups: []uint32{supplementary},
			Setup: func(t *Tester) {
				t.WriteFile("f", s("x"), 0o644)
				own(t, "f")
			},
			Run: func(t *Tester) {
				t.ExpectOK(t.Chown("f", -1, supplementary))
				t.Owner("f")
				t.ExpectOK(t.Chown("f", ChildUID, ChildGID))
				t.Owner("f")
			}},
		{Name: "perm/chmod_setgid_dropped_outside_group", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("f", s("x"), 0o755)
				t.Must(t.Chown("f", ChildUID, supplementary))
			},
			Run: func(t *Tester) {
				t.ExpectOK(t.Chmod("f", os.ModeSetgid|0o755))
				t.Stat("f")
				t.ExpectOK(t.Chmod("f", os.ModeSetuid|0o755))
				t.Stat("f")
			}},
		{Name: "perm/chtimes_others_file_eperm", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("roots", s("x"), 0o666)
				t.WriteFile("mine", s("x"), 0o644)
				own(t, "mine")
			},
			Run: func(t *Tester) {
				t.ExpectErr(t.Chtimes("roots", past, past), syscall.EPERM)
				t.ExpectOK(t.Chtimes("mine", past, past))
				t.Times("mine")
			}},
		{Name: "perm/touch_needs_write_permission", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("writable", s("x"), 0o666)
				t.WriteFile("readonly", s("x"), 0o644)
				t.Must(t.Chmod("writable", 0o666)) // (past the umask)
			},
			Run: func(t *Tester) {
				// Both times now: root's file, writable by all, is the
				// caller's to touch; not one it may only read (EACCES);
				// explicit times stay the owner's (EPERM).
				t.ExpectOK(t.Touch("writable"))
				t.ExpectErr(t.Touch("readonly"), syscall.EACCES)
				t.ExpectErr(t.Chtimes("writable", past, past), syscall.EPERM)
				t.ExpectErr(t.Touch("missing"), syscall.ENOENT)
			}},
		{Name: "perm/sticky_dir_protects_others_entries", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.Must(t.Mkdir("tmp", 0o777))
				t.Must(t.Chmod("tmp", os.ModeSticky|0o777))
				t.WriteFile("tmp/other", s("x"), 0o666)
				t.Must(t.Chown("tmp/other", 1000, 1000))
				t.Must(t.Mkdir("tmp/otherdir", 0o777))
				t.Must(t.Chown("tmp/otherdir", 1000, 1000))
				t.WriteFile("tmp/mine", s("x"), 0o644)
				own(t, "tmp/mine")
			},
			Run: func(t *Tester) {
				t.ExpectErr(t.Remove("tmp/other"), syscall.EPERM)
				t.ExpectErr(t.Rename("tmp/other", "tmp/x"), syscall.EPERM)
				t.ExpectErr(t.Remove("tmp/otherdir"), syscall.EPERM)
				t.WriteFile("tmp/new", s("n"), 0o644)
				t.ExpectErr(t.Rename("tmp/new", "tmp/other"), syscall.EPERM)
				t.ExpectOK(t.Rename("tmp/mine", "tmp/mine2"))
				t.ExpectOK(t.Remove("tmp/mine2"))
				t.ExpectOK(t.Remove("tmp/new"))
				t.ReadDir("tmp")
			}},
		{Name: "perm/group_read_via_supplementary_group", Needs: NeedNonRoot, Groups: []uint32{supplementary},
			Setup: func(t *Tester) {
				t.WriteFile("f", s("group data"), 0o640)
				t.Must(t.Chown("f", 0, supplementary))
			},
			Run: func(t *Tester) {
				b, err := t.ReadFile("f")
				t.ExpectOK(err)
				t.ExpectData(b, s("group data"))
				_, err = t.OpenFile("f", os.O_WRONLY, 0)
				t.ExpectErr(err, syscall.EACCES)
			}},
		{Name: "perm/group_read_denied_without_group", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("f", s("group data"), 0o640)
				t.Must(t.Chown("f", 0, supplementary))
			},
			Run: func(t *Tester) {
				_, err := t.Open("f")
				t.ExpectErr(err, syscall.EACCES)
			}},
		{Name: "perm/owner_and_group_bits_take_precedence", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("owned", s("x"), 0o644)
				own(t, "owned")
				t.Must(t.Chmod("owned", 0o077))
				t.WriteFile("grouped", s("x"), 0o644)
				t.Must(t.Chown("grouped", 0, ChildGID))
				t.Must(t.Chmod("grouped", 0o707))
			},
			Run: func(t *Tester) {
				_, err := t.Open("owned")
				t.ExpectErr(err, syscall.EACCES)
				_, err = t.Open("grouped")
				t.ExpectErr(err, syscall.EACCES)
			}},
		{Name: "perm/write_clears_setuid_and_setgid", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("f", s("x"), 0o775)
				own(t, "f")
				t.Must(t.Chmod("f", os.ModeSetuid|os.ModeSetgid|0o775))
			},
			Run: func(t *Tester) {
				t.Stat("f")
				f, err := t.OpenFile("f", os.O_WRONLY, 0)
				t.Must(err)
				f.Write(s("y"))
				f.Close()
				t.Stat("f")
			}},
		{Name: "perm/new_entries_owned_by_caller", Needs: NeedNonRoot,
			Setup: func(t *Tester) { own(t, ".") },
			Run: func(t *Tester) {
				t.WriteFile("f", s("x"), 0o644)
				t.Must(t.Mkdir("d", 0o755))
				uid, gid := t.Owner("f")
				t.Check(uid == ChildUID && gid == ChildGID, "file owned by %d:%d", uid, gid)
				t.Owner("d")
			}},
		{Name: "perm/chmod_own_file", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				t.WriteFile("f", s("x"), 0o644)
				own(t, "f")
			},
			Run: func(t *Tester) {
				t.ExpectOK(t.Chmod("f", 0o000))
				_, err := t.Open("f")
				t.ExpectErr(err, syscall.EACCES)
				t.ExpectOK(t.Chmod("f", 0o400))
				b, _ := t.ReadFile("f")
				t.ExpectData(b, s("x"))
			}},
		{Name: "perm/unlink_needs_dir_write_not_file_mode", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				own(t, ".")
				t.WriteFile("f", s("x"), 0o000)
			},
			Run: func(t *Tester) {
				_, err := t.Open("f")
				t.ExpectErr(err, syscall.EACCES)
				t.ExpectOK(t.Rename("f", "g"))
				t.ExpectOK(t.Remove("g"))
				t.ReadDir(".")
			}},
		{Name: "perm/rename_dir_across_needs_write_on_it", Needs: NeedNonRoot,
			Setup: func(t *Tester) {
				own(t, ".")
				t.Must(t.MkdirAll("a/sub", 0o755))
				t.Must(t.Mkdir("b", 0o755))
				own(t, "a")
				own(t, "b")
			},
			Run: func(t *Tester) {
				t.Rename("a/sub", "b/sub")
				t.ExpectOK(t.Rename("a/sub", "a/renamed"))
				t.ReadDir("a")
			}},
	}
}
