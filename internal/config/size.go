package config

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Size is a number of bytes. In a file it is either a number ("4096") or a
// string with an optional binary unit: "4096", "64KiB", "8MiB", "1GiB".
type Size uint64

// Binary size units.
const (
	B   Size = 1
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

var sizeUnits = []struct {
	name string
	size Size
}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}, {"B", B}}

// ParseSize parses a whole number of bytes with an optional unit B, KiB,
// MiB, GiB or TiB, e.g. "8MiB" or "8 MiB". Decimal units (KB, MB) are refused
// rather than guessed at.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes with an optional unit (B, KiB, MiB, GiB, TiB), e.g. \"8MiB\"", s)
	}
	n, err := strconv.ParseUint(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: number out of range", s)
	}
	unit := strings.TrimSpace(t[i:])
	mult := B
	if unit != "" {
		mult = 0
		for _, u := range sizeUnits {
			if u.name == unit {
				mult = u.size
			}
		}
		if mult == 0 {
			return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB or TiB)", s, unit)
		}
	}
	hi, v := bits.Mul64(n, uint64(mult))
	if hi != 0 {
		return 0, fmt.Errorf("size %q: out of range", s)
	}
	return Size(v), nil
}

// String formats s in the largest unit that divides it exactly, e.g. "8MiB",
// "1536KiB", "100B"; ParseSize reads it back.
func (s Size) String() string {
	for _, u := range sizeUnits {
		if s != 0 && s%u.size == 0 {
			return strconv.FormatUint(uint64(s/u.size), 10) + u.name
		}
	}
	return "0B"
}
