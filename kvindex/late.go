package kvindex

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// Outcomes of preflights that missed their timeout or were not waited for
// (Precise.LateOutcomes).
const (
	// LatePredicted: the tokens came after the decision and the chosen
	// replica's blocks were predicted from them.
	LatePredicted = iota
	// LateAfterEnd: the tokens came after the request ended (nothing to
	// predict: the engine's own events have it).
	LateAfterEnd
	// LateFailed: the preflight failed or passed LateTimeout.
	LateFailed
	// LateUnrouted: the request ended without being routed to a replica
	// with a feed.
	LateUnrouted
	numLate
)

// LateOutcomeNames names the late outcomes, by index, for metric labels.
var LateOutcomeNames = [numLate]string{"predicted", "after_end", "failed", "unrouted"}

// LateOutcomes counts the preflights that missed their timeout or were
// not waited for (deferLate, the wait rule), by
// outcome (LatePredicted, LateAfterEnd, LateFailed, LateUnrouted).
func (p *Precise) LateOutcomes(outcome int) uint64 { return p.late[outcome].Load() }

// Late is a preflight that missed its timeout: the request is routed by
// the estimate, and when the token ids arrive later the replica it was
// routed to gets its blocks predicted, as a precise decision would have
// (so the precise index does not go blind to what it was sent). Report
// the decision with Routed and the request's end with End. Safe for
// concurrent use.
type Late struct {
	p *Precise

	mu     sync.Mutex
	tokens []uint32
	done   bool // the preflight ended (tokens nil: failed)
	slot   selection.Slot
	routed bool
	ended  bool
	held   Replica // the replica Held for, -1 none
	keys   []uint64
	probe  func() (selection.Slot, bool)
	// start, set on a request routed on a cached message prefix
	// (deferLate), sends its tokenization: at its first response byte
	// (FirstByte) or its end, whichever comes first.
	start func()
	tail  int // the bytes of the messages past that prefix
	// prefix is the prefix's tokens when they were not returned (the
	// wait rule routed the request by the estimate), for PromptTokens.
	prefix int
	// estimate is the prompt's tokens as the request's reservation
	// estimated them from its bytes (estimated), 0 unknown: the tokens
	// past it top up the others' prefill estimate's credit (predictLocked).
	estimate int
	// bytes is the prompt's bytes (estimated), for the estimate when the
	// estimate's router was not set yet when it was recorded: the module
	// sets it at its first pool view, after the cold start's first
	// preflight (TestColdStartCredit).
	bytes int
}

// estimated records, on a handle whose tokens are still to come (l nil:
// none), the prompt's tokens as the reservation estimates them from f's
// bytes (selection.Features.PromptTokens under the estimate's router).
// Call it before the request is routed.
func (l *Late) estimated(p *Precise, f *selection.Features) {
	if l == nil || f == nil {
		return
	}
	l.mu.Lock()
	l.bytes = f.PromptBytes
	if e := p.est.Load(); e != nil {
		l.estimate = f.PromptTokens(e.cfg)
	}
	l.mu.Unlock()
}

// estimateLocked is estimate, or when it was not known the bytes'
// estimate under the estimate's router now (0: still none).
func (l *Late) estimateLocked() int {
	if l.estimate > 0 || l.bytes <= 0 {
		return l.estimate
	}
	if e := l.p.est.Load(); e != nil {
		return int(float64(l.bytes) / e.cfg.CharsPerToken)
	}
	return 0
}

// Preflight is Tokenize for one request on its way to Route: the tokens
// when they come within the tokenizer's timeout (or ctx); else the error,
// and, when the preflight goes on past the timeout, a Late handle whose
// tokens will predict the chosen replica's blocks. probe, when set, tells
// the handle the request's decision once it is made (it is asked when
// the tokens arrive; Late.Routed tells it too).
func (p *Precise) Preflight(ctx context.Context, key uint64, req TokenizeRequest, probe func() (selection.Slot, bool)) ([]uint32, *Late, error) {
	return p.preflight(ctx, key, req, probe, msgPrefix{}, true)
}

