// Package fsck is weir's offline consistency check (`weir check`): it opens
// a stopped data directory the way the services would (the namespace
// recovers from its checkpoint and write-ahead log), checks the
// namespace's own invariants, and compares the metadata service's blob map
// with the blobs the backend holds.
//
// A check is strictly read-only: the namespace opens read-only (a torn WAL
// tail is skipped, not cut; nothing is freed; no checkpoint is written)
// and the backend must be opened read-only by the caller. Repairs are
// explicit (Options.Repair, `weir check --repair`): they open both for
// writing, delete the blobs awaiting deletion and the orphans, free the
// files that were unlinked while open, and set each file whose size the
// namespace records wrongly to its blob's size, then check again.
package fsck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/staging"
	iosvc "github.com/weir-storage/weir/services/io"
	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/metadata/ns"
)

// Problem is one inconsistency found, or one thing noted that is not an
// inconsistency (Note: a delete that the next start of the services will
// finish).
type Problem struct {
	// Kind is namespace, orphan-blob, missing-blob, size-mismatch,
	// stray-object, staging-log, or for notes pending-delete, held-file
	// and staged-file.
	Kind   string `json:"kind"`
	Ino    uint64 `json:"ino,omitempty"`
	Blob   uint64 `json:"blob,omitempty"`
	Detail string `json:"detail"`
	Note   bool   `json:"note,omitempty"` // not a problem: the services finish it at their next start (or the file's next open: a blob larger than the size recorded)
}

// Report is what a check found.
type Report struct {
	Files    int       `json:"files"`    // regular files in the namespace
	Blobs    int       `json:"blobs"`    // blobs in the backend (the staging log's not counted)
	Staged   int       `json:"staged"`   // live records in the staging log: the next start replays them
	Problems []Problem `json:"problems"` // empty when consistent
	Repaired []string  `json:"repaired,omitempty"`
}

// OK reports whether nothing but notes was found.
func (r *Report) OK() bool {
	return !slices.ContainsFunc(r.Problems, func(p Problem) bool { return !p.Note })
}

// Write prints the report as text or JSON.
func (r *Report) Write(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	fmt.Fprintf(w, "%d files in the namespace, %d blobs in the backend, %d live records in the staging log\n", r.Files, r.Blobs, r.Staged)
	for _, s := range r.Repaired {
		fmt.Fprintf(w, "  repaired: %s\n", s)
	}
	problems := 0
	for _, p := range r.Problems {
		kind := p.Kind
		if p.Note {
			kind = "note: " + kind
		} else {
			problems++
		}
		fmt.Fprintf(w, "  %-20s ino %-8d blob %-8d %s\n", kind, p.Ino, p.Blob, p.Detail)
	}
	if problems == 0 {
		fmt.Fprintln(w, "consistent")
	} else {
		fmt.Fprintf(w, "%d problems\n", problems)
	}
	return nil
}

// Options configure Check.
type Options struct {
	// Repair fixes what can be fixed (see the package comment); be must
	// then be open for writing.
	Repair bool
	Logger hclog.Logger
	// NS carries namespace options other than the directory (tests set
	// NS.FS to the vfs the namespace was written to).
	NS ns.Options
}

// Check opens the namespace of a stopped weir and compares it with the
// backend be (opened by the caller from the same configuration, read-only
// unless o.Repair); Check closes be.
func Check(cfg *config.Config, be backend.Backend, o Options) (*Report, error) {
	defer be.Close()
	nso := o.NS
	nso.Dir = filepath.Join(cfg.DataDir, "meta")
	nso.Logger = o.Logger
	nso.ReadOnly = !o.Repair
	if o.Repair {
		// Every blob of another namespace's store would look orphaned:
		// repair only this namespace's store, which a read-only open of
		// the namespace tells before anything is written.
		if err := checkOwnStore(nso, be); err != nil {
			return nil, err
		}
	}
	n, err := ns.Open(nso)
	if err != nil {
		return nil, fmt.Errorf("open namespace: %w", err)
	}
	defer n.Close()
	r := &Report{}
	if o.Repair {
		r.Repaired, err = repair(n, be)
		if err != nil {
			return r, err
		}
	}
	if err := check(r, n, be); err != nil {
		return nil, err
	}
	return r, nil
}

