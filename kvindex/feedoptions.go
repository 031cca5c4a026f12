package kvindex

import (
	"errors"
	"fmt"
	"strings"
)

// FeedOptions are the engines' feeds as the ramjet directive takes them,
// one line each so that an environment variable can carry one: per-engine
// maps from the upstream's dial address, or one bound address for every
// engine.
type FeedOptions struct {
	// Events, Replay and Topics map an upstream to its rank-0 PUB
	// address, its rank-0 replay ROUTER address and its topic.
	Events, Replay, Topics map[string]string
	// Bind is the one address every engine's PUB socket connects to
	// (exclusive with Events).
	Bind string
	// Topic is the topic of every engine without its own.
	Topic string
}

// ParsePairs reads the "<upstream>=<value>" items of option name, each
// upstream once.
func ParsePairs(name string, args []string) (map[string]string, error) {
	m := map[string]string{}
	for _, a := range args {
		up, v, ok := strings.Cut(a, "=")
		if !ok || up == "" || v == "" {
			return nil, fmt.Errorf("%s: want <upstream>=<value>, got %q", name, a)
		}
		if _, dup := m[up]; dup {
			return nil, fmt.Errorf("%s: upstream %s listed twice", name, up)
		}
		m[up] = v
	}
	return m, nil
}

// On reports whether the options turn the precise path on.
func (o FeedOptions) On() bool { return len(o.Events) > 0 || o.Bind != "" }

// Feeds returns the feeds of the upstreams (dial addresses, schemes and
// rank counts in upstream order): every engine with an events address, or
// every engine on the bound address. An upstream named in the maps must
// be one of dials.
func (o FeedOptions) Feeds(dials, schemes []string, ranks []int) ([]FeedSpec, error) {
	if len(o.Events) > 0 && o.Bind != "" {
		return nil, fmt.Errorf("kv_events (dial) and kv_bind (bind) are exclusive: choose how the engines' PUB sockets connect")
	}
	known := map[string]bool{}
	for _, u := range dials {
		known[u] = true
	}
	for _, m := range []map[string]string{o.Events, o.Replay, o.Topics} {
		for up := range m {
			if !known[up] {
				return nil, fmt.Errorf("kv: %s is not one of the upstreams (write it as in the upstream list, host:port)", up)
			}
		}
	}
	var out []FeedSpec
	for i, up := range dials {
		e := FeedSpec{Upstream: up, Replay: o.Replay[up], Topic: o.Topics[up]}
		if ranks[i] > 1 {
			e.Ranks = ranks[i]
		}
		if schemes[i] == "https" {
			e.Scheme = "https"
		}
		if o.Bind != "" {
			e.Events, e.Bind = o.Bind, true
			if e.Topic == "" && len(dials) > 1 {
				return nil, fmt.Errorf("kv_bind: upstream %s needs its topic in kv_topics (engines sharing a bound socket are told apart by topic)", up)
			}
		} else if e.Events = o.Events[up]; e.Events == "" {
			continue // no feed: routed by the estimate
		}
		out = append(out, e)
	}
	return out, nil
}

// Set reads option name of the ramjet directive's precise-path lines
// (the arguments already split on commas and spaces): kv_events,
// kv_replay and kv_topics take <upstream>=<value> pairs, kv_bind and
// kv_topic one value; no value keeps the default. It reports false for
// another name.
func (o *FeedOptions) Set(name string, args []string) (bool, error) {
	var err error
	switch name {
	case "kv_events":
		o.Events, err = ParsePairs(name, args)
	case "kv_replay":
		o.Replay, err = ParsePairs(name, args)
	case "kv_topics":
		o.Topics, err = ParsePairs(name, args)
	case "kv_bind", "kv_topic":
		if len(args) > 1 {
			return true, fmt.Errorf("%s: want one value, got %d", name, len(args))
		}
		v := ""
		if len(args) == 1 {
			v = args[0]
		}
		if name == "kv_bind" {
			o.Bind = v
		} else {
			o.Topic = v
		}
	default:
		return false, nil
	}
	return true, err
}

// ParseFeedLine reads the arguments of the policy's kv_events line,
// <upstream> [dial|bind] <events> [<replay>], into a FeedSpec; the
// options of its block are read into the spec after.
func ParseFeedLine(args []string) (FeedSpec, error) {
	var e FeedSpec
	if len(args) >= 2 && (args[1] == "bind" || args[1] == "dial") {
		e.Bind = args[1] == "bind"
		args = append(args[:1:1], args[2:]...)
	}
	if len(args) < 2 || len(args) > 3 {
		return e, errors.New("want <upstream> [dial|bind] <events> [<replay>]")
	}
	e.Upstream, e.Events = args[0], args[1]
	if len(args) == 3 {
		e.Replay = args[2]
	}
	return e, nil
}
