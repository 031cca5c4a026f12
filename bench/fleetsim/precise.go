package fleetsim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// Defaults of the "ramjet-precise" policy.
const (
	// DefaultKVEventDelay is how long a KV event takes from the engine to
	// the index: the ZMQ hop plus decoding, in simulated time.
	DefaultKVEventDelay = 5 * time.Millisecond
	// DefaultPredictTTL bounds how long a routed, unconfirmed block counts
	// for its replica's overlap while its request runs: the module's
	// kv_predict_ttl default (kvindex.DefaultPredictTTL).
	DefaultPredictTTL = kvindex.DefaultPredictTTL
	// DefaultPredictGrace is how long such a block still counts after its
	// request ended (kvindex.DefaultPredictGrace).
	DefaultPredictGrace = kvindex.DefaultPredictGrace
)

// PreciseConfig configures the precise index of "ramjet-precise". Zero
// fields take the defaults.
type PreciseConfig struct {
	// Delay is the delivery delay of every KV event (DefaultKVEventDelay).
	// Events reach the index Delay after the engine emitted them.
	Delay time.Duration
	// PredictTTL bounds the life of predicted entries (DefaultPredictTTL).
	// A prediction lives until its BlockStored is delivered, or until
	// PredictGrace after its request ended (Done), at most PredictTTL.
	PredictTTL time.Duration
	// PredictGrace is the life of an unconfirmed prediction after its
	// request ended (DefaultPredictGrace).
	PredictGrace time.Duration
	// TokenizeMiss is the share of decisions whose tokenize preflight
	// misses its timeout (chosen per request by a hash of its id): the
	// request is routed by the estimate alone, and its token ids come
	// TokenizeLate after the decision. 0: every preflight answers in time.
	// The preflight's wait itself is not modelled (requests are sent at
	// once).
	TokenizeMiss float64
	// TokenizeLate is when a missed preflight's answer arrives after its
	// decision (default 150ms): the chosen replica's blocks are then held
	// as predicted entries until the request ends (kvindex.Late), unless
	// NoLate drops the answer (the behaviour before kvindex.Late), and with
	// it the cold start's (NoCold).
	TokenizeLate time.Duration
	NoLate       bool
	// NoCold turns off the cold start's preflight (kvindex.Precise.
	// ColdPreflight): by default a decision made while no feed is fresh
	// (Precise.Cold; no preflight waited for) still tokenizes in the
	// background, and its answer, TokenizeLate later, holds the chosen
	// replica's blocks whether or not its feed is fresh yet.
	NoCold bool
	// ExactPastEstimate credits every exact overlap even past the
	// router's estimate (kvindex.PreciseConfig.ExactPastEstimate): the
	// precise path before the estimate cap.
	ExactPastEstimate bool
	// CapForeign: kvindex.PreciseConfig.CapForeign.
	CapForeign bool
	// QueueEstimate: kvindex.PreciseConfig.QueueEstimate (0: its
	// default, negative: off).
	QueueEstimate float64
	// CapQueue: kvindex.PreciseConfig.CapQueue (0: off, the estimate
	// cap everywhere).
	CapQueue float64
	// CapLoad: kvindex.PreciseConfig.CapLoad (0: its default, the lift
	// stack's with CapPeer's, CapGain's and CapFit's; negative: off, the
	// estimate cap everywhere).
	CapLoad float64
	// CapPeer, CapPeerInflight: kvindex.PreciseConfig's (0: its default,
	// negative: off).
	CapPeer         float64
	CapPeerInflight bool
	// CapForeignQueue: kvindex.PreciseConfig.CapForeignQueue (0: its
	// default, negative: off).
	CapForeignQueue float64
	// CapGain, CapPeerSlack, CapFit: kvindex.PreciseConfig's (CapGain and
	// CapFit 0: their defaults, negative: off; CapPeerSlack 0: off).
	CapGain, CapPeerSlack float64
	CapGainMean           bool
	CapGainFleet          bool
	CapGainRoom           bool
	CapFit                float64
	// WaitRule applies the module's wait rule (kvindex.Precise.
	// WaitPreflight) to every decision, as to a request with no cached
	// message prefix (the simulation models no message-prefix cache): a
	// decision the rule does not wait for is routed by the estimate, its
	// tokens coming TokenizeLate later, as a missed preflight's.
	WaitRule bool
	// WaitWarm, with WaitRule: kvindex.PreciseConfig.WaitWarm (tokenize_wait
	// warm): a decision the estimate credits to no replica is not waited
	// for (kvindex.Precise.WaitFor).
	WaitWarm bool
	// MaxEntries is the index budget in (replica, block) entries; 0 sizes
	// it past what the engines can hold, so that it never evicts (the
	// kvindex README: size it to the fleet's total KV blocks).
	MaxEntries int
	// OwnScale, when positive, scales the index's own-block memory:
	// kvindex.Config.MaxPredicted (65,536) and MaxOwnGone (4 x it) times
	// OwnScale (a probe of whether the estimate cap loses its marks on
	// long overloaded traces; 0: the defaults).
	OwnScale float64
}

