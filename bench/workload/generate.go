package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
)

// Workload is a generated trace plus what it asks of the fleet.
type Workload struct {
	// Name is the workload's name (see Names).
	Name string
	// Summary says what it models, in one line.
	Summary string
	// Trace is the requests.
	Trace Trace
	// Replicas, when positive, is the replica count the workload is
	// defined for (spec-pair: 2), overriding the run's.
	Replicas int
	// Speculative lists the replicas (0-based) that run speculative
	// decoding.
	Speculative []int
}

// Options parameterise a generator.
type Options struct {
	// Seed makes a generated trace reproducible.
	Seed uint64
	// Replicas is the fleet size the open-loop rates are scaled to
	// (shared-prefix and hotspot send a rate per replica); 0 means 8.
	Replicas int
	// Scale multiplies the number of requests (sessions, agents' turns,
	// arrivals) of the larger workloads; 0 means 1. Tests use a small
	// scale; the declared shapes hold at 1.
	Scale float64
}

func (o *Options) setDefaults() {
	if o.Replicas <= 0 {
		o.Replicas = 8
	}
	if o.Scale <= 0 {
		o.Scale = 1
	}
}

func (o Options) scaled(n, least int) int {
	return max(least, int(math.Round(float64(n)*o.Scale)))
}

// Names lists the workloads, in the order the fleet simulation runs them.
// spec-pair-cold is spec-pair without the shared system prompt (every
// request cold), which isolates the output-length preference.
var Names = []string{"locality", "burst", "agent-fleet", "shared-prefix", "hotspot", "spec-pair", "spec-pair-cold"}

// Variants lists workloads Generate knows that "all" leaves out:
// hotspot-600 is hotspot at its size before it scaled with the fleet (600
// sessions whatever the replica count: 2.9 requests per replica at 256).
var Variants = []string{"hotspot-600"}

// Generate builds the named workload.
func Generate(name string, o Options) (*Workload, error) {
	o.setDefaults()
	stream := name
	if name == "hotspot-600" {
		stream = "hotspot" // the same draws: its first 600 sessions are hotspot's at 8 replicas
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x72616d6a6574^uint64(len(stream))))
	var w *Workload
	switch name {
	case "locality":
		w = locality(rng, o)
	case "burst":
		w = burst(rng, o)
	case "agent-fleet":
		w = agentFleet(rng, o)
	case "shared-prefix":
		w = sharedPrefix(rng, o)
	case "hotspot":
		w = hotspot(rng, o, o.scaled(75*o.Replicas, 20))
	case "hotspot-600":
		w = hotspot(rng, o, o.scaled(600, 20))
	case "spec-pair":
		w = specPair(rng, o, true)
	case "spec-pair-cold":
		w = specPair(rng, o, false)
	default:
		return nil, fmt.Errorf("unknown workload %q (want one of %s)", name, strings.Join(append(Names, Variants...), ", "))
	}
	w.Name = name
	if err := w.Trace.Validate(); err != nil {
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	return w, nil
}

