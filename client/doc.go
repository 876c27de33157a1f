// Package client will be the Go client library, shaped like os and io/fs,
// that reaches the services over the rings of package ring
// (docs/architecture.md). Not built yet: issue 3 builds it.
package client
