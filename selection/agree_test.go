package selection

import (
	"cmp"
	"slices"
	"testing"
)

// An answer holding a quarter of the prompt (and two blocks) more than
// this instance ever sent the replica is another instance's placement: the
// agreement band turns on, and goes off AgreeMemory answers after the
// last such one. Answers that confirm the index, or exceed it by an
// agent's reply (a few blocks of a long prompt), do not turn it on.
func TestAgreementSeenInAnswers(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	rt, cands := newTestRouter(t, c, 2)
	route := func(blocks []uint64) *Reservation {
		var res Reservation
		_, r := rt.Route(features(rt.Config(), blocks, 0), cands, NewScratch(2), nil, &res)
		r.Release()
		return r
	}
	long := blocksOf(1, 64)
	rt.Observe(route(long[:60]), 0, 0, 0)      // cold, as predicted
	rt.Observe(route(long), 0, (60+3)*16, 0)   // 60 known + 3 blocks of reply
	rt.Observe(route(blocksOf(2, 8)), 0, 0, 0) // cold, as predicted
	if rt.Several() {
		t.Fatal("on after answers that only confirm the index or exceed it by a reply")
	}
	// A prompt this instance never sent, of which the engine held 6 of 8
	// blocks: another instance sent it there.
	if rt.Observe(route(blocksOf(3, 8)), 0, 6*16, 0); !rt.Several() {
		t.Fatal("off after an answer holding 6 of 8 blocks this instance never sent")
	}
	confirm := func() {
		r := route(blocksOf(2, 8))
		rt.Observe(r, 0, int(r.predicted)*16, 0)
	}
	for range AgreeMemory - 1 {
		confirm()
	}
	if !rt.Several() {
		t.Fatal("off before AgreeMemory answers passed")
	}
	confirm()
	if rt.Several() {
		t.Fatal("still on AgreeMemory answers after the last foreign one")
	}
}

// Two instances that know different loads agree on a cold prompt's
// replica once the band is on: instance B, whose own in-flight request
// sits on the replica instance A (idle) picks by rendezvous, goes
// elsewhere without the band and to A's replica with it; a prompt longer
// than AgreeMax and a precise candidate are left to the rule.
func TestAgreementBand(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	a, cands := newTestRouter(t, c, 8)
	b, _ := newTestRouter(t, c, 8)
	s := NewScratch(8)
	prompt := blocksOf(7, 40) // 640 tokens
	fa := features(a.Config(), prompt, 0)
	da := a.Pick(fa, cands, s)
	if da.Reason != ReasonCold || da.Tie != TieRendezvous {
		t.Fatalf("A: %v/%v, want a cold rendezvous pick", da.Reason, da.Tie)
	}
	// B's own request (another prompt) still prefilling on A's pick: not
	// a band target (a burst of one prefix would pile onto it).
	rb := b.Reserve(da.Slot, 2000)
	defer rb.Release()
	on := b.WithOptions(Options{AgreeAlways: true})
	if d := on.Pick(fa, cands, s); d.Slot == da.Slot {
		t.Fatal("the band sent the prompt to a replica still prefilling B's own request")
	}
	// Past its first token: decoding, still B's load there.
	off := b.WithOptions(Options{AgreeBand: -1, AgreeAlways: true})
	if d := off.Pick(fa, cands, s); d.Slot == da.Slot {
		t.Fatalf("B without the band picked A's replica %d despite its own load there", d.Slot)
	}
	if d := b.Pick(fa, cands, s); d.Slot == da.Slot {
		t.Fatal("the band applied before any answer showed another instance")
	}
	rb.PrefillDone()
	if d := on.Pick(fa, cands, s); d.Slot != da.Slot {
		t.Fatalf("B with the band picked %d, A %d", d.Slot, da.Slot)
	}
	// B's load beyond the band: the rule's pick again.
	var rb2 []*Reservation
	for range DefaultAgreeBand/DefaultRequestCost + 1 {
		r := b.Reserve(da.Slot, 0)
		r.PrefillDone()
		rb2 = append(rb2, r)
	}
	if d := on.Pick(fa, cands, s); d.Slot == da.Slot {
		t.Fatal("the band outweighed load past its width")
	}
	for _, r := range rb2 {
		r.Release()
	}
	// A prompt past AgreeMax (without the home band, TestAgreementHomeBand),
	// and a precise candidate: left to the rule.
	short := b.WithOptions(Options{AgreeAlways: true, AgreeMax: 320, AgreeHome: -1})
	if d := short.Pick(fa, cands, s); d.Slot == da.Slot {
		t.Fatalf("the band applied to a prompt longer than AgreeMax: %+v", d)
	}
	pc := append([]Candidate(nil), cands...)
	pc[0].Precise = true
	if d, want := on.Pick(fa, pc, s), off.Pick(fa, pc, s); d.Slot != want.Slot {
		t.Fatalf("with a precise candidate the band moved the pick to %d from %d", d.Slot, want.Slot)
	}
}

