package benchutil

import (
	"math"
	"math/bits"
)

// histSubBits sets the histogram's precision: each power of two is split
// into 1<<histSubBits buckets, so a value is known to within 1/128 (0.8 %)
// of itself, and values below 128 exactly.
const histSubBits = 7

const (
	histSub     = 1 << histSubBits
	histBuckets = (64 - histSubBits + 1) * histSub
)

// Histogram counts latencies in nanoseconds in log-linear buckets. It has
// a fixed size (about 60 KiB) whatever the number of values, so a
// benchmark's memory does not grow with its operation count. The zero
// value is empty and ready to use.
type Histogram struct {
	counts   [histBuckets]uint64
	n        uint64
	sum      float64
	min, max int64
}

// bucket returns the index of the bucket holding v (v >= 0).
func bucket(v int64) int {
	if v < histSub {
		return int(max(v, 0))
	}
	e := bits.Len64(uint64(v)) - 1 // >= histSubBits
	shift := e - histSubBits
	m := int(v >> shift) // in [histSub, 2*histSub)
	return (shift+1)*histSub + m - histSub
}

// bounds returns the smallest and largest value bucket i holds.
func bounds(i int) (lo, hi int64) {
	if i < histSub {
		return int64(i), int64(i)
	}
	shift := i/histSub - 1
	m := int64(histSub + i%histSub)
	lo = m << shift
	return lo, lo + 1<<shift - 1
}

// Record adds one value in nanoseconds; negative values count as 0.
func (h *Histogram) Record(ns int64) {
	ns = max(ns, 0)
	if h.n == 0 || ns < h.min {
		h.min = ns
	}
	if ns > h.max {
		h.max = ns
	}
	h.counts[bucket(ns)]++
	h.n++
	h.sum += float64(ns)
}

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min and Max are the exact extremes in nanoseconds (0 when empty).
func (h *Histogram) Min() int64 { return h.min }

// Max is the largest value recorded, in nanoseconds.
func (h *Histogram) Max() int64 { return h.max }

// Mean is the exact mean in nanoseconds (0 when empty).
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// Quantile returns the nearest-rank p-quantile in nanoseconds: the middle
// of the bucket holding the value of rank ceil(p·n), clamped to the exact
// extremes. 0 when empty.
func (h *Histogram) Quantile(p float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(p * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bounds(i)
			return min(max(lo+(hi-lo)/2, h.min), h.max)
		}
	}
	return h.max
}

// QuantileUs is Quantile in microseconds.
func (h *Histogram) QuantileUs(p float64) float64 { return float64(h.Quantile(p)) / 1e3 }

// CDFPoint is one step of a cumulative distribution: Fraction of the
// values are at most Us microseconds.
type CDFPoint struct {
	Us       float64 `json:"us"`
	Fraction float64 `json:"f"`
}

// CDF returns the cumulative distribution, one point per non-empty bucket
// at the bucket's upper bound (the last at the exact maximum). Nil when
// empty.
func (h *Histogram) CDF() []CDFPoint {
	if h.n == 0 {
		return nil
	}
	var pts []CDFPoint
	var seen uint64
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		seen += c
		_, hi := bounds(i)
		hi = min(hi, h.max)
		pts = append(pts, CDFPoint{Us: float64(hi) / 1e3, Fraction: float64(seen) / float64(h.n)})
	}
	return pts
}