// RamjetPrecise is the "ramjet-precise" policy: Ramjet's Route call with
// the module's precise-path service (kvindex.Precise) as its annotator,
// the same code the Caddy module runs. Per decision, when some feed is
// fresh (when production sends the tokenize preflight), the request's token
// ids stand for the preflight's answer; Precise.Annotate gives every
// candidate whose feed is fresh its exact overlap, the others keep the
// approximate estimate, Pick decides, and only after a precise decision
// are the picked replica's blocks recorded as predicted entries, as in
// production. The approximate index keeps learning every decision, so a
// replica whose feed is not fresh is still routed by a live estimate.
//
// The index is fed in simulated time: every engine's KV events (BlockStored
// with token ids, BlockRemoved, AllBlocksCleared) are queued as emitted and
// applied Delay later, in emission order, so a decision sees only what
// ZMQ would have delivered by then. The preflight's latency is not
// modelled. The policies NewPolicy names (ramjet-precise and its @
// variants) apply the module's default wait rule (WaitRule) unless
// flagged always; NewRamjetPrecise's zero PreciseConfig waits for every
// preflight (tokenize { wait always }).
type RamjetPrecise struct {
	*Ramjet
	pc PreciseConfig

	x     *kvindex.Index
	reps  []kvindex.Replica // by replica index
	clock time.Duration     // the index's clock (simulated)
	now   time.Duration     // the decision being made

	queue []queuedKV // emitted, not yet delivered, in emission order
	qhead int
	batch kvindex.Batch

	engines []*engine.Engine // by replica index, for their clocks
	// held maps a request decided with the precise path (so holding
	// predictions) to the candidate it was routed to, until Done.
	held map[int]int
	// late are the missed preflights' answers still to come, in order;
	// routed the requests routed and not yet done.
	late   []lateAnswer
	routed map[int]bool

	// Misses counts decisions routed by the estimate because their
	// preflight missed its timeout; LateHolds those whose late answer
	// then predicted the chosen replica's blocks.
	Misses, LateHolds int
	// ColdHolds counts the decisions of the cold start whose background
	// preflight then predicted the chosen replica's blocks (NoCold).
	ColdHolds int

	// EventsQueued counts the KV events received from the engines.
	EventsQueued int

	// fp, when set (the "fp" variant, the module's foreign_prefill), is
	// the estimate of the other instances' prefill, driven as the module
	// drives it (selection.ForeignPrefill's lifecycle): fed by the index's
	// stored runs, refreshed before each decision, credited with each
	// reservation and each first token.
	fp *selection.ForeignPrefill
	// sent is when each request with a reservation was routed (fp on):
	// its first token teaches fp the engines' prefill speed.
	sent map[int]time.Duration
	// born is the same until the request ends: its life teaches fp the
	// others' contexts' decay (Lived).
	born map[int]time.Duration
}

