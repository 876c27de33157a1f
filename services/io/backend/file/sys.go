package file

import (
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// blockSize is the unit of O_DIRECT transfers: offsets, lengths and buffer
// addresses are multiples of it. 4096 satisfies every device with 512-byte
// or 4 KiB logical blocks; New falls back to buffered I/O on anything that
// needs more.
const blockSize = 4096

// bounceSize is the largest O_DIRECT transfer: a longer read or write is
// split into transfers of at most this many bytes.
const bounceSize = 256 << 10

// bouncePool holds aligned bounce buffers of bounceSize bytes.
var bouncePool = sync.Pool{New: func() any {
	b := alignedBuf(bounceSize, blockSize)
	return &b
}}

func getBounce() *[]byte  { return bouncePool.Get().(*[]byte) }
func putBounce(b *[]byte) { bouncePool.Put(b) }

func alignDown(x int64) int64 { return x &^ (blockSize - 1) }
func alignUp(x int64) int64   { return (x + blockSize - 1) &^ (blockSize - 1) }

// preadFull reads into p at off until p is full or the file ends, and
// returns how many bytes it read. With direct set, a transfer that ends off
// a block boundary means the file ended there (the next one would be
// unaligned and refused).
func preadFull(fd int, p []byte, off int64, direct bool) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pread(fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			break
		}
		done += n
		if direct && done%blockSize != 0 {
			break
		}
	}
	return done, nil
}

// pwriteFull writes all of p at off.
func pwriteFull(fd int, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pwrite(fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.ErrShortWrite
		}
		done += n
	}
	return done, nil
}

// fsync and fdatasync are the package's only durability calls.
func fsync(fd int) error {
	for {
		if err := unix.Fsync(fd); err != unix.EINTR {
			return err
		}
	}
}

func fdatasync(fd int) error {
	for {
		if err := unix.Fdatasync(fd); err != unix.EINTR {
			return err
		}
	}
}

func ftruncate(fd int, size int64) error {
	for {
		if err := unix.Ftruncate(fd, size); err != unix.EINTR {
			return err
		}
	}
}

func openFile(path string, flags int, perm uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, perm)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// fsyncDir makes the entries of directory path durable; opened is false
// when it could not open the directory (nothing was synced).
func fsyncDir(path string) (opened bool, err error) {
	fd, err := openFile(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return false, err
	}
	err = fsync(fd)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return true, err
}
