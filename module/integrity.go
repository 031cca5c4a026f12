package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/selection"
)

// IntegrityConfig turns on engine integrity for the ramjet policy (package
// integrity), off by default: compatibility admission against SHA-256 pins
// read from each engine's identity contract (docs/identity.md), and the
// speculative-decoding acceptance-collapse quarantine. A replica that
// integrity holds out is never offered to selection nor to the fallback
// policy (fail closed, per replica: when every replica is out the request
// gets 503). Checks start when the policy first sees its upstream pool (its
// first request) and when /health names the replica; until a replica's
// first identity answer it is out with reason "pending".
type IntegrityConfig struct {
	// ModelSHA256 pins the weights: the SHA-256 of the weights' manifest
	// (docs/identity.md), 64 lowercase hex digits. Default: not pinned.
	ModelSHA256 string `json:"model_sha256,omitempty"`
	// TemplateSHA256 pins the chat template (SHA-256 of its UTF-8 text).
	// Default: not pinned.
	TemplateSHA256 string `json:"chat_template_sha256,omitempty"`
	// TokenizerSHA256 pins the tokenizer (SHA-256 of tokenizer.json).
	// Default: not pinned.
	TokenizerSHA256 string `json:"tokenizer_sha256,omitempty"`
	// IdentityPath is the contract's path on every engine. Default
	// "/ramjet/identity".
	IdentityPath string `json:"identity_path,omitempty"`
	// Interval is the time between two identity checks of a replica.
	// Default 10s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Timeout bounds one identity fetch or metrics scrape. Default 2s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Scheme is how the engines are reached for the checks: "http" or
	// "https". Default "http".
	Scheme string `json:"scheme,omitempty"`
	// UpstreamToken is sent with every check ("Authorization: Bearer
	// <token>"); placeholders such as {env.RJ_UPSTREAM_TOKEN} are
	// resolved. Default: none.
	UpstreamToken string `json:"upstream_token,omitempty"`
	// SpecDecode turns on the acceptance-collapse quarantine; nil: off.
	SpecDecode *SpecDecodeConfig `json:"spec_decode,omitempty"`
}

// SpecDecodeConfig configures the speculative-decoding acceptance-collapse
// quarantine: each engine's vllm:spec_decode_* counters are scraped once per
// window; N consecutive complete windows with draft tokens but no accepted
// token (overall, or at Position) make a collapse.
type SpecDecodeConfig struct {
	// Mode is "observe" (report the collapse: metrics, /health,
	// /ramjet/fleet, a log line; keep routing) or "enforce" (commit the
	// engine instance to StateFile, then hold the replica out until a
	// different attested instance answers at that address). Default
	// "observe".
	Mode string `json:"mode,omitempty"`
	// Window is the length of one window (one scrape per window).
	// Default 10s.
	Window caddy.Duration `json:"window,omitempty"`
	// Windows is N. Default 3.
	Windows int `json:"windows,omitempty"`
	// Position watches the acceptance at this draft position (0-based,
	// vllm:spec_decode_num_accepted_tokens_per_pos_total) instead of the
	// overall acceptance. Default: overall.
	Position *int `json:"position,omitempty"`
	// MetricsPath is the engines' metrics path. Default "/metrics".
	MetricsPath string `json:"metrics_path,omitempty"`
	// StateFile is where enforce mode keeps its commitments (keyed hashes
	// of engine identities: no address, no prompt). Required for
	// enforce.
	StateFile string `json:"state_file,omitempty"`
	// CommitmentKey keys the commitments and seals the state file, at
	// least 16 bytes; use a placeholder such as {env.RJ_INTEGRITY_KEY}.
	// Required for enforce; it must stay the same across restarts.
	CommitmentKey string `json:"commitment_key,omitempty"`
}

func (c *IntegrityConfig) setDefaults() {
	if c.IdentityPath == "" {
		c.IdentityPath = integrity.DefaultIdentityPath
	}
	if c.Interval == 0 {
		c.Interval = caddy.Duration(10 * time.Second)
	}
	if c.Timeout == 0 {
		c.Timeout = caddy.Duration(2 * time.Second)
	}
	if c.Scheme == "" {
		c.Scheme = "http"
	}
	if sd := c.SpecDecode; sd != nil {
		if sd.Mode == "" {
			sd.Mode = "observe"
		}
		if sd.Window == 0 {
			sd.Window = caddy.Duration(10 * time.Second)
		}
		if sd.Windows == 0 {
			sd.Windows = 3
		}
		if sd.MetricsPath == "" {
			sd.MetricsPath = "/metrics"
		}
	}
}

