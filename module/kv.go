package module

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// kvOptions adds the kv options of the policy's Caddyfile block to b
// (kv_<name> is kvindex.Settings' field <name>; tokenize's options are its
// tokenize_* fields):
//
//	kv_events <upstream>|* [dial|bind] <events> [<replay>] [{
//		ranks  <n>
//		scheme http|https
//		topic  <topic>
//		resolvers <dns server>...
//	}]
//	kv_upstream_token <token>
//	kv_topic        <topic>
//	kv_block_size   <tokens>
//	kv_max_entries  <n>
//	kv_predict_ttl  <duration>
//	kv_queue_estimate <x>|off
//	kv_cap_load       <x>|off
//	kv_cap_foreign_queue <x>|off
//	kv_canary <model> [{
//		interval <duration>
//		blocks   <n>
//	}]
//	tokenize [{
//		timeout        <duration>
//		max_concurrent <n>
//		cache_entries  <n>
//		url            <base url>
//		wait           always|auto|warm
//	}]
//
// kv_events may appear once per engine, and once with "*" as the template
// of every other upstream (kvindex/template.go); it turns the precise index on.
// "dial" (the default) connects to the engine's PUB socket; "bind" listens
// on <events> for the engine's PUB socket to connect to.
func (s *RamjetSelection) kvOptions(b *caddyblock.Block) {
	kv := func() *kvindex.Settings {
		if s.KV == nil {
			s.KV = new(kvindex.Settings)
		}
		return s.KV
	}
	for _, name := range []string{"topic", "upstream_token", "block_size", "max_entries", "predict_ttl", "queue_estimate", "cap_load", "cap_foreign_queue", "canary"} {
		b.Custom["kv_"+name] = func(d *caddyfile.Dispenser) error { return b.Option(d, "kv_"+name, kv(), name) }
	}
	b.Custom["tokenize"] = func(d *caddyfile.Dispenser) error {
		if d.NextArg() {
			return d.ArgErr()
		}
		return b.Sub(d, "tokenize", kv(), map[string]string{"timeout": "tokenize_timeout",
			"max_concurrent": "tokenize_concurrency", "cache_entries": "tokenize_cache", "url": "tokenize_url", "wait": "tokenize_wait"})
	}
	b.Custom["kv_events"] = func(d *caddyfile.Dispenser) error {
		e, err := kvindex.ParseFeedLine(d.RemainingArgs())
		if err != nil {
			return d.Errf("kv_events: %v", err)
		}
		if err := b.Sub(d, "kv_events", &e, map[string]string{"ranks": "ranks", "scheme": "scheme", "topic": "topic", "resolvers": "resolvers"}); err != nil {
			return err
		}
		c := kv()
		if err := kvindex.ValidateFeeds(append(c.Engines, e)); err != nil { // a template's placeholders included
			return d.Errf("kv_events %s: %v", e.Upstream, err)
		}
		c.Engines = append(c.Engines, e)
		return nil
	}
}

// kvStates holds the precise-index state across config reloads, keyed by
// state_key and the kv configuration: a reload with the same feeds keeps
// the index and its subscriptions.
var kvStates = caddy.NewUsagePool()

// kvState is one precise-path service (kvindex.Precise) kept across
// reloads, with what the module adds: the preflight's latency histogram
// and the fleet whose route ids label its metrics.
type kvState struct {
	p *kvindex.Precise

	// timeout bounds the whole preflight of one request (waiting for an
	// identical one in flight included).
	timeout    time.Duration
	tokLatency *kvindex.LatencyHist

	stateKey string
	fleet    atomic.Pointer[fleet] // for route ids; the last provisioned

	// fp is the other instances' prefill estimate fed by p's feeds;
	// foreign is fp while foreign_prefill is on, else nil (foreign.go).
	fp      *selection.ForeignPrefill
	foreign atomic.Pointer[selection.ForeignPrefill]
}

// Destruct stops the feeds: the last policy using them was cleaned up.
func (k *kvState) Destruct() error {
	kvLive.Drop(k.stateKey, k)
	k.setForeign(false, nil, 0)
	return k.p.Close()
}

// kvLive maps each state_key to its kv state provisioned last, for the
// metrics collector and KVPreflight.
var kvLive fleetstate.Latest[*kvState]

