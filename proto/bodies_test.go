package proto

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// codec is one body's encoder and decoder, for the round-trip test and the
// fuzzer: decode(encode(v)) must be v, and decode must never panic.
type codec struct {
	name   string
	sample any
	encode func(v any) []byte
	decode func(b []byte) (any, error)
	// exact: the body is a response, decoded with no bytes to spare, so a
	// longer input must fail; requests leave response space after them.
	exact bool
}

func codecs() []codec {
	attr := Attr{Ino: 7, Mode: syscall.S_IFREG | 0o644, UID: 1000, GID: 100, Nlink: 1, Size: 12345,
		Atime: 1, Mtime: -2, Ctime: 1 << 62}
	tok := [TokenSize]byte{1, 2, 3, 31: 0xff}
	return []codec{
		{"attr", attr,
			func(v any) []byte { a := v.(Attr); return AppendAttr(nil, &a) },
			func(b []byte) (any, error) { return DecodeAttr(b) }, true},
		{"hello-req", HelloReq{MinVersion: 1, MaxVersion: 3, Features: FeatureReopen},
			func(v any) []byte { r := v.(HelloReq); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeHelloReq(b) }, false},
		{"hello-resp", HelloResp{Version: 1, Features: FeatureReopen, Session: MakeID(3, 9), Token: tok},
			func(v any) []byte { r := v.(HelloResp); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeHelloResp(b) }, true},
		{"path", PathReq{Path: "a/b/../c"},
			func(v any) []byte { r := v.(PathReq); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodePathReq(b) }, false},
		{"mode-path", ModePathReq{Mode: 0o4755, Path: "/x"},
			func(v any) []byte { r := v.(ModePathReq); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeModePathReq(b) }, false},
		{"rename", RenameReq{NewDir: 44, Old: "old", New: "new/name"},
			func(v any) []byte { r := v.(RenameReq); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeRenameReq(b) }, false},
		{"chown", OwnerReq{UID: -1, GID: 1 << 32, Path: "f"},
			func(v any) []byte { r := v.(OwnerReq); return r.Append(nil, true) },
			func(b []byte) (any, error) { return DecodeOwnerReq(b, true) }, false},
		{"fchown", OwnerReq{UID: 5, GID: -1},
			func(v any) []byte { r := v.(OwnerReq); return r.Append(nil, false) },
			func(b []byte) (any, error) { return DecodeOwnerReq(b, false) }, false},
		{"chtimes", TimesReq{Atime: TimeOmit, Mtime: 99, Path: "t"},
			func(v any) []byte { r := v.(TimesReq); return r.Append(nil, true) },
			func(b []byte) (any, error) { return DecodeTimesReq(b, true) }, false},
		{"fchtimes", TimesReq{Atime: 1, Mtime: TimeOmit},
			func(v any) []byte { r := v.(TimesReq); return r.Append(nil, false) },
			func(b []byte) (any, error) { return DecodeTimesReq(b, false) }, false},
		{"readdir-req", ReadDirReq{Path: "d", After: "m"},
			func(v any) []byte { r := v.(ReadDirReq); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeReadDirReq(b) }, false},
		{"dirents", []Dirent{{Ino: 2, Mode: syscall.S_IFDIR, Name: "a"}, {Ino: 3, Mode: syscall.S_IFREG, Name: strings.Repeat("z", MaxName)}},
			func(v any) []byte { b, _ := AppendDirents(nil, v.([]Dirent), 1<<20); return b },
			func(b []byte) (any, error) { return DecodeDirents(b) }, true},
		{"open-resp", OpenResp{Handle: MakeID(1, 2), Attr: attr, Created: true},
			func(v any) []byte { r := v.(OpenResp); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeOpenResp(b, 0) }, true},
		{"open-resp-ticket", OpenResp{Handle: 9, Attr: attr, Granted: true, HasTicket: true, Ticket: Ticket{4: 4}},
			func(v any) []byte { r := v.(OpenResp); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeOpenResp(b, FeatureReopen) }, true},
		{"open-resp-leases", OpenResp{Handle: 9, Attr: attr, Granted: true, HasTicket: true, Ticket: Ticket{4: 4}, HasDataHandle: true, DataHandle: 5},
			func(v any) []byte { r := v.(OpenResp); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeOpenResp(b, FeatureReopen|FeatureLeases) }, true},
		{"open-resp-cap", OpenResp{Handle: 9, Attr: attr, HasTicket: true, Ticket: Ticket{4: 4}, HasDataHandle: true, DataHandle: 9, CapRoom: true, HasCap: true, Cap: [CapSize]byte{0: 7, CapSize - 1: 8}},
			func(v any) []byte { r := v.(OpenResp); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeOpenResp(b, FeatureReopen|FeatureLeases|FeatureOpenCap) }, true},
		{"open-resp-no-cap", OpenResp{Handle: 9, Attr: attr, Granted: true, HasDataHandle: true, DataHandle: 5, CapRoom: true},
			func(v any) []byte { r := v.(OpenResp); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeOpenResp(b, FeatureLeases|FeatureOpenCap) }, true},
		{"ticket", Ticket{0: 1, 31: 2},
			func(v any) []byte { t := v.(Ticket); return t[:] },
			func(b []byte) (any, error) { return DecodeTicket(b) }, false},
		{"attach", AttachReq{Version: 1, Session: MakeID(2, 1), Token: tok},
			func(v any) []byte { r := v.(AttachReq); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeAttachReq(b) }, false},
		{"getattr", GetAttrResp{Size: 1 << 40, Mtime: 5, Changed: true},
			func(v any) []byte { r := v.(GetAttrResp); return r.Append(nil) },
			func(b []byte) (any, error) { return DecodeGetAttrResp(b) }, true},
	}
}