// checkOwnStore refuses a repair of a store that is not the namespace's.
func checkOwnStore(nso ns.Options, be backend.Backend) error {
	nso.ReadOnly = true
	n, err := ns.Open(nso)
	if err != nil {
		return fmt.Errorf("open namespace: %w", err)
	}
	defer n.Close()
	blobs, err := fileBlobs(be)
	if err != nil {
		return err
	}
	var r Report
	identityProblems(&r, n, be, len(blobs))
	for _, p := range r.Problems {
		if !p.Note {
			return fmt.Errorf("--repair refused, nothing was changed: %s: %s", p.Kind, p.Detail)
		}
	}
	return nil
}

// identityProblems reports a store that is not this namespace's by the
// IO service's rule (services/io checkStore): a store recording another
// stack is refused; one recording none is claimed at the next start,
// unless it holds blobs and the namespace is empty (a new namespace over
// an old store).
func identityProblems(r *Report, n *ns.NS, be backend.Backend, blobs int) {
	mine := backend.Identity(n.StackID())
	id, ok, err := be.Identity()
	switch {
	case err != nil:
		r.Problems = append(r.Problems, Problem{Kind: "store-identity", Detail: fmt.Sprintf("reading the stack the store belongs to: %v", err)})
	case ok && id != mine:
		r.Problems = append(r.Problems, Problem{Kind: "wrong-store", Detail: fmt.Sprintf(
			"the store belongs to stack %s, this namespace is stack %s: the IO service refuses to serve it; "+
				"point it at this namespace's store, or erase both with `weir format`", id, mine)})
	case !ok && blobs > 0 && n.Empty():
		r.Problems = append(r.Problems, Problem{Kind: "wrong-store", Detail: fmt.Sprintf(
			"the store holds %d blobs and records no stack, and this namespace (stack %s) is new and empty: "+
				"the IO service refuses to serve another namespace's blobs; point it at this namespace's store, or erase both with `weir format`", blobs, mine)})
	case !ok:
		r.Problems = append(r.Problems, Problem{Kind: "unclaimed-store", Note: true, Detail: fmt.Sprintf(
			"the store records no stack yet: the next start of the IO service claims it for this namespace (stack %s)", mine)})
	}
}

