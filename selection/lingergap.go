package selection

import (
	"math"
	"sync/atomic"
)

// Released context that expires on its own agent's pace (Options.LingerGap):
// each release leaves an entry on its replica, which the agent's next
// request there takes back (found by its prompt's tips, as reserveChain
// finds an earlier step in flight) and which otherwise counts in the pair
// term until LingerGap times the agent's last interval between two
// requests has passed since the release: an agent that does not come
// back by then is presumed ended. A replica-wide TTL instead keeps an
// ended agent's context whole while any other request releases there, and
// a half-life decays a live agent's context between its turns.

// maxGapEntries bounds a replica's lingering entries; past it the entry
// that expires first is dropped.
const maxGapEntries = 64

// gapLifeMin bounds an entry's life from below (ms).
const gapLifeMin = 1000

// gapEntry is one released context: the prompt's tips (Reservation.tips),
// its tokens, its release time and life (the router's clock, ms).
type gapEntry struct {
	tips            [4]uint64
	depths          [4]int32
	tokens          int32
	born, rel, life uint32
}

// gapSet is a replica's lingering entries, under its chainList's mu.
type gapSet struct {
	e   []gapEntry
	sum int64 // tokens of e
}

// gapLifeMax is the longest an entry lingers (ms): Options.LingerGapMax,
// else the linger TTL, or DefaultLingerTTL when that is forever.
func (rt *Router) gapLifeMax() uint32 {
	if m := rt.opt.LingerGapMax; m > 0 {
		return uint32(min(m.Milliseconds(), math.MaxUint32))
	}
	if _, ttl := rt.lingerOn(); ttl > 0 {
		return ttl
	}
	return uint32(DefaultLingerTTL.Milliseconds())
}

// gapLife is the life of an entry whose agent's last interval between
// requests was iv ms (0: unknown, the longest).
func (rt *Router) gapLife(iv uint32) uint32 {
	hi := rt.gapLifeMax()
	if iv == 0 {
		return hi
	}
	return min(hi, max(gapLifeMin, uint32(rt.opt.LingerGap*float64(iv))))
}

// prune drops the entries expired at now, and takes their tokens off
// sub unless nil.
func (g *gapSet) prune(now uint32, sub *atomic.Int32) {
	for i := 0; i < len(g.e); {
		if e := &g.e[i]; now-e.rel >= e.life {
			if sub != nil {
				subFloor(sub, e.tokens)
			}
			g.sum -= int64(e.tokens)
			g.e[i] = g.e[len(g.e)-1]
			g.e = g.e[:len(g.e)-1]
			continue
		}
		i++
	}
}

// take removes the entry a prompt of blocks extends (its whole prompt or
// 15/16 of it: the same agent's, not another of its group) and reports
// when its request arrived.
func (g *gapSet) take(blocks []uint64) (uint32, bool) {
	nb := int32(len(blocks))
	for i := range g.e {
		e := &g.e[i]
		for k, d := range e.depths[:2] {
			if d > 0 && d <= nb && blocks[d-1] == e.tips[k] {
				born := e.born
				g.sum -= int64(e.tokens)
				g.e[i] = g.e[len(g.e)-1]
				g.e = g.e[:len(g.e)-1]
				return born, true
			}
		}
	}
	return 0, false
}

// put adds r's released context of tokens at now.
func (g *gapSet) put(r *Reservation, tokens int32, now, life uint32) {
	if len(g.e) >= maxGapEntries {
		g.prune(now, nil)
	}
	if len(g.e) >= maxGapEntries {
		first := 0
		for i := range g.e {
			if g.e[i].rel+g.e[i].life-now < g.e[first].rel+g.e[first].life-now {
				first = i
			}
		}
		g.sum -= int64(g.e[first].tokens)
		g.e[first] = g.e[len(g.e)-1]
		g.e = g.e[:len(g.e)-1]
	}
	g.e = append(g.e, gapEntry{tips: r.tips, depths: r.depths, tokens: tokens, born: r.born, rel: now, life: life})
	g.sum += int64(tokens)
}

// gapLinger is slot s's lingering context at now under Options.LingerGap.
func (rt *Router) gapLinger(s Slot, now uint32) int64 {
	l := &rt.chains[s]
	l.mu.Lock()
	defer l.mu.Unlock()
	var sub *atomic.Int32
	if rt.opt.LingerGapSub {
		sub = &rt.loads[s].linger
	}
	l.gaps.prune(now, sub)
	return l.gaps.sum
}

// lingerPut leaves r's released context of tokens on its replica.
func (rt *Router) lingerPut(r *Reservation, tokens int32) {
	life := r.life
	if life == 0 {
		life = rt.gapLife(0)
	}
	l := &rt.chains[r.slot]
	l.mu.Lock()
	l.gaps.put(r, tokens, rt.clockMS(), life)
	l.mu.Unlock()
}
