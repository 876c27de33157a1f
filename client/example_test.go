package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/client"
	"github.com/weir-storage/weir/stack"
)

// Connect to the services that `weir up` started, write a file and read it
// back. With empty socket paths Dial looks in $WEIR_RUN_DIR, or in
// /var/lib/weir/run where weir up puts them by default; weir up prints the
// paths, which can also be given in Options. (When go test runs this
// example, TestMain has started the services and set WEIR_RUN_DIR.)
func Example() {
	ctx := context.Background()
	fsys, err := client.Dial(ctx, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer fsys.Close()

	if err := fsys.MkdirAll("reports/2026", 0o755); err != nil {
		log.Fatal(err)
	}
	f, err := fsys.OpenFile("reports/2026/q4.txt", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := f.Write([]byte("revenue: up\n")); err != nil {
		log.Fatal(err)
	}
	if err := f.Sync(); err != nil { // durable before Sync returns
		log.Fatal(err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
	data, err := fsys.ReadFile("reports/2026/q4.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(data))
	// Output: revenue: up
}

// exampleServices starts the services in this process on a temporary data
// directory, as weir up would, and points WEIR_RUN_DIR at their sockets,
// so that Example runs as written.
func exampleServices() (stop func(), err error) {
	dir, err := os.MkdirTemp("", "weir-example-")
	if err != nil {
		return nil, err
	}
	cfg, err := stack.LocalConfig(filepath.Join(dir, "data"), filepath.Join(dir, "run"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	st, err := stack.Start(cfg, hclog.NewNullLogger())
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	os.Setenv(client.RunDirEnv, cfg.RunDir)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "stop the services for Example:", err)
		}
		os.Unsetenv(client.RunDirEnv)
		os.RemoveAll(dir)
	}, nil
}
