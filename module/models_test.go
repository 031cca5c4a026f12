package module

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestFleetModelsFetch(t *testing.T) {
	var hits, slowHits atomic.Int32
	var down atomic.Bool
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if down.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, `{"data":[{"id":"m1","max_model_len":2048}]}`)
	}))
	defer engine.Close()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slowHits.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)

	dials := []string{strings.TrimPrefix(engine.URL, "http://"), strings.TrimPrefix(slow.URL, "http://")}
	// The fetch timeout is 1s, not 300ms: the engine that answers must do
	// so within it on a loaded machine; the hanging one is cut at it.
	f, key, err := acquireModelList(append(dials, dials[0]), "tok", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer modelLists.Delete(key)
	f2, key2, _ := acquireModelList([]string{dials[1], dials[0]}, "tok", time.Second)
	defer modelLists.Delete(key2)
	if f2 != f {
		t.Error("same upstreams in another order do not share the model list")
	}

	ctx := context.Background()
	start := time.Now()
	l, err := f.Models(ctx, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Errorf("fetch took %v despite the 1s timeout", el)
	}
	if len(l.Data) != 1 || l.Data[0].ID != "m1" || *l.Data[0].MaxModelLen != 2048 {
		t.Errorf("list = %+v", l.Data)
	}
	if _, err := f.Models(ctx, time.Minute, nil); err != nil || hits.Load() != 1 {
		t.Errorf("cached list not served: err %v, hits %d", err, hits.Load())
	}
	if known, listed := f.Knows(ctx, "m1"); !known || !listed {
		t.Errorf("knows(m1) = %v, %v", known, listed)
	}
	// Engines Caddy holds down are not asked: the hanging one does not
	// stall the refresh.
	before := slowHits.Load()
	start = time.Now()
	if _, err := f.Models(ctx, 0, map[string]bool{dials[0]: true}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 750*time.Millisecond || slowHits.Load() != before {
		t.Errorf("refresh with the slow engine held down took %v, slow engine asked %d more times", el, slowHits.Load()-before)
	}

	// An engine failing keeps the last good list (stale) rather than none.
	down.Store(true)
	if l, err := f.Models(ctx, 0, nil); err != nil || len(l.Data) != 1 {
		t.Errorf("stale list not served: %v %v", l, err)
	}
}

func TestFleetModelsNoEngine(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dial := strings.TrimPrefix(dead.URL, "http://")
	dead.Close()
	f, key, err := acquireModelList([]string{dial}, "", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer modelLists.Delete(key)
	if _, err := f.Models(context.Background(), time.Second, nil); err == nil {
		t.Fatal("want an error when no engine answers")
	}
	if known, listed := f.Knows(context.Background(), "x"); known || listed {
		t.Errorf("knows = %v, %v with no list", known, listed)
	}
}
