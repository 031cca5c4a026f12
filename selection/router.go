package selection

import (
	"cmp"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Slot is a Router's small integer id for one replica (a dial address plus
// data-parallel rank), stable for the Router's life.
type Slot int32

// Profile is a replica's engine profile, used by the output-length
// tie-break.
type Profile uint8

const (
	// ProfileStandard is an engine without speculative decoding.
	ProfileStandard Profile = iota
	// ProfileSpeculative is an engine with speculative decoding: it wins
	// ties for long requested outputs.
	ProfileSpeculative
)

// Candidate is one replica offered to Pick.
type Candidate struct {
	// Slot identifies the replica (from Router.Register).
	Slot Slot
	// Usable is false when the replica is unhealthy, unavailable, not
	// admitted or quarantined: it is filtered out before scoring.
	Usable bool
	// Profile is the replica's engine profile.
	Profile Profile
	// Precise, when set, makes Overlap (in tokens, exact, from the precise
	// index) replace the approximate index's estimate for this replica.
	Precise bool
	Overlap int
}

// Reason says why Pick chose what it chose.
type Reason uint8

const (
	// ReasonNone: no usable replica.
	ReasonNone Reason = iota
	// ReasonAffinity: the replica with the deepest overlap won.
	ReasonAffinity
	// ReasonLoadOverride: a replica with less overlap won because the
	// warmer ones carried more load.
	ReasonLoadOverride
	// ReasonCold: no replica held any of the prompt; placed by the
	// tie-breaks (rendezvous hash, so that independent instances agree).
	ReasonCold
	// ReasonTieBreak: several replicas equally warm and loaded; a
	// tie-break rule after depth decided.
	ReasonTieBreak
	// ReasonPanic: the proxy's health checks held every replica out; the
	// caller routed among those out only for their recent failures
	// (Caddy's passive health), as Envoy's panic threshold does. Set by
	// the caller, never by Route.
	ReasonPanic
)

var reasonNames = [...]string{"none", "affinity", "load_override", "cold", "tie_break", "panic"}

func (r Reason) String() string { return reasonNames[r] }

// TieRule is the tie-break rule that decided among equal scores.
type TieRule uint8

const (
	TieNone TieRule = iota
	TieDepth
	TieProfile
	TieRendezvous
	TieLoad
	TieOrder
)

var tieNames = [...]string{"none", "depth", "profile", "rendezvous", "load", "order"}

func (t TieRule) String() string { return tieNames[t] }

// Decision is Pick's answer.
type Decision struct {
	// Index is the chosen candidate's index in the slice given to Pick; -1
	// when no candidate was usable.
	Index int
	Slot  Slot
	// Reason and Tie explain the choice.
	Reason Reason
	Tie    TieRule
	// Overlap is the chosen replica's raw (uncapped) overlap, in tokens;
	// BestOverlap the deepest among usable replicas.
	Overlap     int
	BestOverlap int
	Score       float64
	Load        float64
	// Prefill estimates the prompt tokens the chosen replica must compute:
	// what to pass to Reserve.
	Prefill int
	// Usable counts the candidates that passed the filters.
	Usable int
	// Precise reports that Route's annotator gave at least one candidate
	// an exact overlap (the precise index decided, not only the estimate).
	Precise bool
}

// Scratch is caller-owned working memory for Pick; after Pick it holds the
// per-candidate figures (explain reads them). Reuse one per goroutine, or
// pool them.
type Scratch struct {
	// Overlap, Load and Score are per candidate, in the order given to Pick.
	// Score is NaN for filtered candidates.
	Overlap []int
	Load    []float64
	Score   []float64

	// Tokens is the request's token ids when a tokenize preflight produced
	// them (the precise path), nil otherwise: an input of Route's
	// annotator, set by the caller before Route.
	Tokens []uint32
	// Keys and Exact are the annotator's working memory (block keys of
	// Tokens, exact overlap per replica), kept between Annotate and
	// Decided of one Route.
	Keys  []uint64
	Exact []int

	marg  []Candidate // the marginal variant's second candidate set
	spill []uint64    // the instance-aware spill's ranking (spill.go)
	depth [MaxReplicas]int32
	work  depthWork
	// top1 and top2 are the deepest and second deepest usable overlaps
	// of the last Pick (topTwo of s.Overlap as Pick left it), low the
	// least (-1 when none is usable).
	top1, top2, low int
}

// NewScratch returns a Scratch sized for n candidates.
func NewScratch(n int) *Scratch {
	s := &Scratch{}
	s.ensure(n)
	return s
}

func (s *Scratch) ensure(n int) {
	if cap(s.Overlap) < n {
		s.Overlap = make([]int, n)
		s.Load = make([]float64, n)
		s.Score = make([]float64, n)
	}
	s.Overlap, s.Load, s.Score = s.Overlap[:n], s.Load[:n], s.Score[:n]
}

type loadCell struct {
	// inflight packs the slot's generation (high 32 bits, bumped by
	// Unregister: older reservations no longer count) and its in-flight
	// requests (low 32 bits), so that a reservation takes its generation
	// and a release or UnregisterIdle checks it in the same atomic step
	// as the count changes (count and generation: loadCell.count, gen).
	inflight atomic.Int64
	pending  atomic.Int64
	resident atomic.Int64  // prompt tokens of the in-flight requests, until release
	kvtokens atomic.Int32  // the replica's KV capacity in tokens (0: unknown), at most MaxInt32
	lingerAt atomic.Uint32 // the router's clock (ms, wrapping) at the last release that added to linger
	ext      extCell       // engine-reported load of others (SetExternalLoad)
	extCtx   atomic.Int32  // others' contexts estimated from their stored runs (SetExternalContext); fills the cache line
	linger   atomic.Int32  // released context presumed still in use (see loadPair), at most the KV capacity
}

// still reports whether every load figure of the slot but its lingering
// context is zero: in-flight requests, pending prefill, resident context,
// and the others' load and context (Pick's quiet case). The in-flight
// count, most often set on a busy fleet, is read first.
func (c *loadCell) still() bool {
	return int32(c.inflight.Load())|c.ext.prefill.Load()|c.extCtx.Load() == 0 &&
		c.pending.Load()|c.resident.Load()|c.ext.requests.Load()|c.ext.kv.Load() == 0
}

// count is the slot's in-flight requests (the low half of inflight).
func (c *loadCell) count() int64 { return int64(int32(c.inflight.Load())) }

// gen is the slot's generation (the high half of inflight).
func (c *loadCell) gen() uint32 { return uint32(uint64(c.inflight.Load()) >> 32) }

// nextGen starts the slot's next generation with no request in flight;
// idle: only if none is in flight now. It reports whether it did.
func (c *loadCell) nextGen(idle bool) bool {
	for {
		w := c.inflight.Load()
		if idle && int32(w) != 0 {
			return false
		}
		if c.inflight.CompareAndSwap(w, int64((uint64(w)>>32+1)<<32)) {
			return true
		}
	}
}

// chainList lists a replica's in-flight reservations (reserveChain),
// under mu. It is kept beside loadCell, which is one cache line.
type chainList struct {
	mu   sync.Mutex
	head *Reservation
	// kv is the context of the listed reservations with every block two
	// of them share counted once (Options.SharedOnce; written under mu).
	kv atomic.Int64
	// eng is the engine's KV tokens in use at the last scrape plus one
	// (0: none; SetEngineKV), base this router's resident context then.
	eng, base atomic.Int64
}

// DefaultLingerTTL is how long released context keeps counting in the pair
// term after the replica's last release (Options.LingerTTL): a closed-loop
// agent or a conversation comes back within seconds (tool calls, think
// time); context whose owner has not been back for that long is presumed
// done, as the rounds of a burst are, and no longer pushes new requests
// off an idle replica. Chosen in the fleet simulation (bench/EXPERIMENTS.md
// section 9).
const DefaultLingerTTL = 20 * time.Second

// DefaultPairFloor is the least KV capacity, in tokens, that the pair
// term divides by (Options.PairFloor): below it a smaller cache no longer
// makes the same resident and lingering context heavier, so that on a
// 65,536-token replica the pair term on an app's lingering sessions does
// not outweigh the full prefix hit of its next first turn (which then
// went cold to an idle replica). 196,608 tokens, an 80 GB card's KV after
// the weights of a 32B model: replicas at least that large are scored as
// before. Chosen in the fleet simulation (bench/EXPERIMENTS.md section 14).
const DefaultPairFloor = 196_608

// DefaultOverflowWeight is Options.OverflowWeight's default: past its KV
// capacity (the resident context of its in-flight requests, shared
// context counted once, plus the request's prompt) a replica's load grows
// by 4 tokens per token it lacks, so that an overloaded home whose
// agents' contexts no longer fit sheds the next one to a replica with
// room, as Dynamo's active-block term does, while a replica with room
// pays nothing. Chosen in the fleet simulation on the tool-agent trace
// (bench/EXPERIMENTS.md section 16).
const DefaultOverflowWeight = 4.0

// DefaultOverflowHome and DefaultOverflowHomeRoom are Options.OverflowHome's
// and Options.OverflowHomeRoom's defaults: a home holding at least 0.9 of
// the prompt, whose KV capacity is below 2.5 times the prompt, pays no
// overflow term. Chosen in the fleet simulation on the tool-agent trace at
// 64 replicas of 65,536 tokens (TTFT p50 1.15-1.44 s -> 0.50-0.51 s, p99
// 15.4-15.6 s -> 1.4-3.4 s, Dynamo's 0.52-0.54 and 2.6-3.6 s) with the
// 8-replica rows as they were: the gate keeps the rule where a replica
// holds several contexts (a room of 1.5 loses the 64-replica gain, 2-3
// keep it; bench/EXPERIMENTS.md sections 73, 74).
const (
	DefaultOverflowHome     = 0.9
	DefaultOverflowHomeRoom = 2.5
)

// DefaultHotGuard is Options.HotGuard's default: a replica running more
// than twice the usable replicas' mean count of in-flight requests (a
// mean of at least one: on a nearly idle fleet, past 2 requests) pays
// request_cost once more for each request past that. Chosen in the fleet simulation (bench/EXPERIMENTS.md
// section 21): on the tuning seeds it changes no decision of the
// closed-loop workloads at 8 and 64 replicas, and on the open-loop
// tool-agent traces it spreads the agents' first steps while the fleet is
// still nearly idle (the median p99 of nine traces 1.32x -> 0.72x
// Dynamo's).
const DefaultHotGuard = 2.0

// DefaultSubsetGuard is Options.SubsetGuard's default: over a fleet of at
// least SubsetGuardReplicas usable replicas, a replica holding more of the
// prompt than the least warm one pays request_cost once more for each
// request in flight past the usable replicas' mean (past DefaultSubsetFloor
// requests on a lightly loaded fleet). Chosen in the fleet simulation
// (bench/EXPERIMENTS.md section 24): the hotspot workload at 64 replicas
// (one app's 3k-token prompt on 47 of 64 replicas running 7-8 requests
// each while the other apps' replicas run 3-5; a minor app's only holder)
// keeps its busiest replica under 1.5x the mean, and every closed-loop
// workload at 64 and 256 replicas but hotspot and shared-prefix decides
// as before.
const DefaultSubsetGuard = 1.0

// DefaultSubsetFloor is Options.SubsetFloor's default: the subset guard
// lets a replica run 3 requests whatever the mean (a floor of 2, the busy
// guard's idle limit, spread the hot app of the hotspot workload at 256
// replicas with 65,536-token caches over cold replicas: p50 +1-2%;
// bench/EXPERIMENTS.md section 24).
const DefaultSubsetFloor = 3.0

// DefaultProfileQueue is Options.ProfileQueue's default: the output bonus
// is not paid on a replica with more than one request_cost of pending
// prefill beyond the least pending usable replica, where profiles differ
// (bench/EXPERIMENTS.md: spec-pair's TTFT p99 over 24 tuning seeds).
const DefaultProfileQueue = 1.0

// DefaultWarmHold is Options.WarmHold's default: on a fleet of at least
// SubsetGuardReplicas running at least two requests per replica, a load
// override to a replica holding none of the prompt goes to a holder
// running fewer than 1.5 times the usable replicas' mean of in-flight
// requests whose queue lets the request's first token come no later, the
// shortest such queue (bench/EXPERIMENTS.md sections 36 and 41: the
// hotspot workload's warm-up at 64 and 256 replicas).
const DefaultWarmHold = 1.5

// warmHoldMean is the least mean of in-flight requests per usable replica
// at which the warm hold applies: on a fleet that runs fewer, a cold
// replica costs the request no queue and the hold only stacked long-lived
// contexts (the tool-agent trace at 64 replicas: its agents' first steps
// held beside other agents; bench/EXPERIMENTS.md section 36).
const warmHoldMean = 2.0

// SubsetGuardReplicas is the least usable replicas Options.SubsetGuard
// applies over. On 8 replicas the same guard costs the open-loop
// tool-agent and conversation traces' p99 (each replica is an eighth of
// the fleet: shedding to one means a cold prefill of long contexts with
// every replica as busy; bench/EXPERIMENTS.md section 24), so smaller
// fleets keep the busy guard alone.
const SubsetGuardReplicas = 32

// ErrTooManyReplicas is returned by Register when MaxReplicas replicas are
// registered at once.
var ErrTooManyReplicas = errors.New("selection: more than 1024 replicas registered at once")

// Router makes routing decisions and keeps what they need across requests:
// the approximate index, the live load of every replica, and the replica
// registry. It is safe for concurrent use; keep one per fleet and let it
// outlive configuration reloads (Retune changes its knobs and keeps the
// rest).
type Router struct {
	cfg Config
	opt Options
	x   Extractor
	lk  loadKnobs // loadKnobs' answer: cfg and opt do not change
	pk  pickKnobs // Pick's other options, their defaults applied (knobbed)
	*shared
}

// Options are variants of the routing rule that Route applies, for
// experiments in the fleet simulation. The zero value is ramjet's rule.
type Options struct {
	// Marginal scores the overlap each replica holds beyond the least warm
	// usable one, so that a prefix every replica holds (a fleet-wide system
	// prompt) does not use up the affinity cap:
	//
	//	score(r) = min(overlap(r) - min_usable_overlap, affinity_cap) - alpha x load(r)
	//
	// The reservation still counts the real prefill.
	Marginal bool
	// FirstBlockTie makes the rendezvous tie-break hash the prompt's first
	// block (the earlier rule) rather than the first block not every
	// usable replica holds.
	FirstBlockTie bool
	// PairShare multiplies the pair_weight term by the request's own share
	// of the replica's KV (P/C): pair_weight x P x P x R / (C x C).
	PairShare bool
	// PairSqrt makes the pair_weight term concave in the resident context:
	// pair_weight x P x sqrt(R / C).
	PairSqrt bool
	// PairSat caps the resident context the pair_weight term counts at the
	// replica's KV capacity: replicas that are all full weigh the same.
	PairSat bool
	// PairEverywhere applies the pair_weight term to the request's home
	// too (the one replica that holds strictly more of its prompt than
	// any other), which the rule exempts (Config.PairWeight).
	PairEverywhere bool
	// PairFloor floors the KV capacity the pair_weight term divides by,
	// pair_weight x P x R / max(C, PairFloor): 0 is DefaultPairFloor,
	// negative no floor (the rule before).
	PairFloor int64
	// PairCap, when positive, caps the pair_weight term at PairCap times
	// the request's deepest overlap on any usable replica (at most the
	// affinity cap), for a request with some overlap: the term then never
	// outweighs a prefix hit it would forgo.
	PairCap float64
	// LingerCap, when positive, caps the lingering part of the pair_weight
	// term (released context) likewise, at LingerCap times the deepest
	// overlap (at most the affinity cap).
	LingerCap float64
	// NoLinger leaves released contexts out of the pair_weight term's
	// resident tokens (the rule before: in-flight requests only).
	NoLinger bool
	// LingerTTL is how long released context counts after the replica's
	// last release: 0 is DefaultLingerTTL, negative forever (until new
	// requests take it off: the rule of the 2026-12-02 04:00 session).
	LingerTTL time.Duration
	// LingerHalfLife, when positive, makes the lingering context decay
	// with this half-life since the replica's last release instead of
	// expiring after LingerTTL (experiment).
	LingerHalfLife time.Duration
	// ObserveShadowed makes Observe read every shortfall as eviction (the
	// rule before), also when the prompt shared a prefix with a request
	// still prefilling on the replica, which the rule ignores: the engine
	// had not computed that prefix yet (an agent whose next step arrives
	// while its previous one still waits). See reserveChain.
	ObserveShadowed bool
	// NoChainDedup counts every in-flight request's whole prompt in the
	// resident tokens (the rule before). The rule counts context that
	// requests in flight on one replica share about once (see
	// reserveChain), as the engine holds it and as Dynamo counts distinct
	// active blocks.
	NoChainDedup bool
	// OverflowWeight is the load, per token of KV a replica lacks to run
	// the request beside its in-flight ones (past its capacity the engine
	// must queue or preempt and recompute), on every replica, the
	// request's home too:
	//
	//	load(r) += overflow_weight x max(0, R + P - C)
	//
	// 0 is DefaultOverflowWeight over this router's own reservations
	// (R without the engine-reported KV of others), negative none (the
	// rule before); a positive weight counts R with it.
	OverflowWeight float64
	// OverflowFull, when positive, is the overflow term's weight (in place
	// of OverflowWeight, when lower) for a request that no usable replica
	// has room for: every one's context in flight (this router's), with
	// the prompt, passes its KV capacity (overflowfull.go), gated by
	// OverflowFullHome and OverflowFullRoom. The term then weighs resident
	// context about as much as pending prefill, as Dynamo's active blocks
	// do, instead of 4 times, which sends turns cold away from their homes
	// on a fleet whose caches are all full. 0 is DefaultOverflowFull,
	// negative off (the rule before). Ungated it took the tool-agent
	// trace at 8 replicas of 65,536 tokens to TTFT p50 0.96x Dynamo's but
	// cost agent-fleet's p99 and a tool-agent trace's at 196,608
	// (bench/EXPERIMENTS.md sections 79, 80).
	OverflowFull float64
	// OverflowFullHome gates OverflowFull on the request's home: the
	// lighter weight only where the warmest usable replica holds at least
	// this share of the prompt more than the coldest. 0 is
	// DefaultOverflowFullHome, negative no gate. A request cold everywhere
	// but a shared prefix (agent-fleet's late turns, whose contexts no
	// cache keeps) has no overlap to keep, and there the weight only
	// trades resident context for pending prefill, which costs the tail.
	OverflowFullHome float64
	// OverflowFullRoom gates OverflowFull on the replicas' size: the
	// lighter weight only while the usable replicas' mean KV capacity is
	// below this many of this router's mean prompts (the running mean of
	// its reservations). 0 is DefaultOverflowFullRoom, negative no gate.
	// Where a replica holds several contexts a full fleet is a crowded
	// one, and keeping turns home piles them on the hottest.
	OverflowFullRoom float64
	// IndexShare, when in (0, 1), is the share of each replica's KV
	// capacity the index models as its prefix cache (the LRU bound of
	// what it presumes the replica still holds); the load's capacity
	// stays the whole. The engine's cache shares its blocks with the
	// running requests' KV, so fewer prefixes stay than the capacity
	// holds. 0 is DefaultIndexShare, negative (or 1 and more) the whole
	// (main's rule before it). EXPERIMENTS 79, 85, 87: with
	// IndexShareRoom and QueueExtra's defaults, shared-prefix 8/196,608's
	// TTFT p99 1.092x -> 1.002x dynamo-tuned's over seeds 1-12, 1.101x ->
	// 1.001x on seeds 13-24, every other row measured unchanged; ungated
	// by IndexShareRoom it costs agent-fleet 8 and the 65,536-token rows.
	IndexShare float64
	// FixedDensity keeps Config.CharsPerToken as the prompts' bytes per
	// real token where the engines' figures (KV capacity) meet the index's
	// estimated tokens, rather than the density the answers show where
	// prompts are lighter than that (density.go; fleet simulation key dl=0).
	FixedDensity bool
	// IndexShareRoom applies IndexShare only on a replica whose KV
	// capacity is at least IndexShareRoom times the mean prompt this
	// router reserved lately (OnceBelow's measure): where the cache holds
	// many prompts, not where a few contexts fill it. 0 is
	// DefaultIndexShareRoom, negative no gate.
	IndexShareRoom float64
	// QueueExtra, when positive, weighs a replica's pending prefill (the
	// uncached prompt tokens of its requests not yet past their first
	// token) QueueExtra times more in load(r), on top of its weight 1, so
	// that a request goes where its first token comes soonest rather
	// than behind another group's cold prefill on a replica whose decode
	// side looks lighter. 0 is DefaultQueueExtra, negative off (main's
	// rule before it); its three gates below (EXPERIMENTS 85, 87).
	QueueExtra float64
	// QueueExtraRoom applies QueueExtra only on a replica whose KV
	// capacity is at least QueueExtraRoom times the mean prompt this
	// router reserved lately (IndexShareRoom's measure). 0 is
	// DefaultQueueExtraRoom, negative no gate.
	QueueExtraRoom float64
	// QueueExtraFull applies QueueExtra only on a replica the index
	// believes holds at least QueueExtraFull of its capacity (a bounded
	// index that is evicting: cache pressure). 0 is
	// DefaultQueueExtraFull, negative no gate.
	QueueExtraFull float64
	// QueueExtraWarm applies QueueExtra to every request; by default it
	// applies only to a request no usable replica holds any of (cold
	// everywhere): a warm request keeps the rule's trade of its overlap
	// against the home's queue (a conversation's follow-up turns stay
	// home). QueueExtra never applies where the usable replicas' profiles
	// differ for a request that wants one (ProfileQueue's case).
	QueueExtraWarm bool
	// ColdSpill applies the instance-aware spill (SetInstance) to a cold
	// prefix too: several instances that all learn every replica's blocks
	// (the precise path) need not agree on where a cold prefix goes.
	ColdSpill bool
	// SpillBand, when positive, widens the instance-aware spill to every
	// candidate scoring within SpillBand of the best (band.go), once this
	// instance has seen evidence of others (SawOthers) unless
	// SpillBandAlone: in a lone instance the band at a non-zero position
	// only moves load overrides (the tool-agent trace's p50 1.15x).
	SpillBand      float64
	SpillBandAlone bool
	// HotGuard is the busy guard: a replica with more requests in flight
	// than HotGuard times the usable replicas' mean (a mean of at least
	// one: on an idle fleet, HotGuard requests) pays request_cost once
	// more for each request past that, so that a replica that alone
	// holds a busy prefix (a minor app's system prompt, an agent's home)
	// sheds new work to a second one before it runs many times its share,
	// while a fleet whose replicas are all about as busy is scored as
	// without it. 0 is DefaultHotGuard, negative none (the rule before).
	HotGuard float64
	// SubsetGuard is the busy guard's factor for a replica that holds
	// more of the prompt than the least warm usable replica (the
	// request's home, or one of the replicas that share a prefix only a
	// subset of the fleet holds, such as a popular app's system prompt),
	// over a fleet of at least SubsetGuardReplicas usable replicas: such a
	// replica pays request_cost once more for each request in flight past
	// SubsetGuard times the usable replicas' mean (but never below
	// SubsetFloor requests, nor above the busy guard's limit), so that a
	// prefix's holders running above the fleet while the rest idle shed
	// work to a cold replica early. 0 is DefaultSubsetGuard, negative
	// none (the rule before: HotGuard for every replica).
	SubsetGuard float64
	// SubsetFloor is the least in-flight requests SubsetGuard's limit
	// allows (not above the busy guard's): 0 is DefaultSubsetFloor.
	SubsetFloor float64
	// ReplyCharge charges each answer's completion tokens to the index's
	// model of the replica's cache (Observe, Index.Replied), as the engine
	// caches the reply's blocks beside the prompt's. Off: measured, it
	// removes most of the index's mispredictions under a reduced cache
	// but costs the smallest caches more than it gains (a fleet there
	// does better on beliefs that outlive the engine's, which keep a
	// group on the replica its running requests pin it to):
	// bench/EXPERIMENTS.md, section 28 (press10).
	ReplyCharge bool
	// InflightGuard keeps the horizon a shortfall sets (Observe) from
	// dropping what was routed to the replica since the oldest request
	// still in flight there. HorizonFloor, when positive, keeps that
	// horizon at least HorizonFloor times the replica's capacity in blocks
	// (with InflightGuard: caps the guard there). Both off: measured, they
	// win agent-fleet at 8 replicas and lose the tool-agent trace at
	// 65,536 tokens of KV (bench/EXPERIMENTS.md, section 34, press11).
	InflightGuard bool
	HorizonFloor  float64
	// GuardCap, when positive, applies InflightGuard only where what it
	// keeps (the blocks touched on the replica since its oldest in-flight
	// request was learned) is at most GuardCap times the replica's
	// capacity in blocks (known capacities only): past that the replica
	// cannot hold it all and the shortfall's own age stands. Off: at 3 it
	// takes the guard's win on agent-fleet at 8 replicas without its loss
	// on the tool-agent trace at 65,536 tokens of KV, but costs
	// shared-prefix at 65,536 its TTFT p95 (bench/EXPERIMENTS.md, section
	// 40, press12).
	GuardCap float64
	// SharedOnce makes the overflow term count the context of the
	// requests in flight on a replica with every block two of them share
	// counted once, as the engine holds it (the deepest common prefix of
	// the two prompts), rather than only where one prompt extends
	// another's (at its whole length or 15/16, 3/4 or 1/2 of it):
	// requests of different sessions that share a deep prefix (an agent
	// framework's system prompt and tools) then no longer read as several
	// copies of it past the replica's KV capacity (sharedonce.go). The
	// pair term's resident context is unchanged.
	SharedOnce bool
	// OnceBelow, when positive, applies SharedOnce's count on a replica
	// whose KV capacity is below OnceBelow times the mean prompt this
	// router reserved lately, the rule's elsewhere (the gated form,
	// sharedonce.go; both counts are kept); 0 or negative: only
	// SharedOnce. Off by default: at 6 it takes the tool-agent trace at 8
	// replicas with 65,536 tokens of KV from TTFT p50 1.077x to 1.017x
	// Dynamo's (traces 1-12; held out 13-24: 1.086x to 1.053x) and leaves
	// the trace at the default KV as the rule, but it opens on agent-fleet
	// at the default KV (contexts past 100k), whose seed-1 row it moves
	// (output tok/s 288 -> 281, cached 0.512 -> 0.502; p99 better)
	// (bench/EXPERIMENTS.md section 71).
	OnceBelow float64
	// EngineOverflow makes the overflow term read what the replica's
	// engine reported holding at the last scrape (SetEngineKV:
	// engine_metrics' KV usage, a prefix shared by running requests held
	// once, every instance's requests in it) plus the change in this
	// router's resident context since, in place of its own in-flight
	// contexts, where a fresh scrape reported it (engineoverflow.go);
	// without one the term is the rule's. engine_metrics' overflow. Off by
	// default: it takes the tool-agent trace at 65,536 tokens of KV from
	// TTFT p99 9.08 to 4.04 s (window) but costs agent-fleet at 8
	// replicas 4-8% of its TTFT p99 and the tool-agent traces at the default
	// KV theirs (bench/EXPERIMENTS.md section 53).
	EngineOverflow bool
	// OverflowHome exempts the request's home from the overflow term: the
	// replica holding strictly the deepest overlap, at least OverflowHome
	// of the prompt, whose KV capacity is below OverflowHomeRoom times the
	// prompt. 0 is DefaultOverflowHome, negative none (the rule before).
	// Moving an agent whose context only its home holds costs that whole
	// context prefilled cold, while the engine's overflow at home costs a
	// wait for the in-flight requests it lacks room beside; on the
	// tool-agent trace at 64 replicas of 65,536 tokens the term pushed
	// agents off their homes (cached share 0.70 of the pooled oracle,
	// TTFT p50 2.2-2.6x Dynamo's). 0.9 (a turn adding at most a tenth of
	// its context) keeps them home there; 0.8 keeps turns with larger
	// additions home too and loses the p99 (bench/EXPERIMENTS.md section
	// 73).
	OverflowHome float64
	// OverflowHomeRoom gates OverflowHome on how many contexts of the
	// request's size the home's KV holds: the home is exempt only while
	// its capacity is below OverflowHomeRoom times the prompt. 0 is
	// DefaultOverflowHomeRoom, negative no gate. Where a replica holds
	// only a couple of such contexts, one more in flight overflows it and
	// the wait beside it is short; where it holds several, an overflowing
	// home is a crowded one and the turn is better moved (without the
	// gate the exemption cost the tool-agent traces at 8 replicas with the
	// default KV their TTFT p99 and 3-6% of throughput; bench/EXPERIMENTS.md
	// section 74).
	OverflowHomeRoom float64
	// PendingDepth counts a replica's overlap only up to what was there
	// before the requests still prefilling on it whose whole prompt is a
	// prefix of this one (pendingdepth.go; experiment).
	PendingDepth bool
	// AgreeBand is the agreement band (agree.go): while the answers show
	// other instances' placements, the candidate with the highest
	// rendezvous weight among those scoring within AgreeBand of the best
	// wins. 0 is DefaultAgreeBand, negative none (the rule before).
	AgreeBand float64
	// AgreeAlways applies the agreement band with no other instance seen
	// (experiment).
	AgreeAlways bool
	// AgreeMax is the longest prompt (tokens) the agreement band applies
	// to: 0 is DefaultAgreeMax, negative no limit.
	AgreeMax int
	// AgreeHome is the home band's width (agree.go), in tokens of score
	// per token of the prompt: 0 is DefaultAgreeHome, negative none. The
	// agreement band for prompts longer than AgreeMax that no replica
	// holds more of than another in this instance's view (an agent's turn
	// another instance placed), keyed by the first block past what they
	// hold.
	AgreeHome float64
	// AgreeStale: the home band also applies to a long prompt this
	// instance knows on one replica, if what it knows there past what
	// several replicas hold is less than AgreeStale of the prompt past it
	// (other instances have routed the agent since). 0 is
	// DefaultAgreeStale, negative none.
	AgreeStale float64
	// AgreeWalk keeps the agreement band walking its rendezvous order past
	// any number of replicas prefilling this instance's own requests (the
	// rule before; agree.go).
	AgreeWalk bool
	// NoAgentTie breaks a long prompt's ties by tieKey's block as any
	// other prompt's (the rule before; agentTie in agree.go).
	NoAgentTie bool
	// AgreeExt turns the agreement (band and home band) on once the
	// engines reported requests this instance did not reserve
	// (SetExternalLoad), not only once answers show other instances'
	// placements: engine_metrics' agree (enginemetrics.Settings.Agree).
	AgreeExt bool
	// HomeWarm leaves a prompt of which no replica holds anything in this
	// instance's view to the rule, not the home band (experiment).
	HomeWarm bool
	// ProfileQueue: when the usable replicas differ in profile, the
	// output bonus (output_weight x max_tokens) is not paid on a replica
	// whose pending prefill exceeds the least pending usable replica's by
	// more than ProfileQueue x request_cost, so that a burst's long
	// outputs do not queue a prefill step's worth more on the speculative
	// replica than elsewhere (spec-pair's TTFT p99). 0 is
	// DefaultProfileQueue, negative none (the rule before).
	ProfileQueue float64
	// WarmHold is the warm hold, over a fleet of at least
	// SubsetGuardReplicas usable replicas: when the best score is a
	// replica holding none of the prompt while others hold part of it (a
	// load override to a cold replica) on a fleet running at least two
	// requests per usable replica, a holder running fewer than WarmHold
	// times the usable replicas' mean in-flight requests wins instead, if
	// its queue (pending prefill less its overlap) is at most the cold
	// replica's pending prefill (the request's prompt is computed no
	// later there): the holder with the shortest queue, not the best
	// score, which favours a replica that runs few requests because it
	// took the prefix cold a moment ago and whose first prefill the
	// requests would then queue behind. A fleet warming up (a popular
	// prefix on few replicas, the rest idle) then warms fewer replicas:
	// each cold replica it warms costs one request a cold prefill. Only for
	// prompts of at most DefaultAgreeMax tokens (the agreement band's
	// bound): a longer one is an agent's context, which stays and grows
	// where it lands, and the pair term that spread it must stand
	// (agent-fleet at 64 replicas lost 30% of its throughput without the
	// bound). 0 is DefaultWarmHold, negative none (the rule before).
	WarmHold float64
	// AgentMove, when positive, lets an agent leave its home before the
	// home overflows (move.go, agentMove): while this router's contexts
	// in flight on the request's home, with the request's new tokens, pass
	// AgentMove times the home's KV capacity, the smallest of them (the
	// cheapest to recompute) pays the pair term on its home too, if
	// another replica has room for it under AgentMoveRoom times its
	// capacity. 0: off (the rule). Off by default: at 0.75 it takes the
	// tool-agent trace tool1's TTFT p99 from 1.15x to 0.71x Dynamo's and
	// the median of nine such traces from 1.12x to 0.93x, but a held-out
	// trace's from 0.72x to 1.10x, and agent-fleet at 8 replicas
	// (contexts past every replica's capacity) loses up to 31% of its
	// TTFT p50 on a seed (bench/EXPERIMENTS.md section 49).
	AgentMove float64
	// AgentMoveRoom is AgentMove's bound on the replica it moves to: 0 is
	// DefaultAgentMoveRoom.
	AgentMoveRoom float64
	// ColdAway, when positive, charges a cold prompt (one no usable
	// replica holds any block of) on each replica with the warm arrivals
	// the replica can expect within ColdAway, each of which would queue
	// behind its prefill: a cold prefill goes where warm traffic is not
	// about to arrive. A replica's warm arrivals are the requests routed
	// to it as the sole replica holding most of their prompt (coldaway.go:
	// an arrival other replicas hold as well can go around the prefill),
	// at a rate decayed over 30 s. Only below SubsetGuardReplicas usable
	// replicas, and not on a replica whose KV capacity is under 16 times
	// the prompt. 0: off (the rule). Off by default: at 0.5 s with
	// ColdAwayMax 8,192 it takes shared-prefix at 8 replicas with
	// 196,608-token caches from 1.07x to 1.05x dynamo-tuned's TTFT p99
	// and leaves every other measured row as the rule's on the report
	// seeds; on a tuning seed of hotspot a few changed cold placements
	// move its p99 by 6%, inside the band any such change moves it over
	// 24 seeds (bench/EXPERIMENTS.md sections 55, 58).
	ColdAway time.Duration
	// ColdAwayMax is the longest prompt (tokens) ColdAway charges: 0 is
	// no limit (an agent's long context is left to the pair term).
	ColdAwayMax int
	// EngineQueue, when positive, charges each request that a replica's
	// engine reported waiting at the last fresh scrape and that this
	// instance did not send (SetExternalLoad's waiting) EngineQueue tokens
	// of load beside request_cost (enginequeue.go), on every replica.
	// engine_metrics' queue. Off by default: 32768 brings several
	// precise instances on the tool-agent trace at 8 replicas to one
	// instance's TTFT p99 and costs the unsaturated 64-replica trace and
	// the conversation trace theirs (bench/EXPERIMENTS.md section 75).
	EngineQueue float64
	// EngineQueueSat scales EngineQueue by the fleet's mean of the
	// others' waiting requests per replica over EngineQueueSat, at most 1
	// (experiment).
	EngineQueueSat float64
}

// WithOptions returns a Router applying o that shares rt's index, registry
// and live load.
func (rt *Router) WithOptions(o Options) *Router {
	return (&Router{cfg: rt.cfg, opt: o, x: rt.x, shared: rt.shared}).knobbed()
}

// Options returns the Router's rule variants.
func (rt *Router) Options() Options { return rt.opt }

// shared is the state that Routers retuned from one another have in common.
type shared struct {
	idx *Index

	mu      sync.Mutex
	slots   map[string]Slot
	keys    [MaxReplicas]string
	keyHash [MaxReplicas]uint64
	n       atomic.Int32       // slots ever used: 0..n-1
	free    []Slot             // unregistered slots, reused first
	kvcap   [MaxReplicas]int64 // SetCapacity's tokens per slot; 0: Config.KVCapacity
	dens    densitySums        // the prompts' learned density (density.go)

	loads  [MaxReplicas]loadCell
	chains [MaxReplicas]chainList
	warm   [MaxReplicas]warmCell // warm arrivals' rate (Options.ColdAway)
	// promptAvg: the mean prompt (tokens) of this router's recent
	// reservations, scaled by promptAvgScale (Options.OnceBelow).
	promptAvg atomic.Int64
	// ixAvg: promptAvg when the index's capacities were last applied
	// under Options.IndexShareRoom.
	ixAvg atomic.Int64
	// capKnown: some slot's KV capacity was applied (applyCapacity);
	// QueueExtraFull's gate is shut for every request until then.
	capKnown atomic.Bool
	// extFresh: the slot's engine-reported load is from a fresh scrape
	// (SetExternalFresh; ForeignPrefill's prior skips it).
	extFresh [MaxReplicas]atomic.Bool
	qSum     atomic.Int64 // the others' waiting requests summed over the slots (SetExternalLoad)
	// firsts: the slot's reservations of this generation still before
	// their first token (neither PrefillDone nor released; Queued),
	// counted only once CountQueued has been called (queuedOn).
	firsts   [MaxReplicas]atomic.Int32
	queuedOn atomic.Bool

	spread    atomic.Uint64 // this instance's spill position (SetInstance)
	others    atomic.Bool   // external load, prefill or context seen (SawOthers)
	engOthers atomic.Bool   // engine-reported requests of others seen (SetExternalLoad; agreeOn)
	agreement agreement     // other instances seen in the answers (agree.go)

	// clock is the time since the Router was made (SetClock), read by
	// the pair term's lingering context.
	clock func() time.Duration
}

// NewRouter returns a Router for cfg, with defaults filled in.
func NewRouter(cfg Config) (*Router, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	return (&Router{
		cfg: cfg,
		x:   NewExtractor(cfg),
		shared: &shared{
			idx:   NewIndex(cfg.IndexBudget),
			slots: make(map[string]Slot),
			clock: func() time.Duration { return time.Since(start) },
		},
	}).knobbed(), nil
}

// SetClock replaces the Router's clock (default: the monotonic time since
// NewRouter) with now, e.g. a simulation's virtual time. Call it before
// the Router is used; Routers retuned from one another share it.
func (rt *Router) SetClock(now func() time.Duration) { rt.clock = now }

// clockMS is the Router's clock in milliseconds, wrapping at 2^32 (about
// 49 days): lingering context compares ages, never absolute times.
func (rt *Router) clockMS() uint32 { return uint32(rt.clock() / time.Millisecond) }

// lingerOn reports whether released context counts in the pair term, and
// its time to live in ms (0: forever).
func (rt *Router) lingerOn() (bool, uint32) {
	if rt.opt.NoLinger || rt.cfg.PairWeight == 0 {
		return false, 0
	}
	switch ttl := rt.opt.LingerTTL; {
	case ttl < 0:
		return true, 0
	case ttl == 0:
		return true, uint32(DefaultLingerTTL / time.Millisecond)
	default:
		return true, uint32(min(ttl/time.Millisecond, math.MaxUint32))
	}
}

// IndexShape is the part of c that the index and the fingerprints depend
// on: block_tokens, prefix_tokens, chars_per_token and index_budget. Two
// configurations of the same shape can share a Router's state.
func (c Config) IndexShape() Config {
	return Config{BlockTokens: c.BlockTokens, PrefixTokens: c.PrefixTokens,
		CharsPerToken: c.CharsPerToken, IndexBudget: c.IndexBudget}
}

// Retune returns a Router with cfg's knobs (defaults filled in) that shares
// rt's index, registry and live load, so that changing affinity_cap, alpha,
// request_cost, long_output_tokens, tie_epsilon or output_weight keeps
// everything ramjet learned. cfg must have rt's IndexShape.
func (rt *Router) Retune(cfg Config) (*Router, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.IndexShape() != rt.cfg.IndexShape() {
		return nil, errors.New("selection: retune cannot change block_tokens, prefix_tokens, chars_per_token or index_budget")
	}
	nrt := (&Router{cfg: cfg, opt: rt.opt, x: rt.x, shared: rt.shared}).knobbed()
	if cfg.KVCapacity != rt.cfg.KVCapacity {
		rt.mu.Lock()
		for s := range rt.Len() {
			if rt.keys[s] != "" {
				nrt.applyCapacity(Slot(s))
			}
		}
		rt.mu.Unlock()
	}
	return nrt, nil
}

// Config returns the Router's configuration, defaults filled in.
func (rt *Router) Config() Config { return rt.cfg }

// Extractor returns the body parser matching the Router's configuration.
func (rt *Router) Extractor() Extractor { return rt.x }

// Index returns the approximate index.
func (rt *Router) Index() *Index { return rt.idx }

// Register returns the slot of the replica named key (its dial address,
// plus "#rank" for a data-parallel rank), creating it on first use. A slot
// freed by Unregister is reused first, so slots stay dense.
func (rt *Router) Register(key string) (Slot, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if s, ok := rt.slots[key]; ok {
		return s, nil
	}
	var s Slot
	if k := len(rt.free); k > 0 {
		// The lowest free slot keeps the index's holder sets narrow.
		lo := 0
		for i := range rt.free {
			if rt.free[i] < rt.free[lo] {
				lo = i
			}
		}
		s = rt.free[lo]
		rt.free[lo] = rt.free[k-1]
		rt.free = rt.free[:k-1]
	} else {
		n := rt.n.Load()
		if n >= MaxReplicas {
			return -1, ErrTooManyReplicas
		}
		s = Slot(n)
		rt.n.Store(n + 1)
	}
	rt.keys[s] = key
	rt.keyHash[s] = xxhash.Sum64String(key)
	rt.slots[key] = s
	rt.applyCapacity(s)
	return s, nil
}

// SetCapacity sets slot s's KV cache capacity in tokens, as its engine
// reports it (vLLM's vllm:cache_config_info num_gpu_blocks x block_size,
// SGLang's max_total_num_tokens); 0 falls back to Config.KVCapacity. The
// approximate index believes s holds at most that many tokens of what
// ramjet sent it, the least recently sent presumed evicted first, so that
// overlap decays as the engine's cache does.
func (rt *Router) SetCapacity(s Slot, tokens int64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.kvcap[s] == max(0, tokens) && tokens > 0 && rt.indexShare() > 0 {
		// Unchanged (an engine scrape repeating it): the index keeps the
		// bound IndexShare gave it, which Capacity reports.
		return
	}
	rt.kvcap[s] = max(0, tokens)
	rt.applyCapacity(s)
}

// Capacity is slot s's KV cache capacity in tokens as the index applies
// it, in its estimated tokens (RealTokens; 0: unbounded).
func (rt *Router) Capacity(s Slot) int64 {
	return rt.idx.Capacity(s) * int64(rt.cfg.BlockTokens)
}

// applyCapacity hands slot s's capacity to the index (rt.mu held).
func (rt *Router) applyCapacity(s Slot) {
	tokens := rt.kvcap[s]
	if tokens == 0 {
		tokens = rt.cfg.KVCapacity
	}
	tokens = rt.RealTokens(tokens) // the engine's tokens in the index's
	blocks := int64(0)
	if tokens > 0 {
		it := tokens
		if sh := rt.indexShare(); sh > 0 && rt.indexShareOn(tokens) {
			it = int64(float64(tokens) * sh)
		}
		blocks = max(1, it/int64(rt.cfg.BlockTokens))
	}
	rt.idx.SetCapacity(s, blocks)
	rt.loads[s].kvtokens.Store(int32(min(tokens, math.MaxInt32)))
	if blocks > 0 && !rt.capKnown.Load() {
		rt.capKnown.Store(true)
	}
}

// Unregister forgets the replica named key (it left the fleet): its index
// entries, capacity and horizon are dropped, its load is zeroed, and
// reservations made on it before no longer count when they end. Its slot
// is free for the next Register. It reports whether key was registered.
//
// Callers must stop offering the slot as a Candidate before calling it;
// a Scratch or Candidate list naming the slot afterwards names whichever
// replica registers next.
func (rt *Router) Unregister(key string) bool { return rt.unregister(key, false) }

// UnregisterIdle is Unregister only while no request holds a reservation
// on key's slot, decided in the same atomic step that starts the slot's
// next generation: a reservation made concurrently either lands before
// (and UnregisterIdle reports false) or in the next generation (and its
// release balances it there). Its pending prefill and resident context
// are zero then, as no reservation holds any.
func (rt *Router) UnregisterIdle(key string) bool { return rt.unregister(key, true) }

func (rt *Router) unregister(key string, idle bool) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s, ok := rt.slots[key]
	if !ok {
		return false
	}
	c := &rt.loads[s]
	if !c.nextGen(idle) {
		return false
	}
	if !idle {
		// The old generation's reservations no longer count.
		c.pending.Store(0)
		c.resident.Store(0)
		rt.firsts[s].Store(0)
		rt.chains[s].mu.Lock()
		rt.chains[s].head = nil
		rt.chains[s].kv.Store(0)
		rt.chains[s].mu.Unlock()
	}
	rt.chains[s].eng.Store(0)
	rt.warm[s].v.Store(0) // a new replica in the slot starts without warm arrivals (ColdAway)
	delete(rt.slots, key)
	rt.keys[s] = ""
	rt.keyHash[s] = 0
	c.linger.Store(0)
	rt.qSum.Add(-int64(c.ext.waiting.Load()))
	c.resetExternal()
	rt.extFresh[s].Store(false)
	rt.kvcap[s] = 0
	rt.idx.release(s)
	rt.free = append(rt.free, s)
	return true
}

