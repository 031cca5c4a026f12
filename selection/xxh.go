package selection

import (
	"encoding/binary"
	"math/bits"
)

// XXH64 with a seed over one slice, as xxhash.Digest computes it after
// ResetWithSeed(seed) and one Write(p): the block hasher's one call per
// block, without the Digest's state (TestHashSeeded holds the two equal).
const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
)

func xxRound(acc, input uint64) uint64 {
	acc += input * xxPrime2
	acc = bits.RotateLeft64(acc, 31)
	acc *= xxPrime1
	return acc
}

func xxMergeRound(acc, val uint64) uint64 {
	val = xxRound(0, val)
	acc ^= val
	acc = acc*xxPrime1 + xxPrime4
	return acc
}

// hashSeeded returns XXH64(seed, p).
func hashSeeded(seed uint64, p []byte) uint64 {
	n := len(p)
	var h uint64
	if n >= 32 {
		v1 := seed + xxPrime1 + xxPrime2
		v2 := seed + xxPrime2
		v3 := seed
		v4 := seed - xxPrime1
		// The stripes by index, each read through one array pointer
		// (one bounds check a stripe, and the slice advanced once), the
		// rounds written out (xxRound's inlining leaves a marker
		// instruction per call).
		i := 0
		for ; i <= n-32; i += 32 {
			q := (*[32]byte)(p[i : i+32])
			v1 = bits.RotateLeft64(v1+binary.LittleEndian.Uint64(q[0:8])*xxPrime2, 31) * xxPrime1
			v2 = bits.RotateLeft64(v2+binary.LittleEndian.Uint64(q[8:16])*xxPrime2, 31) * xxPrime1
			v3 = bits.RotateLeft64(v3+binary.LittleEndian.Uint64(q[16:24])*xxPrime2, 31) * xxPrime1
			v4 = bits.RotateLeft64(v4+binary.LittleEndian.Uint64(q[24:32])*xxPrime2, 31) * xxPrime1
		}
		p = p[i:]
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMergeRound(h, v1)
		h = xxMergeRound(h, v2)
		h = xxMergeRound(h, v3)
		h = xxMergeRound(h, v4)
	} else {
		h = seed + xxPrime5
	}
	h += uint64(n)
	for ; len(p) >= 8; p = p[8:] {
		k1 := xxRound(0, binary.LittleEndian.Uint64(p[:8]))
		h ^= k1
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	if len(p) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(p[:4])) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
		p = p[4:]
	}
	for _, c := range p {
		h ^= uint64(c) * xxPrime5
		h = bits.RotateLeft64(h, 11) * xxPrime1
	}
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}
