package fleetsim

import (
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// Request is one routed request as policies see it.
type Request struct {
	// Row is the trace row.
	Row workload.Request
	// Prompt and Output are the synthesised token ids.
	Prompt []uint32
	Output []uint32

	blocks    [2]blockCache
	engHashes []uint64
}

type blockCache struct {
	size   int
	blocks []uint64
}

// Blocks returns the chained keys (selection.AppendTokenBlocks, seed 0) of
// the prompt's full blocks of size tokens. The two most recent sizes are
// kept.
func (r *Request) Blocks(size int) []uint64 {
	for i := range r.blocks {
		if r.blocks[i].size == size {
			return r.blocks[i].blocks
		}
	}
	b := selection.AppendTokenBlocks(nil, 0, r.Prompt, size)
	r.blocks[1] = r.blocks[0]
	r.blocks[0] = blockCache{size: size, blocks: b}
	return b
}

// Replica is one engine and what any router can observe of it.
type Replica struct {
	// ID is the replica's index, 0-based.
	ID int
	// Speculative reports that the engine runs speculative decoding.
	Speculative bool
	// InFlight counts the requests routed to it that have not completed
	// (what every router counts itself).
	InFlight int
	// Routed counts every request routed to it.
	Routed int
	// KVCapacity is the engine's KV cache capacity in tokens, as vLLM
	// publishes it (vllm:cache_config_info num_gpu_blocks x block_size).
	KVCapacity int

	eng engineView
	// cached mirrors the engine's prefix cache from its KV events (the
	// precise index a KV-event-driven router keeps).
	cached map[uint64]struct{}
}

// engineView is what policies may read of an engine: the metrics a
// router scrapes (vllm:num_requests_waiting, vllm:num_requests_running,
// vllm:kv_cache_usage_perc).
type engineView interface {
	Waiting() int
	Running() int
	KVUsage() float64
}

// Waiting is the engine's waiting queue length.
func (r *Replica) Waiting() int { return r.eng.Waiting() }

// Running is the engine's running batch size.
func (r *Replica) Running() int { return r.eng.Running() }

// KVUsage is the engine's KV cache usage in [0,1].
func (r *Replica) KVUsage() float64 { return r.eng.KVUsage() }

// CachedBlocks returns how many leading blocks of hashes (the engine's
// chain hashes of a prompt) the replica holds, from its KV events.
func (r *Replica) CachedBlocks(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := r.cached[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// Policy routes requests. A Policy serves one simulation run; the
// simulation calls it from one goroutine, in simulated-time order.
type Policy interface {
	// Name is the row label in tables.
	Name() string
	// Pick returns the index of the replica for r.
	Pick(r *Request, fleet []*Replica) int
	// Routed is called once r was submitted to fleet[rep].
	Routed(r *Request, rep int)
	// FirstToken is called when r's first token arrives.
	FirstToken(r *Request, rep int)
	// Done is called when r completes (or fails).
	Done(r *Request, rep int)
}

// hooks is a no-op base for policies that only pick.
type hooks struct{}

func (hooks) Routed(*Request, int)     {}
func (hooks) FirstToken(*Request, int) {}
func (hooks) Done(*Request, int)       {}
