package selection

import (
	"fmt"
	"math"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func newTestRouter(t testing.TB, c Config, n int) (*Router, []Candidate) {
	t.Helper()
	rt, err := NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	cands := make([]Candidate, n)
	for i := range cands {
		s, err := rt.Register(fmt.Sprintf("127.0.0.1:%d", 8000+i))
		if err != nil {
			t.Fatal(err)
		}
		cands[i] = Candidate{Slot: s, Usable: true}
	}
	return rt, cands
}

// blocksOf returns n chained blocks of a prompt family: prompts with the
// same family share every block.
func blocksOf(family uint64, n int) []uint64 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(family)*1_000_003 + uint32(i)
	}
	return AppendTokenBlocks(nil, family, toks, 1)
}

func features(c Config, blocks []uint64, maxTokens int) *Features {
	return &Features{Blocks: blocks, PromptBytes: int(float64(len(blocks)*c.BlockTokens) * c.CharsPerToken), Seed: 1, MaxTokens: maxTokens}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    func(*Config)
		wantErr string
	}{
		{"defaults", func(*Config) {}, ""},
		{"cap", func(c *Config) { c.AffinityCap = -1 }, "affinity_cap"},
		{"alpha", func(c *Config) { c.Alpha = math.NaN() }, "alpha"},
		{"request cost", func(c *Config) { c.RequestCost = -5 }, "request_cost"},
		{"prefix", func(c *Config) { c.PrefixTokens = 8 }, "prefix_tokens"},
		{"chars", func(c *Config) { c.CharsPerToken = 100 }, "chars_per_token"},
		{"budget", func(c *Config) { c.IndexBudget = 10 }, "index_budget"},
		{"blocks bound", func(c *Config) { c.BlockTokens = 1; c.PrefixTokens = 1 << 20 }, "65536 blocks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{}
			c.SetDefaults()
			tt.give(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to name %q", err, tt.wantErr)
			}
		})
	}
}

func TestIndexDepths(t *testing.T) {
	x := NewIndex(1 << 20)
	a := blocksOf(1, 100)
	x.Learn(a[:40], 0)
	x.Learn(a[:100], 1)
	x.Learn(a[:1], 2)
	x.Learn(blocksOf(2, 50), 3)
	var interest mask
	for s := Slot(0); s < 5; s++ {
		interest.Add(s)
	}
	var depth [MaxReplicas]int32
	x.Depths(a, interest, &depth)
	if diff := cmp.Diff([]int32{40, 100, 1, 0, 0}, depth[:5]); diff != "" {
		t.Fatalf("depths (-want +got):\n%s", diff)
	}
	// Slots outside the interest set are not looked at.
	var only1 mask
	only1.Add(1)
	depth = [MaxReplicas]int32{}
	x.Depths(a, only1, &depth)
	if depth[0] != 0 || depth[1] != 100 {
		t.Fatalf("interest not honoured: %v", depth[:2])
	}
	x.Forget(1)
	depth = [MaxReplicas]int32{}
	x.Depths(a, interest, &depth)
	if depth[1] != 0 || depth[0] != 40 {
		t.Fatalf("after Forget(1): %v", depth[:3])
	}
}

// Depths agrees with a linear scan for every split point.
func TestIndexDepthsMatchesLinear(t *testing.T) {
	x := NewIndex(1 << 22)
	fam := blocksOf(7, 257)
	var interest mask
	for s := Slot(0); s < 100; s++ {
		x.Learn(fam[:(int(s)*37)%258], s)
		interest.Add(s)
	}
	var depth [MaxReplicas]int32
	x.Depths(fam, interest, &depth)
	for s := Slot(0); s < 100; s++ {
		want := 0
		for _, b := range fam {
			if !x.holds(b, s) {
				break
			}
			want++
		}
		if int(depth[s]) != want {
			t.Errorf("slot %d: depth %d, linear %d", s, depth[s], want)
		}
	}
}

