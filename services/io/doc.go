// Package iosvc is the IO service: it owns the storage backend and serves
// reads and writes from client rings (docs/architecture.md).
//
// A client session starts with a ring handshake on the IO socket, then
// OpAttach binds it to the client's metadata session (the metadata service
// vouches for the session id, token, uid and pid over NATS). The IO service
// authorises nothing by itself: a handle works only after the metadata
// service granted it to this session (wire.Subjects.Grant) and stops
// working when it is revoked. Each session is served by its own poller
// goroutine, so a slow request delays only its own session. Reads and
// writes run on goroutines of their own (ring.AsyncHandler), so one
// session keeps many of them in flight at the backend, up to its ring's SQ
// size.
//
// Blob size and mtime are live here while a file is open for writing; the
// metadata service asks for them (wire.Subjects.Live), receives them when a
// grant ends, and is told durably at every fsync (wire.Subjects.SetLive).
//
// A backend that moves data straight between the device and registered
// memory (backend.MemRegistrar: SPDK) gets each session's whole region
// registered when the session starts and unregistered after its last
// request, before the region is unmapped (ringsrv.Drainer); a refusal is
// counted in mem_register_failures and the backend copies that session's
// payloads. If it wants huge pages, regions are MFD_HUGETLB; a session for
// which none can be had falls back to ordinary pages, unregistered,
// counted in ring_hugepage_fallbacks.
//
// Not built yet (see docs/architecture.md): the write-back buffer cache with
// readahead, split journaling, multiplexing many sessions onto a fixed set of
// polling workers, and the SPDK backend (issue 4).
package iosvc