// Lookup returns the slot of key if it is registered.
func (rt *Router) Lookup(key string) (Slot, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s, ok := rt.slots[key]
	return s, ok
}

// Key returns the replica key of slot s ("" for a free slot).
func (rt *Router) Key(s Slot) string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.keys[s]
}

// Len bounds the slots in use: every registered replica's slot is in
// 0..Len-1 (a slot freed by Unregister has Key "" until reused).
func (rt *Router) Len() int { return int(rt.n.Load()) }

// Registered is the number of replicas registered now.
func (rt *Router) Registered() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.slots)
}

// Load returns slot s's in-flight requests and pending prefill tokens.
func (rt *Router) Load(s Slot) (inflight, pendingPrefill int64) {
	c := &rt.loads[s]
	return c.count(), c.pending.Load()
}

// Queued returns how many of this router's reservations on slot s are
// before their first token (neither Reservation.PrefillDone nor released):
// queued or prefilling on the engine. It counts only the reservations
// made after CountQueued (0 without it).
func (rt *Router) Queued(s Slot) int64 { return max(int64(rt.firsts[s].Load()), 0) }

// CountQueued turns on Queued's count for the reservations from now on
// (ForeignPrefill.QueueCost's SetRouter calls it); without it a request
// pays no count.
func (rt *Router) CountQueued() { rt.queuedOn.Store(true) }

