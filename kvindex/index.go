package kvindex

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// MaxReplicas is the most replicas (engine endpoints times data-parallel
// ranks) one Index tracks; the same bound as the router's.
const MaxReplicas = selection.MaxReplicas

// Replica is the handle of a replica in an Index (from Register).
type Replica int32

// set is a set of replica handles, one bit each.
type set [MaxReplicas / 64]uint64

func (m *set) add(r Replica)      { m[r>>6] |= 1 << (uint(r) & 63) }
func (m *set) del(r Replica)      { m[r>>6] &^= 1 << (uint(r) & 63) }
func (m *set) has(r Replica) bool { return m[r>>6]&(1<<(uint(r)&63)) != 0 }
func (m set) and(o set) set {
	var z set
	for i := range m {
		z[i] = m[i] & o[i]
	}
	return z
}
func (m set) or(o set) set {
	var z set
	for i := range m {
		z[i] = m[i] | o[i]
	}
	return z
}
func (m set) andNot(o set) set {
	var z set
	for i := range m {
		z[i] = m[i] &^ o[i]
	}
	return z
}
func (m set) empty() bool {
	var o uint64
	for _, w := range m {
		o |= w
	}
	return o == 0
}

// each calls fn for every member, in order.
func (m set) each(fn func(Replica)) {
	for i, w := range m {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			fn(Replica(i*64 + b))
			w &^= 1 << uint(b)
		}
	}
}

// FenceReason says why a replica's entries were dropped.
type FenceReason uint8

const (
	// FenceGap: sequence numbers jumped and the gap could not be replayed.
	FenceGap FenceReason = iota
	// FenceReset: sequence numbers went back (the engine restarted).
	FenceReset
	// FenceReconnect: the event connection was lost.
	FenceReconnect
	// FenceCleared: the engine reported AllBlocksCleared.
	FenceCleared
	// FenceDecode: a message could not be decoded, so its events are lost.
	FenceDecode
	// FenceDeparted: the replica left the fleet (Retire).
	FenceDeparted
	numFenceReasons
)

func (f FenceReason) String() string {
	switch f {
	case FenceGap:
		return "gap"
	case FenceReset:
		return "reset"
	case FenceReconnect:
		return "reconnect"
	case FenceCleared:
		return "cleared"
	case FenceDecode:
		return "decode"
	case FenceDeparted:
		return "departed"
	}
	return "unknown"
}

// FenceReasons lists every FenceReason, for metric labels.
var FenceReasons = []FenceReason{FenceGap, FenceReset, FenceReconnect, FenceCleared, FenceDecode, FenceDeparted}

// Config configures an Index. Zero values take the defaults.
type Config struct {
	// BlockSize is the engines' KV-cache block size in tokens (vLLM
	// --block-size, SGLang page size). Requests are cut into blocks of this
	// size for the overlap query. Default 16.
	BlockSize int
	// MaxEntries bounds the (replica, block) entries held across all
	// replicas; past it the least recently stored entries are evicted.
	// Default 1<<20 (about 150 MiB).
	MaxEntries int
	// MaxPredicted bounds the predicted entries (see Predict). Default 65536.
	MaxPredicted int
	// MaxOwnGone bounds the (replica, block) pairs remembered as routed
	// there by this router after the index lost them (evicted by the
	// engine, or predicted and dropped before the engine stored them), so
	// that a re-store is known as this router's own (Own). Default
	// 4 x MaxPredicted (about 50 bytes each).
	MaxOwnGone int
	// MaxInflight bounds the (replica, block) pairs of this router's
	// requests in flight (Hold to Release), which tell its stored runs from
	// other routers' (Precise.SetForeign). Default 4 x MaxPredicted (about
	// 60 bytes each).
	MaxInflight int
	// Now is the clock; default time.Now.
	Now func() time.Time
	// MaxOrphanRun is how many BlockStored events in a row may fail to
	// land (unknown parent, wrong block size) before the replica's feed is
	// reported unhealthy and its replica falls back to the estimate.
	// Default 32.
	MaxOrphanRun int
	// StallWindow is how long a feed may deliver stores none of which
	// lands before it is reported unhealthy. Default 5s.
	StallWindow time.Duration
}

