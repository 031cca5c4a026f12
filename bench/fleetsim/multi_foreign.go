package fleetsim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// ForeignSpec and ColdSpec, after SpillSep and joined by "+", are
// experiments for ramjet-precise instances: "fp" turns on the others'
// prefill estimate (selection.ForeignPrefill) with the default decay
// (the engines' time for selection.DefaultForeignTauTokens prefill tokens,
// learned), "fp=0.5" with a fixed 0.5 s one, "fpt=<tokens>" with the
// engines' time for that many tokens, "fpres=<x>" counting the others' stored
// runs as resident contexts for x times the learned mean life of a
// request (ForeignPrefill.ResidentLives: DefaultResidentLives with "fp"
// alone, 0 off), "fpwhole" each of those tokens as the whole context it
// stands for (ForeignPrefill.ResidentWhole; "fpwhole=<x>" its scale at most
// x, ResidentWholeMax), "fpearly" from the first
// stored run on (ForeignPrefill.ResidentEarly), "fplife=<s>" assuming that life until one has ended (the
// default: the oldest request's age), "fpq=<x>" counting x times the others'
// unseen load (ForeignPrefill.SetPrior; "fp" alone: as the module's default,
// selection.DefaultForeignPrior, which a fresh -engine-load scrape turns
// off per replica; the module's foreign_prefill on is fpq=0, queues fpq=1),
// "fpn=<tokens>" adding that many tokens per own request not yet at its
// first token to the unseen load's base (ForeignPrefill.QueueCost),
// "fpnw=<s>" scaled by the replica's mean wait beyond prefill over s (QueueWait),
// "fpnws=<x>" fpnw's charge times the share of replicas waiting at least
// fpnw over x (QueueWaitShare),
// "fpown" counting, once an instance has seen the others, its requests' in
// flight blocks as its own and the rest as theirs (ForeignPrefill.OwnInflight),
// "fpmin=<blocks>" counting only stored runs
// of at least that many blocks (a full prefill chunk: more of the prompt
// to come); "cs" applies the instance spill to cold
// prefixes too (selection.Options.ColdSpill); "band=<tokens>" widens it
// (Options.SpillBand). The instances keep the ordinal ids (SpillSep),
// unless "inst=<id>" names them as SpillSep's inst= does (hashed
// positions: a lone instance named by its host name is then not at
// position 0, and the variants apply to it too). "kvd=<ms>" delays every
// instance's KV events by that much (PreciseConfig.Delay, default
// DefaultKVEventDelay): real processes' event delivery under load.
// "eq=<tokens>" charges each request an engine reports waiting that the
// instance did not send that many tokens of load (Options.EngineQueue;
// needs -engine-load).
const (
	ForeignSpec = "fp"
	ColdSpec    = "cs"
	BandSpec    = "band"
	// OracleSpec hands every instance, before each decision, the exact
	// pending prefill (queued and prefilling requests) the other instances
	// reserved on each replica as its external prefill: router-to-router
	// traffic with no delay, which issue 13 excludes; an upper bound for
	// any estimate of the blind window. Without "fp" (which would
	// overwrite it). "oracle=<ms>" knows each request that many
	// milliseconds after it was routed (engines that report a routed
	// request that fast).
	OracleSpec = "oracle"
)

// preciseSpec is what a spec after SpillSep asks of ramjet-precise
// instances (ForeignSpec, ColdSpec); ok is false when it asks neither.
type preciseSpec struct {
	foreign bool
	tau     time.Duration
	tauTok  int // the decay's tokens (ForeignPrefill.TauTokens); 0: a fixed tau
	cold    bool
	band    float64
	alone   bool          // "bandalone": the band spill also before evidence of other instances (Options.SpillBandAlone)
	inst    string        // "inst=<id>": the instances' ids as SpillSep's inst= gives
	minRun  int           // "fpmin=<blocks>": the smallest stored run fp counts
	lives   float64       // "fpres=<x>": the others' runs as resident contexts for x lives (ForeignPrefill.ResidentLives; 0: off)
	livesOn bool          // fpres given
	life    time.Duration // "fplife=<s>": the life assumed until learned (ForeignPrefill.ResidentLife)
	prior   float64       // "fpq=<x>": ForeignPrefill.SetPrior
	qcost   int64         // "fpn=<tokens>": ForeignPrefill.QueueCost
	qcWait  time.Duration // "fpnw=<s>": ForeignPrefill.QueueWait
	qcWaitS float64       // "fpnws=<x>": ForeignPrefill.QueueWaitShare
	whole   bool          // "fpwhole": ForeignPrefill.ResidentWhole
	wholeMx float64       // "fpwhole=<x>": ForeignPrefill.ResidentWholeMax
	early   bool          // "fpearly": ForeignPrefill.ResidentEarly
	ownFly  bool          // "fpown": ForeignPrefill.OwnInflight
	priorOn bool          // fpq given (else the module's default)
	oracle  bool          // OracleSpec
	delay   time.Duration // "oracle=<ms>"
	kvDelay time.Duration // "kvd=<ms>": every instance's KV event delivery delay (PreciseConfig.Delay)
	queue   float64       // "eq=<tokens>": selection.Options.EngineQueue (with -engine-load)
	qSat    float64       // "eqsat=<x>": Options.EngineQueueSat
}

