package selection

import (
	"math"
	mathbits "math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// ForeignPrefill estimates, per replica, the prefill work that other
// routers' requests are putting on it, from the engine's own KV events:
// several ramjet instances on the precise path each subscribe to every
// engine, so each sees every block any of them caused to be stored. A
// block run stored beyond what this instance's own pending requests
// explain is another instance's prompt being computed; it counts in
// load(r) (Router.SetExternalPrefill) as this instance's own pending
// prefill does, decaying with the time constant Tau once stored.
//
// Without it, an instance sees a replica that another instance has just
// started to warm with a long shared prefix (the engine's chunked prefill
// announces the prefix block run by block run) as warm and unloaded, and
// sends its own request to share that prefill. Alone it does not close
// that blind window (the first run is announced a chunk after the other
// instance's decision); with the cold spill and a 1024-token band
// (Options.ColdSpill, SpillBand) it does: the module's foreign_prefill,
// on by default with kv_events (bench/RESULTS.md, 2026-12-05; with
// engine_metrics too since the others' resident contexts).
//
// The decay follows the engines' prefill speed: Tau is the time they take
// to prefill TauTokens prompt tokens, learned from this instance's own
// requests (FirstTokenAfter: time to first token per prefill token, a low
// quantile of it, so that queueing behind other requests counts little),
// and DefaultForeignTau until it has learned it. A 1 s decay fits engines
// that prefill 4096 tokens a second or so, as the simulator's H200 does
// under load; on engines four times faster (or the benchmark's
// time-scaled simulators) the estimate must fade four times sooner, or
// the instances keep avoiding a replica whose foreign prefill is long
// done (bench/RESULTS.md, 2026-12-05, "foreign_prefill's decay follows
// the engines").
//
// Only runs of at least MinBlocks blocks count: a decoding request stores
// one block at a time, a prefill chunk many. This instance's own requests
// are credited with their expected prefill (Reserved: in the preflight's
// tokens when it has them, what the engine stores) and their stored
// blocks are not foreign; a credit is dropped once this instance has no
// prefill pending on the replica and Grace has passed since its last own
// first token (the events of its last chunk can trail the first token).
// Safe for concurrent use; memory is fixed (one cell per slot).
//
// The others' stored runs are also their requests' contexts, resident on
// the replica while those requests decode: with ResidentLives positive
// they count as such (Router.SetExternalContext), decaying with
// ResidentLives times the mean life of this instance's own requests
// (Lived: from sending to the end of the response), learned; until one
// has ended, with the oldest one's age (ResidentLife). They do not count
// for a prompt whose prefix no replica holds (Router.SetExternalContext).
// Without it an instance sees the replicas that the
// others keep busy with long contexts as idle, and with several instances
// the agents' first turns pile onto the few replicas warm with their
// shared prefix (bench/RESULTS.md, 2026-12-05, "the others' contexts").
//
// What the KV events cannot show, the others' queued requests (a waiting
// request stores nothing until its prefill runs), SetPrior estimates from
// this instance's own pending prefill and the others' share of the stored
// tokens.
//
// The lifecycle, the same in the module and the fleet simulation:
// SetRouter once (and again on a reload), StoredRun from the KV feeds
// (kvindex.Precise.OnStored), Refresh before each Route, Reserved with
// Route's reservation, FirstToken at each of this instance's first tokens,
// Lived at each one's end.
type ForeignPrefill struct {
	// Tau is the decay time constant of a stored foreign run's weight
	// until the engines' prefill speed is learned, and always when
	// TauTokens is 0.
	Tau time.Duration
	// TauTokens, when positive, sets the decay to the time the engines
	// take to prefill this many prompt tokens, once learned
	// (FirstTokenAfter), bounded to [Tau/TauRange, Tau*TauRange].
	TauTokens int
	// MinBlocks is the smallest stored run (in blocks) counted as prefill.
	MinBlocks int
	// Grace is how long after this instance's last first token on a
	// replica its leftover credit still absorbs stored runs.
	Grace time.Duration

	// ResidentLives, when positive, also counts the foreign stored runs as
	// the others' resident contexts, decaying with this many times the
	// learned mean life of this instance's requests (ResidentDecay).
	// NewForeignPrefill sets DefaultResidentLives; 0 turns it off.
	ResidentLives float64
	// ResidentLife is the mean life assumed until one of this instance's
	// requests has ended; 0: the time since the first Refresh (the age of
	// the oldest request, a lower bound of its life).
	ResidentLife time.Duration

	// ResidentWhole counts each foreign stored token as the context it
	// stands for: a run stored by another instance's request is only the
	// part of its prompt the engine had not cached, and the request keeps
	// its whole prompt resident. The scale is this instance's own ratio of
	// prompt tokens to prefill tokens (Reserved; at most
	// MaxResidentWhole): behind a front that deals requests alike, the
	// others' requests extend the same contexts. Off, an agent's next turn
	// on a replica counts as its few new tokens (bench/RESULTS.md,
	// 2026-12-06, "the others' whole contexts").
	ResidentWhole bool
	// ResidentWholeMax, when positive, bounds ResidentWhole's scale below
	// MaxResidentWhole.
	ResidentWholeMax float64

	// ResidentEarly counts the others' contexts from the first stored run
	// this instance sees, not from its own first request: the life's lower
	// bound (ResidentLife 0) is the age of the oldest stored run, and a
	// run stored while no life is known yet counts undecayed until one is.
	// Off, an instance whose first request comes after the others' first
	// agents were placed sees none of their contexts, and its first
	// decisions' decay is the few seconds since its own first request
	// (bench/RESULTS.md, 2026-12-06, "the others' whole contexts").
	ResidentEarly bool

	// OwnInflight, once the router has seen other instances, counts a
	// stored run as this instance's own when all its blocks belong to its
	// requests in flight there, and as the others' otherwise, whatever the
	// pooled credit says (StoredMine; kvindex.Precise.SetForeign gives the
	// blocks). Off, it counts the credit's cover as its own: its own
	// requests' recomputing under KV pressure read as the others' prefill
	// and the others' runs stored while its prefill is pending as its own
	// (experiment, fleetsim fpown; bench/EXPERIMENTS.md, section 115).
	OwnInflight bool

	// RefreshEvery bounds how often Refresh decays the estimates on the
	// router (each Route calls it): at most once per RefreshEvery.
	RefreshEvery time.Duration

	// QueueCost, when positive, adds to SetPrior's estimate of the others'
	// unseen load QueueCost tokens per request of this instance's still
	// before its first token on the replica (Router.Queued: reserved,
	// neither PrefillDone nor released), scaled as the pending prefill is
	// (prior x rho): an
	// agent's next turn at its home reserves few prefill tokens, so a home
	// queue of such turns shows in the prior as next to nothing
	// (experiment, fleetsim fpn=<tokens>; off by default).
	QueueCost int64
	// QueueWait, when positive, scales QueueCost's charge on a replica by
	// min(1, w / QueueWait), w the mean (exponentially weighted) of this
	// instance's own requests' wait there beyond their prefill: the time
	// to the first token less the prefill at the learned speed
	// (FirstTokenAfter). A saturated home's turns wait seconds, a step's
	// wait is milliseconds (experiment, fleetsim fpnw=<seconds>).
	QueueWait time.Duration
	// QueueWaitShare, when positive, scales QueueWait's charge by
	// min(1, w / (QueueWaitShare x the replicas)), w how many replicas'
	// mean waits (as QueueWait's) are at least QueueWait: whole once that
	// share of the fleet waits. A saturated fleet's homes all wait; a few
	// replicas waiting half a second among 64 do not open it (experiment,
	// fleetsim fpnws=<share>).
	QueueWaitShare float64

	rt      atomic.Pointer[Router]
	perTok  atomic.Uint64 // learned seconds per prefill token (float64 bits), 0 until learned
	life    atomic.Uint64 // learned mean life of a request in seconds (float64 bits), 0 until learned
	first   atomic.Int64  // the first Refresh, Unix nanoseconds
	last    atomic.Int64  // Refresh's last run, Unix nanoseconds
	counted atomic.Uint64 // foreign tokens counted (Stored), ever
	runs    atomic.Uint64 // stored runs with a foreign part, ever
	own     atomic.Uint64 // stored tokens credited to this instance's own requests, ever
	recent  atomic.Bool   // the windowed share reached ForeignEvidenceShare (Stored)
	prior   atomic.Uint64 // SetPrior's scale (float64 bits), 0: off
	prompts atomic.Uint64 // this instance's prompt tokens reserved, ever (ResidentWhole)
	fills   atomic.Uint64 // their prefill tokens, ever

	mu     sync.Mutex
	cells  [MaxReplicas]foreignCell
	active SlotSet // slots with a foreign estimate, under mu
	// wOwn and wForeign are the own and foreign stored tokens decayed with
	// EvidenceWindow, as of wAt (under mu).
	wOwn, wForeign float64
	wAt            time.Time

	waits   [MaxReplicas]atomic.Uint64 // QueueWait's mean wait per slot, seconds (float64 bits)
	waiting atomic.Int64               // QueueWaitShare: slots whose mean wait is at least QueueWait
}

type foreignCell struct {
	credit    int64     // own prefill tokens expected to be stored
	v         float64   // decayed foreign stored tokens, as of at
	at        time.Time // when v was last updated
	lastFirst time.Time // this instance's last first token here
	r         float64   // decayed foreign stored tokens as resident contexts (ResidentLives), as of rat
	rat       time.Time
}

// Default ForeignPrefill settings.
const (
	DefaultForeignTau       = time.Second
	DefaultForeignMinBlocks = 4
	DefaultForeignGrace     = 100 * time.Millisecond
	DefaultForeignRefresh   = 5 * time.Millisecond
	// DefaultForeignTauTokens: the decay is the engines' time for this many
	// prompt tokens at the learned speed. On the simulator's H200 under the
	// benchmarks' load (about 0.29 ms per prefill token at the tracked
	// quantile) that is about 1.2 s, near the 1 s chosen there as a
	// constant (bench/RESULTS.md, 2026-12-05).
	DefaultForeignTauTokens = 4096
	// DefaultResidentLives: the others' contexts decay with twice the mean
	// life of this instance's requests (chosen in the fleet simulation
	// over 1; bench/RESULTS.md, 2026-12-05, "the others' contexts").
	DefaultResidentLives = 2
	// DefaultForeignPrior is SetPrior's scale where no engine reports its
	// queue (the module's foreign_prefill unset, without engine_metrics):
	// the others' queued requests on a replica warm with a shared prefix
	// store nothing, and without it every instance's first turns of new
	// agents joined the first replica warm with their prefix while its
	// queue grew (agent-fleet at 8 replicas, 4 instances: 11 of 48 agents
	// on one replica, p99 20 s; bench/RESULTS.md, 2026-12-05, "the
	// first-turn pile-up").
	DefaultForeignPrior = 1

	// TauRange bounds the learned decay to [Tau/TauRange, Tau*TauRange].
	TauRange = 16
	// foreignLearnMin is the smallest prefill (tokens) a first token is
	// learned from: below it the time is mostly fixed costs.
	foreignLearnMin = 1024
	// The quantile tracker of the time per prefill token: it converges to
	// the foreignQuantile of the observations, moving by a factor of at
	// most exp(foreignStep) per one.
	foreignQuantile = 0.25
	foreignStep     = 0.05
	// lifeWeight is the weight of each new life in the learned mean (an
	// exponentially weighted one).
	lifeWeight = 1.0 / 32
)

// NewForeignPrefill returns a ForeignPrefill with the default settings.
func NewForeignPrefill() *ForeignPrefill {
	return &ForeignPrefill{Tau: DefaultForeignTau, TauTokens: DefaultForeignTauTokens, MinBlocks: DefaultForeignMinBlocks,
		Grace: DefaultForeignGrace, RefreshEvery: DefaultForeignRefresh, ResidentLives: DefaultResidentLives}
}

// Routed credits slot s with the prefill tokens of a request this
// instance just sent there (Decision.Prefill).
func (f *ForeignPrefill) Routed(s Slot, prefill int) {
	if s < 0 || s >= MaxReplicas || prefill <= 0 {
		return
	}
	f.mu.Lock()
	f.cells[s].credit += int64(prefill)
	f.mu.Unlock()
}

// Credit adds tokens to slot s's credit of this instance's own expected
// stored tokens, as Routed does, for a request already routed: the
// tokens of its prompt past what its reservation credited (the bytes'
// estimate, its tokens known only later: kvindex.Late). Non-positive
// tokens and slots out of range are ignored.
func (f *ForeignPrefill) Credit(s Slot, tokens int64) {
	if s < 0 || s >= MaxReplicas || tokens <= 0 {
		return
	}
	f.mu.Lock()
	f.cells[s].credit += tokens
	f.mu.Unlock()
}

// FirstToken records that one of this instance's requests on slot s got
// its first token at t (its prefill is done).
func (f *ForeignPrefill) FirstToken(s Slot, t time.Time) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	f.mu.Lock()
	f.cells[s].lastFirst = t
	f.mu.Unlock()
}

