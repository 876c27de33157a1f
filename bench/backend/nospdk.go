//go:build !spdk

package main

// spdkBuilt says the spdk rows can run.
const spdkBuilt = false

const noSPDK = "n/a: built without the spdk tag"

// newSPDK reports both spdk targets as not available.
func newSPDK(dir string, s settings) []target {
	return []target{{name: targetSPDKAio, na: noSPDK}, {name: targetSPDKMalloc, na: noSPDK}}
}
