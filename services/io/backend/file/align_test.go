package file

import "testing"

func TestAlignedBuf(t *testing.T) {
	for _, size := range []int{1, 4095, 4096, 4097, bounceSize} {
		for range 20 {
			b := alignedBuf(size, blockSize)
			if len(b) != size || cap(b) != size || !isAligned(b, blockSize) {
				t.Fatalf("alignedBuf(%d): len %d cap %d aligned %v", size, len(b), cap(b), isAligned(b, blockSize))
			}
		}
	}
	b := getBounce()
	defer putBounce(b)
	if len(*b) != bounceSize || !isAligned(*b, blockSize) {
		t.Fatalf("bounce buffer: len %d aligned %v", len(*b), isAligned(*b, blockSize))
	}
}