// SetForeignPrefill turns the other instances' prefill estimate on (nil:
// off), before Run attaches the engines.
func (p *RamjetPrecise) SetForeignPrefill(fp *selection.ForeignPrefill) { p.fp = fp }

// PreciseDecisions counts decisions where at least one candidate had an
// exact overlap; ApproxDecisions those routed by the estimate alone (the
// module's ramjet_kv_decisions_total{mode}).
func (p *RamjetPrecise) PreciseDecisions() int {
	if p.pre == nil {
		return 0
	}
	n, _ := p.pre.Decisions()
	return int(n)
}

// ApproxDecisions: see PreciseDecisions.
func (p *RamjetPrecise) ApproxDecisions() int {
	if p.pre == nil {
		return 0
	}
	_, n := p.pre.Decisions()
	return int(n)
}

type queuedKV struct {
	rep int
	ev  engine.KVEvent
}

// kvFed is implemented by policies that read the engines' KV events in
// simulated time. Run calls attach once per replica before the first
// request, and setNow with the simulated time before every Pick.
type kvFed interface {
	attach(rep int, e *engine.Engine)
	setNow(now time.Duration)
}

var _ kvFed = (*RamjetPrecise)(nil)

// epoch anchors simulated durations on the index's wall clock.
var epoch = time.Unix(0, 0)

// NewRamjetPrecise returns the "ramjet-precise" policy with the router
// configuration cfg (zero fields: selection defaults) and the index
// configuration pc.
func NewRamjetPrecise(cfg selection.Config, pc PreciseConfig) (*RamjetPrecise, error) {
	if pc.Delay < 0 || pc.PredictTTL < 0 || pc.PredictGrace < 0 || pc.MaxEntries < 0 || pc.TokenizeLate < 0 {
		return nil, fmt.Errorf("ramjet-precise: delay, predict TTL, predict grace, tokenize late and max entries must be >= 0")
	}
	if pc.TokenizeMiss < 0 || pc.TokenizeMiss > 1 {
		return nil, fmt.Errorf("ramjet-precise: tokenize miss must be in [0, 1]")
	}
	if pc.TokenizeLate == 0 {
		pc.TokenizeLate = 150 * time.Millisecond
	}
	if pc.Delay == 0 {
		pc.Delay = DefaultKVEventDelay
	}
	if pc.PredictTTL == 0 {
		pc.PredictTTL = DefaultPredictTTL
	}
	if pc.PredictGrace == 0 {
		pc.PredictGrace = DefaultPredictGrace
	}
	r, err := NewRamjet(cfg)
	if err != nil {
		return nil, err
	}
	r.label = "ramjet-precise"
	return &RamjetPrecise{Ramjet: r, pc: pc, held: map[int]int{}, routed: map[int]bool{}}, nil
}

// Index exposes the precise index (tests, statistics).
func (p *RamjetPrecise) Index() *kvindex.Index { return p.x }

// Delay is the configured delivery delay of KV events.
func (p *RamjetPrecise) Delay() time.Duration { return p.pc.Delay }

