package directive

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/deploy"
	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/envcheck"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/module"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/snapshot"
	"github.com/ramjet-llm/ramjet/upstream"
)

func init() {
	httpcaddyfile.RegisterDirective("ramjet", parseRamjet)
	httpcaddyfile.RegisterDirectiveOrder("ramjet", httpcaddyfile.After, "reverse_proxy")
}

// Defaults the ramjet directive gives the reverse_proxy it expands into.
const (
	// DefaultHealthInterval is the period of the active health check.
	DefaultHealthInterval = 5 * time.Second
	// DefaultHealthTimeout bounds one active health check.
	DefaultHealthTimeout = 3 * time.Second
	// DefaultHealthURI is what the active health check asks for.
	DefaultHealthURI = "/v1/models"
	// DefaultFailDuration is how long a failed request counts against its
	// upstream (passive health).
	DefaultFailDuration = 30 * time.Second
	// DefaultMaxFails is how many recent failures take an upstream out.
	DefaultMaxFails = 3
	// DefaultRetries is how many times a request that could not reach an
	// engine, or that an engine answered 5xx, is sent to another one.
	DefaultRetries = 2
	// RetryStatusExpression is the lb_retry_match expression that retries
	// 5xx answers (on another replica: Select skips tried ones).
	RetryStatusExpression = "{http.reverse_proxy.status_code} >= 500"
	// DefaultDialTimeout bounds connecting to an engine.
	DefaultDialTimeout = 3 * time.Second
	// DefaultMaxIdleConnsPerHost keeps enough warm connections per engine
	// for hundreds of concurrent streams.
	DefaultMaxIdleConnsPerHost = 1024
	// DefaultIdleConnTimeout is how long an idle engine connection is kept.
	DefaultIdleConnTimeout = 2 * time.Minute
	// DefaultEngineTimeout is the longest an engine may stay silent on a
	// request: before its response (a whole non-streaming generation) and
	// between two reads of a stream. A hung engine's attempt fails after it
	// (retried elsewhere when nothing reached the client) and counts
	// against the engine (outlier detection).
	DefaultEngineTimeout = 5 * time.Minute
	// MaxDPRanks bounds the data-parallel ranks of one engine.
	MaxDPRanks = 64
)

// envDrivenProxyOptions are the reverse_proxy subdirectives that are
// dropped when given without a value inside ramjet (an unset {$RJ_*}
// environment variable), so that ramjet's default applies.
var envDrivenProxyOptions = map[string]bool{
	"health_uri": true, "health_port": true, "health_interval": true, "health_timeout": true,
	"health_passes": true, "health_fails": true, "health_status": true,
	"fail_duration": true, "max_fails": true, "unhealthy_latency": true, "unhealthy_request_count": true,
	"lb_retries": true, "lb_try_duration": true, "lb_try_interval": true,
	"flush_interval": true, "stream_timeout": true, "stream_close_delay": true,
}

// ramjetDirective is the parsed ramjet directive. Its own options are
// its tagged fields (package caddyblock, line-form: an option without a
// value keeps its default), the routing knobs (selection.Config) and the
// precise path's, integrity's and snapshots' options (below).
type ramjetDirective struct {
	upstreams []upstream.Addr
	ranks     []int    // per engine
	profiles  []string // per engine

	Token        string   `json:"upstream_token"`
	Secret       string   `json:"route_id_secret"`
	ClientTokens []string `json:"client_tokens"`
	// DPRanks and Profiles are kept as given, to be spread over the
	// engines.
	DPRanks           []string       `json:"dp_ranks"`
	Profiles          []string       `json:"profiles"`
	ForwardClientAuth bool           `json:"forward_client_auth"`
	MaxBodySize       int64          `json:"max_body_size"`
	ModelCheck        string         `json:"model_check"`
	ModelsCache       caddy.Duration `json:"models_cache"`
	ModelsTimeout     caddy.Duration `json:"models_timeout"`
	EngineTimeout     caddy.Duration `json:"engine_timeout"`
	BodyTimeout       caddy.Duration `json:"body_timeout"`
	BodyMinRate       int64          `json:"body_min_rate"`
	WriteTimeout      caddy.Duration `json:"write_timeout"`
	AllowPaths        []string       `json:"allow_paths"`
	InstanceID        string         `json:"instance_id"`
	DepartAfter       caddy.Duration `json:"depart_after"`
	// SpillBand and ForeignPrefill are the policy's spill_band and
	// foreign_prefill (fleetstate.PolicySettings); unset keeps their
	// defaults.
	SpillBand      int    `json:"spill_band"`
	ForeignPrefill string `json:"foreign_prefill"`
	// IndexShare and QueueExtra are the policy's index_share and
	// queue_extra (fleetstate.PolicySettings); unset keeps their defaults.
	IndexShare float64 `json:"index_share"`
	QueueExtra float64 `json:"queue_extra"`
	// FixedDensity is the policy's fixed_density.
	FixedDensity bool `json:"fixed_density"`
	// SessionShadow is the session key header of the session-affinity
	// shadow telemetry (integrity.ShadowSettings); empty keeps it off.
	SessionShadow    string `json:"session_shadow"`
	selection.Config        // the routing knobs given

	kv    kvDirective        // the precise path's options
	integ integrityDirective // engine integrity's options
	snap  snapshotDirective  // index snapshots' options
}

