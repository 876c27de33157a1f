package ns

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/weir-storage/weir/internal/vfs"
	"github.com/weir-storage/weir/internal/wal"
)

// Checkpoint format constants (version 4; versions 1 to 3 are still read); see
// the package comment.
const (
	ckptVersion    = 4
	ckptHeaderSize = 64
	ckptMinInode   = 68 // bytes of an inode record without entries
	ckptBootSize   = 4 + 16 + 32
)

var ckptMagic = [8]byte{'w', 'e', 'i', 'r', 'c', 'k', 'p', 't'}

// ckptName is the file name of the checkpoint covering LSN lsn.
func ckptName(lsn uint64) string { return fmt.Sprintf("ckpt-%020d.ckpt", lsn) }

// parseCkptName returns the LSN in a checkpoint file name.
func parseCkptName(name string) (uint64, bool) {
	if len(name) != 30 || !strings.HasPrefix(name, "ckpt-") || !strings.HasSuffix(name, ".ckpt") {
		return 0, false
	}
	v, err := strconv.ParseUint(name[5:25], 10, 64)
	return v, err == nil
}

// encodeCheckpoint serialises s as the state after WAL record lsn.
// Inodes and entries are sorted, so equal states encode identically.
func encodeCheckpoint(s *state, lsn uint64) []byte {
	inos := make([]Ino, 0, len(s.inodes))
	for ino := range s.inodes {
		inos = append(inos, ino)
	}
	slices.Sort(inos)
	dead := make([]uint64, 0, len(s.dead))
	for blob := range s.dead {
		dead = append(dead, blob)
	}
	slices.Sort(dead)
	b := make([]byte, ckptHeaderSize, ckptHeaderSize+ckptBootSize+8+8*len(dead)+len(inos)*(ckptMinInode+16))
	b = s.boot.encode(b)
	b = le.AppendUint64(b, uint64(len(dead)))
	for _, blob := range dead {
		b = le.AppendUint64(b, blob)
	}
	var names []string
	for _, ino := range inos {
		n := s.inodes[ino]
		a := &n.attr
		b = le.AppendUint64(b, uint64(a.Ino))
		b = le.AppendUint32(b, a.Mode)
		b = le.AppendUint32(b, a.UID)
		b = le.AppendUint32(b, a.GID)
		b = le.AppendUint32(b, a.Nlink)
		b = le.AppendUint64(b, uint64(a.Size))
		b = le.AppendUint64(b, uint64(a.Atime))
		b = le.AppendUint64(b, uint64(a.Mtime))
		b = le.AppendUint64(b, uint64(a.Ctime))
		b = le.AppendUint64(b, a.Blob)
		b = le.AppendUint32(b, uint32(len(n.entries)))
		names = names[:0]
		for name := range n.entries {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			b = appendName(b, name)
			b = le.AppendUint64(b, uint64(n.entries[name]))
		}
		if n.isLink() {
			b = appendTarget(b, n.target)
		}
	}
	h := b[:ckptHeaderSize]
	copy(h, ckptMagic[:])
	le.PutUint32(h[8:], ckptVersion)
	le.PutUint32(h[12:], ckptHeaderSize)
	le.PutUint64(h[16:], lsn)
	le.PutUint64(h[24:], uint64(s.nextIno))
	le.PutUint64(h[32:], uint64(len(inos)))
	le.PutUint64(h[40:], uint64(len(b)-ckptHeaderSize))
	le.PutUint64(h[52:], uint64(s.allocLimit))
	le.PutUint32(h[48:], wal.Checksum(b[ckptHeaderSize:]))
	le.PutUint32(h[60:], wal.Checksum(h[:60]))
	return b
}