func check(r *Report, n *ns.NS, be backend.Backend) error {
	if err := n.Check(); err != nil {
		r.Problems = append(r.Problems, Problem{Kind: "namespace", Detail: err.Error()})
	}
	files := n.Files()
	r.Files = len(files)
	blobs, err := fileBlobs(be)
	if err != nil {
		return err
	}
	r.Blobs = len(blobs)
	identityProblems(r, n, be, len(blobs))
	staged, err := stagingProblems(r, be)
	if err != nil {
		return err
	}
	if a, ok := be.(backend.Auditor); ok {
		for _, s := range a.Strays() {
			r.Problems = append(r.Problems, Problem{Kind: "stray-object", Detail: s})
		}
	}
	want := make(map[uint64]ns.Attr, len(files))
	for _, a := range files {
		want[a.Blob] = a
	}
	held := map[ns.Ino]bool{}
	for _, ino := range n.Held() {
		held[ino] = true
		r.Problems = append(r.Problems, Problem{Kind: "held-file", Ino: uint64(ino), Blob: uint64(ino), Note: true,
			Detail: "unlinked while open when the services stopped: kept for its holder to reopen, freed after the reclaim grace of the next start"})
	}
	for _, id := range blobs {
		a, ok := want[uint64(id)]
		if !ok {
			if n.PendingDelete(uint64(id)) {
				r.Problems = append(r.Problems, Problem{Kind: "pending-delete", Blob: uint64(id), Note: true,
					Detail: "its file is gone and the delete is recorded: the next start of the services deletes it"})
				continue
			}
			r.Problems = append(r.Problems, Problem{Kind: "orphan-blob", Blob: uint64(id),
				Detail: "blob of no file and no delete recorded: space leaked (weir check --repair deletes it; the next start of the services does too)"})
			continue
		}
		delete(want, uint64(id))
		b, err := be.Open(id)
		if err != nil {
			r.Problems = append(r.Problems, Problem{Kind: "missing-blob", Ino: uint64(a.Ino), Blob: uint64(id),
				Detail: fmt.Sprintf("blob listed but cannot be opened: %v", err)})
			continue
		}
		size := b.Size()
		b.Close()
		if st, ok := staged[uint64(id)]; ok {
			r.Problems = append(r.Problems, Problem{Kind: "staged-file", Ino: uint64(a.Ino), Blob: uint64(id), Note: true,
				Detail: fmt.Sprintf("%d fsyncs of it wait in the staging log: the next start replays them, and the file is %d bytes (the namespace records %d, the blob holds %d)", st.records, st.size, a.Size, size)})
			continue
		}
		if p, bad := sizeProblem(a, size); bad {
			r.Problems = append(r.Problems, p)
		}
	}
	// A file whose blob does not exist is fine while it is empty: the IO
	// service creates blobs on first use.
	missing := make([]uint64, 0, len(want))
	for blob := range want {
		missing = append(missing, blob)
	}
	slices.Sort(missing)
	for _, blob := range missing {
		if st, ok := staged[blob]; ok {
			a := want[blob]
			r.Problems = append(r.Problems, Problem{Kind: "staged-file", Ino: uint64(a.Ino), Blob: blob, Note: true,
				Detail: fmt.Sprintf("its blob's create was not durable; %d fsyncs of it wait in the staging log: the next start makes the blob and replays them (%d bytes)", st.records, st.size)})
			continue
		}
		if a := want[blob]; a.Size != 0 {
			r.Problems = append(r.Problems, Problem{Kind: "missing-blob", Ino: uint64(a.Ino), Blob: blob,
				Detail: fmt.Sprintf("file of %d bytes has no blob: its data is lost", a.Size)})
		}
	}
	return nil
}

// fileBlobs lists the backend's blobs but the staging log's.
func fileBlobs(be backend.Backend) ([]backend.BlobID, error) {
	blobs, err := be.List()
	if err != nil {
		return nil, fmt.Errorf("list blobs: %w", err)
	}
	return slices.DeleteFunc(blobs, func(id backend.BlobID) bool { return id == backend.StagingBlob }), nil
}

// stagedState is what the staging log's live records make of one blob.
type stagedState struct {
	records int
	size    int64 // the size the last record sets
}

// stagingProblems reads the staging log without writing (staging.Inspect):
// a log that cannot be read is a problem (the IO service would not
// start); its live records are noted per blob. A store without a log (made
// before it, or with io.staging_size 0) has none.
func stagingProblems(r *Report, be backend.Backend) (map[uint64]stagedState, error) {
	b, err := be.Open(backend.StagingBlob)
	if errors.Is(err, syscall.ENOENT) {
		return nil, nil
	}
	if err != nil {
		r.Problems = append(r.Problems, Problem{Kind: "staging-log", Blob: uint64(backend.StagingBlob), Detail: fmt.Sprintf("the staging log cannot be opened: %v", err)})
		return nil, nil
	}
	defer b.Close()
	recs, st, err := staging.Inspect(b)
	if err != nil {
		r.Problems = append(r.Problems, Problem{Kind: "staging-log", Blob: uint64(backend.StagingBlob),
			Detail: fmt.Sprintf("the staging log does not read (the IO service would not start, and fsyncs it acknowledged may be lost): %v", err)})
		return nil, nil
	}
	r.Staged = len(recs)
	out := map[uint64]stagedState{}
	for i, rec := range recs {
		if want := st.TrimLSN + 1 + uint64(i); rec.LSN != want {
			r.Problems = append(r.Problems, Problem{Kind: "staging-log", Blob: rec.Blob,
				Detail: fmt.Sprintf("record %d of the live chain has lsn %d, want %d", i, rec.LSN, want)})
		}
		s := out[rec.Blob]
		s.records++
		s.size = rec.Size
		out[rec.Blob] = s
	}
	return out, nil
}

