package benchutil

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for _, v := range []int64{0, 1, 127, 128, 129, 255, 256, 257, 1000, 1 << 20, 1<<40 + 12345, 1<<62 + 1} {
		i := bucket(v)
		if i < prev {
			t.Errorf("bucket(%d) = %d, below the previous %d", v, i, prev)
		}
		prev = i
		lo, hi := bounds(i)
		if v < lo || v > hi {
			t.Errorf("bucket(%d) = %d holds [%d, %d]", v, i, lo, hi)
		}
		if v >= histSub && float64(hi-lo+1)/float64(lo) > 1.0/histSub+1e-12 {
			t.Errorf("bucket of %d is [%d, %d]: wider than 1/%d", v, lo, hi, histSub)
		}
	}
	if i := bucket(1<<63 - 1); i >= histBuckets {
		t.Errorf("bucket(max int64) = %d, beyond %d buckets", i, histBuckets)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.CDF() != nil || h.Mean() != 0 {
		t.Fatal("empty histogram not empty")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var vals []int64
	for range 100000 {
		v := int64(rng.ExpFloat64()*20000) + 500
		vals = append(vals, v)
		h.Record(v)
	}
	slices.Sort(vals)
	for _, p := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		exact := PercentileUs(vals, p)
		got := h.QuantileUs(p)
		if d := (got - exact) / exact; d > 0.01 || d < -0.01 {
			t.Errorf("p%v = %v µs, exact %v µs", p*100, got, exact)
		}
	}
	if h.Count() != 100000 || h.Min() != vals[0] || h.Max() != vals[len(vals)-1] {
		t.Errorf("count %d min %d max %d", h.Count(), h.Min(), h.Max())
	}
	cdf := h.CDF()
	if last := cdf[len(cdf)-1]; last.Fraction != 1 || last.Us != float64(vals[len(vals)-1])/1e3 {
		t.Errorf("last CDF point %+v", last)
	}
	for i := 1; i < len(cdf); i++ {
		if cdf[i].Us <= cdf[i-1].Us || cdf[i].Fraction <= cdf[i-1].Fraction {
			t.Fatalf("CDF not increasing at %d: %+v then %+v", i, cdf[i-1], cdf[i])
		}
	}
}

func TestHistogramMerge(t *testing.T) {
	var a, b, want Histogram
	for i := int64(1); i <= 1000; i++ {
		if i%3 == 0 {
			a.Record(i * 1000)
		} else {
			b.Record(i * 1000)
		}
		want.Record(i * 1000)
	}
	var m Histogram
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(&Histogram{})
	if m.Count() != want.Count() || m.Min() != want.Min() || m.Max() != want.Max() || m.Quantile(0.5) != want.Quantile(0.5) || m.Mean() != want.Mean() {
		t.Fatalf("merged: n %d min %d max %d p50 %d; want %d %d %d %d", m.Count(), m.Min(), m.Max(), m.Quantile(0.5), want.Count(), want.Min(), want.Max(), want.Quantile(0.5))
	}
}