func TestIndexEvictsOldestAndKeepsBudget(t *testing.T) {
	x := NewIndex(64 << 10)
	max := x.MaxEntries()
	for f := uint64(0); f < 200; f++ {
		x.Learn(blocksOf(f+1, 100), Slot(f%8))
	}
	if got := x.Entries(); got < int64(max)*3/4 || got > int64(max) {
		t.Fatalf("entries = %d, want about the budget's %d", got, max)
	}
	if x.Bytes() > x.Budget() {
		t.Fatalf("bytes %d over budget %d", x.Bytes(), x.Budget())
	}
	if x.Evictions() == 0 {
		t.Fatal("no evictions counted")
	}
	// The newest prompt is whole; the oldest is gone.
	var interest mask
	interest.Add(Slot(199 % 8))
	interest.Add(0)
	var depth [MaxReplicas]int32
	x.Depths(blocksOf(200, 100), interest, &depth)
	if depth[199%8] != 100 {
		t.Fatalf("newest prompt depth %d, want 100", depth[199%8])
	}
	depth = [MaxReplicas]int32{}
	x.Depths(blocksOf(1, 100), interest, &depth)
	if depth[0] != 0 {
		t.Fatalf("oldest prompt still held to depth %d", depth[0])
	}
}

// The index holds its budget (+10%) on the heap after 1M distinct prompts.
func TestIndexHeapWithinBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("1M prompts")
	}
	const budget = 32 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := NewIndex(budget)
	blocks := make([]uint64, 8)
	for p := uint64(0); p < 1_000_000; p++ {
		for i := range blocks {
			blocks[i] = mix64(p*8 + uint64(i) + 1)
		}
		x.Learn(blocks, Slot(p%64))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("index heap after 1M prompts: %.1f MiB (budget %.1f MiB, %d entries, %d evictions)",
		float64(heap)/(1<<20), float64(budget)/(1<<20), x.Entries(), x.Evictions())
	if heap > budget*11/10 {
		t.Fatalf("index heap %d bytes, over budget %d + 10%%", heap, budget)
	}
	runtime.KeepAlive(x)
}

func TestPickScoreAndReasons(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 1000, Alpha: 1, RequestCost: 100}
	rt, cands := newTestRouter(t, c, 4)
	// The score without the busy guard (TestBusyGuard): 9 and 11 requests
	// on one replica of 4 are past twice the mean.
	rt = rt.WithOptions(Options{HotGuard: -1})
	c = rt.Config()
	s := NewScratch(4)
	prompt := blocksOf(3, 200) // 3200 tokens
	f := features(c, prompt, 0)

	d := rt.Pick(f, cands, s)
	if d.Reason != ReasonCold || d.Tie != TieRendezvous || d.Usable != 4 {
		t.Fatalf("cold: %+v", d)
	}
	cold := d.Index
	rt.Learn(f, cands[cold].Slot)
	d = rt.Pick(f, cands, s)
	if d.Index != cold || d.Reason != ReasonAffinity || d.Overlap != 3200 || d.Score != 1000 {
		t.Fatalf("warm: %+v", d)
	}
	// Load on the warm replica: 9 requests * 100 = 900 < cap 1000: still wins.
	var rs []*Reservation
	for range 9 {
		rs = append(rs, rt.Reserve(cands[cold].Slot, 0))
	}
	if d = rt.Pick(f, cands, s); d.Index != cold || d.Score != 100 {
		t.Fatalf("loaded but warm: %+v", d)
	}
	// Two more: 1100 > 1000, a cold replica wins: load overrides affinity.
	rs = append(rs, rt.Reserve(cands[cold].Slot, 0), rt.Reserve(cands[cold].Slot, 0))
	d = rt.Pick(f, cands, s)
	if d.Index == cold || d.Reason != ReasonLoadOverride || d.BestOverlap != 3200 || d.Overlap != 0 {
		t.Fatalf("overloaded: %+v", d)
	}
	if got := s.Score[cold]; got != -100 {
		t.Fatalf("scratch score of the warm replica = %v, want -100", got)
	}
	for _, r := range rs {
		r.Release()
	}
	// Unusable replicas are filtered.
	cands[cold].Usable = false
	d = rt.Pick(f, cands, s)
	if d.Index == cold || d.Usable != 3 || !math.IsNaN(s.Score[cold]) {
		t.Fatalf("filtered: %+v", d)
	}
	for i := range cands {
		cands[i].Usable = false
	}
	if d = rt.Pick(f, cands, s); d.Index != -1 || d.Reason != ReasonNone {
		t.Fatalf("none usable: %+v", d)
	}
}

func TestPickPreciseOverlapReplacesEstimate(t *testing.T) {
	rt, cands := newTestRouter(t, Config{}, 3)
	c := rt.Config()
	f := features(c, blocksOf(5, 10), 0)
	rt.Learn(f, cands[0].Slot)
	cands[1].Precise, cands[1].Overlap = true, 5000
	s := NewScratch(3)
	d := rt.Pick(f, cands, s)
	if d.Index != 1 || s.Overlap[0] != 640 || s.Overlap[1] != 5000 {
		t.Fatalf("%+v overlaps %v", d, s.Overlap)
	}
}

