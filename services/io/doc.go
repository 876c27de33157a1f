// Package iosvc is the IO service: it owns the storage backend and serves
// reads and writes from client rings (docs/architecture.md), on the
// service skeleton of package host.
//
// A client session starts with a ring handshake on the IO socket, then
// proto.OpAttach binds it to the client's metadata session (the metadata
// service vouches for the session id, token, uid and pid over NATS). The
// IO service authorises nothing by itself: a handle works only after the
// metadata service granted it to this session (control.Subjects.Grant, or
// a read capability it minted with this epoch's key, which the client
// claims with proto.OpClaim: claims.go) and stops working when it is
// revoked. A revocation is a barrier: the handle
// leaves the grant table at once, so new requests on it get EBADF, and the
// answer, with the blob's final size and mtime, waits until the requests
// in flight on it are done.
//
// The metadata service's control requests arrive on one ordered
// subscription and are validated as strictly as ring descriptors
// (control.go): a malformed body, a grant for a session that is not
// attached here or of another incarnation, a blob at or above the
// allocation limit, a grant whose version is not newer than the last
// message applied to its file, a revoke not newer than the grant it would
// end: refused, counted in control_refused_*, logged once per
// kind, nothing changed. Blob deletes (up to 8 at once) and the blob
// listings of the orphan scan run off that subscription, so a slow one
// holds up no grant or revoke; the emptying of an O_TRUNC grant stays in
// order, as later messages of the file depend on it.
//
// The IO service keeps a service session with the metadata service
// (Options.MetadataSocket). At every start of that session the metadata
// service resynchronises this one (control.Subjects.Resync): every grant
// is dropped, every attached session becomes stale (ESTALE until it
// attaches again; the client library then re-establishes itself), and the
// allocation limit is set; the sizes of blobs that dropped grants wrote
// are reported to metadata.
//
// Each session is served by its own poller goroutine, so a slow request
// delays only its own session. Reads and writes run on goroutines of their
// own (ring.AsyncHandler), so one session keeps many of them in flight at
// the backend, up to its ring's SQ size. A write that fails changes
// nothing; a read at or past the end of the file reads nothing, whatever
// the offset; with O_SYNC or O_DSYNC (the grant's sync mode) each write is
// followed by what fsync does.
//
// Blob size and mtime are live here while a file is open for writing; the
// metadata service asks for them (control.Subjects.Live), receives them
// when a grant ends, and is told durably at every fsync
// (control.Subjects.SetLive): the size the fsync made durable, read before
// it began. Every report carries the blob's data version, which grows with
// every change, so that metadata never applies an older size after a newer
// one.
//
// A backend that moves data straight between the device and registered
// memory (backend.MemRegistrar: SPDK) gets each session's whole region
// registered when the session starts and unregistered after its last
// request, before the region is unmapped (host.Drainer); a refusal is
// counted in mem_register_failures and the backend copies that session's
// payloads. If it wants huge pages, regions are MFD_HUGETLB; a session for
// which none can be had falls back to ordinary pages, unregistered,
// counted in ring_hugepage_fallbacks. The SPDK backend builds with the
// spdk tag (docs/spdk-backend.md).
//
// Not built yet (see docs/architecture.md): the write-back page cache with
// readahead, split journaling, and multiplexing many sessions onto a fixed
// set of polling workers.
package iosvc
