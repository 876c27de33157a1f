// Package benchutil holds what the programs under bench/ share: readers of
// a process's CPU time and peak RSS and of the machine's CPU time from
// /proc, a description of the host, nearest-rank percentiles, the number
// formats of the Markdown tables, and an atomic file write for results.
package benchutil