// parseRamjet sets up the ramjet directive: a production-tuned reverse_proxy
// to OpenAI-compatible engines with lb_policy ramjet, plus GET /health,
// GET /v1/models and the request guard. Syntax:
//
//	ramjet [<matcher>] <upstreams...> {
//	    upstream_token      <token>
//	    client_tokens       <keys...>
//	    dp_ranks            <n> | <n1,n2,...>
//	    profiles            standard|speculative | <p1,p2,...>
//	    route_id_secret     <secret>
//	    forward_client_auth
//	    max_body_size       <size>
//	    model_check         on|off
//	    models_cache        <duration>
//	    models_timeout      <duration>
//	    engine_timeout      <duration>
//	    body_timeout        <duration>
//	    body_min_rate       <size per second>
//	    write_timeout       <duration>|off
//	    instance_id         <id>
//	    depart_after        <duration>
//	    spill_band          <tokens>|off
//	    index_share         <share>|off   (the approximate path's full-cache model)
//	    queue_extra         <weight>|off
//	    fixed_density       [true|false] (chars_per_token, not the learned bytes per token)
//	    foreign_prefill     on|off|queues (needs kv_events or kv_bind)
//	    session_shadow      <header>    (shadow telemetry, off when empty)
//	    allow_paths         <paths...>
//	    kv_events | kv_replay | kv_topics <upstream>=<value>...
//	    kv_bind <tcp://addr> | kv_topic <topic> | kv_block_size <tokens> |
//	    tokenize_timeout <duration>     (the precise path, kvDirectiveOptions)
//	    integrity_model_sha256 | integrity_template_sha256 |
//	    integrity_tokenizer_sha256 <hex> | integrity_interval |
//	    integrity_timeout <duration> | integrity_identity_path <path> |
//	    spec_decode off|observe|enforce | spec_decode_window <duration> |
//	    spec_decode_windows <n> | spec_decode_position <n>|overall |
//	    integrity_state_file <path> | integrity_key <key>
//	                                    (engine integrity, integrityDirectiveOptions)
//	    snapshot_path <path> | snapshot_interval | snapshot_max_age <duration> |
//	    snapshot_key <key>              (index snapshots, snapshotDirectiveOptions)
//	    affinity_cap | alpha | request_cost | block_tokens | prefix_tokens |
//	    chars_per_token | index_budget | long_output_tokens | tie_epsilon |
//	    output_weight | context_weight | pair_weight | kv_capacity <value>
//
//	    # any reverse_proxy subdirective, e.g.
//	    health_interval 2s
//	    transport http { ... }
//	}
//
// Upstreams are host:port or http(s)://host:port, space- or comma-separated
// (so one token such as {$RJ_UPSTREAM} holding "a:8000,b:8000" works as it
// is). dp_ranks and profiles take one value for every engine or one per
// engine, in upstream order. An option whose value is empty (an unset
// environment variable) keeps its default. The defaults given to
// reverse_proxy apply only where the block does not set the same thing.
func parseRamjet(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	if !h.Next() {
		return nil, h.ArgErr()
	}
	userMatcherSet, err := h.ExtractMatcherSet()
	if err != nil {
		return nil, err
	}
	h.Next() // ExtractMatcherSet rewound the dispenser
	d := h.NewFromNextSegment()
	rd, err := parseRamjetTokens(d)
	if err != nil {
		return nil, err
	}

	// What is left of the block is reverse_proxy syntax.
	d.Reset()
	rp := new(reverseproxy.Handler)
	if err := rp.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	if err := rp.FinalizeUnmarshalCaddyfile(h); err != nil {
		return nil, err
	}
	if err := rd.tune(rp, h.WithDispenser(d)); err != nil {
		return nil, err
	}
	dials := rd.dials()

	health := &module.Health{Upstreams: dials, RouteIDSecret: rd.Secret}
	engines := module.Engines{Upstreams: rd.baseURLs(), UpstreamToken: rd.Token, ClientTokens: strings.Join(rd.ClientTokens, ",")}
	models := &module.Models{Engines: engines,
		Settings: catalog.Settings{Cache: duration.Duration(rd.ModelsCache), Timeout: duration.Duration(rd.ModelsTimeout)}}
	guard := &module.Guard{Engines: engines, GuardSettings: edge.GuardSettings{
		ForwardClientAuth: rd.ForwardClientAuth,
		MaxBodySize:       rd.MaxBodySize,
		ModelCheck:        rd.ModelCheck,
		ModelsTimeout:     duration.Duration(rd.ModelsTimeout),
		BodyTimeout:       duration.Duration(rd.BodyTimeout),
		BodyMinRate:       rd.BodyMinRate,
		AllowPaths:        rd.AllowPaths,
	}}
	observe := &module.Handler{WriteTimeout: rd.WriteTimeout}

	routes := caddyhttp.RouteList{
		{
			MatcherSetsRaw: []caddy.ModuleMap{{
				"method": h.JSON(caddyhttp.MatchMethod{"GET", "HEAD"}),
				"path":   h.JSON(caddyhttp.MatchPath{"/health"}),
			}},
			HandlersRaw: []json.RawMessage{caddyconfig.JSONModuleObject(health, "handler", "ramjet_health", nil)},
		},
		{
			MatcherSetsRaw: []caddy.ModuleMap{{
				"method": h.JSON(caddyhttp.MatchMethod{"GET", "HEAD"}),
				"path":   h.JSON(caddyhttp.MatchPath{"/v1/models", "/v1/models/*"}),
			}},
			HandlersRaw: []json.RawMessage{caddyconfig.JSONModuleObject(models, "handler", "ramjet_models", nil)},
		},
		{
			// Any other method on the two routes ramjet answers itself: an
			// OpenAI-shaped 405 (never forwarded to an engine).
			MatcherSetsRaw: []caddy.ModuleMap{{
				"path": h.JSON(caddyhttp.MatchPath{"/health", "/v1/models", "/v1/models/*"}),
			}},
			HandlersRaw: []json.RawMessage{caddyconfig.JSONModuleObject(methodNotAllowed(), "handler", "static_response", nil)},
		},
		{
			HandlersRaw: []json.RawMessage{
				// The ramjet handler observes responses (prefill done,
				// release, metrics); in front of the guard so that the
				// requests the guard rejects are counted too.
				caddyconfig.JSONModuleObject(observe, "handler", "ramjet_observe", nil),
				caddyconfig.JSONModuleObject(guard, "handler", "ramjet_guard", nil),
				caddyconfig.JSONModuleObject(rp, "handler", "reverse_proxy", nil),
			},
		},
	}
	subroute := caddyhttp.Subroute{Routes: routes}
	if userMatcherSet != nil {
		return []httpcaddyfile.ConfigValue{{
			Class: "route",
			Value: caddyhttp.Route{
				MatcherSetsRaw: []caddy.ModuleMap{userMatcherSet},
				HandlersRaw:    []json.RawMessage{caddyconfig.JSONModuleObject(subroute, "handler", "subroute", nil)},
			},
		}}, nil
	}
	return []httpcaddyfile.ConfigValue{{Class: "route", Value: subroute}}, nil
}

