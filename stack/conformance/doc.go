// Package conformance is the differential POSIX conformance suite of weir
// (issue 3): one table of file-system cases, Cases(), run against several
// targets whose observable results and errno values must match those of the
// reference target, the kernel.
//
// # Targets
//
// A target is a function that returns an FS on a fresh, empty root: a
// directory with mode 0755 owned by the calling user. KernelTarget is the
// reference: package os on a temporary directory. The weir client plugs in
// the same way (see Run and the example below). Known, justified mismatches
// are listed in Differences and in docs/posix-differences.md.
//
// Names are relative to the root and never leave it: Within, used by the
// kernel target and usable by any target that keeps its roots in
// subdirectories, drops a leading "/" and turns a ".." that would climb
// above the root into ".", exactly what the kernel does at a process root,
// and leaves everything else to the target. The alternative of running the
// kernel cases one directory down would let ".." at the root reach a real
// directory the other target does not have, so the comparison would not be
// honest.
//
// The reference semantics are those of package os on Linux with two
// clarifications: Rename is rename(2) itself (os.Rename refuses existing
// directory targets with EEXIST before asking the kernel), and Remove is
// os.Remove, which tries unlink then rmdir and reports the rmdir error unless
// it is ENOTDIR (so a non-empty directory gives ENOTEMPTY, "." gives EINVAL).
// MkdirAll and RemoveAll are those of package os, whose answers for "" and
// names ending in "." are Go's, not the kernel's. MainHook pins the umask to
// 022 so that modes are the same on every machine.
//
// # Observations
//
// A case drives its target through a Tester, which records every call as a
// normalized line ("rename \"a\" \"b\": EINVAL"): errors as errno names,
// FileInfo as name, type and permission bits, and size for regular files
// only (directory sizes are file-system specific); modification times only
// as relations ("mtime \"a\" after 2001-02-03T04:05:06Z: true") or exactly
// right after Chtimes; owners from FileInfo.Sys, a *syscall.Stat_t on both
// targets. Directory order is only compared where it is defined (ReadDir
// sorts); File.ReadDir pages are recorded by size, their names sorted.
// Goroutines in a case use the FS directly and the case records summaries,
// so every run produces the same lines. Expectations written in a case
// (ExpectErr, Check, ...) hold on every target, the kernel included.
//
// # Permission cases
//
// Cases that need a non-root identity (NeedNonRoot, group perm/) run in a
// child process. When the test runs as root, Run prepares the root as root
// with Case.Setup, then re-executes a copy of the test binary as uid 65534,
// gid 65534 and the case's supplementary groups, with the case name, a
// factory name and its argument in WEIR_CONFORMANCE_CHILD. MainHook, called
// from TestMain, sees that variable in the child, builds the FS with the
// factory registered under that name (RegisterFactory; the kernel's is
// built in), runs the case and prints its observations as JSON on stdout;
// the parent appends them to Setup's and compares as usual. When the test
// does not run as root these cases are skipped, as are the NeedRoot cases
// that check root's overrides.
//
// # Plugging in the weir target
//
// The client's OpenFile returns its own *File, so a two-line adapter makes it
// an FS; the same adapter can implement Restarter (stop and start the
// services on the same data directory) for the persist/ cases, and Within
// forwards Restart to it.
//
//	type weirFS struct{ *client.FS }
//
//	func (w weirFS) OpenFile(name string, flag int, perm fs.FileMode) (conformance.File, error) {
//		f, err := w.FS.OpenFile(name, flag, perm)
//		if err != nil {
//			return nil, err // not a typed nil in the interface
//		}
//		return f, nil
//	}
//
//	func TestMain(m *testing.M) {
//		conformance.RegisterFactory("weir", func(dir string) (conformance.FS, error) {
//			// In a child this dials as uid 65534: the services see its credentials.
//			c, err := client.Dial(context.Background(), client.Options{
//				MetadataSocket: os.Getenv("WEIR_METADATA_SOCKET"),
//				IOSocket:       os.Getenv("WEIR_IO_SOCKET"),
//			})
//			if err != nil {
//				return nil, err
//			}
//			return conformance.Within(weirFS{c}, dir), nil
//		})
//		conformance.MainHook()
//		os.Exit(m.Run())
//	}
//
//	func TestConformance(t *testing.T) {
//		c := startWeirAndDial(t) // also sets WEIR_*_SOCKET, inherited by the children
//		var n atomic.Int64
//		conformance.Run(t, map[string]func(*testing.T) conformance.FS{
//			conformance.Reference: conformance.KernelTarget,
//			"weir": func(t *testing.T) conformance.FS {
//				dir := fmt.Sprintf("/conformance/%d", n.Add(1))
//				if err := c.MkdirAll(dir, 0o755); err != nil {
//					t.Fatal(err)
//				}
//				if err := c.Chmod(dir, 0o755); err != nil {
//					t.Fatal(err)
//				}
//				s := conformance.Within(weirFS{c}, dir)
//				s.Factory, s.Arg = "weir", dir
//				return s
//			},
//		}, conformance.Cases())
//	}
package conformance