// validate names the bad setting.
func (c *IntegrityConfig) validate() error {
	if err := c.pins().Validate(); err != nil {
		return fmt.Errorf("integrity: %w", err)
	}
	switch {
	case c.Interval < 0:
		return errors.New("integrity interval must be positive")
	case c.Timeout < 0:
		return errors.New("integrity timeout must be positive")
	case c.Scheme != "http" && c.Scheme != "https":
		return fmt.Errorf("integrity scheme must be http or https, got %q", c.Scheme)
	case c.IdentityPath[0] != '/':
		return fmt.Errorf("integrity identity_path must start with '/', got %q", c.IdentityPath)
	}
	sd := c.SpecDecode
	if sd == nil {
		if !c.pins().Any() {
			return errors.New("integrity: set at least one pin or spec_decode")
		}
		return nil
	}
	switch {
	case sd.Mode != "observe" && sd.Mode != "enforce":
		return fmt.Errorf("integrity spec_decode mode must be observe or enforce, got %q", sd.Mode)
	case sd.Window < 0:
		return errors.New("integrity spec_decode window must be positive")
	case sd.Windows < 0:
		return errors.New("integrity spec_decode windows must be positive")
	case sd.Position != nil && (*sd.Position < 0 || *sd.Position >= integrity.MaxPositions):
		return fmt.Errorf("integrity spec_decode position must be in [0,%d), got %d", integrity.MaxPositions, *sd.Position)
	case sd.MetricsPath[0] != '/':
		return fmt.Errorf("integrity spec_decode metrics_path must start with '/', got %q", sd.MetricsPath)
	}
	if sd.Mode == "enforce" {
		if sd.StateFile == "" {
			return errors.New("integrity spec_decode enforce needs state_file")
		}
		if len(resolveSecret(sd.CommitmentKey)) < integrity.MinKeyBytes {
			return fmt.Errorf("integrity spec_decode enforce needs a commitment_key of at least %d bytes", integrity.MinKeyBytes)
		}
	}
	return nil
}

func (c *IntegrityConfig) pins() integrity.Pins {
	return integrity.Pins{ModelSHA256: c.ModelSHA256, TemplateSHA256: c.TemplateSHA256, TokenizerSHA256: c.TokenizerSHA256}
}

// unmarshalCaddyfile parses the integrity block of the policy:
//
//	integrity {
//		model_sha256         <hex>
//		chat_template_sha256 <hex>
//		tokenizer_sha256     <hex>
//		identity_path        <path>
//		interval             <duration>
//		timeout              <duration>
//		scheme               http|https
//		upstream_token       <token>
//		spec_decode          observe|enforce {
//			window         <duration>
//			windows        <n>
//			position       <n>|overall
//			metrics_path   <path>
//			state_file     <path>
//			commitment_key <key>
//		}
//	}
func (c *IntegrityConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("integrity %s: option specified more than once", opt)
		}
		seen[opt] = true
		if opt == "spec_decode" {
			c.SpecDecode = new(SpecDecodeConfig)
			if err := c.SpecDecode.unmarshalCaddyfile(d); err != nil {
				return err
			}
			continue
		}
		v, err := oneArg(d, "integrity "+opt)
		if err != nil {
			return err
		}
		switch opt {
		case "model_sha256":
			c.ModelSHA256 = v
		case "chat_template_sha256":
			c.TemplateSHA256 = v
		case "tokenizer_sha256":
			c.TokenizerSHA256 = v
		case "identity_path":
			c.IdentityPath = v
		case "scheme":
			c.Scheme = v
		case "upstream_token":
			c.UpstreamToken = v
		case "interval", "timeout":
			dur, err := positiveDuration(d, "integrity "+opt, v)
			if err != nil {
				return err
			}
			if opt == "interval" {
				c.Interval = dur
			} else {
				c.Timeout = dur
			}
		default:
			return d.Errf("unrecognized integrity option '%s'", opt)
		}
	}
	return nil
}

