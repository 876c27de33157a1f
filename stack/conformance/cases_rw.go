package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"syscall"
)

func rwCases() []Case {
	cases := []Case{
		{Name: "rw/write_read_back", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.Write(s("hello"))
			f.Seek(0, io.SeekStart)
			b, _ := f.Read(5)
			t.ExpectData(b, s("hello"))
			_, err := f.Read(5)
			t.ExpectErr(err, io.EOF)
			f.Close()
		}},
		{Name: "rw/read_at_eof", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			_, err := f.Read(1)
			t.ExpectErr(err, io.EOF)
			f.Write(s("abc"))
			_, err = f.Read(1)
			t.ExpectErr(err, io.EOF)
			_, err = f.Read(0)
			t.ExpectOK(err)
			f.Close()
		}},
		{Name: "rw/readat_past_eof_short", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			b, err := f.ReadAt(10, 2)
			t.ExpectErr(err, io.EOF)
			t.ExpectData(b, s("llo"))
			b, err = f.ReadAt(4, 5)
			t.ExpectErr(err, io.EOF)
			t.Check(len(b) == 0, "read %d bytes at EOF", len(b))
			_, err = f.ReadAt(4, 1000)
			t.ExpectErr(err, io.EOF)
			b, err = f.ReadAt(5, 0)
			t.ExpectOK(err)
			t.ExpectData(b, s("hello"))
			f.Close()
		}},
		// Linux checks a descriptor's mode before what it names: a write
		// to a directory (open read-only, as a directory must be) is
		// EBADF, a read EISDIR.
		{Name: "rw/write_dir_opened_readonly", Run: func(t *Tester) {
			t.Mkdir("d", 0o755)
			f := t.MustOpenFile("d", os.O_RDONLY, 0)
			_, err := f.Write(s("x"))
			t.ExpectErr(err, syscall.EBADF)
			_, err = f.WriteAt(s("x"), 0)
			t.ExpectErr(err, syscall.EBADF)
			_, err = f.Read(1)
			t.ExpectErr(err, syscall.EISDIR)
			f.Close()
		}},
		// A write that fails changes nothing: the size stays.
		{Name: "rw/failed_write_changes_nothing", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f := t.MustOpenFile("a", os.O_RDWR, 0)
			_, err := f.WriteAt(s("xy"), 1<<63-2) // the end overflows: EINVAL
			t.ExpectErr(err, syscall.EINVAL)
			f.Stat()
			b, _ := f.ReadAt(16, 0)
			t.ExpectData(b, s("hello"))
			f.Close()
			t.Stat("a")
		}},
		// Reading past any size a file can have reads nothing, as at the
		// end of the file (no EFBIG for reads).
		{Name: "rw/read_past_max_size", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			for _, off := range []int64{1 << 44, 1 << 46, 1 << 62} {
				b, err := f.ReadAt(4, off)
				t.ExpectErr(err, io.EOF)
				t.Check(len(b) == 0, "read %d bytes at %d", len(b), off)
			}
			f.Close()
		}},
		{Name: "rw/writeat_keeps_offset", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.WriteAt(s("tail"), 10)
			pos, _ := f.Seek(0, io.SeekCurrent)
			t.Check(pos == 0, "WriteAt moved the offset to %d", pos)
			f.Write(s("head"))
			f.ReadAt(1, 3)
			pos, _ = f.Seek(0, io.SeekCurrent)
			t.Check(pos == 4, "ReadAt moved the offset to %d", pos)
			f.Close()
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("head\x00\x00\x00\x00\x00\x00tail"))
		}},
		{Name: "rw/overwrite_middle", Run: func(t *Tester) {
			t.WriteFile("a", s("hello world"), 0o644)
			f := t.MustOpenFile("a", os.O_WRONLY, 0)
			f.WriteAt(s("XY"), 3)
			f.Close()
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("helXY world"))
			t.Stat("a")
		}},
		{Name: "rw/write_empty", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			n, err := f.Write(nil)
			t.ExpectOK(err)
			t.Check(n == 0, "wrote %d", n)
			f.WriteAt(nil, 100)
			f.Stat()
			f.Close()
		}},
		{Name: "rw/sparse_hole_reads_zeros", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.WriteAt(s("head"), 0)
			f.WriteAt(s("tail"), mib+5)
			b, _ := f.ReadAt(4096, 4)
			t.ExpectData(b, make([]byte, 4096))
			b, _ = f.ReadAt(8, mib+1)
			t.ExpectData(b, s("\x00\x00\x00\x00tail"))
			b, _ = f.ReadAt(mib, 4)
			t.ExpectData(b, make([]byte, mib))
			f.Stat()
			f.Close()
		}},
		{Name: "rw/sparse_seek_past_end_then_write", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.Seek(10000, io.SeekStart)
			f.Stat()
			f.Write(s("end"))
			b, _ := f.ReadAt(10000, 0)
			t.ExpectData(b, make([]byte, 10000))
			fi, _ := f.Stat()
			t.Check(fi != nil && fi.Size() == 10003, "size %v", fi)
			f.Close()
		}},
		{Name: "rw/large_offset_5gib", Run: func(t *Tester) {
			f := t.MustOpenFile("big", os.O_RDWR|os.O_CREATE, 0o644)
			off := int64(5*gib + 3)
			f.WriteAt(s("abc"), off)
			fi, _ := f.Stat()
			t.Check(fi != nil && fi.Size() == off+3, "size %v", fi)
			t.Stat("big")
			b, _ := f.ReadAt(4096, off-4096)
			t.ExpectData(b, make([]byte, 4096))
			b, _ = f.ReadAt(8, off-5)
			t.ExpectData(b, s("\x00\x00\x00\x00\x00abc"))
			_, err := f.ReadAt(16, off-5)
			t.ExpectErr(err, io.EOF)
			b, _ = f.ReadAt(4, 4*gib-2)
			t.ExpectData(b, make([]byte, 4))
			f.Close()
		}},
		{Name: "rw/large_offset_across_4gib", Run: func(t *Tester) {
			f := t.MustOpenFile("big", os.O_RDWR|os.O_CREATE, 0o644)
			f.WriteAt(s("0123456789"), 4*gib-5)
			b, err := f.ReadAt(20, 4*gib-10)
			t.ExpectErr(err, io.EOF)
			t.ExpectData(b, s("\x00\x00\x00\x00\x000123456789"))
			b, _ = f.ReadAt(3, 4*gib-1)
			t.ExpectData(b, s("456"))
			f.WriteAt(s("AB"), 4*gib-1)
			b, _ = f.ReadAt(4, 4*gib-2)
			t.ExpectData(b, s("3AB6"))
			f.Stat()
			f.Close()
		}},
		{Name: "rw/large_offset_seek_write", Run: func(t *Tester) {
			f := t.MustOpenFile("big", os.O_RDWR|os.O_CREATE, 0o644)
			f.Seek(6*gib+1, io.SeekStart)
			f.Write(s("xyz"))
			f.Seek(0, io.SeekEnd)
			f.Seek(-2, io.SeekEnd)
			b, _ := f.Read(10)
			t.ExpectData(b, s("yz"))
			f.Seek(-(6*gib + 2), io.SeekCurrent)
			f.Close()
		}},
		{Name: "rw/large_truncate_grow", Run: func(t *Tester) {
			t.WriteFile("big", s("start"), 0o644)
			t.ExpectOK(t.Truncate("big", 6*gib))
			t.Stat("big")
			f := t.MustOpenFile("big", os.O_RDONLY, 0)
			b, _ := f.ReadAt(8, 6*gib-8)
			t.ExpectData(b, make([]byte, 8))
			_, err := f.ReadAt(1, 6*gib)
			t.ExpectErr(err, io.EOF)
			b, _ = f.ReadAt(5, 0)
			t.ExpectData(b, s("start"))
			f.Close()
		}},
		{Name: "rw/seek_whence", Run: func(t *Tester) {
			t.WriteFile("a", s("0123456789"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			pos, _ := f.Seek(3, io.SeekStart)
			t.Check(pos == 3, "SEEK_SET gave %d", pos)
			b, _ := f.Read(2)
			t.ExpectData(b, s("34"))
			pos, _ = f.Seek(2, io.SeekCurrent)
			t.Check(pos == 7, "SEEK_CUR gave %d", pos)
			b, _ = f.Read(1)
			t.ExpectData(b, s("7"))
			pos, _ = f.Seek(-2, io.SeekEnd)
			t.Check(pos == 8, "SEEK_END gave %d", pos)
			b, _ = f.Read(5)
			t.ExpectData(b, s("89"))
			f.Seek(0, io.SeekEnd)
			f.Seek(-3, io.SeekCurrent)
			f.Close()
		}},
		{Name: "rw/seek_negative_einval", Run: func(t *Tester) {
			t.WriteFile("a", s("0123456789"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			f.Seek(4, io.SeekStart)
			_, err := f.Seek(-1, io.SeekStart)
			t.ExpectErr(err, syscall.EINVAL)
			_, err = f.Seek(-11, io.SeekEnd)
			t.ExpectErr(err, syscall.EINVAL)
			_, err = f.Seek(-5, io.SeekCurrent)
			t.ExpectErr(err, syscall.EINVAL)
			pos, _ := f.Seek(0, io.SeekCurrent)
			t.Check(pos == 4, "a failed Seek moved the offset to %d", pos)
			f.Close()
		}},
		{Name: "rw/seek_past_largest_file_einval", Run: seekPastLargestFile},
		{Name: "rw/seek_bad_whence_einval", Run: func(t *Tester) {
			t.WriteFile("a", s("0123456789"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			_, err := f.Seek(0, 42)
			t.ExpectErr(err, syscall.EINVAL)
			f.Close()
		}},
		{Name: "rw/seek_beyond_eof_read_eof", Run: func(t *Tester) {
			t.WriteFile("a", s("abc"), 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			f.Seek(100, io.SeekStart)
			_, err := f.Read(1)
			t.ExpectErr(err, io.EOF)
			f.Close()
			t.Stat("a")
		}},
		{Name: "rw/read_large_in_odd_chunks", Run: func(t *Tester) {
			want := pattern(11, mib+3)
			t.WriteFile("a", want, 0o644)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			var got []byte
			reads := 0
			for {
				b := make([]byte, 4097)
				n, err := f.Raw().Read(b)
				got = append(got, b[:n]...)
				if err == io.EOF {
					break
				}
				t.Must(err)
				reads++
			}
			t.Logf("read %d chunks of 4097: %s", reads, data(got))
			t.ExpectData(got, want)
			f.Close()
		}},
		{Name: "rw/truncate_path_shrink", Run: func(t *Tester) {
			t.WriteFile("a", s("hello world"), 0o644)
			t.ExpectOK(t.Truncate("a", 5))
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("hello"))
			t.ExpectOK(t.Truncate("a", 0))
			t.Stat("a")
		}},
		{Name: "rw/truncate_path_grow", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			t.ExpectOK(t.Truncate("a", 10))
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("hello\x00\x00\x00\x00\x00"))
			t.ExpectOK(t.Truncate("a", 3*mib+1))
			t.Stat("a")
		}},
		{Name: "rw/truncate_shrink_then_grow_zeros", Run: func(t *Tester) {
			t.WriteFile("a", pattern(3, 10000), 0o644)
			t.ExpectOK(t.Truncate("a", 2))
			t.ExpectOK(t.Truncate("a", 10000))
			b, _ := t.ReadFile("a")
			want := append(pattern(3, 2), make([]byte, 9998)...)
			t.ExpectData(b, want)
		}},
		{Name: "rw/ftruncate", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.Write(s("hello world"))
			t.ExpectOK(f.Truncate(5))
			pos, _ := f.Seek(0, io.SeekCurrent)
			t.Check(pos == 11, "Truncate moved the offset to %d", pos)
			f.Stat()
			f.Write(s("!"))
			b, _ := f.ReadAt(20, 0)
			t.ExpectData(b, s("hello\x00\x00\x00\x00\x00\x00!"))
			t.ExpectOK(f.Truncate(7))
			b, _ = f.ReadAt(20, 0)
			t.ExpectData(b, s("hello\x00\x00"))
			f.Close()
		}},
		{Name: "rw/truncate_errors", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			t.WriteFile("a", s("hello"), 0o644)
			t.ExpectErr(t.Truncate("missing", 0), syscall.ENOENT)
			t.ExpectErr(t.Truncate("d", 0), syscall.EISDIR)
			t.ExpectErr(t.Truncate("a", -1), syscall.EINVAL)
			f := t.MustOpenFile("a", os.O_RDONLY, 0)
			t.ExpectErr(f.Truncate(1), syscall.EINVAL)
			f.Close()
			f = t.MustOpenFile("a", os.O_RDWR, 0)
			t.ExpectErr(f.Truncate(-1), syscall.EINVAL)
			f.Close()
			t.Stat("a")
		}},
		{Name: "rw/sync", Run: func(t *Tester) {
			t.Must(t.Mkdir("d", 0o755))
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			f.Write(s("durable"))
			t.ExpectOK(f.Sync())
			f.Close()
			f = t.MustOpenFile("a", os.O_RDONLY, 0)
			t.ExpectOK(f.Sync())
			f.Close()
			f = t.MustOpenFile("d", os.O_RDONLY, 0)
			t.ExpectOK(f.Sync())
			f.Close()
		}},
		{Name: "rw/stat_size_while_open", Run: func(t *Tester) {
			f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
			for _, n := range []int{1, 4096, 5000} {
				f.Write(pattern(uint64(n), n))
				f.Stat()
				t.Stat("a")
			}
			f.Close()
		}},
		{Name: "rw/mtime_write_truncate_not_read", Run: func(t *Tester) {
			t.WriteFile("a", s("hello"), 0o644)
			t.Must(t.Chtimes("a", past, past))
			b, _ := t.ReadFile("a")
			t.ExpectData(b, s("hello"))
			t.Check(!t.MtimeAfter("a", past), "read changed mtime")
			f := t.MustOpenFile("a", os.O_WRONLY, 0)
			f.WriteAt(s("J"), 0)
			f.Close()
			t.Check(t.MtimeAfter("a", past), "write did not change mtime")
			t.Must(t.Chtimes("a", past, past))
			t.ExpectOK(t.Truncate("a", 2))
			t.Check(t.MtimeAfter("a", past), "truncate did not change mtime")
		}},
	}
	for i, size := range []int{1, 7, 4095, 4097, 65537} {
		cases = append(cases, Case{Name: fmt.Sprintf("rw/unaligned_%d", size), Run: func(t *Tester) {
			unaligned(t, uint64(100+i), size)
		}})
	}
	cases = append(cases,
		Case{Name: "rw/concurrent_writers_one_handle", Run: func(t *Tester) {
			concurrentWriters(t, false, 37*kib+3, false)
		}},
		Case{Name: "rw/concurrent_writers_own_handles", Run: func(t *Tester) {
			concurrentWriters(t, true, 37*kib+3, false)
		}},
		Case{Name: "rw/concurrent_writers_interleaved_stripes", Run: func(t *Tester) {
			concurrentWriters(t, false, 4097, true)
		}},
	)
	return cases
}

