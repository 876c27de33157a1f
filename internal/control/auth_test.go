package control

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestEnsureCreds(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	c, err := EnsureCreds(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("creds dir: %v, %v; want mode 0700", fi.Mode(), err)
	}
	seen := map[string]bool{}
	for _, r := range Roles {
		path := filepath.Join(dir, string(r)+CredsFileSuffix)
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", path, fi.Mode(), err)
		}
		pub := c.Public(r)
		if !strings.HasPrefix(pub, "U") || seen[pub] {
			t.Errorf("role %s: public key %q (a user nkey, one per role)", r, pub)
		}
		seen[pub] = true
	}
	// Again: the same keys, nothing rewritten.
	c2, err := EnsureCreds(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range Roles {
		if c.Public(r) != c2.Public(r) {
			t.Errorf("role %s: key changed on the second EnsureCreds", r)
		}
	}
	if names, _ := os.ReadDir(dir); len(names) != len(Roles) {
		t.Errorf("creds dir holds %d files, want %d (no temporary files left)", len(names), len(Roles))
	}
}

// TestEnsureCredsRace: processes that create the credentials at once all
// end up with the same set.
func TestEnsureCredsRace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	var wg sync.WaitGroup
	got := make([]*Creds, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Go(func() { got[i], errs[i] = EnsureCreds(dir) })
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		for _, r := range Roles {
			if got[i].Public(r) != got[0].Public(r) {
				t.Fatalf("racer %d has another %s key", i, r)
			}
		}
	}
}

func TestLoadCredsRefusesWhatOthersCanRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	if _, err := EnsureCreds(dir); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "io"+CredsFileSuffix)
	if err := os.Chmod(seed, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadCreds(dir, RoleIO)
	if err == nil || !strings.Contains(err.Error(), "lets others read it") || !strings.Contains(err.Error(), "chmod 0600") {
		t.Errorf("LoadCreds with a 0644 seed: %v", err)
	}
	_ = os.Chmod(seed, 0o600)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureCreds(dir); err == nil || !strings.Contains(err.Error(), "chmod 0700") {
		t.Errorf("EnsureCreds on a 0755 directory: %v", err)
	}
	_ = os.Chmod(dir, 0o700)
	if err := os.WriteFile(seed, []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCreds(dir, RoleIO); err == nil || !strings.Contains(err.Error(), "not an nkey seed") {
		t.Errorf("LoadCreds with garbage: %v", err)
	}
}

func TestCredsErrorPermissionDenied(t *testing.T) {
	err := &CredsError{Path: "/var/lib/weir/creds/cli.nk", Err: fs.ErrPermission}
	if !strings.HasPrefix(err.Error(), "permission denied reading /var/lib/weir/creds/cli.nk: run as the service user") {
		t.Errorf("message: %s", err)
	}
	if !errors.Is(err, fs.ErrPermission) {
		t.Error("CredsError does not unwrap to its cause")
	}
}

func TestConnectWithoutCredentialsRefused(t *testing.T) {
	e := startServer(t)
	nc, err := Connect(e.URL(), "anonymous", nil)
	if err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was admitted")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("refusal: %v, want an authorization violation", err)
	}
	// A key the server does not know is refused too.
	other, err := EnsureCreds(filepath.Join(t.TempDir(), "creds"))
	if err != nil {
		t.Fatal(err)
	}
	opts, _ := other.Options(DefaultNamespace, RoleMetadata)
	if nc, err := Connect(e.URL(), "stranger", nil, opts...); err == nil {
		nc.Close()
		t.Fatal("a connection with an unknown nkey was admitted")
	}
}

// probe tries one publish or subscribe as a role and reports whether the
// server allowed it: an allowed publish reaches the admin's wildcard
// subscription, a refused one comes back as a permissions violation.
type probe struct {
	t     *testing.T
	s     *testServer
	admin *nats.Conn
	seen  chan string
}

func newProbe(t *testing.T, s *testServer) *probe {
	p := &probe{t: t, s: s, seen: make(chan string, 256)}
	p.admin = connectAdmin(t, s, nil)
	if _, err := p.admin.Subscribe(">", func(m *nats.Msg) { p.seen <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	if err := p.admin.Flush(); err != nil {
		t.Fatal(err)
	}
	return p
}

// conn connects as role of ns, collecting permissions violations.
func (p *probe) conn(ns string, r Role) (*nats.Conn, <-chan error) {
	opts, err := p.s.creds[ns].Options(ns, r)
	if err != nil {
		p.t.Fatal(err)
	}
	errs := make(chan error, 64)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	nc, err := nats.Connect(p.s.URL(), opts...)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(nc.Close)
	return nc, errs
}

func (p *probe) publish(ns string, r Role, subject string) bool {
	nc, errs := p.conn(ns, r)
	if err := nc.Publish(subject, []byte("probe")); err != nil {
		p.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		p.t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-p.seen:
			if got == subject {
				return true
			}
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) {
				return false
			}
		case <-deadline:
			p.t.Fatalf("publish %s as %s/%s: neither delivered nor refused", subject, ns, r)
		}
	}
}

