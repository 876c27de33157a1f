// Package cheader checks a C header that restates a Go ABI: every numeric
// define against the Go constant it mirrors, and the layout of its structs
// as a C compiler sees them. The ring ABI (ring/include/weir_ring.h) and the
// request protocol (proto/include/weir_proto.h) are both held to their Go
// definitions with it, from their tests.
package cheader

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Const is one define and the Go value it must have.
type Const struct {
	Name string
	Want uint64
}

// Field is one struct field whose place and type the C compiler must agree
// on with the Go side.
type Field struct {
	Type, Field string
	Off         uint64
	GoType      reflect.Type // the Go type the field is read and written as
}

// GoFieldType is the type of the field name of the struct v.
func GoFieldType(v any, name string) reflect.Type {
	f, ok := reflect.TypeOf(v).FieldByName(name)
	if !ok {
		panic("no field " + name)
	}
	return f.Type
}

var defineRE = regexp.MustCompile(`^\s*#\s*define\s+(WEIR_[A-Za-z0-9_]*)(.*)$`)

// ParseDefines returns the value text of every object-like WEIR_ define in
// src that has a value (an include guard has none; function-like macros
// are not constants).
func ParseDefines(src string) (map[string]string, error) {
	src = strings.ReplaceAll(src, "\\\n", " ")
	defs := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		m := defineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		name, rest := m[1], m[2]
		if strings.HasPrefix(rest, "(") {
			continue // function-like: no space between the name and "("
		}
		if i := strings.Index(rest, "/*"); i >= 0 {
			rest = rest[:i]
		}
		if i := strings.Index(rest, "//"); i >= 0 {
			rest = rest[:i]
		}
		rest = strings.TrimSpace(rest)
		if rest == "" {
			continue
		}
		if _, dup := defs[name]; dup {
			return nil, fmt.Errorf("%s defined twice", name)
		}
		defs[name] = rest
	}
	return defs, sc.Err()
}

// ParseNumber reads a C integer literal such as 4096u, 0x1ull or (128u).
func ParseNumber(s string) (uint64, error) {
	for strings.HasPrefix(s, "(") && strings.HasSuffix(s, ")") {
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	return strconv.ParseUint(strings.TrimRight(s, "uUlL"), 0, 64)
}

// CheckDefines checks the header file against consts: each must be
// defined with its Go value, and every numeric WEIR_ define must be one of
// consts or named in compileOnly (defines whose value is an expression, such
// as INT64_MIN, that only the compiler can evaluate: CheckLayout checks
// those).
func CheckDefines(t *testing.T, file string, consts []Const, compileOnly ...string) {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := ParseDefines(string(src))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	mirrored := make(map[string]bool)
	for _, n := range compileOnly {
		mirrored[n] = true
		if _, ok := defs[n]; !ok {
			t.Errorf("%s: #define %s missing", file, n)
		}
	}
	for _, c := range consts {
		if mirrored[c.Name] {
			continue
		}
		mirrored[c.Name] = true
		text, ok := defs[c.Name]
		if !ok {
			t.Errorf("%s: #define %s missing (Go value %d = %#x)", file, c.Name, c.Want, c.Want)
			continue
		}
		got, err := ParseNumber(text)
		if err != nil {
			t.Errorf("%s: %s: value %q is not an integer literal: %v", file, c.Name, text, err)
			continue
		}
		if got != c.Want {
			t.Errorf("%s: %s = %d (%#x), Go says %d (%#x)", file, c.Name, got, got, c.Want, c.Want)
		}
	}
	for name := range defs {
		if !mirrored[name] {
			t.Errorf("%s: #define %s mirrors no Go constant; add it to the test's list", file, name)
		}
	}
}

// cTypeName is the <stdint.h> type a Go integer type is spelled as.
func cTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Uint8:
		return "uint8_t"
	case reflect.Uint16:
		return "uint16_t"
	case reflect.Uint32:
		return "uint32_t"
	case reflect.Uint64:
		return "uint64_t"
	case reflect.Int32:
		return "int32_t"
	case reflect.Int64:
		return "int64_t"
	case reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "" // byte arrays: size only
		}
	}
	panic("no C type for " + t.String())
}

