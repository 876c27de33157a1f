package grantcap

import (
	"bytes"
	"crypto/rand"
	"testing"
)

func key(t *testing.T) *Key {
	b := make([]byte, KeySize)
	rand.Read(b)
	k, err := NewKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestMintCheck(t *testing.T) {
	k := key(t)
	c := Cap{Session: 1 << 40, Handle: 7, Blob: 4097, Ver: 99, Access: AccessRead}
	b := k.Mint(c)
	got, err := k.Check(b[:])
	if err != nil || got != c {
		t.Fatalf("Check = %+v, %v; want %+v", got, err, c)
	}
	// Any changed bit, another key, a short or long slice: refused.
	for i := range Size * 8 {
		x := b
		x[i/8] ^= 1 << (i % 8)
		if _, err := k.Check(x[:]); err == nil {
			t.Fatalf("bit %d flipped: accepted", i)
		}
	}
	if _, err := key(t).Check(b[:]); err == nil {
		t.Fatal("another key's check accepted it")
	}
	if _, err := k.Check(b[:Size-1]); err == nil {
		t.Fatal("a short capability was accepted")
	}
	if _, err := k.Check(append(b[:], 0)); err == nil {
		t.Fatal("a long capability was accepted")
	}
	if _, err := NewKey(make([]byte, 16)); err == nil {
		t.Fatal("a 16-byte key was accepted")
	}
}

func FuzzCheck(f *testing.F) {
	k, _ := NewKey(bytes.Repeat([]byte{7}, KeySize))
	good := k.Mint(Cap{Session: 1, Handle: 2, Blob: 3, Ver: 4, Access: AccessRead})
	f.Add(good[:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := k.Check(b)
		if err != nil {
			return
		}
		// Whatever passes is exactly what the key minted for its fields.
		if m := k.Mint(c); !bytes.Equal(m[:], b) {
			t.Fatalf("accepted %x, which is not the mint of %+v", b, c)
		}
	})
}
