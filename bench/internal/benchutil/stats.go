package benchutil

import "math"

// PercentileUs is the nearest-rank p-quantile of sorted nanoseconds, in
// microseconds; 0 for no samples.
func PercentileUs(sorted []int64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i]) / 1e3
}