func TestPickTieBreaks(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 4096, AffinityCap: 160, Alpha: 1, RequestCost: 1, LongOutputTokens: 500}
	prompt := blocksOf(9, 30) // 480 tokens, capped at 160

	t.Run("deeper raw overlap", func(t *testing.T) {
		rt, cands := newTestRouter(t, c, 3)
		rt.Index().Learn(prompt[:20], cands[0].Slot)
		rt.Index().Learn(prompt[:30], cands[2].Slot)
		d := rt.Pick(features(rt.Config(), prompt, 0), cands, NewScratch(3))
		if d.Index != 2 || d.Tie != TieDepth || d.Reason != ReasonAffinity {
			t.Fatalf("%+v", d)
		}
	})
	t.Run("profile", func(t *testing.T) {
		c := c
		c.OutputWeight = 1e-6 // the profile's score term stays within TieEpsilon
		rt, cands := newTestRouter(t, c, 4)
		cands[1].Profile = ProfileSpeculative
		s := NewScratch(4)
		long := rt.Pick(features(rt.Config(), prompt, 2000), cands, s)
		if long.Index != 1 || long.Tie != TieProfile {
			t.Fatalf("long output: %+v", long)
		}
		short := rt.Pick(features(rt.Config(), prompt, 50), cands, s)
		if short.Index == 1 || short.Tie != TieRendezvous {
			t.Fatalf("short output: %+v", short)
		}
		// Without a requested length, the profile does not matter.
		none := rt.Pick(features(rt.Config(), prompt, 0), cands, s)
		if none.Tie == TieProfile {
			t.Fatalf("no length: %+v", none)
		}
	})
	t.Run("rendezvous agrees across instances and spreads families", func(t *testing.T) {
		seen := map[int]bool{}
		for fam := uint64(1); fam <= 64; fam++ {
			p := blocksOf(fam, 4)
			var picks []int
			for range 2 {
				rt, cands := newTestRouter(t, c, 8)
				picks = append(picks, rt.Pick(features(rt.Config(), p, 0), cands, NewScratch(8)).Index)
			}
			if picks[0] != picks[1] {
				t.Fatalf("family %d: instances disagree: %v", fam, picks)
			}
			seen[picks[0]] = true
		}
		if len(seen) < 7 {
			t.Fatalf("64 cold families used %d of 8 replicas", len(seen))
		}
	})
	t.Run("lower load within epsilon", func(t *testing.T) {
		cc := c
		cc.TieEpsilon = 10
		rt, cands := newTestRouter(t, cc, 2)
		// Same slot key twice cannot happen; force equal rendezvous by
		// offering the same slot under two indices.
		cands[1].Slot = cands[0].Slot
		s := NewScratch(2)
		d := rt.Pick(features(rt.Config(), prompt, 0), cands, s)
		if d.Index != 0 || d.Tie != TieOrder {
			t.Fatalf("%+v", d)
		}
	})
}

// A long requested output outweighs a little warm cache on a standard
// engine by OutputWeight per output token; a short one stays.
func TestPickOutputWeight(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 4096, OutputWeight: 4, LongOutputTokens: 1000}
	rt, cands := newTestRouter(t, c, 2)
	cands[1].Profile = ProfileSpeculative
	prompt := blocksOf(21, 100) // 1600 tokens, warm on the standard engine
	rt.Index().Learn(prompt, cands[0].Slot)
	s := NewScratch(2)
	long := rt.Pick(features(rt.Config(), prompt, 2000), cands, s)
	if long.Index != 1 || s.Score[1] != 8000 || s.Score[0] != 1600 {
		t.Fatalf("long output: %+v scores %v", long, s.Score)
	}
	short := rt.Pick(features(rt.Config(), prompt, 100), cands, s)
	if short.Index != 0 || s.Score[0] != 2000 {
		t.Fatalf("short output: %+v scores %v", short, s.Score)
	}
	bad := Config{}
	bad.SetDefaults()
	bad.OutputWeight = -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "output_weight") {
		t.Fatalf("negative output_weight: %v", err)
	}
}