// Resident returns the context tokens slot s's in-flight requests weigh
// under Config.ContextWeight.
func (rt *Router) Resident(s Slot) int64 { return rt.loads[s].resident.Load() }

// Lingering returns the released context slot s's pair term counts now
// (0 once the linger TTL has passed since the replica's last release, or
// with the linger off).
func (rt *Router) Lingering(s Slot) int64 {
	on, ttl := rt.lingerOn()
	if !on {
		return 0
	}
	return int64(rt.lingered(&rt.loads[s], rt.lingerClock(on, ttl), ttl))
}

// lingered is the released context of c the pair term counts at now (the
// router's clock, ms): decayed by Options.LingerHalfLife when set, else
// whole until ttl (0: forever) has passed since the last release.
func (rt *Router) lingered(c *loadCell, now, ttl uint32) float64 {
	lg := c.linger.Load()
	switch {
	case lg <= 0:
		return 0
	case rt.opt.LingerHalfLife > 0:
		return float64(lg) * math.Exp2(-float64(now-c.lingerAt.Load())/float64(rt.opt.LingerHalfLife.Milliseconds()))
	case ttl == 0 || now-c.lingerAt.Load() < ttl:
		return float64(lg)
	}
	return 0
}

// AssumedKVTokens is the KV capacity the context load assumes of a replica
// whose capacity is unknown: 262,144 tokens, about one H200's after the
// weights of a 32B model (bench/engine's default deployment).
const AssumedKVTokens = 1 << 18