// methodNotAllowed is the 405 of /health and /v1/models for a method
// other than GET or HEAD.
func methodNotAllowed() *caddyhttp.StaticResponse {
	return &caddyhttp.StaticResponse{
		StatusCode: caddyhttp.WeakString("405"),
		Headers: map[string][]string{
			"Allow":        {"GET, HEAD"},
			"Content-Type": {"application/json"},
		},
		Body: `{"error":{"message":"Only GET and HEAD are allowed on this path.","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`,
	}
}

// parseRamjetTokens reads the upstreams and the ramjet options, deleting
// their tokens so that only reverse_proxy syntax is left in d.
func parseRamjetTokens(d *caddyfile.Dispenser) (*ramjetDirective, error) {
	rd := &ramjetDirective{}
	d.Next() // directive name
	// The settings first: a retired MD_UPSTREAM must be named as such, not
	// reported as a missing upstream, and a typo'd RJ_* name must not be
	// ignored.
	known, ok := envcheck.Known(d.File(), deployEnvNames)
	if !ok {
		known = nil
	}
	if err := envcheck.Check(os.Environ(), known); err != nil {
		return nil, d.Errf("%v", err)
	}
	if err := deploy.CheckListenPorts(d.File(), os.LookupEnv); err != nil {
		return nil, d.Errf("%v", err)
	}
	file, line := d.File(), d.Line()
	args := d.RemainingArgs()
	if len(args) > 0 {
		d.DeleteN(len(args))
	}
	for _, a := range caddyblock.SplitList(args) {
		u, err := upstream.Parse(a)
		if err != nil {
			return nil, d.Errf("upstream %q: %v", a, err)
		}
		rd.upstreams = append(rd.upstreams, u)
	}
	b := rd.block()
	seen := map[string]bool{}
	for d.NextBlock(0) {
		if d.Nesting() != 1 {
			continue
		}
		name := d.Val()
		if envDrivenProxyOptions[name] && !d.NextArg() {
			// Given without a value (an unset environment variable): keep
			// ramjet's default instead of failing in reverse_proxy.
			d.DeleteN(1)
			continue
		} else if envDrivenProxyOptions[name] {
			d.Prev()
		}
		switch name {
		case "to", "lb_policy", "dynamic":
			return nil, d.Errf("ramjet sets %s itself; to write the proxy out, use reverse_proxy { lb_policy ramjet }", name)
		}
		if !b.Known(rd, name) {
			continue // reverse_proxy syntax
		}
		if seen[name] {
			return nil, d.Errf("ramjet: %s specified more than once", name)
		}
		seen[name] = true
		// Read the option's line, then delete it: what is left of the
		// block is reverse_proxy's.
		toks := []caddyfile.Token{d.Token()}
		for d.NextArg() {
			toks = append(toks, d.Token())
		}
		d.DeleteN(len(toks))
		line := caddyfile.NewDispenser(toks)
		line.Next()
		if err := b.Read(line, rd); err != nil {
			return nil, err
		}
	}
	if len(rd.upstreams) == 0 {
		// Cite the directive's line, not the block's closing brace.
		return nil, fmt.Errorf("%s:%d - Error during parsing: ramjet needs at least one upstream (set RJ_UPSTREAM)", file, line)
	}
	ranks, err := upstream.PerEngine("dp_ranks", "value", rd.DPRanks, len(rd.upstreams), "1")
	if err != nil {
		return nil, d.Errf("%v", err)
	}
	for _, v := range ranks {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxDPRanks {
			return nil, d.Errf("dp_ranks: %q must be an integer from 1 to %d", v, MaxDPRanks)
		}
		rd.ranks = append(rd.ranks, n)
	}
	if rd.profiles, err = upstream.PerEngine("profiles", "profile", rd.Profiles, len(rd.upstreams), "standard"); err != nil {
		return nil, d.Errf("%v", err)
	}
	for _, p := range rd.profiles {
		if p != "standard" && p != "speculative" {
			return nil, d.Errf("profiles: %q must be standard or speculative", p)
		}
	}
	return rd, nil
}

