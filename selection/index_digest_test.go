package selection

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// indexDigestWant are the digests TestIndexDigest got from the index of
// main at e50bb05, before the learn's rework (perf13): the rework must
// leave every belief, order, stamp, count and byte where it was.
var indexDigestWant = map[int64]uint64{
	24 << 10:  0x629e4d533434d494,
	64 << 10:  0x7cc09dadd19872bc,
	256 << 10: 0xb708223592abeee,
	1 << 20:   0x2531af2edebcc94d,
	64 << 20:  0xe64ce1f39617ffc0,
}

// indexDigest drives an index through a seeded random sequence of every
// operation that changes it (learns of long chains, resends and
// extensions, prompts with repeated blocks, replies, capacities, horizons,
// forgets, releases) on 70 slots, under budget bytes, and digests what it
// believes after each: the global LRU order, every replica's list with
// its stamps, the learns' ages, depths, counts and bytes.
func indexDigest(budget int64) uint64 {
	r := rand.New(rand.NewPCG(13, uint64(budget)))
	x := NewIndex(budget)
	d := xxhash.New()
	put := func(v uint64) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		d.Write(b[:])
	}
	const slots = 70
	var prompts [][]uint64
	var interest SlotSet
	for s := range Slot(slots) {
		interest.Add(s)
	}
	next := uint64(1 << 40)
	for op := 0; op < 4000; op++ {
		s := Slot(r.IntN(slots))
		if r.IntN(3) > 0 {
			s = Slot(r.IntN(6)) // a few busy replicas: long lists
		}
		switch k := r.IntN(100); {
		case k < 3:
			x.SetCapacity(s, int64(r.IntN(3000)))
		case k < 7:
			x.SetHorizon(s, int64(r.IntN(4000)))
		case k < 8:
			x.Forget(s)
		case k < 9:
			x.release(s)
		case k < 12 && len(prompts) > 0:
			p := prompts[r.IntN(len(prompts))]
			if len(p) > 0 {
				x.Replied(p[len(p)-1], s, r.IntN(40))
			}
		case k < 14 && len(prompts) > 0:
			p := prompts[r.IntN(len(prompts))]
			if len(p) > 0 {
				x.dropReply(p[len(p)-1], s)
			}
		default:
			var p []uint64
			switch {
			case len(prompts) > 0 && k < 55:
				// Resend, cut or extend an earlier prompt.
				p = slices.Clone(prompts[r.IntN(len(prompts))])
				if r.IntN(3) == 0 {
					p = p[:r.IntN(len(p)+1)]
				}
				for range r.IntN(3) * r.IntN(200) {
					p = append(p, next)
					next++
				}
			case k < 70:
				for range r.IntN(60) {
					p = append(p, r.Uint64N(400)) // repeats within and across prompts
				}
			default:
				// A fresh long chain.
				for range 1 + r.IntN(1100) {
					p = append(p, next)
					next++
				}
			}
			prompts = append(prompts, p)
			putLearn(put, x, p, s, r.IntN(len(p)+2), interest, slots)
		}
		putState(put, x, slots, op%16 == 0)
	}
	if err := x.checkTables(); err != nil {
		panic(fmt.Sprintf("budget %d: %v", budget, err))
	}
	if testing.Verbose() {
		fmt.Printf("budget %d: entries %d pairs %d bytes %d evictions %d dropped %d\n", budget, x.Entries(), x.Pairs(), x.Bytes(), x.Evictions(), x.Dropped())
	}
	return d.Sum64()
}

// TestIndexDigest checks that the index believes, op after op, exactly
// what the index before the rework believed (indexDigestWant), from an
// index that fits everything down to one that evicts at every learn.
func TestIndexDigest(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	for _, budget := range []int64{24 << 10, 64 << 10, 256 << 10, 1 << 20, 64 << 20} {
		got := indexDigest(budget)
		want, ok := indexDigestWant[budget]
		if !ok {
			t.Errorf("budget %d: digest %#x, none recorded", budget, got)
			continue
		}
		if got != want {
			t.Errorf("budget %d: digest %#x, want %#x", budget, got, want)
		}
	}
}

// putLearn learns p on s (n: the learn's reply depth argument) and puts
// what the learn returned and every slot's depth of p after it.
func putLearn(put func(uint64), x *Index, p []uint64, s Slot, n int, interest SlotSet, slots int) {
	put(uint64(x.learn(p, s, n)))
	var depth [MaxReplicas]int32
	x.Depths(p, interest, &depth)
	for _, v := range depth[:slots] {
		put(uint64(v))
	}
}

// putState puts the index's counts and, when full, what it believes: the
// global LRU order and every replica's list with its stamps, held tokens,
// clock, capacity and horizon.
func putState(put func(uint64), x *Index, slots int, full bool) {
	put(uint64(x.Entries()))
	put(uint64(x.Pairs()))
	put(uint64(x.Bytes()))
	put(x.Evictions())
	put(x.Dropped())
	if !full {
		return
	}
	g, reps := x.state(slots)
	put(uint64(len(g)))
	for _, k := range g {
		put(k)
	}
	for s := range Slot(slots) {
		put(uint64(len(reps[s])))
		for _, p := range reps[s] {
			put(p.key)
			put(uint64(p.stamp))
		}
		put(uint64(x.Held(s)))
		put(uint64(x.clockOf(s)))
		put(uint64(x.Capacity(s)))
		put(uint64(x.Horizon(s)))
	}
}