// NoCompiler is the skip message when no C compiler is found.
const NoCompiler = "no C compiler (cc or gcc) on PATH: install gcc to check the C header's struct layout"

// CheckLayout compiles a program that includes header (found in its own
// directory) and prints, for each field, its offset, size and type, for
// each sizes key (a C expression) its value, and each const's define as
// the compiler reads it; every printed value must equal the Go one. It
// skips the test, saying so, when there is no C compiler.
func CheckLayout(t *testing.T, header string, fields []Field, sizes map[string]uint64, consts []Const) {
	t.Helper()
	var cc string
	for _, name := range []string{"cc", "gcc"} {
		if p, err := exec.LookPath(name); err == nil {
			cc = p
			break
		}
	}
	if cc == "" {
		t.Skip(NoCompiler)
	}
	inc, err := filepath.Abs(filepath.Dir(header))
	if err != nil {
		t.Fatal(err)
	}
	want := make(map[string]uint64)
	var prog strings.Builder
	fmt.Fprintf(&prog, "#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n#include %q\n", filepath.Base(header))
	prog.WriteString("#define CFIELD(t, f) (((t *)0)->f)\n")
	prog.WriteString("#define P(k, v) printf(\"%s\\t%llu\\n\", k, (unsigned long long)(v))\n")
	prog.WriteString("int main(void) {\n")
	add := func(key string, v uint64) {
		want[key] = v
		fmt.Fprintf(&prog, "\tP(%q, %s);\n", key, key)
	}
	for _, f := range fields {
		add(fmt.Sprintf("offsetof(%s, %s)", f.Type, f.Field), f.Off)
		add(fmt.Sprintf("sizeof(CFIELD(%s, %s))", f.Type, f.Field), uint64(f.GoType.Size()))
		if ctype := cTypeName(f.GoType); ctype != "" {
			add(fmt.Sprintf("_Generic(CFIELD(%s, %s), %s: 1, default: 0)", f.Type, f.Field, ctype), 1)
		}
	}
	for key, v := range sizes {
		add(key, v)
	}
	// The compiler's reading of each define, against the Go value: this
	// also checks the parser of CheckDefines.
	for _, c := range consts {
		want[c.Name] = c.Want
		fmt.Fprintf(&prog, "\tP(%q, %s);\n", c.Name, c.Name)
	}
	prog.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	src, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(src, []byte(prog.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), cc, "-std=c11", "-Wall", "-Wextra", "-Werror",
		"-I", inc, "-o", bin, src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s failed to compile a program including %s: %v\n%s", cc, header, err, out)
	}
	out, err := exec.CommandContext(t.Context(), bin).Output()
	if err != nil {
		t.Fatalf("layout program: %v", err)
	}
	seen := make(map[string]bool)
	for line := range strings.Lines(string(out)) {
		key, val, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
		if !ok {
			t.Fatalf("layout program printed %q", line)
		}
		got, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			t.Fatalf("layout program printed %q: %v", line, err)
		}
		seen[key] = true
		if w, ok := want[key]; !ok {
			t.Errorf("layout program printed unexpected %q", key)
		} else if got != w {
			t.Errorf("C says %s = %d, Go says %d", key, got, w)
		}
	}
	for key := range want {
		if !seen[key] {
			t.Errorf("layout program did not print %s", key)
		}
	}
}

// Def is the Const name = want.
func Def(name string, want uint64) Const { return Const{Name: name, Want: want} }

// At is the Field of struct typ named field, at offset off, read and
// written in Go as goType.
func At(typ, field string, off uint64, goType reflect.Type) Field {
	return Field{Type: typ, Field: field, Off: off, GoType: goType}
}
