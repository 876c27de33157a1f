package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/ring"
)

// Targets: the weir client, package os with buffered I/O, and package os
// with O_DIRECT (data files only; its namespace operations would be those
// of os, so the metadata workloads do not run on it).
const (
	targetWeir     = "weir"
	targetOS       = "os"
	targetOSDirect = "os-direct"
)

var allTargets = []string{targetWeir, targetOS, targetOSDirect}

// dataFile is what the data workloads need of an open file; *os.File and
// *client.File both have it.
type dataFile interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Sync() error
	Close() error
}

// target is one side of the comparison, rooted at its own directory.
type target interface {
	// OpenFile opens a data file (with O_DIRECT for os-direct).
	OpenFile(name string, flag int, perm fs.FileMode) (dataFile, error)
	// Create is the metadata workload's create: open with
	// O_CREATE|O_EXCL|O_WRONLY, then close.
	Create(name string) error
	Stat(name string) (fs.FileInfo, error)
	Remove(name string) error
	MkdirAll(name string) error
	// FS is the directory dir as an fs.FS, as a program would read it
	// through io/fs.
	FS(dir string) (fs.FS, error)
	Chmod(name string, mode fs.FileMode) error
	Close() error
}

// weirRoot is the directory of the weir namespace the benchmark works in.
const weirRoot = "fileops"

// weirTarget is the weir client; names are relative to weirRoot.
type weirTarget struct{ fs *client.FS }

func dialWeir(ctx context.Context, metaSock, ioSock, wait string) (*weirTarget, error) {
	mode, err := ring.ParseWaitMode(wait)
	if err != nil {
		return nil, err
	}
	c, err := client.Dial(ctx, client.Options{MetadataSocket: metaSock, IOSocket: ioSock, Mode: mode})
	if err != nil {
		return nil, err
	}
	if err := c.MkdirAll(weirRoot, 0o755); err != nil {
		c.Close()
		return nil, err
	}
	return &weirTarget{fs: c}, nil
}

func (w *weirTarget) path(name string) string { return weirRoot + "/" + name }

func (w *weirTarget) OpenFile(name string, flag int, perm fs.FileMode) (dataFile, error) {
	return w.fs.OpenFile(w.path(name), flag, perm)
}

func (w *weirTarget) Create(name string) error {
	f, err := w.fs.OpenFile(w.path(name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func (w *weirTarget) Stat(name string) (fs.FileInfo, error) { return w.fs.Stat(w.path(name)) }

// FS is the client's fs.FS (rooted at the namespace's root) below dir.
func (w *weirTarget) FS(dir string) (fs.FS, error) { return fs.Sub(w.fs, w.path(dir)) }

func (w *weirTarget) Remove(name string) error   { return w.fs.Remove(w.path(name)) }
func (w *weirTarget) MkdirAll(name string) error { return w.fs.MkdirAll(w.path(name), 0o755) }
func (w *weirTarget) Close() error               { return w.fs.Close() }
func (w *weirTarget) Chmod(name string, mode fs.FileMode) error {
	return w.fs.Chmod(w.path(name), mode)
}

// osTarget is package os under root; direct adds O_DIRECT to data files.
type osTarget struct {
	root   string
	direct bool
}

func (o *osTarget) path(name string) string { return filepath.Join(o.root, name) }

func (o *osTarget) OpenFile(name string, flag int, perm fs.FileMode) (dataFile, error) {
	if o.direct {
		flag |= syscall.O_DIRECT
	}
	f, err := os.OpenFile(o.path(name), flag, perm)
	if err != nil {
		if o.direct && errors.Is(err, syscall.EINVAL) {
			return nil, &notApplicable{fmt.Sprintf("open with O_DIRECT: %v (the file system refuses direct I/O)", err)}
		}
		return nil, err
	}
	return f, nil
}

func (o *osTarget) Create(name string) error {
	f, err := os.OpenFile(o.path(name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func (o *osTarget) Stat(name string) (fs.FileInfo, error) { return os.Stat(o.path(name)) }

func (o *osTarget) FS(dir string) (fs.FS, error) { return os.DirFS(o.path(dir)), nil }

func (o *osTarget) Remove(name string) error   { return os.Remove(o.path(name)) }
func (o *osTarget) MkdirAll(name string) error { return os.MkdirAll(o.path(name), 0o755) }
func (o *osTarget) Close() error               { return nil }
func (o *osTarget) Chmod(name string, mode fs.FileMode) error {
	return os.Chmod(o.path(name), mode)
}

// notApplicable is a workload a target cannot run on this machine
// (O_DIRECT refused); its row says why instead of giving numbers.
type notApplicable struct{ why string }

func (e *notApplicable) Error() string { return "n/a: " + e.why }