// FirstTokenAfter is FirstToken for a request whose reservation expected
// prefill tokens to compute and whose first token came took after it was
// sent: it also learns the engines' prefill speed from it (see TauTokens).
func (f *ForeignPrefill) FirstTokenAfter(s Slot, t time.Time, prefill int64, took time.Duration) {
	f.FirstToken(s, t)
	f.learn(prefill, took)
	if f.QueueWait > 0 && s >= 0 && s < MaxReplicas && took > 0 {
		x := max(took.Seconds()-float64(max(prefill, 0))*math.Float64frombits(f.perTok.Load()), 0)
		w := &f.waits[s]
		old := math.Float64frombits(w.Load())
		nw := old + waitWeight*(x-old)
		w.Store(math.Float64bits(nw))
		if thr := f.QueueWait.Seconds(); f.QueueWaitShare > 0 {
			switch {
			case old < thr && nw >= thr:
				f.waiting.Add(1)
			case old >= thr && nw < thr:
				f.waiting.Add(-1)
			}
		}
	}
}

// waitWeight is the weight of each new wait in QueueWait's mean.
const waitWeight = 1.0 / 8

// learn moves the time per prefill token towards the foreignQuantile of
// the observed ones (a multiplicative quantile tracker: lock-free, one
// word).
func (f *ForeignPrefill) learn(prefill int64, took time.Duration) {
	if prefill < foreignLearnMin || took <= 0 {
		return
	}
	x := took.Seconds() / float64(prefill)
	for {
		old := f.perTok.Load()
		est := math.Float64frombits(old)
		switch {
		case est == 0:
			est = x
		case x < est:
			est *= math.Exp(-foreignStep * (1 - foreignQuantile))
			est = max(est, x)
		case x > est:
			est *= math.Exp(foreignStep * foreignQuantile)
			est = min(est, x)
		default:
			return
		}
		if f.perTok.CompareAndSwap(old, math.Float64bits(est)) {
			return
		}
	}
}

