package fleetsim

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/ramjet-llm/ramjet/selection"
)

// Ramjet routes through the real selection.Router, exactly as the Caddy
// module drives it: Pick over every replica, Reserve and Learn with the
// decision, PrefillDone at the first token, Release at completion.
//
// Features are built from the synthesised token ids rather than from a
// request body: Blocks are selection.AppendTokenBlocks over the bounded
// prefix with the router's BlockTokens, and PromptBytes is the prompt's
// tokens times CharsPerToken, so the router sees the same structure (a
// shared prefix, a conversation extending its previous turn) that it
// derives from bytes in production.
type Ramjet struct {
	rt    *selection.Router
	f     *selection.Features
	s     *selection.Scratch
	cands []selection.Candidate
	res   map[int]*selection.Reservation // by trace ID
	seed  uint64
	label string

	// marginal, when set, scores the overlap each replica has beyond the
	// least warm usable one (see NewRamjetMarginal).
	marginal bool
	mcands   []selection.Candidate

	// ctxWeight, when positive, adds a second reservation of ctxWeight x
	// prompt tokens held until completion (see NewRamjetContext).
	ctxWeight float64
	ctxRes    map[int]*selection.Reservation

	// Reasons counts decisions by reason.
	Reasons map[string]int
}

// NewRamjet returns a ramjet policy with cfg (zero fields take the
// selection defaults).
func NewRamjet(cfg selection.Config) (*Ramjet, error) {
	rt, err := selection.NewRouter(cfg)
	if err != nil {
		return nil, fmt.Errorf("ramjet policy: %w", err)
	}
	return &Ramjet{
		rt:      rt,
		f:       rt.Extractor().NewFeatures(),
		s:       selection.NewScratch(0),
		res:     make(map[int]*selection.Reservation),
		seed:    xxhash.Sum64String("model\x00"),
		label:   "ramjet",
		Reasons: make(map[string]int),
	}, nil
}

// NewRamjetMarginal returns the "ramjet-marginal" variant: a proposal,
// not ramjet's rule. It runs the real Pick twice: once to read every
// replica's overlap, then with those overlaps minus the smallest usable one
// supplied as precise overlaps, so that the rule becomes
//
//	score(r) = min(overlap(r) - min_usable_overlap, affinity_cap) - alpha x load(r)
//
// A prefix every replica holds (a fleet-wide system prompt) then no longer
// uses up the affinity cap. The reservation still counts the real prefill.
func NewRamjetMarginal(cfg selection.Config) (*Ramjet, error) {
	p, err := NewRamjet(cfg)
	if err != nil {
		return nil, err
	}
	p.marginal, p.label = true, "ramjet-marginal"
	return p, nil
}

// NewRamjetContext returns the "ramjet-context" variant: a proposal, not
// ramjet's rule. Every in-flight request also weighs weight x its prompt
// tokens until it completes, so that load(r) grows with the context the
// replica must read at every decode step:
//
//	load(r) = sum over in-flight (RequestCost + weight x context) + pending prefill
//
// It runs the real selection code: the extra weight is a second
// reservation whose "prefill" is never marked done, released at
// completion. The second reservation also counts RequestCost once more, so
// the variant halves RequestCost to keep the per-request cost unchanged.
func NewRamjetContext(cfg selection.Config, weight float64) (*Ramjet, error) {
	cfg.SetDefaults()
	cfg.RequestCost = max(1, cfg.RequestCost/2)
	p, err := NewRamjet(cfg)
	if err != nil {
		return nil, err
	}
	p.ctxWeight, p.label = weight, "ramjet-context"
	p.ctxRes = make(map[int]*selection.Reservation)
	return p, nil
}

func (p *Ramjet) Name() string { return p.label }

// Router exposes the underlying router (tests, index size).
func (p *Ramjet) Router() *selection.Router { return p.rt }

func (p *Ramjet) ensure(fleet []*Replica) error {
	for len(p.cands) < len(fleet) {
		i := len(p.cands)
		s, err := p.rt.Register(fmt.Sprintf("replica-%d:8000", i))
		if err != nil {
			return err
		}
		prof := selection.ProfileStandard
		if fleet[i].Speculative {
			prof = selection.ProfileSpeculative
		}
		p.cands = append(p.cands, selection.Candidate{Slot: s, Usable: true, Profile: prof})
	}
	return nil
}

// features fills p.f for r.
func (p *Ramjet) features(r *Request) {
	cfg := p.rt.Config()
	f := p.f
	f.Reset()
	f.Endpoint = selection.EndpointChat
	f.Seed = p.seed
	f.MaxTokens = r.Row.Output
	f.Stream = true
	limit := cfg.PrefixTokens / cfg.BlockTokens * cfg.BlockTokens
	toks := r.Prompt
	if len(toks) > limit {
		toks = toks[:limit]
		f.Truncated = true
	}
	f.Blocks = selection.AppendTokenBlocks(f.Blocks[:0], f.Seed, toks, cfg.BlockTokens)
	f.PromptBytes = int(float64(len(r.Prompt)) * cfg.CharsPerToken)
}

func (p *Ramjet) Pick(r *Request, fleet []*Replica) int {
	if err := p.ensure(fleet); err != nil {
		panic(err) // more than selection.MaxReplicas: rejected by Run first
	}
	p.features(r)
	cands := p.cands[:len(fleet)]
	d := p.rt.Pick(p.f, cands, p.s)
	prefill := d.Prefill
	if p.marginal && d.Index >= 0 {
		base := -1
		for i, c := range cands {
			if c.Usable && (base < 0 || p.s.Overlap[i] < base) {
				base = p.s.Overlap[i]
			}
		}
		p.mcands = append(p.mcands[:0], cands...)
		for i := range p.mcands {
			p.mcands[i].Precise = true
			p.mcands[i].Overlap = p.s.Overlap[i] - base
		}
		d = p.rt.Pick(p.f, p.mcands, p.s)
		prefill = max(0, d.Prefill-base)
	}
	p.Reasons[d.Reason.String()]++
	res := p.rt.Reserve(d.Slot, prefill)
	p.rt.Learn(p.f, d.Slot)
	p.res[r.Row.ID] = res
	if p.ctxWeight > 0 {
		p.ctxRes[r.Row.ID] = p.rt.Reserve(d.Slot, int(p.ctxWeight*float64(len(r.Prompt))))
	}
	return d.Index
}

func (*Ramjet) Routed(*Request, int) {}

func (p *Ramjet) FirstToken(r *Request, _ int) {
	if res, ok := p.res[r.Row.ID]; ok {
		res.PrefillDone()
	}
}

func (p *Ramjet) Done(r *Request, _ int) {
	if res, ok := p.res[r.Row.ID]; ok {
		res.Release()
		delete(p.res, r.Row.ID)
	}
	if res, ok := p.ctxRes[r.Row.ID]; ok {
		res.Release()
		delete(p.ctxRes, r.Row.ID)
	}
}
