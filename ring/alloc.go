package ring

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"
)

// bitmap hands out indices [0, n) without a lock: a set bit is a free index
// and taking one is a CAS on its 64-bit word. Callers first reserve units in
// a sema, so a take never finds fewer free bits than it asks for (it may
// have to look twice while another goroutine's put is half done).
type bitmap struct {
	words []atomic.Uint64
	hint  atomic.Uint32 // word to start scanning at; spreads contention
}

func newBitmap(n int) *bitmap {
	b := &bitmap{words: make([]atomic.Uint64, (n+63)/64)}
	for i := range b.words {
		lo := i * 64
		switch {
		case n-lo >= 64:
			b.words[i].Store(^uint64(0))
		default:
			b.words[i].Store(uint64(1)<<uint(n-lo) - 1)
		}
	}
	return b
}

// take appends k free indices to dst, lowest bits of a word first so that
// free runs come out contiguous.
func (b *bitmap) take(k int, dst []uint32) []uint32 {
	nw := uint32(len(b.words))
	w := b.hint.Load() % nw
	for k > 0 {
		old := b.words[w].Load()
		if old == 0 {
			w = (w + 1) % nw
			continue
		}
		var mask uint64
		got := 0
		for rest := old; rest != 0 && got < k; got++ {
			low := rest & -rest
			mask |= low
			rest &^= low
		}
		if !b.words[w].CompareAndSwap(old, old&^mask) {
			continue
		}
		for m := mask; m != 0; m &= m - 1 {
			dst = append(dst, w*64+uint32(bits.TrailingZeros64(m)))
		}
		k -= got
		if old&^mask == 0 {
			w = (w + 1) % nw
		}
	}
	b.hint.Store(w)
	return dst
}

// put frees indices.
func (b *bitmap) put(idx []uint32) {
	for _, i := range idx {
		b.words[i/64].Or(uint64(1) << (i % 64))
	}
}

// sema counts free units. The fast path is one CAS; only a caller that has
// to wait takes the mutex. release broadcasts to waiters by closing the
// current generation channel.
type sema struct {
	n       atomic.Int64
	waiting atomic.Int32
	mu      sync.Mutex
	gen     chan struct{} // protected by mu
}

func newSema(n int64) *sema {
	s := &sema{gen: make(chan struct{})}
	s.n.Store(n)
	return s
}

func (s *sema) tryAcquire(k int64) bool {
	for {
		v := s.n.Load()
		if v < k {
			return false
		}
		if s.n.CompareAndSwap(v, v-k) {
			return true
		}
	}
}

// acquire takes k units, waiting until they are free, ctx ends or done is
// closed (then it returns doneErr()).
func (s *sema) acquire(ctx context.Context, k int64, done <-chan struct{}, doneErr func() error) error {
	if s.tryAcquire(k) {
		return nil
	}
	for {
		s.mu.Lock()
		gen := s.gen
		s.mu.Unlock()
		s.waiting.Add(1)
		if s.tryAcquire(k) {
			s.waiting.Add(-1)
			return nil
		}
		select {
		case <-gen:
		case <-ctx.Done():
			s.waiting.Add(-1)
			return ctx.Err()
		case <-done:
			s.waiting.Add(-1)
			return doneErr()
		}
		s.waiting.Add(-1)
	}
}

func (s *sema) release(k int64) {
	s.n.Add(k)
	if s.waiting.Load() > 0 {
		s.mu.Lock()
		close(s.gen)
		s.gen = make(chan struct{})
		s.mu.Unlock()
	}
}