func parsePreciseSpec(spec string) (ps preciseSpec, ok bool, err error) {
	for _, it := range strings.Split(spec, "+") {
		switch k, v, hasV := strings.Cut(it, "="); {
		case k == ColdSpec && !hasV:
			ps.cold = true
		case k == "bandalone" && !hasV:
			ps.alone = true
		case k == OracleSpec:
			ps.oracle = true
			if hasV {
				if ps.delay, err = positiveMS(v); err != nil {
					return ps, true, fmt.Errorf("%s%s: want a positive delay in milliseconds", SpillSep, spec)
				}
			}
		case k == "kvd" && hasV:
			if ps.kvDelay, err = positiveMS(v); err != nil {
				return ps, true, fmt.Errorf("%s%s: want a positive KV event delay in milliseconds", SpillSep, spec)
			}
		case k == "inst" && hasV && v != "":
			ps.inst = v
		case k == "fpmin" && hasV:
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive run in blocks", SpillSep, spec)
			}
			ps.minRun = n
		case k == "fpres" && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x < 0 {
				return ps, true, fmt.Errorf("%s%s: want a number of request lives, 0 or more", SpillSep, spec)
			}
			ps.lives, ps.livesOn = x, true
		case k == "fpwhole":
			ps.whole = true
			if hasV {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil || x < 1 {
					return ps, true, fmt.Errorf("%s%s: want a scale bound, 1 or more", SpillSep, spec)
				}
				ps.wholeMx = x
			}
		case k == "eq" && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive cost in tokens per waiting request", SpillSep, spec)
			}
			ps.queue = x
		case k == "eqsat" && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive mean queue", SpillSep, spec)
			}
			ps.qSat = x
		case k == "fpearly" && !hasV:
			ps.early = true
		case k == "fpown" && !hasV:
			ps.ownFly = true
		case k == "fpq" && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x < 0 {
				return ps, true, fmt.Errorf("%s%s: want a prior scale, 0 or more", SpillSep, spec)
			}
			ps.prior, ps.priorOn = x, true
		case k == "fpn" && hasV:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive cost in tokens per queued request", SpillSep, spec)
			}
			ps.qcost = n
		case k == "fpnw" && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive wait in seconds", SpillSep, spec)
			}
			ps.qcWait = seconds(x)
		case k == "fpnws" && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x <= 0 || x > 1 {
				return ps, true, fmt.Errorf("%s%s: want a share of the replicas, above 0 and at most 1", SpillSep, spec)
			}
			ps.qcWaitS = x
		case k == "fplife" && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive life in seconds", SpillSep, spec)
			}
			ps.life = seconds(x)
		case k == BandSpec && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive band in tokens", SpillSep, spec)
			}
			ps.band = x
		case k == ForeignSpec:
			ps.foreign, ps.tau, ps.tauTok = true, selection.DefaultForeignTau, selection.DefaultForeignTauTokens
			if hasV {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil || x <= 0 {
					return ps, true, fmt.Errorf("%s%s: want a positive decay in seconds", SpillSep, spec)
				}
				ps.tau, ps.tauTok = seconds(x), 0
			}
		case k == "fpt" && hasV:
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive decay in prefill tokens", SpillSep, spec)
			}
			ps.foreign, ps.tau, ps.tauTok = true, selection.DefaultForeignTau, n
		default:
			return preciseSpec{}, false, nil
		}
	}
	if ps == (preciseSpec{inst: ps.inst}) { // "inst=<id>" alone: SpillSep's
		return preciseSpec{}, false, nil
	}
	if ps.oracle && ps.foreign {
		return ps, true, fmt.Errorf("%s%s: %s replaces fp's estimate, not with it", SpillSep, spec, OracleSpec)
	}
	return ps, true, nil
}

