package control

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/weir-storage/weir/internal/vfs"
)

// Authentication and authorisation of the control plane.
//
// Every NATS connection of a stack authenticates with an nkey: an Ed25519
// key pair per role (metadata, io, journal, verifier, cli). The server
// knows only the public keys and proves each connection by a signed
// nonce, so the seed never travels, and the server configuration, even
// that of an external cluster, holds no secret. (User/password would put
// the password on the wire to the server and in its configuration file.)
// nkeys need nothing beyond the NATS libraries weir already uses: no
// account server, no JWTs.
//
// Each role may publish and subscribe only what it needs (Permissions);
// replies to requests it received are allowed through the server's
// allow_responses, so no role can publish to another's inbox. Each role
// has its own inbox prefix (_INBOX.<namespace>.<role>), so none can read
// another's replies either. Clients have no credentials at all: the
// server refuses a connection without one.
//
// On disk: CredsDir holds one file per role, "<role>.nk", with the seed
// (the "SU..." string of nkeys) and a newline, mode 0600, in a directory
// of mode 0700. A seed file or directory that others can read is refused,
// as ssh refuses a private key others can read.

// Role is who a connection speaks for.
type Role string

// The roles of a stack.
const (
	RoleMetadata Role = "metadata"
	RoleIO       Role = "io"
	RoleJournal  Role = "journal"
	RoleVerifier Role = "verifier"
	RoleCLI      Role = "cli" // weir status and the other CLI commands
)

// Roles are every role, in a fixed order.
var Roles = []Role{RoleMetadata, RoleIO, RoleJournal, RoleVerifier, RoleCLI}

// ServiceName is the micro service name of a service role ("weir-io").
func (r Role) ServiceName() string { return ServicePrefix + string(r) }

// InboxPrefix is the prefix of the role's reply subjects in namespace.
func InboxPrefix(namespace string, r Role) string {
	return "_INBOX." + namespace + "." + string(r)
}

// Permissions are the subjects a role may publish to and subscribe to.
// Responses allows replies to requests the role received.
type Permissions struct {
	Publish   []string
	Subscribe []string
	Responses bool
}

// PermissionsOf returns what role r may do in namespace.
func PermissionsOf(namespace string, r Role) Permissions {
	s := SubjectsIn(namespace)
	// Every service answers $SRV.PING/INFO/STATS for itself (micro) and
	// serves health and stats in its own group.
	service := func(short string) []string {
		name := ServicePrefix + short
		return []string{
			"$SRV.*", "$SRV.*." + name, "$SRV.*." + name + ".*",
			namespace + "." + short + ".*." + HealthEndpoint,
			namespace + "." + short + ".*." + StatsEndpoint,
		}
	}
	inbox := InboxPrefix(namespace, r) + ".>"
	switch r {
	case RoleMetadata:
		return Permissions{
			Publish: []string{s.Grant, s.Revoke, s.Live, s.Delete, s.Resync, s.Alloc, s.DirGen, s.Blobs},
			Subscribe: append([]string{s.Session, s.SetLive, s.SetLiveBatch, inbox,
				namespace + ".metadata.*." + LeasesEndpoint, namespace + ".metadata.*." + LeaseRevokeEndpoint}, service("metadata")...),
			Responses: true,
		}
	case RoleIO:
		return Permissions{
			Publish:   []string{s.Session, s.SetLive},
			Subscribe: append([]string{s.IO, inbox, namespace + ".io.*." + DropCacheEndpoint}, service("io")...),
			Responses: true,
		}
	case RoleJournal:
		return Permissions{
			Publish:   []string{s.SetLiveBatch},
			Subscribe: append([]string{inbox}, service("journal")...),
			Responses: true,
		}
	case RoleVerifier:
		return Permissions{
			Subscribe: append([]string{inbox}, service(string(r))...),
			Responses: true,
		}
	case RoleCLI:
		return Permissions{
			Publish: []string{"$SRV.PING", "$SRV.INFO", "$SRV.STATS",
				namespace + ".*.*." + HealthEndpoint, namespace + ".*.*." + StatsEndpoint,
				namespace + ".io.*." + DropCacheEndpoint,
				namespace + ".metadata.*." + LeasesEndpoint, namespace + ".metadata.*." + LeaseRevokeEndpoint},
			Subscribe: []string{inbox},
		}
	}
	return Permissions{}
}

// User is one NATS user of a stack: an nkey and what it may do.
type User struct {
	Role        Role
	Namespace   string
	Nkey        string // public key, "U..."
	Permissions Permissions
}

// CredsFileSuffix ends every seed file's name.
const CredsFileSuffix = ".nk"

// Creds are a stack's key pairs, by role, as loaded from a directory.
type Creds struct {
	Dir  string
	keys map[Role]nkeys.KeyPair
}

// CredsError is a failure to read the credentials.
type CredsError struct {
	Path string
	Err  error
}

func (e *CredsError) Error() string {
	if errors.Is(e.Err, fs.ErrPermission) {
		owner := ""
		if fi, err := os.Stat(filepath.Dir(e.Path)); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				owner = fmt.Sprintf(" (%s belongs to uid %d)", filepath.Dir(e.Path), st.Uid)
			}
		}
		return fmt.Sprintf("permission denied reading %s: run as the service user%s", e.Path, owner)
	}
	return fmt.Sprintf("credentials %s: %v", e.Path, e.Err)
}