func TestBodiesRoundTrip(t *testing.T) {
	for _, c := range codecs() {
		b := c.encode(c.sample)
		got, err := c.decode(b)
		if err != nil || !reflect.DeepEqual(got, c.sample) {
			t.Errorf("%s: decode(encode(%+v)) = %+v, %v", c.name, c.sample, got, err)
		}
		// Every cut is a short body: EINVAL, never a panic.
		for n := range len(b) {
			if _, err := c.decode(b[:n]); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("%s cut to %d of %d bytes: %v, want EINVAL", c.name, n, len(b), err)
			}
		}
		_, err = c.decode(append(bytes.Clone(b), 0))
		if c.exact && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s with a trailing byte: %v, want EINVAL (a response is exactly its fields)", c.name, err)
		}
		if !c.exact && err != nil {
			t.Errorf("%s with a trailing byte: %v, want success (response space)", c.name, err)
		}
	}
}

// TestResponsesValidated: decoders of responses refuse values a client
// must not act on, whatever their encoding.
func TestResponsesValidated(t *testing.T) {
	good := Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 2}
	for name, a := range map[string]Attr{
		"symlink mode":  {Ino: 1, Mode: syscall.S_IFLNK | 0o755}, // (a link's is always 0777)
		"fifo mode":     {Ino: 1, Mode: syscall.S_IFIFO | 0o644},
		"unknown bits":  {Ino: 1, Mode: syscall.S_IFREG | 0o10000},
		"negative size": {Ino: 1, Mode: syscall.S_IFREG, Size: -1},
	} {
		if _, err := DecodeAttr(AppendAttr(nil, &a)); err == nil {
			t.Errorf("DecodeAttr accepted %s", name)
		}
	}
	if _, err := DecodeAttr(AppendAttr(nil, &good)); err != nil {
		t.Errorf("DecodeAttr(good) = %v", err)
	}
	if _, err := DecodeOpenResp((&OpenResp{Attr: good}).Append(nil), 0); err == nil {
		t.Error("DecodeOpenResp accepted handle 0")
	}
	bad := (&OpenResp{Handle: 1, Attr: good}).Append(nil)
	bad[8+AttrSize] = 2 // created is neither 0 nor 1
	if _, err := DecodeOpenResp(bad, 0); err == nil {
		t.Error("DecodeOpenResp accepted created = 2")
	}
	both := (&OpenResp{Handle: 1, Attr: good, Granted: true, CapRoom: true, HasCap: true}).Append(nil)
	if _, err := DecodeOpenResp(both, FeatureOpenCap); err == nil {
		t.Error("DecodeOpenResp accepted a capability of a handle it says is granted")
	}
	noCap := (&OpenResp{Handle: 1, Attr: good, CapRoom: true}).Append(nil)
	noCap[len(noCap)-1] = 9 // capability bytes after has cap = 0
	if _, err := DecodeOpenResp(noCap, FeatureOpenCap); err == nil {
		t.Error("DecodeOpenResp accepted has cap 0 with non-zero padding")
	}
	for name, ents := range map[string][]Dirent{
		"slash":     {{Ino: 2, Mode: syscall.S_IFREG, Name: "a/b"}},
		"nul":       {{Ino: 2, Mode: syscall.S_IFREG, Name: "a\x00"}},
		"dot":       {{Ino: 2, Mode: syscall.S_IFDIR, Name: "."}},
		"empty":     {{Ino: 2, Mode: syscall.S_IFREG, Name: ""}},
		"long":      {{Ino: 2, Mode: syscall.S_IFREG, Name: strings.Repeat("n", MaxName+1)}},
		"mode":      {{Ino: 2, Mode: syscall.S_IFIFO, Name: "l"}},
		"unordered": {{Ino: 2, Mode: syscall.S_IFREG, Name: "b"}, {Ino: 3, Mode: syscall.S_IFREG, Name: "a"}},
		"duplicate": {{Ino: 2, Mode: syscall.S_IFREG, Name: "a"}, {Ino: 3, Mode: syscall.S_IFREG, Name: "a"}},
	} {
		b, _ := AppendDirents(nil, ents, 1<<20)
		if _, err := DecodeDirents(b); err == nil {
			t.Errorf("DecodeDirents accepted %s", name)
		}
	}
	// A count far beyond the body is refused before anything is allocated.
	if _, err := DecodeDirents([]byte{0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Error("DecodeDirents accepted a count of 2^32-1 in a 4-byte body")
	}
	if _, err := DecodeGetAttrResp((&GetAttrResp{Size: -5}).Append(nil)); err == nil {
		t.Error("DecodeGetAttrResp accepted a negative size")
	}
}