// positiveMS parses a positive number of milliseconds.
func positiveMS(v string) (time.Duration, error) {
	x, err := strconv.ParseFloat(v, 64)
	if err == nil && x <= 0 {
		err = fmt.Errorf("%v ms: not positive", x)
	}
	return time.Duration(x * float64(time.Millisecond)), err
}

// enablePrecise applies ps to every instance, each a ramjet-precise. The
// others' prefill estimate ("fp") is the module's foreign_prefill: each
// instance's RamjetPrecise drives a selection.ForeignPrefill from its own
// index's stored runs (kvindex.Precise.OnStored), as the module does.
func (m *Multi) enablePrecise(ps preciseSpec) error {
	m.oracle, m.oracleDelay = ps.oracle, ps.delay
	if ps.delay > 0 {
		m.pend = make(map[int]pendingPrefill)
	}
	for _, p := range m.inst {
		rp, ok := p.(*RamjetPrecise)
		if !ok {
			return fmt.Errorf("%s%s/%s needs ramjet-precise (instances reading every engine's KV events)", SpillSep, ForeignSpec, ColdSpec)
		}
		if ps.kvDelay > 0 {
			rp.pc.Delay = ps.kvDelay
		}
		if ps.cold || ps.band > 0 || ps.queue > 0 {
			o := rp.rt.Options()
			o.ColdSpill, o.SpillBand, o.SpillBandAlone = ps.cold, ps.band, ps.alone
			o.EngineQueue, o.EngineQueueSat = ps.queue, ps.qSat
			rp.rt = rp.rt.WithOptions(o)
		}
		if ps.foreign {
			fp := selection.NewForeignPrefill()
			fp.Tau, fp.TauTokens = ps.tau, ps.tauTok
			if ps.minRun > 0 {
				fp.MinBlocks = ps.minRun
			}
			if ps.livesOn {
				fp.ResidentLives = ps.lives
			}
			if ps.life > 0 {
				fp.ResidentLife = ps.life
			}
			fp.ResidentWhole, fp.ResidentWholeMax, fp.ResidentEarly = ps.whole, ps.wholeMx, ps.early
			fp.OwnInflight = ps.ownFly
			fp.QueueCost, fp.QueueWait, fp.QueueWaitShare = ps.qcost, ps.qcWait, ps.qcWaitS
			prior := ps.prior // fpq=
			if !ps.priorOn {
				prior = selection.DefaultForeignPrior // the module's default (with -engine-load: where a scrape is not fresh)
			}
			fp.SetPrior(prior)
			rp.SetForeignPrefill(fp)
		}
	}
	return nil
}

// pendingPrefill is a request an instance routed, not yet at its first
// token (the delayed oracle).
type pendingPrefill struct {
	inst, rep int
	at        time.Duration
	prefill   int64
}

// notePending records the request instance k just routed to replica rep
// with its reservation's prefill (the delayed oracle).
func (m *Multi) notePending(k, rep int, r *Request) {
	if rp, ok := m.inst[k].(*RamjetPrecise); ok {
		if res := rp.res[r.Row.ID]; res != nil {
			m.pend[r.Row.ID] = pendingPrefill{inst: k, rep: rep, at: m.now, prefill: res.Prefill()}
		}
	}
}

// sharePending sets, on instance k's router, every replica's external
// prefill to the pending prefill the other instances have reserved there
// (OracleSpec), or with a delay the prefill of their requests routed at
// least that long ago and not at their first token.
func (m *Multi) sharePending(k int) {
	me, ok := m.inst[k].(*RamjetPrecise)
	if !ok {
		return
	}
	if m.oracleDelay > 0 {
		var sum [selection.MaxReplicas]int64
		for _, p := range m.pend {
			if p.inst != k && p.at <= m.now-m.oracleDelay && p.rep < len(sum) {
				sum[p.rep] += p.prefill
			}
		}
		for i, c := range me.cands {
			me.rt.SetExternalPrefill(c.Slot, sum[i])
		}
		return
	}
	for i, c := range me.cands {
		var others int64
		for j, p := range m.inst {
			if o, ok := p.(*RamjetPrecise); ok && j != k && i < len(o.cands) {
				_, pend := o.rt.Load(o.cands[i].Slot)
				others += pend
			}
		}
		me.rt.SetExternalPrefill(c.Slot, others)
	}
}
