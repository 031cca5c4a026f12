package module

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/snapshot"
	"github.com/ramjet-llm/ramjet/upstream"
)

func init() {
	caddy.RegisterModule(RamjetSelection{})
}

// Response and request headers set by the policy.
const (
	// HeaderUpstream carries the opaque route id of the replica that served
	// the response: a keyed hash, never an address.
	HeaderUpstream = "X-Ramjet-Upstream"
	// HeaderRank tells a data-parallel engine (vLLM) which rank serves the
	// request, when the same dial address is listed several times.
	HeaderRank = "X-data-parallel-rank"
)

// DefaultMaxBodyBytes bounds how much of a request body ramjet reads to
// fingerprint it: 16 MiB.
const DefaultMaxBodyBytes = fleetstate.DefaultMaxBodyBytes

// RamjetSelection is the ramjet load-balancing policy: it sends each LLM
// request to the replica whose prefix cache most likely holds the start of
// its prompt, unless live load on that replica outweighs the warm cache:
//
//	score(r) = min(overlap(r), affinity_cap) - alpha * load(r)
//
// It reads the request body once (bounded, or takes what the ramjet_body
// matcher already read), reserves load on the chosen replica until the
// response ends, and tags the response with X-Ramjet-Upstream. Requests it
// cannot fingerprint (no JSON body, e.g. GET /v1/models) go to the fallback
// policy.
//
// Replicas are identified by their dial address; a dial address listed k
// times in the upstream pool is k data-parallel ranks (0..k-1) of one
// engine, each routed as its own replica with the X-data-parallel-rank
// request header.
type RamjetSelection struct {
	// The policy's JSON: the knobs, the fleet's name and secrets, the
	// optional parts (see fleetstate.PolicySettings).
	fleetstate.PolicySettings

	fallback   reverseproxy.Selector
	fleet      *fleet
	rt         *selection.Router // the fleet's state with this policy's knobs
	poolKey    string
	cleaned    bool // Cleanup ran (Caddy calls it once, never concurrently)
	x          selection.Extractor
	profiles   map[string]selection.Profile
	view       *atomic.Pointer[poolView] // set in Provision
	logger     *zap.Logger
	set        *metrics.Set // the process's metric set (processMetrics), held from Provision
	kv         *kvState     // precise index, when KV is set
	kvKey      string
	kvUnhook   func()       // removes kv's hook on the fleet's departures
	engines    *engineState // engine metrics scraper, when EngineMetrics is set
	enginesKey string
	integ      *integState // engine integrity, when Integrity is set (integrity.go)
	integKey   string
	shadow     *shadowState // session shadow, when SessionShadow is set (integrity.go)
	shadowKey  string
	snap       *snapshot.Writer // index snapshots, when Snapshot is set (snapshot.go)
	snapKey    string
}

// routeState is the part of a request's state that routing owns.
type routeState struct {
	// tokens are the request's token ids from the precise path's
	// preflight (kvPreflight.preflight), nil when it did not run or failed.
	tokens []uint32
	// res is the first attempt's reservation, kept in the request's state
	// so that Route allocates none.
	res selection.Reservation
	// kv ends the precise path's predictions with the request (kvrequest.go);
	// nil when the preflight did not run.
	kv *kvRequest
}