func (c *Config) setDefaults() {
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 1 << 20
	}
	if c.MaxPredicted <= 0 {
		c.MaxPredicted = 65536
	}
	if c.MaxOwnGone <= 0 {
		c.MaxOwnGone = 4 * c.MaxPredicted
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = 4 * c.MaxPredicted
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxOrphanRun <= 0 {
		c.MaxOrphanRun = 32
	}
	if c.StallWindow <= 0 {
		c.StallWindow = 5 * time.Second
	}
}

// EntryBytes is the accounted memory of one entry: the record, its place in
// the engine-hash map, the key reference count and the key's holder set.
const EntryBytes = 48 + 40 + 24 + 48

// ownRef marks a replica's router key (in replica.refs) as routed there by
// this router: the engine stored it for a request the router predicted it
// for (Predict, Hold), or the router sent the replica a request with it
// while the engine held it, or it stored again a key that had the mark
// when the index lost it (ownMem). A key the engine holds without the mark
// came from traffic the router did not route (other routers, other
// clients).
const ownRef = 1 << 30

// Own reports whether r holds router key key and this router routed it
// there (see ownRef).
func (x *Index) Own(r Replica, key uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.ownLocked(r, key)
}

func (x *Index) ownLocked(r Replica, key uint64) bool {
	if r < 0 || int(r) >= len(x.reps) {
		return false
	}
	return x.reps[r].refs[key]&ownRef != 0
}

// rec is one block a replica holds: its engine hash and router key, linked
// in the global LRU list.
type rec struct {
	engine     uint64
	key        uint64
	rep        Replica
	prev, next *rec
}

type replica struct {
	id       string
	byEngine map[uint64]*rec
	refs     map[uint64]int32 // router key -> engine hashes mapping to it, | ownRef
	// counters, under Index.mu
	applied, fences, decodeErrors, gaps, replayed uint64
	messages, lastSeq                             uint64
	replayFailures                                uint64
	connected                                     bool
	// complete: the entries mirror the engine's whole cache, because they
	// were built from its first message (sequence 0) or from an empty cache
	// (AllBlocksCleared) on. Otherwise blocks cached before the index
	// joined, and hit since without being stored again, are missing.
	complete  bool
	lastEvent time.Time
	// gone remembers the keys of recently removed engine blocks (bounded
	// by maxGone, goneRing in insertion order), to recognise a re-store
	// that is not a chain.
	gone     map[uint64]uint64
	goneRing []uint64
	goneNext int
	// Health: a feed is healthy while its stores land in the index.
	// failRun counts BlockStored events in a row that did not land since
	// failSince; unhealthy holds the reason once reported (empty when
	// healthy); healthChanged is set on a transition until taken.
	failRun       int
	failSince     time.Time
	unhealthy     string
	healthChanged bool
	orphans       uint64
	// joining: a join replay (after a fence, or joining a running
	// engine) is rebuilding the entries; the feed is not fresh (nor
	// complete) until it ends (Index.beginJoin, endReplay).
	joining bool
}

// Index is the precise index: per replica, the blocks its engine reports
// holding, keyed router-side. Safe for concurrent use: queries share a read
// lock, events take the write lock.
type Index struct {
	cfg Config

	mu    sync.RWMutex
	byID  map[string]Replica
	reps  []*replica
	live  set            // registered replicas (not retired)
	free  []Replica      // retired handles Register reuses (Retire, Free)
	fresh set            // replicas whose feed is trusted
	keys  map[uint64]set // router key -> replicas holding it
	head  rec            // LRU sentinel: head.next is the most recent
	n     int            // entries
	pred  predictions    // short-lived predicted entries
	own   ownMem         // own blocks the index lost (see Own)
	fly   inflight       // this router's requests' blocks in flight (inflight.go)
	// scratch holds one store's chain keys (under mu).
	scratch []uint64

	eventsApplied   atomic.Uint64
	decodeErrors    atomic.Uint64
	gaps            atomic.Uint64
	replayed        atomic.Uint64
	fences          [numFenceReasons]atomic.Uint64
	evictions       atomic.Uint64
	orphans         atomic.Uint64
	unknownRemovals atomic.Uint64
	removed         atomic.Uint64
	lastRemoval     atomic.Int64 // when an engine last dropped indexed blocks (Unix ns; 0 never)
	skipped         atomic.Uint64
	sizeMismatch    atomic.Uint64
	nonChain        atomic.Uint64
	replayFailures  atomic.Uint64
	entries         atomic.Int64
	stored          atomic.Pointer[storedHook] // stored.go: Precise.OnStored
}

