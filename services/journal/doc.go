// Package journal will be the journal service after Oxbow's Split
// Journaling: fsync stages data and inode, this service batches staged
// transactions into the journal and checkpoints them (docs/architecture.md).
// Not built yet.
package journal