func TestAppendDirentsLimit(t *testing.T) {
	ents := []Dirent{{Ino: 2, Mode: syscall.S_IFREG, Name: "aa"}, {Ino: 3, Mode: syscall.S_IFREG, Name: "bb"}}
	for _, tc := range []struct{ limit, want int }{{4, 0}, {4 + DirentSize(2), 1}, {4 + 2*DirentSize(2) - 1, 1}, {1 << 10, 2}} {
		b, n := AppendDirents(nil, ents, tc.limit)
		if n != tc.want || len(b) > max(tc.limit, 4) {
			t.Errorf("limit %d: %d entries in %d bytes, want %d", tc.limit, n, len(b), tc.want)
		}
		if got, err := DecodeDirents(b); err != nil || len(got) != n {
			t.Errorf("limit %d: decoded %d, %v", tc.limit, len(got), err)
		}
	}
}

// FuzzBodies feeds the same bytes to every decoder. None may panic, and
// whatever decodes must encode to something that decodes to the same
// value (a response also to the same bytes: its encoding is canonical).
func FuzzBodies(f *testing.F) {
	for _, c := range codecs() {
		f.Add(c.encode(c.sample))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, c := range codecs() {
			v, err := c.decode(b)
			if err != nil {
				if !errors.Is(err, syscall.EINVAL) {
					t.Fatalf("%s: error %v, want EINVAL", c.name, err)
				}
				continue
			}
			again := c.encode(v)
			w, err := c.decode(again)
			if err != nil || !reflect.DeepEqual(v, w) {
				t.Fatalf("%s: %x decodes to %+v, which encodes to %x, which decodes to %+v, %v", c.name, b, v, again, w, err)
			}
			if c.exact && !bytes.Equal(again, b) {
				t.Fatalf("%s: %x decodes to %+v, which encodes to %x", c.name, b, v, again)
			}
		}
	})
}
