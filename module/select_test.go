package module

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
)

// newTestPolicy provisions a policy with its own state key.
func newTestPolicy(tb testing.TB, key string) *RamjetSelection {
	tb.Helper()
	p := &RamjetSelection{PolicySettings: fleetstate.PolicySettings{StateKey: key}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := p.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	p.logger = zap.NewNop()
	tb.Cleanup(func() {
		p.Cleanup()
		cancel()
	})
	return p
}

// newTestPool returns n upstreams on distinct dial addresses.
func newTestPool(n int) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Dial: "127.0.0.1:" + strconv.Itoa(8001+i), Host: new(reverseproxy.Host)}
	}
	return pool
}

// chatJSON is a chat request with a system prompt of about n bytes.
func chatJSON(n int, user string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      "qwen3-8b",
		"max_tokens": 64,
		"messages": []map[string]string{
			{"role": "system", "content": longText("system", n)},
			{"role": "user", "content": user},
		},
	})
	return b
}

var chatURL = &url.URL{Path: "/v1/chat/completions"}

// newTestRequest builds a proxied request as Caddy hands it to Select: a
// context with the vars map and a body.
func newTestRequest(ctx context.Context, body []byte) *http.Request {
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, make(map[string]any, 4))
	r := &http.Request{
		Method: http.MethodPost, URL: chatURL, Header: make(http.Header, 4),
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
	}
	return r.WithContext(ctx)
}

// TestDecideAllocs proves the Select hot path past the body read (the
// cached features, the pool view, candidate building and Route with pooled
// scratch and the request's reservation storage) allocates nothing for 8
// replicas.
func TestDecideAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	p := newTestPolicy(t, "allocs")
	pool := newTestPool(8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := newTestRequest(ctx, chatJSON(64<<10, "hello"))
	if up := p.Select(pool, r, nil); up == nil {
		t.Fatal("no upstream selected")
	}
	st := lookupRequest(r)
	ep := selection.EndpointChat
	var d selection.Decision
	var storage selection.Reservation
	allocs := testing.AllocsPerRun(1000, func() {
		if !st.body.Acquire() {
			t.Fatal("body released")
		}
		f := st.features(p.x, ep)
		v := p.viewFor(pool)
		var res *selection.Reservation
		d, res = p.decide(pool, v, st, f, &storage, false)
		res.Release()
		st.body.Release()
	})
	if allocs != 0 {
		t.Fatalf("decide allocates %v times per call, want 0", allocs)
	}
	// The first Select's reservation (a 16k-token prefill, still held)
	// overrode the warm replica once; every decide released its own, so
	// the replica it taught is warm and idle: affinity, after an index hit.
	if d.Index < 0 || d.BestOverlap == 0 || d.Overlap != d.BestOverlap || d.Reason != selection.ReasonAffinity {
		t.Fatalf("decision %+v: want affinity to a warm idle replica", d)
	}
}

// TestSelectReleases checks the reservation lifecycle of Select alone
// (no ramjet handler): held while the request runs, released when its
// context ends, and released before a retry reserves again.
func TestSelectReleases(t *testing.T) {
	p := newTestPolicy(t, "release")
	pool := newTestPool(4)
	ctx, cancel := context.WithCancel(context.Background())
	r := newTestRequest(ctx, chatJSON(8<<10, "hi"))
	up := p.Select(pool, r, nil)
	if up == nil {
		t.Fatal("no upstream")
	}
	st := lookupRequest(r)
	rt := p.fleet.Base()
	if in, pend := rt.Load(st.slot); in != 1 || pend == 0 {
		t.Fatalf("after Select: inflight %d pending %d, want 1 and the prompt", in, pend)
	}
	first := st.slot
	// A retry: the first reservation is released, another replica chosen.
	if up2 := p.Select(pool, r, nil); up2 == nil || up2 == up {
		t.Fatalf("retry chose %v, first %v", up2, up)
	}
	if in, pend := rt.Load(first); in != 0 || pend != 0 {
		t.Fatalf("first attempt still reserved: inflight %d pending %d", in, pend)
	}
	if in, _ := rt.Load(st.slot); in != 1 {
		t.Fatalf("retry not reserved: inflight %d", in)
	}
	cancel()
	eventually(t, "reservation released", func() bool { in, pend := rt.Load(st.slot); return in == 0 && pend == 0 })
	if !st.hold.Ended() {
		t.Fatal("request state not finished")
	}
}

// TestSelectOversizedBody checks that a body over max_body_bytes goes to
// the fallback policy untouched: the upstream reads the identical bytes.
func TestSelectOversizedBody(t *testing.T) {
	p := newTestPolicy(t, "oversized")
	p.MaxBodyBytes = 1024
	pool := newTestPool(4)
	for _, chunked := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		body := chatJSON(4096, "big")
		r := newTestRequest(ctx, body)
		if chunked {
			r.ContentLength = -1 // length unknown: read up to the bound
		}
		if p.Select(pool, r, nil) == nil {
			t.Fatal("no upstream")
		}
		st := lookupRequest(r)
		if !st.fallback || st.bodyErr != edge.ErrTooLarge {
			t.Fatalf("chunked=%v: fallback %v, body error %v", chunked, st.fallback, st.bodyErr)
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("chunked=%v: forwarded %d bytes (%v), want the %d sent", chunked, len(got), err, len(body))
		}
		if in, _ := p.fleet.Base().Load(st.slot); in != 1 {
			t.Fatalf("fallback pick not reserved: inflight %d", in)
		}
		cancel()
		eventually(t, "fallback reservation released", func() bool { in, _ := p.fleet.Base().Load(st.slot); return in == 0 })
	}
}