// block reads the directive's options: its fields, the routing knobs
// (an explicit zero kept), and the precise path's, integrity's and
// snapshots' options into their parts.
func (rd *ramjetDirective) block() *caddyblock.Block {
	b := &caddyblock.Block{Name: "ramjet", Line: true,
		Custom: map[string]func(*caddyfile.Dispenser) error{},
		Zero:   func(path string) bool { return selection.KnobNamed(path) != 0 || path == "spec_decode_position" },
		Set:    func(path string) { rd.Explicit |= selection.KnobNamed(path) },
		Check: map[string]func(string) (string, error){"model_check": catalog.ParseModelCheck, "mode": integrity.ParseSpecMode,
			"foreign_prefill": fleetstate.ParseForeign},
		Words: fleetstate.PolicyWords(map[string]map[string]any{"write_timeout": {"off": -1}, "spec_decode": {"off": ""},
			"spec_decode_position": {"overall": nil}}),
	}
	for name := range kvDirectiveOptions {
		b.Custom[name] = func(d *caddyfile.Dispenser) error { return rd.kv.read(b, d, name) }
	}
	for name, field := range integrityDirectiveOptions {
		b.Custom[name] = func(d *caddyfile.Dispenser) error { return rd.integ.read(b, d, name, field) }
	}
	for name := range snapshotDirectiveOptions {
		b.Custom[name] = func(d *caddyfile.Dispenser) error {
			return b.Option(d, name, &rd.snap.c, strings.TrimPrefix(name, "snapshot_"))
		}
	}
	return b
}