func (p *RamjetPrecise) attach(rep int, e *engine.Engine) {
	if p.x == nil {
		budget := p.pc.MaxEntries
		if budget == 0 {
			// The index mirrors the engines, so it never holds more than
			// their blocks: a budget that the largest fleet of such
			// engines cannot reach never evicts.
			budget = max(1<<20, e.Config().TotalBlocks()*selection.MaxReplicas)
		}
		// Every replica a feed, no subscriber (events are applied here in
		// simulated time) and no HTTP base (token ids stand for the
		// preflight).
		engines := make([]kvindex.PreciseEngine, selection.MaxReplicas)
		for i := range engines {
			engines[i].Feed.Replica = replicaKey(i)
		}
		ic := kvindex.Config{
			BlockSize:  e.Config().BlockSize,
			MaxEntries: budget,
			Now:        func() time.Time { return epoch.Add(p.clock) },
		}
		if p.pc.OwnScale > 0 {
			ic.MaxPredicted = max(1, int(65536*p.pc.OwnScale))
			ic.MaxOwnGone = 4 * ic.MaxPredicted
		}
		pre, err := kvindex.NewPrecise(kvindex.PreciseConfig{
			Index:             ic,
			Engines:           engines,
			PredictTTL:        p.pc.PredictTTL,
			PredictGrace:      p.pc.PredictGrace,
			ExactPastEstimate: p.pc.ExactPastEstimate,
			CapForeign:        p.pc.CapForeign,
			QueueEstimate:     p.pc.QueueEstimate,
			CapQueue:          p.pc.CapQueue,
			CapLoad:           p.pc.CapLoad,
			CapPeer:           p.pc.CapPeer,
			CapPeerInflight:   p.pc.CapPeerInflight,
			CapForeignQueue:   p.pc.CapForeignQueue,
			CapGain:           p.pc.CapGain,
			CapPeerSlack:      p.pc.CapPeerSlack,
			CapGainMean:       p.pc.CapGainMean,
			CapGainFleet:      p.pc.CapGainFleet,
			CapGainRoom:       p.pc.CapGainRoom,
			CapFit:            p.pc.CapFit,
			WaitAuto:          p.pc.WaitRule,
			WaitWarm:          p.pc.WaitWarm,
		})
		if err != nil {
			panic(err) // a static configuration
		}
		p.pre, p.x = pre, pre.Index()
		pre.SetEstimate(p.rt)
		if p.fp != nil {
			p.fp.SetRouter(p.rt)
			pre.SetForeign(p.fp) // its stored runs; fleetsim's late answers do not go through kvindex.Late
		}
		for i, c := range p.cands {
			pre.Bind(c.Slot, replicaKey(i))
		}
	}
	for len(p.reps) <= rep {
		h, ok := p.x.Lookup(replicaKey(len(p.reps)))
		if !ok {
			panic("fleetsim: replica without a precise feed") // more than kvindex.MaxReplicas: rejected by Run first
		}
		p.reps = append(p.reps, h)
	}
	for len(p.engines) <= rep {
		p.engines = append(p.engines, nil)
	}
	p.engines[rep] = e
	e.SetKVEventHandler(p.kvHandler(rep))
}

// kvHandler is what attach hands engine rep as its KV event handler (Multi
// fans one engine's events out to several instances' handlers). It only
// reads the events.
func (p *RamjetPrecise) kvHandler(rep int) func(engine.KVEvent) {
	return func(ev engine.KVEvent) {
		// Nothing emitted at ev.At can be seen before ev.At+Delay, and
		// everything emitted up to ev.At-Delay is due: deliver it now, so
		// that the queue holds at most Delay of events.
		p.deliver(ev.At)
		p.queue = append(p.queue, queuedKV{rep: rep, ev: ev})
		p.EventsQueued++
	}
}

func (p *RamjetPrecise) setNow(now time.Duration) { p.now = now }

// deliver applies, in emission order, every queued event due by t, one
// batch per run of events of the same replica.
func (p *RamjetPrecise) deliver(t time.Duration) {
	for p.qhead < len(p.queue) && p.queue[p.qhead].ev.At+p.pc.Delay <= t {
		rep := p.queue[p.qhead].rep
		p.batch.Events = p.batch.Events[:0]
		for p.qhead < len(p.queue) {
			q := &p.queue[p.qhead]
			if q.rep != rep || q.ev.At+p.pc.Delay > t {
				break
			}
			p.clock = max(p.clock, q.ev.At+p.pc.Delay)
			p.batch.Events = append(p.batch.Events, toKVIndex(q.ev))
			*q = queuedKV{} // drop the slices
			p.qhead++
		}
		p.batch.TS = p.clock.Seconds()
		p.x.Apply(p.reps[rep], &p.batch)
	}
	if p.qhead == len(p.queue) {
		p.queue, p.qhead = p.queue[:0], 0
	} else if p.qhead > len(p.queue)/2 {
		n := copy(p.queue, p.queue[p.qhead:])
		clear(p.queue[n:])
		p.queue, p.qhead = p.queue[:n], 0
	}
}