func (sd *SpecDecodeConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		sd.Mode = d.Val()
		if sd.Mode != "observe" && sd.Mode != "enforce" {
			return d.Errf("integrity spec_decode: want observe or enforce, got %q", sd.Mode)
		}
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("integrity spec_decode %s: option specified more than once", opt)
		}
		seen[opt] = true
		v, err := oneArg(d, "integrity spec_decode "+opt)
		if err != nil {
			return err
		}
		switch opt {
		case "window":
			if sd.Window, err = positiveDuration(d, "integrity spec_decode window", v); err != nil {
				return err
			}
		case "windows":
			n, err := parsePositive(v)
			if err != nil {
				return d.Errf("integrity spec_decode windows: %v", err)
			}
			sd.Windows = n
		case "position":
			if v == "overall" {
				sd.Position = nil
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n >= integrity.MaxPositions {
				return d.Errf("integrity spec_decode position: want overall or 0-%d, got %q", integrity.MaxPositions-1, v)
			}
			sd.Position = &n
		case "metrics_path":
			sd.MetricsPath = v
		case "state_file":
			sd.StateFile = v
		case "commitment_key":
			sd.CommitmentKey = v
		default:
			return d.Errf("unrecognized integrity spec_decode option '%s'", opt)
		}
	}
	return nil
}

// integStates holds the integrity state across config reloads, keyed by
// the fleet and the integrity configuration.
var integStates = caddy.NewUsagePool()

// integStores shares one integrity.Store per state file path among the
// states using it (a reload provisions the new config before the old one
// is cleaned up: two writers of one file would drop each other's
// commitments).
var integStores = caddy.NewUsagePool()

type storeRef struct {
	s   *integrity.Store
	key string
}

func (storeRef) Destruct() error { return nil }

// integState is one fleet's integrity service: the monitor, and the
// per-slot verdict the request path reads without a lock.
type integState struct {
	key      string
	storeKey string // integStores key, "" without a store
	mon      *integrity.Monitor
	f        *fleet
	scheme   string
	header   http.Header

	// out[slot]: integrity holds the replica out.
	out [selection.MaxReplicas]atomic.Bool

	mu    sync.Mutex
	known map[string]bool // replica keys added to the monitor
}

// Destruct stops the monitor: the last policy using it was cleaned up.
func (g *integState) Destruct() error {
	integLive.CompareAndDelete(g.f, g)
	err := g.mon.Close()
	if g.storeKey != "" {
		if _, derr := integStores.Delete(g.storeKey); derr != nil && err == nil {
			err = derr
		}
	}
	return err
}

// integLive maps each live fleet to its integrity state, for /health,
// /ramjet/fleet and the metrics.
var integLive sync.Map // *fleet -> *integState

func integrityOf(f *fleet) *integState {
	if f == nil {
		return nil
	}
	v, ok := integLive.Load(f)
	if !ok {
		return nil
	}
	return v.(*integState)
}

// refresh publishes the monitor's verdicts to the per-slot flags.
func (g *integState) refresh() {
	for _, st := range g.mon.Statuses() {
		if s, ok := g.f.Base().Lookup(st.Key); ok && int(s) < len(g.out) {
			g.out[s].Store(st.Out)
		}
	}
}

// track starts checking the replica key (dial address, data-parallel
// rank or -1) unless it is checked already.
func (g *integState) track(key, dial string, rank int) {
	g.mu.Lock()
	added := !g.known[key]
	g.known[key] = true
	g.mu.Unlock()
	if added {
		g.mon.Add(integrity.Target{Key: key, BaseURL: g.scheme + "://" + dial, Rank: rank, Header: g.header})
	}
	// Also for a replica /health named before the policy registered its
	// slot: the flag is set before the slot is first routed.
	if s, ok := g.f.Base().Lookup(key); ok && int(s) < len(g.out) {
		g.out[s].Store(g.mon.Out(key))
	}
}

