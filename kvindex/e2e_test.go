package kvindex

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// modelEngine serves POST /v1/completions (prompt as token ids) from the
// deterministic engine model of bench/engine, and publishes the model's KV
// events over a real ZMQ PUB socket. Batches alternate between the
// positional and the map encoding; hashes are integers, or 8-byte strings
// when bytesHashes (vLLM sends bytes for its sha256-based hashes; one engine
// uses one kind).
type modelEngine struct {
	*httptest.Server
	pub *testPub

	mu        sync.Mutex
	e         *engine.Engine
	pending   []engine.KVEvent
	nextID    uint64
	published atomic.Uint64
	removals  int // BlockRemoved events published
	batches   int
	bytesHash bool
}

func newModelEngine(t *testing.T, cfg engine.Config, bytesHashes bool) *modelEngine {
	m := &modelEngine{pub: newTestPub(t, "", false), e: engine.New(cfg), bytesHash: bytesHashes}
	m.e.SetKVEventHandler(func(ev engine.KVEvent) { m.pending = append(m.pending, ev) })
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.Close)
	return m
}

func (m *modelEngine) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt    []uint32 `json:"prompt"`
		MaxTokens int      `json:"max_tokens"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.URL.Path != "/v1/completions" {
		http.Error(w, `{"error":{"message":"bad request","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	usage, err := m.complete(req.Prompt, max(req.MaxTokens, 1))
	if err != nil {
		http.Error(w, `{"error":{"message":"`+err.Error()+`","type":"server_error"}}`, http.StatusServiceUnavailable)
		return
	}
	json.NewEncoder(w).Encode(map[string]any{
		"object": "text_completion",
		"usage": map[string]any{"prompt_tokens": usage.PromptTokens,
			"completion_tokens":     usage.CompletionTokens,
			"prompt_tokens_details": map[string]any{"cached_tokens": usage.CachedTokens}},
	})
}

// complete runs one request to completion in simulated time and publishes
// the KV events it caused.
func (m *modelEngine) complete(prompt []uint32, maxTokens int) (engine.Usage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	id := m.nextID
	if err := m.e.Submit(engine.Request{ID: id, Prompt: prompt, MaxTokens: maxTokens}); err != nil {
		return engine.Usage{}, err
	}
	var usage engine.Usage
	var evs []engine.Event
	for done := false; !done; {
		next, ok := m.e.NextEventTime()
		if !ok {
			break
		}
		evs = m.e.AdvanceTo(next, evs[:0])
		for _, ev := range evs {
			if ev.ID == id && ev.Kind == engine.EventFinished {
				usage, done = ev.Usage, true
			}
		}
	}
	m.flush()
	return usage, nil
}

// flush publishes the pending KV events as one batch (under m.mu).
func (m *modelEngine) flush() {
	if len(m.pending) == 0 {
		return
	}
	enc := encoding(m.batches % 2)
	m.batches++
	hash := func(h uint64) any {
		if !m.bytesHash {
			return h
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], h)
		return b[:]
	}
	var evs []wireEvent
	for _, ev := range m.pending {
		w := wireEvent{Medium: "GPU", BlockSize: ev.BlockSize, Tokens: ev.TokenIDs}
		for _, h := range ev.BlockHashes {
			w.Hashes = append(w.Hashes, hash(h))
		}
		switch ev.Kind {
		case engine.BlockStored:
			w.Kind = KindBlockStored
			if ev.HasParent {
				w.Parent = hash(ev.ParentHash)
			}
		case engine.BlockRemoved:
			w.Kind = KindBlockRemoved
			m.removals++
		case engine.AllBlocksCleared:
			w = wireEvent{Kind: KindAllBlocksCleared}
		}
		evs = append(evs, w)
	}
	m.pending = m.pending[:0]
	m.pub.publish(encodeBatch(enc, float64(time.Now().UnixNano())/1e9, evs, 0), false)
	m.published.Add(1)
}

