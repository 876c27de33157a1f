// Package journal is the journal service after Oxbow's Split Journaling
// (docs/architecture.md, "fsync as built"): an fsync writes its file's
// changed pages and inode fields as one staging record and returns; this
// service, a process of its own, commits those records in the background.
// It keeps a service session with the IO service (internal/journalproto)
// and, pass after pass, takes the run of live staging records from io's
// trim point as one batch of files, has io make each file durable at home
// (the checkpoint: io owns the device), commits the files' inode fields
// (size, mtime, data version) to the metadata service in one synced WAL
// commit (control.SetLiveBatch), and has io trim the log.
//
// weir's journal is the metadata service's WAL: the inode fields of a
// batch are one record there, and recovery replays that WAL and the
// staging log (io, before it serves anyone). A journal log of this
// service's own would hold the same fields a second time and cost one
// device flush more per commit.
//
// While this service is down fsync goes on until the staging log is full,
// then waits; on its return the service catches up.
package journal
