package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"
)

// waitFor polls cond until it holds; the deadline is generous because it
// only bounds a hung test, it measures nothing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncBuffer is a log destination the test can read while loggers write.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger(t *testing.T, w *syncBuffer) hclog.Logger {
	opts := &hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug}
	if w != nil {
		opts.Output = w
	} else {
		opts.Output = hclog.DefaultOutput
		opts.Level = hclog.Warn
	}
	return hclog.New(opts)
}

// testServer is an embedded server whose users are two stacks (the
// default namespace and "stack-b.prod") and an admin that may do anything
// (for what no weir role may, such as a foreign micro service).
type testServer struct {
	*Embedded
	creds map[string]*Creds // by namespace
	admin nkeys.KeyPair
}

const otherNS = "stack-b.prod"

func startServer(t *testing.T) *testServer {
	t.Helper()
	return startServerAt(t, "127.0.0.1:-1")
}

func startServerAt(t *testing.T, listen string) *testServer {
	t.Helper()
	s := &testServer{creds: map[string]*Creds{}}
	var users []User
	for _, ns := range []string{DefaultNamespace, otherNS} {
		c, err := EnsureCreds(filepath.Join(t.TempDir(), "creds"))
		if err != nil {
			t.Fatal(err)
		}
		s.creds[ns] = c
		users = append(users, c.Users(ns)...)
	}
	var err error
	if s.admin, err = nkeys.CreateUser(); err != nil {
		t.Fatal(err)
	}
	pub, _ := s.admin.PublicKey()
	users = append(users, User{Role: "admin", Nkey: pub, Permissions: Permissions{Publish: []string{">"}, Subscribe: []string{">"}}})
	s.Embedded, err = StartEmbedded(EmbeddedOptions{Listen: listen, Users: users, Logger: testLogger(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// connect connects as role of the default namespace.
func connect(t *testing.T, s *testServer, r Role) *nats.Conn {
	t.Helper()
	return connectIn(t, s, DefaultNamespace, r)
}

func connectIn(t *testing.T, s *testServer, ns string, r Role) *nats.Conn {
	t.Helper()
	opts, err := s.creds[ns].Options(ns, r)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Connect(s.URL(), string(r), testLogger(t, nil), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// connectAdmin connects as the admin user.
func (s *testServer) adminPub() string {
	pub, _ := s.admin.PublicKey()
	return pub
}

func connectAdmin(t *testing.T, s *testServer, log hclog.Logger) *nats.Conn {
	t.Helper()
	pub, _ := s.admin.PublicKey()
	if log == nil {
		log = testLogger(t, nil)
	}
	nc, err := Connect(s.URL(), "admin", log, nats.Nkey(pub, s.admin.Sign))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func register(t *testing.T, nc *nats.Conn, name string, health func() error, stats func() any) micro.Service {
	t.Helper()
	svc, err := Register(nc, ServiceInfo{Name: name, Version: "1.2.3", Description: "test " + name}, health, stats)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return svc
}

// status is Status in the default namespace.
func status(t *testing.T, nc *nats.Conn) []ServiceStatus {
	t.Helper()
	return statusIn(t, nc, "")
}

func statusIn(t *testing.T, nc *nats.Conn, namespace string) []ServiceStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := Status(ctx, nc, namespace)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStatusFindsServices(t *testing.T) {
	e := startServer(t)
	// Each service on its own connection, as in separate processes.
	type ioStats struct {
		Sessions  int    `json:"sessions"`
		BytesRead uint64 `json:"bytes_read"`
		Backend   string `json:"backend"`
	}
	register(t, connect(t, e, RoleMetadata), "weir-metadata", nil, func() any {
		return map[string]any{"ops": 42, "wal": map[string]any{"records": 7}}
	})
	register(t, connect(t, e, RoleIO), "weir-io", func() error { return nil }, func() any {
		return ioStats{Sessions: 3, BytesRead: 1 << 60, Backend: "file"}
	})
	// A micro service that is not weir's is not listed.
	other, err := micro.AddService(connectAdmin(t, e, nil), micro.Config{Name: "other", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Stop()

	cli := connect(t, e, RoleCLI)
	st := status(t, cli)
	if len(st) != 2 {
		t.Fatalf("Status found %d services, want 2: %+v", len(st), st)
	}
	if st[0].Name != "weir-io" || st[1].Name != "weir-metadata" {
		t.Fatalf("Status order: %s, %s", st[0].Name, st[1].Name)
	}
	for _, s := range st {
		if !s.Healthy || s.Error != "" || s.Version != "1.2.3" || s.ID == "" {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	if got := st[0].Stats; got["sessions"] != json.Number("3") || got["bytes_read"] != json.Number("1152921504606846976") || got["backend"] != "file" {
		t.Errorf("weir-io stats = %v", got)
	}
	if got := st[1].Stats; got["ops"] != json.Number("42") {
		t.Errorf("weir-metadata stats = %v", got)
	}

	var table bytes.Buffer
	if err := FormatStatus(&table, st, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SERVICE", "weir-io", st[0].ID, "backend=file bytes_read=1152921504606846976 sessions=3", "weir-metadata", "ops=42 wal.records=7", " ok "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var js bytes.Buffer
	if err := FormatStatus(&js, st, true); err != nil {
		t.Fatal(err)
	}
	var back []ServiceStatus
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back) != 2 || back[1].Name != "weir-metadata" || !back[1].Healthy {
		t.Errorf("JSON output %s: %v", js.String(), err)
	}
}

func TestStatusUnhealthy(t *testing.T) {
	e := startServer(t)
	nc := connect(t, e, RoleIO)
	register(t, nc, "weir-io", func() error { return errors.New("backend: disk gone") }, nil)
	st := status(t, connect(t, e, RoleCLI))
	if len(st) != 1 || st[0].Healthy || !strings.Contains(st[0].Error, "disk gone") {
		t.Fatalf("Status = %+v, want one unhealthy weir-io", st)
	}
	var table bytes.Buffer
	_ = FormatStatus(&table, st, false)
	if !strings.Contains(table.String(), "error: backend: disk gone") {
		t.Errorf("table:\n%s", table.String())
	}

	// The health endpoint itself speaks the documented JSON.
	m, err := connect(t, e, RoleCLI).Request("weir.io."+st[0].ID+".health", nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(m.Data); got != `{"status":"error","error":"backend: disk gone"}` {
		t.Errorf("health reply = %s", got)
	}
}

// TestStatusInstances: two instances of one service each answer for
// themselves.
func TestStatusInstances(t *testing.T) {
	e := startServer(t)
	for i := range 2 {
		register(t, connect(t, e, RoleVerifier), "weir-verifier", nil, func() any { return map[string]int{"instance": i} })
	}
	st := status(t, connect(t, e, RoleCLI))
	if len(st) != 2 || st[0].ID == st[1].ID {
		t.Fatalf("Status = %+v, want two instances", st)
	}
	if a, b := st[0].Stats["instance"], st[1].Stats["instance"]; a == b {
		t.Errorf("both instances report instance=%v", a)
	}
}

// TestStatusNamespaces: two stacks on one server, each with its own NATS
// namespace, are listed apart, and each service's endpoints live under its
// namespace.
func TestStatusNamespaces(t *testing.T) {
	e := startServer(t)
	for _, ns := range []string{"weir", otherNS} {
		for _, r := range []Role{RoleMetadata, RoleIO} {
			name := r.ServiceName()
			svc, err := Register(connectIn(t, e, ns, r), ServiceInfo{Name: name, Namespace: ns}, nil,
				func() any { return map[string]string{"namespace": ns} })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = svc.Stop() })
		}
	}
	cli := connectAdmin(t, e, nil) // sees both stacks
	for _, tc := range []struct{ ask, want string }{{"", "weir"}, {"weir", "weir"}, {otherNS, otherNS}} {
		st := statusIn(t, cli, tc.ask)
		if len(st) != 2 {
			t.Fatalf("Status(%q) found %d services, want 2: %+v", tc.ask, len(st), st)
		}
		for _, s := range st {
			if !s.Healthy || s.Stats["namespace"] != tc.want {
				t.Errorf("Status(%q): %s is %+v, want a healthy service of namespace %q", tc.ask, s.Name, s, tc.want)
			}
		}
	}
	if st := statusIn(t, cli, "other"); len(st) != 0 {
		t.Errorf("Status(other) = %+v, want nothing", st)
	}

	st := statusIn(t, cli, "stack-b.prod")
	m, err := cli.Request("stack-b.prod.io."+st[0].ID+".health", nil, 10*time.Second)
	if err != nil || string(m.Data) != `{"status":"ok"}` {
		t.Fatalf("health under the namespace: %v, %v", m, err)
	}
}

// TestStatusExpected: an expected service that does not answer is listed
// as missing, and one that hangs after discovery as not answering; both
// are unhealthy.
func TestStatusExpected(t *testing.T) {
	e := startServer(t)
	register(t, connect(t, e, RoleMetadata), "weir-metadata", nil, nil)
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	register(t, connect(t, e, RoleVerifier), "weir-verifier", func() error { <-hang; return nil }, nil)

	cli := connect(t, e, RoleCLI)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := Status(ctx, cli, "", "weir-metadata", "weir-io", "weir-verifier")
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 3 || st[0].Name != "weir-io" || st[1].Name != "weir-metadata" || st[2].Name != "weir-verifier" {
		t.Fatalf("Status = %+v, want weir-io, weir-metadata, weir-verifier", st)
	}
	if io := st[0]; io.Healthy || io.ID != "" || io.Error != "no reply within 2s" {
		t.Errorf("missing weir-io: %+v", io)
	}
	if !st[1].Healthy {
		t.Errorf("weir-metadata: %+v", st[1])
	}
	if v := st[2]; v.Healthy || v.ID == "" || !strings.HasPrefix(v.Error, "no reply within 2s") {
		t.Errorf("hung weir-verifier: %+v", v)
	}
	if bad := Unhealthy(st); len(bad) != 2 || bad[0].Name != "weir-io" || bad[1].Name != "weir-verifier" {
		t.Errorf("Unhealthy = %+v", bad)
	}

	var table bytes.Buffer
	_ = FormatStatus(&table, st, false)
	if f := strings.Fields(strings.Split(table.String(), "\n")[1]); strings.Join(f, " ") != "weir-io - - error: no reply within 2s" {
		t.Errorf("table line of the missing service: %q\n%s", f, table.String())
	}
	var js bytes.Buffer
	_ = FormatStatus(&js, st, true)
	var back []ServiceStatus
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back) != 3 || back[0].Healthy || back[0].Error != "no reply within 2s" {
		t.Errorf("JSON %s: %v", js.String(), err)
	}
}

// TestStatusExpectedNoServer: with no micro service on the server at all,
// expected services are reported missing at once.
func TestStatusExpectedNoServer(t *testing.T) {
	e := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := Status(ctx, connect(t, e, RoleCLI), "", "weir-io")
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Healthy || !strings.Contains(st[0].Error, "no micro service") {
		t.Errorf("Status = %+v", st)
	}
}

func TestStatusNoServices(t *testing.T) {
	e := startServer(t)
	var out bytes.Buffer
	st := status(t, connect(t, e, RoleCLI))
	if len(st) != 0 {
		t.Fatalf("Status = %+v", st)
	}
	_ = FormatStatus(&out, st, false)
	_ = FormatStatus(&out, st, true)
	if out.String() != "no weir services found\n[]\n" {
		t.Errorf("output %q", out.String())
	}
}

func TestRegisterRefusesBadNames(t *testing.T) {
	e := startServer(t)
	nc := connectAdmin(t, e, nil)
	for _, name := range []string{"metadata", "weir-", "weir-a.b", "weir-*"} {
		if svc, err := Register(nc, ServiceInfo{Name: name}, nil, nil); err == nil {
			_ = svc.Stop()
			t.Errorf("Register(%q) succeeded", name)
		}
	}
	for _, ns := range []string{"a b", "a.*", ">", "a..b", ".a", "$SRV"} {
		if svc, err := Register(nc, ServiceInfo{Name: "weir-io", Namespace: ns}, nil, nil); err == nil {
			_ = svc.Stop()
			t.Errorf("Register in namespace %q succeeded", ns)
		}
	}
}

func TestStartEmbeddedErrors(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", "10.1.2.3:4222", "127.0.0.1", "127.0.0.1:99999"} {
		if e, err := StartEmbedded(EmbeddedOptions{Listen: listen, UnsafeNoAuth: true}); err == nil {
			e.Shutdown()
			t.Errorf("StartEmbedded(%q) succeeded", listen)
		}
	}
	// A port in use is an error, not a hang.
	e := startServer(t)
	u, _ := url.Parse(e.URL())
	if e2, err := StartEmbedded(EmbeddedOptions{Listen: u.Host, UnsafeNoAuth: true}); err == nil {
		e2.Shutdown()
		t.Errorf("second server on %s started", u.Host)
	}
}

// TestConnectReconnects: a connection survives the server going away and
// coming back on the same port, and logs both events.
func TestConnectReconnects(t *testing.T) {
	e := startServerAt(t, "127.0.0.1:0")
	u, _ := url.Parse(e.URL())
	var logs syncBuffer
	nc := connectAdmin(t, e, testLogger(t, &logs))
	sub, err := nc.Subscribe("weir.test.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	e.Shutdown()
	waitFor(t, "disconnect", func() bool { return !nc.IsConnected() })
	if nc.IsClosed() {
		t.Fatal("connection closed instead of reconnecting")
	}

	users := append(e.creds[DefaultNamespace].Users(DefaultNamespace), User{Nkey: e.adminPub(), Permissions: Permissions{Publish: []string{">"}, Subscribe: []string{">"}}})
	e2, err := StartEmbedded(EmbeddedOptions{Listen: u.Host, Users: users, Logger: testLogger(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Shutdown()
	waitFor(t, "reconnect", nc.IsConnected)

	// The subscription came back with the connection.
	m, err := nc.Request("weir.test.echo", []byte("ping"), 10*time.Second)
	if err != nil || string(m.Data) != "ping" {
		t.Fatalf("request after reconnect = %v, %v", m, err)
	}
	waitFor(t, "reconnect logged", func() bool { return strings.Contains(logs.String(), "nats reconnected") })
	if !strings.Contains(logs.String(), "nats disconnected") {
		t.Errorf("no disconnect in the log:\n%s", logs.String())
	}
}

func TestConnectFailsFast(t *testing.T) {
	e := startServer(t)
	u, _ := url.Parse(e.URL())
	e.Shutdown() // nothing listens there now
	if nc, err := Connect("nats://"+u.Host, "nobody", nil); err == nil {
		nc.Close()
		t.Fatal("Connect to a dead address succeeded")
	}
}

func TestReconnectDelay(t *testing.T) {
	for a := range 40 {
		d := reconnectDelay(a)
		if d < reconnectMin*8/10 || d > reconnectMax*12/10 {
			t.Errorf("reconnectDelay(%d) = %v", a, d)
		}
	}
}

func TestServerLogger(t *testing.T) {
	var logs syncBuffer
	l := &serverLogger{log: testLogger(t, &logs), fatal: make(chan string, 1)}
	l.Noticef("n %d", 1)
	l.Warnf("w")
	l.Errorf("e")
	l.Debugf("d")
	l.Tracef("hidden at debug")
	l.Fatalf("f %s", "x")
	l.Fatalf("second fatal does not block")
	out := logs.String()
	for _, want := range []string{"[DEBUG] TestServerLogger: n 1", "[WARN]  TestServerLogger: w", "[ERROR] TestServerLogger: e", "[DEBUG] TestServerLogger: d", "[ERROR] TestServerLogger: f x: fatal=true"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hidden") {
		t.Errorf("trace logged at debug level:\n%s", out)
	}
	if got := <-l.fatal; got != "f x" {
		t.Errorf("fatal = %q", got)
	}
}