// uniform returns an integer in [lo, hi].
func uniform(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// builder assigns IDs and keeps each session's last row, so that a next
// turn can extend it.
type builder struct {
	t    Trace
	last map[int]int // session -> ID of its latest turn
}

func newBuilder() *builder { return &builder{last: make(map[int]int)} }

// first adds turn 0 of a new session, sent at at (or after after, if >= 0).
func (b *builder) first(at float64, after int, think float64, session, group, prefix, user, output int) int {
	id := len(b.t)
	b.t = append(b.t, Request{
		ID: id, At: at, After: after, Think: think, Session: session, Group: group,
		Prefix: prefix, Input: prefix + user, Output: output,
	})
	b.last[session] = id
	return id
}

// next adds the session's next turn: its history plus user new tokens, sent
// think seconds after the previous turn completes.
func (b *builder) next(session int, think float64, user, output int) int {
	p := b.t[b.last[session]]
	id := len(b.t)
	b.t = append(b.t, Request{
		ID: id, At: p.At, After: p.ID, Think: think, Session: session, Turn: p.Turn + 1,
		Group: p.Group, Prefix: p.Prefix, Input: p.Input + p.Output + user, Output: output,
	})
	b.last[session] = id
	return id
}

// sorted renumbers the trace so that open-loop rows are ordered by arrival
// and every dependency still points backwards.
func (b *builder) sorted() Trace {
	t := b.t
	// Depth-respecting order: sort by At, breaking ties by original ID.
	// Every dependent row has At equal to its parent's and a larger ID,
	// so it sorts after it.
	order, newID := stableOrder(len(t), func(i, j int) bool { return t[i].At < t[j].At })
	out := make(Trace, len(t))
	for n, o := range order {
		r := t[o]
		r.ID = n
		if r.After >= 0 {
			r.After = newID[r.After]
		}
		out[n] = r
	}
	return out
}

// Locality: 8 apps x 24 sessions x 3 turns. Each app has a long system
// prompt (8k tokens); sessions start at random over 120 s, and each later
// turn follows the previous one after a short think time. (It had 3 apps x
// 4 sessions x 2 turns, 24 requests: too few for seed-to-seed spread to
// stay below the differences between policies.)
func locality(rng *rand.Rand, o Options) *Workload {
	b := newBuilder()
	const apps, prefix, turns = 8, 8192, 3
	sessions := o.scaled(24, 2)
	for a := range apps {
		for s := range sessions {
			sess := a*sessions + s
			b.first(rng.Float64()*120, -1, 0, sess, a, prefix, uniform(rng, 200, 600), uniform(rng, 150, 400))
			for range turns - 1 {
				b.next(sess, 1+2*rng.Float64(), uniform(rng, 100, 400), uniform(rng, 150, 400))
			}
		}
	}
	return &Workload{
		Summary: fmt.Sprintf("%d apps x %d sessions x %d turns, 8k-token app system prompts", apps, sessions, turns),
		Trace:   b.sorted(),
	}
}

// Burst: rounds of concurrent requests, each round one app (4k-token
// system prompt) sending 1.5 requests per replica (at least 12) at once;
// 8 rounds, 30 s apart, each of a different app.
func burst(rng *rand.Rand, o Options) *Workload {
	b := newBuilder()
	rounds := o.scaled(8, 1)
	n := max(12, o.Replicas*3/2)
	sess := 0
	for round := range rounds {
		for range n {
			b.first(30*float64(round), -1, 0, sess, round, 4096, uniform(rng, 256, 512), 256)
			sess++
		}
	}
	return &Workload{
		Summary: fmt.Sprintf("%d rounds, 30 s apart, of %d concurrent requests of one app (4k-token system prompt)", rounds, n),
		Trace:   b.sorted(),
	}
}

// AgentFleet: 48 coding agents in closed loop. Every agent shares a
// 20k-token system-and-tools prefix; each turn appends a tool call (the
// output) and its result, so contexts grow past 100k tokens; an agent whose
// context passes its limit starts a new task (session) at once. Agents start
// over the first 20 s; tool execution takes 0.5 to 3 s.
func agentFleet(rng *rand.Rand, o Options) *Workload {
	b := newBuilder()
	const agents, prefix = 48, 20000
	tasks := o.scaled(1, 1) // sessions per agent
	limit := 100000
	if o.Scale < 1 {
		limit = max(prefix+8000, int(100000*o.Scale))
	}
	sess := 0
	for range agents {
		after := -1
		at := rng.Float64() * 20
		for range tasks {
			id := b.first(at, after, 0, sess, 0, prefix, uniform(rng, 1000, 3000), uniform(rng, 200, 800))
			for b.t[id].Input <= limit {
				id = b.next(sess, 0.5+2.5*rng.Float64(), uniform(rng, 1500, 6000), uniform(rng, 200, 800))
			}
			after = id
			sess++
		}
	}
	return &Workload{
		Summary: "48 closed-loop coding agents, shared 20k-token prefix, contexts growing past 100k tokens",
		Trace:   b.sorted(),
	}
}

// SharedPrefix: 150 groups of a 6k-token prefix, 5 users each, 1.2k-token
// questions and 1k-token outputs. Every user asks one question in each step
// of a Poisson rate ladder (0.15, 0.3, 0.6 requests/s per replica; the
// last rung is past the capacity of a fleet that misses its cache). The
// prefixes (900k tokens) far exceed one replica's cache.
func sharedPrefix(rng *rand.Rand, o Options) *Workload {
	b := newBuilder()
	groups := o.scaled(150, 4)
	const users, prefix = 5, 6144
	ladder := []float64{0.15, 0.3, 0.6}
	t := 0.0
	type user struct{ g, u int }
	all := make([]user, 0, groups*users)
	for g := range groups {
		for u := range users {
			all = append(all, user{g, u})
		}
	}
	sess := 0
	for _, perReplica := range ladder {
		rate := perReplica * float64(o.Replicas)
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		for _, us := range all {
			t += rng.ExpFloat64() / rate
			b.first(t, -1, 0, sess, us.g, prefix, uniform(rng, 1000, 1400), uniform(rng, 800, 1200))
			sess++
		}
	}
	return &Workload{
		Summary: "150 groups x 5 users, 6k-token prefixes, 1.2k questions, 1k outputs, Poisson ladder 0.15/0.3/0.6 req/s per replica",
		Trace:   b.sorted(),
	}
}

// Hotspot: 10 apps with 3k-token system prompts; app 0 carries 80% of the
// requests. Poisson arrivals at 1.2 requests/s per replica; a quarter of the
// n sessions take a second turn. Hotspot's n is 75 per replica (600 at 8), so
// that every fleet size sees the same ~62 s of traffic: a fixed 600 lasted
// 2.4 s at 256 replicas and its max/mean load counted 2.9 requests each.
func hotspot(rng *rand.Rand, o Options, n int) *Workload {
	b := newBuilder()
	const apps, prefix = 10, 3072
	rate := 1.2 * float64(o.Replicas)
	t := 0.0
	for s := range n {
		t += rng.ExpFloat64() / rate
		app := 0
		if rng.Float64() >= 0.8 {
			app = 1 + rng.IntN(apps-1)
		}
		b.first(t, -1, 0, s, app, prefix, uniform(rng, 300, 1500), uniform(rng, 100, 500))
		if rng.Float64() < 0.25 {
			b.next(s, 1+3*rng.Float64(), uniform(rng, 100, 600), uniform(rng, 100, 500))
		}
	}
	return &Workload{
		Summary: fmt.Sprintf("10 apps (3k-token system prompts), one carries 80%% of traffic, 1.2 req/s per replica, %d sessions", n),
		Trace:   b.sorted(),
	}
}

// SpecPair: two replicas, replica 0 with speculative decoding. Half of the
// requests want short outputs (32-128 tokens), half long ones (1024-2048).
// Phase one runs them one at a time (concurrency 1); phase two, after it,
// with 32 concurrent closed-loop clients. With shared, every request
// begins with one 1024-token system prompt; without, each request is its
// own group with its own 1024-token system prompt (all cold).
func specPair(rng *rand.Rand, o Options, shared bool) *Workload {
	b := newBuilder()
	const prefix = 1024
	group := func(sess int) int {
		if shared {
			return 0
		}
		return sess
	}
	out := func() int {
		if rng.IntN(2) == 0 {
			return uniform(rng, 32, 128)
		}
		return uniform(rng, 1024, 2048)
	}
	sess := 0
	prev := -1
	for range o.scaled(40, 6) {
		prev = b.first(0, prev, 0, sess, group(sess), prefix, uniform(rng, 200, 800), out())
		sess++
	}
	barrier := prev
	for range 32 {
		prev := barrier
		for range o.scaled(8, 2) {
			prev = b.first(0, prev, 0, sess, group(sess), prefix, uniform(rng, 200, 800), out())
			sess++
		}
	}
	summary := "2 replicas (one speculative), short and long outputs, concurrency 1 then 32, shared 1k system prompt"
	if !shared {
		summary = "2 replicas (one speculative), short and long outputs, concurrency 1 then 32, no shared prefix"
	}
	return &Workload{
		Summary:     summary,
		Trace:       b.sorted(),
		Replicas:    2,
		Speculative: []int{0},
	}
}

// stableOrder returns the indices 0..n-1 stably sorted by less (which
// compares two indices) and its inverse: order[k] is the k-th index,
// rank[i] the position of index i.
func stableOrder(n int, less func(i, j int) bool) (order, rank []int) {
	order = make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return less(order[a], order[b]) })
	rank = make([]int, n)
	for k, i := range order {
		rank[i] = k
	}
	return order, rank
}
