package kvindex

import (
	"fmt"
	"net/http"
	"strconv"
)

// FeedSpec is one engine's event feed as an operator configures it (an
// entry of the ramjet policy's kv "engines"); Endpoints turns it into the
// subscriber endpoints of its ranks, PreciseEngines into a Precise's
// engines.
type FeedSpec struct {
	// Upstream is the engine's dial address exactly as in the upstream
	// list, e.g. "10.0.0.5:8000".
	Upstream string `json:"upstream"`
	// Events is the rank-0 PUB address, e.g. "tcp://10.0.0.5:5557"; rank r
	// publishes on its port plus r, as vLLM does.
	Events string `json:"events"`
	// Replay is the rank-0 replay ROUTER address, e.g.
	// "tcp://10.0.0.5:5558" (optional; strongly recommended).
	Replay string `json:"replay,omitempty"`
	// Ranks is the number of data-parallel ranks (the upstream is then
	// listed that many times). Default: 1.
	Ranks int `json:"ranks,omitempty"`
	// Scheme is how the engine's HTTP API is reached for the tokenize
	// preflight and the canary: "http" or "https" (as the reverse_proxy
	// transport reaches it). Default: "http".
	Scheme string `json:"scheme,omitempty"`
	// Bind makes Events an address ramjet binds and the engine's PUB
	// socket connects to (vLLM "endpoint": "tcp://<ramjet>:5557", llm-d's
	// usual setup), instead of the engine's address ramjet dials (vLLM's
	// default "tcp://*:5557"). Engines may share one bound address when
	// each has its own Topic. Rank r binds the port plus r. Default: dial.
	Bind bool `json:"bind,omitempty"`
	// Topic is this engine's topic (vLLM "topic"), overriding the policy's
	// kv_topic; required to tell apart engines sharing a bound address,
	// e.g. "kv@10.0.0.5:8000@<model>".
	Topic string `json:"topic,omitempty"`
	// Resolvers are the DNS servers ("host" or "host:port") a dialed
	// feed's host name is resolved with, like the reverse_proxy
	// transport's resolvers option. Default: the system's resolver.
	Resolvers []string `json:"resolvers,omitempty"`
}

// ValidateFeeds rejects unusable feeds, naming the entry: a missing
// upstream or events address, an upstream listed twice (the template "*"
// included), a scheme other than http or https, a rank count outside
// [1, MaxReplicas] (0 is the default, 1), an address Endpoints cannot
// offset by the rank or a template that cannot expand (template.go).
func ValidateFeeds(feeds []FeedSpec) error {
	seen := map[string]bool{}
	for i, e := range feeds {
		if e.Upstream == "" || e.Events == "" {
			return fmt.Errorf("engines[%d]: upstream and events are required", i)
		}
		if seen[e.Upstream] {
			return fmt.Errorf("engines[%d]: upstream %s listed twice", i, e.Upstream)
		}
		seen[e.Upstream] = true
		for _, r := range e.Resolvers {
			if _, err := resolverAddr(r); err != nil {
				return fmt.Errorf("engines[%d]: resolvers: %w", i, err)
			}
		}
		if e.Scheme != "" && e.Scheme != "http" && e.Scheme != "https" {
			return fmt.Errorf("engines[%d]: scheme must be http or https, got %q", i, e.Scheme)
		}
		if e.Ranks < 0 || e.Ranks > MaxReplicas {
			return fmt.Errorf("engines[%d]: ranks must be in [1,%d]", i, MaxReplicas)
		}
		if e.IsTemplate() {
			if err := e.validateTemplate(); err != nil {
				return fmt.Errorf("engines[%d]: %w", i, err)
			}
			continue
		}
		if _, err := e.Endpoints(""); err != nil {
			return fmt.Errorf("engines[%d]: %w", i, err)
		}
	}
	return nil
}

// Endpoints returns the engine's feeds, one per rank, keyed like the
// router's replicas: the dial address, plus "#rank" when it has several
// (selection.ReplicaKey). topic is the default topic, for a feed without
// its own.
func (e FeedSpec) Endpoints(topic string) ([]Endpoint, error) {
	ranks := max(e.Ranks, 1)
	if e.Topic != "" {
		topic = e.Topic
	}
	var eps []Endpoint
	for r := range ranks {
		ep, err := RankEndpoint(e.Upstream, e.Events, e.Replay, topic, r)
		if err != nil {
			return nil, err
		}
		if ranks == 1 {
			ep.Replica = e.Upstream
		}
		ep.Bind, ep.Resolvers = e.Bind, e.Resolvers
		eps = append(eps, ep)
	}
	return eps, nil
}

// PreciseEngines are the engines of a Precise for feeds (templates left
// out): one per rank,
// reached at scheme://upstream (http by default), each rank of a
// data-parallel engine with its rank in header rankHeader (vLLM's
// X-data-parallel-rank).
func PreciseEngines(feeds []FeedSpec, topic, rankHeader string) ([]PreciseEngine, error) {
	var out []PreciseEngine
	for _, e := range feeds {
		if e.IsTemplate() {
			continue // Precise.Bind expands it (PreciseConfig.Template)
		}
		eps, err := e.Endpoints(topic)
		if err != nil {
			return nil, err
		}
		scheme := e.scheme()
		for rank, ep := range eps {
			var hdr http.Header
			if len(eps) > 1 {
				hdr = http.Header{rankHeader: {strconv.Itoa(rank)}}
			}
			out = append(out, PreciseEngine{Feed: ep, BaseURL: scheme + "://" + e.Upstream, Header: hdr})
		}
	}
	return out, nil
}
