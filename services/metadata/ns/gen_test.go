package ns

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
)

// gen produces random operations over a small name space so that they
// collide often: creates over existing names, renames into subtrees,
// removals of open files, permission failures.
type gen struct {
	rng     *rand.Rand
	handles []Ino // open handles, to Release or SetLive
	prefix  string
	bad     error // the first error that was not a bare Errno
}

func newGen(seed uint64, prefix string) *gen {
	return &gen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), prefix: prefix}
}

func (g *gen) path() string {
	depth := 1
	switch r := g.rng.IntN(20); {
	case r >= 17:
		depth = 3
	case r >= 9:
		depth = 2
	}
	parts := make([]string, depth)
	for i := range parts {
		switch r := g.rng.IntN(24); {
		case r == 0:
			parts[i] = "."
		case r == 1:
			parts[i] = ".."
		default:
			parts[i] = string(rune('a' + g.rng.IntN(5)))
		}
	}
	p := strings.Join(parts, "/")
	if g.prefix != "" {
		p = g.prefix + "/" + strings.Join(parts, "/")
		if strings.Contains(p, "..") {
			p = g.prefix + "/" + strings.ReplaceAll(strings.Join(parts, "/"), "..", "b")
		}
	}
	if g.rng.IntN(10) == 0 {
		p = "/" + p
	}
	if g.rng.IntN(15) == 0 {
		p += "/"
	}
	return p
}

// target returns an existing path (a random walk from the prefix, read as
// root) two times in three, else a random one.
func (g *gen) target(n *NS) string {
	if g.rng.IntN(3) == 0 {
		return g.path()
	}
	p := g.prefix
	for depth := 0; depth < 4; depth++ {
		ents, err := n.ReadDir(root, "/"+p)
		if err != nil || len(ents) == 0 || (depth > 0 && g.rng.IntN(3) == 0) {
			break
		}
		e := ents[g.rng.IntN(len(ents))]
		if p == "" {
			p = e.Name
		} else {
			p += "/" + e.Name
		}
		if e.Mode != syscall.S_IFDIR {
			break
		}
	}
	if p == g.prefix {
		return g.path()
	}
	return p
}

func (g *gen) cred() Cred {
	switch r := g.rng.IntN(10); {
	case r < 7:
		return root
	case r < 9:
		return u1
	}
	return u2
}

func (g *gen) mode(modes ...uint32) uint32 { return modes[g.rng.IntN(len(modes))] }

// step runs one random operation on n and describes it with its result.
func (g *gen) step(n *NS) string {
	c := g.cred()
	var err error
	var what string
	op := g.rng.IntN(18)
	if op >= 13 && op <= 15 && len(g.handles) == 0 {
		op = 0 // nothing open: create instead
	}
	switch op {
	case 0, 1, 2:
		p := g.path()
		if g.rng.IntN(4) == 0 {
			p = g.target(n)
		}
		flags := syscall.O_CREAT | []int{syscall.O_RDONLY, syscall.O_WRONLY, syscall.O_RDWR}[g.rng.IntN(3)]
		if g.rng.IntN(3) == 0 {
			flags |= syscall.O_EXCL
		}
		if g.rng.IntN(4) == 0 {
			flags |= syscall.O_TRUNC
		}
		var a Attr
		a, _, err = n.Open(c, p, flags, g.mode(0o644, 0o600, 0o755, 0o2755, 0o4755, 0o777))
		if err == nil {
			g.handles = append(g.handles, a.Ino)
		}
		what = fmt.Sprintf("open %q %#x", p, flags)
	case 3, 4:
		p := g.path()
		_, err = n.Mkdir(c, p, g.mode(0o755, 0o777, 0o1777, 0o2775, 0o700))
		what = fmt.Sprintf("mkdir %q", p)
	case 5:
		p := g.target(n)
		err = n.Rmdir(c, p)
		what = fmt.Sprintf("rmdir %q", p)
	case 6:
		p := g.target(n)
		_, err = n.Unlink(c, p)
		what = fmt.Sprintf("unlink %q", p)
	case 7, 8:
		p, q := g.target(n), g.path()
		if g.rng.IntN(3) == 0 {
			q = g.target(n)
		}
		_, err = n.Rename(c, p, q)
		what = fmt.Sprintf("rename %q %q", p, q)
	case 9:
		p := g.target(n)
		mode := g.mode(0o777, 0o755, 0o1777, 0o2775, 0o700, 0o644, 0o4755, 0o2745)
		if g.rng.IntN(4) == 0 {
			mode = uint32(g.rng.IntN(0o10000))
		}
		err = n.Chmod(c, p, mode)
		what = fmt.Sprintf("chmod %q", p)
	case 10:
		p := g.target(n)
		ids := []int{-1, 0, 1001, 1002, 2000, 3000}
		err = n.Chown(c, p, ids[g.rng.IntN(len(ids))], ids[g.rng.IntN(len(ids))])
		what = fmt.Sprintf("chown %q", p)
	case 11:
		p := g.target(n)
		err = n.Chtimes(c, p, g.rng.Int64N(1e18), g.rng.Int64N(1e18))
		what = fmt.Sprintf("chtimes %q", p)
	case 12:
		p := g.target(n)
		_, err = n.Truncate(c, p, g.rng.Int64N(1<<20))
		what = fmt.Sprintf("truncate %q", p)
	case 13:
		ino := g.handles[g.rng.IntN(len(g.handles))]
		err = n.SetLive(ino, g.rng.Int64N(1<<30), g.rng.Int64N(1e18))
		what = fmt.Sprintf("setlive %d", ino)
	case 14, 15:
		i := g.rng.IntN(len(g.handles))
		ino := g.handles[i]
		g.handles = append(g.handles[:i], g.handles[i+1:]...)
		_, err = n.Release(ino)
		what = fmt.Sprintf("release %d", ino)
	case 16:
		p := g.path()
		t := []string{"a", "../b", "/c/d", "x"}[g.rng.IntN(4)]
		_, err = n.SymlinkAt(c, t, RootIno, p)
		what = fmt.Sprintf("symlink %q %q", t, p)
	case 17:
		p, q := g.target(n), g.path()
		_, err = n.LinkAt(c, RootIno, p, RootIno, q, g.rng.IntN(2) == 0)
		what = fmt.Sprintf("link %q %q", p, q)
	}
	if err != nil {
		var fe *FollowError
		if _, ok := err.(syscall.Errno); !ok && !errors.As(err, &fe) && g.bad == nil {
			g.bad = fmt.Errorf("%s as uid %d: non-errno error %w", what, c.UID, err)
		}
	}
	return fmt.Sprintf("uid %d %s: %v", c.UID, what, err)
}