// unaligned writes size bytes at odd offsets across block boundaries of a
// file that already has data, and reads back at other odd offsets, against
// an in-memory model.
func unaligned(t *Tester, seed uint64, size int) {
	model := pattern(seed, 3*size+9000)
	t.WriteFile("a", model, 0o644)
	f := t.MustOpenFile("a", os.O_RDWR, 0)
	for i, off := range []int64{1, 4093, int64(size) + 4099, int64(len(model)) - int64(size/2) + 3} {
		p := pattern(seed*10+uint64(i), size)
		f.WriteAt(p, off)
		if end := int(off) + size; end > len(model) {
			model = append(model, make([]byte, end-len(model))...)
		}
		copy(model[off:], p)
	}
	for _, off := range []int64{0, 3, 4091, int64(size) + 1} {
		n := size + 5
		b, _ := f.ReadAt(n, off)
		want := model[min(int(off), len(model)):min(int(off)+n, len(model))]
		t.ExpectData(b, want)
	}
	f.Seek(7, io.SeekStart)
	b, _ := f.Read(size)
	t.ExpectData(b, model[7:7+size])
	f.Close()
	got, _ := t.ReadFile("a")
	t.ExpectData(got, model)
}

// concurrentWriters has 8 goroutines write disjoint ranges of one file at
// once (through one handle or one each), then checks every byte. With
// stripes, writer w owns ranges w, w+8, w+16, ... of chunk bytes, so
// neighbours share blocks. The observations are the per-writer results in
// writer order and the final contents.
func concurrentWriters(t *Tester, ownHandles bool, chunk int, stripes bool) {
	const writers = 8
	perWriter := 1
	if stripes {
		perWriter = 16
	}
	size := writers * perWriter * chunk
	want := pattern(42, size)
	f := t.MustOpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			h := f.Raw()
			if ownHandles {
				var err error
				if h, err = t.FS().OpenFile("a", os.O_WRONLY, 0); err != nil {
					errs[w] = err
					return
				}
				defer func() {
					if err := h.Close(); err != nil && errs[w] == nil {
						errs[w] = err
					}
				}()
			}
			<-start
			for k := range perWriter {
				off := (k*writers + w) * chunk
				if !stripes {
					off = w * chunk
				}
				if _, err := h.WriteAt(want[off:off+chunk], int64(off)); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for w, err := range errs {
		name, _ := errName(err)
		t.Logf("writer %d: %s", w, name)
		t.ExpectOK(err)
	}
	fi, _ := f.Stat()
	t.Check(fi != nil && fi.Size() == int64(size), "size %v, want %d", fi, size)
	got := make([]byte, size+1)
	n, err := f.Raw().ReadAt(got, 0)
	if err != io.EOF {
		t.Errorf("ReadAt past the end: %v", err)
	}
	got = got[:n]
	t.Logf("contents: %s", data(got))
	if !bytes.Equal(got, want) {
		t.ExpectData(got, want)
	}
	f.Close()
}

// seekPastLargestFile: Linux bounds a file's offsets by its file system's
// largest file (s_maxbytes): a seek past it is EINVAL, wherever from, and
// leaves the offset; a write at it is EFBIG. Where that bound lies is the
// file system's (ext4 with 4 KiB blocks: 16 TiB - 4 KiB, so a seek to
// 2^62 fails; tmpfs, XFS, btrfs: 2^63 - 1, so it succeeds; weir: 64 TiB),
// so the case finds it on each target and records only what holds on all:
// a seek and a write agree on it.
func seekPastLargestFile(t *Tester) {
	t.WriteFile("a", s("0123456789"), 0o644)
	f := t.MustOpenFile("a", os.O_RDWR, 0)
	raw := f.Raw()
	// The largest offset a seek takes (unrecorded: it is the target's).
	lo, hi := int64(0), int64(math.MaxInt64)
	for lo < hi {
		mid := lo + (hi-lo)/2 + 1
		if _, err := raw.Seek(mid, io.SeekStart); err == nil {
			lo = mid
		} else if errors.Is(err, syscall.EINVAL) {
			hi = mid - 1
		} else {
			t.Fatalf("seek to %d: %v, want ok or EINVAL", mid, err)
		}
	}
	largest := lo
	if largest < math.MaxInt64 {
		pos, err := raw.Seek(largest, io.SeekStart)
		t.Check(err == nil && pos == largest, "seek to the largest offset %d: %d %v", largest, pos, err)
		_, err = raw.Seek(1, io.SeekCurrent)
		t.Check(errors.Is(err, syscall.EINVAL), "seek 1 past the largest offset from it: %v, want EINVAL", err)
		_, err = raw.Seek(largest-9, io.SeekEnd)
		t.Check(errors.Is(err, syscall.EINVAL), "seek past the largest offset from the end of 10 bytes: %v, want EINVAL", err)
		pos, err = raw.Seek(0, io.SeekCurrent)
		t.Check(err == nil && pos == largest, "failed seeks moved the offset from %d to %d (%v)", largest, pos, err)
		_, err = raw.WriteAt(s("x"), largest)
		t.Check(errors.Is(err, syscall.EFBIG), "write at the largest offset %d: %v, want EFBIG", largest, err)
	}
	// 2^62, past ext4's bound and within tmpfs's: the seek fails with
	// EINVAL where the write fails with EFBIG, and both work elsewhere.
	_, serr := raw.Seek(1<<62, io.SeekStart)
	_, werr := raw.WriteAt(s("x"), 1<<62)
	t.Check((serr == nil) == (werr == nil), "at 2^62 a seek gives %v and a write %v: one bound, or none, for both", serr, werr)
	t.Check(serr == nil || errors.Is(serr, syscall.EINVAL), "seek to 2^62: %v, want ok or EINVAL", serr)
	t.Check(werr == nil || errors.Is(werr, syscall.EFBIG), "write at 2^62: %v, want ok or EFBIG", werr)
	if werr == nil {
		t.Must(raw.Truncate(10))
	}
	f.Seek(4, io.SeekStart)
	b, _ := f.Read(2)
	t.ExpectData(b, s("45"))
	f.Close()
	t.Stat("a")
}
