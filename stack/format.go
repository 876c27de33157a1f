package stack

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/vfs"
)

// FormatPlan says what Format of c erases, for the operator to confirm.
func FormatPlan(c *config.Config) (string, error) {
	meta := filepath.Join(c.DataDir, "meta")
	switch c.IO.Backend {
	case "file":
		return fmt.Sprintf("the namespace in %s and every file's data in %s", meta, filepath.Join(c.DataDir, "blobs")), nil
	case "spdk":
		return fmt.Sprintf("the namespace in %s and everything on SPDK bdev %q (from %s)", meta, c.IO.SPDKBdev, c.IO.SPDKConfig), nil
	case "mem":
		return "", errors.New(`io.backend = "mem" keeps nothing to format`)
	default:
		return "", fmt.Errorf("unknown backend %q", c.IO.Backend)
	}
}

// Format erases the stack of c, which must be stopped: its namespace (the
// next start makes a new one, with a new stack identity) and its store (a
// new, empty blobstore on the SPDK bdev; an empty blob directory for the
// file backend). The namespace goes first: if the store then cannot be
// formatted, the new namespace's IO service refuses the old store
// (wrong_store) rather than serving it, and Format can be run again.
func Format(c *config.Config, log hclog.Logger) error {
	if _, err := FormatPlan(c); err != nil {
		return err
	}
	// What could stop the store's format is checked before the namespace
	// goes: the binary has SPDK, its config reads, no process holds the
	// blobstore.
	if c.IO.Backend == "spdk" {
		if !spdkBuilt {
			return errors.New(`format: io.backend = "spdk" needs a weir built with the spdk tag (make spdk); nothing was changed`)
		}
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			return fmt.Errorf("format: %w", err)
		}
		// It reads the config, and takes and releases the locks.
		if err := spdkCheckFree(c); err != nil {
			return fmt.Errorf("format: %w; nothing was changed (a store in use: stop weir first)", err)
		}
	}
	meta := filepath.Join(c.DataDir, "meta")
	if err := os.MkdirAll(meta, 0o700); err != nil {
		return fmt.Errorf("format: %w", err)
	}
	// The namespace's lock is held by a running metadata service.
	unlock, err := vfs.OS{}.Lock(filepath.Join(meta, "LOCK"))
	if err != nil {
		return fmt.Errorf("format: the namespace is in use (stop weir first): %w", err)
	}
	defer unlock.Close()
	var blobsLock io.Closer
	blobs := filepath.Join(c.DataDir, "blobs")
	if c.IO.Backend == "file" {
		if err := os.MkdirAll(blobs, 0o700); err != nil {
			return fmt.Errorf("format: %w", err)
		}
		if blobsLock, err = (vfs.OS{}).Lock(filepath.Join(blobs, "LOCK")); err != nil {
			return fmt.Errorf("format: the store is in use (stop weir first): %w", err)
		}
		defer blobsLock.Close()
	}
	if err := emptyDir(meta, "LOCK"); err != nil {
		return fmt.Errorf("format: erase the namespace: %w", err)
	}
	log.Info("namespace erased", "dir", meta)
	switch c.IO.Backend {
	case "file":
		if err := emptyDir(blobs, "LOCK"); err != nil {
			return fmt.Errorf("format: the namespace was erased, the store in %s not entirely (run weir format again): %w", blobs, err)
		}
		log.Info("store erased", "dir", blobs)
	case "spdk":
		be, err := spdkBackend(c, spdkFormat)
		if err != nil {
			return fmt.Errorf("format: the namespace was erased, the store not (run weir format again): %w", err)
		}
		if err := be.Close(); err != nil {
			return fmt.Errorf("format: close the new blobstore: %w", err)
		}
		log.Info("store formatted", "bdev", c.IO.SPDKBdev)
	}
	return vfs.OS{}.SyncDir(c.DataDir)
}

// spdkLockFile is the file an SPDK backend of c's data directory holds
// flocked while its blobstore is loaded (spdk.Options.LockFile).
func spdkLockFile(c *config.Config) string { return filepath.Join(c.DataDir, "spdk.LOCK") }

// emptyDir removes everything in dir but keep, and syncs dir.
func emptyDir(dir, keep string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == keep {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return vfs.OS{}.SyncDir(dir)
}
