package module

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// recycleChain runs requests through guard and handler (guard first or
// handler first) in front of next, each with vars of its own, and returns
// the vars and the request as a late reader of them would see it.
func recycleChain(t *testing.T, guardFirst bool) func(body string, next caddyhttp.HandlerFunc) (*http.Request, error) {
	g := newTestGuard(t, &Guard{})
	h := Handler{set: processMetrics()}
	return func(body string, next caddyhttp.HandlerFunc) (*http.Request, error) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer())
		req = req.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{}))
		rec := httptest.NewRecorder()
		var err error
		if guardFirst {
			err = g.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				return h.ServeHTTP(w, r, next)
			}))
		} else {
			err = h.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				return g.ServeHTTP(w, r, next)
			}))
		}
		return req, err
	}
}

// TestRecycledStateLeavesNoHolder: the guard and the handler put the
// request state they created back into the pool when the chain returned
// without an error, and the next request gets it again. What may outlive
// the first request must not see the second: a late reader of the first
// request's vars (an error route, a handler after the chain) finds no
// state and makes its own, never the one the second request now owns (it
// fails when the vars hold the state itself, or when recycle leaves the
// vars entry pointing at it); and the first request's body reader, which
// net/http's write loop may still read after the handler returned, yields
// the first body (it fails when the reader lives in the pooled state).
func TestRecycledStateLeavesNoHolder(t *testing.T) {
	for _, guardFirst := range []bool{true, false} {
		serve := recycleChain(t, guardFirst)
		reused := 0
		for i := range 20 {
			first := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"first %d"}]}`, i)
			second := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"the second request, %d"}]}`, i)
			var held io.ReadCloser
			var st1 *reqState
			late, err := serve(first, func(w http.ResponseWriter, r *http.Request) error {
				held, st1 = r.Body, lookupRequest(r) // a transport that has not read the body yet
				w.WriteHeader(http.StatusOK)
				return nil
			})
			if err != nil || st1 == nil {
				t.Fatalf("guard first %v: error %v, state %p", guardFirst, err, st1)
			}
			_, err = serve(second, func(w http.ResponseWriter, r *http.Request) error {
				st2 := lookupRequest(r)
				if st2 == st1 {
					reused++
				}
				// A late reader of the first request's vars while the
				// second runs.
				if got := lookupRequest(late); got != nil {
					t.Errorf("guard first %v: the ended request's vars lead to a state (the second's: %v)", guardFirst, got == st2)
				}
				st, created := ownedState(nil, late)
				if !created || st == st2 {
					t.Errorf("guard first %v: a late reader took a state it did not create (the second's: %v)", guardFirst, st == st2)
				}
				st.finish()
				_, _ = io.Copy(io.Discard, r.Body)
				_ = r.Body.Close()
				w.WriteHeader(http.StatusOK)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(held)
			_ = held.Close()
			if err != nil || string(got) != first {
				t.Fatalf("guard first %v: the first request's body read after its end: %q, %v; want %q", guardFirst, got, err, first)
			}
		}
		if reused == 0 {
			t.Errorf("guard first %v: no request state was reused: the test shows nothing", guardFirst)
		}
	}
}

// TestStateKeptAfterChainError: when the chain returns an error (Caddy
// then runs its error routes over the same vars) the state is not pooled:
// a reader after the chain still finds the request's own state.
func TestStateKeptAfterChainError(t *testing.T) {
	h := Handler{set: processMetrics()} // alone: no guard in front rewrites the error
	var st1 *reqState
	late := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m1","messages":[]}`))
	late = late.WithContext(context.WithValue(late.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	err := h.ServeHTTP(httptest.NewRecorder(), late, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		st1 = lookupRequest(r)
		st1.readBody(r, 1<<20)
		return caddyhttp.Error(http.StatusBadGateway, errors.New("upstream gone"))
	}))
	if err == nil || st1 == nil || st1.body == nil {
		t.Fatalf("error %v, state %p: the chain's error was not returned or no body read", err, st1)
	}
	if got := lookupRequest(late); got == nil || got != st1 {
		t.Fatalf("after an error the vars lead to %p, want the request's own state %p", got, st1)
	}
}