// preflight is Preflight that also teaches the message-prefix cache (m:
// what it knew of req's messages) with the tokens. Unless wait, a
// preflight not answered at once is not waited for: its Late handle
// returns with no tokens and no error (the wait rule, diverge.go).
func (p *Precise) preflight(ctx context.Context, key uint64, req TokenizeRequest, probe func() (selection.Slot, bool), m msgPrefix, wait bool) ([]uint32, *Late, error) {
	base, err := p.tokenizeBase(true)
	if err != nil || base == "" {
		return nil, nil, err
	}
	toks, c, err := p.tk.Start(base, key, req)
	if m.n > 0 {
		p.barePrefix(base, m, req)
	}
	if c == nil {
		if toks != nil {
			p.learned(m, toks)
		}
		return toks, nil, err
	}
	if m.n > 0 {
		p.tk.Then(c, func(toks []uint32, err error) {
			if err == nil {
				p.learned(m, toks)
			}
		})
	}
	if !wait {
		p.div.unwaited.Add(1)
		l := &Late{p: p, slot: -1, held: -1, probe: probe}
		p.tk.Then(c, l.arrived)
		return nil, l, nil
	}
	t0 := time.Now()
	toks, err = p.tk.Wait(ctx, c)
	p.waitNanos.Add(int64(time.Since(t0)))
	p.waited.Add(1)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return toks, nil, err
	}
	l := &Late{p: p, slot: -1, held: -1, probe: probe}
	p.tk.Then(c, l.arrived)
	return nil, l, err
}

// arrived is the preflight's outcome.
func (l *Late) arrived(tokens []uint32, err error) {
	var probe func() (selection.Slot, bool)
	l.mu.Lock()
	l.done, l.tokens = true, tokens
	if err != nil {
		l.tokens = nil
		l.mu.Unlock()
		l.p.late[LateFailed].Add(1)
		return
	}
	if l.ended {
		l.mu.Unlock()
		l.p.late[LateAfterEnd].Add(1)
		return
	}
	if !l.routed {
		probe = l.probe
	}
	l.mu.Unlock()
	if probe != nil {
		if s, ok := probe(); ok {
			l.Routed(s)
			return
		}
	}
	l.mu.Lock()
	l.predictLocked()
	l.mu.Unlock()
}

// Routed reports that the request was routed to slot s (by the estimate).
// A second call is ignored unless Retried came between (a retry elsewhere).
func (l *Late) Routed(s selection.Slot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.routed || l.ended {
		return
	}
	l.routed, l.slot = true, s
	l.predictLocked()
}

// Retried reports that the request is being routed again (a retry): the
// predictions the late tokens made for the earlier attempt's replica live
// PredictGrace more unless confirmed, as at the end of a request, and the
// next Routed (or the probe, when the tokens come later) predicts for the
// new attempt's replica.
func (l *Late) Retried() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if l.held >= 0 {
		l.p.x.Release(l.held, l.keys, l.p.cfg.PredictGrace)
		l.held = -1
	}
	l.routed, l.slot = false, -1
}

// predictLocked holds the routed replica's blocks once both the tokens and
// the decision are known.
func (l *Late) predictLocked() {
	if !l.routed || !l.done || l.tokens == nil || l.ended || l.held >= 0 {
		return
	}
	r := l.p.replicaOf(l.slot)
	if r < 0 {
		return
	}
	l.keys = l.p.x.Keys(nil, 0, l.tokens)
	l.p.x.Hold(r, l.keys, l.p.cfg.PredictTTL)
	l.held = r
	l.p.late[LatePredicted].Add(1)
	// The reservation credited the others' prefill estimate with the
	// bytes' estimate of the prompt (no tokens then): the engine stores the
	// tokens past it too (a chat template's), which would read as another
	// instance's prefill and, past ForeignEvidenceShare, make a lone
	// instance under the wait rule read itself as several.
	// The cold start's first request recorded no estimate (no router
	// yet): its reservation's was the bytes' all the same, and where
	// content is denser than chars_per_token (2.5 bytes per token: 37.5%
	// of the prompt past it) its uncredited tokens alone made a lone
	// instance read itself as several and wait for every preflight for
	// good.
	if est := l.estimateLocked(); est > 0 && len(l.tokens) > est {
		if fp := l.p.foreign.Load(); fp != nil {
			fp.Credit(l.slot, int64(len(l.tokens)-est))
		}
	}
}