// Lived records that one of this instance's requests ended took after it
// was sent: the mean life that ResidentDecay scales (an exponentially
// weighted mean, lock-free). Non-positive durations are ignored.
func (f *ForeignPrefill) Lived(took time.Duration) {
	if took <= 0 {
		return
	}
	x := took.Seconds()
	for {
		old := f.life.Load()
		est := math.Float64frombits(old)
		if est == 0 {
			est = x
		} else {
			est += lifeWeight * (x - est)
		}
		if f.life.CompareAndSwap(old, math.Float64bits(est)) {
			return
		}
	}
}

// ResidentDecay is the decay time constant of the others' resident
// contexts at now: ResidentLives times the learned mean life (before a
// request has ended, ResidentLife or a lower bound of it), 0 (none
// counted) while off.
func (f *ForeignPrefill) ResidentDecay(now time.Time) time.Duration {
	life := math.Float64frombits(f.life.Load())
	if first := f.first.Load(); life <= 0 && f.ResidentLife <= 0 && first != 0 {
		life = time.Duration(now.UnixNano() - first).Seconds()
	} else if life <= 0 {
		life = f.ResidentLife.Seconds()
	}
	if f.ResidentLives <= 0 || life <= 0 {
		return 0
	}
	return time.Duration(f.ResidentLives * life * float64(time.Second))
}