// decodeCheckpoint verifies and decodes a checkpoint file. The state it
// returns passed the structural check (orphans allowed).
func decodeCheckpoint(data []byte) (*state, uint64, error) {
	if len(data) < ckptHeaderSize {
		return nil, 0, fmt.Errorf("short file (%d bytes)", len(data))
	}
	h := data[:ckptHeaderSize]
	if wal.Checksum(h[:60]) != le.Uint32(h[60:]) {
		return nil, 0, fmt.Errorf("header checksum mismatch")
	}
	if [8]byte(h[:8]) != ckptMagic {
		return nil, 0, fmt.Errorf("bad magic %q", h[:8])
	}
	version := le.Uint32(h[8:])
	if version < 1 || version > ckptVersion {
		return nil, 0, fmt.Errorf("unsupported version %d", version)
	}
	allocLimit := Ino(le.Uint64(h[52:]))
	if (version < 3 && allocLimit != 0) || allocLimit > MaxIno+1 {
		return nil, 0, fmt.Errorf("allocation limit %d in a version %d header", allocLimit, version)
	}
	if v := le.Uint32(h[12:]); v != ckptHeaderSize {
		return nil, 0, fmt.Errorf("unsupported header size %d", v)
	}
	lsn, next, count, bodyLen := le.Uint64(h[16:]), Ino(le.Uint64(h[24:])), le.Uint64(h[32:]), le.Uint64(h[40:])
	body := data[ckptHeaderSize:]
	if bodyLen != uint64(len(body)) {
		return nil, 0, fmt.Errorf("body is %d bytes, header says %d", len(body), bodyLen)
	}
	if wal.Checksum(body) != le.Uint32(h[48:]) {
		return nil, 0, fmt.Errorf("body checksum mismatch")
	}
	if next == 0 || next > MaxIno+1 {
		return nil, 0, fmt.Errorf("next inode %d outside [1, %d]", next, MaxIno+1)
	}
	s := &state{nextIno: next, allocLimit: allocLimit, dead: map[uint64]struct{}{}}
	d := &decoder{b: body}
	if version >= 2 {
		s.boot.incarnation = d.u32()
		copy(s.boot.stackID[:], d.take(16))
		copy(s.boot.key[:], d.take(32))
		ndead := d.u64()
		if d.err != nil || ndead > uint64(len(d.b))/8 {
			return nil, 0, fmt.Errorf("dead blob count %d does not fit the body", ndead)
		}
		prev := uint64(0)
		for range ndead {
			blob := d.u64()
			if blob <= prev {
				return nil, 0, fmt.Errorf("dead blobs not ascending at %d", blob)
			}
			s.dead[blob], prev = struct{}{}, blob
		}
		if (s.boot.incarnation == 0) != (s.boot.stackID == [16]byte{}) || (s.boot.incarnation == 0) != (s.boot.key == [32]byte{}) ||
			s.boot.incarnation > MaxIncarnation {
			return nil, 0, fmt.Errorf("boot fields inconsistent (incarnation %d)", s.boot.incarnation)
		}
	}
	if count > uint64(len(d.b))/ckptMinInode {
		return nil, 0, fmt.Errorf("inode count %d does not fit %d bytes", count, len(d.b))
	}
	s.inodes = make(map[Ino]*inode, count)
	for i := uint64(0); i < count && d.err == nil; i++ {
		n := &inode{attr: Attr{
			Ino: d.ino(), Mode: d.u32(), UID: d.u32(), GID: d.u32(), Nlink: d.u32(),
			Size: d.i64(), Atime: d.i64(), Mtime: d.i64(), Ctime: d.i64(), Blob: d.u64(),
		}}
		nent := d.u32()
		if d.err != nil {
			break
		}
		if _, dup := s.inodes[n.attr.Ino]; dup {
			return nil, 0, fmt.Errorf("inode %d appears twice", n.attr.Ino)
		}
		if !modeValid(n.attr.Mode) {
			return nil, 0, fmt.Errorf("inode %d: invalid mode %#o", n.attr.Ino, n.attr.Mode)
		}
		if n.isLink() && version < 4 {
			return nil, 0, fmt.Errorf("inode %d: a symbolic link in a version %d checkpoint", n.attr.Ino, version)
		}
		if n.isDir() {
			n.entries = make(map[string]Ino, min(int(nent), len(d.b)/10))
		} else if nent != 0 {
			return nil, 0, fmt.Errorf("file inode %d has %d entries", n.attr.Ino, nent)
		}
		for j := uint32(0); j < nent && d.err == nil; j++ {
			name, child := d.name(), d.ino()
			if d.err != nil {
				break
			}
			if _, dup := n.entries[name]; dup {
				return nil, 0, fmt.Errorf("directory %d: name %q appears twice", n.attr.Ino, name)
			}
			n.setEntry(name, child)
		}
		if n.isLink() {
			n.target = d.target()
		}
		s.inodes[n.attr.Ino] = n
	}
	if err := d.finish(); err != nil {
		return nil, 0, fmt.Errorf("body: %w", err)
	}
	root := s.inodes[RootIno]
	if root == nil || !root.isDir() {
		return nil, 0, fmt.Errorf("no root directory")
	}
	root.parent = RootIno
	for _, n := range s.inodes {
		for _, child := range n.entries {
			if c := s.inodes[child]; c != nil && c.isDir() {
				if c.parent != 0 {
					return nil, 0, fmt.Errorf("directory %d has two names", child)
				}
				c.parent = n.attr.Ino
			}
		}
	}
	if err := s.check(false); err != nil {
		return nil, 0, err
	}
	return s, lsn, nil
}

