package fleetsim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/selection"
)

// Front is how a front balancer (a plain L4/L7 load balancer or a
// Kubernetes Service) splits the client traffic over router instances.
type Front int

const (
	// FrontRoundRobin deals the requests to the instances in turn.
	FrontRoundRobin Front = iota
	// FrontRandom sends each request to an instance drawn at random.
	FrontRandom
	// FrontClientHash sends every request of one session (one client
	// conversation, one agent task) to the same instance, by a hash of the
	// session id (session affinity, e.g. a Service's sessionAffinity or a
	// consistent hash on a client header).
	FrontClientHash
)

// FrontNames lists the front balancers by their flag names.
var FrontNames = []string{"rr", "random", "client-hash"}

// ParseFront parses a front balancer's flag name (FrontNames).
func ParseFront(s string) (Front, error) {
	for i, n := range FrontNames {
		if s == n {
			return Front(i), nil
		}
	}
	return 0, fmt.Errorf("unknown front %q (want one of %s)", s, strings.Join(FrontNames, ", "))
}

func (f Front) String() string {
	if int(f) >= 0 && int(f) < len(FrontNames) {
		return FrontNames[f]
	}
	return fmt.Sprintf("front(%d)", int(f))
}

// SyncSuffix marks a policy whose instances share one state (see
// NewMulti): "dynamo-sync" is Dynamo with router replica sync.
const SyncSuffix = "-sync"

// MultiPolicyNames lists the policies NewMulti models with several
// instances, each with its documented multi-router behaviour:
//
//   - ramjet: independent instances, no router-to-router traffic: each
//     its own selection.Router (own index, own reservations) over the same
//     replica keys, so the rendezvous placement of a cold prefix is the
//     same on every instance;
//   - sglang, sglang-tuned: the gateway without its mesh (no tree gossip):
//     each instance learns its own radix trees from its own traffic and
//     counts its own in-flight requests;
//   - dynamo, dynamo-tuned: KV router replicas without replica sync: every
//     instance reads the engines' KV events (the same cached blocks) but
//     tracks the active blocks and queued prefill of its own requests only;
//   - dynamo-sync, dynamo-tuned-sync: with router replica sync
//     (--router-replica-sync), every request's lifecycle is broadcast to
//     the other replicas, so all share one view; modelled as one shared
//     state with no propagation delay (an upper bound for sync).
//
// The ramjet experiment variants ("ramjet@k=v+...", e.g. "ramjet@el=1"
// scraping the engines every second) and ramjet-precise (each instance
// its own kvindex fed by every engine's KV events, as each instance's
// subscribers are) are independent instances too.
var MultiPolicyNames = []string{"ramjet", "sglang", "sglang-tuned", "dynamo", "dynamo-tuned", "dynamo-sync", "dynamo-tuned-sync"}

// SpillSep separates a multi-router policy name from the ramjet
// instances' ids (selection.Router.SetInstance): "ramjet~same" gives every
// instance position 0 (the shared spill order, the rule before
// instance-aware spill), "ramjet~inst=<id>" names instance 0 <id> and
// instance k <id>/k (hashed positions, as hostnames give). Without it,
// instance k is named k: ordinals, positions 0, 0.618, 0.236, ...
const SpillSep = "~"

// instanceIDs are the ramjet instances' ids for the spill spec after
// SpillSep (see SpillSep).
func instanceIDs(spec string, given bool, routers int) ([]string, error) {
	ids := make([]string, routers)
	switch id, named := strings.CutPrefix(spec, "inst="); {
	case !given:
		for k := range ids {
			ids[k] = fmt.Sprint(k)
		}
	case spec == "same":
	case named && id != "":
		for k := range ids {
			ids[k] = id
			if k > 0 {
				ids[k] = fmt.Sprintf("%s/%d", id, k)
			}
		}
	default:
		return nil, fmt.Errorf("spill %q: want %ssame or %sinst=<id>", spec, SpillSep, SpillSep)
	}
	return ids, nil
}

