package kvindex

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/selection"
)

// A feed template (a FeedSpec whose Upstream is TemplateUpstream) gives
// the event feed of every upstream without a feed of its own, for fleets
// whose engines are found at run time (reverse_proxy's dynamic upstreams):
// its Events, Replay and Topic name the upstream through placeholders,
// expanded with each replica's dial address when the router's pool first
// lists it (Precise.Bind). The feed stops, and the replica's entries and
// predictions are dropped, when the replica leaves the fleet
// (Precise.Depart); a replica that comes back starts cold.
//
//	{upstream.host}      the dial host, in brackets when IPv6 ("[::1]")
//	{upstream.port}      the dial port
//	{upstream.port+<n>}  the dial port plus n (several engines on one host)
//
// vLLM's default publisher binds tcp://*:5557 on the engine's host, so
// "tcp://{upstream.host}:5557" is the Kubernetes form. Templates dial: an
// address ramjet binds cannot follow the fleet. ({host} and {port} are the
// Caddyfile's shorthands for the request's host and port, so they are
// not used.)

// TemplateUpstream is the Upstream of a feed template.
const TemplateUpstream = "*"

// IsTemplate reports whether e is a feed template.
func (e FeedSpec) IsTemplate() bool { return e.Upstream == TemplateUpstream }

// expand replaces the placeholders of s with dial's host and port.
func expand(s, dial string) (string, error) {
	host, port, err := net.SplitHostPort(dial)
	if err != nil {
		return "", fmt.Errorf("upstream %q: %w", dial, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return "", fmt.Errorf("upstream %q: bad port", dial)
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("%q: unclosed {", s)
		}
		b.WriteString(s[:i])
		name := s[i+1 : i+j]
		switch {
		case name == "upstream.host":
			b.WriteString(host)
		case name == "upstream.port":
			b.WriteString(port)
		case strings.HasPrefix(name, "upstream.port+"):
			n, err := strconv.Atoi(strings.TrimPrefix(name, "upstream.port+"))
			if err != nil || n < 0 || p+n > 65535 {
				return "", fmt.Errorf("%q: bad port offset in {%s}", s, name)
			}
			b.WriteString(strconv.Itoa(p + n))
		case strings.HasPrefix(name, "http.request."):
			return "", fmt.Errorf("%q: {%s} is the request's (the Caddyfile's {host} and {port}); write {upstream.host} and {upstream.port}", s, name)
		default:
			return "", fmt.Errorf("%q: unknown placeholder {%s}; want {upstream.host}, {upstream.port} or {upstream.port+<n>}", s, name)
		}
		s = s[i+j+1:]
	}
}

// validateTemplate rejects a template that cannot expand: a bound address,
// an unknown placeholder, or an address that is not tcp://host:port once
// expanded for an IPv4 and an IPv6 upstream.
func (e FeedSpec) validateTemplate() error {
	if e.Bind {
		return errors.New("a template dials each upstream's engine; bind is not supported (list each engine on its own kv_events line)")
	}
	for _, dial := range []string{"127.0.0.1:8000", "[::1]:8000"} {
		if _, err := e.Expand(dial, "", ""); err != nil {
			return fmt.Errorf("template: %w", err)
		}
	}
	return nil
}

// Expand returns the engine the template e gives replica key (the
// router's: a dial address, plus "#rank" when e has several ranks), with
// topic as the default topic and rankHeader carrying a data-parallel
// rank. It fails for a key that does not match e's rank count.
func (e FeedSpec) Expand(key, topic, rankHeader string) (PreciseEngine, error) {
	ranks := max(e.Ranks, 1)
	dial, rank := key, 0
	if i := strings.LastIndexByte(key, '#'); i >= 0 {
		r, err := strconv.Atoi(key[i+1:])
		if err != nil || r < 0 || r >= ranks || ranks == 1 {
			return PreciseEngine{}, fmt.Errorf("replica %q: rank outside the template's %d", key, ranks)
		}
		dial, rank = key[:i], r
	} else if ranks > 1 {
		return PreciseEngine{}, fmt.Errorf("replica %q: the template has %d ranks", key, ranks)
	}
	c := e
	var err error
	if c.Events, err = expand(e.Events, dial); err != nil {
		return PreciseEngine{}, err
	}
	if c.Replay, err = expand(e.Replay, dial); err != nil {
		return PreciseEngine{}, err
	}
	if c.Topic, err = expand(e.Topic, dial); err != nil {
		return PreciseEngine{}, err
	}
	if c.Topic == "" {
		c.Topic = topic
	}
	ep, err := RankEndpoint(dial, c.Events, c.Replay, c.Topic, rank)
	if err != nil {
		return PreciseEngine{}, err
	}
	ep.Resolvers = e.Resolvers
	out := PreciseEngine{Feed: ep, BaseURL: c.scheme() + "://" + dial}
	if ranks == 1 {
		out.Feed.Replica = dial
	} else {
		out.Header = http.Header{rankHeader: {strconv.Itoa(rank)}}
	}
	return out, nil
}