// agentBlocks is an agent's prompt: the fleet-wide prefix's blocks, then
// n blocks of the agent's own context, chained.
func agentBlocks(prefix, agent, n int) []uint64 {
	toks := make([]uint32, 0, prefix+n)
	for i := range prefix {
		toks = append(toks, uint32(i))
	}
	for i := range n {
		toks = append(toks, uint32(agent)*1_000_003+uint32(i)+1<<30)
	}
	return AppendTokenBlocks(nil, 1, toks, 1)
}

// The home band: a prompt longer than AgreeMax of which this instance
// knows only a prefix several replicas hold (an agent's turn whose
// context another instance placed) goes where every instance sends that
// agent's first turn, the highest rendezvous weight for the agent's own
// first block, although the instances' loads differ; a prompt with a home
// in this instance's view is left to the rule.
func TestAgreementHomeBand(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	a, cands := newTestRouter(t, c, 8)
	b, _ := newTestRouter(t, c, 8)
	s := NewScratch(8)
	const prefix = 32 // blocks every replica holds in both views
	for _, rt := range []*Router{a, b} {
		pf := features(a.Config(), agentBlocks(prefix, 0, 0), 0)
		for i := range cands {
			rt.Learn(pf, cands[i].Slot)
		}
	}
	opt := Options{AgreeAlways: true, AgreeMax: 320}
	ha, hb := a.WithOptions(opt), b.WithOptions(opt)
	// The agent's first turn through A (idle): its rendezvous replica.
	first := features(a.Config(), agentBlocks(prefix, 7, 40), 0)
	da := ha.Pick(first, cands, s)
	// B's own requests on A's pick, one still prefilling (another
	// agent's turn): B's rule would go elsewhere; the home band follows A.
	own := []*Reservation{b.Reserve(da.Slot, 2000)}
	for range 3 {
		r := b.Reserve(da.Slot, 0)
		r.PrefillDone()
		own = append(own, r)
	}
	defer func() {
		for _, r := range own {
			r.Release()
		}
	}()
	later := features(a.Config(), agentBlocks(prefix, 7, 90), 0) // a later turn
	off := b.WithOptions(Options{AgreeAlways: true, AgreeMax: 320, AgreeHome: -1})
	if d := off.Pick(later, cands, s); d.Slot == da.Slot {
		t.Fatalf("B without the home band picked A's replica %d despite its load there", d.Slot)
	}
	if d := hb.Pick(later, cands, s); d.Slot != da.Slot {
		t.Fatalf("B with the home band picked %d for the agent's later turn, A its first turn %d", d.Slot, da.Slot)
	}
	// Another agent goes elsewhere for some agent: the key is the agent's
	// own block, not the shared prefix.
	spread := map[Slot]bool{}
	for ag := range 16 {
		spread[ha.Pick(features(a.Config(), agentBlocks(prefix, 100+ag, 40), 0), cands, s).Slot] = true
	}
	if len(spread) < 4 {
		t.Fatalf("16 agents' first turns on %d replicas", len(spread))
	}
	// B knows the agent on a replica of its own choosing (a home): the
	// rule decides, as without the band.
	other := cands[(da.Index+1)%len(cands)].Slot
	b.Learn(first, other)
	if d, want := hb.Pick(later, cands, s), off.Pick(later, cands, s); d.Slot != want.Slot || d.Slot != other {
		t.Fatalf("with a home (%d) the home band picked %d, the rule %d", other, d.Slot, want.Slot)
	}
	// A stale home: B knows 40 blocks of the agent's 200 past the prefix
	// there (under AgreeStale): others have routed the agent since, to
	// where the band sends it.
	much := features(a.Config(), agentBlocks(prefix, 7, 200), 0)
	if d := hb.Pick(much, cands, s); d.Slot != da.Slot {
		t.Fatalf("B with a stale home %d picked %d, A placed the agent on %d", other, d.Slot, da.Slot)
	}
	noStale := b.WithOptions(Options{AgreeAlways: true, AgreeMax: 320, AgreeStale: -1})
	if d := noStale.Pick(much, cands, s); d.Slot != other {
		t.Fatalf("without AgreeStale B picked %d, its home is %d", d.Slot, other)
	}
}