func (m *modelEngine) cachedPrefix(prompt []uint32) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.e.CachedPrefix(prompt)
}

func (m *modelEngine) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.e.Reset()
	m.flush()
}

// waitDelivered waits until the subscriber received everything published.
func (m *modelEngine) waitDelivered(t *testing.T, x *Index, r Replica, base uint64) {
	t.Helper()
	eventually(t, "event delivery", func() bool {
		return x.Stats(r).Messages >= base+m.published.Load()
	})
}

// workload returns prompts sharing a few system prefixes, with multi-turn
// growth, over a small vocabulary.
func workload(rng *rand.Rand, n, bs int) [][]uint32 {
	systems := make([][]uint32, 3)
	for i := range systems {
		systems[i] = make([]uint32, bs*(2+i))
		for j := range systems[i] {
			systems[i][j] = uint32(rng.IntN(500))
		}
	}
	var prompts [][]uint32
	for len(prompts) < n {
		p := append([]uint32{}, systems[rng.IntN(len(systems))]...)
		for turn := rng.IntN(3); turn >= 0 && len(prompts) < n; turn-- {
			for j := 0; j < bs+rng.IntN(3*bs); j++ {
				p = append(p, uint32(rng.IntN(500)))
			}
			prompts = append(prompts, append([]uint32{}, p...))
		}
	}
	return prompts
}

func TestEndToEndIndexAgreesWithEngine(t *testing.T) {
	for _, bytesHashes := range []bool{false, true} {
		t.Run(map[bool]string{false: "int hashes", true: "bytes hashes"}[bytesHashes], func(t *testing.T) {
			testEndToEnd(t, bytesHashes)
		})
	}
}

func testEndToEnd(t *testing.T, bytesHashes bool) {
	const bs = 4
	cfg := engine.Config{BlockSize: bs, CapacityTokens: 96 * bs, MaxModelLen: 4096}
	m := newModelEngine(t, cfg, bytesHashes)
	x := New(Config{BlockSize: bs})
	startSub(t, x, Endpoint{Replica: "engine#0", Events: m.pub.events})
	r, _ := x.Lookup("engine#0")
	m.pub.sync(t, x, r)
	base := x.Stats(r).Messages

	rng := rand.New(rand.NewPCG(7, 7))
	prompts := workload(rng, 150, bs)
	out := make([]int, 1)
	checked, warm := 0, 0
	for i, p := range prompts {
		if _, err := m.complete(p, 1+rng.IntN(8)); err != nil {
			t.Fatal(err)
		}
		m.waitDelivered(t, x, r, base)
		// Check the index against the engine on an earlier prompt (which
		// may have been evicted since) and on the one just sent.
		for _, q := range [][]uint32{prompts[rng.IntN(i+1)], p} {
			x.Overlap(x.Keys(nil, 0, q), out)
			got := min(out[0], (len(q)-1)/bs*bs) // engines recompute the last token
			want := m.cachedPrefix(q)
			if got != want {
				t.Fatalf("prompt %d (len %d): index overlap %d, engine caches %d; orphans %d, entries %d, engine blocks %d",
					i, len(q), got, want, x.Orphans(), x.Entries(), m.e.Stats().CachedBlocks)
			}
			checked++
			if want > 0 {
				warm++
			}
		}
	}
	if x.Evictions() != 0 || x.Orphans() != 0 || x.DecodeErrors() != 0 {
		t.Errorf("evictions %d orphans %d decode errors %d", x.Evictions(), x.Orphans(), x.DecodeErrors())
	}
	st := m.e.Stats()
	if warm < checked/3 || st.CachedBlocks == 0 || m.removals == 0 {
		t.Errorf("only %d of %d checks were warm, %d removals: the workload checks too little",
			warm, checked, m.removals)
	}
	// The engine evicted under its small capacity, and the index followed.
	if int(x.Entries()) != st.CachedBlocks {
		t.Errorf("index holds %d entries, engine %d cached blocks", x.Entries(), st.CachedBlocks)
	}
	t.Logf("%d checks (%d warm), %d entries, %d events (%d removals)", checked, warm, x.Entries(),
		x.EventsApplied(), m.removals)

	// An engine restart clears its cache: the replica is fenced, then
	// trusted again once events flow.
	m.reset()
	eventually(t, "a clear fence", func() bool { return x.Fences(FenceCleared) == 1 })
	if x.Fresh(r) || x.Entries() != 0 {
		t.Errorf("fresh %v entries %d after the engine reset", x.Fresh(r), x.Entries())
	}
	m.complete(prompts[0], 1)
	eventually(t, "fresh again", func() bool { return x.Fresh(r) })
}