// CaddyModule returns the Caddy module information.
func (RamjetSelection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.ramjet",
		New: func() caddy.Module { return new(RamjetSelection) },
	}
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy ramjet {
//		affinity_cap       <tokens>
//		alpha              <number>
//		request_cost       <tokens>
//		block_tokens       <tokens>
//		prefix_tokens      <tokens>
//		chars_per_token    <number>
//		index_budget       <size>
//		long_output_tokens <tokens>
//		tie_epsilon        <number>
//		output_weight      <number>
//		max_body_bytes     <size>
//		profile            <upstream> speculative|standard
//		fallback           <policy> [{ <policy options> }]
//		state_key          <name>
//		route_id_secret    <secret>
//		instance_id        <id>
//		spill_band         <tokens>|off
//		index_share        <share>|off
//		queue_extra        <weight>|off
//		fixed_density      [true|false]
//		foreign_prefill    on|off|queues
//		engine_metrics     [<interval>] [{ path, timeout, scheme, upstream_token, stale_after, max_body_bytes, concurrency, agree, overflow, queue, queue_sat }]
//		outlier {
//			consecutive_failures <n>|off
//			base_ejection        <duration>
//			max_ejection         <duration>
//			max_ejected_percent  <percent>
//		}
//		integrity { <integrity.Settings' fields> }
//		session_shadow [<header>] { max_sessions <n> }
//		snapshot [<path>] { <snapshot.Settings' fields> }
//		depart_after       <duration>
//	}
//
// Each option is the JSON field of that name, read by its type (package
// caddyblock): sizes accept units (64MiB, 512KB), durations Caddy's syntax.
// Every option may appear once, except profile (once per upstream) and
// kv_events (once per engine).
func (s *RamjetSelection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	b := &caddyblock.Block{
		Name:   "ramjet",
		Custom: map[string]func(*caddyfile.Dispenser) error{"profile": s.parseProfileOption, "fallback": s.parseFallback},
		Repeat: map[string]bool{"profile": true, "kv_events": true},
		Zero: func(path string) bool {
			return selection.KnobNamed(path) != 0 || path == "integrity spec_decode position"
		},
		Set: func(path string) { s.Explicit |= selection.KnobNamed(path) },
		Check: map[string]func(string) (string, error){"scheme": upstream.ParseScheme, "mode": integrity.ParseSpecMode,
			"foreign_prefill": fleetstate.ParseForeign},
		Words: fleetstate.PolicyWords(map[string]map[string]any{
			"outlier consecutive_failures":   {"off": -1},
			"integrity spec_decode position": {"overall": nil},
		}),
	}
	s.kvOptions(b) // kv.go
	return b.Parse(d, s)
}

// parseProfileOption reads profile <upstream> speculative|standard.
func (s *RamjetSelection) parseProfileOption(d *caddyfile.Dispenser) error {
	var up, prof string
	if !d.Args(&up, &prof) || d.NextArg() {
		return d.Errf("profile: want <upstream> speculative|standard")
	}
	if _, ok := fleetstate.ParseProfile(prof); !ok {
		return d.Errf("profile %s: unknown engine profile %q (want speculative or standard)", up, prof)
	}
	if _, dup := s.Profiles[up]; dup {
		return d.Errf("profile %s: specified more than once", up)
	}
	if s.Profiles == nil {
		s.Profiles = make(map[string]string)
	}
	s.Profiles[up] = prof
	return nil
}

// parseFallback reads fallback <policy> [{ <policy options> }].
func (s *RamjetSelection) parseFallback(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("fallback: want a policy name")
	}
	name := d.Val()
	if name == "ramjet" {
		return d.Errf("fallback: ramjet cannot be its own fallback")
	}
	modID := "http.reverse_proxy.selection_policies." + name
	unm, err := caddyfile.UnmarshalModule(d, modID)
	if err != nil {
		return d.Errf("fallback: %v", err)
	}
	sel, ok := unm.(reverseproxy.Selector)
	if !ok {
		return d.Errf("fallback: module %s is not a selection policy", modID)
	}
	s.FallbackRaw = caddyconfig.JSONModuleObject(sel, "policy", name, nil)
	return nil
}

// Provision fills defaults, loads the fallback policy and takes (or
// creates) the shared fleet state.
func (s *RamjetSelection) Provision(ctx caddy.Context) error {
	if err := CheckRetiredEnv(); err != nil { // env.go: refuse MD_* settings
		return err
	}
	s.logger, s.set = ctx.Logger(), processMetrics()
	s.view = new(atomic.Pointer[poolView])
	s.SetDefaults()
	if err := s.Validate(); err != nil {
		return err
	}
	s.profiles = s.ProfileMap()
	if s.FallbackRaw == nil {
		s.FallbackRaw = caddyconfig.JSONModuleObject(reverseproxy.LeastConnSelection{}, "policy", "least_conn", nil)
	}
	mod, err := ctx.LoadModule(s, "FallbackRaw")
	if err != nil {
		return fmt.Errorf("loading fallback policy: %w", err)
	}
	s.fallback = mod.(reverseproxy.Selector)

	secret := caddy.NewReplacer().ReplaceAll(s.RouteIDSecret, "")
	f, rt, key, err := acquireFleet(s.StateKey, s.Config, []byte(secret))
	if err != nil {
		return fmt.Errorf("ramjet state %q: %w", s.StateKey, err)
	}
	// spill_band (default on with kv and engine_metrics): the rule
	// variants on the same state, as explain and the dashboard see them.
	if o := s.SpillOptions(); o != rt.Options() {
		if rt, err = f.TuneOptions(s.Config, o); err != nil {
			releaseFleet(key)
			return fmt.Errorf("ramjet state %q: %w", s.StateKey, err)
		}
	}
	s.fleet, s.rt, s.poolKey = f, rt, key
	rt.SetInstance(instanceID(s.InstanceID)) // env.go
	f.SetOutlier(s.OutlierConfig())
	s.x = rt.Extractor()
	parts := s.parts()
	for i, p := range parts {
		if err := p.provision(ctx); err != nil {
			_ = cleanupParts(parts[:i])
			s.fleet = nil
			releaseFleet(key)
			return err
		}
	}
	return nil
}