// toKVIndex is the decoded form of an engine event, as the subscriber
// would hand it to the index.
func toKVIndex(ev engine.KVEvent) kvindex.Event {
	out := kvindex.Event{BlockHashes: ev.BlockHashes}
	switch ev.Kind {
	case engine.BlockStored:
		out.Kind = kvindex.KindBlockStored
		out.Parent, out.HasParent = ev.ParentHash, ev.HasParent
		out.TokenIDs, out.BlockSize = ev.TokenIDs, ev.BlockSize
	case engine.BlockRemoved:
		out.Kind = kvindex.KindBlockRemoved
	case engine.AllBlocksCleared:
		out.Kind = kvindex.KindAllBlocksCleared
	}
	return out
}

// Pick delivers the events due by now and makes Ramjet's Route call with
// the precise annotator.
func (p *RamjetPrecise) Pick(r *Request, fleet []*Replica) int {
	if p.x == nil {
		panic("fleetsim: ramjet-precise used without Run attaching its engines")
	}
	// Register the fleet with the precise index bound (as the module binds
	// every upstream's slot when it builds its pool view) before a
	// decision routed at once can register it with no annotator: an
	// instance whose first decision was not waited for (the wait rule,
	// with another instance's events already fresh) otherwise never bound
	// a slot, so its feeds' stored runs reached neither its exact
	// overlaps nor its foreign prefill estimate.
	if err := p.ensure(fleet); err != nil {
		panic(err) // more than selection.MaxReplicas: rejected by Run first
	}
	p.deliver(p.now)
	p.clock = max(p.clock, p.now)
	p.answers(p.now)
	if p.fp != nil {
		p.fp.Refresh(epoch.Add(p.now))
		defer p.reserved(r)
	}
	if p.missed(r) {
		// Routed by the estimate: no token ids, so no annotation (stale
		// Precise flags cleared) and no prediction now.
		pre := p.pre
		for j := range p.cands {
			p.cands[j].Precise = false
		}
		p.Ramjet.pre = nil
		i := p.Ramjet.Pick(r, fleet)
		p.Ramjet.pre = pre
		p.Misses++
		if i >= 0 {
			p.routed[r.Row.ID] = true
			if !p.pc.NoLate {
				p.late = append(p.late, lateAnswer{at: p.now + p.pc.TokenizeLate, id: r.Row.ID, cand: i, prompt: r.Prompt})
			}
		}
		return i
	}
	before := p.PreciseDecisions()
	cold := !p.pc.NoCold && !p.pc.NoLate && p.pre.Cold()
	i := p.Ramjet.Pick(r, fleet)
	if i >= 0 {
		p.routed[r.Row.ID] = true
		if p.PreciseDecisions() > before {
			p.held[r.Row.ID] = i
		} else if cold {
			p.late = append(p.late, lateAnswer{at: p.now + p.pc.TokenizeLate, id: r.Row.ID, cand: i, prompt: r.Prompt, cold: true})
		}
	}
	return i
}

// reserved credits the others' prefill estimate with r's reservation, if
// Pick made one.
func (p *RamjetPrecise) reserved(r *Request) {
	if res, ok := p.res[r.Row.ID]; ok && res != nil {
		p.fp.Reserved(res, len(r.Prompt))
		if p.sent == nil {
			p.sent = map[int]time.Duration{}
		}
		p.sent[r.Row.ID] = p.now
		if p.born == nil {
			p.born = map[int]time.Duration{}
		}
		p.born[r.Row.ID] = p.now
	}
}

