package workload

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func gen(t *testing.T, name string, o Options) *Workload {
	t.Helper()
	w, err := Generate(name, o)
	if err != nil {
		t.Fatalf("Generate(%s): %v", name, err)
	}
	return w
}

func TestGenerateDeterministic(t *testing.T) {
	for _, name := range Names {
		t.Run(name, func(t *testing.T) {
			a := gen(t, name, Options{Seed: 7})
			b := gen(t, name, Options{Seed: 7})
			if diff := cmp.Diff(a.Trace, b.Trace); diff != "" {
				t.Fatalf("same seed, different traces (-a +b):\n%s", diff)
			}
			c := gen(t, name, Options{Seed: 8})
			if name != "burst" && cmp.Equal(a.Trace, c.Trace) {
				t.Fatalf("seeds 7 and 8 gave the same trace")
			}
		})
	}
}

func TestGenerateUnknown(t *testing.T) {
	if _, err := Generate("nope", Options{}); err == nil || !strings.Contains(err.Error(), "unknown workload") {
		t.Fatalf("err = %v, want unknown workload", err)
	}
}

func countBy(tr Trace, key func(Request) int) map[int]int {
	m := make(map[int]int)
	for _, r := range tr {
		m[key(r)]++
	}
	return m
}

func TestLocalityShape(t *testing.T) {
	w := gen(t, "locality", Options{Seed: 1})
	s := w.Trace.Stats()
	if s.Requests != 576 || s.Sessions != 192 || s.Groups != 8 || s.ClosedLoop != 384 {
		t.Fatalf("stats = %+v, want 576 requests, 192 sessions, 8 groups, 384 closed-loop", s)
	}
	for g, n := range countBy(w.Trace, func(r Request) int { return r.Group }) {
		if n != 72 {
			t.Errorf("group %d has %d requests, want 72 (24 sessions x 3 turns)", g, n)
		}
	}
	for _, r := range w.Trace {
		if r.Prefix != 8192 {
			t.Fatalf("row %d prefix %d, want 8192", r.ID, r.Prefix)
		}
		if r.Turn > 2 {
			t.Fatalf("row %d turn %d, want 0 to 2", r.ID, r.Turn)
		}
	}
}

func TestBurstShape(t *testing.T) {
	for _, tt := range []struct{ replicas, perRound int }{{8, 12}, {64, 96}} {
		w := gen(t, "burst", Options{Seed: 1, Replicas: tt.replicas})
		if len(w.Trace) != 8*tt.perRound {
			t.Fatalf("%d replicas: %d requests, want 8 rounds of %d", tt.replicas, len(w.Trace), tt.perRound)
		}
		for g, n := range countBy(w.Trace, func(r Request) int { return r.Group }) {
			if n != tt.perRound {
				t.Fatalf("round %d has %d requests, want %d", g, n, tt.perRound)
			}
		}
		for _, r := range w.Trace {
			if r.At != 30*float64(r.Group) || r.After != -1 || r.Prefix != 4096 {
				t.Fatalf("row %+v: want round g at 30g s, open loop, a 4096 prefix", r)
			}
		}
	}
}

func TestAgentFleetShape(t *testing.T) {
	w := gen(t, "agent-fleet", Options{Seed: 1})
	s := w.Trace.Stats()
	if s.Groups != 1 || s.MaxInput <= 100000 {
		t.Fatalf("stats = %+v, want one group and contexts past 100k", s)
	}
	// 48 agents: 48 open-loop roots, everything else closed loop.
	roots := 0
	for _, r := range w.Trace {
		if r.Prefix != 20000 {
			t.Fatalf("row %d prefix %d, want 20000", r.ID, r.Prefix)
		}
		if r.After < 0 {
			roots++
		}
	}
	if roots != 48 {
		t.Fatalf("%d open-loop roots, want 48 agents", roots)
	}
	// Every session grows past 100k.
	maxIn := make(map[int]int)
	for _, r := range w.Trace {
		maxIn[r.Session] = max(maxIn[r.Session], r.Input)
	}
	for sess, m := range maxIn {
		if m <= 100000 {
			t.Fatalf("session %d peaks at %d tokens, want > 100000", sess, m)
		}
	}
}

