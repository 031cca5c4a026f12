package module

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestRecycledStateLeavesNoHolder: the guard and the handler recycle the
// request state they created when they return, and the next request gets
// it again. What may outlive the first request must not see the second:
// its body reader, which net/http's write loop may still read after the
// handler returned (an engine that answered before reading the whole
// body), yields the first body, and a module that looks the state up in
// the first request's vars after the chain does not take it as its own
// (ownedState). It fails when the reader lives in the recycled state.
func TestRecycledStateLeavesNoHolder(t *testing.T) {
	g := newTestGuard(t, &Guard{})
	var h Handler
	for _, guardFirst := range []bool{true, false} {
		chain := func(next caddyhttp.HandlerFunc) caddyhttp.HandlerFunc {
			if guardFirst {
				return func(w http.ResponseWriter, r *http.Request) error {
					return g.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
						return h.ServeHTTP(w, r, next)
					}))
				}
			}
			return func(w http.ResponseWriter, r *http.Request) error {
				return h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					return g.ServeHTTP(w, r, next)
				}))
			}
		}
		serve := func(body string, next caddyhttp.HandlerFunc) map[string]any {
			t.Helper()
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			vars := map[string]any{}
			ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer())
			req = req.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, vars))
			rec := httptest.NewRecorder()
			if err := chain(next)(rec, req); err != nil || rec.Code != http.StatusOK {
				t.Fatalf("guard first %v: status %d, error %v", guardFirst, rec.Code, err)
			}
			return vars
		}
		reused := 0
		for i := range 20 {
			first := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"first %d"}]}`, i)
			second := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"the second request, %d"}]}`, i)
			var held io.ReadCloser
			var st1 *reqState
			vars := serve(first, func(w http.ResponseWriter, r *http.Request) error {
				held, st1 = r.Body, lookupRequest(r) // a transport that has not read the body yet
				w.WriteHeader(http.StatusOK)
				return nil
			})
			if st, _ := vars[VarRequest].(*reqState); st == nil || st.vars == reflect.ValueOf(vars).Pointer() {
				t.Fatalf("guard first %v: a handler after the chain would take the recycled state as its request's", guardFirst)
			}
			serve(second, func(w http.ResponseWriter, r *http.Request) error {
				if lookupRequest(r) == st1 {
					reused++
				}
				_, _ = io.Copy(io.Discard, r.Body)
				_ = r.Body.Close()
				w.WriteHeader(http.StatusOK)
				return nil
			})
			got, err := io.ReadAll(held)
			_ = held.Close()
			if err != nil || string(got) != first {
				t.Fatalf("guard first %v: the first request's body read after its end: %q, %v; want %q", guardFirst, got, err, first)
			}
		}
		// sync.Pool hands a goroutine back what it put (it drops items at
		// random under the race detector): the states were reused.
		if reused == 0 && !raceEnabled {
			t.Errorf("guard first %v: no request state was reused: the test shows nothing", guardFirst)
		}
	}
}

// observedState is the handler's part of a request's state, as
// Handler.ServeHTTP takes it: the state, created when the handler is the
// first ramjet module to see the request (the handler then recycles it).
func observedState(r *http.Request) (*reqState, bool) {
	st, created := ownedState(r)
	st.observed = true
	return st, created
}

// lookupRequest returns the request's reqState or nil (a recycled one
// included: read it while the request runs).
func lookupRequest(r *http.Request) *reqState {
	st, _ := caddyhttp.GetVar(r.Context(), VarRequest).(*reqState)
	return st
}