// New returns an empty Index.
func New(c Config) *Index {
	c.setDefaults()
	x := &Index{cfg: c, byID: map[string]Replica{}, keys: map[uint64]set{}}
	x.head.next, x.head.prev = &x.head, &x.head
	x.pred.init(c.MaxPredicted)
	x.own.init(c.MaxOwnGone)
	x.fly.init(c.MaxInflight)
	x.pred.own = &x.own
	return x
}

// BlockSize is the block size requests are cut into, in tokens.
func (x *Index) BlockSize() int { return x.cfg.BlockSize }

// ErrTooManyReplicas is returned by Register past MaxReplicas.
var ErrTooManyReplicas = errors.New("kvindex: too many replicas")

// Register returns the handle of replica id (e.g. "10.0.0.5:8000#1" for
// data-parallel rank 1), creating it on first use. A new replica is not
// fresh until its first event.
func (x *Index) Register(id string) (Replica, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r, ok := x.byID[id]; ok {
		return r, nil
	}
	if n := len(x.free); n > 0 {
		// A retired handle: everything of its last replica is dropped.
		r := x.free[n-1]
		x.free = x.free[:n-1]
		x.pred.dropReplica(r)
		x.own.dropReplica(r)
		x.fly.dropReplica(r)
		x.reps[r] = &replica{id: id, byEngine: map[uint64]*rec{}, refs: map[uint64]int32{}}
		x.byID[id] = r
		x.live.add(r)
		return r, nil
	}
	if len(x.reps) >= MaxReplicas {
		return -1, fmt.Errorf("%w: %d", ErrTooManyReplicas, MaxReplicas)
	}
	r := Replica(len(x.reps))
	x.reps = append(x.reps, &replica{id: id, byEngine: map[uint64]*rec{}, refs: map[uint64]int32{}})
	x.byID[id] = r
	x.live.add(r)
	return r, nil
}

// Retire forgets replica r (it left the fleet): its entries and
// predictions are dropped, its id is no longer found (Lookup), and events
// still applied to it are ignored. Its handle is reused by Register once
// Free releases it (after its feed stopped); an id registered again meanwhile
// gets another handle and starts cold.
func (x *Index) Retire(r Replica) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r < 0 || int(r) >= len(x.reps) || !x.live.has(r) {
		return
	}
	x.fenceLocked(r, FenceDeparted)
	rep := x.reps[r]
	delete(x.byID, rep.id)
	rep.id, rep.connected = "", false
	x.live.del(r)
}

// Free makes a retired handle reusable by Register: nothing applies events
// to it any more.
func (x *Index) Free(r Replica) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r >= 0 && int(r) < len(x.reps) && !x.live.has(r) {
		x.free = append(x.free, r)
	}
}

// Lookup returns the handle of a registered replica.
func (x *Index) Lookup(id string) (Replica, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r, ok := x.byID[id]
	return r, ok
}

// ID returns the id a replica was registered with.
func (x *Index) ID(r Replica) string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.reps[r].id
}

// Fresh reports whether r's feed is trusted: it applied an event since it
// was registered or last fenced. The router should use the precise overlap
// only for fresh replicas and fall back to its estimate for the others.
func (x *Index) Fresh(r Replica) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.fresh.has(r)
}

// loraSeed is the chain seed of a LoRA adapter's blocks: 0 for the base
// model, else the id's hash (so adapters never share blocks).
func loraSeed(e *Event) uint64 {
	if !e.HasLora || e.LoraID == 0 {
		return 0
	}
	return Seed(e.LoraID)
}

// Seed returns the chain seed of requests to LoRA adapter id (0 for the
// base model), to pass to Keys.
func Seed(loraID int64) uint64 {
	if loraID == 0 {
		return 0
	}
	var t [2]uint32
	t[0], t[1] = uint32(loraID), uint32(uint64(loraID)>>32)
	return selection.HashTokenBlock(0x6c6f7261, t[:]) // "lora"
}

