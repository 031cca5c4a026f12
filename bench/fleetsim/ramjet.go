package fleetsim

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// Ramjet routes through the real selection.Router with the call the Caddy
// module makes: one Router.Route per decision (Pick, Reserve, Learn, and
// for the precise path the same kvindex.Precise annotator), PrefillDone at
// the first token, Release at completion. The rule's variants are Router
// options of the same call (selection.Options), so a change to the routing
// rule shows up here and in the module with no second edit.
//
// Features are built from the synthesised token ids rather than from a
// request body: Blocks and PromptBytes are those of a body whose text has
// RamjetDensity bytes per real token (DensityBlocks; by default the
// router's CharsPerToken, where the blocks are selection.AppendTokenBlocks
// over the bounded prefix with the router's BlockTokens), so the router
// sees the same structure (a shared prefix, a conversation extending its
// previous turn) that it derives from bytes in production.
type Ramjet struct {
	rt    *selection.Router
	f     *selection.Features
	s     *selection.Scratch
	cands []selection.Candidate
	res   map[int]*selection.Reservation // by trace ID
	seed  uint64
	label string
	// density is the prompts' bytes per real token (RamjetDensity when
	// the policy was made; 0: the router's CharsPerToken).
	density float64
	// dpx: the precise path's exact overlaps in estimated tokens (estUnits).
	dpx bool

	// pre is the precise path (ramjet-precise), nil otherwise.
	pre *kvindex.Precise
	// setup says which engine signals the policy uses.
	setup RamjetSetup
	// keys, when set, are the replica keys (UseReplicaKeys).
	keys []string
	// nextScrape is when the next engine scrape is due (EngineLoad);
	// extSeen sums the external requests the scrapes found.
	nextScrape time.Duration
	extSeen    int64
	// now is the simulated time of the event being handled (ScrapeEngines
	// hears it before every event): the router's clock.
	now     time.Duration
	scrapes int

	// Reasons counts decisions by reason.
	Reasons map[string]int

	// trace, when set, receives one line per decision (SetTrace);
	// traceEst is the estimate's depth per slot before the decision.
	trace    io.Writer
	traceEst [selection.MaxReplicas]int32
	// traceOwn: whether this router routed to the slot the block one
	// router block past the estimate's credit (the estimate cap's test,
	// kvindex capByEstimate), before the decision.
	traceOwn [selection.MaxReplicas]bool
	// traceLift: each slot's load before the decision (in-flight,
	// pending prefill, resident context) and which of the lift stack's
	// clauses (kvindex capByEstimate with the default CapLoad, CapPeer,
	// CapGain x the fleet's saturation, CapFit) would let its exact
	// overlap past the estimate stand, whatever the policy's own config.
	traceLift [selection.MaxReplicas]liftSnap
	flip      flipProbe
}

// flipOn, flipID, flipRep: a probe (ramjet-precise@flip=K): request
// flipID is decided with replica flipRep left out, one different
// decision and nothing else (a placebo for a rule that changes few).
type flipProbe struct {
	on  bool
	id  int
	rep int
}

type liftSnap struct {
	inf, pend, res, capa  int64
	load, peer, gain, fit bool
}

// SetTrace makes the policy write one line per decision to w: the
// request, the chosen replica and reason, and every usable candidate's
// overlap, load and score (explain's figures), the others' prefill and
// context it counts (lg: Router.Lingering; xp, xc: SetExternalPrefill, SetExternalContext), beside what its engine
// holds of the prompt (eng) and in all (ecache, tokens) and what the
// index believes it holds (icache) and its horizon (hz, blocks), for
// finding where the index departs from the engine and where a rule
// sends what; and one line per first token ("first id=...") and per
// engine answer's usage ("obs id=... prompt=... cached=...": whether an
// affinity decision really hit). nil turns it off.
func (p *Ramjet) SetTrace(w io.Writer) { p.trace = w }