// sizeProblem says what a difference between the recorded size and the
// blob's means.
func sizeProblem(a ns.Attr, blob int64) (Problem, bool) {
	p := Problem{Kind: "size-mismatch", Ino: uint64(a.Ino), Blob: a.Blob}
	switch {
	case blob == a.Size:
		return p, false
	case blob > a.Size:
		// Not damage: writes no fsync acknowledged reached the device
		// (io died before it reported their size). A note.
		p.Note = true
		p.Detail = fmt.Sprintf("the namespace records %d bytes, the blob holds %d: %d bytes written after the size last reached the namespace (at an fsync or a close) are on the device, but the crash came before their size was recorded; nothing is lost, and the next open of the file takes the blob's size", a.Size, blob, blob-a.Size)
	default:
		p.Detail = fmt.Sprintf("the namespace records %d bytes, the blob holds %d: the last %d bytes were written after the last fsync and did not reach the device before the crash (they are lost); the next open of the file takes the blob's size", a.Size, blob, a.Size-blob)
	}
	return p, true
}

// repair deletes the blobs awaiting deletion and the orphans, frees the
// held files, and records each file's blob size.
func repair(n *ns.NS, be backend.Backend) ([]string, error) {
	var done []string
	freed, err := n.ReleaseHeld()
	if err != nil {
		return done, fmt.Errorf("free held files: %w", err)
	}
	if len(freed) > 0 {
		done = append(done, fmt.Sprintf("freed %d files unlinked while open", len(freed)))
	}
	// The staging log first, as the IO service's start would: the sizes
	// recorded below are those its fsyncs acknowledged.
	if replayed, err := iosvc.Replay(be, nil); err != nil {
		return done, fmt.Errorf("replay the staging log: %w", err)
	} else if replayed > 0 {
		done = append(done, fmt.Sprintf("replayed %d staging records into their blobs", replayed))
	}
	blobs, err := fileBlobs(be)
	if err != nil {
		return done, err
	}
	owned := map[uint64]ns.Attr{}
	for _, a := range n.Files() {
		owned[a.Blob] = a
	}
	orphans := 0
	for _, id := range blobs {
		if _, ok := owned[uint64(id)]; ok || n.PendingDelete(uint64(id)) || ns.Ino(id) > ns.MaxIno {
			continue // past MaxIno: not weir's (still reported), left alone
		}
		if err := n.MarkDead(uint64(id)); err != nil {
			return done, fmt.Errorf("mark orphan blob %d: %w", id, err)
		}
		orphans++
	}
	deleted := 0
	for _, blob := range n.PendingDeletes() {
		err := be.Delete(backend.BlobID(blob))
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			return done, fmt.Errorf("delete blob %d: %w", blob, err)
		}
		if err := n.BlobGone(blob); err != nil {
			return done, err
		}
		deleted++
	}
	if err := be.Sync(); err != nil {
		return done, fmt.Errorf("sync backend: %w", err)
	}
	if deleted > 0 {
		done = append(done, fmt.Sprintf("deleted %d blobs (%d orphans, %d awaiting deletion)", deleted, orphans, deleted-orphans))
	}
	sizes := 0
	for blob, a := range owned {
		b, err := be.Open(backend.BlobID(blob))
		if err != nil {
			continue
		}
		size := b.Size()
		b.Close()
		if size != a.Size {
			if err := n.SetLive(a.Ino, size, a.Mtime); err != nil {
				return done, fmt.Errorf("record the size of file %d: %w", a.Ino, err)
			}
			sizes++
		}
	}
	if sizes > 0 {
		done = append(done, fmt.Sprintf("recorded the blob's size for %d files", sizes))
	}
	return done, n.Sync()
}