// kv is c's KV capacity in tokens, AssumedKVTokens when unknown.
func (c *loadCell) kv() int64 {
	if kv := int64(c.kvtokens.Load()); kv > 0 {
		return kv
	}
	return AssumedKVTokens
}

// load is load(r) of the rule, in tokens, for a request of prompt
// tokens: the reservations (in-flight x request_cost + pending prefill),
// the engine-reported load of others, and the decode side
// (Config.ContextWeight, Config.PairWeight, Options.OverflowWeight).
func (rt *Router) load(s Slot, prompt int) float64 {
	return rt.loadPair(s, prompt, true, rt.lingerNow(), -1)
}

// lingerNow is the clock reading loadPair takes (any value when released
// context does not count).
func (rt *Router) lingerNow() uint32 { return rt.lingerClock(rt.lingerOn()) }

// lingerClock is lingerNow for lingerOn's answer (on, ttl), which Pick has
// read already (loadKnobs).
func (rt *Router) lingerClock(on bool, ttl uint32) uint32 {
	if on && ttl > 0 {
		return rt.clockMS()
	}
	return 0
}

// loadPair is load with the pair_weight term left out unless pairOn (the
// request's home is exempt from it); now is lingerNow's reading; hit is
// the request's deepest overlap, capped at the affinity cap (negative:
// unknown), which Options.PairCap and LingerCap bound the term by.
func (rt *Router) loadPair(s Slot, prompt int, pairOn bool, now uint32, hit int) float64 {
	ld, _ := rt.loadPairN(s, prompt, pairOn, now, hit)
	return ld
}