func (s *RamjetSelection) provisionIntegrity(ctx caddy.Context) error {
	c := s.Integrity
	if c == nil {
		return nil
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return err
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(integCollectorOnce()); err != nil && !errors.As(err, &are) {
			return fmt.Errorf("integrity metrics: %w", err)
		}
	}
	b, _ := json.Marshal(c)
	key := fmt.Sprintf("ramjet-integrity/%s/%016x", s.poolKey, xxhash.Sum64(b))
	logger := s.logger.Named("integrity")
	f := s.fleet
	v, _, err := integStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		g := &integState{key: key, f: f, scheme: c.Scheme, known: map[string]bool{}}
		if tok := resolveSecret(c.UpstreamToken); tok != "" {
			g.header = http.Header{"Authorization": {"Bearer " + tok}}
		}
		timeout := time.Duration(c.Timeout)
		client := &http.Client{Timeout: 2 * timeout}
		cfg := integrity.Config{Pins: c.pins(), IdentityPath: c.IdentityPath, Interval: time.Duration(c.Interval),
			Timeout: timeout, Client: client, Logger: logger, OnChange: func() { g.refresh() }}
		if sd := c.SpecDecode; sd != nil {
			sc := &integrity.SpecConfig{Window: time.Duration(sd.Window),
				WindowConfig: integrity.WindowConfig{Windows: sd.Windows, Position: -1},
				Source:       &integrity.MetricsSource{Client: client, Path: sd.MetricsPath, Timeout: timeout}}
			if sd.Position != nil {
				sc.Position = *sd.Position
			}
			if sd.Mode == "enforce" {
				sc.Mode = integrity.ModeEnforce
				sc.Key = []byte(resolveSecret(sd.CommitmentKey))
				st, skey, err := acquireStore(sd.StateFile, sc.Key)
				if err != nil {
					return nil, err
				}
				sc.Store, g.storeKey = st, skey
				if st.Dirty() {
					logger.Warn("integrity state file had an unresolved dirty marker: its engine instances start fenced")
				}
			}
			cfg.Spec = sc
		}
		mon, err := integrity.NewMonitor(cfg)
		if err != nil {
			if g.storeKey != "" {
				_, _ = integStores.Delete(g.storeKey)
			}
			return nil, err
		}
		g.mon = mon
		// The checks outlive this config (a reload keeps them): they stop
		// in Destruct, not with the provisioning context.
		mon.Start(context.Background())
		return g, nil
	})
	if err != nil {
		return fmt.Errorf("integrity: %w", err)
	}
	s.integ, s.integKey = v.(*integState), key
	integLive.Store(f, s.integ)
	return nil
}

// acquireStore opens (or shares) the store of path.
func acquireStore(path string, key []byte) (*integrity.Store, string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, "", fmt.Errorf("state_file: %w", err)
	}
	pk := "ramjet-integrity-store/" + abs
	v, _, err := integStores.LoadOrNew(pk, func() (caddy.Destructor, error) {
		st, err := integrity.OpenStore(abs, key)
		if err != nil {
			return nil, err
		}
		return storeRef{s: st, key: string(key)}, nil
	})
	if err != nil {
		return nil, "", err
	}
	ref := v.(storeRef)
	if ref.key != string(key) {
		_, _ = integStores.Delete(pk)
		return nil, "", fmt.Errorf("state_file %s is in use under another commitment_key", abs)
	}
	return ref.s, pk, nil
}

func (s *RamjetSelection) cleanupIntegrity() error {
	if s.integ == nil {
		return nil
	}
	s.integ = nil
	_, err := integStates.Delete(s.integKey)
	return err
}

// bindIntegrity starts checking the replicas of a new pool view.
func (s *RamjetSelection) bindIntegrity(v *poolView) {
	if s.integ == nil {
		return
	}
	for i, key := range v.keys {
		if v.slots[i] >= 0 {
			s.integ.track(key, v.pool[i].Dial, v.ranks[i])
		}
	}
}

// integrityOut reports whether integrity holds the replica in slot out.
// Without integrity configured it is one nil check.
func (s *RamjetSelection) integrityOut(slot selection.Slot) bool {
	return s.integ != nil && slot >= 0 && int(slot) < selection.MaxReplicas && s.integ.out[slot].Load()
}

// integrityPool is pool (a sub-pool of v's) without the replicas integrity
// holds out; nil when none is left (fail closed). Without integrity it is
// pool itself.
func (s *RamjetSelection) integrityPool(pool reverseproxy.UpstreamPool, v *poolView) reverseproxy.UpstreamPool {
	if s.integ == nil {
		return pool
	}
	var sub reverseproxy.UpstreamPool
	for _, up := range pool {
		for j, vu := range v.pool {
			if vu == up {
				if !s.integrityOut(v.slots[j]) {
					sub = append(sub, up)
				}
				break
			}
		}
	}
	return sub
}