func (e FeedSpec) scheme() string {
	if e.Scheme == "" {
		return "http"
	}
	return e.Scheme
}

// startFeed starts the template's feed for replica key (registering it,
// cold); false when the template does not expand for key, the index is
// at its replica cap, or p is closed.
func (p *Precise) startFeed(key string) (Replica, bool) {
	t := p.cfg.Template
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.dyn[key]; ok {
		return f.r, true
	}
	if p.closed || p.dynBad[key] {
		return -1, false
	}
	e, err := t.Feed.Expand(key, t.Topic, t.RankHeader)
	var r Replica
	if err == nil {
		r, err = p.x.Register(key)
	}
	if err != nil {
		if len(p.dynBad) < MaxReplicas {
			p.dynBad[key] = true
		}
		p.cfg.Logger.Warn("kv_events template: no feed for this upstream; routed by the estimate",
			zap.String("replica", key), zap.Error(err))
		return -1, false
	}
	ctx, cancel := context.WithCancel(p.dynCtx)
	f := &dynFeed{r: r, cancel: cancel, base: preciseBase{r: r, url: e.BaseURL, hdr: e.Header}}
	p.dyn[key] = f
	p.dynChanged()
	p.dynWG.Add(1)
	go func() {
		defer p.dynWG.Done()
		p.sub.run(ctx, e.Feed, r)
		p.x.Free(r) // a no-op unless Depart retired it
	}()
	p.cfg.Logger.Info("kv_events template: feed started", zap.String("replica", key),
		zap.String("events", e.Feed.Events))
	return r, true
}

// Depart is the fleet's departure of replica key from slot s (its
// OnUnregister hook; the slot is reused next): s is unbound and, for a
// template feed, the feed stops and the replica's entries and predictions
// are dropped (Index.Retire; FenceDeparted). A replica that comes back
// starts cold. Static feeds keep running.
func (p *Precise) Depart(s selection.Slot, key string) {
	if s >= 0 && int(s) < len(p.bySlot) {
		p.bySlot[s].Store(0)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.dynBad, key)
	f, ok := p.dyn[key]
	if !ok {
		return
	}
	delete(p.dyn, key)
	p.dynChanged()
	p.x.Retire(f.r) // before the feed ends, so that Free finds it retired
	f.cancel()
	p.cfg.Logger.Info("kv_events template: replica departed; feed stopped, its entries dropped", zap.String("replica", key))
}

// TemplateFeeds is the number of live template feeds.
func (p *Precise) TemplateFeeds() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.dyn)
}

// dynChanged republishes the engines the preflight and the canary choose
// from: the static ones and the template's live ones. Under p.mu.
func (p *Precise) dynChanged() {
	bases := append(make([]preciseBase, 0, len(p.static)+len(p.dyn)), p.static...)
	for _, f := range p.dyn {
		bases = append(bases, f.base)
	}
	p.bases.Store(&bases)
	if p.canary != nil {
		p.canary.setTargets(bases)
	}
}

// BindAll binds the slots of a router pool view to their replica keys
// (Bind), warning about a replica whose address has a static feed that
// does not reach it: the feed was configured under another rank count
// than how often the pool lists the address.
func (p *Precise) BindAll(slots []selection.Slot, keys []string) {
	for i, key := range keys {
		if p.Bind(slots[i], key) {
			continue
		}
		dial, ranks := key, 0
		if j := strings.LastIndexByte(key, '#'); j >= 0 {
			dial = key[:j]
		}
		for _, e := range p.cfg.Engines {
			if base, _, _ := strings.Cut(e.Feed.Replica, "#"); base == dial {
				ranks++
			}
		}
		if ranks > 0 {
			p.cfg.Logger.Warn("kv feed does not match the upstream list: check kv_events ranks against how often the address is listed",
				zap.String("replica", key), zap.Int("ranks", ranks))
		}
	}
}