// A lone instance whose index forgot a prompt's context (its horizon on a
// saturated replica) sees the engine hold more than predicted, as from
// another instance's placement: a surplus turns the band on only for a
// conversation or agent (its first block past what two replicas hold)
// this instance never had answered, for long prompts (AgreeMax 320) and
// short ones alike (a lone instance on the conversation trace at 65,536
// tokens of KV turned the band on 13-22 times a run: p99 1.10x
// dynamo-tuned's, 1.01x with this).
func TestAgreementOwnForgottenAgent(t *testing.T) {
	for _, max := range []int{320, 1 << 20} {
		const prefix = 32
		rt, route, forget := agreeAgents(t, max, prefix)
		turn1 := features(rt.Config(), agentBlocks(prefix, 5, 40), 0)
		r := route(turn1)
		rt.Observe(r, 0, int(r.predicted)*16, 0)
		forget() // the horizon dropped every belief
		turn2 := features(rt.Config(), agentBlocks(prefix, 5, 80), 0)
		if rt.Observe(route(turn2), 0, (prefix+40)*16, 0); rt.Several() {
			t.Fatalf("AgreeMax %d: on after the engine held a context this instance routed and forgot", max)
		}
		other := features(rt.Config(), agentBlocks(prefix, 6, 80), 0)
		if rt.Observe(route(other), 0, (prefix+40)*16, 0); !rt.Several() {
			t.Fatalf("AgreeMax %d: off after the engine held 40 blocks of a context this instance never routed", max)
		}
	}
}

// agreeAgents is a router of 4 replicas under AgreeMax max, each believed
// to hold the agents' shared prefix (prefix blocks); route routes and
// releases one request, forget drops every belief but that prefix (as a
// saturated replica's horizon does).
func agreeAgents(t *testing.T, max, prefix int) (rt *Router, route func(*Features) *Reservation, forget func()) {
	t.Helper()
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 4)
	rt = rt0.WithOptions(Options{AgreeMax: max})
	pf := features(rt.Config(), agentBlocks(prefix, 0, 0), 0)
	forget = func() {
		for i := range cands {
			rt.Forget(cands[i].Slot)
			rt.Learn(pf, cands[i].Slot)
		}
	}
	forget()
	route = func(f *Features) *Reservation {
		var res Reservation
		_, r := rt.Route(f, cands, NewScratch(4), nil, &res)
		r.Release()
		return r
	}
	return rt, route, forget
}

