package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// TreeInfo describes the workload's tree.
type TreeInfo struct {
	Tar   string `json:"tar"`    // the tar every untar reads
	From  string `json:"from"`   // what it holds
	Files int    `json:"files"`  // regular files
	Dirs  int    `json:"dirs"`   // directories, src itself included
	Bytes int64  `json:"bytes"`  // the regular files' bytes
	Other int    `json:"others"` // entries of any other type (links)
}

// tree is the tar and what it holds: each path below src (src itself is
// ".") with its type and, for a regular file, the SHA-256 of its bytes.
type tree struct {
	info  TreeInfo
	files map[string]string // path -> hex SHA-256
	dirs  map[string]bool
}

// makeTree makes the tar of $(go env GOROOT)/src in out unless it is
// there (its name carries the Go version: a new toolchain makes a new
// one), and reads it back.
func makeTree(out string, quick bool) (*tree, error) {
	goroot := runtime.GOROOT()
	if b, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		goroot = strings.TrimSpace(string(b))
	}
	parts, name := []string{"src"}, runtime.Version()+"-src.tar"
	if quick {
		parts, name = []string{"src/net", "src/crypto"}, runtime.Version()+"-src-net-crypto.tar"
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	path, err := filepath.Abs(filepath.Join(out, name))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		tmp := path + ".tmp"
		args := append([]string{"-C", goroot, "--sort=name", "-cf", tmp}, parts...)
		fmt.Fprintf(os.Stderr, "trees: tar %s\n", strings.Join(args, " "))
		if b, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
			os.Remove(tmp)
			return nil, fmt.Errorf("tar %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, err
		}
	}
	t, err := readTar(path)
	if err != nil {
		return nil, err
	}
	t.info.From = filepath.Join(goroot, "src")
	if quick {
		t.info.From += " (net and crypto only)"
	}
	return t, nil
}

// readTar lists the tar at path, hashing every regular file.
func readTar(path string) (*tree, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t := &tree{info: TreeInfo{Tar: path}, files: map[string]string{}, dirs: map[string]bool{".": true}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		rel, ok := belowSrc(h.Name)
		if !ok {
			return nil, fmt.Errorf("%s: %q is not below src/", path, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			t.dirs[rel] = true
		case tar.TypeReg:
			sum := sha256.New()
			n, err := io.Copy(sum, tr)
			if err != nil {
				return nil, fmt.Errorf("read %s: %s: %w", path, h.Name, err)
			}
			t.files[rel] = hex.EncodeToString(sum.Sum(nil))
			t.info.Bytes += n
		default:
			t.info.Other++
		}
	}
	// Directories the tar names only through their files (src when the
	// tar holds src/net and src/crypto).
	for p := range t.files {
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			t.dirs[d] = true
		}
	}
	t.info.Files, t.info.Dirs = len(t.files), len(t.dirs)
	return t, nil
}

// belowSrc is a tar entry's path below src ("." for src itself).
func belowSrc(name string) (string, bool) {
	name = strings.TrimSuffix(name, "/")
	if name == "src" {
		return ".", true
	}
	rel, ok := strings.CutPrefix(name, "src/")
	return rel, ok && rel != ""
}

// verifyScript prints, for the directory root, every entry as "TYPE
// PATH" and then, after a "=" entry, every regular file's SHA-256 as
// sha256sum -z does; entries end with NUL, so any name survives.
func verifyScript(root string) string {
	return fmt.Sprintf("cd %s && find . -printf '%%y %%p\\0' && printf '=\\0' && find . -type f -print0 | xargs -0 -r sha256sum -z", quote(root))
}

// diffTree compares verifyScript's output with the tar's contents and
// describes every difference (none: nil).
func (t *tree) diffTree(out []byte) []string {
	// (the leading NUL lets an empty listing cut too)
	types, hashes, _ := bytes.Cut(append([]byte{0}, out...), []byte("\x00=\x00"))
	seenDirs, seenFiles := map[string]bool{}, map[string]string{}
	var missing, extra, differ, wrongType []string
	for _, e := range strings.Split(string(types), "\x00") {
		if e == "" {
			continue
		}
		typ, p, _ := strings.Cut(e, " ")
		p = clean(p)
		switch typ {
		case "d":
			seenDirs[p] = true
		case "f":
			seenFiles[p] = ""
		default:
			wrongType = append(wrongType, p+" (type "+typ+")")
		}
	}
	for _, e := range strings.Split(string(hashes), "\x00") {
		if h, p, ok := strings.Cut(e, "  "); ok {
			seenFiles[clean(p)] = h
		}
	}
	for p := range t.dirs {
		if !seenDirs[p] {
			if _, isFile := seenFiles[p]; isFile {
				wrongType = append(wrongType, p+" (a file, not a directory)")
			} else {
				missing = append(missing, p+"/")
			}
		}
	}
	for p, want := range t.files {
		got, ok := seenFiles[p]
		switch {
		case !ok && seenDirs[p]:
			wrongType = append(wrongType, p+" (a directory, not a file)")
		case !ok:
			missing = append(missing, p)
		case got == "":
			differ = append(differ, p+" (no checksum)")
		case got != want:
			differ = append(differ, p)
		}
	}
	for p := range seenDirs {
		if _, isFile := t.files[p]; !t.dirs[p] && !isFile {
			extra = append(extra, p+"/")
		}
	}
	for p := range seenFiles {
		if _, ok := t.files[p]; !ok && !t.dirs[p] {
			extra = append(extra, p)
		}
	}
	var d []string
	for _, g := range []struct {
		what  string
		paths []string
	}{{"missing", missing}, {"with other bytes", differ}, {"of another type", wrongType}, {"not in the tar", extra}} {
		if len(g.paths) == 0 {
			continue
		}
		sort.Strings(g.paths)
		first := g.paths[:min(len(g.paths), 5)]
		d = append(d, fmt.Sprintf("%d %s: %s", len(g.paths), g.what, strings.Join(first, ", ")))
	}
	return d
}

// clean turns find's "./a/b" into the tar's "a/b" (and "." stays).
func clean(p string) string {
	if p == "." {
		return p
	}
	return strings.TrimPrefix(p, "./")
}

// quote makes s one word of sh.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
