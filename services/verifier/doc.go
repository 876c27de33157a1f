// Package verifier will be the integrity verifier after Trio: it checks a
// file's core state when an exclusive writer of another trust group releases
// it (docs/architecture.md). Not built yet.
package verifier
