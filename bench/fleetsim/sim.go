package fleetsim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// synthBudget bounds the tokens a run keeps of the streams it synthesised
// (4 bytes each: 64 MiB), so that a session's later turns copy their
// context instead of recomputing it.
const synthBudget = 1 << 24

// Defaults of a run's fleet.
const (
	// DefaultMaxModelLen lets agent contexts pass 100k tokens (Qwen3-32B
	// with YaRN serves 131072).
	DefaultMaxModelLen = 131072
	// DefaultSpecTokens is the draft length of speculative replicas
	// (EAGLE-class, vLLM num_speculative_tokens 3).
	DefaultSpecTokens = 3
)

// Config describes one simulation run.
type Config struct {
	// Workload is the trace and its fleet requirements.
	Workload *workload.Workload
	// Replicas is the fleet size (the workload's own Replicas, when set,
	// wins).
	Replicas int
	// Engine is every replica's engine model; zero fields take the
	// engine's defaults, and MaxModelLen defaults to DefaultMaxModelLen.
	Engine engine.Config
	// SpecTokens is the draft length of the workload's speculative
	// replicas; 0 means DefaultSpecTokens.
	SpecTokens int
	// Policy routes the requests; a Policy serves one run.
	Policy Policy
	// Salt separates the synthesised tokens of different runs; runs that
	// are compared must use the same salt.
	Salt uint64
}

// Record is one request's outcome.
type Record struct {
	ID      int
	Replica int
	// Sent, First and Done are simulated times in seconds.
	Sent, First, Done float64
	Prompt, Cached    int
	Output            int
	// Err is set when the engine refused the request.
	Err string
}

// TTFT is the time to first token in seconds.
func (r Record) TTFT() float64 { return r.First - r.Sent }

// Result is a run's outcome.
type Result struct {
	Policy   string
	Workload string
	Replicas int
	Records  []Record
	// Routed counts requests per replica.
	Routed []int
	// Engine holds each replica's final engine counters.
	Engine []engine.Stats
	// Wall is the real time the run took.
	Wall time.Duration
}

// arrival is a pending send.
type arrival struct {
	at time.Duration
	id int
}

type arrivals []arrival