// Decays reports the decay time constants in use, of the others' prefill
// estimate (Decay) and of their resident contexts (ResidentDecay: 0 while
// not counted), and false while the estimate is off (no router: before
// SetRouter, after Detach).
func (f *ForeignPrefill) Decays() (prefill, context time.Duration, on bool) {
	if f.rt.Load() == nil {
		return 0, 0, false
	}
	return f.Decay(), f.ResidentDecay(time.Now()), true
}

// Decay is the decay time constant in use: TauTokens at the learned
// prefill speed (bounded by TauRange around Tau), or Tau.
func (f *ForeignPrefill) Decay() time.Duration {
	est := math.Float64frombits(f.perTok.Load())
	if f.TauTokens <= 0 || est <= 0 || f.Tau <= 0 {
		return f.Tau
	}
	d := time.Duration(est * float64(f.TauTokens) * float64(time.Second))
	return min(max(d, f.Tau/TauRange), f.Tau*TauRange)
}

// Stored takes a BlockStored run of blocks blocks of blockTokens tokens
// on slot s, delivered at t; ownPending is this instance's prefill still
// reserved on s (Router.Load). It reports the tokens counted as foreign.
func (f *ForeignPrefill) Stored(s Slot, blocks, blockTokens int, ownPending int64, t time.Time) int64 {
	return f.StoredOwn(s, blocks, 0, blockTokens, ownPending, t)
}

// StoredOwn is Stored for a run of which own blocks are known to be this
// instance's (its precise index marks them as routed there by it:
// kvindex.Index.Own). The run takes the credit first, as Stored; what the
// credit does not cover counts as foreign except for up to own blocks'
// tokens, which count as own. Under KV pressure this instance's requests
// store more than their reservations credit: a request preempted and
// recomputed stores again the blocks the engine evicted meanwhile, and one
// whose cached prefix the engine evicted while it queued prefills it
// again. Without it a lone instance read those runs as other instances'
// prefill (the tool-agent traces at 8 x 65,536: a third to a half of its
// own stored tokens; bench/EXPERIMENTS.md, section 113).
func (f *ForeignPrefill) StoredOwn(s Slot, blocks, own, blockTokens int, ownPending int64, t time.Time) int64 {
	return f.storedRun(s, blocks, blockTokens, ownPending, t, func(c *foreignCell, n int64) int64 {
		mine := min(n, c.credit)
		c.credit -= mine
		return mine + min(n-mine, int64(max(own, 0))*int64(blockTokens))
	})
}

