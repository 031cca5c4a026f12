package fleetsim

import (
	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// The live surface: what a benchmark adapter (bench/peerproxy) needs to
// run a Policy of this package in front of real engines over HTTP rather
// than in the simulation. It only builds the values Run builds; the
// policies' logic is the same.

// EngineView is what a live Replica's policy reads of its engine: the
// metrics a router scrapes (vllm:num_requests_waiting,
// vllm:num_requests_running, vllm:kv_cache_usage_perc).
type EngineView interface {
	Waiting() int
	Running() int
	KVUsage() float64
}

// NewLiveReplica returns replica id of a live fleet whose engine metrics
// are read from view, with KVCapacity kvCapacity tokens. With kvEvents its
// precise index (CachedBlocks) is kept by MirrorKV, as Run keeps it for
// the policies that read the engines' KV events (WantsEngineHashes). The
// caller counts InFlight and Routed as Run does.
func NewLiveReplica(id int, speculative bool, kvCapacity int, view EngineView, kvEvents bool) *Replica {
	r := &Replica{ID: id, Speculative: speculative, KVCapacity: kvCapacity, eng: view}
	if kvEvents {
		r.cached = make(map[uint64]struct{})
	}
	return r
}

// MirrorKV applies one of the engine's KV events to the replica's precise
// index (a replica made without kvEvents ignores it).
func (r *Replica) MirrorKV(ev engine.KVEvent) {
	if r.cached != nil {
		r.mirror(ev)
	}
}

// WantsEngineHashes reports whether p reads the engines' KV events (its
// requests need NewLiveRequest's engine hashes and its replicas MirrorKV).
func WantsEngineHashes(p Policy) bool {
	_, ok := p.(interface{ wantsEngineHashes() })
	return ok
}

// NewLiveRequest returns the Request of a live request: row (its ID must
// be unique among the requests in flight) and its prompt tokens as the
// engine tokenized them. With hashes, the engine's chained block hashes
// (seed and block size of the engine) are computed as Run computes them.
func NewLiveRequest(row workload.Request, prompt []uint32, hashes bool, seed uint64, blockSize int) *Request {
	r := &Request{Row: row, Prompt: prompt}
	if hashes {
		r.engHashes = engineHashes(seed, blockSize, prompt)
	}
	return r
}

// EngineHashes returns the engine's block hashes of r's prompt
// (NewLiveRequest with hashes), nil without.
func (r *Request) EngineHashes() []uint64 { return r.engHashes }
