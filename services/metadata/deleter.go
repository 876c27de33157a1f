package metadata

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/weir-storage/weir/internal/control"
)

// deleter deletes the blobs awaiting deletion at the IO service. The
// namespace persists that set (ns.PendingDeletes), so a delete lost in a
// crash is retried after the restart; here every blob is tried on its own
// schedule: a delete that fails is retried with backoff (100ms doubling to
// 30s) and never holds up the others, which go ahead up to
// deleteParallel at a time. Nothing is tried while io is not connected;
// its return (after the resync) starts everything again.
type deleter struct {
	s  *Service
	mu sync.Mutex
	// due maps every blob awaiting deletion to its next attempt;
	// protected by mu.
	due      map[uint64]*deleteState
	inflight map[uint64]bool // protected by mu
	wake     chan struct{}
}

type deleteState struct {
	attempts int
	next     time.Time
}

// deleteParallel bounds the deletes in flight at once.
const deleteParallel = 8

func newDeleter(s *Service) *deleter {
	return &deleter{s: s, due: map[uint64]*deleteState{}, inflight: map[uint64]bool{}, wake: make(chan struct{}, 1)}
}

// add schedules blob (already awaiting deletion in the namespace) now.
func (d *deleter) add(blob uint64) {
	if blob == 0 {
		return
	}
	d.mu.Lock()
	if d.due[blob] == nil {
		d.due[blob] = &deleteState{next: time.Now()}
	}
	d.mu.Unlock()
	d.kick()
}

func (d *deleter) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// pending is the number of blobs awaiting deletion (the stats gauge).
func (d *deleter) pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.due)
}

func (d *deleter) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	sem := make(chan struct{}, deleteParallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-d.s.stop:
			return
		case <-d.wake:
		case <-t.C:
		case <-d.s.io.wait():
		}
		next := time.Hour
		if d.s.io.isUp() {
			now := time.Now()
			d.mu.Lock()
			var ready []uint64
			for blob, st := range d.due {
				if d.inflight[blob] {
					continue
				}
				if st.next.After(now) {
					next = min(next, st.next.Sub(now))
					continue
				}
				ready = append(ready, blob)
				d.inflight[blob] = true
			}
			d.mu.Unlock()
			for _, blob := range ready {
				select {
				case sem <- struct{}{}:
				case <-d.s.stop:
					d.mu.Lock()
					for _, b := range ready {
						delete(d.inflight, b)
					}
					d.mu.Unlock()
					return
				}
				wg.Go(func() {
					defer func() { <-sem }()
					d.attempt(blob)
					d.kick()
				})
			}
		}
		t.Reset(max(next, time.Millisecond))
	}
}

// attempt tries one delete and records the outcome.
func (d *deleter) attempt(blob uint64) {
	err := d.s.deleteBlob(blob)
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.inflight, blob)
	st := d.due[blob]
	if st == nil {
		return
	}
	if err == nil {
		delete(d.due, blob)
		return
	}
	st.attempts++
	st.next = time.Now().Add(backoff(st.attempts))
	lvl := d.s.log.Debug
	if st.attempts == 3 {
		lvl = d.s.log.Warn
	}
	lvl("blob delete failed; retrying", "blob", blob, "attempts", st.attempts, "next_in", time.Until(st.next).Round(time.Millisecond), "error", err)
}

// final tries each pending delete once more, at most until ctx ends, as
// the service stops: what fails stays pending in the namespace.
func (d *deleter) final(ctx context.Context) {
	if !d.s.io.isUp() {
		return
	}
	d.mu.Lock()
	blobs := make([]uint64, 0, len(d.due))
	for b := range d.due {
		blobs = append(blobs, b)
	}
	d.mu.Unlock()
	for _, b := range blobs {
		if ctx.Err() != nil {
			return
		}
		d.attempt(b)
	}
}

// deleteBlob deletes one blob at io and records it gone.
func (s *Service) deleteBlob(blob uint64) error {
	s.endLeasesOfBlob(blob) // io deletes no blob a grant holds
	var ack control.Ack
	err := s.request(s.subj.Delete, control.Delete{Blob: blob}, &ack)
	if err != nil {
		s.Stats.DeleteFailures.Add(1)
		return err
	}
	s.Stats.DeletesDone.Add(1)
	if err := s.ns.BlobGone(blob); err != nil && !errors.Is(err, syscall.ENOENT) {
		return err
	}
	return nil
}

// queueDelete schedules the blob of a file that lost its last name and
// last open (ns put it in the set awaiting deletion): the reply to an
// unlink or close does not wait for the IO service.
func (s *Service) queueDelete(blob uint64) { s.dels.add(blob) }