// StoredMine is Stored for a run of which mine blocks belong to this
// instance's requests in flight on s (its precise index holds their key
// chains from the decision to the request's end: kvindex.Precise.
// SetForeign gives the whole run or none). They count as own and the rest
// as foreign, whatever the credit says: the credit is pooled per replica,
// and another instance's run stored while this one's prefill is pending
// took it as this instance's (a quarter to a third of the others' stored
// tokens on the tool-agent windows at 8 x 65,536 with 2 instances;
// bench/EXPERIMENTS.md, section 115). The credit still drains as Stored
// drains it.
func (f *ForeignPrefill) StoredMine(s Slot, blocks, mine, blockTokens int, ownPending int64, t time.Time) int64 {
	return f.storedRun(s, blocks, blockTokens, ownPending, t, func(c *foreignCell, n int64) int64 {
		own := min(n, int64(max(mine, 0))*int64(blockTokens))
		c.credit -= min(c.credit, own)
		return own
	})
}

// storedRun counts one stored run of blocks x blockTokens tokens on s:
// after the credit's Grace rule, own (under f.mu) says how many of them are
// this instance's; the rest are foreign and returned.
func (f *ForeignPrefill) storedRun(s Slot, blocks, blockTokens int, ownPending int64, t time.Time, own func(c *foreignCell, n int64) int64) int64 {
	if s < 0 || s >= MaxReplicas || blocks < max(f.MinBlocks, 1) || blockTokens <= 0 {
		return 0
	}
	n := int64(blocks) * int64(blockTokens)
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &f.cells[s]
	if ownPending <= 0 && t.Sub(c.lastFirst) > f.Grace {
		c.credit = 0
	}
	if f.ResidentEarly {
		f.first.CompareAndSwap(0, t.UnixNano())
	}
	mine := own(c, n)
	f.count(c, s, mine, n-mine, t)
	return n - mine
}

// count adds one stored run's own and foreign tokens on slot s (cell c),
// stored at t, to the estimate. Under mu.
func (f *ForeignPrefill) count(c *foreignCell, s Slot, mine, foreign int64, t time.Time) {
	if mine > 0 {
		f.own.Add(uint64(mine))
	}
	f.window(mine, foreign, t)
	if foreign > 0 {
		c.v = c.decayed(t, f.Decay()) + float64(foreign)
		c.at = t
		if rtau := f.ResidentDecay(t); rtau > 0 {
			c.r = decay(c.r, c.rat, t, rtau) + float64(foreign)*f.WholeScale()
			c.rat = t
		} else if f.ResidentEarly && f.ResidentLives > 0 {
			c.r += float64(foreign) * f.WholeScale() // no life known yet: kept whole until one is
			c.rat = t
		}
		f.active.Add(s)
		f.counted.Add(uint64(foreign))
		f.runs.Add(1)
	}
}

// MaxResidentWhole bounds ResidentWhole's scale.
const MaxResidentWhole = 64

// WholeScale is the context one foreign stored token stands for
// (ResidentWhole): this instance's prompt over prefill tokens so far,
// within [1, MaxResidentWhole] (or ResidentWholeMax); 1 while off or
// before a prefill.
func (f *ForeignPrefill) WholeScale() float64 {
	fills := f.fills.Load()
	if !f.ResidentWhole || fills == 0 {
		return 1
	}
	top := float64(MaxResidentWhole)
	if f.ResidentWholeMax > 0 {
		top = min(top, max(f.ResidentWholeMax, 1))
	}
	return min(max(float64(f.prompts.Load())/float64(fills), 1), top)
}

// SetRouter sets the router whose load the estimate joins: StoredRun
// reads this instance's pending prefill from it and, with Refresh, hands
// it the estimate (Router.SetExternalPrefill). Routers retuned from one
// another share their load, so any of them will do. With QueueCost set
// it turns on the router's count of queued requests (Router.CountQueued).
func (f *ForeignPrefill) SetRouter(rt *Router) {
	if f.QueueCost > 0 && rt != nil {
		rt.CountQueued()
	}
	f.rt.Store(rt)
}

// StoredRun takes one BlockStored event of a KV feed (a
// kvindex.StoredFunc): Stored with this instance's pending prefill on s
// (Router.Load), then the new estimate to the router. Without a router it
// does nothing.
func (f *ForeignPrefill) StoredRun(s Slot, blocks, blockTokens int, at time.Time) {
	rt := f.rt.Load()
	if rt == nil || s < 0 || s >= MaxReplicas {
		return
	}
	_, pend := rt.Load(s)
	if f.StoredOwn(s, blocks, 0, blockTokens, pend, at) > 0 {
		f.Apply(rt, s, at)
	}
}