// Keys appends to dst the router keys of tokens' full blocks, chained from
// seed (0 for the base model; see Seed).
func (x *Index) Keys(dst []uint64, seed uint64, tokens []uint32) []uint64 {
	return selection.AppendTokenBlocks(dst, seed, tokens, x.cfg.BlockSize)
}

// Apply applies one decoded batch of r's events. Events of other storage
// tiers than the GPU, and of KV-cache groups other than the first, are
// skipped (counted).
func (x *Index) Apply(r Replica, b *Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.live.has(r) {
		return // retired: its feed is stopping
	}
	rep := x.reps[r]
	now := x.cfg.Now()
	at := publishedAt(b.TS, now)
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case KindBlockStored:
			if !x.relevant(e) {
				continue
			}
			landed, own, mine := x.store(r, rep, e, now)
			x.noteStore(r, rep, landed, now)
			x.noteStored(r, e, own, mine, at) // stored.go
		case KindBlockRemoved:
			if !x.relevant(e) {
				continue
			}
			for _, h := range e.BlockHashes {
				if rc, ok := rep.byEngine[h]; ok {
					x.remove(rc)
					x.removed.Add(1)
					x.lastRemoval.Store(now.UnixNano())
				} else {
					x.unknownRemovals.Add(1)
				}
			}
		case KindAllBlocksCleared:
			x.lastRemoval.Store(now.UnixNano())
			x.fenceLocked(r, FenceCleared)
			rep.complete = true // the engine's cache is empty: known exactly
			rep.applied++
			x.eventsApplied.Add(1)
			continue
		default:
			x.skipped.Add(1)
			continue
		}
		if rep.unhealthy == "" && !rep.joining {
			x.fresh.add(r)
		}
		rep.applied++
		rep.lastEvent = now
		x.eventsApplied.Add(1)
	}
	x.pred.sweep(now)
}

func (x *Index) relevant(e *Event) bool {
	if (e.Medium != "" && !strings.EqualFold(e.Medium, "GPU")) || e.GroupIdx != 0 {
		x.skipped.Add(1)
		return false
	}
	return true
}

// store keys e's blocks; it reports whether any block landed under a key
// a request can match, how many of them are marked as this router's
// (ownRef), and mine: how many belong to this router's requests in flight
// at now (inflight), when all the blocks it keyed do (else 0: a run that
// leaves every chain this router's requests hold is another router's
// request's, the part within them included).
func (x *Index) store(r Replica, rep *replica, e *Event, now time.Time) (landed bool, own, mine int) {
	bs := e.BlockSize
	if bs <= 0 {
		x.skipped.Add(1)
		return false, 0, 0
	}
	landed = len(e.BlockHashes) > 0 && len(e.TokenIDs) >= bs
	if bs != x.cfg.BlockSize {
		x.sizeMismatch.Add(1)
		landed = false // keyed, but no request can ever match them
	}
	prev := loraSeed(e)
	// A parent of 0 is how several publishers (llm-d's adapter, some
	// emulators' positional encoding) write "no parent": it is a chain start
	// unless this replica really holds a block hashing to 0.
	if e.HasParent && (e.Parent != 0 || rep.byEngine[0] != nil) {
		p, ok := rep.byEngine[e.Parent]
		if !ok {
			// The parent is unknown (missed, or evicted by the budget):
			// the chain cannot be keyed.
			x.orphans.Add(1)
			rep.orphans++
			return false, 0, 0
		}
		prev = p.key
	}
	// First pass: the chain keys, and whether the engine's own identities
	// contradict them. An engine hash names one block (its parent and
	// tokens), so a block held or recently removed under another key proves
	// the store is not one contiguous chain under its parent (a re-store of
	// scattered evicted blocks). Then only the first block (under the given
	// parent) and blocks of known identity are keyed; the rest are skipped.
	tokens := e.TokenIDs
	x.scratch = x.scratch[:0]
	broken := false
	for _, h := range e.BlockHashes {
		if len(tokens) < bs {
			break
		}
		prev = selection.HashTokenBlock(prev, tokens[:bs])
		tokens = tokens[bs:]
		if k, ok := rep.known(h); ok && k != prev {
			broken = true
		}
		x.scratch = append(x.scratch, prev)
	}
	keyed := 0
	for i, key := range x.scratch {
		h := e.BlockHashes[i]
		if broken {
			if k, ok := rep.known(h); ok {
				key = k
			} else if i > 0 {
				x.nonChain.Add(1)
				x.skipped.Add(1)
				continue
			}
		}
		x.put(r, rep, h, key)
		ref := rep.refs[key]
		if x.pred.confirm(r, key) || x.own.take(predID{key, r}) {
			ref |= ownRef
			rep.refs[key] = ref
		}
		if ref&ownRef != 0 {
			own++
		}
		if keyed++; x.fly.has(predID{key, r}, now.UnixNano()) {
			mine++
		}
	}
	if mine < keyed {
		mine = 0
	}
	return landed, own, mine
}