func (p *probe) subscribe(ns string, r Role, subject string) bool {
	nc, errs := p.conn(ns, r)
	if _, err := nc.SubscribeSync(subject); err != nil {
		p.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		p.t.Fatal(err)
	}
	select {
	case err := <-errs:
		if errors.Is(err, nats.ErrPermissionViolation) {
			return false
		}
		p.t.Fatalf("subscribe %s as %s/%s: %v", subject, ns, r, err)
	case <-time.After(300 * time.Millisecond):
		// The server answers a refused subscription before the PONG of
		// the flush; this wait only lets the error callback run.
	}
	return true
}

// TestPermissions checks each role's permissions on a real server: what
// the role needs is allowed, the rest refused.
func TestPermissions(t *testing.T) {
	s := startServer(t)
	p := newProbe(t, s)
	ns := DefaultNamespace
	sj := SubjectsIn(ns)
	for _, tc := range []struct {
		r       Role
		subject string
		allowed bool
	}{
		{RoleMetadata, sj.Grant, true}, {RoleMetadata, sj.Revoke, true}, {RoleMetadata, sj.Delete, true},
		{RoleMetadata, sj.Resync, true}, {RoleMetadata, sj.Blobs, true},
		{RoleMetadata, sj.Session, false}, {RoleMetadata, sj.SetLive, false}, {RoleMetadata, "weir.io.other", false},
		{RoleIO, sj.Session, true}, {RoleIO, sj.SetLive, true},
		{RoleIO, sj.Grant, false}, {RoleIO, sj.Revoke, false}, {RoleIO, sj.Delete, false},
		{RoleIO, "_INBOX.weir.metadata.x", false},
		{RoleCLI, "$SRV.INFO", true}, {RoleCLI, "weir.io.ID.health", true}, {RoleCLI, "weir.metadata.ID.stats", true},
		{RoleCLI, sj.Grant, false}, {RoleCLI, sj.Delete, false}, {RoleCLI, sj.Session, false},
		{RoleCLI, "weir.io.ID.other", false},
		{RoleJournal, sj.Grant, false}, {RoleVerifier, sj.Delete, false},
	} {
		if got := p.publish(ns, tc.r, tc.subject); got != tc.allowed {
			t.Errorf("publish %s as %s: allowed = %v, want %v", tc.subject, tc.r, got, tc.allowed)
		}
	}
	// Another stack's credentials reach nothing of this one.
	for _, subj := range []string{sj.Grant, sj.Delete, sj.Session} {
		for _, r := range []Role{RoleMetadata, RoleIO} {
			if p.publish(otherNS, r, subj) {
				t.Errorf("publish %s as %s of %s: allowed", subj, r, otherNS)
			}
		}
	}
	for _, tc := range []struct {
		r       Role
		subject string
		allowed bool
	}{
		{RoleMetadata, sj.Session, true}, {RoleMetadata, sj.IO, false}, {RoleMetadata, sj.Grant, false},
		{RoleMetadata, InboxPrefix(ns, RoleIO) + ".>", false},
		{RoleIO, sj.IO, true}, {RoleIO, sj.Session, false}, {RoleIO, InboxPrefix(ns, RoleMetadata) + ".>", false},
		{RoleCLI, InboxPrefix(ns, RoleCLI) + ".>", true}, {RoleCLI, ">", false}, {RoleCLI, sj.IO, false},
		{RoleCLI, "$SRV.>", false},
	} {
		if got := p.subscribe(ns, tc.r, tc.subject); got != tc.allowed {
			t.Errorf("subscribe %s as %s: allowed = %v, want %v", tc.subject, tc.r, got, tc.allowed)
		}
	}
}

func TestServerConfig(t *testing.T) {
	c, err := EnsureCreds(filepath.Join(t.TempDir(), "creds"))
	if err != nil {
		t.Fatal(err)
	}
	conf := ServerConfig(c.Users("prod"))
	for _, want := range []string{
		"authorization {", "nkey: " + c.Public(RoleIO), `publish: { allow: ["prod.meta.session", "prod.meta.setlive"] }`,
		`subscribe: { allow: ["prod.io.*", "_INBOX.prod.io.>"`, "allow_responses: true",
		`publish: { deny: ">" }`, // journal and verifier publish nothing yet
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("server config lacks %q:\n%s", want, conf)
		}
	}
	for _, r := range Roles {
		seed, err := os.ReadFile(filepath.Join(c.Dir, string(r)+CredsFileSuffix))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(conf, strings.TrimSpace(string(seed))) {
			t.Errorf("server config contains the seed of %s", r)
		}
	}
}