// TestProfileQueue checks Options.ProfileQueue: where the usable
// replicas' profiles differ, the output bonus is not paid on a replica
// whose pending prefill exceeds the least pending one's by more than
// ProfileQueue x request_cost, so a long output no longer queues behind a
// burst's prefill on the speculative replica; within the limit, in a fleet
// of one profile, and with ProfileQueue -1 it is paid as before.
func TestProfileQueue(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 4096, OutputWeight: 4, LongOutputTokens: 1000, RequestCost: 100}
	rt, cands := newTestRouter(t, c, 2)
	cands[1].Profile = ProfileSpeculative
	s := NewScratch(2)
	long := features(rt.Config(), blocksOf(22, 10), 2000) // cold, bonus 8000 on the speculative replica
	r := rt.Reserve(cands[1].Slot, 150)                   // 150 pending: past the limit, 0 + 1 x 100
	defer r.Release()
	if d := rt.Pick(long, cands, s); d.Index != 0 || s.Score[1] != -250 {
		t.Fatalf("speculative replica 150 tokens of prefill behind: %+v scores %v, want the standard replica, no bonus (-100 - 150)", d, s.Score)
	}
	if d := rt.WithOptions(Options{ProfileQueue: -1}).Pick(long, cands, s); d.Index != 1 || s.Score[1] != 7750 {
		t.Fatalf("ProfileQueue -1: %+v scores %v, want the speculative replica at 8000 - 250", d, s.Score)
	}
	if d := rt.WithOptions(Options{ProfileQueue: 2}).Pick(long, cands, s); d.Index != 1 || s.Score[1] != 7750 {
		t.Fatalf("ProfileQueue 2 (limit 200 tokens): %+v scores %v, want the bonus paid", d, s.Score)
	}
	// The standard replica queues as much: the difference is 0, the bonus paid.
	r2 := rt.Reserve(cands[0].Slot, 150)
	defer r2.Release()
	if d := rt.Pick(long, cands, s); d.Index != 1 {
		t.Fatalf("both 150 behind: %+v scores %v, want the speculative replica", d, s.Score)
	}
	// One profile: a short output's bonus is paid on every replica, however queued.
	cands[1].Profile = ProfileStandard
	r3 := rt.Reserve(cands[1].Slot, 1000)
	defer r3.Release()
	short := features(rt.Config(), blocksOf(23, 10), 100)
	if rt.Pick(short, cands, s); s.Score[1] != 400-200-1150 {
		t.Fatalf("one profile: scores %v, want the bonus 400 on the queued replica too", s.Score)
	}
}

func TestRetuneSharesState(t *testing.T) {
	rt, cands := newTestRouter(t, Config{AffinityCap: 100}, 2)
	f := features(rt.Config(), blocksOf(4, 10), 0)
	rt.Learn(f, cands[1].Slot)
	r := rt.Reserve(cands[1].Slot, 7)
	tuned, err := rt.Retune(Config{AffinityCap: 5000, Alpha: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if tuned.Config().AffinityCap != 5000 || rt.Config().AffinityCap != 100 {
		t.Fatal("knobs not retuned")
	}
	if in, p := tuned.Load(cands[1].Slot); in != 1 || p != 7 {
		t.Fatalf("load not shared: %d %d", in, p)
	}
	if s, ok := tuned.Lookup(rt.Key(cands[0].Slot)); !ok || s != cands[0].Slot {
		t.Fatal("registry not shared")
	}
	sc := NewScratch(2)
	if d := tuned.Pick(f, cands, sc); d.BestOverlap != 640 || sc.Overlap[1] != 640 {
		t.Fatalf("index not shared: %+v", d)
	}
	// The retuned knobs apply: load (request_cost+7) x alpha 0.5.
	if got, want := sc.Score[1], 640-0.5*float64(DefaultRequestCost+7); got != want {
		t.Fatalf("score %v, want %v", got, want)
	}
	r.Release()
	if in, _ := rt.Load(cands[1].Slot); in != 0 {
		t.Fatal("release not seen by the original")
	}
	if _, err := rt.Retune(Config{BlockTokens: 16}); err == nil || !strings.Contains(err.Error(), "block_tokens") {
		t.Fatalf("retune across index shapes: %v", err)
	}
}

func TestReservationLifecycle(t *testing.T) {
	rt, cands := newTestRouter(t, Config{RequestCost: 10}, 1)
	s := cands[0].Slot
	r := rt.Reserve(s, 500)
	if in, p := rt.Load(s); in != 1 || p != 500 {
		t.Fatalf("reserved: %d %d", in, p)
	}
	if !r.PrefillDone() || r.PrefillDone() {
		t.Fatal("PrefillDone must take effect exactly once")
	}
	if in, p := rt.Load(s); in != 1 || p != 0 {
		t.Fatalf("after first token: %d %d", in, p)
	}
	var wg sync.WaitGroup
	released := make(chan bool, 8)
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); released <- r.Release() }()
	}
	wg.Wait()
	close(released)
	n := 0
	for ok := range released {
		if ok {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("Release took effect %d times", n)
	}
	if r.PrefillDone() {
		t.Fatal("PrefillDone after Release")
	}
	// Released before the first token: the pending prefill goes too.
	rt.Reserve(s, 300).Release()
	if in, p := rt.Load(s); in != 0 || p != 0 {
		t.Fatalf("after release: %d %d", in, p)
	}
}