// An agent whose turns this instance routed precisely (the precise path:
// Observe does not compare those answers) is still one it routed: a later
// turn routed by the estimate, whose context the engine holds past the
// estimate's beliefs, is no other instance's placement. A lone precise
// instance read itself as several on the tool-agent trace 10 so
// (bench/EXPERIMENTS.md, section 115).
func TestAgreementPreciseAgent(t *testing.T) {
	const prefix = 32
	rt, route, forget := agreeAgents(t, 320, prefix)
	turn1 := route(features(rt.Config(), agentBlocks(prefix, 5, 40), 0))
	turn1.precise = true // decided on the engines' KV events
	rt.Observe(turn1, 0, prefix*16, 0)
	forget()
	turn2 := features(rt.Config(), agentBlocks(prefix, 5, 80), 0)
	if rt.Observe(route(turn2), 0, (prefix+40)*16, 0); rt.Several() {
		t.Fatal("on after the engine held a context this instance routed precisely")
	}
	other := features(rt.Config(), agentBlocks(prefix, 6, 80), 0)
	if rt.Observe(route(other), 0, (prefix+40)*16, 0); !rt.Several() {
		t.Fatal("off after the engine held 40 blocks of a context this instance never routed")
	}
}

// A burst of one prefix with the band on: once three replicas the band
// ranks above its choice are prefilling this instance's own requests,
// the rule's pick (here its instance spill) stands instead of the next
// replica in the shared order, which every instance would pile its burst
// onto; with two such replicas the band still walks on (agreement).
func TestAgreementBandBurst(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	rt, cands := newTestRouter(t, c, 8)
	rt.SetInstance("1")
	s := NewScratch(8)
	f := features(rt.Config(), blocksOf(7, 40), 0)
	order := make([]Slot, len(cands))
	for i := range cands {
		order[i] = cands[i].Slot
	}
	slices.SortFunc(order, func(x, y Slot) int {
		return cmp.Compare(rt.Rendezvous(f.Blocks[0], y), rt.Rendezvous(f.Blocks[0], x))
	})
	rt.Learn(f, order[0]) // the burst's first request went there
	r0, r1, r2 := rt.Reserve(order[0], 5000), rt.Reserve(order[1], 5000), rt.Reserve(order[2], 5000)
	defer r0.Release()
	defer r1.Release()
	on := rt.WithOptions(Options{AgreeAlways: true})
	off := rt.WithOptions(Options{AgreeAlways: true, AgreeBand: -1})
	walk := rt.WithOptions(Options{AgreeAlways: true, AgreeWalk: true})
	want := off.Pick(f, cands, s).Slot
	if want == order[3] {
		t.Fatalf("the rule's pick is the band's next replica %d: the test shows nothing", want)
	}
	if d := walk.Pick(f, cands, s); d.Slot != order[3] {
		t.Fatalf("walking, the band picked %d, want its next replica %d", d.Slot, order[3])
	}
	if d := on.Pick(f, cands, s); d.Slot != want {
		t.Fatalf("with three replicas ranked above prefilling its own requests the band picked %d, the rule %d", d.Slot, want)
	}
	r2.Release()
	if d := on.Pick(f, cands, s); d.Slot != order[2] {
		t.Fatalf("with two replicas ranked above prefilling the band picked %d, want the next one %d", d.Slot, order[2])
	}
}