// loadPairN is loadPair and the in-flight count it read (the busy guard
// in Pick charges by the same reading).
func (rt *Router) loadPairN(s Slot, prompt int, pairOn bool, now uint32, hit int) (float64, int64) {
	k := rt.loadKnobs()
	return rt.loadWith(&k, s, prompt, pairOn, now, hit)
}

// loadKnobs are the options loadWith reads, their defaults applied: the
// same for every candidate of one Pick, which reads them once.
type loadKnobs struct {
	ow, floor float64 // OverflowWeight, PairFloor
	lingerOn  bool
	ttl       uint32
	bare      bool // no decode-side term: the reservations only
	owOff     bool // Options.OverflowHome: the candidate is the home, exempt
	// quiet: in Pick, a slot holding none of the prompt with nothing in
	// flight, pending, resident or reported by others pays the pair term
	// on its lingering context and the overflow term alone
	// (loadCell.still); off where an option reads other state
	// (SharedOnce, OnceBelow, EngineOverflow, EngineQueue).
	quiet bool
}

// loadKnobs returns the knobs the Router was made with (knobbed).
func (rt *Router) loadKnobs() loadKnobs { return rt.lk }

// knobbed fills rt's knobs from its configuration and options, which do
// not change after: every constructor of a Router ends with it.
func (rt *Router) knobbed() *Router {
	k := loadKnobs{ow: cmp.Or(rt.opt.OverflowWeight, DefaultOverflowWeight),
		floor: float64(cmp.Or(rt.opt.PairFloor, DefaultPairFloor))} // floor negative: none
	k.lingerOn, k.ttl = rt.lingerOn()
	k.bare = rt.cfg.ContextWeight == 0 && rt.cfg.PairWeight == 0 && k.ow <= 0
	k.quiet = !rt.opt.SharedOnce && rt.opt.OnceBelow <= 0 && !rt.opt.EngineOverflow && rt.opt.EngineQueue <= 0
	rt.lk = k
	o := &rt.opt
	rt.pk = pickKnobs{hot: cmp.Or(o.HotGuard, DefaultHotGuard), subset: cmp.Or(o.SubsetGuard, DefaultSubsetGuard),
		subsetFloor: DefaultSubsetFloor, profileQueue: cmp.Or(o.ProfileQueue, DefaultProfileQueue),
		homeAt: max(cmp.Or(o.OverflowHome, DefaultOverflowHome), 0), homeRoom: cmp.Or(o.OverflowHomeRoom, DefaultOverflowHomeRoom),
		fullW: cmp.Or(o.OverflowFull, DefaultOverflowFull), fullHome: cmp.Or(o.OverflowFullHome, DefaultOverflowFullHome),
		fullRoom: cmp.Or(o.OverflowFullRoom, DefaultOverflowFullRoom), agreeMax: cmp.Or(o.AgreeMax, DefaultAgreeMax)}
	if o.SubsetFloor > 0 {
		rt.pk.subsetFloor = o.SubsetFloor
	}
	return rt
}