func (p *Ramjet) traceDecision(r *Request, d selection.Decision, fleet []*Replica) {
	fmt.Fprintf(p.trace, "id=%d now=%.3f at=%.3f sess=%d turn=%d group=%d in=%d out=%d -> %d %s/%s ov=%d best=%d |",
		r.Row.ID, p.now.Seconds(), r.Row.At, r.Row.Session, r.Row.Turn, r.Row.Group, r.Row.Input, r.Row.Output,
		d.Index, d.Reason, d.Tie, d.Overlap, d.BestOverlap)
	// The precise path: each candidate's estimate (est, what the
	// approximate index alone credits) beside its exact overlap (x, -1: no
	// fresh feed) and whether Pick read the exact one (P1).
	est := &p.traceEst
	for i := range p.s.Score {
		if p.s.Score[i] != p.s.Score[i] {
			continue
		}
		inf, pend := p.rt.Load(p.cands[i].Slot)
		// What the engine holds of the prompt now and in all (cached
		// tokens), against what the index believes it holds (-1: not known).
		held, all := -1, -1
		if e, ok := fleet[i].eng.(*engine.Engine); ok {
			held = e.CachedPrefix(r.Prompt)
			st := e.Stats()
			all = st.CachedBlocks * e.Config().BlockSize
		}
		fmt.Fprintf(p.trace, " %d:ov%d/ld%.0f/sc%.0f/n%d/p%d/run%d/wait%d/kv%.2f/res%d/lg%d/xp%d/xc%d/eng%d/ecache%d/icache%d/hz%d", i, p.s.Overlap[i], p.s.Load[i], p.s.Score[i],
			inf, pend, fleet[i].Running(), fleet[i].Waiting(), fleet[i].KVUsage(), p.rt.Resident(p.cands[i].Slot), p.rt.Lingering(p.cands[i].Slot),
			p.rt.ExternalPrefill(p.cands[i].Slot), p.rt.ExternalContext(p.cands[i].Slot), held, all,
			p.rt.Index().Held(p.cands[i].Slot)*int64(p.rt.Config().BlockTokens), p.rt.Index().Horizon(p.cands[i].Slot))
		if p.pre != nil {
			x, pr := -1, 0
			if d.Precise || p.cands[i].Precise {
				x = p.cands[i].Overlap
			}
			if p.cands[i].Precise {
				pr = 1
			}
			own := 0
			if p.traceOwn[p.cands[i].Slot] {
				own = 1
			}
			fmt.Fprintf(p.trace, "/est%d/x%d/P%d/own%d", int(est[p.cands[i].Slot])*p.rt.Config().BlockTokens, x, pr, own)
			l := &p.traceLift[p.cands[i].Slot]
			fmt.Fprintf(p.trace, "/n0%d/p0%d/r0%d/cap%d/lift%s", l.inf, l.pend, l.res, l.capa, liftFlags(l))
		}
	}
	fmt.Fprintln(p.trace)
}

// NewRamjet returns a ramjet policy with cfg (zero fields take the
// selection defaults).
func NewRamjet(cfg selection.Config) (*Ramjet, error) {
	return newRamjet(cfg, selection.Options{}, "ramjet")
}

// RamjetSetup is how a ramjet policy is wired to the engines: the rule's
// variant and which of the engines' signals it uses. The zero value is
// ramjet as shipped with the module's scraper: each engine's KV capacity
// known (SetCapacity, from vllm:cache_config_info).
type RamjetSetup struct {
	Options selection.Options
	// NoCapacity leaves the engines' KV capacity unknown (no scraper, no
	// kv_capacity setting): the index is bounded by its budget only.
	NoCapacity bool
	// CapacityScale, when positive, scales the capacity told (probe).
	CapacityScale float64
	// IndexOnly, LoadOnly: the capacity bounds only the index, or only
	// the load term's (probes).
	IndexOnly, LoadOnly bool
	// IndexScale, when positive, tells the index alone IndexScale x the
	// capacity the load terms are told (probe "capi": the over-belief of
	// the index apart from the load terms' capacity). It turns IndexShare
	// off, which would hand the index the load terms' capacity again; a
	// learned density past chars_per_token (which re-applies it) undoes
	// it too: use it at densities of chars_per_token or denser, or with
	// dl=0.
	IndexScale float64
	// NoObserve does not feed the engines' cached-token counts back
	// (Router.Observe).
	NoObserve bool
	// EngineLoad, when positive, scrapes every engine's running and
	// waiting requests and KV usage at this interval and adds the load
	// this policy did not reserve to the router's (ScrapeEngines), as the
	// module's engine_metrics does.
	EngineLoad time.Duration
}