func (e *CredsError) Unwrap() error { return e.Err }

// EnsureCreds loads the credentials in dir, first creating the directory
// (0700) and a key pair for every role that has none (0600). Creation is
// atomic per file (written, synced, then linked into place), so two
// processes racing to create them end up with the same set.
func EnsureCreds(dir string) (*Creds, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, &CredsError{Path: dir, Err: err}
	}
	if err := checkPrivate(dir, true); err != nil {
		return nil, err
	}
	made := false
	for _, r := range Roles {
		path := filepath.Join(dir, string(r)+CredsFileSuffix)
		if _, err := os.Lstat(path); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, &CredsError{Path: path, Err: err}
		}
		if err := createSeed(path); err != nil {
			return nil, err
		}
		made = true
	}
	if made {
		if err := (vfs.OS{}).SyncDir(dir); err != nil {
			return nil, &CredsError{Path: dir, Err: err}
		}
	}
	return LoadCreds(dir, Roles...)
}

func createSeed(path string) error {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return &CredsError{Path: path, Err: err}
	}
	seed, err := kp.Seed()
	if err != nil {
		return &CredsError{Path: path, Err: err}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".new-*")
	if err != nil {
		return &CredsError{Path: path, Err: err}
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(append(seed, '\n'))
	if err == nil {
		err = tmp.Chmod(0o600)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// link fails if another process made the file first: keep theirs.
		if err = os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
			err = nil
		}
	}
	if err != nil {
		return &CredsError{Path: path, Err: err}
	}
	return nil
}

// checkPrivate refuses a directory (dir) or file that others may read.
func checkPrivate(path string, dir bool) error {
	fi, err := os.Stat(path)
	if err != nil {
		return &CredsError{Path: path, Err: err}
	}
	if dir != fi.IsDir() {
		return &CredsError{Path: path, Err: errors.New("not a directory")}
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		want := "0600"
		if dir {
			want = "0700"
		}
		return &CredsError{Path: path, Err: fmt.Errorf("mode %#o lets others read it; credentials must be private (chmod %s %s)", m, want, path)}
	}
	return nil
}

// LoadCreds reads the key pairs of roles from dir.
func LoadCreds(dir string, roles ...Role) (*Creds, error) {
	if err := checkPrivate(dir, true); err != nil {
		return nil, err
	}
	c := &Creds{Dir: dir, keys: map[Role]nkeys.KeyPair{}}
	for _, r := range roles {
		path := filepath.Join(dir, string(r)+CredsFileSuffix)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, &CredsError{Path: path, Err: err}
		}
		if err := checkPrivate(path, false); err != nil {
			return nil, err
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			return nil, &CredsError{Path: path, Err: fmt.Errorf("not an nkey seed: %w", err)}
		}
		if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicUserKey(pub) {
			return nil, &CredsError{Path: path, Err: errors.New("not a user nkey")}
		}
		c.keys[r] = kp
	}
	return c, nil
}

// Public returns the public key of role r ("" if not loaded).
func (c *Creds) Public(r Role) string {
	kp := c.keys[r]
	if kp == nil {
		return ""
	}
	pub, _ := kp.PublicKey()
	return pub
}

// Has reports whether the key pair of r is loaded.
func (c *Creds) Has(r Role) bool { return c.keys[r] != nil }

// Users returns the stack's NATS users in namespace: every loaded role
// with its permissions.
func (c *Creds) Users(namespace string) []User {
	var us []User
	for _, r := range Roles {
		if c.keys[r] != nil {
			us = append(us, User{Role: r, Namespace: namespace, Nkey: c.Public(r), Permissions: PermissionsOf(namespace, r)})
		}
	}
	return us
}

// Options returns the connection options that authenticate as role r in
// namespace: the nkey (the server's nonce is signed with the seed) and the
// role's inbox prefix.
func (c *Creds) Options(namespace string, r Role) ([]nats.Option, error) {
	kp := c.keys[r]
	if kp == nil {
		return nil, fmt.Errorf("control: no credentials for role %q loaded from %s", r, c.Dir)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return []nats.Option{
		nats.Nkey(pub, kp.Sign),
		nats.CustomInboxPrefix(InboxPrefix(namespace, r)),
	}, nil
}

// ServerConfig is the authorization block of a nats-server configuration
// file that admits users (of one stack or several) with their permissions:
// what an external server needs for weir (README: external NATS).
func ServerConfig(users []User) string {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	for _, u := range users {
		fmt.Fprintf(&b, "    # weir %s, namespace %s\n", u.Role, u.Namespace)
		fmt.Fprintf(&b, "    {\n      nkey: %s\n      permissions: {\n", u.Nkey)
		list := func(name string, subjects []string) {
			if len(subjects) == 0 {
				fmt.Fprintf(&b, "        %s: { deny: \">\" }\n", name)
				return
			}
			q := make([]string, len(subjects))
			for i, s := range subjects {
				q[i] = fmt.Sprintf("%q", s)
			}
			fmt.Fprintf(&b, "        %s: { allow: [%s] }\n", name, strings.Join(q, ", "))
		}
		list("publish", u.Permissions.Publish)
		list("subscribe", u.Permissions.Subscribe)
		if u.Permissions.Responses {
			b.WriteString("        allow_responses: true\n")
		}
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

// RoleOf returns the role whose name is s.
func RoleOf(s string) (Role, bool) {
	r := Role(s)
	return r, slices.Contains(Roles, r)
}
