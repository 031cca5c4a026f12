package fleetsim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/selection"
)

// ForeignSpec and ColdSpec, after SpillSep and joined by "+", are
// experiments for ramjet-precise instances: "fp" turns on the others'
// prefill estimate (selection.ForeignPrefill) with the default decay,
// "fp=0.5" with a 0.5 s one, "fpmin=<blocks>" counting only stored runs
// of at least that many blocks (a full prefill chunk: more of the prompt
// to come); "cs" applies the instance spill to cold
// prefixes too (selection.Options.ColdSpill); "band=<tokens>" widens it
// (Options.SpillBand). The instances keep the ordinal ids (SpillSep),
// unless "inst=<id>" names them as SpillSep's inst= does (hashed
// positions: a lone instance named by its host name is then not at
// position 0, and the variants apply to it too).
const (
	ForeignSpec = "fp"
	ColdSpec    = "cs"
	BandSpec    = "band"
)

// preciseSpec is what a spec after SpillSep asks of ramjet-precise
// instances (ForeignSpec, ColdSpec); ok is false when it asks neither.
type preciseSpec struct {
	foreign bool
	tau     time.Duration
	cold    bool
	band    float64
	inst    string // "inst=<id>": the instances' ids as SpillSep's inst= gives
	minRun  int    // "fpmin=<blocks>": the smallest stored run fp counts
}

func parsePreciseSpec(spec string) (ps preciseSpec, ok bool, err error) {
	for _, it := range strings.Split(spec, "+") {
		switch k, v, hasV := strings.Cut(it, "="); {
		case k == ColdSpec && !hasV:
			ps.cold = true
		case k == "inst" && hasV && v != "":
			ps.inst = v
		case k == "fpmin" && hasV:
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive run in blocks", SpillSep, spec)
			}
			ps.minRun = n
		case k == BandSpec && hasV:
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x <= 0 {
				return ps, true, fmt.Errorf("%s%s: want a positive band in tokens", SpillSep, spec)
			}
			ps.band = x
		case k == ForeignSpec:
			ps.foreign, ps.tau = true, selection.DefaultForeignTau
			if hasV {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil || x <= 0 {
					return ps, true, fmt.Errorf("%s%s: want a positive decay in seconds", SpillSep, spec)
				}
				ps.tau = seconds(x)
			}
		default:
			return preciseSpec{}, false, nil
		}
	}
	if ps == (preciseSpec{inst: ps.inst}) { // "inst=<id>" alone: SpillSep's
		return preciseSpec{}, false, nil
	}
	return ps, true, nil
}

// foreignState is one ramjet-precise instance's estimate of the other
// instances' prefill, fed by the KV events every instance receives (each
// delivered Delay after its emission, as the instance's index sees it).
type foreignState struct {
	rp *RamjetPrecise
	fp *selection.ForeignPrefill
	q  []storedRun // emitted, not yet delivered, in emission order
}

type storedRun struct {
	rep    int
	at     time.Duration // delivery time
	blocks int
	bs     int
}

// enablePrecise applies ps to every instance, each a ramjet-precise.
func (m *Multi) enablePrecise(ps preciseSpec) error {
	if ps.foreign {
		m.foreign = make([]*foreignState, len(m.inst))
	}
	for k, p := range m.inst {
		rp, ok := p.(*RamjetPrecise)
		if !ok {
			return fmt.Errorf("%s%s/%s needs ramjet-precise (instances reading every engine's KV events)", SpillSep, ForeignSpec, ColdSpec)
		}
		if ps.cold || ps.band > 0 {
			o := rp.rt.Options()
			o.ColdSpill, o.SpillBand = ps.cold, ps.band
			rp.rt = rp.rt.WithOptions(o)
		}
		if ps.foreign {
			fp := selection.NewForeignPrefill()
			fp.Tau = ps.tau
			if ps.minRun > 0 {
				fp.MinBlocks = ps.minRun
			}
			m.foreign[k] = &foreignState{rp: rp, fp: fp}
		}
	}
	return nil
}

// foreignHandler wraps instance k's KV event handler for engine rep so
// that its stored runs also reach k's estimate.
func (m *Multi) foreignHandler(k, rep int, h func(engine.KVEvent)) func(engine.KVEvent) {
	if m.foreign == nil || m.foreign[k] == nil {
		return h
	}
	fs := m.foreign[k]
	return func(ev engine.KVEvent) {
		h(ev)
		if ev.Kind == engine.BlockStored {
			fs.q = append(fs.q, storedRun{rep: rep, at: ev.At + fs.rp.pc.Delay, blocks: len(ev.BlockHashes), bs: ev.BlockSize})
		}
	}
}

// foreignBefore brings instance k's estimate to now and hands it to its
// router, before k picks for a request over fleet (k's view).
func (m *Multi) foreignBefore(k int, fleet []*Replica) {
	if m.foreign == nil {
		return
	}
	fs := m.foreign[k]
	if err := fs.rp.ensure(fleet); err != nil {
		return
	}
	rt, now := fs.rp.rt, simEpoch.Add(m.now)
	n := 0
	for n < len(fs.q) && fs.q[n].at <= m.now {
		r := fs.q[n]
		n++
		if r.rep >= len(fs.rp.cands) {
			continue
		}
		s := fs.rp.cands[r.rep].Slot
		_, pend := rt.Load(s)
		fs.fp.Stored(s, r.blocks, r.bs, pend, simEpoch.Add(r.at))
	}
	if n > 0 {
		fs.q = append(fs.q[:0], fs.q[n:]...)
	}
	for i := range fleet {
		fs.fp.Apply(rt, fs.rp.cands[i].Slot, now)
	}
}

// foreignRouted credits instance k's own request r, routed to rep, with
// the prefill it reserved there.
func (m *Multi) foreignRouted(k int, r *Request, rep int) {
	if m.foreign == nil || rep < 0 {
		return
	}
	fs := m.foreign[k]
	if res, ok := fs.rp.res[r.Row.ID]; ok && rep < len(fs.rp.cands) {
		fs.fp.Routed(fs.rp.cands[rep].Slot, int(res.Prefill()))
	}
}

// foreignFirst records instance k's first token on rep at the engine's
// clock.
func (m *Multi) foreignFirst(k, rep int) {
	if m.foreign == nil || rep < 0 || rep >= len(m.foreign[k].rp.cands) {
		return
	}
	fs := m.foreign[k]
	t := m.now
	if rep < len(fs.rp.engines) && fs.rp.engines[rep] != nil {
		t = fs.rp.engines[rep].Now()
	}
	fs.fp.FirstToken(fs.rp.cands[rep].Slot, simEpoch.Add(t))
}
