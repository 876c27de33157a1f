package ctest

import "testing"

// TestShimMmapWritable: a writable MAP_SHARED mapping of a weir file
// (io's cache pages, read-write) is coherent with read and write both
// ways, in this process and in others, across the region's 4 MiB chunks;
// its stores survive msync and munmap, a writer killed with SIGKILL
// without msync (its session's end makes them dirty), and fsync; after a
// restart of the services every store is on the device. A file written
// only through a mapping gets a new mtime at msync.
func TestShimMmapWritable(t *testing.T) {
	need(t, "python3", "python3")
	s, restart := restartable(t)
	out := s.sh("python3", `
import mmap, os, subprocess, sys, time
N = 6 << 20
with open('/weir/w', 'wb') as f:
    f.write(b'.' * N)
fd = os.open('/weir/w', os.O_RDWR)
m = mmap.mmap(fd, N, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
B = 4 << 20
m[B - 4:B + 4] = b'ABCDEFGH'  # across the region's chunks
print('pread', os.pread(fd, 8, B - 4))
print('dd', subprocess.run(['dd', 'if=/weir/w', 'bs=1', 'skip=%d' % (B - 4), 'count=8', 'status=none'],
                           capture_output=True, check=True).stdout)
subprocess.run(['sh', '-c', 'printf wxyz | dd of=/weir/w bs=1 seek=100 conv=notrunc status=none'], check=True)
print('map sees write', m[100:104])
os.pwrite(fd, b'own', 200)
print('map sees own pwrite', m[200:203])
before = os.stat('/weir/w').st_mtime_ns
time.sleep(0.05)
m[0:5] = b'hello'
m.flush()  # msync(MS_SYNC)
print('mtime moved', os.stat('/weir/w').st_mtime_ns > before)
m.close()
os.close(fd)
with open('/weir/w', 'rb') as f:
    print('after munmap', f.read(5))
child = subprocess.Popen([sys.executable, '-c', """
import mmap, os, sys, time
fd = os.open("/weir/w", os.O_RDWR)
m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=1 << 20)
m[0:6] = b"killed"
print("stored", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE)
child.stdout.readline()
child.kill()
child.wait()
with open('/weir/w', 'rb') as f:
    f.seek(1 << 20)
    print('killed writer', f.read(6))
fd = os.open('/weir/w', os.O_RDWR)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=2 << 20)
m[0:5] = b'fsync'
os.fsync(fd)
print('fsynced')
`)
	want := "pread b'ABCDEFGH'\ndd b'ABCDEFGH'\nmap sees write b'wxyz'\nmap sees own pwrite b'own'\nmtime moved True\n" +
		"after munmap b'hello'\nkilled writer b'killed'\nfsynced\n"
	if out != want {
		t.Fatalf("writable MAP_SHARED of a weir file:\n%s\nwant:\n%s", out, want)
	}
	restart()
	out = s.sh("python3", `
with open('/weir/w', 'rb') as f:
    d = f.read()
B = 4 << 20
print(len(d), d[0:5], d[100:104], d[200:203], d[B - 4:B + 4], d[1 << 20:(1 << 20) + 6], d[2 << 20:(2 << 20) + 5])
print(d.count(b'.') == len(d) - 5 - 4 - 3 - 8 - 6 - 5)
`)
	if want := "6291456 b'hello' b'wxyz' b'own' b'ABCDEFGH' b'killed' b'fsync'\nTrue\n"; out != want {
		t.Fatalf("after a restart:\n%s\nwant:\n%s", out, want)
	}
}
