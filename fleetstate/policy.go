package fleetstate

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/snapshot"
)

// DefaultMaxBodyBytes bounds how much of a request body ramjet reads to
// fingerprint it: 16 MiB, the guard's default body bound (so that every
// body the guard accepts is also fingerprinted).
const DefaultMaxBodyBytes = edge.DefaultMaxBodySize

// PolicySettings are the settings of the ramjet lb_policy (the JSON of
// module.RamjetSelection, which embeds them): the routing knobs, the
// fleet's name and secrets, and the optional parts. SetDefaults fills the
// zero fields; Validate names the bad setting.
type PolicySettings struct {
	// The routing knobs: affinity_cap, alpha, request_cost, block_tokens,
	// prefix_tokens, chars_per_token, index_budget, long_output_tokens,
	// tie_epsilon and output_weight. Unset means the default (see package
	// selection); an explicit 0 of alpha, request_cost, tie_epsilon or
	// output_weight is a value (alpha 0: pure affinity).
	selection.Config

	// MaxBodyBytes bounds how much of a request body is read to
	// fingerprint it, in bytes. Larger bodies are forwarded untouched and
	// routed by the fallback policy. Default: 16 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`

	// Profiles maps an upstream dial address (or "address#rank") to its
	// engine profile, "speculative" or "standard" (the default). When cache
	// and load tie, requests asking for at least long_output_tokens prefer
	// speculative engines and shorter ones standard engines.
	Profiles map[string]string `json:"profiles,omitempty"`

	// FallbackRaw is the policy for requests that cannot be fingerprinted
	// (a Caddy selection policy module, loaded by the Caddy module).
	// Default: least_conn.
	FallbackRaw json.RawMessage `json:"fallback,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`

	// StateKey names the routing state (index, load reservations) this
	// policy shares with every other ramjet policy of the same name. It
	// survives config reloads as long as the index-relevant settings stay
	// the same. Default: "default".
	StateKey string `json:"state_key,omitempty"`

	// RouteIDSecret keys the opaque X-Ramjet-Upstream ids. Set it (it
	// accepts placeholders such as {env.RJ_ROUTE_ID_SECRET}) to keep ids
	// stable across restarts and ramjet instances; by default a random
	// per-process secret is used.
	RouteIDSecret string `json:"route_id_secret,omitempty"`

	// InstanceID names this ramjet instance among several in front of the
	// same engines (no traffic between them): it sets where the instance
	// spills a request when the replicas holding its prefix are too
	// loaded (selection.Router.SetInstance), so that instances agree on a
	// cold prefix's replica but not on the spills. An id ending in an
	// ordinal ("ramjet-0", "ramjet-1", a StatefulSet's pod names) spreads
	// instances best. Accepts placeholders ({env.HOSTNAME}). Default: the
	// host name (set it when several instances share a host).
	InstanceID string `json:"instance_id,omitempty"`

	// SpillBand widens the instance spill (InstanceID) to every replica
	// scoring within this many tokens of the best, and applies it to cold
	// prefixes too (selection.Options.SpillBand and ColdSpill): several
	// instances on the precise path that read the same engine scrape then
	// walk disjoint stretches of one rendezvous order instead of all
	// taking the one replica idle at the last scrape. 0 (unset) is the
	// default: DefaultSpillBand when kv is on with engine_metrics or with
	// foreign_prefill (alone, without engine load, it was measured to
	// cost; see bench/RESULTS.md), else off; -1 (Caddyfile "off") is off.
	// It changes nothing for an instance at spill position 0 (no id, or
	// an ordinal 0).
	SpillBand int `json:"spill_band,omitempty"`

	// IndexShare and QueueExtra set selection.Options.IndexShare and
	// QueueExtra, the approximate path's model of a full KV cache: the
	// share of a replica's KV capacity the index counts as prefix cache
	// (in (0, 1]; 1 counts the whole), and the extra weight of pending
	// prefill for a request cold on every replica (positive). 0 (unset) is
	// the default: selection's DefaultIndexShare and DefaultQueueExtra,
	// except IndexShare off with kv (the engines' events say what they
	// hold; bench/EXPERIMENTS.md sections 87 and 108); -1 (Caddyfile "off")
	// is off.
	IndexShare float64 `json:"index_share,omitempty"`
	QueueExtra float64 `json:"queue_extra,omitempty"`

	// FixedDensity keeps chars_per_token as the prompts' bytes per real
	// token where the engines' token figures (KV capacity, KV in use, the
	// others' prefill) meet the index's estimated tokens, rather than the
	// density the engines' usage.prompt_tokens show where prompts are
	// lighter than that (selection.Options.FixedDensity; gauge
	// ramjet_prompt_bytes_per_token).
	FixedDensity bool `json:"fixed_density,omitempty"`

	// ForeignPrefill, "on", "queues" or "off", counts the prefill other ramjet
	// instances put on a replica as load, estimated from the block runs
	// the engine's KV events report beyond this instance's own pending
	// prefill (selection.ForeignPrefill): without it, an instance sees a
	// replica another instance has just started to warm with a long prompt
	// as warm and unloaded, and joins that prefill; the same runs count
	// as the others' resident contexts. It needs kv. Unset is the default:
	// on with kv (with the spill band), with engine_metrics too since the
	// others' contexts made it win there on the tuning seeds
	// (bench/RESULTS.md, 2026-12-05, "the others' contexts"); off without
	// kv. Unset it also counts (with engine_metrics: on replicas without a
	// fresh scrape, whose reported queue counts them otherwise) the others' queued
	// requests, which store nothing until their prefill runs, as their
	// learned share of this instance's pending prefill (ForeignPrior), as
	// "queues" asks; "on" leaves them out: without them several instances
	// sent their agents' first turns to the one replica warm at start-up
	// (bench/RESULTS.md, 2026-12-05, "the first-turn pile-up"), and a
	// tool-agent trace's tail was longer ("the blind window measured").
	ForeignPrefill string `json:"foreign_prefill,omitempty"`

	// KV turns on the precise index from the engines' KV-cache events
	// (see kvindex.Settings); off by default.
	KV *kvindex.Settings `json:"kv,omitempty"`

	// Outlier tunes outlier detection (see selection.OutlierSettings); on by
	// default.
	Outlier *selection.OutlierSettings `json:"outlier,omitempty"`

	// EngineMetrics turns on scraping of the engines' own metrics (see
	// enginemetrics.Settings); off by default.
	EngineMetrics *enginemetrics.Settings `json:"engine_metrics,omitempty"`

	// Integrity turns on engine integrity: admission against pinned
	// digests and the speculative-decoding quarantine (see
	// integrity.Settings); off by default.
	Integrity *integrity.Settings `json:"integrity,omitempty"`

	// SessionShadow turns on session-affinity shadow telemetry (see
	// integrity.ShadowSettings); off by default. It never changes a
	// decision.
	SessionShadow *integrity.ShadowSettings `json:"session_shadow,omitempty"`

	// Snapshot turns on authenticated snapshots of the approximate index
	// (see snapshot.Settings); off by default.
	Snapshot *snapshot.Settings `json:"snapshot,omitempty"`

	// DepartAfter is how long a replica must be missing from every live
	// ramjet policy's upstream pool (dynamic upstreams, a reload), with no
	// request in flight on it, before the fleet forgets it: its index
	// entries, load and slot are freed and a replica that appears later
	// starts cold (Fleet.Depart). Default: 30s.
	DepartAfter duration.Duration `json:"depart_after,omitempty"`
}

