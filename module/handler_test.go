package module

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/observe"
)

// recordingObserver records what the handler fed it.
type recordingObserver struct {
	status int
	body   []byte
	ended  bool
	endErr error
}

func (o *recordingObserver) WriteHeader(status int, _ http.Header) { o.status = status }
func (o *recordingObserver) Write(p []byte)                        { o.body = append(o.body, p...) }
func (o *recordingObserver) End(_ int, err error)                  { o.ended, o.endErr = true, err }

var testObservers = map[*http.Request]*recordingObserver{}

// recordObserver is a Handler's extra observer recording the responses of
// requests with X-Test-Observe.
func recordObserver(r *http.Request, _ *reqState) observe.Observer {
	if r.Header.Get("X-Test-Observe") == "" {
		return nil
	}
	o := &recordingObserver{}
	testObservers[r] = o
	return o
}

func TestHandlerPrefillReleaseAndObserve(t *testing.T) {
	p := newTestPolicy(t, "handler")
	pool := newTestPool(4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := newTestRequest(ctx, chatJSON(16<<10, "hi"))
	r.Header.Set("X-Test-Observe", "1")
	rec := httptest.NewRecorder()
	rt := p.fleet.Base()
	errNext := errors.New("next failed after writing")

	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if p.Select(pool, r, w) == nil {
			t.Fatal("no upstream")
		}
		st := lookupRequest(r)
		if in, pend := rt.Load(st.slot); in != 1 || pend == 0 {
			t.Fatalf("before the first byte: inflight %d pending %d", in, pend)
		}
		w.Header().Add(HeaderUpstream, "127.0.0.1:8001") // an upstream leaking its address
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		if in, pend := rt.Load(st.slot); in != 1 || pend == 0 {
			t.Fatalf("headers alone must not end the prefill: inflight %d pending %d", in, pend)
		}
		w.Write([]byte("data: {}\n\n"))
		if in, pend := rt.Load(st.slot); in != 1 || pend != 0 {
			t.Fatalf("after the first byte: inflight %d pending %d, want 1 and 0", in, pend)
		}
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Fatalf("flush through the wrapper: %v", err)
		}
		w.Write([]byte("data: [DONE]\n\n"))
		return errNext
	})
	if err := (Handler{extra: recordObserver, set: processMetrics()}).ServeHTTP(rec, r, next); err != errNext {
		t.Fatalf("ServeHTTP error %v, want next's", err)
	}
	st := lookupRequest(r)
	if in, pend := rt.Load(st.slot); in != 0 || pend != 0 {
		t.Fatalf("after the handler: inflight %d pending %d", in, pend)
	}
	if !rec.Flushed {
		t.Fatal("flush did not reach the client writer")
	}
	if got := rec.Result().Header.Values(HeaderUpstream); len(got) != 1 || got[0] != st.routeID() {
		t.Fatalf("X-Ramjet-Upstream %q, want only %q", got, st.routeID())
	}
	o := testObservers[r]
	delete(testObservers, r)
	if o == nil || o.status != 200 || string(o.body) != "data: {}\n\ndata: [DONE]\n\n" || !o.ended || o.endErr != errNext {
		t.Fatalf("observer saw %+v", o)
	}
}

func TestHandlerUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    string
		wantErr string
	}{
		{name: "bare", give: "ramjet_observe"},
		{name: "state key", give: "ramjet_observe {\n state_key fleet-a\n}", want: "fleet-a"},
		{name: "twice", give: "ramjet_observe {\n state_key a\n state_key b\n}", wantErr: "more than once"},
		{name: "unknown", give: "ramjet_observe {\n color blue\n}", wantErr: "ramjet_observe: unrecognized option 'color'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || h.StateKey != tt.want {
				t.Fatalf("state key %q, err %v; want %q", h.StateKey, err, tt.want)
			}
			if err := h.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if err := (&Handler{StateKey: "no spaces allowed"}).Validate(); err == nil {
		t.Error("a bad state_key validated")
	}
}