func TestCanaryAgainstEngine(t *testing.T) {
	const bs = 4
	m := newModelEngine(t, engine.Config{BlockSize: bs, CapacityTokens: 64 * bs, MaxModelLen: 4096}, true)
	x := New(Config{BlockSize: bs})
	startSub(t, x, Endpoint{Replica: "engine#0", Events: m.pub.events})
	r, _ := x.Lookup("engine#0")
	m.pub.sync(t, x, r)
	base := x.Stats(r).Messages

	c, err := NewCanary(x, []CanaryTarget{{Replica: r, BaseURL: m.URL}}, CanaryConfig{Model: "m", Blocks: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	hits, misses := 0, 0
	for round := 0; round < 6; round++ {
		res, err := c.Probe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The first probe warms the prefix (and the replica is not fresh
		// before its first event); later ones find it or, once the other
		// traffic grew, find it evicted.
		switch {
		case round == 0:
			if res.Fresh || res.Actual != 0 {
				t.Errorf("first probe: %+v", res)
			}
		case res.Actual == 3*bs:
			hits++
		case res.Actual == 0:
			misses++
		default:
			t.Errorf("round %d: engine cached %d tokens", round, res.Actual)
		}
		m.waitDelivered(t, x, r, base)
		// Other traffic, enough to evict the canary prefix on some rounds.
		for i := 0; i < round*4; i++ {
			p := make([]uint32, 8*bs)
			for j := range p {
				p[j] = uint32(rng.IntN(1 << 20))
			}
			m.complete(p, 1)
		}
		m.waitDelivered(t, x, r, base)
	}
	if hits == 0 || misses == 0 {
		t.Errorf("%d hits and %d evictions: the test checks neither path", hits, misses)
	}
	acc, n := c.Accuracy()
	if n != 5 || acc != 1 || c.MeanAbsError() != 0 {
		t.Errorf("accuracy %v over %d probes, mean abs error %v", acc, n, c.MeanAbsError())
	}
	if c.Errors() != 0 || c.Unsupported() != 0 {
		t.Errorf("errors %d unsupported %d", c.Errors(), c.Unsupported())
	}
}

func TestCanaryErrorsAndLifecycle(t *testing.T) {
	x := New(Config{BlockSize: 4})
	r, _ := x.Register("a")
	if _, err := NewCanary(x, nil, CanaryConfig{Model: "m"}); err == nil {
		t.Error("no targets accepted")
	}
	if _, err := NewCanary(x, []CanaryTarget{{Replica: r}}, CanaryConfig{}); err == nil {
		t.Error("no model accepted")
	}
	noDetails := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"usage":{"prompt_tokens":10}}`))
	}))
	defer noDetails.Close()
	c, _ := NewCanary(x, []CanaryTarget{{Replica: r, BaseURL: noDetails.URL},
		{Replica: r, BaseURL: "http://127.0.0.1:1"}}, CanaryConfig{Model: "m", Interval: 5 * time.Millisecond})
	c.Start(context.Background())
	eventually(t, "both failure kinds", func() bool { return c.Unsupported() > 0 && c.Errors() > 0 })
	c.Close()
	if _, n := c.Accuracy(); n != 0 {
		t.Errorf("%d probes counted", n)
	}
}
