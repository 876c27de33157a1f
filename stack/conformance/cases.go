package conformance

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"
)

// Cases returns the suite: one table, grouped by the prefix of Case.Name.
//
//	open/     OpenFile flags and their errors
//	rw/       reads, writes, holes, unaligned and >4 gib offsets, Seek,
//	          concurrent writers, Truncate, Sync
//	dir/      Mkdir, MkdirAll, ReadDir, File.ReadDir, Remove, RemoveAll
//	rename/   Rename in all its shapes, atomic replacement
//	unlink/   removed files that are still open
//	names/    empty, NUL, long, "." and "..", slashes, odd bytes
//	attr/     Stat, File.Stat, Chmod, Chown, Chtimes
//	root/     root's override of permissions (NeedRoot)
//	perm/     permission checks as uid 65534 (NeedNonRoot)
//	persist/  contents across Restarter.Restart
//	shared/   one process's changes as another process with the file open
//	          sees them (Case.Peer: a second process, peer.go)
func Cases() []Case {
	var all []Case
	for _, group := range [][]Case{
		openCases(), rwCases(), dirCases(), renameCases(), unlinkCases(),
		nameCases(), attrCases(), rootCases(), permCases(), persistCases(),
		sharedCases(),
	} {
		all = append(all, group...)
	}
	return all
}

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
)

// past is an mtime set with Chtimes before an operation, so that "mtime
// after past" says whether the operation changed it, whatever the clock's
// granularity.
var past = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

// pattern returns n bytes that depend only on seed.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n]
}

// s is shorthand for []byte(str).
func s(str string) []byte { return []byte(str) }

// dirNames returns the sorted names of des.
func dirNames(des []os.DirEntry) []string {
	out := make([]string, 0, len(des))
	for _, de := range des {
		out = append(out, de.Name())
	}
	slices.Sort(out)
	return out
}

// expectNames fails the case unless got (sorted) equals want.
func expectNames(t *Tester, got []string, want ...string) {
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.fail(2, "names are ["+strings.Join(got, " ")+"], want ["+strings.Join(want, " ")+"]")
	}
}