// UnmarshalJSON decodes the settings as Caddy does (unknown fields are an
// error) and marks the routing knobs present in the JSON as explicit, so
// that "alpha": 0 means pure affinity while a missing alpha means the
// default. Caddy's module decoding reaches it through the module struct
// that embeds PolicySettings.
func (s *PolicySettings) UnmarshalJSON(b []byte) error {
	type plain PolicySettings // without these methods
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode((*plain)(s)); err != nil {
		return err
	}
	k, err := selection.ExplicitInJSON(b)
	s.Explicit |= k
	return err
}

// MarshalJSON encodes the settings, writing the explicit zero knobs that
// omitempty would drop, so that a Caddyfile's alpha 0 survives the
// Caddyfile -> JSON adaptation.
func (s *PolicySettings) MarshalJSON() ([]byte, error) {
	type plain PolicySettings
	b, err := json.Marshal((*plain)(s))
	if err != nil {
		return nil, err
	}
	return s.Config.AppendExplicitZeros(b), nil
}

// SetDefaults fills the zero fields of the knobs, the body bound, the
// state key and depart_after with their defaults (the optional parts fill
// their own when they start).
func (s *PolicySettings) SetDefaults() {
	s.Config.SetDefaults()
	if s.MaxBodyBytes == 0 {
		s.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if s.StateKey == "" {
		s.StateKey = DefaultStateKey
	}
	if s.DepartAfter == 0 {
		s.DepartAfter = duration.Duration(DefaultDepartAfter)
	}
}

// Validate rejects settings that cannot work, naming the option.
func (s *PolicySettings) Validate() error {
	if err := s.Config.Validate(); err != nil {
		return err
	}
	if s.MaxBodyBytes < 0 {
		return fmt.Errorf("max_body_bytes must be positive, got %d", s.MaxBodyBytes)
	}
	for up, p := range s.Profiles {
		if _, ok := ParseProfile(p); !ok {
			return fmt.Errorf("profiles[%s]: unknown engine profile %q (want speculative or standard)", up, p)
		}
	}
	if err := CheckStateKey(s.StateKey); err != nil {
		return err
	}
	if s.Outlier != nil {
		if err := s.Outlier.Validate(); err != nil {
			return err
		}
	}
	if s.SpillBand < -1 {
		return fmt.Errorf("spill_band must be positive, 0 (the default) or -1 (off), got %d", s.SpillBand)
	}
	if v := s.IndexShare; v != -1 && (v < 0 || v > 1) {
		return fmt.Errorf("index_share must be in (0, 1], 0 (the default) or -1 (off), got %v", v)
	}
	if v := s.QueueExtra; v != -1 && v < 0 {
		return fmt.Errorf("queue_extra must be positive, 0 (the default) or -1 (off), got %v", v)
	}
	if _, err := ParseForeign(s.ForeignPrefill); err != nil {
		return fmt.Errorf("foreign_prefill: %w", err)
	}
	if (s.ForeignPrefill == "on" || s.ForeignPrefill == "queues") && s.KV == nil {
		return fmt.Errorf("foreign_prefill %s needs kv_events (the engines' KV events are what it reads)", s.ForeignPrefill)
	}
	if s.DepartAfter < 0 {
		return fmt.Errorf("depart_after must be positive, got %v", time.Duration(s.DepartAfter))
	}
	return nil
}

// PolicyWords adds to words (caddyblock.Block.Words of lb_policy ramjet
// or the ramjet directive) the Caddyfile keywords of PolicySettings'
// options, the same in both: "off" is -1 for spill_band, index_share,
// queue_extra, kv_queue_estimate, kv_cap_load and kv_cap_foreign_queue.
// It returns words.
func PolicyWords(words map[string]map[string]any) map[string]map[string]any {
	for _, name := range []string{"spill_band", "index_share", "queue_extra", "kv_queue_estimate", "kv_cap_load", "kv_cap_foreign_queue"} {
		words[name] = map[string]any{"off": -1}
	}
	return words
}

// DefaultSpillBand is spill_band's default with kv and engine_metrics on,
// in tokens.
const DefaultSpillBand = 1024

// SpillOptions are the rule variants spill_band and engine_metrics'
// agree, overflow and queue ask for (the zero Options when all are off
// and kv is), with selection's IndexShare off under kv unless
// index_share is set.
func (s *PolicySettings) SpillOptions() selection.Options {
	em := s.EngineMetrics
	o := selection.Options{AgreeExt: em != nil && em.Agree, EngineOverflow: em != nil && em.Overflow}
	if em != nil {
		o.EngineQueue, o.EngineQueueSat = em.Queue, em.QueueSat
	}
	band := s.SpillBand
	if band == 0 && s.KV != nil && (s.EngineMetrics != nil || s.ForeignPrefillOn()) {
		band = DefaultSpillBand
	}
	if band > 0 {
		o.ColdSpill, o.SpillBand = true, float64(band)
	}
	if s.KV != nil {
		// The precise index knows what the engines hold: IndexShare's
		// model of their eviction cost several precise instances their
		// TTFT p99 on shared-prefix at 196,608 tokens (bench/EXPERIMENTS.md
		// section 87). QueueExtra stays on: without it the precise path's
		// p99 there was 1.04x the approximate path's (section 108).
		o.IndexShare = -1
	}
	o.IndexShare = cmp.Or(s.IndexShare, o.IndexShare) // set: on either path
	o.QueueExtra = cmp.Or(s.QueueExtra, o.QueueExtra)
	o.FixedDensity = s.FixedDensity
	return o
}

// ForeignPrefillOn reports whether the other instances' prefill estimate
// is on: foreign_prefill, or by default when kv is on.
func (s *PolicySettings) ForeignPrefillOn() bool {
	switch s.ForeignPrefill {
	case "on", "queues":
		return s.KV != nil
	case "off":
		return false
	}
	return s.KV != nil
}

// ForeignPrior is the scale of the others' unseen load with the estimate
// on (selection.ForeignPrefill.SetPrior): 1 with foreign_prefill queues
// and selection.DefaultForeignPrior unset, else 0 (on: the stored runs
// alone). With engine_metrics it applies only to replicas without a fresh
// scrape (selection.Router.ExternalFresh): a fresh scrape's queue counts
// the others' queued requests already, and a stalled or failing one falls
// back to what the instance does without engine_metrics.
func (s *PolicySettings) ForeignPrior() float64 {
	switch {
	case !s.ForeignPrefillOn() || s.ForeignPrefill == "on":
		return 0
	case s.ForeignPrefill == "queues":
		return 1
	}
	return selection.DefaultForeignPrior
}

// ParseForeign checks foreign_prefill: on|off|queues, or "" (unset).
func ParseForeign(v string) (string, error) {
	if v == "queues" {
		return v, nil
	}
	if _, err := ParseOnOff(v); err != nil {
		return v, fmt.Errorf("%q: want on, off or queues", v)
	}
	return v, nil
}

// ParseOnOff checks an on|off option: "on", "off" or "" (unset).
func ParseOnOff(v string) (string, error) {
	switch v {
	case "on", "off", "":
		return v, nil
	}
	return v, fmt.Errorf("%q: want on or off", v)
}

// ProfileMap is Profiles parsed (Validate accepted them).
func (s *PolicySettings) ProfileMap() map[string]selection.Profile {
	m := make(map[string]selection.Profile, len(s.Profiles))
	for up, name := range s.Profiles {
		m[up], _ = ParseProfile(name)
	}
	return m
}

// OutlierConfig is the outlier detector's configuration (the defaults
// when Outlier is unset).
func (s *PolicySettings) OutlierConfig() selection.OutlierConfig {
	var od selection.OutlierSettings
	if s.Outlier != nil {
		od = *s.Outlier
	}
	return od.Config()
}

// ParseProfile reads an engine profile name: speculative, or standard
// (also the empty name), in any case.
func ParseProfile(s string) (selection.Profile, bool) {
	switch strings.ToLower(s) {
	case "speculative":
		return selection.ProfileSpeculative, true
	case "standard", "":
		return selection.ProfileStandard, true
	}
	return 0, false
}

var stateKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// CheckStateKey rejects a state_key other than 1-64 letters, digits, '_',
// '.' or '-'; the empty key (the default) passes.
func CheckStateKey(key string) error {
	if key != "" && !stateKeyRE.MatchString(key) {
		return fmt.Errorf("state_key must be 1-64 letters, digits, '_', '.' or '-', got %q", key)
	}
	return nil
}