func TestSharedPrefixShape(t *testing.T) {
	w := gen(t, "shared-prefix", Options{Seed: 1, Replicas: 8})
	s := w.Trace.Stats()
	if s.Groups != 150 || s.Requests != 150*5*3 || s.ClosedLoop != 0 {
		t.Fatalf("stats = %+v, want 150 groups, 2250 open-loop requests", s)
	}
	for _, r := range w.Trace {
		q := r.Input - r.Prefix
		if r.Prefix != 6144 || q < 1000 || q > 1400 || r.Output < 800 || r.Output > 1200 {
			t.Fatalf("row %+v outside the declared shape", r)
		}
	}
	// The ladder: the last third arrives about four times as fast as the
	// first.
	n := len(w.Trace) / 3
	first := w.Trace[n-1].At - w.Trace[0].At
	last := w.Trace[3*n-1].At - w.Trace[2*n].At
	if ratio := first / last; ratio < 3 || ratio > 5 {
		t.Fatalf("first/last step duration ratio %.2f, want about 4", ratio)
	}
	// Rate per replica: 8 replicas at 0.15 req/s each send the first 750
	// in about 625 s.
	if first < 540 || first > 710 {
		t.Fatalf("first step lasts %.0f s, want about 625", first)
	}
}

func TestHotspotShape(t *testing.T) {
	w := gen(t, "hotspot", Options{Seed: 1})
	by := countBy(w.Trace, func(r Request) int { return r.Group })
	share := float64(by[0]) / float64(len(w.Trace))
	if share < 0.75 || share > 0.85 {
		t.Fatalf("group 0 carries %.2f of requests, want about 0.8", share)
	}
	if len(by) != 10 {
		t.Fatalf("%d groups, want 10", len(by))
	}
}

// TestHotspotScalesWithFleet: hotspot sends 75 sessions per replica, so its
// duration (and the requests per replica its max/mean load counts) does not
// shrink as the fleet grows; hotspot-600 keeps the fixed size it had, and at
// 8 replicas both are the same trace.
func TestHotspotScalesWithFleet(t *testing.T) {
	sessions := func(w *Workload) int { return len(countBy(w.Trace, func(r Request) int { return r.Session })) }
	span := func(w *Workload) float64 { return w.Trace[len(w.Trace)-1].At - w.Trace[0].At }
	at8 := gen(t, "hotspot", Options{Seed: 2, Replicas: 8})
	at64 := gen(t, "hotspot", Options{Seed: 2, Replicas: 64})
	if got := sessions(at8); got != 600 {
		t.Fatalf("hotspot at 8 replicas: %d sessions, want 600", got)
	}
	if got := sessions(at64); got != 4800 {
		t.Fatalf("hotspot at 64 replicas: %d sessions, want 4800", got)
	}
	if r := span(at64) / span(at8); r < 0.85 || r > 1.15 {
		t.Fatalf("hotspot lasts %.1f s at 64 replicas and %.1f s at 8, want about the same", span(at64), span(at8))
	}
	old := gen(t, "hotspot-600", Options{Seed: 2, Replicas: 256})
	if got := sessions(old); got != 600 {
		t.Fatalf("hotspot-600 at 256 replicas: %d sessions, want 600", got)
	}
	if diff := cmp.Diff(at8.Trace, gen(t, "hotspot-600", Options{Seed: 2, Replicas: 8}).Trace); diff != "" {
		t.Fatalf("hotspot and hotspot-600 differ at 8 replicas (-hotspot +600):\n%s", diff)
	}
}

func TestSpecPairShape(t *testing.T) {
	for _, name := range []string{"spec-pair", "spec-pair-cold"} {
		t.Run(name, func(t *testing.T) { testSpecPairShape(t, name) })
	}
}

func testSpecPairShape(t *testing.T, name string) {
	w := gen(t, name, Options{Seed: 1})
	groups := countBy(w.Trace, func(r Request) int { return r.Group })
	if shared := len(groups) == 1; shared != (name == "spec-pair") {
		t.Fatalf("%d groups", len(groups))
	}
	if w.Replicas != 2 || !slices.Equal(w.Speculative, []int{0}) {
		t.Fatalf("fleet = %d replicas, speculative %v; want 2, [0]", w.Replicas, w.Speculative)
	}
	short, long := 0, 0
	for _, r := range w.Trace {
		switch {
		case r.Output <= 128:
			short++
		case r.Output >= 1024:
			long++
		default:
			t.Fatalf("row %d output %d is neither short nor long", r.ID, r.Output)
		}
	}
	if short < len(w.Trace)/3 || long < len(w.Trace)/3 {
		t.Fatalf("short %d, long %d: want a mix", short, long)
	}
	// Concurrency: phase one is one chain of 40; phase two is 32 chains
	// that start when phase one ends.
	children := countBy(w.Trace, func(r Request) int { return r.After })
	if children[-1] != 1 {
		t.Fatalf("%d roots, want 1", children[-1])
	}
	fan := 0
	for _, n := range children {
		fan = max(fan, n)
	}
	if fan != 32 {
		t.Fatalf("widest fan-out %d, want 32", fan)
	}
}