// StoredRunOwn is StoredRun with own of the run's blocks marked as this
// instance's by its precise index and mine of them belonging to its
// requests in flight (kvindex.Precise.SetForeign): StoredOwn until the
// router has seen other instances' load or stored runs (Router.SawOthers,
// not its answers' agreement), then StoredMine with OwnInflight, else
// StoredOwn without the marks. The marks tell this
// router's blocks from the others' but not its requests from theirs: with
// several instances behind a front that deals an agent's turns to any of
// them, an agent's context evicted and recomputed by another instance's
// turn is marked as this router's too, and counted so the others' share
// fell to a third of its value (the tool-agent windows at 8 x 65,536 with
// 2 and 4 instances; bench/EXPERIMENTS.md, section 113). Its requests in
// flight tell them apart, with OwnInflight: each instance counts its own
// recomputing as its own and the others' as theirs (section 115).
func (f *ForeignPrefill) StoredRunOwn(s Slot, blocks, own, mine, blockTokens int, at time.Time) {
	rt := f.rt.Load()
	if rt == nil || s < 0 || s >= MaxReplicas {
		return
	}
	_, pend := rt.Load(s)
	var foreign int64
	switch {
	case !rt.others.Load():
		foreign = f.StoredOwn(s, blocks, own, blockTokens, pend, at)
	case f.OwnInflight:
		foreign = f.StoredMine(s, blocks, mine, blockTokens, pend, at)
	default:
		foreign = f.StoredOwn(s, blocks, 0, blockTokens, pend, at)
	}
	if foreign > 0 {
		f.Apply(rt, s, at)
	}
}

// Reserved credits the request Route just reserved res for (Routed with
// its slot and prefill); nil (no replica usable) does nothing. tokens is
// the prompt's token count as the preflight made it (0: none; see
// kvindex.Late.PromptTokens): the reservation's prefill counts the
// prompt's bytes over chars_per_token, and an engine whose tokenizer makes
// more tokens of them (the chat template's, say) stores more than that
// estimate, which read as another instance's prefill on own requests
// (bench/EXPERIMENTS.md, section 32). The reservation's pending prefill
// (Router.Load) takes the same count: Stored keeps a credit while
// prefill is pending, and a reservation of 0 (an exact overlap past the
// bytes' estimate of the prompt: an agent's next turn) with a credit of
// its template's tokens lost the credit once Grace had passed since the
// replica's last first token, before its own runs were stored. A
// reservation whose overlap is the estimate's (not Reservation.precise) and
// whose prompt has fewer tokens than the estimate counted takes its
// prefill scaled to the prompt's tokens instead, when that is more: the
// estimate's overlap is in its own units (kvindex's lone-chat test).
func (f *ForeignPrefill) Reserved(res *Reservation, tokens int) {
	if res == nil {
		return
	}
	if tokens > 0 && res.prompt > 0 {
		n := res.prefill + int64(tokens) - int64(res.prompt)
		if !res.precise {
			// The overlap is the estimate's, in tokens estimated from
			// bytes: where the prompt has fewer tokens than that
			// estimate, the shift leaves the cached part counted in the
			// estimate's larger units and credits less than the engine
			// stores (a long conversation in prose lighter than
			// chars_per_token routed on its cached message prefix:
			// every turn's run read as foreign). The prefill in the
			// prompt's tokens is the estimate's share of them.
			n = max(n, res.prefill*int64(tokens)/int64(res.prompt))
		}
		res.setPrefill(max(n, 0))
	}
	f.Routed(res.slot, int(res.prefill))
	if f.ResidentWhole {
		f.prompts.Add(uint64(max(tokens, int(res.prompt), 0)))
		f.fills.Add(uint64(max(res.prefill, 0)))
	}
	if rt := f.rt.Load(); rt != nil && f.Prior() > 0 && res.slot >= 0 && res.slot < MaxReplicas && !rt.ExternalFresh(res.slot) {
		if p := f.unseen(rt, res.slot); p > rt.ExternalPrefill(res.slot) {
			rt.SetExternalPrefill(res.slot, p)
		}
		f.mu.Lock()
		f.active.Add(res.slot)
		f.mu.Unlock()
	}
}

// SetPrior sets the scale of the others' unseen load (0: off, as a new
// ForeignPrefill has it; the module sets DefaultForeignPrior by default).
// It applies only to replicas whose engine-reported load is not fresh
// (Router.ExternalFresh: no engine_metrics, no good scrape yet, or a
// stale one): a fresh scrape's queue counts the others' queued requests
// already. With it, each replica
// counts x rho times this instance's own pending prefill there (its
// requests not yet at their first token: queued or prefilling) as the
// others' pending prefill, the larger of it
// and the estimate from their stored runs; rho is the ratio of the
// foreign to this instance's own stored tokens so far. Behind a front
// that deals requests alike to every instance the others send rho times
// as much as this instance does, and their queued requests store nothing
// until their prefill runs: without engine_metrics (which reports the
// queues) an instance sees a home queue of the others' requests as a
// quarter as long as it is with 4 instances (bench/RESULTS.md,
// 2026-12-05, "the others' queues"). Scaling the whole reserved load
// (in-flight x request_cost too) was measured to cost the conversation
// trace (decoding requests are no queue). Alone rho is 0 and nothing
// changes. Safe to call at any time.
func (f *ForeignPrefill) SetPrior(x float64) { f.prior.Store(math.Float64bits(max(x, 0))) }

