// Package fsck is weir's offline consistency check (`weir check`): it opens
// a stopped data directory the way the services would (the namespace
// recovers from its checkpoint and write-ahead log, cutting a torn tail),
// checks the namespace's own invariants, and compares the metadata
// service's blob map with the blobs the backend holds.
package fsck

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Problem is one inconsistency found.
type Problem struct {
	Kind   string `json:"kind"` // namespace, orphan-blob, missing-blob, size-mismatch, stray-object
	Ino    uint64 `json:"ino,omitempty"`
	Blob   uint64 `json:"blob,omitempty"`
	Detail string `json:"detail"`
}

// Report is what a check found.
type Report struct {
	Files    int       `json:"files"`    // regular files in the namespace
	Blobs    int       `json:"blobs"`    // blobs in the backend
	Problems []Problem `json:"problems"` // empty when consistent
}

// OK reports whether nothing was found.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// Write prints the report as text or JSON.
func (r *Report) Write(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	fmt.Fprintf(w, "%d files in the namespace, %d blobs in the backend\n", r.Files, r.Blobs)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  %-14s ino %-8d blob %-8d %s\n", p.Kind, p.Ino, p.Blob, p.Detail)
	}
	if r.OK() {
		fmt.Fprintln(w, "consistent")
	} else {
		fmt.Fprintf(w, "%d problems\n", len(r.Problems))
	}
	return nil
}

// Check opens the namespace of a stopped weir and compares it with the
// backend be (opened by the caller from the same configuration); Check
// closes be.
func Check(cfg *config.Config, be backend.Backend, log hclog.Logger) (*Report, error) {
	defer be.Close()
	n, err := ns.Open(ns.Options{Dir: filepath.Join(cfg.DataDir, "meta"), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("open namespace: %w", err)
	}
	defer n.Close()
	r := &Report{}
	if err := n.Check(); err != nil {
		r.Problems = append(r.Problems, Problem{Kind: "namespace", Detail: err.Error()})
	}
	files := n.Files()
	r.Files = len(files)
	blobs, err := be.List()
	if err != nil {
		return nil, fmt.Errorf("list blobs: %w", err)
	}
	r.Blobs = len(blobs)
	if a, ok := be.(backend.Auditor); ok {
		for _, s := range a.Strays() {
			r.Problems = append(r.Problems, Problem{Kind: "stray-object", Detail: s})
		}
	}
	want := make(map[uint64]ns.Attr, len(files))
	for _, a := range files {
		want[a.Blob] = a
	}
	for _, id := range blobs {
		a, ok := want[uint64(id)]
		if !ok {
			r.Problems = append(r.Problems, Problem{Kind: "orphan-blob", Blob: uint64(id),
				Detail: "blob has no file: space leaked (a delete was lost)"})
			continue
		}
		delete(want, uint64(id))
		b, err := be.Open(id)
		if err != nil {
			r.Problems = append(r.Problems, Problem{Kind: "missing-blob", Ino: uint64(a.Ino), Blob: uint64(id),
				Detail: fmt.Sprintf("blob listed but cannot be opened: %v", err)})
			continue
		}
		if sz := b.Size(); sz != a.Size {
			r.Problems = append(r.Problems, Problem{Kind: "size-mismatch", Ino: uint64(a.Ino), Blob: uint64(id),
				Detail: fmt.Sprintf("namespace says %d bytes, blob has %d (writes after the last fsync or close were lost in a crash; the next open takes the blob's size)", a.Size, sz)})
		}
		b.Close()
	}
	// A file whose blob does not exist is fine while it is empty: the IO
	// service creates blobs on first use.
	missing := make([]uint64, 0, len(want))
	for blob := range want {
		missing = append(missing, blob)
	}
	slices.Sort(missing)
	for _, blob := range missing {
		if a := want[blob]; a.Size != 0 {
			r.Problems = append(r.Problems, Problem{Kind: "missing-blob", Ino: uint64(a.Ino), Blob: blob,
				Detail: fmt.Sprintf("file of %d bytes has no blob: its data is lost", a.Size)})
		}
	}
	return r, nil
}