// ramjetVariants are the ramjet variants NewPolicy knows beside the
// ones it names, in table order.
var ramjetVariants = map[string]RamjetSetup{
	"ramjet-nocap":       {NoCapacity: true},
	"ramjet-noobserve":   {NoObserve: true},
	"ramjet-nocap-noobs": {NoCapacity: true, NoObserve: true},
}

var ramjetVariantNames = []string{"ramjet-nocap", "ramjet-noobserve", "ramjet-nocap-noobs"}

func init() { Variants = append(Variants, ramjetVariantNames...) }

// ramjetNamed returns the ramjet variant name names: one of
// ramjetVariants, or "ramjet@k=v+k=v..." for an experiment (knobs cw
// context_weight, pw pair_weight, ow overflow_weight (0: none), outw output_weight, rc request_cost, cap affinity_cap, cpt chars_per_token, bt block_tokens, pt prefix_tokens, alpha, eps
// tie_epsilon, el engine-load scrape interval in seconds (0: off); flags
// nocap, noobs, marginal, firsttie, obsall (Options.ObserveShadowed),
// nochain (Options.NoChainDedup), dl=0 (Options.FixedDensity), once (Options.SharedOnce), onceb (Options.OnceBelow), agreeext (Options.AgreeExt: engine_metrics agree), eo (Options.EngineOverflow; with el or -engine-load), owhome (Options.OverflowHome, 0: none) and owroom (Options.OverflowHomeRoom, 0: no gate), owfull (Options.OverflowFull, 0: off), owfh (Options.OverflowFullHome, 0: no gate) and owfroom (Options.OverflowFullRoom, 0: no gate), ixs (Options.IndexShare, 0: off; ixs=-1+qx=-1 is the rule before they became the default) and ixsr (Options.IndexShareRoom, 0: no gate), qx (Options.QueueExtra, 0: off) with its gates qxr (Options.QueueExtraRoom, 0: no gate), qxfull (Options.QueueExtraFull, 0: no gate) and qxwarm (Options.QueueExtraWarm: warm requests too; qxcold, the default, is accepted), homewarm (Options.HomeWarm), pdepth (Options.PendingDepth), reply (Options.ReplyCharge), guard (Options.InflightGuard), gc (guard with Options.GuardCap), hot (Options.HotGuard, 0: none), subset (Options.SubsetGuard, 0: none), subfloor (Options.SubsetFloor), pq (Options.ProfileQueue, 0: none), wh (Options.WarmHold, 0: none), em (Options.AgentMove) and emt (Options.AgentMoveRoom), caw (Options.ColdAway, seconds) and cawmax (Options.ColdAwayMax), lhl (Options.LingerHalfLife, seconds), and the pair term's forms
// paireverywhere, pairshare, pairsqrt, pairsat, nolinger; lt the linger
// TTL in seconds, negative: forever; pairfloor the pair term's capacity
// floor in tokens (0: selection.DefaultPairFloor, negative: none), paircap and lingercap its bound (whole, or its
// lingering part) as a fraction of the request's deepest overlap; probes
// of the capacity: capx scales it, capi=K tells the index alone K x it (IndexShare off), capidx tells it to the index only,
// capload to the load term only). ok is false when
// name is neither. Keys are separated by "+" (-policy splits on commas).
func ramjetNamed(name string, cfg selection.Config) (p Policy, ok bool, err error) {
	if setup, found := ramjetVariants[name]; found {
		setup.EngineLoad = RamjetEngineLoad
		p, err := NewRamjetVariant(cfg, setup, name)
		return p, true, err
	}
	spec, found := strings.CutPrefix(name, "ramjet@")
	if !found {
		return nil, false, nil
	}
	setup := RamjetSetup{EngineLoad: RamjetEngineLoad}
	for _, kv := range strings.Split(spec, "+") {
		k, v, hasV := strings.Cut(kv, "=")
		var x float64
		if hasV {
			if x, err = strconv.ParseFloat(v, 64); err != nil {
				return nil, true, fmt.Errorf("policy %s: %s: %w", name, k, err)
			}
		}
		switch k {
		case "cw":
			cfg.ContextWeight = x
		case "pw":
			cfg.PairWeight, cfg.Explicit = x, cfg.Explicit|selection.KnobPairWeight
		case "ow":
			setup.Options.OverflowWeight = ZeroIsNone(x)
		case "outw":
			cfg.OutputWeight, cfg.Explicit = x, cfg.Explicit|selection.KnobOutputWeight
		case "rc":
			cfg.RequestCost, cfg.Explicit = int(x), cfg.Explicit|selection.KnobRequestCost
		case "cap":
			cfg.AffinityCap = int(x)
		case "cpt":
			cfg.CharsPerToken = x
		case "bt":
			cfg.BlockTokens = int(x)
		case "pt":
			cfg.PrefixTokens = int(x)
		case "alpha":
			cfg.Alpha, cfg.Explicit = x, cfg.Explicit|selection.KnobAlpha
		case "eps":
			cfg.TieEpsilon, cfg.Explicit = x, cfg.Explicit|selection.KnobTieEpsilon
		case "nocap":
			setup.NoCapacity = true
		case "noobs":
			setup.NoObserve = true
		case "marginal":
			setup.Options.Marginal = true
		case "pairshare":
			setup.Options.PairShare = true
		case "pairsqrt":
			setup.Options.PairSqrt = true
		case "pairsat":
			setup.Options.PairSat = true
		case "paireverywhere":
			setup.Options.PairEverywhere = true
		case "pairfloor":
			setup.Options.PairFloor = int64(x)
		case "paircap":
			setup.Options.PairCap = x
		case "lhl":
			setup.Options.LingerHalfLife = seconds(x)
		case "obsall":
			setup.Options.ObserveShadowed = true
		case "nochain":
			setup.Options.NoChainDedup = true
		case "lingercap":
			setup.Options.LingerCap = x
		case "nolinger":
			setup.Options.NoLinger = true
		case "lt":
			setup.Options.LingerTTL = seconds(x)
			if x < 0 {
				setup.Options.LingerTTL = -1
			}
		case "hot":
			setup.Options.HotGuard = ZeroIsNone(x)
		case "subfloor":
			setup.Options.SubsetFloor = x
		case "subset":
			setup.Options.SubsetGuard = ZeroIsNone(x)
		case "reply":
			setup.Options.ReplyCharge = true
		case "hfloor":
			setup.Options.HorizonFloor = x
		case "guard":
			setup.Options.InflightGuard = true
		case "capidx":
			setup.IndexOnly = true
		case "capload":
			setup.LoadOnly = true
		case "capx":
			setup.CapacityScale = x
		case "capi":
			setup.IndexScale = x
			setup.Options.IndexShare = -1
		case "once":
			setup.Options.SharedOnce = true
		case "onceb":
			setup.Options.OnceBelow = x
		case "gc":
			setup.Options.InflightGuard, setup.Options.GuardCap = true, x
		case "pq":
			setup.Options.ProfileQueue = ZeroIsNone(x)
		case "wh":
			setup.Options.WarmHold = ZeroIsNone(x)
		case "firsttie":
			setup.Options.FirstBlockTie = true
		case "el":
			setup.EngineLoad = seconds(x)
		case "agree":
			setup.Options.AgreeBand = ZeroIsNone(x)
		case "agreemax":
			setup.Options.AgreeMax = int(x)
		case "agreeall":
			setup.Options.AgreeAlways = true
		case "home":
			setup.Options.AgreeHome = ZeroIsNone(x)
		case "stale":
			setup.Options.AgreeStale = ZeroIsNone(x)
		case "agreewalk":
			setup.Options.AgreeWalk = true
		case "ixsr":
			setup.Options.IndexShareRoom = ZeroIsNone(x)
		case "qx":
			setup.Options.QueueExtra = ZeroIsNone(x)
		case "qxfull":
			setup.Options.QueueExtraFull = ZeroIsNone(x)
		case "qxcold":
			setup.Options.QueueExtraWarm = false // the default
		case "qxwarm":
			setup.Options.QueueExtraWarm = true
		case "qxr":
			setup.Options.QueueExtraRoom = ZeroIsNone(x)
		case "ixs":
			setup.Options.IndexShare = ZeroIsNone(x)
		case "dl": // dl=0: the density fixed at chars_per_token (the learned one is the default)
			if !hasV || x != 0 {
				return nil, true, fmt.Errorf("policy %s: dl takes only =0 (the density fixed at chars_per_token; the learned one is the default)", name)
			}
			setup.Options.FixedDensity = true
		case "owfull":
			setup.Options.OverflowFull = ZeroIsNone(x)
		case "owfh":
			setup.Options.OverflowFullHome = ZeroIsNone(x)
		case "owfroom":
			setup.Options.OverflowFullRoom = ZeroIsNone(x)
		case "em":
			setup.Options.AgentMove = x
		case "emt":
			setup.Options.AgentMoveRoom = x
		case "noagenttie":
			setup.Options.NoAgentTie = true
		case "agreeext":
			setup.Options.AgreeExt = true
		case "homewarm":
			setup.Options.HomeWarm = true
		case "eo":
			setup.Options.EngineOverflow = true
		case "owhome":
			setup.Options.OverflowHome = ZeroIsNone(x)
		case "pdepth":
			setup.Options.PendingDepth = true
		case "owroom":
			setup.Options.OverflowHomeRoom = ZeroIsNone(x)
		case "cawmax":
			setup.Options.ColdAwayMax = int(x)
		case "caw":
			setup.Options.ColdAway = seconds(x)
		default:
			return nil, true, fmt.Errorf("policy %s: unknown key %q", name, k)
		}
	}
	p, err = NewRamjetVariant(cfg, setup, name)
	return p, true, err
}

