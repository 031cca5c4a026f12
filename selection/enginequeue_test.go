package selection

import "testing"

// TestEngineQueue: the others' waiting requests an engine reported
// (SetExternalLoad) cost Options.EngineQueue tokens each beside
// request_cost, so that a turn leaves a home whose engine queue is long
// though this instance sent none of it; running requests, a stale scrape
// (zeros) and this instance's own requests are charged as by the rule.
func TestEngineQueue(t *testing.T) {
	base, cands := newTestRouter(t, Config{BlockTokens: 16}, 3)
	cost := float64(base.Config().RequestCost)
	f := features(base.Config(), blocksOf(1, 64), 0) // 1,024 tokens
	base.Learn(f, cands[0].Slot)                     // the home
	s := NewScratch(len(cands))
	home, other := cands[0].Slot, cands[1].Slot

	pick := func(o Options) (Decision, []float64) {
		t.Helper()
		d := base.WithOptions(o).Pick(f, cands, s)
		return d, append([]float64(nil), s.Load...)
	}
	on := Options{EngineQueue: 1024}

	// One of the others' requests waits at home.
	base.SetExternalLoad(home, 0, 1, 0)
	if d, ld := pick(Options{}); d.Slot != home || ld[0] != cost {
		t.Fatalf("off: slot %d, loads %v; want home %d at %v", d.Slot, ld, home, cost)
	}
	if d, ld := pick(on); d.Slot == home || ld[0] != cost+1024 {
		t.Fatalf("on: slot %d, loads %v; want away from home %d, load %v there", d.Slot, ld, home, cost+1024)
	}

	// Every replica pays it.
	base.SetExternalLoad(other, 0, 1, 0)
	if _, ld := pick(on); ld[1] != cost+1024 {
		t.Fatalf("on: loads %v; want %v on the other waiting replica", ld, cost+1024)
	}
	base.SetExternalLoad(other, 0, 0, 0)

	// EngineQueueSat scales it by the fleet's mean of the others'
	// waiting requests per replica (here 1 of 3 replicas: 1/3) over
	// EngineQueueSat, at most 1.
	sat := func(x float64) Options { return Options{EngineQueue: 1024, EngineQueueSat: x} }
	base.SetExternalLoad(home, 0, 1, 0)
	if _, ld := pick(sat(2.0 / 3)); ld[0] != cost+512 {
		t.Fatalf("sat 2/3: loads %v; want %v at home", ld, cost+512)
	}
	if _, ld := pick(sat(0.25)); ld[0] != cost+1024 {
		t.Fatalf("sat 0.25: loads %v; want %v at home", ld, cost+1024)
	}
	base.SetExternalLoad(other, 0, 2, 0) // mean 1: the whole charge
	if _, ld := pick(sat(1)); ld[0] != cost+1024 || ld[1] != 2*cost+2048 {
		t.Fatalf("sat 1, mean 1: loads %v; want [%v %v 0]", ld, cost+1024, 2*cost+2048)
	}
	base.SetExternalLoad(other, 0, 0, 0)
	if _, ld := pick(sat(1)); ld[0] != cost+1024.0/3 {
		t.Fatalf("sat 1, mean 1/3: loads %v; want %v at home", ld, cost+1024.0/3)
	}

	// Running requests are charged request_cost only.
	base.SetExternalLoad(home, 1, 0, 0)
	if d, ld := pick(on); d.Slot != home || ld[0] != cost {
		t.Fatalf("running: slot %d, loads %v; want home at %v", d.Slot, ld, cost)
	}

	// A stale scrape (zeros): local reservations only.
	base.SetExternalLoad(home, 0, 0, 0)
	if d, ld := pick(on); d.Slot != home || ld[0] != 0 {
		t.Fatalf("stale: slot %d, loads %v; want home at 0", d.Slot, ld)
	}

	// A lone instance's own request waiting there is not the others'.
	res := base.Reserve(home, 100)
	defer res.Release()
	if d, ld := pick(on); d.Slot != home || ld[0] != cost+100 {
		t.Fatalf("own request: slot %d, loads %v; want home at %v", d.Slot, ld, cost+100)
	}
}
