package ring

import (
	"errors"
	"sync/atomic"
)

// The two queues are bounded MPMC queues after Dmitry Vyukov: every slot
// starts with a 64-bit sequence word, and a slot at position pos is
//
//	free for the producer of pos  when seq == pos
//	ready for the consumer of pos when seq == pos+1
//	free again for pos+entries    after the consumer stores pos+entries
//
// The producer position and the consumer position are private to the side
// that advances them (a Go atomic in this process); only the sequence words
// and the slot bodies are shared. A peer therefore can corrupt nothing but
// slot contents and sequence words, and every value read from those is
// classified below as ready, not-ready or corrupt. docs/ring-abi.md has the
// memory-ordering contract.

// errCorrupt means a sequence word holds a value no honest peer writes.
var errCorrupt = errors.New("ring: queue sequence corrupted by peer")

// queue is one side's view of one shared queue.
type queue struct {
	r        *Region
	slot     func(pos uint64) uint64 // slot offset for a position
	entries  uint64
	raceBase int           // first race key of this queue
	pos      atomic.Uint64 // this side's position (producer or consumer)
}

func newSQ(r *Region) *queue {
	return &queue{r: r, slot: r.sqSlot, entries: uint64(r.g.SQEntries)}
}

func newCQ(r *Region) *queue {
	return &queue{r: r, slot: r.cqSlot, entries: uint64(r.g.CQEntries), raceBase: int(r.g.SQEntries)}
}

// claimProduce reserves the next slot for writing. It returns the slot's
// position and offset, or ok=false if the queue is full.
func (q *queue) claimProduce() (pos, off uint64, ok bool, err error) {
	for {
		pos = q.pos.Load()
		off = q.slot(pos)
		seq := q.r.load64(off)
		switch diff := int64(seq - pos); {
		case diff == 0:
			if q.pos.CompareAndSwap(pos, pos+1) {
				q.r.raceAcquire(q.raceBase + int(pos&(q.entries-1)))
				return pos, off, true, nil
			}
		case diff < 0:
			return 0, 0, false, nil
		default:
			// Another producer of this process took pos; if our position
			// has not moved, the peer wrote a sequence from the future.
			if q.pos.Load() == pos {
				return 0, 0, false, errCorrupt
			}
		}
	}
}

// publish hands a produced slot to the consumer.
func (q *queue) publish(pos, off uint64) {
	q.r.raceRelease(q.raceBase + int(pos&(q.entries-1)))
	q.r.store64(off, pos+1)
}

// claimConsume reserves the next ready slot for reading. ok=false means the
// queue is empty.
func (q *queue) claimConsume() (pos, off uint64, ok bool, err error) {
	for {
		pos = q.pos.Load()
		off = q.slot(pos)
		seq := q.r.load64(off)
		switch diff := int64(seq - (pos + 1)); {
		case diff == 0:
			if q.pos.CompareAndSwap(pos, pos+1) {
				q.r.raceAcquire(q.raceBase + int(pos&(q.entries-1)))
				return pos, off, true, nil
			}
		case diff < 0:
			return 0, 0, false, nil
		default:
			if q.pos.Load() == pos {
				return 0, 0, false, errCorrupt
			}
		}
	}
}

// recycle gives a consumed slot back to the producers.
func (q *queue) recycle(pos, off uint64) {
	q.r.raceRelease(q.raceBase + int(pos&(q.entries-1)))
	q.r.store64(off, pos+q.entries)
}

// ready reports, without claiming, whether the consumer's next slot holds an
// entry. A corrupt sequence counts as ready so the consumer goes and finds
// out.
func (q *queue) ready() bool {
	pos := q.pos.Load()
	return int64(q.r.load64(q.slot(pos))-(pos+1)) >= 0
}