// pickKnobs are options Pick reads once per request, with their defaults
// applied (the accessors hotGuard, subsetGuard, subsetFloor, profileQueue,
// overflowHome, agreeMax and overflowFull's).
type pickKnobs struct {
	hot, subset, subsetFloor, profileQueue float64
	homeAt, homeRoom                       float64
	fullW, fullHome, fullRoom              float64
	agreeMax                               int
}

// loadWith is loadPairN with its options read (rt.loadKnobs).
func (rt *Router) loadWith(k *loadKnobs, s Slot, prompt int, pairOn bool, now uint32, hit int) (float64, int64) {
	c := &rt.loads[s]
	if k.quiet && c.still() {
		return rt.quietLoad(k, c, prompt, pairOn, now, hit), 0
	}
	cfg := &rt.cfg
	n := c.count()
	ld := float64((n+c.extRequests())*int64(cfg.RequestCost)+c.pending.Load()+c.extPrefill()) + rt.engineQueue(s)
	ow := k.ow
	if k.owOff {
		ow = 0
	}
	if k.bare {
		return ld, n
	}
	// The others' contexts: the engine-reported KV tokens or the estimate
	// from their stored runs (SetExternalContext), the larger; the
	// estimate not for a prefix cold everywhere (hit 0), which rendezvous
	// placement puts where every instance does, each seeing the others'
	// contexts and not its own as foreign.
	mine, others := c.resident.Load(), c.extKV()
	if hit != 0 {
		others = max(others, int64(c.extCtx.Load()))
	}
	r := mine + others
	res, p, capa := float64(r), float64(prompt), float64(c.kv())
	if r > 0 {
		ld += cfg.ContextWeight * res * res / capa
	}
	// The pair term also counts the context of requests that ended on r
	// and whose successor has not come yet (c.linger): a closed-loop agent
	// between turns still holds its context there and will be back. Once
	// nothing was released on r for the linger TTL, it is presumed done.
	pres, pcap := res, capa
	if k.floor > capa { // max(capa, floor): capa is at least 1, neither is NaN
		pcap = k.floor
	}
	lgr := 0.0
	if k.lingerOn && pairOn {
		lgr = rt.lingered(c, now, k.ttl)
		pres += lgr
	}
	if pres > 0 && pairOn {
		ld += rt.pairTerm(p, pres, capa, pcap, lgr, hit)
	}
	// At the default weight the overflow counts this router's own
	// reservations only, not the engine-reported KV of others
	// (SetExternalLoad), which was not measured with it; an explicit
	// weight counts both (the experiment's form).
	if rt.opt.SharedOnce || rt.onceOn(capa) {
		mine = rt.chains[s].kv.Load()
	}
	own := float64(mine + others)
	if rt.opt.OverflowWeight == 0 {
		own = float64(mine)
	}
	if rt.opt.EngineOverflow {
		if e, ok := rt.engineHeld(s, c); ok {
			own = float64(e)
		}
	}
	if over := own + p - capa; over > 0 && ow > 0 {
		ld += ow * over
	}
	return ld, n
}

// quietLoad is loadWith for a slot with nothing in flight, pending,
// resident or reported by others (loadCell.still) under options that read
// no other state (loadKnobs.quiet): what its terms come to with those
// inputs zero, in their order: the pair term on the lingering context,
// then the overflow term on the prompt alone (0 + x is x).
func (rt *Router) quietLoad(k *loadKnobs, c *loadCell, prompt int, pairOn bool, now uint32, hit int) float64 {
	ld := 0.0
	p, capa := float64(prompt), float64(c.kv())
	if k.lingerOn && pairOn && c.linger.Load() > 0 { // lingered is 0 otherwise
		if lgr := rt.lingered(c, now, k.ttl); lgr > 0 {
			pcap := capa
			if k.floor > capa {
				pcap = k.floor
			}
			ld += rt.pairTerm(p, lgr, capa, pcap, lgr, hit)
		}
	}
	if over := p - capa; over > 0 && k.ow > 0 && !k.owOff {
		ld += k.ow * over
	}
	return ld
}

// pairTerm is loadWith's pair_weight term for a prompt of p tokens on a
// replica of capa KV tokens (pcap: capa floored, PairFloor) holding pres
// > 0 tokens of resident and lingering context, lgr of them lingering;
// hit is the request's deepest overlap, capped.
func (rt *Router) pairTerm(p, pres, capa, pcap, lgr float64, hit int) float64 {
	if rt.opt.PairSat {
		pres = min(pres, capa)
	}
	pair := rt.cfg.PairWeight * p * pres / pcap
	if rt.opt.PairSqrt {
		pair = rt.cfg.PairWeight * p * math.Sqrt(pres/pcap)
	}
	if rt.opt.PairShare {
		pair *= p / pcap
	}
	if hit > 0 && rt.opt.LingerCap > 0 && lgr > 0 {
		// The lingering part's share of the term, bounded.
		lpart := pair * lgr / pres
		pair += min(lpart, rt.opt.LingerCap*float64(hit)) - lpart
	}
	if hit > 0 && rt.opt.PairCap > 0 {
		pair = min(pair, rt.opt.PairCap*float64(hit))
	}
	return pair
}

// overflowHome is the home exemption's share of the prompt (0: off) and
// room (negative: no gate), Options.OverflowHome and OverflowHomeRoom
// with their defaults applied.
func (rt *Router) overflowHome() (at, room float64) { return rt.pk.homeAt, rt.pk.homeRoom }

// Learn records that slot s now holds f's prompt prefix.
func (rt *Router) Learn(f *Features, s Slot) { rt.idx.Learn(f.Blocks, s) }

// Forget drops everything the index believes slot s holds (an engine
// restarted with an empty cache).
func (rt *Router) Forget(s Slot) { rt.idx.Forget(s) }

// mix64 is the splitmix64 finalizer.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Rendezvous is the rendezvous weight of slot s for a prompt whose tie
// key (TieKey) is key: the highest weight wins a tie.
func (rt *Router) Rendezvous(key uint64, s Slot) uint64 {
	return mix64(key ^ rt.keyHash[s])
}

// tieKey is the block the rendezvous tie-break hashes, once Pick has
// filled s.Overlap: the first block of the prompt that not every usable
// replica holds (the deepest block when all hold it all). A prefix that
// every replica holds (a fleet-wide system prompt) then does not fix one
// replica order for every request that begins with it, while requests
// that share more than it (a conversation, a group's document) still agree
// on where to go, and independent ramjet instances that know the same
// fleet-wide prefix agree too. Options.FirstBlockTie hashes the first
// block instead (the earlier rule); a long prompt on a large fleet hashes
// its agentKey (agentTie).
func (rt *Router) tieKey(f *Features, cands []Candidate, s *Scratch) uint64 {
	if rt.opt.FirstBlockTie || len(f.Blocks) == 0 {
		return f.FirstBlock()
	}
	if key, ok := rt.agentTie(f, cands, s); ok {
		return key
	}
	return f.Blocks[min(max(s.low, 0)/rt.cfg.BlockTokens, len(f.Blocks)-1)]
}

// TieKey is the block of f that the rendezvous tie-break hashes in Pick
// over cands (s as Pick left it).
func (rt *Router) TieKey(f *Features, cands []Candidate, s *Scratch) uint64 {
	return rt.tieKey(f, cands, s)
}

