//go:build !spdk

package main

// spdkBuilt says the spdk rows can run.
const spdkBuilt = false

const noSPDK = "n/a: built without the spdk tag"

// spdkPhases reports every spdk target as not available.
func spdkPhases(dir string, s settings) []func() []target {
	return []func() []target{func() []target {
		var ts []target
		dev, weirDev := devTargets(s)
		for _, n := range []string{dev, targetSPDKMalloc, targetSPDKMallocCGO, weirDev, targetWeirSPDKMalloc} {
			ts = append(ts, target{name: n, na: noSPDK})
		}
		return ts
	}}
}
