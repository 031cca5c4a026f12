package fleetstate

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

func TestReplicaKeys(t *testing.T) {
	tests := []struct {
		name string
		give []string
		want []string
	}{
		{name: "distinct", give: []string{"a:1", "b:1"}, want: []string{"a:1", "b:1"}},
		{name: "ranks", give: []string{"a:1", "b:1", "a:1"}, want: []string{"a:1#0", "b:1", "a:1#1"}},
		{name: "none", give: nil, want: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, ReplicaKeys(tt.give)); diff != "" {
				t.Errorf("ReplicaKeys (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRouteIDs: the ids a fleet hands out are RouteID of the replica key
// under its secret, follow a secret change, and are what ReplicaIDs
// computes from the upstream list.
func TestRouteIDs(t *testing.T) {
	f, err := New(DefaultStateKey, PoolKey(DefaultStateKey, selection.Config{}), selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.SetSecret([]byte("k"))
	dials := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:2"}
	want := ReplicaIDs([]byte("k"), dials)
	for i, key := range ReplicaKeys(dials) {
		s, id, err := f.Register(key)
		if err != nil {
			t.Fatal(err)
		}
		if int(s) != i || id != want[i] || f.RouteID(key) != id {
			t.Errorf("Register(%q) = %d, %q; RouteID %q; want %d, %q", key, s, id, f.RouteID(key), i, want[i])
		}
		if len(id) != 16 {
			t.Errorf("id %q is not 16 hex characters", id)
		}
	}
	f.SetSecret([]byte("other"))
	if got := f.RouteID("127.0.0.1:1"); got != RouteID([]byte("other"), "127.0.0.1:1") || got == want[0] {
		t.Errorf("after the secret change RouteID = %q", got)
	}
	if f.RouteID("127.0.0.1:9") != "" {
		t.Error("an unregistered key has an id")
	}
	reps := f.Replicas()
	if len(reps) != 3 || reps[2].Key != "127.0.0.1:2#1" || reps[2].Rank != -1 || reps[2].ID != RouteID([]byte("other"), "127.0.0.1:2#1") {
		t.Errorf("Replicas = %+v", reps)
	}
}

func TestLatest(t *testing.T) {
	var l Latest[*int]
	if _, ok := l.Get("a"); ok || l.Keys() != nil {
		t.Fatal("zero Latest is not empty")
	}
	one, two := new(int), new(int)
	l.Set("b", one)
	l.Set("a", one)
	l.Set("a", two)
	if v, _ := l.Get("a"); v != two {
		t.Error("Set did not replace")
	}
	l.Drop("a", one) // no longer a's value: kept
	if v, _ := l.Get("a"); v != two {
		t.Error("Drop removed a newer value")
	}
	l.Drop("a", two)
	if diff := cmp.Diff([]string{"b"}, l.Keys()); diff != "" {
		t.Errorf("Keys (-want +got):\n%s", diff)
	}
	l.Set("c", two)
	if v := l.Values(); len(v) != 2 || v[0] != one || v[1] != two {
		t.Errorf("Values = %v, want b's then c's", v)
	}
}

// TestLatestOne: Get answers as the map does whether the map holds one
// key (read without a map lookup) or several, through every change
// between the two.
func TestLatestOne(t *testing.T) {
	var l Latest[*int]
	if !l.Empty() {
		t.Error("zero Latest: Empty() = false")
	}
	one, two := new(int), new(int)
	check := func(step string, want map[string]*int) {
		t.Helper()
		for _, k := range []string{"a", "b", "", "ab"} {
			v, ok := l.Get(k)
			if w, wok := want[k]; v != w || ok != wok {
				t.Errorf("%s: Get(%q) = %p, %v; want %p, %v", step, k, v, ok, w, wok)
			}
		}
		if e := l.one.Load(); (e != nil) != (len(want) == 1) {
			t.Errorf("%s: single-entry cache %v with %d keys", step, e != nil, len(want))
		}
		if l.Empty() != (len(want) == 0) {
			t.Errorf("%s: Empty() = %v with %d keys", step, l.Empty(), len(want))
		}
	}
	l.Set("a", one)
	check("one key", map[string]*int{"a": one})
	l.Set("a", two)
	check("replaced", map[string]*int{"a": two})
	l.Set("b", one)
	check("two keys", map[string]*int{"a": two, "b": one})
	l.Drop("a", two)
	check("back to one", map[string]*int{"b": one})
	l.Drop("b", one)
	check("none", map[string]*int{})
}

func TestNewHealthReport(t *testing.T) {
	tests := []struct {
		name    string
		healthy []bool
		want    string
	}{
		{name: "all", healthy: []bool{true, true}, want: StatusOK},
		{name: "some", healthy: []bool{true, false}, want: StatusDegraded},
		{name: "none", healthy: []bool{false}, want: StatusUnhealthy},
		{name: "empty", want: StatusUnhealthy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reps := make([]ReplicaHealth, len(tt.healthy))
			n := 0
			for i, h := range tt.healthy {
				reps[i].Healthy = h
				if h {
					n++
				}
			}
			rep := NewHealthReport(reps)
			if rep.Status != tt.want || rep.Healthy != n || rep.Total != len(reps) {
				t.Errorf("NewHealthReport = %+v, want status %s, %d healthy", rep, tt.want, n)
			}
		})
	}
}

// TestStateJSON: a fleet without replicas lists none as [], and used is
// bytes over budget.
func TestStateJSON(t *testing.T) {
	b, err := json.Marshal(Snapshot{Key: "k", IndexBytes: 1, IndexBudget: 4}.State())
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Replicas []ReplicaSnapshot `json:"replicas"`
		Index    IndexState        `json:"index"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Replicas == nil || len(got.Replicas) != 0 || got.Index.Used != 0.25 {
		t.Errorf("State JSON = %s", b)
	}
}

func TestFleetsOf(t *testing.T) {
	snaps := []Snapshot{{Key: "a"}, {Key: "b"}}
	if out, ok := FleetsOf(snaps, ""); !ok || len(out.Fleets) != 2 {
		t.Errorf("all: %+v %v", out, ok)
	}
	if out, ok := FleetsOf(snaps, "b"); !ok || len(out.Fleets) != 1 || out.Fleets[0].Fleet != "b" {
		t.Errorf("b: %+v %v", out, ok)
	}
	if out, ok := FleetsOf(snaps, "c"); ok || out.Fleets == nil {
		t.Errorf("c: %+v %v", out, ok)
	}
	if out, ok := FleetsOf(nil, ""); !ok || out.Fleets == nil {
		t.Errorf("none: %+v %v (want an empty list, not null)", out, ok)
	}
}

func TestReadExplain(t *testing.T) {
	tests := []struct {
		name   string
		url    string
		body   string
		want   selection.Endpoint
		status int
	}{
		{name: "default path", url: "/ramjet/explain", body: "{}", want: selection.EndpointChat, status: 200},
		{name: "completions", url: "/ramjet/explain?path=/v1/completions", body: "{}", want: selection.EndpointCompletions, status: 200},
		{name: "not an LLM route", url: "/ramjet/explain?path=/v1/models", body: "{}", status: 400},
		{name: "too large", url: "/ramjet/explain", body: strings.Repeat("x", 65), status: 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, tt.url, strings.NewReader(tt.body))
			ep, body, status, err := ReadExplain(httptest.NewRecorder(), r, 64)
			if status != tt.status || (err == nil) != (tt.status == 200) {
				t.Fatalf("status %d, err %v; want %d", status, err, tt.status)
			}
			if err == nil && (ep != tt.want || string(body) != tt.body) {
				t.Errorf("endpoint %v body %q", ep, body)
			}
		})
	}
}

func TestHealthReportWrite(t *testing.T) {
	for _, tt := range []struct {
		method string
		rep    HealthReport
		status int
		body   bool
	}{
		{method: http.MethodGet, rep: NewHealthReport([]ReplicaHealth{{ID: "a", Healthy: true}}), status: 200, body: true},
		{method: http.MethodGet, rep: NewHealthReport(nil), status: 503, body: true},
		{method: http.MethodHead, rep: NewHealthReport(nil), status: 503},
	} {
		rec := httptest.NewRecorder()
		if err := tt.rep.Write(rec, httptest.NewRequest(tt.method, "/health", nil)); err != nil {
			t.Fatal(err)
		}
		var got HealthReport
		if rec.Code != tt.status || rec.Header().Get("Cache-Control") != "no-store" ||
			(json.Unmarshal(rec.Body.Bytes(), &got) == nil) != tt.body || (tt.body && got.Status != tt.rep.Status) {
			t.Errorf("%s %s: %d %q", tt.method, tt.rep.Status, rec.Code, rec.Body.String())
		}
	}
}

// TestSettingsKey: a part's key names its kind and scope and changes with
// its settings only; PoolKey is the fleet's own.
func TestSettingsKey(t *testing.T) {
	type settings struct{ A, B int }
	k := SettingsKey("ramjet-kv", "default", settings{1, 2})
	if !strings.HasPrefix(k, "ramjet-kv/default/") || len(k) != len("ramjet-kv/default/")+16 {
		t.Errorf("SettingsKey = %q, want ramjet-kv/default/<16 hex digits>", k)
	}
	if k2 := SettingsKey("ramjet-kv", "default", &settings{1, 2}); k2 != k {
		t.Errorf("the same settings by pointer: %q, want %q", k2, k)
	}
	for _, other := range []string{
		SettingsKey("ramjet-kv", "default", settings{1, 3}),
		SettingsKey("ramjet-kv", "other", settings{1, 2}),
		SettingsKey("ramjet-engines", "default", settings{1, 2}),
	} {
		if other == k {
			t.Errorf("%q: another kind, scope or settings got the same key", other)
		}
	}
	if pk := PoolKey("default", selection.Config{}); !strings.HasPrefix(pk, "ramjet/default/") {
		t.Errorf("PoolKey = %q, want ramjet/default/<hash>", pk)
	}
}
