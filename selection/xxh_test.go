package selection

import (
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// hashSeeded is XXH64 as xxhash.Digest computes it, for every length up
// to 600 bytes and random seeds (0 among them).
func TestHashSeeded(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 600)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	var d xxhash.Digest
	for n := 0; n <= len(buf); n++ {
		for _, seed := range []uint64{0, 1, r.Uint64(), r.Uint64()} {
			d.ResetWithSeed(seed)
			_, _ = d.Write(buf[:n])
			if got, want := hashSeeded(seed, buf[:n]), d.Sum64(); got != want {
				t.Fatalf("len %d seed %x: %x, want %x", n, seed, got, want)
			}
		}
	}
	if hashSeeded(0, buf[:100]) != xxhash.Sum64(buf[:100]) {
		t.Fatal("seed 0 differs from Sum64")
	}
}

func BenchmarkHashBlock(b *testing.B) {
	buf := make([]byte, 256)
	b.Run("digest", func(b *testing.B) {
		b.SetBytes(256)
		var d xxhash.Digest
		h := uint64(0)
		for b.Loop() {
			d.ResetWithSeed(h)
			_, _ = d.Write(buf)
			h = d.Sum64()
		}
	})
	b.Run("hashSeeded", func(b *testing.B) {
		b.SetBytes(256)
		h := uint64(0)
		for b.Loop() {
			h = hashSeeded(h, buf)
		}
	})
	b.Run("sum64", func(b *testing.B) {
		b.SetBytes(256)
		h := uint64(0)
		for b.Loop() {
			h += xxhash.Sum64(buf)
		}
	})
}
