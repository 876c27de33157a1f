package stack_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/weir-storage/weir/"

// layer names the layer of a package of this module, bottom-up: what a
// package may import is its own layer and those below it (listed in
// mayImport).
func layer(pkg string) string {
	p := strings.TrimPrefix(pkg, module)
	for _, l := range []string{"proto", "ring", "internal", "client", "services", "stack", "cmd", "bench"} {
		if p == l || strings.HasPrefix(p, l+"/") {
			return l
		}
	}
	return "other"
}

var mayImport = map[string][]string{
	"proto":    {"proto"},
	"ring":     {"ring"},
	"internal": {"internal", "ring", "proto"},
	"client":   {"client", "ring", "proto"},
	"services": {"services", "internal", "ring", "proto"},
	"stack":    {"stack", "services", "internal", "client", "ring", "proto"},
	"cmd":      {"cmd", "stack", "services", "internal", "client", "ring", "proto"},
	"bench":    {"bench", "cmd", "stack", "services", "internal", "client", "ring", "proto"},
}

// TestLayering reads the import graph (go list) and holds it bottom-up:
// what services stand on (internal/) imports no service and nothing above
// (not even in its tests), ring/, proto/ and client/ build without any
// service, services import neither stack/ nor cmd/, and no service
// imports another service's package (each is its own process).
func TestLayering(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on PATH: cannot read the import graph")
	}
	cmd := exec.Command("go", "list", "-f",
		"{{.ImportPath}}|{{join .Imports \" \"}}|{{join .TestImports \" \"}}|{{join .XTestImports \" \"}}", module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	checked := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) != 4 {
			t.Fatalf("go list printed %q", sc.Text())
		}
		pkg, from := f[0], layer(f[0])
		kinds := []struct {
			what string
			list string
		}{{"imports", f[1]}}
		// For internal/ tests count too: nothing there may lean on a
		// service, even to test itself. Elsewhere tests may run whole
		// stacks (the client's tests do), so only what builds counts.
		if from == "internal" {
			kinds = append(kinds, struct{ what, list string }{"test imports", f[2] + " " + f[3]})
		}
		for _, k := range kinds {
			for _, imp := range strings.Fields(k.list) {
				if !strings.HasPrefix(imp, module) || imp == pkg || strings.HasSuffix(imp, "_test") {
					continue
				}
				checked++
				to := layer(imp)
				ok := false
				for _, l := range mayImport[from] {
					ok = ok || l == to
				}
				if !ok {
					t.Errorf("%s %s %s: %s may not import from %s", pkg, k.what, imp, from, to)
				}
				if from == "services" && to == "services" {
					own := strings.SplitN(strings.TrimPrefix(pkg, module+"services/"), "/", 2)[0]
					other := strings.SplitN(strings.TrimPrefix(imp, module+"services/"), "/", 2)[0]
					if own != other {
						t.Errorf("%s imports %s: one service imports another's package", pkg, imp)
					}
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d imports checked: go list printed %q", checked, out)
	}
}