// Pick scores every usable candidate and returns the best one. It reads the
// index once, allocates nothing once s has room for len(cands), and changes
// no state: call Reserve and Learn with the decision.
func (rt *Router) Pick(f *Features, cands []Candidate, s *Scratch) Decision {
	s.ensure(len(cands))
	// The per-candidate figures as slices of cands' length, so that the
	// loops below index them without bounds checks.
	ovs, lds, scs := s.Overlap[:len(cands)], s.Load[:len(cands)], s.Score[:len(cands)]
	var interest [MaxReplicas / 64]uint64 // the slots Pick asks the index about
	words := 0
	for i := range cands {
		if c := &cands[i]; c.Usable && !c.Precise {
			w := int(c.Slot) >> 6
			interest[w] |= 1 << (uint(c.Slot) & 63)
			s.depth[c.Slot] = 0
			words = max(words, w+1)
		}
	}
	if words > 0 {
		rt.idx.depths(f.Blocks, interest[:words], s.depth[:], &s.work)
	}

	cfg := &rt.cfg
	d := Decision{Index: -1}
	best := math.Inf(-1)
	sec, top := best, -1 // the best score but one (NaN when any was), and the best's index
	knobs := rt.loadKnobs()
	now := rt.lingerClock(knobs.lingerOn, knobs.ttl)
	prompt := f.PromptTokens(rt.cfg)
	want, wantSet := ProfileStandard, f.MaxTokens > 0
	if f.MaxTokens >= cfg.LongOutputTokens {
		want = ProfileSpeculative
	}
	bonus := 0.0
	if wantSet {
		bonus = cfg.OutputWeight * float64(f.MaxTokens)
	}
	// The deepest and second deepest overlaps (equal when two replicas
	// share the deepest): the request's home, if it has one, is the
	// replica with strictly the deepest, exempt from the pair term.
	// low is the least warm usable replica's overlap (what every usable
	// replica holds: Options.SubsetGuard).
	top1, top2, low := -1, -1, -1
	busy, usable := int64(0), 0
	pOr, pAnd := Profile(0), ^Profile(0) // the usable profiles differ where their OR and AND do
	bt, pending := cfg.BlockTokens, rt.opt.PendingDepth
	for i := range cands {
		c := &cands[i]
		if !c.Usable {
			continue
		}
		busy += rt.loads[c.Slot].count()
		usable++
		pOr, pAnd = pOr|c.Profile, pAnd&c.Profile
		ov := c.Overlap
		if !c.Precise {
			ov = int(s.depth[c.Slot]) * bt
			if pending {
				ov = rt.pendingDepth(c.Slot, f.Blocks, ov)
			}
		}
		ovs[i] = ov
		if low < 0 || ov < low {
			low = ov
		}
		if ov > top1 {
			top1, top2 = ov, top1
		} else if ov > top2 {
			top2 = ov
		}
	}
	s.top1, s.top2, s.low = top1, top2, low
	mixed := wantSet && usable > 0 && pOr != pAnd
	hit := min(top1, cfg.AffinityCap)
	// The output bonus's queue limit (Options.ProfileQueue), where the
	// usable replicas' profiles differ: their least pending prefill is
	// read only then, and each candidate's only against a limit.
	queueLim, limited := math.Inf(1), false
	if pq := rt.profileQueue(); pq > 0 && wantSet && mixed {
		pendMin := int64(math.MaxInt64)
		for i := range cands {
			if cands[i].Usable {
				pendMin = min(pendMin, rt.loads[cands[i].Slot].pending.Load())
			}
		}
		queueLim, limited = float64(pendMin)+pq*float64(cfg.RequestCost), true
	}
	// The busy guard's limit (Options.HotGuard; hot 0: no guard).
	hot, hotSub := 0.0, 0.0
	if g := rt.hotGuard(); g > 0 && usable > 0 {
		mean := max(1, float64(busy)/float64(usable))
		hot, hotSub = g*mean, g*mean
		if gs := rt.subsetGuard(); gs > 0 && usable >= SubsetGuardReplicas {
			hotSub = min(hot, max(gs*mean, rt.subsetFloor()))
		}
	}
	homeAt, homeRoom := rt.overflowHome()
	if w, ok := rt.overflowFull(cands, prompt, top1, low); ok {
		knobs.ow = min(knobs.ow, w)
	}
	awayMS := uint32(0)
	away := rt.opt.ColdAway > 0 && top1 <= 0 && usable < SubsetGuardReplicas && (rt.opt.ColdAwayMax <= 0 || prompt <= rt.opt.ColdAwayMax)
	if away {
		awayMS = rt.clockMS()
	}
	qx, qxKV := rt.queueExtra(top1, wantSet && mixed)
	cold := knobs.quiet && !away // the quiet case below: no per-replica term of an idle replica is on
	affCap, alpha := cfg.AffinityCap, cfg.Alpha
	for i := range cands {
		c := &cands[i]
		if !c.Usable {
			ovs[i], lds[i], scs[i] = 0, 0, math.NaN()
			continue
		}
		ov := ovs[i]
		ld := 0.0
		if lc := &rt.loads[c.Slot]; ov == 0 && cold && lc.still() {
			// A replica holding none of the prompt with nothing on it but
			// lingering context: its load is what loadWith's terms come
			// to with every other input zero, in their order: the pair
			// term on the lingering context (on: ov is 0), then the
			// overflow term on the prompt alone (0 + x is x). Its home
			// exemption, queue (nothing pending) and busy terms are zero.
			// This is quietLoad written out: called here it costs about
			// 0.4k instructions a request (callgrind, WholeChain/1KiB);
			// TestPickQuietMatchesTerms holds both to loadWith's terms.
			p, capa := float64(prompt), float64(lc.kv())
			if knobs.lingerOn && lc.linger.Load() > 0 { // lingered is 0 otherwise
				if lgr := rt.lingered(lc, now, knobs.ttl); lgr > 0 {
					pcap := capa
					if knobs.floor > capa {
						pcap = knobs.floor
					}
					ld += rt.pairTerm(p, lgr, capa, pcap, lgr, hit)
				}
			}
			if over := p - capa; over > 0 && knobs.ow > 0 {
				ld += knobs.ow * over
			}
		} else {
			pairOn := rt.opt.PairEverywhere || ov <= top2 || ov == 0
			if !pairOn && rt.opt.AgentMove > 0 {
				pairOn = rt.agentMove(cands, i, prompt, ov)
			}
			knobs.owOff = homeAt > 0 && ov > top2 && float64(ov) >= homeAt*float64(prompt) &&
				(homeRoom < 0 || float64(lc.kv()) < homeRoom*float64(prompt))
			var n int64
			ld, n = rt.loadWith(&knobs, c.Slot, prompt, pairOn, now, hit)
			if away {
				ld += rt.coldAway(c.Slot, prompt, awayMS)
			}
			if qx > 0 {
				ld += rt.queueExtraLoad(c.Slot, qx, qxKV)
			}
			if lim := hot; lim > 0 {
				if ov > low {
					lim = hotSub
				}
				if float64(n) > lim {
					ld += float64(cfg.RequestCost) * (float64(n) - lim)
				}
			}
		}
		sc := float64(min(ov, affCap)) - alpha*ld
		if wantSet && c.Profile == want && (!limited || float64(rt.loads[c.Slot].pending.Load()) <= queueLim) {
			sc += bonus
		}
		ovs[i], lds[i], scs[i] = ov, ld, sc
		d.Usable++
		if ov > d.BestOverlap {
			d.BestOverlap = ov
		}
		best, sec, top = runnerUp(sc, best, sec, top, i)
	}
	if d.Usable == 0 {
		return d
	}

	// Among the candidates within TieEpsilon of the best, apply the
	// tie-breaks in order. When the second best score is short of them
	// (and no score is NaN, which every comparison fails), the best is
	// the only one, and the rendezvous tie key is not needed unless a
	// rule below asks for it (keyed).
	var first uint64
	keyed := false
	w, ties := top, 1
	tied := best - cfg.TieEpsilon // the least score within TieEpsilon of the best
	if !(sec < tied) {
		first, keyed = rt.tieKey(f, cands, s), true
		w, ties = -1, 0
		for i := range cands {
			if !cands[i].Usable || scs[i] < tied {
				continue
			}
			ties++
			if w < 0 {
				w = i
				continue
			}
			if beats, _ := rt.prefer(cands, s, i, w, want, wantSet, first); beats {
				w = i
			}
		}
	}
	tieWinner := w // the only tied candidate when ties == 1
	if s.Overlap[w] == 0 && d.BestOverlap > 0 && usable >= SubsetGuardReplicas && prompt <= DefaultAgreeMax {
		w = rt.warmHold(cands, s, w, busy, usable)
	}
	// A spill (w holds less than the warmest usable replica, or a cold
	// prefix with ColdSpill): spill keeps w's overlap, so the band spill
	// after it sees the same case.
	if pos := rt.spread.Load(); pos != 0 && (s.Overlap[w] < d.BestOverlap || rt.opt.ColdSpill && d.BestOverlap == 0) {
		if !keyed {
			first, keyed = rt.tieKey(f, cands, s), true
		}
		if ties > 1 {
			w = rt.spill(cands, s, w, best, wantSet, first, pos)
		}
		if rt.opt.SpillBand > 0 && (rt.opt.SpillBandAlone || rt.SawOthers()) {
			w = rt.bandSpill(cands, s, w, best, rt.opt.SpillBand, first, pos)
		}
	}
	w = rt.agreePick(f, cands, s, w, best, prompt, &first, &keyed)
	// The rule that decided: the latest one the winner needed against any
	// other tied candidate (none to compare when the winner is the only
	// one: the loop is skipped).
	for i := range cands {
		if ties == 1 && w == tieWinner {
			break
		}
		if i == w || !cands[i].Usable || scs[i] < tied {
			continue
		}
		if !keyed {
			first, keyed = rt.tieKey(f, cands, s), true
		}
		if _, rule := rt.prefer(cands, s, w, i, want, wantSet, first); rule > d.Tie {
			d.Tie = rule
		}
	}

	d.Index, d.Slot = w, cands[w].Slot
	d.Overlap, d.Score, d.Load = s.Overlap[w], s.Score[w], s.Load[w]
	switch {
	case d.BestOverlap == 0:
		d.Reason = ReasonCold
	case d.Overlap < d.BestOverlap:
		d.Reason = ReasonLoadOverride
	case d.Tie > TieDepth:
		d.Reason = ReasonTieBreak
	default:
		d.Reason = ReasonAffinity
	}
	d.Prefill = max(0, prompt-d.Overlap)
	return d
}

// runnerUp folds candidate i's score sc into Pick's best score (top its
// index, the first to reach it) and sec, the best but one: max(sec, sc)
// as the scores come, and NaN from the first NaN score on, which Pick's
// tie loop counts as tied (every comparison with it fails). sec <= best
// while neither is NaN.
func runnerUp(sc, best, sec float64, top, i int) (float64, float64, int) {
	if sc > best {
		if sec == sec {
			sec = best
		}
		return sc, sec, i
	}
	if sec == sec && !(sc <= sec) {
		sec = sc
	}
	return best, sec, top
}

// hotGuard is Options.HotGuard with its default applied (<= 0: none).
func (rt *Router) hotGuard() float64 { return rt.pk.hot }

// subsetGuard is Options.SubsetGuard with its default applied (<= 0:
// none).
func (rt *Router) subsetGuard() float64 { return rt.pk.subset }

// profileQueue is Options.ProfileQueue with its default applied (<= 0:
// none).
func (rt *Router) profileQueue() float64 { return rt.pk.profileQueue }

// warmHold is the warm hold (Options.WarmHold) for w, a cold replica that
// won while others hold part of the prompt: among the holders running
// fewer than the hold's limit of in-flight requests whose queue (pending
// prefill less overlap) is at most w's pending prefill, the one with the
// shortest queue (ties: the best score), else w.
func (rt *Router) warmHold(cands []Candidate, s *Scratch, w int, busy int64, usable int) int {
	g := cmp.Or(rt.opt.WarmHold, DefaultWarmHold)
	if g <= 0 {
		return w
	}
	mean := float64(busy) / float64(usable)
	if mean < warmHoldMean {
		return w
	}
	lim := g * mean
	wait := rt.loads[cands[w].Slot].pending.Load()
	alt, altQ := w, int64(0)
	for i := range cands {
		c := &rt.loads[cands[i].Slot]
		q := c.pending.Load() - int64(s.Overlap[i])
		if !cands[i].Usable || s.Overlap[i] == 0 || float64(c.count()) >= lim || q > wait {
			continue
		}
		if alt == w || q < altQ || q == altQ && s.Score[i] > s.Score[alt] {
			alt, altQ = i, q
		}
	}
	return alt
}

// subsetFloor is Options.SubsetFloor with its default applied.
func (rt *Router) subsetFloor() float64 { return rt.pk.subsetFloor }

// prefer reports whether tied candidate i beats tied candidate j, and the
// rule that separated them.
func (rt *Router) prefer(cands []Candidate, s *Scratch, i, j int, want Profile, wantSet bool, first uint64) (bool, TieRule) {
	if s.Overlap[i] != s.Overlap[j] {
		return s.Overlap[i] > s.Overlap[j], TieDepth
	}
	if wantSet && cands[i].Profile != cands[j].Profile {
		return cands[i].Profile == want, TieProfile
	}
	ri, rj := rt.Rendezvous(first, cands[i].Slot), rt.Rendezvous(first, cands[j].Slot)
	if ri != rj {
		return ri > rj, TieRendezvous
	}
	if s.Load[i] != s.Load[j] {
		return s.Load[i] < s.Load[j], TieLoad
	}
	return i < j, TieOrder
}