// NewRamjetVariant returns the ramjet policy labelled label wired as setup.
func NewRamjetVariant(cfg selection.Config, setup RamjetSetup, label string) (*Ramjet, error) {
	p, err := newRamjet(cfg, setup.Options, label)
	if err != nil {
		return nil, err
	}
	p.setup = setup
	return p, nil
}

func newRamjet(cfg selection.Config, opt selection.Options, label string) (*Ramjet, error) {
	rt, err := selection.NewRouter(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s policy: %w", label, err)
	}
	p := &Ramjet{
		rt:      rt.WithOptions(opt),
		setup:   RamjetSetup{Options: opt},
		f:       rt.Extractor().NewFeatures(),
		s:       selection.NewScratch(0),
		res:     make(map[int]*selection.Reservation),
		seed:    xxhash.Sum64String("model\x00"),
		label:   label,
		density: RamjetDensity,
		Reasons: make(map[string]int),
		trace:   RamjetTrace,
	}
	rt.SetClock(func() time.Duration { return p.now })
	return p, nil
}

// RamjetTrace, when set, receives every ramjet policy's decision lines
// (Ramjet.SetTrace); fleetsim's -decisions sets it (with -parallel 1, so
// that runs do not interleave).
var RamjetTrace io.Writer

// NewRamjetMarginal returns the "ramjet-marginal" variant: a proposal,
// not ramjet's rule. It is Route with selection.Options.Marginal:
//
//	score(r) = min(overlap(r) - min_usable_overlap, affinity_cap) - alpha x load(r)
//
// A prefix every replica holds (a fleet-wide system prompt) then no longer
// uses up the affinity cap. The reservation still counts the real prefill.
func NewRamjetMarginal(cfg selection.Config) (*Ramjet, error) {
	return newRamjet(cfg, selection.Options{Marginal: true}, "ramjet-marginal")
}