// part is one optional part of the policy, provisioned after the fleet is
// acquired and cleaned up before it is released.
type part struct {
	provision func(caddy.Context) error
	cleanup   func() error
}

// parts are the policy's optional parts in provisioning order: the
// precise path (kv.go), engine metrics (engines.go), integrity and the
// session shadow (integrity.go), index snapshots (snapshot.go) and the
// departure sweeper (churn.go).
func (s *RamjetSelection) parts() []part {
	return []part{
		{s.provisionKV, s.cleanupKV},
		{s.provisionEngines, s.cleanupEngines},
		{s.provisionIntegrity, s.cleanupIntegrity},
		{s.provisionShadow, s.cleanupShadow},
		{s.provisionSnapshot, s.cleanupSnapshot},
		{s.provisionChurn, func() error { s.cleanupChurn(); return nil }},
	}
}

// cleanupParts cleans up parts in reverse order (the departure sweeper
// stops first) and joins their errors.
func cleanupParts(parts []part) error {
	errs := make([]error, 0, len(parts))
	for i := len(parts) - 1; i >= 0; i-- {
		errs = append(errs, parts[i].cleanup())
	}
	return errors.Join(errs...)
}

// Cleanup drops the policy's reference on the shared state.
func (s *RamjetSelection) Cleanup() error {
	// The fleet stays set: requests of this config still in flight (a
	// retry's Select, a request read as the reload began) route and
	// release into it after Cleanup.
	if s.fleet == nil || s.cleaned {
		return nil
	}
	s.cleaned = true
	kerr := cleanupParts(s.parts())
	s.fleet.dropView(s)
	if err := releaseFleet(s.poolKey); err != nil {
		return err
	}
	return kerr
}

// scratch is the pooled working memory of one Select.
type scratch struct {
	sel   *selection.Scratch
	cands []selection.Candidate
}

var scratchPool = sync.Pool{New: func() any {
	return &scratch{sel: selection.NewScratch(16), cands: make([]selection.Candidate, 0, 16)}
}}

