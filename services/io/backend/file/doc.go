// Package file is weir's default blob backend: one regular file per blob,
// written with O_DIRECT where the file system allows it (all but the
// staging log's, backend.StagingBlob, which goes through the page cache:
// blobFile.direct says why).
//
// # On-disk layout, format version 1
//
// The backend owns DIR/blobs, where DIR is Options.Dir (the service's data
// directory):
//
//	DIR/blobs/
//	    FORMAT              "weir-blobs 1\n": the format version; written once
//	                        (temp file, rename, fsync of blobs/); New refuses
//	                        any other content
//	    LOCK                empty; flock(LOCK_EX) held while a Backend is open,
//	                        so two backends never share a directory
//	    00/ 01/ ... ff/     fan-out directories: the low byte of the blob id
//	                        as two lowercase hex digits; made on first use
//	        0000000000000100
//	        ...             one regular file per blob: the id as 16 lowercase
//	                        hex digits (blob 0x100 lives in 00/, 0x1ff in ff/)
//
// A blob file holds the blob's bytes at the same offsets and nothing else:
// no header, no trailer. Its file size is the blob size; holes in the blob
// are holes in the file, so a blob with 10 bytes at 5 GiB uses one block.
//
//	offset 0                                                  size
//	+---------------------------------------------------------+
//	| blob bytes (holes read as zeros)                         |
//	+---------------------------------------------------------+
//
// Any other name under blobs/ (".direct-probe", strays of the wrong form or
// in the wrong fan-out directory) is not a blob: List skips it and logs it.
//
// # Durability
//
// Create is open(O_CREAT|O_EXCL) of an empty file and Delete is unlink; both
// become durable at Backend.Sync, which fsyncs every fan-out directory
// changed since the last Sync (and blobs/ when a fan-out directory was
// made). Blob.Sync is fdatasync, or fsync when the size changed since the
// last sync. A failed sync is sticky for the life of the Backend: every later
// Sync of that blob returns the first error, even through a new handle,
// because after a failed fsync Linux may already have dropped the dirty
// pages. Only Delete forgets it.
//
// Recovery needs no log: the blob files are the state. After a crash, data
// and sizes not yet synced may be lost, and with O_DIRECT an unsynced
// extending write may leave the file size rounded up to the next 4 KiB with
// zero bytes: the metadata service's size, written at fsync, is the
// authority for file sizes.
//
// # Direct I/O
//
// With DirectAuto (the default) New probes blobs/: it uses O_DIRECT when the
// file system accepts it for 4 KiB-aligned I/O (statx STATX_DIOALIGN is
// consulted where the kernel reports it) and falls back to buffered I/O
// when the file system refuses (EINVAL) or is tmpfs, which accepts O_DIRECT
// since Linux 6.6 but has no device behind the page cache. DirectOn fails
// New instead of falling back; DirectOff never probes. Mode and Stats say
// which is in use.
//
// With O_DIRECT every transfer goes through 4096-aligned bounce buffers at
// 4096-aligned offsets. An unaligned write reads, patches and rewrites only
// its partial first and last blocks (and reads them only when they lie
// below the current size: blocks at or past the end are known to be zeros);
// the aligned blocks between are written without a read. Each edge block's
// read-modify-write holds a lock striped by block number, so concurrent
// writers to disjoint ranges that share a block keep each other's bytes.
// A block that the blob ends inside is written through a second, buffered
// descriptor of the file, to the exact end: an O_DIRECT write of the whole
// block would make the file longer than the blob until a cut back, and a
// crash in between would leave zeros past the end that the next start
// takes for data (the blob's size is its file's).
package file