// integrityStatus returns the replica's integrity state, nil when the
// fleet runs without integrity. A replica /health names before the policy
// saw it is tracked from then on.
func integrityStatus(f *fleet, key string) *fleetstate.IntegrityReport {
	g := integrityOf(f)
	if g == nil {
		return nil
	}
	st, ok := g.mon.Status(key)
	if !ok {
		dial, rank := splitReplicaKey(key)
		g.track(key, dial, rank)
		st, _ = g.mon.Status(key)
	}
	return &fleetstate.IntegrityReport{Out: st.Out, Reason: string(st.Reason), Attested: st.Attested,
		Quarantined: st.Quarantined, Durable: st.Durable, Observed: st.Observed, Streak: st.Streak, Ratio: st.Ratio}
}

// splitReplicaKey inverts selection.ReplicaKey.
func splitReplicaKey(key string) (string, int) {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == '#' {
			if n, err := strconv.Atoi(key[i+1:]); err == nil {
				return key[:i], n
			}
			break
		}
	}
	return key, -1
}

// The integrity series (labels as every ramjet series: fleet, the opaque
// upstream id, and fixed sets).
var (
	descIntegOut = prometheus.NewDesc("ramjet_integrity_out",
		"1 when engine integrity holds the upstream out of routing (admission failed, or quarantined in enforce mode), else 0.", integReplicaLabels, nil)
	descIntegReason = prometheus.NewDesc("ramjet_integrity_reason",
		"1 for the upstream's current integrity reason (pending, unreachable, bad_status, malformed, partial, model_mismatch, template_mismatch, tokenizer_mismatch, spec_collapse, fenced); absent when none.", append(integReplicaLabels, "reason"), nil)
	descIntegChecks = prometheus.NewDesc("ramjet_integrity_checks_total",
		"Identity checks of the upstream, by result (ok: complete and matching every pin; failed).", append(integReplicaLabels, "result"), nil)
	descSpecQuarantined = prometheus.NewDesc("ramjet_spec_decode_quarantined",
		"1 when enforce mode quarantines the upstream for speculative acceptance collapse (or a fenced instance), else 0.", integReplicaLabels, nil)
	descSpecObserved = prometheus.NewDesc("ramjet_spec_decode_collapse_observed",
		"1 when observe mode sees the upstream's speculative acceptance collapsed, else 0.", integReplicaLabels, nil)
	descSpecStreak = prometheus.NewDesc("ramjet_spec_decode_zero_acceptance_windows",
		"Consecutive complete windows with draft tokens and no accepted token.", integReplicaLabels, nil)
	descSpecRatio = prometheus.NewDesc("ramjet_spec_decode_acceptance_ratio",
		"Accepted over draft tokens in the upstream's last complete window with drafts.", integReplicaLabels, nil)
	descShadowSessions = prometheus.NewDesc("ramjet_session_shadow_sessions",
		"Sessions the session-sticky shadow remembers (bounded by max_sessions).", integFleetLabels, nil)
	descIntegWrites = prometheus.NewDesc("ramjet_integrity_state_writes_total",
		"Durable writes of quarantine commitments to the state file, by result (ok, failed).", append(integFleetLabels, "result"), nil)
)

type integCollector struct{}

var integCollectorOnce = sync.OnceValue(func() *integCollector { return &integCollector{} })

func (*integCollector) Describe(ch chan<- *prometheus.Desc) {
	m := shadowMetrics()
	m.decisions.Describe(ch)
	m.overlap.Describe(ch)
	m.load.Describe(ch)
	ch <- descShadowSessions
	for _, d := range []*prometheus.Desc{descIntegOut, descIntegReason, descIntegChecks, descSpecQuarantined,
		descSpecObserved, descSpecStreak, descSpecRatio, descIntegWrites} {
		ch <- d
	}
}