// dials is the reverse_proxy upstream list: each engine once per
// data-parallel rank, in order.
func (rd *ramjetDirective) dials() []string { return upstream.Dials(rd.upstreams, rd.ranks) }

// baseURLs is each engine once, as the handlers that call engines
// themselves (/v1/models) need it.
func (rd *ramjetDirective) baseURLs() []string { return upstream.BaseURLs(rd.upstreams) }

// tune sets the upstreams, the ramjet policy and the defaults of a
// production LLM proxy on rp, wherever the block did not set them.
func (rd *ramjetDirective) tune(rp *reverseproxy.Handler, h httpcaddyfile.Helper) error {
	for _, dial := range rd.dials() {
		rp.Upstreams = append(rp.Upstreams, &reverseproxy.Upstream{Dial: dial})
	}
	policy, err := rd.policy()
	if err != nil {
		return err
	}
	if rp.LoadBalancing == nil {
		rp.LoadBalancing = new(reverseproxy.LoadBalancing)
	}
	lb := rp.LoadBalancing
	lb.SelectionPolicyRaw = caddyconfig.JSONModuleObject(policy, "policy", "ramjet", nil)
	if lb.Retries == 0 && lb.TryDuration == 0 {
		lb.Retries = DefaultRetries
	}
	if lb.RetryMatchRaw == nil {
		// Retry every request, POST included, when the engine gave no
		// response at all (a connection it closed as the request went out,
		// a dial failure) or answered 5xx: nothing of the response has
		// reached the client then (Caddy decides before writing it), the
		// policy replays the body it kept and sends the retry to a replica
		// the request has not tried. An LLM request may run again.
		lb.RetryMatchRaw = caddyhttp.RawMatcherSets{
			{"path": h.JSON(caddyhttp.MatchPath{"*"})},
			{"expression": h.JSON(RetryStatusExpression)},
		}
	}

	if rp.HealthChecks == nil {
		rp.HealthChecks = new(reverseproxy.HealthChecks)
	}
	hc := rp.HealthChecks
	if hc.Active == nil {
		hc.Active = new(reverseproxy.ActiveHealthChecks)
	}
	a := hc.Active
	//lint:ignore SA1019 a block setting the deprecated health_path keeps it.
	if a.URI == "" && a.Path == "" {
		a.URI = DefaultHealthURI
	}
	if a.Interval == 0 {
		a.Interval = caddy.Duration(DefaultHealthInterval)
	}
	if a.Timeout == 0 {
		a.Timeout = caddy.Duration(DefaultHealthTimeout)
	}
	if a.ExpectStatus == 0 {
		a.ExpectStatus = 200
	}
	if a.MaxSize == 0 {
		a.MaxSize = catalog.MaxBody
	}
	if rd.Token != "" && a.Headers.Get("Authorization") == "" {
		if a.Headers == nil {
			a.Headers = make(map[string][]string)
		}
		a.Headers.Set("Authorization", "Bearer "+rd.Token)
	}
	if hc.Passive == nil {
		hc.Passive = new(reverseproxy.PassiveHealthChecks)
	}
	p := hc.Passive
	if p.FailDuration == 0 {
		p.FailDuration = caddy.Duration(DefaultFailDuration)
	}
	if p.MaxFails == 0 {
		p.MaxFails = DefaultMaxFails
	}

	if rp.FlushInterval == 0 {
		rp.FlushInterval = -1 // SSE: every token as it comes
	}

	return rd.tuneTransport(rp, h)
}