// TestMatcherRestoresBody checks that the matcher hands the next reader
// the identical bytes, matches by model glob, and leaves malformed and
// oversized bodies unmatched but intact.
func TestMatcherRestoresBody(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		max       int64
		wantMatch bool
	}{
		{"match", `{"model":"qwen3-8b","messages":[{"role":"user","content":"hi"}]}`, 0, true},
		{"other model", `{"model":"llama","messages":[]}`, 0, false},
		{"malformed", `{"model":"qwen3-8b","messages":[`, 0, false},
		{"oversized", `{"model":"qwen3-8b","messages":[{"role":"user","content":"` + longText("x", 4096) + `"}]}`, 1024, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := BodyMatcher{Models: []string{"qwen3-*"}, MaxBodyBytes: tt.max}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := newTestRequest(ctx, []byte(tt.body))
			ok, err := m.MatchWithError(r)
			if err != nil || ok != tt.wantMatch {
				t.Fatalf("match = %v, %v; want %v", ok, err, tt.wantMatch)
			}
			got, err := io.ReadAll(r.Body)
			if err != nil || string(got) != tt.body {
				t.Fatalf("next reader got %d bytes (%v), want the %d sent", len(got), err, len(tt.body))
			}
			if tt.name == "malformed" {
				var re *selection.RequestError
				st := lookupRequest(r)
				if st == nil {
					t.Fatal("no request state")
				}
				b := st.acquireBody()
				_, err := st.parse(sharedExtractor(), selection.EndpointChat)
				b.Release()
				if !errors.As(err, &re) {
					t.Fatalf("parse error not kept for a 400: %v", err)
				}
			}
		})
	}
}

// TestSelectAllocs bounds Select's allocations per request as it runs in
// the chain the ramjet directive builds: the ramjet handler ahead of
// reverse_proxy created the request's state, Select reads the body into a
// pooled buffer, parses, fingerprints, routes (reserving into the
// request's state) and tags the request; the request then ends as the
// handler ends it (body closed, state finished), so that the pooled body
// buffers recycle as they do in steady state. The one allocation left is
// the body reader handed to the transport.
func TestSelectAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	p := newTestPolicy(t, "select-allocs")
	pool := newTestPool(8)
	const runs = 200
	reqs := make([]*http.Request, runs+2)
	cancels := make([]context.CancelFunc, len(reqs))
	bodies := make([][]byte, 32)
	for i := range bodies {
		bodies[i] = chatJSON(16<<10, "user "+strconv.Itoa(i))
	}
	for i := range reqs {
		var ctx context.Context
		ctx, cancels[i] = context.WithCancel(context.Background())
		reqs[i] = newTestRequest(ctx, bodies[i%len(bodies)])
		observedState(reqs[i]) // the handler's part
	}
	next := 0
	allocs := testing.AllocsPerRun(runs, func() {
		r := reqs[next]
		next++
		if p.Select(pool, r, nil) == nil {
			t.Fatal("no upstream")
		}
		r.Body.Close()
		lookupRequest(r).finish()
	})
	for _, c := range cancels {
		c()
	}
	if allocs > 2 {
		t.Fatalf("Select allocates %v times per request, want at most 2", allocs)
	}
	t.Logf("Select: %v allocations per request", allocs)
}

// TestSelectAllocsBare pins the allocations of Select for a bare
// lb_policy ramjet (no ramjet handler in front): the request is prepared
// as Caddy's server prepares it (caddyhttp.PrepareRequest: replacer, vars
// map), outside the measurement; Select creates the request's state,
// reads and parses the body, routes, reserves and tags; the request then
// ends as Caddy ends it (the transport closes the body, the context is
// cancelled) and the sweeper releases it.
func TestSelectAllocsBare(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	p := newTestPolicy(t, "select-allocs-bare")
	pool := newTestPool(8)
	const runs = 200
	reqs := make([]*http.Request, runs+2)
	cancels := make([]context.CancelFunc, len(reqs))
	bodies := make([][]byte, 32)
	for i := range bodies {
		bodies[i] = chatJSON(16<<10, "user "+strconv.Itoa(i))
	}
	for i := range reqs {
		var ctx context.Context
		ctx, cancels[i] = context.WithCancel(context.Background())
		body := bodies[i%len(bodies)]
		r := (&http.Request{
			Method: http.MethodPost, URL: chatURL, Header: make(http.Header, 4), RemoteAddr: "127.0.0.1:1234",
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		}).WithContext(ctx)
		reqs[i] = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), nil, nil)
	}
	next := 0
	allocs := testing.AllocsPerRun(runs, func() {
		r := reqs[next]
		if p.Select(pool, r, nil) == nil {
			t.Fatal("no upstream")
		}
		r.Body.Close()
		cancels[next]()
		// The sweeper's pass, run here so that the body buffer returns to
		// the pool as it does in steady state (a short run outpaces the
		// sweeper's period); it allocates nothing itself.
		openStates.Sweep()
		next++
	})
	for _, c := range cancels {
		c()
	}
	eventually(t, "every reservation released", func() bool {
		for s := range selection.Slot(8) {
			if in, pend := p.fleet.Base().Load(s); in != 0 || pend != 0 {
				return false
			}
		}
		return true
	})
	if allocs > 2 {
		t.Fatalf("bare Select allocates %v times per request, want at most 2", allocs)
	}
	t.Logf("bare Select: %v allocations per request", allocs)
}