// NewRamjetContext returns the "ramjet-context" variant: a proposal, not
// ramjet's rule. It is Route with selection.Options.ContextWeight: every
// in-flight request also weighs weight x its prompt tokens until it
// completes, so that load(r) grows with the context the replica must read
// at every decode step:
//
//	load(r) = sum over in-flight (RequestCost + weight x context) + pending prefill
func NewRamjetContext(cfg selection.Config, weight float64) (*Ramjet, error) {
	cfg.ContextWeight = weight
	return newRamjet(cfg, selection.Options{}, "ramjet-context")
}

func (p *Ramjet) Name() string { return p.label }

// Router exposes the underlying router (tests, index size).
func (p *Ramjet) Router() *selection.Router { return p.rt }

// UseReplicaKeys makes replica i register under keys[i] (e.g. the dial
// addresses a Caddy module routes over) instead of "replica-<i>:8000", so
// that the rendezvous tie-break places cold prompts as that module does.
// Call it before the first Pick; the precise path keeps its own keys.
func (p *Ramjet) UseReplicaKeys(keys []string) {
	p.keys = append([]string(nil), keys...)
}

// UsePrecise makes pre (a precise-path service fed by the caller, e.g. by
// real engines' event feeds) Route's annotator: the policy then decides as
// the module's precise path does, with r.Prompt standing for the preflight's
// token ids. The replica keys must be pre's feed ids.
func (p *Ramjet) UsePrecise(pre *kvindex.Precise) {
	p.pre = pre
	for i, c := range p.cands {
		key := replicaKey(i)
		if i < len(p.keys) {
			key = p.keys[i]
		}
		pre.Bind(c.Slot, key)
	}
}

