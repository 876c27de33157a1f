package stack_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/weir-storage/weir/internal/config"
	"github.com/weir-storage/weir/internal/control"
	"github.com/weir-storage/weir/stack"
	"github.com/weir-storage/weir/stack/stacktest"
)

// stackConfig is the configuration of a stack in NATS namespace namespace
// with the mem backend.
func stackConfig(t *testing.T, namespace string) *config.Config {
	t.Helper()
	c := stacktest.Config(t, "")
	c.NATS.Namespace, c.IO.Backend = namespace, "mem"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// startStack runs a whole stack of c in this process on the NATS server at
// url.
func startStack(t *testing.T, c *config.Config, url string) *stack.Stack {
	t.Helper()
	namespace := c.NATS.Namespace
	c.NATS.URL = url
	st, err := stack.Start(c, hclog.New(&hclog.LoggerOptions{Name: namespace, Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stack.ShutdownTimeout)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("shutdown of stack %s: %v", namespace, err)
		}
	})
	return st
}

// TestStacksShareNATS: two stacks on one NATS server, each in its own
// namespace, serve clients at the same time, and status in each namespace
// lists that stack's services only. With one shared namespace a stack's
// session checks would reach the other stack's metadata service, which
// knows nothing of the session: every dial would fail with EPERM.
func TestStacksShareNATS(t *testing.T) {
	configs := map[string]*config.Config{}
	var users []control.User
	for _, ns := range []string{"weir", "second.stack"} {
		configs[ns] = stackConfig(t, ns)
		u, err := stack.Users(configs[ns])
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, u...)
	}
	srv, err := control.StartEmbedded(control.EmbeddedOptions{Listen: config.DefaultNATSListen, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	stacks := map[string]*stack.Stack{}
	for ns, c := range configs {
		stacks[ns] = startStack(t, c, srv.URL())
	}

	var wg sync.WaitGroup
	for ns, st := range stacks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := range 20 {
				fsys, err := st.Dial(ctx)
				if err != nil {
					t.Errorf("stack %s: dial %d: %v", ns, i, err)
					return
				}
				name, data := fmt.Sprintf("f%d", i), []byte(ns+" wrote this")
				if err := fsys.WriteFile(name, data, 0o644); err != nil {
					t.Errorf("stack %s: write %s: %v", ns, name, err)
				} else if got, err := fsys.ReadFile(name); err != nil || string(got) != string(data) {
					t.Errorf("stack %s: read %s back: %q, %v", ns, name, got, err)
				}
				fsys.Close()
			}
		})
	}
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := map[string]string{} // instance id -> namespace
	for ns := range stacks {
		nc, err := stacks[ns].Connect(control.RoleCLI, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		st, err := control.Status(ctx, nc, ns, stack.ServiceNames(nil)...)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range st {
			names = append(names, s.Name)
			if !s.Healthy {
				t.Errorf("stack %s: %s unhealthy: %s", ns, s.Name, s.Error)
			}
			if other, dup := ids[s.ID]; dup {
				t.Errorf("instance %s listed for %s and %s", s.ID, other, ns)
			}
			ids[s.ID] = ns
		}
		if strings.Join(names, ",") != "weir-io,weir-journal,weir-metadata" {
			t.Errorf("status of stack %s lists %v, want its weir-io, weir-journal and weir-metadata", ns, names)
		}
	}
}