// Multi is several router instances of one policy in front of one fleet,
// with the client traffic split by a front balancer. The instances do not
// talk to each other: each sees the engines (their metrics, their KV
// events) and only its own requests. In-flight and routed counts of the
// fleet each instance reads are its own (what a router counts itself).
type Multi struct {
	label string
	front Front
	rng   *rand.Rand
	next  int

	inst []Policy
	// shared marks one state for every instance (replica sync): the
	// instances then read the fleet's own counts.
	shared bool
	views  [][]*Replica // per instance, its own counts over the shared engines
	owner  map[int]owned
	// Dispatched counts requests per instance.
	Dispatched []int
	// oracle hands each ramjet-precise instance the others' pending
	// prefill before its decision (OracleSpec: an experiment), known
	// oracleDelay after each request was routed (pend: the requests
	// routed and not at their first token, by trace ID).
	oracle      bool
	oracleDelay time.Duration
	now         time.Duration
	pend        map[int]pendingPrefill
}

type owned struct {
	inst   int
	routed bool
}

var (
	_ Policy        = (*Multi)(nil)
	_ engineScraper = (*Multi)(nil)
	_ usageObserver = (*Multi)(nil)
	_ kvFed         = (*Multi)(nil)
)

// multiHashes is a Multi whose instances read the engines' KV events
// (wantsEngineHashes).
type multiHashes struct{ *Multi }

func (multiHashes) wantsEngineHashes() {}

// NewMulti returns routers instances of the named policy (MultiPolicyNames)
// behind front. Instance k takes seed+k for its random choices (instance 0
// the seed a single instance takes), ramjet instances cfg. With one
// instance the result routes exactly as NewPolicy(name, seed, cfg).
func NewMulti(name string, routers int, front Front, seed uint64, cfg selection.Config) (Policy, error) {
	if routers < 1 {
		return nil, fmt.Errorf("multi %s: routers must be positive, got %d", name, routers)
	}
	pname, spill, hasSpill := strings.Cut(name, SpillSep)
	ps, precise, err := parsePreciseSpec(spill)
	if err != nil {
		return nil, fmt.Errorf("multi %s: %w", name, err)
	}
	if precise {
		hasSpill = false
	}
	known := strings.HasPrefix(pname, "ramjet@") || pname == "ramjet-precise" || strings.HasPrefix(pname, "ramjet-precise@")
	for _, n := range MultiPolicyNames {
		known = known || n == pname
	}
	if !known {
		return nil, fmt.Errorf("multi: policy %q has no multi-router model (want one of %s)", pname, strings.Join(MultiPolicyNames, ", "))
	}
	inst, err := instanceIDs(spill, hasSpill, routers)
	if precise && ps.inst != "" {
		inst, err = instanceIDs("inst="+ps.inst, true, routers)
	}
	if err != nil {
		return nil, fmt.Errorf("multi %s: %w", name, err)
	}
	base, shared := strings.CutSuffix(pname, SyncSuffix)
	m := &Multi{
		label:      fmt.Sprintf("%s x%d %s", name, routers, front),
		front:      front,
		rng:        rand.New(rand.NewPCG(seed, 0x66726f6e74)),
		shared:     shared,
		owner:      make(map[int]owned),
		Dispatched: make([]int, routers),
	}
	n := routers
	if shared {
		n = 1
	}
	hashes := false
	for k := range n {
		p, err := NewPolicy(base, seed+uint64(k), cfg)
		if err != nil {
			return nil, fmt.Errorf("multi %s instance %d: %w", name, k, err)
		}
		if rj, ok := p.(interface{ Router() *selection.Router }); ok {
			rj.Router().SetInstance(inst[k])
		}
		if _, ok := p.(kvFed); ok && !shared {
			if _, ok := p.(*RamjetPrecise); !ok {
				return nil, fmt.Errorf("multi: %s reads KV events through one engine hook per replica; not modelled with several instances", base)
			}
		}
		_, h := p.(interface{ wantsEngineHashes() })
		hashes = hashes || h
		m.inst = append(m.inst, p)
	}
	for range routers - n {
		m.inst = append(m.inst, m.inst[0])
	}
	m.views = make([][]*Replica, routers)
	if precise && (routers > 1 || ps.inst != "" || ps.foreign) {
		if err := m.enablePrecise(ps); err != nil {
			return nil, fmt.Errorf("multi %s: %w", name, err)
		}
	}
	if hashes {
		return multiHashes{m}, nil
	}
	return m, nil
}

// Name is the policy, the instance count and the front: "ramjet x4 rr".
func (m *Multi) Name() string { return m.label }

// Instances returns the instances' policies (one shared policy repeated
// for a sync variant).
func (m *Multi) Instances() []Policy { return m.inst }