// Select picks the replica for r. Caddy calls it once per attempt; on a
// retry the reservation of the earlier attempt is released first.
func (s *RamjetSelection) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	if len(pool) == 0 {
		return nil
	}
	st := requestState(w, r)
	defer observeSelect(s.set, st, metrics.MonoNow()) // metrics.go: decision counts, selection latency
	st.attempts++
	if st.attempts > 1 {
		reportRetried(st, retriedStatus(r))
		st.retried() // kvrequest.go: the earlier attempt's predictions end
	}
	st.hold.Release()
	v := s.viewFor(pool)

	// Features: from the matcher's cache or from the body, read here.
	var feat *selection.Features
	var body *edge.Body
	ep := selection.EndpointUnknown
	if r.Method == http.MethodPost {
		ep = selection.EndpointForPath(r.URL.Path)
	}
	if ep != selection.EndpointUnknown {
		st.readBody(r, s.MaxBodyBytes)
		if b := st.acquireBody(); b != nil {
			body = b
			feat = st.features(s.x, ep)
			s.restoreBody(r, st)
		}
	}
	if feat == nil {
		if body != nil {
			body.Release()
		}
		return s.selectFallback(pool, r, w, st, v)
	}

	var storage *selection.Reservation
	if st.attempts == 1 {
		storage = &st.route.res // retries allocate: storage may still be read by a release
	}
	d, res := s.decide(pool, v, st, feat, storage, false)
	if res == nil && !v.Untracked {
		// Every replica is out. Those out only for recent failures
		// (Caddy's passive health: uncapped, so one fleet-wide blip takes
		// out every engine for fail_duration) still serve, as in Envoy's
		// panic mode; a dead one among them fails fast and is retried.
		if d, res = s.decide(pool, v, st, feat, storage, true); res != nil {
			d.Reason = selection.ReasonPanic
		}
	}
	if res == nil {
		body.Release()
		if v.Untracked {
			// Upstreams past selection.MaxReplicas cannot be scored: the
			// fallback policy may still find one of them.
			return s.selectFallback(pool, r, w, st, v)
		}
		st.decision = d // Reason none: no usable replica
		return nil
	}
	st.markTried(d.Slot)
	if s.shadow != nil { // off by default: no call (the decision is copied into it)
		s.observeShadow(r, pool, v, feat, d) // integrity.go: records only, after the decision
	}
	if st.observed && st.model == "" {
		// Only the handler's observers read the model name (the guard's model check may have interned it).
		st.model = modelNames.Intern(feat.Model)
	}
	body.Release()

	st.fallback = false
	st.decision = d
	s.tag(r, w, st, v, d.Index)
	picked(st, len(pool))
	st.hold.Set(res)
	st.learned = res
	if c := s.logger.Check(zapcore.DebugLevel, "ramjet pick"); c != nil {
		c.Write(zap.String("route_id", st.routeID()), zap.Stringer("reason", d.Reason),
			zap.Stringer("tie", d.Tie), zap.Int("overlap", d.Overlap),
			zap.Int("best_overlap", d.BestOverlap), zap.Float64("load", d.Load),
			zap.Int("usable", d.Usable), zap.Int32("attempt", st.attempts))
	}
	return pool[d.Index]
}

// decide routes over pool with pooled scratch memory: one
// selection.Router.Route call (with the precise path's annotator and the
// preflight's token ids when kv is on), reserving into res (nil:
// allocated). It allocates nothing when res is given (TestDecideAllocs).
// On a retry, replicas already tried for the request are filtered out
// unless no other is usable. In panicMode, a replica Caddy holds out is
// usable when it has recent failures (passive health) and is not full.
// The reservation is nil when no replica is usable.
func (s *RamjetSelection) decide(pool reverseproxy.UpstreamPool, v *poolView, st *reqState, feat *selection.Features, res *selection.Reservation, panicMode bool) (selection.Decision, *selection.Reservation) {
	sc := scratchPool.Get().(*scratch)
	var tried *selection.SlotSet
	if st.attempts > 1 {
		tried = st.triedSet()
	}
	avail := func(i int) bool { return pool[i].Available() } // the usual case: neither panic mode nor integrity
	if panicMode || s.integ != nil {
		avail = func(i int) bool {
			u := pool[i]
			return (u.Available() || panicMode && !u.Full() && u.Fails() > 0) && !s.integrityOut(v.Slots[i])
		}
	}
	cands := selection.AppendCandidates(sc.cands[:0], v.Slots, v.Profiles, avail, s.fleet.Detector(), tried)
	var a selection.Annotator
	if s.kv != nil {
		a = s.kv.p
		sc.sel.Tokens = st.route.tokens
	}
	fp := s.foreignFor() // foreign.go: the other instances' prefill
	if fp != nil {
		fp.Refresh(time.Now())
	}
	d, got := s.rt.Route(feat, cands, sc.sel, a, res)
	if fp != nil {
		n := len(sc.sel.Tokens)
		if k := st.route.kv; k != nil {
			n = k.late.PromptTokens(n, s.rt.Config().CharsPerToken)
		}
		fp.Reserved(got, n)
	}
	sc.sel.Tokens = nil
	sc.cands = cands
	scratchPool.Put(sc)
	return d, got
}