// The two behaviours the rule exists for, with the default knobs: a
// conversation sticks while load is low, and a burst of concurrent requests
// sharing a long prefix spreads (their prefills are pending, so the warm
// replica's load outweighs its capped overlap).
func TestDefaultsStickAndSpread(t *testing.T) {
	rt, cands := newTestRouter(t, Config{}, 8)
	c := rt.Config()
	s := NewScratch(8)
	sys := blocksOf(11, 120) // 7680 tokens of shared system prompt

	// Sequential turns and a second conversation on the same system prompt.
	first := -1
	for turn := 1; turn <= 4; turn++ {
		conv := append(append([]uint64{}, sys...), blocksOf(uint64(100+turn), 4*turn)...)
		f := features(c, conv, 0)
		d := rt.Pick(f, cands, s)
		r := rt.Reserve(d.Slot, d.Prefill)
		rt.Learn(f, d.Slot)
		r.PrefillDone()
		r.Release()
		if first < 0 {
			first = d.Index
		} else if d.Index != first {
			t.Fatalf("turn %d moved from %d to %d (%v)", turn, first, d.Index, d.Reason)
		}
	}

	// A burst of 12 concurrent requests with a new long prefix.
	burst := blocksOf(12, 200)
	used := map[int]int{}
	var rs []*Reservation
	for range 12 {
		f := features(c, burst, 0)
		d := rt.Pick(f, cands, s)
		rs = append(rs, rt.Reserve(d.Slot, d.Prefill))
		rt.Learn(f, d.Slot)
		used[d.Index]++
	}
	if len(used) < 7 {
		t.Fatalf("burst of 12 used %d of 8 replicas: %v", len(used), used)
	}
	for _, r := range rs {
		r.Release()
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 8)
	c := rt.Config()
	prompt := blocksOf(1, 1024)
	for i, cd := range cands {
		rt.Index().Learn(prompt[:i*100], cd.Slot)
	}
	f := features(c, prompt, 300)
	s := NewScratch(8)
	allocs := testing.AllocsPerRun(200, func() {
		_ = rt.Pick(f, cands, s)
	})
	if allocs != 0 {
		t.Fatalf("Pick allocates %v times per decision", allocs)
	}
}

func TestParseDoesNotAllocate(t *testing.T) {
	c := Config{}
	c.SetDefaults()
	x := NewExtractor(c)
	f := x.NewFeatures()
	body := []byte(chatBodyOfSize(64 << 10))
	allocs := testing.AllocsPerRun(50, func() {
		if err := x.Parse(EndpointChat, body, f); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Parse allocates %v times per body", allocs)
	}
}

// chatBodyOfSize builds an agent-like chat body of about n bytes: tools, a
// long system prompt with escapes, alternating turns.
func chatBodyOfSize(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"qwen3-32b","stream":true,"max_tokens":512,"tools":[{"type":"function","function":{"name":"read_file","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}],"messages":[{"role":"system","content":"You are a coding agent.\nFollow the \"rules\" below.\n`)
	line := `Rule: keep functions small, test every change, and explain what you did in one line.\n`
	for b.Len() < n/4 {
		b.WriteString(line)
	}
	b.WriteString(`"}`)
	for turn := 0; b.Len() < n-200; turn++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"step %d: open internal/server/handler_%d.go and fix the failing test named TestHandler%d; the log says: expected 200, got 500"}`, turn, turn, turn)
		fmt.Fprintf(&b, `,{"role":"assistant","content":[{"type":"text","text":"I read the file and changed the status code handling in handler %d so that the error path returns 400 with an OpenAI-shaped body."}]}`, turn)
	}
	b.WriteString(`]}`)
	return b.String()
}

// selection must never import Caddy, ZMQ or anything beyond the standard
// library, xxhash and package duration (itself standard library only: its
// dependencies are listed here too).
func TestImportsOnlyStdlibAndXXHash(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/ramjet-llm/ramjet/selection", "github.com/cespare/xxhash/v2", "github.com/ramjet-llm/ramjet/duration":
		default:
			t.Errorf("selection depends on %s", p)
		}
	}
}