func (p *Ramjet) ensure(fleet []*Replica) error {
	for len(p.cands) < len(fleet) {
		i := len(p.cands)
		key := replicaKey(i)
		if i < len(p.keys) {
			key = p.keys[i]
		}
		s, err := p.rt.Register(key)
		if err != nil {
			return err
		}
		if p.pre != nil {
			p.pre.Bind(s, key)
		}
		if !p.setup.NoCapacity {
			c := int64(fleet[i].KVCapacity)
			if p.setup.CapacityScale > 0 {
				c = int64(float64(c) * p.setup.CapacityScale)
			}
			switch {
			case p.setup.IndexOnly:
				p.rt.Index().SetCapacity(s, c/int64(p.rt.Config().BlockTokens))
			case p.setup.LoadOnly:
				p.rt.SetCapacity(s, c)
				p.rt.Index().SetCapacity(s, 0)
			default:
				p.rt.SetCapacity(s, c)
			}
			if k := p.setup.IndexScale; k > 0 {
				p.rt.Index().SetCapacity(s, max(1, int64(float64(c)*k)/int64(p.rt.Config().BlockTokens)))
			}
		}
		prof := selection.ProfileStandard
		if fleet[i].Speculative {
			prof = selection.ProfileSpeculative
		}
		p.cands = append(p.cands, selection.Candidate{Slot: s, Usable: true, Profile: prof})
	}
	return nil
}

// replicaKey is replica i's key, in the router and in the precise index.
func replicaKey(i int) string { return fmt.Sprintf("replica-%d:8000", i) }

// features fills p.f for r.
func (p *Ramjet) features(r *Request) {
	cfg := p.rt.Config()
	f := p.f
	f.Reset()
	f.Endpoint = selection.EndpointChat
	f.Seed = p.seed
	f.MaxTokens = r.Row.Output
	f.Stream = true
	f.Blocks, f.PromptBytes, f.Truncated = DensityBlocks(f.Blocks[:0], f.Seed, r.Prompt, p.density, cfg)
}