func (s *RamjetSelection) provisionKV(ctx caddy.Context) error {
	if s.KV == nil {
		return nil
	}
	s.KV.SetDefaults()
	if err := s.KV.Validate(); err != nil {
		return err
	}
	if err := register(ctx.GetMetricsRegistry(), kvCollector()); err != nil {
		return fmt.Errorf("kv metrics: %w", err)
	}
	key := fleetstate.SettingsKey("ramjet-kv", s.StateKey, s.KV)
	logger := s.logger.Named("kv")
	v, _, err := kvStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		k := &kvState{timeout: time.Duration(s.KV.TokenizeTimeout),
			tokLatency: kvindex.NewLatencyHist(), stateKey: s.StateKey, fp: selection.NewForeignPrefill()}
		pc, err := s.KV.Precise(resolveSecret(s.KV.UpstreamToken), HeaderRank, logger, k.tokLatency.Observe)
		if err != nil {
			return nil, err
		}
		pc.Subscriber.Handover = "ramjet-kv/" + s.StateKey // a reload's new feeds take over the bound ports
		if k.p, err = kvindex.NewPrecise(pc); err != nil {
			return nil, err
		}
		k.p.Start(context.Background()) // the feeds outlive this config (a reload keeps them): Destruct stops them
		return k, nil
	})
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	s.kv, s.kvKey = v.(*kvState), key
	s.kvUnhook = s.fleet.OnUnregister(s.kv.p.Depart) // a departed replica's template feed stops
	s.kv.fleet.Store(s.fleet)
	s.kv.setForeign(s.ForeignPrefillOn(), s.rt, s.ForeignPrior()) // foreign.go
	s.fleet.kv.Store(&kvPreflight{kv: s.kv, maxBody: s.MaxBodyBytes, owner: s})
	kvLive.Set(s.StateKey, s.kv)
	return nil
}

func (s *RamjetSelection) cleanupKV() error {
	if s.kv == nil {
		return nil
	}
	s.kvUnhook()
	if pf := s.fleet.kv.Load(); pf != nil && pf.owner == s {
		s.fleet.kv.CompareAndSwap(pf, nil)
	}
	// s.kv stays set: a request of this config may still be deciding
	// (decide reads it) after a reload; the state ends with its last user.
	_, err := kvStates.Delete(s.kvKey)
	return err
}

// bindKV maps the slots of a new pool view to the precise index's feeds
// (starting the kv_events template's for new replicas; kvindex.Precise.BindAll).
func (s *RamjetSelection) bindKV(v *poolView) {
	if s.kv != nil {
		s.kv.p.SetEstimate(s.rt) // the estimate cap (kvindex.Precise.SetEstimate)
		s.kv.p.BindAll(v.Slots, v.Keys)
	}
}

// kvPreflight is what the ramjet handler needs to run the tokenize
// preflight of a fleet's precise path before selection: the service and
// the policy's body bound. It is published on the fleet by the policy
// that provisioned it last.
type kvPreflight struct {
	kv      *kvState
	maxBody int64
	owner   *RamjetSelection
}

// preflight tokenizes r's prompt for the precise path and keeps the token
// ids in st for Select. It runs in the ramjet handler, ahead of
// reverse_proxy, bounded by the tokenize timeout and concurrency; on any
// failure the request is routed by the estimate.
func (pf *kvPreflight) preflight(r *http.Request, st *reqState, x selection.Extractor, logger *zap.Logger) {
	if r.Method != http.MethodPost {
		return
	}
	ep := selection.EndpointForPath(r.URL.Path)
	if ep != selection.EndpointChat && ep != selection.EndpointCompletions {
		return
	}
	k := pf.kv
	cold := false
	if !k.p.Ready() {
		// No fresh feed: the exact overlap would not be used. In the cold
		// start (a feed connected, none fresh yet) the request still
		// tokenizes, in the background, so that its replica's blocks are
		// predicted by the time its feed turns fresh.
		if cold = k.p.Cold(); !cold {
			return
		}
	}
	st.readBody(r, pf.maxBody)
	b := st.acquireBody()
	if b == nil {
		return
	}
	defer b.Release()
	f := st.features(x, ep) // cached for Select: one parse per request
	if f == nil {
		return
	}
	if cold {
		if late := k.p.ColdPreflight(ep, b.Bytes(), f, st.routedSlot); late != nil {
			st.route.kv = &kvRequest{p: k.p, st: st, late: late}
		}
		return
	}
	toks, late, err := k.p.PreflightBody(r.Context(), ep, b.Bytes(), f, k.timeout, st.routedSlot)
	if err != nil {
		if c := logger.Check(zap.DebugLevel, "ramjet tokenize fallback"); c != nil {
			c.Write(zap.Error(err))
		}
	}
	st.route.tokens = toks
	if toks != nil || late != nil {
		st.route.kv = &kvRequest{p: k.p, st: st, late: late}
	}
}
