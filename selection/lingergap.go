package selection

import "sync/atomic"

// Released context taken off the lingering context once its agent is
// presumed ended (Options.LingerGap). The pair term counts what requests
// released on a replica and their successors have not taken back yet
// (loadCell.linger), until nothing was released there for the linger TTL:
// on a busy replica an agent that ended keeps counting, and a replica
// whose agents all ended counts them whole for the TTL. Here each release
// also leaves an entry on its replica with a life of LingerGap times its
// agent's last interval between two requests (found by the prompt's tips,
// as reserveChain finds an earlier step in flight). The agent's next
// request takes its entry back; an entry whose life passes first takes
// its tokens off the linger. A decay instead (Options.LingerHalfLife)
// also shrinks the context of agents between two steps, which then no
// longer keep new agents off their replica (bench/EXPERIMENTS.md 62).

// maxGapEntries bounds a replica's entries; past it the one that expires
// first is dropped (its tokens stay in the linger until the TTL).
const maxGapEntries = 64

// gapLifeMin bounds an entry's life from below (ms).
const gapLifeMin = 1000

// gapEntry is one released context: the prompt's tips (Reservation.tips),
// its tokens, when its request arrived, and its release time and life (the
// router's clock, ms).
type gapEntry struct {
	tips            [4]uint64
	depths          [4]int32
	tokens          int32
	born, rel, life uint32
}

// gapSet is a replica's entries, under its chainList's mu.
type gapSet struct{ e []gapEntry }

// gapLifeMax is the longest an entry lives (ms): the linger TTL, or
// DefaultLingerTTL when that is forever.
func (rt *Router) gapLifeMax() uint32 {
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

// drop removes entry i.
func (g *gapSet) drop(i int) {
	g.e[i] = g.e[len(g.e)-1]
	g.e = g.e[:len(g.e)-1]
}

// prune drops the entries expired at now, and takes their tokens off sub
// unless nil.
func (g *gapSet) prune(now uint32, sub *atomic.Int32) {
	for i := 0; i < len(g.e); {
		if e := &g.e[i]; now-e.rel >= e.life {
			if sub != nil {
				subFloor(sub, e.tokens)
			}
			g.drop(i)
			continue
		}
		i++
	}
}

// take removes the entry a prompt of blocks extends (its whole prompt or
// 15/16 of it: the same agent's, not another of its group) and reports
// when that entry's request arrived.
func (g *gapSet) take(blocks []uint64) (uint32, bool) {
	nb := int32(len(blocks))
	for i := range g.e {
		e := &g.e[i]
		for k, d := range e.depths[:2] {
			if d > 0 && d <= nb && blocks[d-1] == e.tips[k] {
				born := e.born
				g.drop(i)
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
		g.drop(first)
	}
	g.e = append(g.e, gapEntry{tips: r.tips, depths: r.depths, tokens: tokens, born: r.born, rel: now, life: life})
}

// gapPrune takes slot s's entries presumed ended at now off its linger.
func (rt *Router) gapPrune(s Slot, now uint32) {
	l := &rt.chains[s]
	l.mu.Lock()
	l.gaps.prune(now, &rt.loads[s].linger)
	l.mu.Unlock()
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