// Pick is one Route call; for the precise path, s.Tokens stands for the
// tokenize preflight, which production runs (and which succeeds) only when
// some feed is fresh.
func (p *Ramjet) Pick(r *Request, fleet []*Replica) int {
	if err := p.ensure(fleet); err != nil {
		panic(err) // more than selection.MaxReplicas: rejected by Run first
	}
	p.features(r)
	return p.route(p.f, r, fleet)
}

// PickFeatures is Pick with the request's features given (e.g. parsed from
// the request body by the router's Extractor, as the module does) rather
// than built from r.Prompt; r names the request for FirstToken and Done.
func (p *Ramjet) PickFeatures(f *selection.Features, r *Request, fleet []*Replica) int {
	if err := p.ensure(fleet); err != nil {
		panic(err)
	}
	return p.route(f, r, fleet)
}

func (p *Ramjet) route(f *selection.Features, r *Request, fleet []*Replica) int {
	cands := p.cands[:len(fleet)]
	var a selection.Annotator
	p.s.Tokens = nil
	if p.pre != nil {
		a = p.annotator()
		if p.pre.Ready() {
			p.s.Tokens = r.Prompt
		}
	}
	if p.trace != nil && p.pre != nil {
		// The estimate before Route learns the request (traceDecision).
		var in selection.SlotSet
		for i := range cands {
			in.Add(cands[i].Slot)
		}
		p.traceEst = [selection.MaxReplicas]int32{}
		p.rt.Index().DepthsWith(f.Blocks, &in, &p.traceEst, selection.NewScratch(0))
		p.traceOwnFlags(f, r, cands)
		p.traceLiftFlags(f, r, cands)
	}
	flip := p.flip.on && r.Row.ID == p.flip.id && p.flip.rep < len(cands)
	if flip {
		cands[p.flip.rep].Usable = false
	}
	d, res := p.rt.Route(f, cands, p.s, a, nil)
	if flip {
		cands[p.flip.rep].Usable = true
	}
	p.s.Tokens = nil
	if p.trace != nil {
		if p.pre != nil {
			p.traceLiftGain(r, cands, f.PromptTokens(p.rt.Config()))
		}
		p.traceDecision(r, d, fleet)
	}
	p.Reasons[d.Reason.String()]++
	p.res[r.Row.ID] = res
	return d.Index
}

// traceOwnFlags fills traceOwn as capByEstimate tests it: the key of the
// block one router block past the estimate's credit, in the request's real
// tokens, routed there by this router.
func (p *Ramjet) traceOwnFlags(f *selection.Features, r *Request, cands []selection.Candidate) {
	p.traceOwn = [selection.MaxReplicas]bool{}
	cfg := p.rt.Config()
	est := f.PromptTokens(cfg)
	if est <= 0 || len(r.Prompt) == 0 {
		return
	}
	x := p.pre.Index()
	keys := x.Keys(nil, 0, r.Prompt)
	tok := int64(len(r.Prompt))
	slack := int(int64(cfg.BlockTokens) * tok / int64(est))
	for i := range cands {
		s := cands[i].Slot
		key := replicaKey(i)
		if i < len(p.keys) {
			key = p.keys[i]
		}
		rep, ok := x.Lookup(key)
		if !ok {
			continue
		}
		credit := int(int64(p.traceEst[s]) * int64(cfg.BlockTokens) * tok / int64(est))
		if b := (credit + slack) / x.BlockSize(); b < len(keys) {
			p.traceOwn[s] = x.Own(rep, keys[b])
		}
	}
}