// writeCheckpoint makes data the checkpoint for lsn: written to a
// temporary file, flushed, renamed into place, directory flushed. A failed
// flush is sticky (it fails the WAL writer).
func (n *NS) writeCheckpoint(lsn uint64, data []byte) error {
	final := filepath.Join(n.opts.Dir, ckptName(lsn))
	tmp := strings.TrimSuffix(final, ".ckpt") + ".tmp"
	f, err := n.fs.Create(tmp)
	if err != nil {
		return &IOError{Op: "create checkpoint", Err: err}
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		n.fs.Remove(tmp)
		return &IOError{Op: "write checkpoint", Err: err}
	}
	if err := vfs.Sync(f); err != nil {
		f.Close()
		n.fail(err)
		return &IOError{Op: "checkpoint", Err: err}
	}
	f.Close()
	if err := n.fs.Rename(tmp, final); err != nil {
		n.fs.Remove(tmp)
		return &IOError{Op: "rename checkpoint", Err: err}
	}
	if err := n.fs.SyncDir(n.opts.Dir); err != nil {
		n.fail(err)
		return &IOError{Op: "checkpoint", Err: err}
	}
	return nil
}

// checkpoint writes a snapshot of the current state, starts a new WAL
// segment after it, and removes what is no longer needed: checkpoints
// older than the previous one and WAL segments wholly covered by the
// previous one. Keeping the previous checkpoint and its WAL lets recovery
// fall back to it if the newest checkpoint is ever found damaged.
func (n *NS) checkpoint() error {
	n.ckptMu.Lock()
	defer n.ckptMu.Unlock()
	n.mu.RLock()
	lsn := n.w.LastLSN()
	if len(n.ckpts) > 0 && n.ckpts[len(n.ckpts)-1] == lsn {
		n.mu.RUnlock()
		return nil
	}
	data := encodeCheckpoint(n.st, lsn)
	err := n.w.Rotate()
	n.sinceCkpt.Store(0)
	n.ckptEvery.Store(int64(len(n.st.inodes) / 4))
	n.mu.RUnlock()
	if err != nil {
		return &IOError{Op: "rotate WAL", Err: err}
	}
	if err := n.writeCheckpoint(lsn, data); err != nil {
		return err
	}
	n.log.Debug("checkpoint written", "lsn", lsn, "bytes", len(data))
	n.ckpts = append(n.ckpts, lsn)
	for len(n.ckpts) > 2 {
		if err := n.fs.Remove(filepath.Join(n.opts.Dir, ckptName(n.ckpts[0]))); err != nil {
			n.log.Warn("cannot remove old checkpoint", "error", err)
		}
		n.ckpts = n.ckpts[1:]
	}
	if len(n.ckpts) == 2 {
		if err := n.w.RemoveObsolete(n.ckpts[0]); err != nil {
			n.log.Warn("cannot remove old WAL segments", "error", err)
		}
	}
	return nil
}
