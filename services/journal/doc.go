// Package journal will be the journal service after Oxbow's Split
// Journaling: fsync stages data and inode, this service batches staged
// transactions into the journal and checkpoints them (docs/architecture.md).
// Built so far: the staging log's format, writer and recovery (package
// staging, docs/journal-format.md). The service itself is not built yet.
package journal
