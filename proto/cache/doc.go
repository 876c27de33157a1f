// Package cache is the ABI of a cache region: the shared memory in which
// the IO service keeps one open file's pages for every client that has the
// file open, so that a read of a cached page is a copy out of memory, with
// no system call and no round trip (issue 9). docs/cache-abi.md is the
// byte-level contract, with the memory-ordering rules; include/weir_cache.h
// in proto restates it for C peers, and a test holds the two together.
//
// A region is one memfd, created and sized by the IO service: a header page,
// then chunks, each one page of state words followed by the ChunkPages
// pages of file data they describe. Page p of the file is page p%ChunkPages
// of chunk p/ChunkPages, so a region grows by appending chunks and nothing
// moves.
//
// The IO service writes the header and every page transition (fill,
// update, eviction); a client reads a page with the seqlock protocol of
// Region.ReadPage, and the file's live fields (size, times, data version)
// with that of Region.Fields. Every value a client can write is untrusted
// to the service: Word.Valid and Fields.Check say what is well-formed, and
// the service keeps its own copy of everything it needs to trust.
//
// This package defines the layout and the protocol and implements both
// sides over a mapping; it does not map memory itself (tests do, with
// memfd_create).
package cache