// noteStore updates r's health after one BlockStored event: a run of
// MaxOrphanRun stores that did not land, or stores failing for longer than
// StallWindow with none landing, makes the feed unhealthy (not fresh: its
// replica is routed by the estimate) until a store lands again.
func (x *Index) noteStore(r Replica, rep *replica, landed bool, now time.Time) {
	if landed {
		rep.failRun = 0
		if rep.unhealthy != "" {
			rep.unhealthy, rep.healthChanged = "", true
		}
		return
	}
	if rep.failRun == 0 {
		rep.failSince = now
	}
	rep.failRun++
	if rep.unhealthy != "" {
		return
	}
	switch {
	case rep.failRun >= x.cfg.MaxOrphanRun:
		rep.unhealthy = fmt.Sprintf("%d stores in a row did not land (unknown parents or block size)", rep.failRun)
	case now.Sub(rep.failSince) >= x.cfg.StallWindow:
		rep.unhealthy = fmt.Sprintf("no store landed for %s", now.Sub(rep.failSince).Round(time.Millisecond))
	default:
		return
	}
	rep.healthChanged = true
	x.fresh.del(r)
}

// HealthChange reports, once per transition, that r's feed became
// unhealthy (reason non-empty) or healthy again (reason empty).
func (x *Index) HealthChange(r Replica) (changed bool, reason string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	rep := x.reps[r]
	changed, rep.healthChanged = rep.healthChanged, false
	return changed, rep.unhealthy
}

// known returns the router key under which the replica holds, or recently
// held, engine block h.
func (rep *replica) known(h uint64) (uint64, bool) {
	if rc, ok := rep.byEngine[h]; ok {
		return rc.key, true
	}
	k, ok := rep.gone[h]
	return k, ok
}

// maxGone bounds the removed blocks a replica remembers.
const maxGone = 4096

// forget remembers that engine block h was keyed key, within maxGone
// (oldest first out).
func (rep *replica) forget(h, key uint64) {
	if rep.gone == nil {
		rep.gone = make(map[uint64]uint64, 64)
	}
	if _, ok := rep.gone[h]; ok {
		rep.gone[h] = key
		return
	}
	if len(rep.goneRing) == maxGone {
		delete(rep.gone, rep.goneRing[rep.goneNext])
		rep.goneRing[rep.goneNext] = h
		rep.goneNext = (rep.goneNext + 1) % maxGone
	} else {
		rep.goneRing = append(rep.goneRing, h)
	}
	rep.gone[h] = key
}

// put records that r holds engine block h under router key key.
func (x *Index) put(r Replica, rep *replica, h, key uint64) {
	if rc, ok := rep.byEngine[h]; ok {
		if rc.key == key {
			x.unlink(rc)
			x.pushFront(rc)
			return
		}
		x.remove(rc)
	}
	for x.n >= x.cfg.MaxEntries {
		x.remove(x.head.prev)
		x.evictions.Add(1)
	}
	rc := &rec{engine: h, key: key, rep: r}
	rep.byEngine[h] = rc
	rep.refs[key]++
	if rep.refs[key]&^ownRef == 1 {
		s := x.keys[key]
		s.add(r)
		x.keys[key] = s
	}
	x.pushFront(rc)
	x.n++
	x.entries.Store(int64(x.n))
}