func (*integCollector) Collect(ch chan<- prometheus.Metric) {
	m := shadowMetrics()
	m.decisions.Collect(ch)
	m.overlap.Collect(ch)
	m.load.Collect(ch)
	shadowLive.Range(func(k, v any) bool {
		ch <- prometheus.MustNewConstMetric(descShadowSessions, prometheus.GaugeValue, float64(v.(*shadowState).ss.Len()), k.(*fleet).StateKey)
		return true
	})
	integLive.Range(func(k, v any) bool {
		f, g := k.(*fleet), v.(*integState)
		_, spec := g.mon.Mode()
		if spec {
			ok, failed := g.mon.Writes()
			ch <- prometheus.MustNewConstMetric(descIntegWrites, prometheus.CounterValue, float64(ok), f.StateKey, "ok")
			ch <- prometheus.MustNewConstMetric(descIntegWrites, prometheus.CounterValue, float64(failed), f.StateKey, "failed")
		}
		for _, st := range g.mon.Statuses() {
			id := f.RouteID(st.Key)
			if id == "" {
				continue
			}
			lv := []string{f.StateKey, id}
			ch <- prometheus.MustNewConstMetric(descIntegOut, prometheus.GaugeValue, boolGauge(st.Out), lv...)
			if st.Reason != "" {
				ch <- prometheus.MustNewConstMetric(descIntegReason, prometheus.GaugeValue, 1, f.StateKey, id, string(st.Reason))
			}
			ch <- prometheus.MustNewConstMetric(descIntegChecks, prometheus.CounterValue, float64(st.ChecksOK), f.StateKey, id, "ok")
			ch <- prometheus.MustNewConstMetric(descIntegChecks, prometheus.CounterValue, float64(st.ChecksFailed), f.StateKey, id, "failed")
			if spec {
				ch <- prometheus.MustNewConstMetric(descSpecQuarantined, prometheus.GaugeValue, boolGauge(st.Quarantined), lv...)
				ch <- prometheus.MustNewConstMetric(descSpecObserved, prometheus.GaugeValue, boolGauge(st.Observed), lv...)
				ch <- prometheus.MustNewConstMetric(descSpecStreak, prometheus.GaugeValue, float64(st.Streak), lv...)
				if st.Ratio >= 0 {
					ch <- prometheus.MustNewConstMetric(descSpecRatio, prometheus.GaugeValue, st.Ratio, lv...)
				}
			}
		}
		return true
	})
}

var _ prometheus.Collector = (*integCollector)(nil)

// integrityDirectiveOptions are the ramjet directive's integrity options
// (deploy/Caddyfile drives them from RJ_* settings). A value left empty (an
// unset variable) keeps the default; integrity is on when a pin is given
// or spec_decode is observe or enforce.
var integrityDirectiveOptions = map[string]bool{
	"integrity_model_sha256": true, "integrity_template_sha256": true, "integrity_tokenizer_sha256": true,
	"integrity_interval": true, "integrity_timeout": true, "integrity_identity_path": true,
	"spec_decode": true, "spec_decode_window": true, "spec_decode_windows": true, "spec_decode_position": true,
	"integrity_state_file": true, "integrity_key": true,
}

// integrityDirective collects the ramjet directive's integrity options.
type integrityDirective struct {
	vals map[string]string
}

func (k *integrityDirective) parse(d *caddyfile.Dispenser, name string, args []string) error {
	switch len(args) {
	case 0:
		return nil
	case 1:
	default:
		return d.Errf("%s: want one value", name)
	}
	v := args[0]
	var err error
	switch name {
	case "integrity_interval", "integrity_timeout", "spec_decode_window":
		var dur time.Duration
		if dur, err = caddy.ParseDuration(v); err == nil && dur <= 0 {
			err = errors.New("must be positive")
		}
	case "spec_decode_windows":
		_, err = parsePositive(v)
	case "spec_decode_position":
		if v != "overall" {
			var n int
			if n, err = strconv.Atoi(v); err == nil && (n < 0 || n >= integrity.MaxPositions) {
				err = fmt.Errorf("want overall or 0-%d", integrity.MaxPositions-1)
			}
		}
	case "spec_decode":
		if v != "off" && v != "observe" && v != "enforce" {
			err = errors.New("want off, observe or enforce")
		}
	}
	if err != nil {
		return d.Errf("%s %q: %v", name, v, err)
	}
	if k.vals == nil {
		k.vals = map[string]string{}
	}
	k.vals[name] = v
	return nil
}

