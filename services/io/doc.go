// Package io will be the IO service: it owns the device and serves reads and
// writes from client rings through polling workers, with a bounded
// write-back buffer and readahead (docs/architecture.md). Not built yet:
// issue 3 builds it, issue 4 adds the SPDK backend.
package io