// tuneTransport gives the HTTP transport ramjet's defaults wherever the
// block's own `transport http { }` (if any) leaves them unset.
func (rd *ramjetDirective) tuneTransport(rp *reverseproxy.Handler, h httpcaddyfile.Helper) error {
	t := new(reverseproxy.HTTPTransport)
	if rp.TransportRaw != nil {
		var probe struct {
			Protocol string `json:"protocol"`
		}
		if err := json.Unmarshal(rp.TransportRaw, &probe); err != nil {
			return h.Errf("ramjet: reading the transport block: %v", err)
		}
		if probe.Protocol != "http" {
			return nil // another transport (fastcgi...): the operator's own
		}
		if err := json.Unmarshal(rp.TransportRaw, t); err != nil {
			return h.Errf("ramjet: reading the transport block: %v", err)
		}
		if upstream.UsesTLS(rd.upstreams) && t.TLS == nil {
			return h.Err("ramjet: with https:// upstreams and a transport block, enable tls in the transport block")
		}
	} else if upstream.UsesTLS(rd.upstreams) {
		t.TLS = new(reverseproxy.TLSConfig)
	}
	if t.DialTimeout == 0 {
		t.DialTimeout = caddy.Duration(DefaultDialTimeout)
	}
	// No response header timeout is set: a long prefill may take minutes
	// before the first byte. The read timeout bounds every silence of the
	// engine instead (engine_timeout).
	if t.ReadTimeout == 0 {
		t.ReadTimeout = caddy.Duration(DefaultEngineTimeout)
		if rd.EngineTimeout > 0 {
			t.ReadTimeout = rd.EngineTimeout
		}
	}
	if t.Compression == nil {
		off := false
		t.Compression = &off // SSE must not wait on a gzip buffer
	}
	if t.KeepAlive == nil {
		t.KeepAlive = new(reverseproxy.KeepAlive)
	}
	if t.KeepAlive.Enabled == nil {
		on := true
		t.KeepAlive.Enabled = &on
	}
	if t.KeepAlive.MaxIdleConnsPerHost == 0 {
		t.KeepAlive.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if t.KeepAlive.IdleConnTimeout == 0 {
		t.KeepAlive.IdleConnTimeout = caddy.Duration(DefaultIdleConnTimeout)
	}
	if len(t.Versions) == 0 && t.TLS == nil {
		t.Versions = []string{"1.1"}
	}
	rp.TransportRaw = caddyconfig.JSONModuleObject(t, "protocol", "http", nil)
	return nil
}

// policy is the lb_policy ramjet configuration: the routing knobs, the
// route-id secret, the body bound and one engine profile per speculative
// engine.
func (rd *ramjetDirective) policy() (*module.RamjetSelection, error) {
	p := &module.RamjetSelection{PolicySettings: fleetstate.PolicySettings{Config: rd.Config, RouteIDSecret: rd.Secret,
		InstanceID: rd.InstanceID, DepartAfter: duration.Duration(rd.DepartAfter),
		SpillBand: rd.SpillBand, ForeignPrefill: rd.ForeignPrefill,
		IndexShare: rd.IndexShare, QueueExtra: rd.QueueExtra, FixedDensity: rd.FixedDensity}}
	if rd.MaxBodySize > 0 {
		// The policy fingerprints every body the guard accepts.
		p.MaxBodyBytes = rd.MaxBodySize
	}
	// The precise path (module/kv.go, kvindex.Settings).
	dials, schemes := make([]string, len(rd.upstreams)), make([]string, len(rd.upstreams))
	for i, u := range rd.upstreams {
		dials[i], schemes[i] = u.Dial, u.Scheme
	}
	kv, err := rd.kv.config(dials, schemes, rd.ranks)
	if err != nil {
		return nil, err
	}
	p.KV = kv
	if (rd.ForeignPrefill == "on" || rd.ForeignPrefill == "queues") && kv == nil {
		return nil, fmt.Errorf("foreign_prefill %s needs kv_events or kv_bind (it reads the engines' KV events)", rd.ForeignPrefill)
	}
	p.Integrity = rd.integ.config(rd.Token, rd.upstreams[0].Scheme)
	p.Snapshot = rd.snap.config()
	if rd.SessionShadow != "" {
		p.SessionShadow = &integrity.ShadowSettings{Header: rd.SessionShadow}
	}
	for i, u := range rd.upstreams {
		if rd.profiles[i] == "speculative" {
			if p.Profiles == nil {
				p.Profiles = map[string]string{}
			}
			p.Profiles[u.Dial] = "speculative"
		}
	}
	return p, nil
}

// kvDirectiveOptions are the precise path's options of the ramjet
// directive, each one line so that an environment variable can carry it:
//
//	kv_events    <upstream>=<tcp://events> ...   dial each engine's PUB socket
//	kv_replay    <upstream>=<tcp://replay> ...   each engine's replay ROUTER socket
//	kv_bind      <tcp://addr>                    or bind one SUB for every engine
//	kv_topics    <upstream>=<topic> ...          each engine's topic (required with
//	                                             kv_bind for more than one engine)
//	kv_topic     <topic>                         the topic of every engine otherwise
//	kv_block_size <tokens>                       the engines' KV block size
//	tokenize_timeout <duration>                  the /tokenize preflight's timeout
//	tokenize_wait auto|always|warm               when a request waits for it (default auto: the wait rule)
//	kv_queue_estimate <x>|off                    the queue rule (default 1; kvindex.Settings.QueueEstimate)
//	kv_cap_load <x>|off                          the estimate cap's load gate (default 3; off: the cap everywhere; kvindex.Settings.CapLoad)
//	kv_cap_foreign_queue <x>|off                 foreign exact overlaps capped past x caches of queue (default 4; kvindex.Settings.CapForeignQueue)
//
// Lists are space- or comma-separated; an empty value (an unset
// environment variable) keeps the default, and without kv_events or
// kv_bind the precise path stays off. dp_ranks and the upstream's scheme
// apply to the feeds too.
var kvDirectiveOptions = map[string]bool{"kv_events": true, "kv_replay": true, "kv_bind": true,
	"kv_topics": true, "kv_topic": true, "kv_block_size": true, "tokenize_timeout": true, "tokenize_wait": true,
	"kv_queue_estimate": true, "kv_cap_load": true, "kv_cap_foreign_queue": true}

// kvDirective is the parsed precise-path options of the ramjet directive.
type kvDirective struct {
	feeds           kvindex.FeedOptions
	BlockSize       int               `json:"kv_block_size"`
	TokenizeTimeout duration.Duration `json:"tokenize_timeout"`
	TokenizeWait    string            `json:"tokenize_wait"`
	QueueEstimate   float64           `json:"kv_queue_estimate"`
	CapLoad         float64           `json:"kv_cap_load"`
	CapForeign      float64           `json:"kv_cap_foreign_queue"`
}

// read reads option name of kvDirectiveOptions at d.
func (k *kvDirective) read(b *caddyblock.Block, d *caddyfile.Dispenser, name string) error {
	if name == "kv_block_size" || name == "tokenize_timeout" || name == "tokenize_wait" || name == "kv_queue_estimate" || name == "kv_cap_load" || name == "kv_cap_foreign_queue" {
		return b.Option(d, name, k, name)
	}
	args := caddyblock.SplitList(d.RemainingArgs())
	if _, err := k.feeds.Set(name, args); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// config returns the policy's kv settings for the upstreams (dial addresses,
// schemes and ranks in upstream order), or nil when the precise path is
// off.
func (k *kvDirective) config(dials, schemes []string, ranks []int) (*kvindex.Settings, error) {
	f := k.feeds
	if !f.On() {
		if len(f.Replay)+len(f.Topics) > 0 || k.BlockSize != 0 || k.TokenizeTimeout != 0 || k.TokenizeWait != "" || k.QueueEstimate != 0 || k.CapLoad != 0 || k.CapForeign != 0 || f.Topic != "" {
			return nil, fmt.Errorf("kv options need kv_events or kv_bind")
		}
		return nil, nil
	}
	engines, err := f.Feeds(dials, schemes, ranks)
	if err != nil {
		return nil, err
	}
	return &kvindex.Settings{Engines: engines, Topic: f.Topic, BlockSize: k.BlockSize, TokenizeTimeout: k.TokenizeTimeout,
		TokenizeWait: k.TokenizeWait, QueueEstimate: k.QueueEstimate, CapLoad: k.CapLoad, CapForeignQueue: k.CapForeign}, nil
}

// integrityDirectiveOptions are the ramjet directive's integrity options
// (deploy/Caddyfile drives them from RJ_* settings), each the field of
// IntegrityConfig (or of its SpecDecodeConfig: "spec_decode <field>") of
// that JSON name. A value left empty (an unset variable) keeps the
// default; integrity is on when a pin is given or spec_decode is observe
// or enforce.
var integrityDirectiveOptions = map[string]string{
	"integrity_model_sha256": "model_sha256", "integrity_template_sha256": "chat_template_sha256",
	"integrity_tokenizer_sha256": "tokenizer_sha256", "integrity_interval": "interval",
	"integrity_timeout": "timeout", "integrity_identity_path": "identity_path",
	"spec_decode": "spec_decode mode", "spec_decode_window": "spec_decode window",
	"spec_decode_windows": "spec_decode windows", "spec_decode_position": "spec_decode position",
	"integrity_state_file": "spec_decode state_file", "integrity_key": "spec_decode commitment_key",
}

// integrityDirective collects the ramjet directive's integrity options.
type integrityDirective struct {
	c  integrity.Settings
	sd integrity.SpecSettings
}

// read reads option name (field of integrityDirectiveOptions) at d.
func (k *integrityDirective) read(b *caddyblock.Block, d *caddyfile.Dispenser, name, field string) error {
	if f, ok := strings.CutPrefix(field, "spec_decode "); ok {
		return b.Option(d, name, &k.sd, f)
	}
	return b.Option(d, name, &k.c, field)
}

// config is the policy's integrity configuration, nil when off. token and
// scheme are the directive's upstream token and the engines' scheme.
func (k *integrityDirective) config(token, scheme string) *integrity.Settings {
	if !k.c.Pins.Any() && k.sd.Mode == "" {
		return nil
	}
	c := k.c
	c.Access = upstream.Access{UpstreamToken: token, Scheme: scheme}
	if k.sd.Mode != "" {
		sd := k.sd
		if sd.Mode != "enforce" {
			sd.StateFile, sd.CommitmentKey = "", ""
		}
		c.Spec = &sd
	}
	return &c
}

// snapshotDirectiveOptions are the ramjet directive's snapshot options,
// snapshot_<field> is snapshot.Settings' <field> (deploy/Caddyfile drives
// them from RJ_* settings); snapshots are on when
// snapshot_path is given. A value left empty keeps the default.
var snapshotDirectiveOptions = map[string]bool{
	"snapshot_path": true, "snapshot_interval": true, "snapshot_max_age": true, "snapshot_key": true,
}

// snapshotDirective collects the ramjet directive's snapshot options.
type snapshotDirective struct {
	c snapshot.Settings
}

// config is the policy's snapshot configuration, nil when off.
func (k *snapshotDirective) config() *snapshot.Settings {
	if k.c.Path == "" {
		return nil
	}
	c := k.c
	return &c
}

// deployEnvNames are the settings of the production configuration, read
// from the embedded deploy/Caddyfile so that the list cannot drift from it.
var deployEnvNames = envcheck.Names(deploy.Caddyfile)