// traceLiftFlags fills traceLift before the decision: the lift stack's
// clauses at their defaults (kvindex queuedUnder, peerUnder, gainOver),
// for the exact overlap past the estimate's credit (traceEst) in the
// request's real tokens. Diagnostic only: the decision is the policy's.
func (p *Ramjet) traceLiftFlags(f *selection.Features, r *Request, cands []selection.Candidate) {
	p.traceLift = [selection.MaxReplicas]liftSnap{}
	cfg := p.rt.Config()
	est := f.PromptTokens(cfg)
	tok := int64(len(r.Prompt))
	var resSum, capSum, n int64
	for i := range cands {
		s := cands[i].Slot
		l := &p.traceLift[s]
		l.inf, l.pend = p.rt.Load(s)
		l.res, l.capa = p.rt.Resident(s), p.rt.Capacity(s)
		resSum, capSum, n = resSum+l.res, capSum+l.capa, n+1
	}
	if est <= 0 || n == 0 {
		return
	}
	for i := range cands {
		l := &p.traceLift[cands[i].Slot]
		l.load = l.capa > 0 && float64(l.inf+1)*float64(tok) < kvindex.DefaultCapLoad*float64(l.capa)
		l.peer = float64(l.res)*float64(n) <= kvindex.DefaultCapPeer*float64(resSum)
		l.fit = kvindex.DefaultCapFit*float64(tok) <= float64(l.capa)
	}
}

// traceLiftGain sets traceLift's gain clause after Route has annotated
// cands with their exact overlaps: the pending prefill over the least
// other candidate's, under CapGain x the fleet's saturation x the tokens
// credited past the estimate's.
func (p *Ramjet) traceLiftGain(r *Request, cands []selection.Candidate, est int) {
	var resSum, capSum int64
	for i := range cands {
		l := &p.traceLift[cands[i].Slot]
		resSum, capSum = resSum+l.res, capSum+l.capa
	}
	kg := kvindex.DefaultCapGain
	if capSum > 0 {
		kg *= float64(resSum) / float64(capSum)
	}
	tok := int64(len(r.Prompt))
	for i := range cands {
		s := cands[i].Slot
		l := &p.traceLift[s]
		least := int64(-1)
		for j := range cands {
			if q := p.traceLift[cands[j].Slot].pend; cands[j].Slot != s && (least < 0 || q < least) {
				least = q
			}
		}
		gain := int64(cands[i].Overlap) - int64(p.traceEst[s])*int64(p.rt.Config().BlockTokens)*tok/int64(max(est, 1))
		l.gain = least < 0 || float64(l.pend-least) < kg*float64(gain)
	}
}

func liftFlags(l *liftSnap) string {
	b := []byte("----")
	for i, ok := range [4]bool{l.load, l.peer, l.gain, l.fit} {
		if ok {
			b[i] = "LMGF"[i]
		}
	}
	return string(b)
}

func (*Ramjet) Routed(*Request, int) {}

func (p *Ramjet) FirstToken(r *Request, rep int) {
	if p.trace != nil {
		fmt.Fprintf(p.trace, "first id=%d now=%.3f rep=%d\n", r.Row.ID, p.now.Seconds(), rep)
	}
	if res, ok := p.res[r.Row.ID]; ok {
		res.PrefillDone()
	}
}

// Observe feeds the engine's cached-token count of r's answer back
// through Router.Observe, as the module does with each response's usage.
func (p *Ramjet) Observe(r *Request, _ int, u engine.Usage) {
	if p.trace != nil {
		fmt.Fprintf(p.trace, "obs id=%d now=%.3f prompt=%d cached=%d\n", r.Row.ID, p.now.Seconds(), u.PromptTokens, u.CachedTokens)
	}
	if p.setup.NoObserve {
		return
	}
	if res, ok := p.res[r.Row.ID]; ok {
		p.rt.Observe(res, u.PromptTokens, u.CachedTokens, 0)
	}
}

// Done releases r's reservation after feeding its answer's completion
// tokens back (Router.Observe charges the reply to the index), as the
// module does at each response's end from its usage.
func (p *Ramjet) Done(r *Request, _ int) {
	if res, ok := p.res[r.Row.ID]; ok {
		if !p.setup.NoObserve {
			p.rt.Observe(res, len(r.Prompt), -1, r.Row.Output)
		}
		res.Release()
		delete(p.res, r.Row.ID)
	}
}

// ZeroIsNone is a policy key's value for an Options field whose 0 means
// its default and a negative value none: a key given 0 turns the rule off.
// e2ecompare's ramjet targets read their option keys with it too.
func ZeroIsNone(x float64) float64 {
	if x == 0 {
		return -1
	}
	return x
}
