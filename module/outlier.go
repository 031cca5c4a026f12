package module

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/ramjet-llm/ramjet/selection"
)

// OutlierSettings tune outlier detection: the outcome of every attempt
// (a 5xx answer, a connection failure, a stream cut before its end, a
// first-token timeout count against the replica; any other answer for it)
// feeds a per-replica detector shared by the fleet (selection.Outlier). An
// ejected replica is not offered to selection, so that a replica whose
// answers fail never wins on load.
type OutlierSettings struct {
	// ConsecutiveFailures ejects a replica after this many failed attempts
	// in a row. Default 5; -1 turns outlier detection off.
	ConsecutiveFailures int `json:"consecutive_failures,omitempty"`
	// ConsecutiveCuts ejects a replica after this many streams in a row
	// that it cut after they started (the client sees those: they cannot
	// be retried). Default 2 (at most consecutive_failures).
	ConsecutiveCuts int `json:"consecutive_cuts,omitempty"`
	// BaseEjection is how long the first ejection lasts; the n-th
	// ejection in a row lasts n times as long. After it, one request
	// probes the replica: success re-admits it, failure ejects it again.
	// Default 10s.
	BaseEjection caddy.Duration `json:"base_ejection,omitempty"`
	// MaxEjection caps an ejection. Default 5m.
	MaxEjection caddy.Duration `json:"max_ejection,omitempty"`
	// MaxEjectedPercent caps the share of the replicas ejected at once, in
	// percent; one replica may always be ejected. Default 50.
	MaxEjectedPercent int `json:"max_ejected_percent,omitempty"`
}

// config returns the detector settings (zero values: the defaults).
func (o OutlierSettings) config() selection.OutlierConfig {
	c := selection.OutlierConfig{
		ConsecutiveFailures: o.ConsecutiveFailures,
		ConsecutiveCuts:     o.ConsecutiveCuts,
		BaseEjection:        time.Duration(o.BaseEjection),
		MaxEjection:         time.Duration(o.MaxEjection),
		MaxEjectedPercent:   o.MaxEjectedPercent,
	}
	return c
}

// validate names the bad setting (selection.OutlierConfig.CheckSettings).
func (o OutlierSettings) validate() error { return o.config().CheckSettings() }

// unmarshalCaddyfile parses the outlier block of the policy:
//
//	outlier {
//		consecutive_failures <n>|off
//		consecutive_cuts     <n>
//		base_ejection        <duration>
//		max_ejection         <duration>
//		max_ejected_percent  <percent>
//	}
func (o *OutlierSettings) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("outlier %s: option specified more than once", opt)
		}
		seen[opt] = true
		v, err := oneArg(d, "outlier "+opt)
		if err != nil {
			return err
		}
		switch opt {
		case "consecutive_failures":
			if v == "off" {
				o.ConsecutiveFailures = -1
				continue
			}
			n, err := parsePositive(v)
			if err != nil {
				return d.Errf("outlier consecutive_failures: %v", err)
			}
			o.ConsecutiveFailures = n
		case "consecutive_cuts":
			n, err := parsePositive(v)
			if err != nil {
				return d.Errf("outlier consecutive_cuts: %v", err)
			}
			o.ConsecutiveCuts = n
		case "max_ejected_percent":
			n, err := parsePositive(v)
			if err != nil || n > 100 {
				return d.Errf("outlier max_ejected_percent: want 1-100, got %q", v)
			}
			o.MaxEjectedPercent = n
		case "base_ejection", "max_ejection":
			dur, err := positiveDuration(d, "outlier "+opt, v)
			if err != nil {
				return err
			}
			if opt == "base_ejection" {
				o.BaseEjection = dur
			} else {
				o.MaxEjection = dur
			}
		default:
			return d.Errf("unrecognized outlier option '%s'", opt)
		}
	}
	return nil
}

// positiveDuration parses v, the value of option what, as a duration
// greater than zero.
func positiveDuration(d *caddyfile.Dispenser, what, v string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur <= 0 {
		return 0, d.Errf("%s: want a positive duration, got %q", what, v)
	}
	return caddy.Duration(dur), nil
}

func parsePositive(v string) (int, error) {
	var n int
	if _, err := fmt.Sscanf(v, "%d", &n); err != nil || n <= 0 || fmt.Sprint(n) != v {
		return 0, fmt.Errorf("want a positive integer, got %q", v)
	}
	return n, nil
}

// outcomeObserver reports the final attempt's outcome of a routed request
// to the fleet's outlier detector. Earlier attempts (retried) are
// reported by Select.
type outcomeObserver struct {
	r  *http.Request
	st *reqState
}

func (o *outcomeObserver) WriteHeader(int, http.Header) {}
func (o *outcomeObserver) Write([]byte)                 {}

// End classifies the outcome. A request its client abandoned says
// nothing about the replica.
func (o *outcomeObserver) End(status int, err error) {
	st := o.st
	if !st.pending || st.fleet == nil || st.slot < 0 {
		return
	}
	st.pending = false
	od := st.fleet.Detector()
	kind, failed := selection.ClassifyOutcome(status, err, o.r.Context().Err() != nil)
	if failed && kind == selection.FailConnect && responseStatus(o.r) >= 500 {
		kind = selection.FailStatus // a 5xx answer Caddy retried until out of tries
	}
	if failed {
		od.Failure(st.slot, kind, st.poolSize)
	} else if status != 0 {
		od.Success(st.slot)
	}
}

// reportRetried reports the failure of the attempt a retry replaces: Caddy
// retries only after a failed attempt (a transport error, or a response
// matched by lb_retry_match). status is the failed response's status, 0
// when there was none.
func reportRetried(st *reqState, status int) {
	if !st.pending || st.fleet == nil || st.slot < 0 {
		return
	}
	st.pending = false
	kind := selection.FailConnect
	if status >= 500 {
		kind = selection.FailStatus
	}
	st.fleet.Detector().Failure(st.slot, kind, st.poolSize)
}

// picked records that the attempt now starting goes to st.slot.
func picked(st *reqState, poolSize int) {
	if st.fleet == nil || st.slot < 0 {
		return
	}
	st.pending = true
	st.poolSize = poolSize
	st.fleet.Detector().Picked(st.slot)
}

// admittedPool is pool without the replicas outlier detection ejected (the
// fallback policy knows nothing of them), or pool itself when none is
// ejected or every one is.
func admittedPool(pool reverseproxy.UpstreamPool, v *poolView, od *selection.Outlier) reverseproxy.UpstreamPool {
	out := -1
	for i := range pool {
		if !od.Usable(v.slots[i]) {
			out = i
			break
		}
	}
	if out < 0 {
		return pool
	}
	sub := make(reverseproxy.UpstreamPool, 0, len(pool)-1)
	for i, up := range pool {
		if od.Usable(v.slots[i]) {
			sub = append(sub, up)
		}
	}
	if len(sub) == 0 {
		return pool
	}
	return sub
}

// retriedStatus is the status of the response a retry replaces (Caddy's
// {http.reverse_proxy.status_code}), 0 when the attempt got none. It is
// taken off the replacer, so that a later transport error is not read as
// the same status.
func retriedStatus(r *http.Request) int {
	n := responseStatus(r)
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok && n != 0 {
		repl.Delete("http.reverse_proxy.status_code")
	}
	return n
}

// responseStatus is Caddy's {http.reverse_proxy.status_code}, 0 when unset.
func responseStatus(r *http.Request) int {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return 0
	}
	v, ok := repl.Get("http.reverse_proxy.status_code")
	if !ok {
		return 0
	}
	n, _ := v.(int)
	return n
}