// Reservation is the load one routed request puts on its replica, from the
// decision until the response ends. PrefillDone and Release are safe to
// call more than once and from any goroutine; each takes effect once.
type Reservation struct {
	rt       *Router
	slot     Slot
	gen      uint32 // the slot's generation when reserved
	prefill  int64
	resident int64
	// pend is what r put in its slot's pending prefill, taken out whole
	// (swapped for pendTaken) by PrefillDone or Release; setPrefill changes
	// it only while it is there.
	pend  atomic.Int64
	state atomic.Uint32 // 0 prefilling, 1 decoding, 2 released

	// What the approximate index predicted, for Observe: the blocks it
	// believed the replica held, the age (blocks touched on the replica
	// since) of the deepest of them, the prompt's estimated tokens, and
	// whether the precise path decided (Observe then learns nothing).
	predicted int32
	learned   learnTicket // the age, once Route's learn is applied (it may be queued)
	prompt    int32
	precise   bool
	observed  atomic.Bool
	densed    atomic.Bool // its prompt tokens went to the density (Observe)
	// The prompt's last block key and full blocks, which its reply's
	// charge hangs off (Index.Replied); replied once charged. held is the
	// key of the deepest block predicted held (0 none): the end of an
	// earlier prompt this one may extend, whose reply it may reuse.
	last, held uint64
	nblocks    int32
	replied    atomic.Bool

	// The prompt's block keys at four depths (its whole length, 15/16,
	// 3/4 and 1/2 of it, in blocks), by which a later prompt that shares
	// its prefix finds it, and the links of the replica's chain list
	// (reserveChain).
	tips       [4]uint64
	depths     [4]int32
	prev, next *Reservation
	linked     bool
	// shadowed: when reserved, the prompt shared a prefix with a request
	// still prefilling on the replica (Observe).
	shadowed bool
	// queued: counted in the router's firsts (CountQueued) until
	// PrefillDone or Release (beside the bools above: no padding added).
	queued bool
	// agent: the prompt's agentKey (agree.go), for Observe.
	agent uint64
	// blocks: the prompt's blocks, which later prompts on the replica
	// compare theirs with (Options.SharedOnce; empty otherwise).
	blocks []uint64
	// kv: the context it counts in its replica's chainList.kv; shared:
	// how many leading blocks of the prompt a later one on the replica
	// shares, which that one counts there (Options.SharedOnce).
	kv     int64
	shared int32
}

// Reserve puts one in-flight request with prefill pending prompt tokens on
// slot s. Call it right after Pick, before forwarding.
func (rt *Router) Reserve(s Slot, prefill int) *Reservation {
	r := new(Reservation)
	rt.reserveInto(r, s, prefill, 0)
	return r
}

func (rt *Router) reserveInto(r *Reservation, s Slot, prefill int, resident int64) {
	if r.learned.pending.Load() {
		// Storage reused before the queued learn it was given landed:
		// let it land first, it writes here.
		rt.idx.settle()
	}
	c := &rt.loads[s]
	gen := uint32(uint64(c.inflight.Add(1)) >> 32)
	c.pending.Add(int64(prefill))
	if r.queued = rt.queuedOn.Load(); r.queued {
		rt.firsts[s].Add(1)
	}
	if resident != 0 {
		c.resident.Add(resident)
		subFloor(&c.linger, int32(min(resident, math.MaxInt32)))
	}
	r.rt, r.slot, r.gen, r.prefill, r.resident = rt, s, gen, int64(prefill), resident
	r.pend.Store(int64(prefill))
	r.predicted, r.prompt, r.precise = 0, 0, false
	r.learned.age.Store(-1)
	r.learned.clock.Store(0)
	r.tips, r.depths, r.prev, r.next, r.linked, r.shadowed = [4]uint64{}, [4]int32{}, nil, nil, false, false
	r.state.Store(0)
	r.observed.Store(false)
	r.densed.Store(false)
	r.last, r.held, r.nblocks = 0, 0, 0
	r.replied.Store(false)
	r.blocks, r.shared, r.kv = r.blocks[:0], 0, 0
}

// maxChainScan bounds how many of a replica's in-flight reservations,
// the most recent first, reserveChain compares a new prompt with.
const maxChainScan = 256

// reserveChain is reserveInto for a prompt of blocks whose context is
// resident tokens: it compares the prompt with the requests in flight on s (the most recent
// maxChainScan). One whose prompt shares a prefix with this one (an
// earlier step of the same agent or conversation still running, a
// request of the same group) no longer counts the shared context, which
// this one's includes, so that resident counts each context about once,
// as the engine holds it (unless Options.NoChainDedup); and if one of
// them is still prefilling, this request's engine answer may report fewer
// cached tokens than the index predicted without anything being evicted
// (Observe, unless Options.ObserveShadowed). A shared prefix is found at j's whole prompt or at
// 15/16, 3/4 or 1/2 of it (the deepest that matches), so a prompt that
// extends j's but diverges in j's last blocks (a partial block, a
// rewritten tail) still finds it.
func (rt *Router) reserveChain(r *Reservation, s Slot, prefill int, resident int64, blocks []uint64) {
	rt.reserveInto(r, s, prefill, resident)
	if rt.opt.NoChainDedup && rt.opt.ObserveShadowed || resident == 0 || len(blocks) == 0 {
		return
	}
	once := rt.opt.SharedOnce || rt.opt.OnceBelow > 0
	if once {
		r.blocks = append(r.blocks[:0], blocks...)
	}
	ixRoom := rt.indexShareRoomOn()
	if once || ixRoom || rt.queueExtraRoomOn() || rt.fullRoomOn() {
		rt.notePrompt(resident)
	}
	if ixRoom {
		rt.reapplyIndexShare()
	}
	c := &rt.loads[s]
	nb := int32(len(blocks))
	r.depths = [4]int32{nb, nb - nb/16, nb - nb/4, nb / 2}
	for i, d := range r.depths {
		if d > 0 {
			r.tips[i] = blocks[d-1]
		}
	}
	bt := int64(rt.cfg.BlockTokens)
	l := &rt.chains[s]
	l.mu.Lock()
	n := 0
	if once {
		r.kv = resident
		l.kv.Add(resident)
	}
	for j := l.head; j != nil && n < maxChainScan; j, n = j.next, n+1 {
		if once {
			rt.shareOnce(l, j, blocks)
		}
		for i, d := range j.depths {
			if d > 0 && d <= nb && blocks[d-1] == j.tips[i] {
				if j.state.Load() == 0 {
					r.shadowed = true
				}
				if !rt.opt.NoChainDedup && j.resident != 0 {
					// j's first d blocks are this prompt's: count them once.
					keep := max(0, j.resident-int64(d)*bt)
					c.resident.Add(keep - j.resident)
					j.resident = keep
				}
				break
			}
		}
	}
	r.next, r.prev, r.linked = l.head, nil, true
	if l.head != nil {
		l.head.prev = r
	}
	l.head = r
	l.mu.Unlock()
}

// unchain takes r off its replica's chain list; it returns the context
// tokens r still counts.
func (r *Reservation) unchain() int64 {
	if !r.linked {
		return r.resident
	}
	l := &r.rt.chains[r.slot]
	l.mu.Lock()
	if r.prev != nil {
		r.prev.next = r.next
	} else if l.head == r {
		l.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	}
	r.prev, r.next, r.linked = nil, nil, false
	res := r.resident
	if r.kv != 0 {
		l.kv.Add(-r.kv)
	}
	l.mu.Unlock()
	return res
}

// Slot is the reserved replica.
func (r *Reservation) Slot() Slot { return r.slot }

// Settled reports that nothing but its owner refers to r: it was released
// (or never reserved) and no queued learn will write into it, so that a
// caller that pools it may zero and reuse its storage.
func (r *Reservation) Settled() bool {
	return (r.rt == nil || r.state.Load() == 2) && !r.learned.pending.Load()
}

// PrefillDone marks the prompt as computed (the first token arrived): the
// pending prefill no longer counts as load. It reports whether this call
// did it.
func (r *Reservation) PrefillDone() bool {
	if r.state.CompareAndSwap(0, 1) {
		if c := &r.rt.loads[r.slot]; c.gen() == r.gen {
			c.pending.Add(-r.pend.Swap(pendTaken))
			if r.queued {
				r.rt.firsts[r.slot].Add(-1)
			}
		}
		return true
	}
	return false
}

// pendTaken marks a reservation's pending prefill as taken out.
const pendTaken = math.MinInt64

// setPrefill makes n the prefill tokens r reserves (in its slot's pending
// prefill while it is prefilling): before its request is sent, by the
// goroutine that reserved it (ForeignPrefill.Reserved). A Release racing
// it (the request's context ended) takes out what is there, before or
// after the change, never both.
func (r *Reservation) setPrefill(n int64) {
	r.prefill = n
	c := &r.rt.loads[r.slot]
	for c.gen() == r.gen {
		old := r.pend.Load()
		if old == pendTaken {
			return
		}
		if r.pend.CompareAndSwap(old, n) {
			c.pending.Add(n - old)
			return
		}
	}
}

// Release ends the reservation. It reports whether this call did it.
func (r *Reservation) Release() bool {
	old := r.state.Swap(2)
	if old == 2 {
		return false
	}
	c := &r.rt.loads[r.slot]
	if c.gen() != r.gen {
		return true // the replica was unregistered since: its load was dropped
	}
	if old == 0 {
		c.pending.Add(-r.pend.Swap(pendTaken))
		if r.queued {
			r.rt.firsts[r.slot].Add(-1)
		}
	}
	if res := r.unchain(); res != 0 {
		c.resident.Add(-res)
		if on, ttl := r.rt.lingerOn(); on {
			kv := c.kv()
			if hl := r.rt.opt.LingerHalfLife; hl > 0 {
				now := r.rt.clockMS()
				age := float64(now - c.lingerAt.Load())
				c.linger.Store(int32(float64(c.linger.Load()) * math.Exp2(-age/float64(hl.Milliseconds()))))
				c.lingerAt.Store(now)
			} else if ttl > 0 {
				// What lingered past the TTL is done: start over.
				now := r.rt.clockMS()
				if now-c.lingerAt.Load() >= ttl {
					c.linger.Store(0)
				}
				c.lingerAt.Store(now)
			}
			addCap(&c.linger, int32(min(res, kv, math.MaxInt32)), int32(min(kv, math.MaxInt32)))
		}
	}
	// The count goes last and only in r's generation: while it holds,
	// UnregisterIdle leaves the slot alone, so the pending and resident
	// tokens above were taken from this generation's.
	for {
		w := c.inflight.Load()
		if uint32(uint64(w)>>32) != r.gen || c.inflight.CompareAndSwap(w, w-1) {
			return true
		}
	}
}

// subFloor subtracts d from v, never below zero.
func subFloor(v *atomic.Int32, d int32) {
	for {
		old := v.Load()
		if old == 0 || v.CompareAndSwap(old, max(0, old-d)) {
			return
		}
	}
}

// addCap adds d to v (both at most limit), never above limit.
func addCap(v *atomic.Int32, d, limit int32) {
	for {
		old := v.Load()
		n := min(int64(old)+int64(d), int64(limit))
		if v.CompareAndSwap(old, int32(n)) {
			return
		}
	}
}