func (a arrivals) Len() int { return len(a) }
func (a arrivals) Less(i, j int) bool {
	if a[i].at != a[j].at {
		return a[i].at < a[j].at
	}
	return a[i].id < a[j].id
}
func (a arrivals) Swap(i, j int) { a[i], a[j] = a[j], a[i] }
func (a *arrivals) Push(x any)   { *a = append(*a, x.(arrival)) }
func (a *arrivals) Pop() any {
	old := *a
	x := old[len(old)-1]
	*a = old[:len(old)-1]
	return x
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

// Run simulates cfg to completion: every request of the trace is sent,
// routed and finished (or refused).
func Run(cfg Config) (*Result, error) {
	w := cfg.Workload
	if w == nil || cfg.Policy == nil {
		return nil, errors.New("fleetsim: workload and policy are required")
	}
	n := cfg.Replicas
	if w.Replicas > 0 {
		n = w.Replicas
	}
	if n < 1 || n > selection.MaxReplicas {
		return nil, fmt.Errorf("fleetsim: replicas must be in [1, %d], got %d", selection.MaxReplicas, n)
	}
	start := time.Now()
	ecfg := cfg.Engine
	if ecfg.MaxModelLen == 0 {
		ecfg.MaxModelLen = DefaultMaxModelLen
	}
	spec := cfg.SpecTokens
	if spec == 0 {
		spec = DefaultSpecTokens
	}
	_, wantHashes := cfg.Policy.(interface{ wantsEngineHashes() })

	fleet := make([]*Replica, n)
	engines := make([]*engine.Engine, n)
	for i := range fleet {
		ec := ecfg
		ec.Seed = ecfg.Seed + uint64(i)
		rep := &Replica{ID: i}
		for _, s := range w.Speculative {
			if s == i {
				rep.Speculative = true
				ec.SpecTokens = spec
			}
		}
		ec.SetDefaults()
		if err := ec.Validate(); err != nil {
			return nil, fmt.Errorf("fleetsim: engine config: %w", err)
		}
		rep.KVCapacity = ec.TotalBlocks() * ec.BlockSize
		e := engine.New(ec)
		rep.eng = e
		if wantHashes {
			rep.cached = make(map[uint64]struct{})
			e.SetKVEventHandler(rep.mirror)
		}
		if kf, ok := cfg.Policy.(kvFed); ok {
			kf.attach(i, e)
		}
		fleet[i], engines[i] = rep, e
	}
	bs := engines[0].Config().BlockSize
	hashSeed := engines[0].Config().HashSeed

	tr := w.Trace
	synth := workload.NewSynthCache(workload.Synth{Salt: cfg.Salt}, synthBudget)
	children := make(map[int][]int)
	var pending arrivals
	for _, r := range tr {
		if r.After >= 0 {
			children[r.After] = append(children[r.After], r.ID)
		} else {
			pending = append(pending, arrival{seconds(r.At), r.ID})
		}
	}
	heap.Init(&pending)

	res := &Result{
		Policy:   cfg.Policy.Name(),
		Workload: w.Name,
		Replicas: n,
		Records:  make([]Record, len(tr)),
		Routed:   make([]int, n),
	}
	live := make(map[int]*Request)
	var evs []engine.Event
	now := time.Duration(0)
	scraper, _ := cfg.Policy.(engineScraper)

	complete := func(id int, at time.Duration) {
		for _, c := range children[id] {
			r := tr[c]
			heap.Push(&pending, arrival{max(at+seconds(r.Think), seconds(r.At)), c})
		}
		delete(children, id)
	}

	steps := newStepQueue(n)
	nextStep := func(r int) (time.Duration, bool) { return engines[r].NextEventTime() }
	for {
		// The next engine step end, lowest replica first on ties. Only
		// the engines touched since the last event can have moved.
		nextE, which := steps.refresh(nextStep)
		if which < 0 {
			nextE = time.Duration(math.MaxInt64)
		}
		nextA := time.Duration(math.MaxInt64)
		if len(pending) > 0 {
			nextA = pending[0].at
		}
		if which < 0 && len(pending) == 0 {
			break
		}
		if scraper != nil {
			scraper.ScrapeEngines(min(nextE, nextA), fleet)
		}
		if which >= 0 && nextE <= nextA {
			now = nextE
			e := engines[which]
			evs = e.AdvanceTo(now, evs[:0])
			steps.touch(which)
			for _, ev := range evs {
				id := int(ev.ID)
				rq := live[id]
				rec := &res.Records[id]
				switch ev.Kind {
				case engine.EventFirstToken:
					rec.First = ev.At.Seconds()
					rec.Cached = ev.Usage.CachedTokens
					if o, ok := cfg.Policy.(usageObserver); ok {
						o.Observe(rq, which, ev.Usage)
					}
					cfg.Policy.FirstToken(rq, which)
				case engine.EventFinished:
					rec.Done = ev.At.Seconds()
					rec.Cached = ev.Usage.CachedTokens
					fleet[which].InFlight--
					cfg.Policy.Done(rq, which)
					delete(live, id)
					complete(id, ev.At)
				}
			}
			continue
		}
		a := heap.Pop(&pending).(arrival)
		now = a.at
		row := tr[a.id]
		rq := &Request{Row: row}
		rq.Prompt = synth.Prompt(make([]uint32, 0, row.Input), row)
		rq.Output = synth.Completion(make([]uint32, 0, row.Output), row)
		if wantHashes {
			rq.engHashes = engineHashes(hashSeed, bs, rq.Prompt)
		}
		if kf, ok := cfg.Policy.(kvFed); ok {
			kf.setNow(now)
		}
		rep := cfg.Policy.Pick(rq, fleet)
		if rep < 0 || rep >= n {
			return nil, fmt.Errorf("fleetsim: policy %s picked replica %d of %d", cfg.Policy.Name(), rep, n)
		}
		rec := &res.Records[a.id]
		*rec = Record{ID: a.id, Replica: rep, Sent: now.Seconds(), Prompt: row.Input, Output: row.Output}
		e := engines[rep]
		e.AdvanceTo(now, nil) // an idle engine's clock catches up; a busy one's step ends later
		steps.touch(rep)
		err := e.Submit(engine.Request{ID: uint64(a.id), Prompt: rq.Prompt, MaxTokens: row.Output, Output: rq.Output})
		fleet[rep].Routed++
		res.Routed[rep]++
		if err != nil {
			rec.Err = err.Error()
			rec.Done = rec.Sent
			cfg.Policy.Done(rq, rep)
			complete(a.id, now)
			continue
		}
		fleet[rep].InFlight++
		live[a.id] = rq
		cfg.Policy.Routed(rq, rep)
	}
	if len(live) > 0 || len(children) > 0 {
		return nil, fmt.Errorf("fleetsim: %d requests never finished and %d closed-loop turns never started (engines idle)", len(live), len(children))
	}
	for _, e := range engines {
		res.Engine = append(res.Engine, e.Stats())
	}
	res.Wall = time.Since(start)
	return res, nil
}

// usageObserver is a Policy that learns from the usage each answer
// reports (usage.prompt_tokens and prompt_tokens_details.cached_tokens of
// the first chunk), as the module reads them from responses.
type usageObserver interface {
	Observe(r *Request, rep int, u engine.Usage)
}

// engineHashes is the engine's chain of block hashes over the prompt, as
// far as the engine can reuse it (full blocks of the first len-1 tokens).
func engineHashes(seed uint64, bs int, prompt []uint32) []uint64 {
	var out []uint64
	var parent uint64
	for i := 0; (i+1)*bs <= len(prompt)-1; i++ {
		parent = engine.HashBlock(seed, parent, prompt[i*bs:(i+1)*bs])
		out = append(out, parent)
	}
	return out
}

// mirror keeps the replica's precise index from its engine's KV events.
func (r *Replica) mirror(ev engine.KVEvent) {
	switch ev.Kind {
	case engine.BlockStored:
		for _, h := range ev.BlockHashes {
			r.cached[h] = struct{}{}
		}
	case engine.BlockRemoved:
		for _, h := range ev.BlockHashes {
			delete(r.cached, h)
		}
	case engine.AllBlocksCleared:
		clear(r.cached)
	}
}