// Two instances, each with its own requests on different idle replicas,
// place an agent's turns (past AgreeMax) where neither has load, by the
// agent's own first block: instance A its first turn, instance B (which
// never saw the agent) a later one, before any answer showed the other.
// By the fleet-wide prefix's block (NoAgentTie) each fills the same order
// with its own agents and they part; under SubsetGuardReplicas the rule
// is tieKey's.
func TestAgentTie(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	a0, cands := newTestRouter(t, c, SubsetGuardReplicas)
	b0, _ := newTestRouter(t, c, SubsetGuardReplicas)
	opt := Options{AgreeMax: 320}
	a, b := a0.WithOptions(opt), b0.WithOptions(opt)
	s := NewScratch(len(cands))
	const prefix = 32
	pf := features(a0.Config(), agentBlocks(prefix, 0, 0), 0)
	var own []*Reservation
	defer func() {
		for _, r := range own {
			r.Release()
		}
	}()
	// Both know the fleet-wide prefix on two replicas kept busy.
	for _, rt := range []*Router{a, b} {
		for _, i := range []int{0, 1} {
			rt.Learn(pf, cands[i].Slot)
			own = append(own, rt.Reserve(cands[i].Slot, 100_000))
		}
	}
	order := make([]Slot, 0, len(cands))
	for i := range cands[2:] {
		order = append(order, cands[2+i].Slot)
	}
	slices.SortFunc(order, func(x, y Slot) int {
		return cmp.Compare(a.Rendezvous(pf.Blocks[0], y), a.Rendezvous(pf.Blocks[0], x))
	})
	busy := func(rt *Router, slots []Slot) {
		for _, sl := range slots {
			r := rt.Reserve(sl, 0)
			r.PrefillDone()
			own = append(own, r)
		}
	}
	busy(a, order[:3]) // A's own agents on the prefix's first three
	busy(b, order[3:6])
	taken := map[Slot]bool{}
	for _, sl := range order[:6] {
		taken[sl] = true
	}
	agent := -1
	for ag := 1; ag < 100 && agent < 0; ag++ {
		f := features(a0.Config(), agentBlocks(prefix, ag, 10), 0)
		key := f.Blocks[prefix]
		top, best := Slot(0), uint64(0)
		for _, sl := range order {
			if w := a.Rendezvous(key, sl); w > best {
				top, best = sl, w
			}
		}
		if !taken[top] {
			agent = ag
		}
	}
	if agent < 0 {
		t.Fatal("no agent whose own first block ranks an idle replica first")
	}
	first := features(a0.Config(), agentBlocks(prefix, agent, 10), 0)
	later := features(a0.Config(), agentBlocks(prefix, agent, 30), 0)
	if da, db := a.Pick(first, cands, s), b.Pick(later, cands, s); da.Slot != db.Slot {
		t.Fatalf("A placed the agent's first turn on %d, B its later turn on %d", da.Slot, db.Slot)
	}
	na, nb := a.WithOptions(Options{AgreeMax: 320, NoAgentTie: true}), b.WithOptions(Options{AgreeMax: 320, NoAgentTie: true})
	if da, db := na.Pick(first, cands, s), nb.Pick(later, cands, s); da.Slot == db.Slot {
		t.Fatalf("by the prefix's block A and B agreed on %d: the test shows nothing", da.Slot)
	}
	small := cands[:SubsetGuardReplicas-1]
	if d, want := a.Pick(first, small, s), na.Pick(first, small, s); d.Slot != want.Slot {
		t.Fatalf("under %d replicas the agent's tie picked %d, tieKey's %d", SubsetGuardReplicas, d.Slot, want.Slot)
	}
}

// With AgreeExt, engine-reported load this instance did not reserve turns
// the agreement band on before any answer shows another instance: B, with
// its own decoding request on A's cold pick, goes there once a scrape
// reports someone else's request anywhere; without AgreeExt, or before
// the scrape, the rule's pick. A lone instance (no external load) is left
// as it is.
func TestAgreementOnEngineLoad(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	a, cands := newTestRouter(t, c, 8)
	b, _ := newTestRouter(t, c, 8)
	s := NewScratch(8)
	fa := features(a.Config(), blocksOf(7, 40), 0)
	da := a.Pick(fa, cands, s)
	rb := b.Reserve(da.Slot, 2000)
	defer rb.Release()
	rb.PrefillDone()
	ext := b.WithOptions(Options{AgreeExt: true})
	if d := ext.Pick(fa, cands, s); d.Slot == da.Slot {
		t.Fatal("AgreeExt applied the band with no external load seen")
	}
	other := (da.Slot + 1) % 8
	b.SetExternalLoad(other, 1, 0, 0)
	if d := ext.Pick(fa, cands, s); d.Slot != da.Slot {
		t.Fatalf("AgreeExt after a scrape showing others: picked %d, A %d", d.Slot, da.Slot)
	}
	if d := b.Pick(fa, cands, s); d.Slot == da.Slot {
		t.Fatal("the band applied on external load without AgreeExt")
	}
}
