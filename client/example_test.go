package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/weir-storage/weir/client"
)

// Connect to the services that `weir up` started (the socket paths are
// printed by weir up; these are the defaults), write a file and read it back.
func Example() {
	ctx := context.Background()
	fsys, err := client.Dial(ctx, client.Options{
		MetadataSocket: "/var/lib/weir/run/metadata.sock",
		IOSocket:       "/var/lib/weir/run/io.sock",
	})
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
}
