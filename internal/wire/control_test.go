package wire

import (
	"strings"
	"testing"
)

func TestSubjectsIn(t *testing.T) {
	// The default namespace keeps the subjects weir always had.
	for _, ns := range []string{"", DefaultNamespace} {
		s := SubjectsIn(ns)
		if s.Grant != "weir.io.grant" || s.Revoke != "weir.io.revoke" || s.Live != "weir.io.live" ||
			s.Delete != "weir.io.delete" || s.Session != "weir.meta.session" || s.SetLive != "weir.meta.setlive" {
			t.Errorf("SubjectsIn(%q) = %+v", ns, s)
		}
	}
	if s := SubjectsIn("prod.a"); s.Grant != "prod.a.io.grant" || s.SetLive != "prod.a.meta.setlive" {
		t.Errorf("SubjectsIn(prod.a) = %+v", s)
	}
}

func TestCheckNamespace(t *testing.T) {
	for _, ns := range []string{"weir", "a", "prod.stack-1", "A_b.c-d.0", strings.Repeat("n", MaxNamespaceLen)} {
		if err := CheckNamespace(ns); err != nil {
			t.Errorf("CheckNamespace(%q) = %v", ns, err)
		}
	}
	for _, ns := range []string{"", "a b", " a", "a\t", "*", "a.*", ">", "a.>", "a..b", ".a", "a.", "$SRV", "é",
		strings.Repeat("n", MaxNamespaceLen+1)} {
		if err := CheckNamespace(ns); err == nil {
			t.Errorf("CheckNamespace(%q) accepted it", ns)
		}
	}
}