// FirstToken records r's first token on rep at the engine's clock in the
// others' prefill estimate, then ends r's pending prefill (Ramjet's).
func (p *RamjetPrecise) FirstToken(r *Request, rep int) {
	if p.fp != nil && rep >= 0 && rep < len(p.cands) {
		t := p.now
		if rep < len(p.engines) && p.engines[rep] != nil {
			t = p.engines[rep].Now()
		}
		sent, ok := p.sent[r.Row.ID]
		res := p.res[r.Row.ID]
		if ok && res != nil {
			delete(p.sent, r.Row.ID)
			p.fp.FirstTokenAfter(p.cands[rep].Slot, epoch.Add(t), res.Prefill(), t-sent)
		} else {
			p.fp.FirstToken(p.cands[rep].Slot, epoch.Add(t))
		}
	}
	p.Ramjet.FirstToken(r, rep)
}

// lateAnswer is a missed preflight's answer to come.
type lateAnswer struct {
	at     time.Duration
	id     int
	cand   int
	prompt []uint32
	cold   bool // a cold start's preflight (held fresh or not, as kvindex.Late holds)
}

// missed reports whether r's preflight misses its timeout: production
// sends one only when some feed is fresh.
func (p *RamjetPrecise) missed(r *Request) bool {
	if !p.pre.Ready() {
		return false
	}
	if p.pc.WaitRule && !p.pre.WaitPreflight() {
		return true
	}
	if p.pc.WaitRule && p.pc.WaitWarm {
		p.features(r)
		if !p.pre.WaitFor(p.f) {
			return true
		}
	}
	if p.pc.TokenizeMiss == 0 {
		return false
	}
	h := xxhash.Sum64String(fmt.Sprintf("tokenize-miss/%d", r.Row.ID))
	return float64(h>>11)/(1<<53) < p.pc.TokenizeMiss
}

// answers applies the late answers due by t: a request still running
// holds its blocks on the replica it was routed to, as kvindex.Late does.
func (p *RamjetPrecise) answers(t time.Duration) {
	n := 0
	for n < len(p.late) && p.late[n].at <= t {
		a := p.late[n]
		n++
		if !p.routed[a.id] {
			continue // ended first: the engine's events have it
		}
		p.clock = max(p.clock, a.at)
		keys := p.x.Keys(nil, 0, a.prompt)
		if a.cold || p.x.Fresh(p.reps[a.cand]) {
			p.x.Hold(p.reps[a.cand], keys, p.pc.PredictTTL)
			p.held[a.id] = a.cand
			if a.cold {
				p.ColdHolds++
			} else {
				p.LateHolds++
			}
		}
	}
	if n > 0 {
		p.late = append(p.late[:0], p.late[n:]...)
	}
}

// Done ends the request's hold on its predictions (the module's
// Precise.Ended at the request's end), at the engine's clock, then
// releases its reservation.
func (p *RamjetPrecise) Done(r *Request, rep int) {
	if rep < len(p.engines) && p.engines[rep] != nil {
		t := p.engines[rep].Now()
		p.deliver(t)
		p.answers(t)
		p.clock = max(p.clock, t)
	}
	delete(p.routed, r.Row.ID)
	delete(p.sent, r.Row.ID)
	if born, ok := p.born[r.Row.ID]; ok {
		delete(p.born, r.Row.ID)
		if p.fp != nil && rep >= 0 && rep < len(p.engines) && p.engines[rep] != nil {
			p.fp.Lived(p.engines[rep].Now() - born)
		}
	}
	if i, ok := p.held[r.Row.ID]; ok {
		delete(p.held, r.Row.ID)
		p.pre.Ended(p.cands[i].Slot, r.Prompt)
	}
	p.Ramjet.Done(r, rep)
}

// WaitRuleLate is TokenizeLate under the wait rule (the default of every
// ramjet-precise name): a request the rule routes at once has its
// preflight's answer one /tokenize round trip (10 ms) after its decision,
// since its preflight was sent alongside it rather than timed out.
const WaitRuleLate = 10 * time.Millisecond

// PreciseOptions are the ramjet-precise policies' rule variants: IndexShare
// off, as the module runs with kv on (fleetstate.PolicySettings.
// SpillOptions). On shared-prefix at 8 replicas of 196,608 tokens
// IndexShare cost two and four precise instances' TTFT p99
// (bench/EXPERIMENTS.md section 87); QueueExtra, off here until
// 2026-12-07, closed the precise path's p99 loss there (section 108).
var PreciseOptions = selection.Options{IndexShare: -1}

