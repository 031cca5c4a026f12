package selection

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// stagingBlocker is the block hasher blocker replaced (main at ce8faf2):
// writes of up to 16 bytes staged in 128, everything else streamed into
// an xxhash.Digest. TestBlockerMatchesStaging holds blocker to it.
type stagingBlocker struct {
	d      xxhash.Digest
	fill   int
	bb     int
	max    int
	blocks []uint64
	total  int
	full   bool
	n      int
	stage  [128]byte
}

func (k *stagingBlocker) reset(x Extractor) {
	k.d.ResetWithSeed(0)
	k.fill, k.total, k.full, k.n = 0, 0, false, 0
	k.bb, k.max, k.blocks = x.blockBytes, x.maxBlocks, nil
}

func (k *stagingBlocker) write(p []byte) {
	if len(p) <= 16 && k.n+len(p) <= len(k.stage) {
		k.n += copy(k.stage[k.n:], p)
		return
	}
	k.flush()
	if len(p) <= 16 {
		k.n = copy(k.stage[:], p)
		return
	}
	k.emit(p)
}

func (k *stagingBlocker) writeByte(c byte) {
	if k.n == len(k.stage) {
		k.flush()
	}
	k.stage[k.n] = c
	k.n++
}

func (k *stagingBlocker) flush() {
	if k.n > 0 {
		n := k.n
		k.n = 0
		k.emit(k.stage[:n])
	}
}

func (k *stagingBlocker) emit(p []byte) {
	k.total += len(p)
	if k.full {
		return
	}
	for {
		n := k.bb - k.fill
		if len(p) < n {
			_, _ = k.d.Write(p)
			k.fill += len(p)
			return
		}
		_, _ = k.d.Write(p[:n])
		h := k.d.Sum64()
		k.blocks = append(k.blocks, h)
		k.d.ResetWithSeed(h)
		k.fill = 0
		p = p[n:]
		if len(k.blocks) >= k.max {
			k.full = true
			return
		}
	}
}

// Random sequences of writes (long and short), single bytes and "raw
// length once full" writes (what writeString, writeCompact and writeDigest
// do past the bound) give the same blocks, total and full flag in blocker
// as in the staging hasher, for block sizes below, at and above blocker's
// buffer and bounds reached or not.
func TestBlockerMatchesStaging(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	src := make([]byte, 5000)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	geoms := [][2]int{{1, 3000}, {7, 500}, {16, 64}, {256, 2048}, {256, 3}, {511, 9}, {512, 5}, {513, 7}, {600, 4}, {1024, 6}, {4096, 2}, {8192, 3}}
	for iter := 0; iter < 3000; iter++ {
		g := geoms[iter%len(geoms)]
		x := Extractor{blockBytes: g[0], maxBlocks: g[1]}
		var a stagingBlocker
		a.reset(x)
		var b blocker
		b.reset(x, make([]uint64, 0, g[1]))
		ops := r.IntN(400)
		for range ops {
			var p []byte
			switch r.IntN(4) {
			case 0:
				p = nil
			case 1:
				n := r.IntN(17)
				off := r.IntN(len(src) - n)
				p = src[off : off+n]
			case 2:
				n := r.IntN(300)
				off := r.IntN(len(src) - n)
				p = src[off : off+n]
			default:
				n := r.IntN(len(src))
				off := r.IntN(len(src) - n)
				p = src[off : off+n]
			}
			switch op := r.IntN(5); {
			case op == 0:
				c := byte(r.Uint32())
				a.writeByte(c)
				b.writeByte(c)
			case op == 1:
				// writeString's rule: raw length once full.
				if a.full != b.full {
					t.Fatalf("iter %d: full %v, staging %v", iter, b.full, a.full)
				}
				if a.full {
					a.total += len(p) + 3
					b.total += len(p) + 3
					continue
				}
				a.write(p)
				b.write(p)
			default:
				a.write(p)
				b.write(p)
			}
		}
		a.flush()
		b.finish()
		if !slices.Equal(a.blocks, b.blocks) || a.total != b.total || a.full != b.full {
			t.Fatalf("iter %d geometry %v: %d blocks total %d full %v, staging %d blocks total %d full %v",
				iter, g, len(b.blocks), b.total, b.full, len(a.blocks), a.total, a.full)
		}
	}
}
