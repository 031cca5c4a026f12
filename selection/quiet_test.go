package selection

import (
	"math"
	"testing"
)

// TestQuietLoadMatchesTerms checks loadWith's quiet case (a slot with
// every load figure zero) against the terms it skips, bit for bit: for
// prompts below and past the slot's KV capacity, with the home's overflow
// exemption, the pair term on and off, a hit or none, and the options that
// change the terms (weights, floors, the bare rule).
func TestQuietLoadMatchesTerms(t *testing.T) {
	cfgs := map[string]func(*Config){
		"defaults": func(*Config) {},
		"no pair":  func(c *Config) { c.PairWeight, c.Explicit = 0, c.Explicit|KnobPairWeight },
		"context":  func(c *Config) { c.ContextWeight = 3 },
	}
	opts := map[string]Options{
		"rule":        {},
		"weight":      {OverflowWeight: 0.5},
		"no overflow": {OverflowWeight: -1}, // bare with "no pair"
		"floor":       {PairFloor: -1, PairSqrt: true, PairShare: true, PairSat: true},
		"caps":        {PairCap: 0.5, LingerCap: 0.25, NoLinger: true, LingerTTL: -1},
	}
	for cname, set := range cfgs {
		var c Config
		set(&c)
		for oname, o := range opts {
			base, _ := newTestRouter(t, c, 2)
			rt := base.WithOptions(o)
			rt.SetCapacity(1, 4096)
			k := rt.loadKnobs()
			if !k.quiet {
				t.Fatalf("%s/%s: quiet off", cname, oname)
			}
			for _, s := range []Slot{0, 1} {
				if !rt.loads[s].idle() {
					t.Fatalf("slot %d not idle", s)
				}
				for _, prompt := range []int{0, 1, 4000, 4096, 5000, 1 << 19} {
					for _, hit := range []int{-1, 0, 64} {
						for _, pairOn := range []bool{false, true} {
							for _, owOff := range []bool{false, true} {
								q := k
								q.owOff = owOff
								full := q
								full.quiet = false
								got, gn := rt.loadWith(&q, s, prompt, pairOn, 7, hit)
								want, wn := rt.loadWith(&full, s, prompt, pairOn, 7, hit)
								if math.Float64bits(got) != math.Float64bits(want) || gn != wn {
									t.Errorf("%s/%s slot %d prompt %d hit %d pair %v home %v: quiet %v (%d), terms %v (%d)",
										cname, oname, s, prompt, hit, pairOn, owOff, got, gn, want, wn)
								}
							}
						}
					}
				}
			}
		}
	}
	// Anything on the slot turns the quiet case off.
	rt, _ := newTestRouter(t, Config{}, 1)
	for name, set := range map[string]func(c *loadCell){
		"inflight": func(c *loadCell) { c.inflight.Store(1) },
		"pending":  func(c *loadCell) { c.pending.Store(1) },
		"resident": func(c *loadCell) { c.resident.Store(1) },
		"requests": func(c *loadCell) { c.ext.requests.Store(1) },
		"prefill":  func(c *loadCell) { c.ext.prefill.Store(1) },
		"kv":       func(c *loadCell) { c.ext.kv.Store(1) },
		"context":  func(c *loadCell) { c.extCtx.Store(1) },
		"linger":   func(c *loadCell) { c.linger.Store(-1) },
	} {
		c := &rt.loads[0]
		*c = loadCell{}
		c.inflight.Store(5 << 32) // a generation alone is idle
		if !c.idle() {
			t.Errorf("a generation alone: not idle")
		}
		set(c)
		if c.idle() {
			t.Errorf("%s set: idle", name)
		}
	}
	// Options that read other state keep the terms.
	for name, o := range map[string]Options{"shared once": {SharedOnce: true}, "once below": {OnceBelow: 2},
		"engine overflow": {EngineOverflow: true}, "engine queue": {EngineQueue: 1}} {
		if k := rt.WithOptions(o).loadKnobs(); k.quiet {
			t.Errorf("%s: quiet on", name)
		}
	}
}
