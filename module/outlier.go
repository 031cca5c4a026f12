package module

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/ramjet-llm/ramjet/selection"
)

// endOutcome reports the final attempt's outcome of a routed request to
// the fleet's outlier detector (the responseObserver's last part, metrics.go;
// status is what was written, 0: nothing). Earlier attempts (retried) are
// reported by Select. A request its client abandoned says nothing about
// the replica.
func endOutcome(r *http.Request, st *reqState, status int, err error) {
	if !st.pending || st.fleet == nil || st.slot < 0 {
		return
	}
	st.pending = false
	od := st.fleet.Detector()
	kind, failed := selection.ClassifyOutcome(status, err, (err != nil || status >= 500) && r.Context().Err() != nil)
	if failed && kind == selection.FailConnect && responseStatus(r) >= 500 {
		kind = selection.FailStatus // a 5xx answer Caddy retried until out of tries
	}
	if failed {
		od.Failure(st.slot, kind, int(st.poolSize))
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
	st.fleet.Detector().Failure(st.slot, kind, int(st.poolSize))
}

// picked records that the attempt now starting goes to st.slot.
func picked(st *reqState, poolSize int) {
	if st.fleet == nil || st.slot < 0 {
		return
	}
	st.pending = true
	st.poolSize = int32(poolSize)
	st.fleet.Detector().Picked(st.slot)
}

// admittedPool is pool without the replicas outlier detection ejected (the
// fallback policy knows nothing of them), or pool itself when none is
// ejected or every one is.
func admittedPool(pool reverseproxy.UpstreamPool, v *poolView, od *selection.Outlier) reverseproxy.UpstreamPool {
	out := -1
	for i := range pool {
		if !od.Usable(v.Slots[i]) {
			out = i
			break
		}
	}
	if out < 0 {
		return pool
	}
	sub := make(reverseproxy.UpstreamPool, 0, len(pool)-1)
	for i, up := range pool {
		if od.Usable(v.Slots[i]) {
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