// preciseNamed returns the policy named "ramjet-precise" or
// "ramjet-precise@k+k...". Each applies the module's default wait rule
// (tokenize { wait auto }; PreciseConfig.WaitRule, answers WaitRuleLate
// later) unless flagged always: it then waits for every preflight with
// some fresh feed (tokenize { wait always }, the module's default until
// 2026-12-07); never (a probe) waits for none: every decision is routed
// by the estimate, its tokens WaitRuleLate later; warm waits as the rule
// and, for a lone instance, only where the estimate credits some replica
// (tokenize_wait warm, PreciseConfig.WaitWarm). Other flags: exact (PreciseConfig.ExactPastEstimate), all
// (CapForeign), nocold (NoCold), wait (no-op: the default), defer (no
// change: the estimate cap is the default), ixs (selection.Options.
// IndexShare at its default; without it off, PreciseOptions), qx (no-op:
// QueueExtra's default, since 2026-12-07) and noqx (QueueExtra off, the
// rule before); dl=0 (selection.Options.FixedDensity); a later wait or always wins. qe=K sets
// PreciseConfig.QueueEstimate (qe=0: off, the rule before it), capq=K
// PreciseConfig.CapQueue (opt-in, with capl=0), capl=K
// PreciseConfig.CapLoad. The estimate cap's lift stack is the default
// since 2026-12-07 (capl=3+capm=1.1+capgf=0.75+capfit=2.5, kvindex's
// DefaultCapLoad, DefaultCapPeer, DefaultCapGain with CapGainFleet and
// DefaultCapFit): each of capl, capm, capmn, capg, capgm, capgf, capgr and
// capfit sets its field and leaves the others at their defaults, and at 0
// turns its field off; capl=0 is the rule before (the estimate cap
// everywhere: CapLoad off, the others then unused but by capq), and a stack measured
// before names every field, e.g. capl=3+capm=0+capg=0+capfit=0 for capl=3
// alone. capm=K PreciseConfig.CapPeer (with capl: the cap lifted only
// on a replica whose resident context is at most K x the candidates'
// mean), capmn=K the same on in-flight counts (CapPeerInflight, a probe);
// capfq=K PreciseConfig.CapForeignQueue (the exact overlaps past the
// estimate on blocks this router did not route capped too where the
// replica's pending prefill is at least K x its capacity; the default 4
// since 2026-12-07, capfq=0 off: the rule before);
// capg=K PreciseConfig.CapGain (with capl: the cap lifted only where the
// replica's pending prefill less the least other candidate's is below K x
// the tokens the exact overlap saves), capgm=K the same against the
// candidates' mean pending prefill (CapGainMean, a probe), capgf=K CapGain
// scaled by the candidates' resident context over their capacity
// (CapGainFleet; capg=K unscaled), capgr=K capgf also scaled by the room the
// cache leaves beside the prompt, in prompts, within 0..1 (CapGainRoom, a
// probe), capfit=F PreciseConfig.CapFit (with capl: the cap lifted only
// where the replica's capacity holds F x the prompt), capmd=D PreciseConfig.CapPeerSlack (a probe:
// also fewer in-flight requests than the candidates' mean + D);
// own=K scales the index's own-block memory (MaxPredicted, MaxOwnGone) by
// K, a probe (PreciseConfig.OwnScale); flip=K decides request K/10 with
// replica K%10 left out, a probe (one different decision: a placebo). ok is
// false when name is not one.
func preciseNamed(name string, cfg selection.Config) (p Policy, ok bool, err error) {
	spec, found := strings.CutPrefix(name, "ramjet-precise@")
	if !found && name != "ramjet-precise" {
		return nil, false, nil
	}
	pc := PreciseConfig{WaitRule: true}
	// The precise path keeps main's rule: IndexShare and QueueExtra off
	// (selection's defaults on the approximate path) unless flagged, as
	// fleetstate.PolicySettings.SpillOptions does with kv on.
	opt := PreciseOptions
	dpx, capx := false, 0.0
	var flip flipProbe
	for _, k := range strings.Split(spec, "+") {
		if !found {
			break
		}
		switch k {
		case "exact":
			pc.ExactPastEstimate = true
		case "all":
			pc.CapForeign = true
		case "nocold":
			pc.NoCold = true
		case "always":
			pc.WaitRule = false
		case "wait": // the default
			pc.WaitRule = true
		case "warm": // tokenize_wait warm
			pc.WaitRule, pc.WaitWarm = true, true
		case "never": // a probe: no request waits, every decision by the estimate
			pc.WaitRule, pc.TokenizeMiss = true, 1
		case "defer": // the name the estimate cap was measured under
		case "ixs":
			opt.IndexShare = 0
		case "qx": // the default since 2026-12-07
			opt.QueueExtra = 0
		case "noqx": // the rule before: QueueExtra off
			opt.QueueExtra = -1
		case "dl=0": // the density fixed at chars_per_token
			opt.FixedDensity = true
		case "dpx": // a probe: the exact overlaps in estimated tokens (estUnits)
			dpx = true
		default:
			name, v, _ := strings.Cut(k, "=")
			if name != "qe" && name != "capq" && name != "capl" && name != "capx" && name != "capm" && name != "capmn" && name != "capg" && name != "capgm" && name != "capgf" && name != "capgr" && name != "capfit" && name != "capmd" && name != "own" && name != "capfq" && name != "flip" {
				return nil, true, fmt.Errorf("ramjet-precise@: unknown flag %q", k)
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, true, fmt.Errorf("ramjet-precise@: %s: %w", name, err)
			}
			switch name {
			case "qe":
				pc.QueueEstimate = ZeroIsNone(x)
			case "capq":
				pc.CapQueue = x
			case "capl": // capl=0: off, the rule before the lift stack
				pc.CapLoad = ZeroIsNone(x)
			case "capm":
				pc.CapPeer = ZeroIsNone(x)
			case "capmn":
				pc.CapPeer, pc.CapPeerInflight = ZeroIsNone(x), true
			case "capg":
				pc.CapGain = ZeroIsNone(x)
			case "capgm": // a probe: CapGain against the candidates' mean pending
				pc.CapGain, pc.CapGainMean = ZeroIsNone(x), true
			case "capgf": // CapGain scaled by the candidates' resident / capacity (CapGainFleet)
				pc.CapGain, pc.CapGainFleet = ZeroIsNone(x), true
			case "capgr": // a probe: capgf also scaled by the cache's room beside the prompt
				pc.CapGain, pc.CapGainFleet, pc.CapGainRoom = ZeroIsNone(x), true, true
			case "capfit":
				pc.CapFit = ZeroIsNone(x)
			case "capmd":
				pc.CapPeerSlack = x
			case "capx": // a probe: the capacity told scaled by x, as ramjet@capx
				capx = x
			case "capfq":
				pc.CapForeignQueue = ZeroIsNone(x)
			case "own": // a probe: the own-block memory scaled by x (OwnScale)
				pc.OwnScale = x
			case "flip": // a probe: request K/10 decided without replica K%10 (Ramjet.flip)
				flip = flipProbe{on: true, id: int(x) / 10, rep: int(x) % 10}
			}
		}
	}
	if pc.WaitRule {
		pc.TokenizeLate = WaitRuleLate
	}
	if pc.TokenizeMiss == 1 {
		pc.WaitRule = false // missed: the wait rule's answers come as late
	}
	q, err := NewRamjetPrecise(cfg, pc)
	if err != nil {
		return nil, true, err
	}
	q.setup.EngineLoad = RamjetEngineLoad
	q.rt, q.setup.Options = q.rt.WithOptions(opt), opt
	q.label = name
	q.dpx, q.setup.CapacityScale = dpx, capx
	q.flip = flip
	return q, true, nil
}