// config is the policy's integrity configuration, nil when off. token and
// scheme are the directive's upstream token and the engines' scheme.
func (k *integrityDirective) config(token, scheme string) *IntegrityConfig {
	v := k.vals
	mode := v["spec_decode"]
	c := &IntegrityConfig{ModelSHA256: v["integrity_model_sha256"], TemplateSHA256: v["integrity_template_sha256"],
		TokenizerSHA256: v["integrity_tokenizer_sha256"], IdentityPath: v["integrity_identity_path"],
		UpstreamToken: token, Scheme: scheme}
	if !c.pins().Any() && (mode == "" || mode == "off") {
		return nil
	}
	for name, dst := range map[string]*caddy.Duration{"integrity_interval": &c.Interval, "integrity_timeout": &c.Timeout} {
		if s, ok := v[name]; ok {
			dur, _ := caddy.ParseDuration(s)
			*dst = caddy.Duration(dur)
		}
	}
	if mode == "observe" || mode == "enforce" {
		sd := &SpecDecodeConfig{Mode: mode}
		if s, ok := v["spec_decode_window"]; ok {
			dur, _ := caddy.ParseDuration(s)
			sd.Window = caddy.Duration(dur)
		}
		if s, ok := v["spec_decode_windows"]; ok {
			sd.Windows, _ = strconv.Atoi(s)
		}
		if s, ok := v["spec_decode_position"]; ok && s != "overall" {
			n, _ := strconv.Atoi(s)
			sd.Position = &n
		}
		if mode == "enforce" {
			sd.StateFile, sd.CommitmentKey = v["integrity_state_file"], v["integrity_key"]
		}
		c.SpecDecode = sd
	}
	return c
}

// SessionShadowConfig turns on session-affinity shadow telemetry: for
// requests carrying a session key in Header, ramjet records what a
// session-sticky policy (each session stays on the replica it was first
// placed on while that replica is usable) would have chosen next to its
// own choice: the agreement rate, and for disagreements the overlap and
// load of both choices. It never changes a decision. The session key is
// hashed and never kept; the table is bounded.
type SessionShadowConfig struct {
	// Header carries the session key. Default "X-Session-ID".
	Header string `json:"header,omitempty"`
	// MaxSessions bounds the sessions remembered (least recently seen
	// evicted). Default 65536.
	MaxSessions int `json:"max_sessions,omitempty"`
}

// unmarshalCaddyfile parses
//
//	session_shadow [<header>] {
//		max_sessions <n>
//	}
func (c *SessionShadowConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		c.Header = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "max_sessions":
			if c.MaxSessions != 0 {
				return d.Errf("session_shadow max_sessions: option specified more than once")
			}
			v, err := oneArg(d, "session_shadow max_sessions")
			if err != nil {
				return err
			}
			if c.MaxSessions, err = parsePositive(v); err != nil {
				return d.Errf("session_shadow max_sessions: %v", err)
			}
		default:
			return d.Errf("unrecognized session_shadow option '%s'", opt)
		}
	}
	return nil
}

// shadowState is one fleet's session shadow, kept across reloads.
type shadowState struct {
	ss     *integrity.SessionShadow
	header string
	f      *fleet
}

func (*shadowState) Destruct() error { return nil }

var (
	shadowStates = caddy.NewUsagePool()
	shadowLive   sync.Map // *fleet -> *shadowState
)

// The shadow series, created once (integCollector describes and collects
// them).
var shadowMetrics = sync.OnceValue(func() (m struct {
	decisions     *prometheus.CounterVec
	overlap, load *prometheus.HistogramVec
}) {
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ramjet", Name: "session_shadow_decisions_total",
		Help: "Requests with a session key, by how a session-sticky policy's choice compares with ramjet's (new, agree, disagree, sticky_unavailable)."},
		[]string{"fleet", "outcome"})
	m.overlap = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ramjet", Name: "session_shadow_overlap_tokens",
		Help:    "On a disagreement, the estimated prefix overlap of ramjet's and of the sticky policy's choice (choice: ramjet, sticky), in tokens.",
		Buckets: []float64{0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768}}, []string{"fleet", "choice"})
	m.load = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ramjet", Name: "session_shadow_load_tokens",
		Help:    "On a disagreement, the live load of ramjet's and of the sticky policy's choice (choice: ramjet, sticky), in tokens.",
		Buckets: prometheus.ExponentialBuckets(256, 4, 8)}, []string{"fleet", "choice"})
	return m
})