// instance is the front balancer's choice for r.
func (m *Multi) instance(r *Request) int {
	k := len(m.inst)
	switch m.front {
	case FrontRandom:
		return m.rng.IntN(k)
	case FrontClientHash:
		var b [8]byte
		s := uint64(r.Row.Session)
		for i := range b {
			b[i] = byte(s >> (8 * i))
		}
		return int(xxhash.Sum64(b[:]) % uint64(k))
	}
	i := m.next % k
	m.next++
	return i
}

// view returns instance k's view of fleet: the same engines and KV
// events, its own in-flight and routed counts.
func (m *Multi) view(k int, fleet []*Replica) []*Replica {
	if m.shared {
		return fleet
	}
	v := m.views[k]
	for len(v) < len(fleet) {
		f := fleet[len(v)]
		v = append(v, &Replica{ID: f.ID, Speculative: f.Speculative, KVCapacity: f.KVCapacity, eng: f.eng, cached: f.cached})
	}
	m.views[k] = v
	return v[:len(fleet)]
}

func (m *Multi) Pick(r *Request, fleet []*Replica) int {
	k := m.instance(r)
	m.Dispatched[k]++
	m.owner[r.Row.ID] = owned{inst: k}
	v := m.view(k, fleet)
	if m.oracle {
		m.sharePending(k)
	}
	i := m.inst[k].Pick(r, v)
	if m.oracleDelay > 0 && i >= 0 {
		m.notePending(k, i, r)
	}
	return i
}

func (m *Multi) Routed(r *Request, rep int) {
	o, ok := m.owner[r.Row.ID]
	if !ok {
		return
	}
	o.routed = true
	m.owner[r.Row.ID] = o
	if !m.shared {
		v := m.views[o.inst][rep]
		v.InFlight++
		v.Routed++
	}
	m.inst[o.inst].Routed(r, rep)
}

func (m *Multi) FirstToken(r *Request, rep int) {
	delete(m.pend, r.Row.ID)
	if o, ok := m.owner[r.Row.ID]; ok {
		m.inst[o.inst].FirstToken(r, rep)
	}
}

func (m *Multi) Done(r *Request, rep int) {
	o, ok := m.owner[r.Row.ID]
	if !ok {
		return
	}
	delete(m.owner, r.Row.ID)
	delete(m.pend, r.Row.ID)
	if o.routed && !m.shared {
		m.views[o.inst][rep].InFlight--
	}
	m.inst[o.inst].Done(r, rep)
}

// ScrapeEngines lets every instance that scrapes the engines
// (engineScraper, e.g. ramjet with -engine-load) read them through its own
// view: the same engines, its own counts, so that what the engines report
// beyond its own reservations is the other instances' traffic. A shared
// (sync) state scrapes once.
func (m *Multi) ScrapeEngines(now time.Duration, fleet []*Replica) {
	for k, p := range m.inst {
		if m.shared && k > 0 {
			break
		}
		if sc, ok := p.(engineScraper); ok {
			sc.ScrapeEngines(now, m.view(k, fleet))
		}
	}
}

// Observe hands an answer's usage (its cached-token count) to the
// instance that routed it, as each router reads the answers it proxies.
func (m *Multi) Observe(r *Request, rep int, u engine.Usage) {
	o, ok := m.owner[r.Row.ID]
	if !ok {
		return
	}
	if uo, ok := m.inst[o.inst].(usageObserver); ok {
		uo.Observe(r, rep, u)
	}
}

// attach hands every instance that reads the engines' KV events
// (ramjet-precise: each its own kvindex) engine rep's events: one handler
// on the engine, fanning each event out to every instance in turn.
func (m *Multi) attach(rep int, e *engine.Engine) {
	var hs []func(engine.KVEvent)
	for k, p := range m.inst {
		if m.shared && k > 0 {
			break
		}
		if rp, ok := p.(*RamjetPrecise); ok {
			rp.attach(rep, e)
			hs = append(hs, rp.kvHandler(rep))
		} else if kf, ok := p.(kvFed); ok {
			kf.attach(rep, e) // one instance's hook (NewMulti allows no other)
			return
		}
	}
	if len(hs) > 0 {
		e.SetKVEventHandler(func(ev engine.KVEvent) {
			for _, h := range hs {
				h(ev)
			}
		})
	}
}

// setNow hands the simulated time to every KV-fed instance.
func (m *Multi) setNow(now time.Duration) {
	m.now = now
	for k, p := range m.inst {
		if m.shared && k > 0 {
			break
		}
		if kf, ok := p.(kvFed); ok {
			kf.setNow(now)
		}
	}
}