// deferLate is the Late handle of a request routed on a cached message
// prefix m without waiting: its own tokenization (which teaches the cache
// the tokens of its messages, for the next turn, and checks the prefix)
// is sent only once the request's first response byte came (FirstByte) or
// it ended, not while the engine computes its prompt: on an engine that
// tokenizes on the CPUs its serving shares, a /tokenize of the same long
// prompt at the same moment delays the request's own first token, and
// the precise decision that routed the request already holds its
// prefix's blocks. The call's body is built now (req slices the client's
// body, whose buffer is the request's).
func (p *Precise) deferLate(key uint64, req TokenizeRequest, probe func() (selection.Slot, bool), m msgPrefix) *Late {
	body := req.body()
	l := &Late{p: p, slot: -1, held: -1, probe: probe, tail: len(req.Messages) - int(m.end)}
	l.start = func() {
		base, err := p.tokenizeBase(true)
		if err != nil {
			l.arrived(nil, err)
			return
		}
		toks, c, err := p.tk.start(base, key, func() []byte { return body })
		if c == nil {
			if toks != nil {
				p.learned(m, toks)
			}
			l.arrived(toks, err)
			return
		}
		p.tk.Then(c, func(toks []uint32, err error) {
			if err == nil {
				p.learned(m, toks)
			}
		})
		p.tk.Then(c, l.arrived)
	}
	return l
}

// FirstByte reports that the request's response began: a tokenization
// deferred until then (deferLate) is sent, from its own goroutine (not
// the response's). Safe to call more than once and from any goroutine.
func (l *Late) FirstByte() {
	l.mu.Lock()
	start := l.start
	l.start = nil
	l.mu.Unlock()
	if start != nil {
		go start()
	}
}

// End reports the request's end: the predictions the late tokens made
// live PredictGrace more unless confirmed, and a tokenization still
// deferred is sent (to teach the cache). Safe to call more than once.
func (l *Late) End() {
	l.FirstByte()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.ended = true
	if l.held >= 0 {
		l.p.x.Release(l.held, l.keys, l.p.cfg.PredictGrace)
		return
	}
	if l.done && l.tokens != nil {
		l.p.late[LateUnrouted].Add(1)
	}
}

// Cold reports whether a request is routed in the precise path's cold
// start: no feed is fresh yet (Ready is false, so no preflight is waited
// for), but one is connected, not found unhealthy, and will turn fresh
// with its engine's first stores (without a subscriber, as in the
// simulation, the feeds count as connected). ColdPreflight is then worth
// sending; a fleet whose every feed is down or delivers only orphans
// sends none.
func (p *Precise) Cold() bool {
	if p.Ready() {
		return false
	}
	if p.sub == nil {
		return true
	}
	x := p.x
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, rep := range x.reps {
		if rep.connected && rep.unhealthy == "" {
			return true
		}
	}
	return false
}

// ColdPreflight is the preflight of a request routed in the cold start
// (Cold): nothing waits for it, the request is routed by the estimate. It
// tokenizes the body in the background, at TokenizeURL or any engine in
// turn (none has a fresh feed), and returns the Late handle whose tokens
// predict the blocks of the replica the request was routed to, fresh or
// not: that replica's feed turns fresh with the first stores of this very
// prefill, which come in chunks, and without the prediction its exact
// overlap would show the part stored so far, below what the estimate
// knows is on its way, and decide against it (bench/EXPERIMENTS.md, the
// cold start). The outcome counts in LateOutcomes. nil when nothing could
// be sent (no engine to tokenize at, the body not a prompt, the tokenizer
// busy).
func (p *Precise) ColdPreflight(ep selection.Endpoint, body []byte, f *selection.Features, probe func() (selection.Slot, bool)) *Late {
	base, err := p.tokenizeBase(false)
	if err != nil {
		return nil
	}
	req, err := RequestFor(ep, body, f)
	if err != nil {
		return nil
	}
	l := &Late{p: p, slot: -1, held: -1, probe: probe}
	l.estimated(p, f)
	toks, c, _ := p.tk.Start(base, xxhash.Sum64(body), req)
	if c == nil {
		if toks == nil {
			return nil // busy or failed at once
		}
		l.arrived(toks, nil)
		return l
	}
	p.tk.Then(c, l.arrived)
	return l
}

// PromptTokens is the prompt's token count from the n tokens a preflight
// returned with l (nil: none, n are the whole prompt's): a request routed
// on a cached message prefix adds to the prefix's its other messages'
// bytes (their JSON: about their text and the template's tokens) over
// charsPerToken; a preflight past its timeout returned none (0).
func (l *Late) PromptTokens(n int, charsPerToken float64) int {
	if l != nil {
		n = max(n, l.prefix)
	}
	if l != nil && l.tail > 0 && charsPerToken > 0 {
		return n + int(math.Ceil(float64(l.tail)/charsPerToken))
	}
	return n
}
