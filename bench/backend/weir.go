package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/stack"
)

// newWeir runs weir in this process (embedded NATS, the metadata and IO
// services: stack.Start) with set applied to its configuration, and makes
// one filled file through the Go client: the whole data path, client, ring,
// IO service and backend. The IO service's session poller waits adaptively
// (the default).
func newWeir(dir, name string, size int64, set func(c *config.Config)) target {
	t := target{name: name}
	// Socket paths must stay short (108 bytes).
	run, err := os.MkdirTemp("", "wbr-")
	if err != nil {
		t.err = err.Error()
		return t
	}
	fail := func(err error, undo ...func()) target {
		for _, u := range undo {
			u()
		}
		os.RemoveAll(run)
		t.err = err.Error()
		return t
	}
	c, err := stack.LocalConfig(filepath.Join(dir, name), run)
	if err != nil {
		return fail(err)
	}
	set(c)
	st, err := stack.Start(c, hclog.NewNullLogger())
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	stop := func() { st.Shutdown(ctx) }
	fsys, err := st.Dial(ctx)
	if err != nil {
		return fail(err, stop)
	}
	f, err := fsys.Create("/bench.dat")
	if err != nil {
		return fail(err, func() { fsys.Close() }, stop)
	}
	if err := fill(f, size); err == nil {
		err = f.Sync()
	} else {
		return fail(err, func() { f.Close(); fsys.Close() }, stop)
	}
	t.dev = f
	t.close = func() error {
		err := errors.Join(f.Close(), fsys.Close(), st.Shutdown(ctx))
		os.RemoveAll(run)
		return err
	}
	return t
}

// newWeirFile is weir on the file backend, O_DIRECT required.
func newWeirFile(dir string, size int64) target {
	return newWeir(dir, targetWeirFile, size, func(c *config.Config) {
		c.IO.Backend, c.IO.Direct = "file", "on"
	})
}