// Prior is SetPrior's scale.
func (f *ForeignPrefill) Prior() float64 { return math.Float64frombits(f.prior.Load()) }

// ForeignEvidenceShare is the share rho (Share) of foreign over own
// stored tokens from which the others' stored runs are evidence of other
// instances (Router.SawOthers; the spill band waits for it). Through real
// HTTP a lone instance misread a few of its own runs as foreign, rho at
// most 0.016 (bench/RESULTS.md, 2026-12-05, "the lone instance's spill
// band under the new gating"); behind a front that deals requests alike, each
// other instance adds about 1. It is evidence since ever and within
// EvidenceWindow (evidence); the wait rule's default (kvindex, tokenize_wait
// auto) relies on it to see other instances without waiting.
const ForeignEvidenceShare = 0.25

// EvidenceWindow is the time constant of the windowed share that is
// evidence of other instances too (evidence): the share since ever alone
// let an instance with a long history alone see one that joined only once
// the newcomer had stored a third of that history (an hour alone: twenty
// minutes at equal rates). Windowed, an instance that stores as much as
// this one is seen within about 0.29 EvidenceWindow of its start. The
// windowed share counts only while this instance's own stored tokens in
// the window are at least EvidenceMinOwn: after a quiet spell one own
// request's run misread as foreign (its credit dropped before its last
// chunk's events came) would be a share of 1.
const (
	EvidenceWindow = time.Minute
	EvidenceMinOwn = 16384
)

// evidence tells rt it has seen other instances once the foreign stored
// tokens reach ForeignEvidenceShare of this instance's own (any foreign
// tokens before its own first), since ever or within EvidenceWindow
// (decayed: window).
func (f *ForeignPrefill) evidence(rt *Router) {
	if c := f.counted.Load(); c > 0 && float64(c) >= ForeignEvidenceShare*float64(f.own.Load()) || f.recent.Load() {
		rt.sawOthers()
	}
}

// window adds one stored run's own and foreign tokens, stored at t, to the
// decayed counts, and notes when their share reaches
// ForeignEvidenceShare. Under mu.
func (f *ForeignPrefill) window(own, foreign int64, t time.Time) {
	if dt := t.Sub(f.wAt); dt > 0 {
		k := math.Exp(-dt.Seconds() / EvidenceWindow.Seconds())
		f.wOwn, f.wForeign, f.wAt = f.wOwn*k, f.wForeign*k, t
	}
	f.wOwn += float64(own)
	f.wForeign += float64(foreign)
	if f.wOwn >= EvidenceMinOwn && f.wForeign >= ForeignEvidenceShare*f.wOwn && !f.recent.Load() {
		f.recent.Store(true)
	}
}

// Share is rho: the foreign over this instance's own stored tokens so far
// (0 before this instance's first).
func (f *ForeignPrefill) Share() float64 {
	if own := f.own.Load(); own > 0 {
		return float64(f.counted.Load()) / float64(own)
	}
	return 0
}

// unseen is the others' unseen load on s in tokens (SetPrior).
func (f *ForeignPrefill) unseen(rt *Router, s Slot) int64 {
	p := f.Prior()
	if p <= 0 || rt.ExternalFresh(s) {
		return 0 // off (the default), or the engine's fresh queue counts them: Refresh and Apply read no more
	}
	k := p * f.Share()
	if k <= 0 {
		return 0
	}
	_, pend := rt.Load(s)
	if f.QueueCost > 0 {
		n := float64(rt.Queued(s))
		if f.QueueWait > 0 {
			n *= min(1, math.Float64frombits(f.waits[s].Load())/f.QueueWait.Seconds())
			if f.QueueWaitShare > 0 && n > 0 {
				n *= min(1, float64(max(f.waiting.Load(), 0))/(f.QueueWaitShare*float64(max(rt.Len(), 1))))
			}
		}
		q := float64(f.QueueCost) * n
		pend += int64(q)
	}
	return int64(k * float64(pend))
}