func (x *Index) remove(rc *rec) {
	rep := x.reps[rc.rep]
	delete(rep.byEngine, rc.engine)
	rep.forget(rc.engine, rc.key)
	if rep.refs[rc.key]--; rep.refs[rc.key]&^ownRef <= 0 {
		if rep.refs[rc.key]&ownRef != 0 {
			x.own.add(predID{rc.key, rc.rep})
		}
		delete(rep.refs, rc.key)
		s := x.keys[rc.key]
		s.del(rc.rep)
		if s.empty() {
			delete(x.keys, rc.key)
		} else {
			x.keys[rc.key] = s
		}
	}
	x.unlink(rc)
	x.n--
	x.entries.Store(int64(x.n))
}

func (x *Index) pushFront(rc *rec) {
	rc.prev, rc.next = &x.head, x.head.next
	x.head.next.prev = rc
	x.head.next = rc
}

func (x *Index) unlink(rc *rec) {
	rc.prev.next, rc.next.prev = rc.next, rc.prev
	rc.prev, rc.next = nil, nil
}

// Fence drops every entry and prediction of r and marks it not fresh until
// its next event.
func (x *Index) Fence(r Replica, why FenceReason) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.live.has(r) {
		x.fenceLocked(r, why)
	}
}

func (x *Index) fenceLocked(r Replica, why FenceReason) {
	rep := x.reps[r]
	for _, rc := range rep.byEngine {
		x.remove(rc)
	}
	x.pred.dropReplica(r)
	x.fresh.del(r)
	rep.complete = false
	rep.fences++
	x.fences[why].Add(1)
}

// Overlap writes to out[r], for every registered replica r, how many
// leading tokens of the request whose block keys are keys (from Keys) r
// holds, counting its predicted entries. Replicas that are not fresh get
// 0. out must have room for every handle (len >= NumReplicas). It does not
// allocate.
func (x *Index) Overlap(keys []uint64, out []int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.overlapLocked(keys, out)
}

// Annotate sets Precise and Overlap on every candidate cands[i] whose
// replica reps[i] has a fresh feed (reps[i] < 0: no precise feed), and
// clears Precise on the others, so that the router uses the exact overlap
// where the feed is trusted and its estimate elsewhere. scratch must have
// room for every handle (len >= NumReplicas). It returns how many
// candidates got a precise overlap, and does not allocate.
func (x *Index) Annotate(keys []uint64, reps []Replica, cands []selection.Candidate, scratch []int) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.overlapLocked(keys, scratch)
	n := 0
	for i := range cands {
		r := Replica(-1)
		if i < len(reps) {
			r = reps[i]
		}
		if r < 0 || int(r) >= len(x.reps) || int(r) >= len(scratch) || !x.fresh.has(r) {
			cands[i].Precise = false
			continue
		}
		cands[i].Precise, cands[i].Overlap = true, scratch[r]
		n++
	}
	return n
}

func (x *Index) overlapLocked(keys []uint64, out []int) {
	n := len(x.reps)
	for i := 0; i < n && i < len(out); i++ {
		out[i] = 0
	}
	run := x.fresh
	var now int64
	if x.pred.live > 0 {
		now = x.cfg.Now().UnixNano()
	}
	bs := x.cfg.BlockSize
	for i, k := range keys {
		held := x.keys[k]
		if x.pred.live > 0 {
			held = held.or(x.pred.holders(k, run.andNot(held), now))
		}
		next := run.and(held)
		if lost := run.andNot(next); !lost.empty() {
			for w, word := range lost {
				for word != 0 {
					b := bits.TrailingZeros64(word)
					if r := w*64 + b; r < len(out) {
						out[r] = i * bs
					}
					word &^= 1 << uint(b)
				}
			}
		}
		run = next
		if run.empty() {
			return
		}
	}
	for w, word := range run {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			if r := w*64 + b; r < len(out) {
				out[r] = len(keys) * bs
			}
			word &^= 1 << uint(b)
		}
	}
}

// NumReplicas is the number of registered replicas (handles are 0..n-1).
func (x *Index) NumReplicas() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.reps)
}

// Held reports whether r holds router key key (stored, not predicted).
func (x *Index) Held(r Replica, key uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s := x.keys[key]
	return s.has(r)
}