// selectFallback routes a request without usable features with the
// fallback policy, still reserving load on the replica it picks.
func (s *RamjetSelection) selectFallback(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter, st *reqState, v *poolView) *reverseproxy.Upstream {
	up := s.fallback.Select(s.integrityPool(admittedPool(pool, v, s.fleet.Detector()), v), r, w)
	if up == nil {
		return nil
	}
	idx := -1
	for i := range pool {
		if pool[i] == up {
			idx = i
			break
		}
	}
	st.fallback = true
	st.learned = nil
	st.decision = selection.Decision{Index: idx, Slot: -1}
	if idx < 0 || v.Slots[idx] < 0 {
		return up
	}
	st.decision.Slot = v.Slots[idx]
	s.tag(r, w, st, v, idx)
	picked(st, len(pool))
	st.hold.Set(s.rt.Reserve(v.Slots[idx], 0))
	st.learned = nil // a fallback pick predicted nothing to correct
	return up
}

// tag records the choice in st and sets the response's route id and the
// request's data-parallel rank header.
func (s *RamjetSelection) tag(r *http.Request, w http.ResponseWriter, st *reqState, v *poolView, i int) {
	st.fleet = s.fleet
	st.slot = v.Slots[i]
	st.routeIDHdr = v.IDHdr[i]
	if w != nil {
		w.Header()[HeaderUpstream] = v.IDHdr[i]
	}
	// On the first attempt r.Header is the map Caddy copies the request
	// headers from on every attempt when header operations are configured;
	// keep the rank current there too, so that a retry to another rank
	// carries its own. A first attempt without a rank has nothing to
	// remove: servers store keys canonical, and only ramjet writes this one.
	if vals := v.RankHdr[i]; vals != nil || st.attempts > 1 {
		edge.SetValues(r.Header, HeaderRank, vals)
	}
	if st.attempts == 1 {
		st.baseHeader = r.Header // the same map: set above
	} else {
		edge.SetValues(st.baseHeader, HeaderRank, v.RankHdr[i])
	}
}

// restoreBody makes sure the request Caddy forwards carries the whole body
// from its first byte: on the first attempt the matcher's untouched reader
// stays; otherwise (a retry, or the body was read here) r.Body becomes a
// fresh reader over the same bytes, so that a retry after a dial failure
// replays the body byte for byte.
func (s *RamjetSelection) restoreBody(r *http.Request, st *reqState) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	if br, ok := r.Body.(*edge.Reader); ok && br.Untouched() {
		return
	}
	orig := &st.ref.reader // the original request's reader when st.hasReader
	if st.attempts == 1 && st.hasReader && orig.Untouched() {
		// The body reaching Caddy's wrappers is still the matcher's reader,
		// unread: leave Caddy's chain (trailers, close handling) intact.
		return
	}
	if st.hasReader && orig.Untouched() {
		// Superseded: nobody will read it now.
		orig.Close()
	}
	r.Body = st.body.NewReader(nil)
}

// viewFor returns the cached view of pool, building it on a change.
func (s *RamjetSelection) viewFor(pool reverseproxy.UpstreamPool) *poolView {
	if v := s.view.Load(); v != nil && slices.Equal(pool, v.pool) {
		return v
	}
	v := &poolView{pool: append(reverseproxy.UpstreamPool(nil), pool...)}
	v.View = s.fleet.NewView(dialsOf(pool), s.profiles, func(err error) {
		if c := s.logger.Check(zapcore.WarnLevel, "replica not routed by ramjet"); c != nil {
			c.Write(zap.Error(err))
		}
	})
	s.bindKV(v)
	s.bindIntegrity(v)
	s.bindSnapshot(v) // snapshot.go: a snapshot read at start, applied once
	s.view.Store(v)
	s.fleet.setView(s, v)
	s.engines.retarget() // engines.go: scrape the new pool's engines
	return v
}

// dialsOf lists the pool's dial addresses, in order.
func dialsOf(pool reverseproxy.UpstreamPool) []string {
	dials := make([]string, len(pool))
	for i, up := range pool {
		dials[i] = up.Dial
	}
	return dials
}

// Interface guards.
var (
	_ reverseproxy.Selector = (*RamjetSelection)(nil)
	_ caddy.Provisioner     = (*RamjetSelection)(nil)
	_ caddy.Validator       = (*RamjetSelection)(nil)
	_ caddy.CleanerUpper    = (*RamjetSelection)(nil)
	_ caddyfile.Unmarshaler = (*RamjetSelection)(nil)
)