// TestIdleWriterBounds: Caddy's write idle timeout stands for
// write_timeout only when it is set, no longer, and has no minimum rate
// (whose deadline grows with the bytes written).
func TestIdleWriterBounds(t *testing.T) {
	const d = time.Minute
	for _, tt := range []struct {
		name string
		w    *caddyhttp.IdleTimeoutWriter
		want bool
	}{
		{"none", nil, false},
		{"unset", &caddyhttp.IdleTimeoutWriter{}, false},
		{"shorter", &caddyhttp.IdleTimeoutWriter{Deadline: caddyhttp.IdleDeadline{Timeout: time.Second}}, true},
		{"equal", &caddyhttp.IdleTimeoutWriter{Deadline: caddyhttp.IdleDeadline{Timeout: d}}, true},
		{"longer", &caddyhttp.IdleTimeoutWriter{Deadline: caddyhttp.IdleDeadline{Timeout: 2 * d}}, false},
		{"min rate", &caddyhttp.IdleTimeoutWriter{Deadline: caddyhttp.IdleDeadline{Timeout: time.Second, MinRate: 1}}, false},
	} {
		if got := (*idleWriter)(tt.w).Bounds(d); got != tt.want {
			t.Errorf("%s: Bounds %v, want %v", tt.name, got, tt.want)
		}
	}
}

// idleLookups counts the lookups of Caddy's idle timeouts in a request's
// context (caddyhttp.IdleTimeoutsFromContext's key).
type idleLookups struct {
	context.Context
	n *int
}

func (c idleLookups) Value(key any) any {
	if key == caddy.CtxKey("idle_timeouts") {
		*c.n++
	}
	return c.Context.Value(key)
}

// TestGuardHandsIdleTimeoutsToHandler: with the guard in front, the
// observe handler bounds its writes by the idle timeout writer the guard
// looked up (one context walk per request, not two); alone, it looks it up
// itself.
func TestGuardHandsIdleTimeoutsToHandler(t *testing.T) {
	g := newTestGuard(t, &Guard{})
	iw := &caddyhttp.IdleTimeoutWriter{Deadline: caddyhttp.IdleDeadline{Timeout: time.Second}}
	for _, guardFirst := range []bool{true, false} {
		var lookups int
		var bound observe.Bound
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if ow, ok := w.(*observe.Writer); ok {
				bound = ow.Bound()
			}
			_, err := w.Write([]byte("ok"))
			return err
		})
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m1"}`))
		ctx := caddyhttp.ContextWithIdleTimeouts(req.Context(), nil, iw)
		ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer())
		req = req.WithContext(idleLookups{context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{}), &lookups})
		h := Handler{WriteTimeout: caddy.Duration(time.Minute), set: processMetrics()}
		var err error
		if guardFirst {
			err = g.ServeHTTP(httptest.NewRecorder(), req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				return h.ServeHTTP(w, r, next)
			}))
		} else {
			err = h.ServeHTTP(httptest.NewRecorder(), req, next)
		}
		if err != nil {
			t.Fatal(err)
		}
		if b, ok := bound.(*idleWriter); !ok || (*caddyhttp.IdleTimeoutWriter)(b) != iw {
			t.Errorf("guard first %v: the handler's writes are bounded by %#v, want the request's idle timeout writer", guardFirst, bound)
		}
		if lookups != 1 {
			t.Errorf("guard first %v: %d lookups of the idle timeouts, want 1", guardFirst, lookups)
		}
	}
}

// lookupRequest returns the request's reqState or nil (none, or the
// request ended and its state went back to the pool).
func lookupRequest(r *http.Request) *reqState {
	if ref, _ := caddyhttp.GetVar(r.Context(), VarRequest).(*stateRef); ref != nil {
		return ref.st.Load()
	}
	return nil
}

// observedState returns the request's reqState as the ramjet handler takes
// it, creating it when none exists.
func observedState(r *http.Request) *reqState {
	st, _ := ownedState(nil, r)
	st.observed = true
	return st
}
