// Package metadata will be the metadata service: the namespace, the
// authoritative permission table, leases and trust groups, and the
// file-to-blob map (docs/architecture.md). Not built yet: issue 3 builds it.
package metadata