func (s *RamjetSelection) provisionShadow(ctx caddy.Context) error {
	c := s.SessionShadow
	if c == nil {
		return nil
	}
	if c.Header == "" {
		c.Header = "X-Session-ID"
	}
	if c.MaxSessions < 0 {
		return errors.New("session_shadow max_sessions must be positive")
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(integCollectorOnce()); err != nil && !errors.As(err, &are) {
			return fmt.Errorf("session shadow metrics: %w", err)
		}
	}
	key := fmt.Sprintf("ramjet-shadow/%s/%s/%d", s.poolKey, c.Header, c.MaxSessions)
	f := s.fleet
	v, _, err := shadowStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &shadowState{ss: integrity.NewSessionShadow(c.MaxSessions), header: http.CanonicalHeaderKey(c.Header), f: f}, nil
	})
	if err != nil {
		return err
	}
	s.shadow, s.shadowKey = v.(*shadowState), key
	shadowLive.Store(f, s.shadow)
	return nil
}

func (s *RamjetSelection) cleanupShadow() error {
	if s.shadow == nil {
		return nil
	}
	sh := s.shadow
	s.shadow = nil
	deleted, err := shadowStates.Delete(s.shadowKey)
	if deleted {
		shadowLive.CompareAndDelete(sh.f, sh)
	}
	return err
}

// observeShadow records the session-sticky policy's choice for a routed
// request (after the decision: it can change nothing). On a disagreement
// it scores the sticky replica with a read-only Pick.
func (s *RamjetSelection) observeShadow(r *http.Request, pool reverseproxy.UpstreamPool, v *poolView, feat *selection.Features, d selection.Decision) {
	sh := s.shadow
	if sh == nil || d.Index < 0 {
		return
	}
	vals := r.Header[sh.header]
	if len(vals) == 0 || vals[0] == "" {
		return
	}
	od := s.fleet.Detector()
	index := func(slot int) int {
		for i, sl := range v.slots {
			if int(sl) == slot {
				return i
			}
		}
		return -1
	}
	usable := func(slot int) bool {
		i := index(slot)
		return i >= 0 && pool[i].Available() && !s.integrityOut(v.slots[i]) && od.Usable(v.slots[i])
	}
	out, sticky := sh.ss.Record(xxhash.Sum64String(vals[0]), int(d.Slot), usable)
	m := shadowMetrics()
	fl := s.fleet.StateKey
	m.decisions.WithLabelValues(fl, out.String()).Inc()
	if out != integrity.ShadowDisagree {
		return
	}
	j := index(sticky)
	if j < 0 {
		return
	}
	cands := make([]selection.Candidate, len(pool))
	for i := range pool {
		cands[i] = selection.Candidate{Slot: v.slots[i], Usable: i == j, Profile: v.profiles[i]}
	}
	sc := selection.NewScratch(len(cands))
	s.rt.Pick(feat, cands, sc)
	m.overlap.WithLabelValues(fl, "ramjet").Observe(float64(d.Overlap))
	m.overlap.WithLabelValues(fl, "sticky").Observe(float64(sc.Overlap[j]))
	m.load.WithLabelValues(fl, "ramjet").Observe(d.Load)
	m.load.WithLabelValues(fl, "sticky").Observe(sc.Load[j])
}

// explainSession is the session part of an explanation of r (nil without
// a session shadow or a session header).
func explainSession(f *fleet, r *http.Request, decided string) *fleetstate.ExplainSession {
	v, ok := shadowLive.Load(f)
	if !ok {
		return nil
	}
	sh := v.(*shadowState)
	key := r.Header.Get(sh.header)
	if key == "" {
		return nil
	}
	es := &fleetstate.ExplainSession{Counts: map[string]uint64{}}
	c := sh.ss.Counts()
	for _, o := range integrity.ShadowOutcomes {
		es.Counts[o.String()] = c[o]
	}
	slot, known := sh.ss.Sticky(xxhash.Sum64String(key))
	es.Known = known
	if known {
		es.StickyUpstream = f.SlotID(selection.Slot(slot))
	}
	es.Agree = !known || es.StickyUpstream == decided
	return es
}

// The label sets of the integrity series, as the fleet series (package metrics).
var (
	integFleetLabels   = []string{"fleet"}
	integReplicaLabels = []string{"fleet", "upstream"}
)

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