func TestTraceRoundTrip(t *testing.T) {
	w := gen(t, "hotspot", Options{Seed: 3, Scale: 0.1})
	var j, c bytes.Buffer
	if err := w.Trace.WriteJSONL(&j); err != nil {
		t.Fatal(err)
	}
	if err := w.Trace.WriteCSV(&c); err != nil {
		t.Fatal(err)
	}
	for name, buf := range map[string]*bytes.Buffer{"jsonl": &j, "csv": &c} {
		got, err := Read(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(w.Trace, got); diff != "" {
			t.Fatalf("%s round trip (-want +got):\n%s", name, diff)
		}
	}
}

func TestTraceValidate(t *testing.T) {
	ok := Request{ID: 0, After: -1, Session: 1, Group: 2, Prefix: 10, Input: 50, Output: 5}
	next := Request{ID: 1, After: 0, Session: 1, Turn: 1, Group: 2, Prefix: 10, Input: 60, Output: 5}
	tests := []struct {
		name    string
		give    Trace
		wantErr string
	}{
		{"fine", Trace{ok, next}, ""},
		{"id", Trace{ok, func() Request { r := next; r.ID = 5; return r }()}, "id 5"},
		{"forward dependency", Trace{func() Request { r := ok; r.After = 0; return r }()}, "earlier id"},
		{"prefix past input", Trace{func() Request { r := ok; r.Prefix = 60; return r }()}, "within input"},
		{"turn gap", Trace{ok, func() Request { r := next; r.Turn = 2; return r }()}, "follows turn"},
		{"history lost", Trace{ok, func() Request { r := next; r.Input = 54; return r }()}, "shorter than the previous"},
		{"group change", Trace{ok, func() Request { r := next; r.Group = 3; return r }()}, "group or prefix"},
		{"late start", Trace{func() Request { r := ok; r.Turn = 1; return r }()}, "starts at turn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestReadRejects(t *testing.T) {
	tests := []struct {
		name, give, wantErr string
	}{
		{"unknown field", `{"id":0,"at":0,"after":-1,"session":0,"turn":0,"group":0,"prefix":0,"input":5,"output":1,"text":"x"}`, "unknown field"},
		{"bad csv number", "id,at,after,think,session,turn,group,prefix,input,output\n0,x,-1,0,0,0,0,0,5,1\n", "column at"},
		{"missing column", "id,at\n0,0\n", "lacks column"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tt.give))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Read = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSynthStructure(t *testing.T) {
	w := gen(t, "agent-fleet", Options{Seed: 2, Scale: 0.3})
	s := Synth{Salt: 9}
	bySession := make(map[int][]Request)
	for _, r := range w.Trace {
		bySession[r.Session] = append(bySession[r.Session], r)
	}
	var a, b []uint32
	checked := 0
	for _, turns := range bySession {
		for k, r := range turns {
			a = s.Prompt(a[:0], r)
			if len(a) != r.Input {
				t.Fatalf("prompt of row %d has %d tokens, want %d", r.ID, len(a), r.Input)
			}
			// The segments concatenate to the prompt.
			segs, err := Segments(turns[:k], r)
			if err != nil {
				t.Fatal(err)
			}
			b = b[:0]
			for _, g := range segs {
				b = s.Tokens(b, r, g)
			}
			if !slices.Equal(a, b) {
				t.Fatalf("row %d: segments do not concatenate to the prompt", r.ID)
			}
			if k == 0 {
				continue
			}
			// Turn k begins with turn k-1's prompt and output.
			p := turns[k-1]
			b = s.Completion(s.Prompt(b[:0], p), p)
			if !slices.Equal(a[:len(b)], b) {
				t.Fatalf("row %d does not begin with its previous turn plus output", r.ID)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no multi-turn session checked")
	}
	// Same group, same prefix; different sessions diverge after it.
	r0, r1 := bySession[0][0], bySession[1][0]
	a = s.Prompt(a[:0], r0)
	b = s.Prompt(b[:0], r1)
	if !slices.Equal(a[:r0.Prefix], b[:r1.Prefix]) {
		t.Fatal("same group, different prefixes")
	}
	if slices.Equal(a[r0.Prefix:r0.Prefix+16], b[r1.Prefix:r1.Prefix+16]) {
		t.Fatal("two sessions share tokens past the prefix")
	}
	// Different salts share nothing.
	c := Synth{Salt: 10}.Prompt(nil, r0)
	if slices.Equal(a[:16], c[:16]) {
		t.Fatal("different salts gave the same tokens")
	}
	for _, tok := range a {
		if tok >= Vocab {
			t.Fatalf("token %d outside the vocabulary", tok)
		}
	}
}