// Refresh hands the router every slot's estimate decayed to now, at most
// once per RefreshEvery; a slot whose estimate has decayed to nothing is
// set to 0 once and then skipped. It does not allocate.
func (f *ForeignPrefill) Refresh(now time.Time) {
	rt := f.rt.Load()
	if rt == nil {
		return
	}
	t := now.UnixNano()
	if last := f.last.Load(); f.RefreshEvery > 0 && t >= last && t-last < int64(f.RefreshEvery) {
		return
	}
	f.last.Store(t)
	f.first.CompareAndSwap(0, t)
	f.evidence(rt)
	tau, rtau := f.Decay(), f.ResidentDecay(now)
	f.mu.Lock()
	defer f.mu.Unlock()
	for w := range f.active {
		for bits := f.active[w]; bits != 0; bits &= bits - 1 {
			s := Slot(w*64 + mathbits.TrailingZeros64(bits))
			v, r := f.cells[s].estimate(now, tau, rtau)
			v = max(v, f.unseen(rt, s))
			rt.SetExternalPrefill(s, v)
			rt.SetExternalContext(s, r)
			if v == 0 && r == 0 {
				f.active.Remove(s)
			}
		}
	}
}

// Detach stops the estimate: every slot it set on the router is set back
// to 0, the router is forgotten and the state dropped (foreign_prefill
// turned off by a reload, the feeds stopped).
func (f *ForeignPrefill) Detach() {
	rt := f.rt.Swap(nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	for w := range f.active {
		for bits := f.active[w]; bits != 0 && rt != nil; bits &= bits - 1 {
			rt.SetExternalPrefill(Slot(w*64+mathbits.TrailingZeros64(bits)), 0)
			rt.SetExternalContext(Slot(w*64+mathbits.TrailingZeros64(bits)), 0)
		}
	}
	f.cells = [MaxReplicas]foreignCell{}
	f.active.Clear()
	for i := range f.waits {
		f.waits[i].Store(0)
	}
	f.waiting.Store(0)
}

// Counted reports the foreign prefill tokens counted and the stored runs
// they came from, since the ForeignPrefill was made.
func (f *ForeignPrefill) Counted() (tokens, runs uint64) { return f.counted.Load(), f.runs.Load() }

// Pending is slot s's foreign prefill estimate at now, in tokens.
func (f *ForeignPrefill) Pending(s Slot, now time.Time) int64 {
	v, _ := f.Estimate(s, now)
	return v
}

// Estimate is slot s's foreign prefill and resident context estimates at
// now, in tokens.
func (f *ForeignPrefill) Estimate(s Slot, now time.Time) (prefill, context int64) {
	if s < 0 || s >= MaxReplicas {
		return 0, 0
	}
	tau, rtau := f.Decay(), f.ResidentDecay(now)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cells[s].estimate(now, tau, rtau)
}

// Apply hands slot s's estimates at now to rt (Router.SetExternalPrefill,
// SetExternalContext).
func (f *ForeignPrefill) Apply(rt *Router, s Slot, now time.Time) {
	v, r := f.Estimate(s, now)
	rt.SetExternalPrefill(s, max(v, f.unseen(rt, s)))
	rt.SetExternalContext(s, r)
	f.evidence(rt)
}

// Reset drops slot s's state (the replica left the fleet).
func (f *ForeignPrefill) Reset(s Slot) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	f.mu.Lock()
	f.cells[s] = foreignCell{}
	f.active.Remove(s)
	f.mu.Unlock()
	// QueueWait's mean wait there, and its count among the waiting slots.
	old := math.Float64frombits(f.waits[s].Swap(0))
	if f.QueueWaitShare > 0 && f.QueueWait > 0 && old >= f.QueueWait.Seconds() {
		f.waiting.Add(-1)
	}
}

// estimate is the cell's prefill and resident context estimates at now, in
// tokens, decayed with tau and rtau.
func (c *foreignCell) estimate(now time.Time, tau, rtau time.Duration) (prefill, context int64) {
	return int64(math.Round(c.decayed(now, tau))), int64(math.Round(decay(c.r, c.rat, now, rtau)))
}

// decayed is the prefill estimate v at now (decay).
func (c *foreignCell) decayed(now time.Time, tau time.Duration) float64 {
	return decay(c.v, c.at, now, tau)
}

// decay is v as of at, decayed to now: exp(-(now-at)/tau) of it (all of
// it at or before at, none with tau <= 0 or below one token).
func decay(v float64, at, now time.Time, tau time.Duration) float64 {
	if v == 0 {
		return 0
	}
	d := now.Sub(at)
	if d <= 0 {
		return v
	}
	if tau <= 0 {
		return 0
	}
	v *= math.Exp(-float64(d) / float64(tau))
	if v < 1 {
		return 0
	}
	return v
}

// Prefill is the prefill tokens r reserved (Decision.Prefill at Reserve;
// the preflight's count after ForeignPrefill.Reserved): what a
// ForeignPrefill credits with Routed.
func (r *Reservation) Prefill() int64 { return r.prefill }
