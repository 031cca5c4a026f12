package fleetstate

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ramjet-llm/ramjet/selection"
)

// testPools are the upstream pools of a sweeper's members: a member
// without an entry has no pool yet.
type testPools struct {
	mu sync.Mutex
	m  map[string][]string
}

func (p *testPools) set(member string, keys ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[member] = keys
}

func (p *testPools) listed(live []string) (map[string]bool, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := map[string]bool{}
	for _, m := range live {
		ks, ok := p.m[m]
		if !ok {
			return nil, false
		}
		for _, k := range ks {
			keys[k] = true
		}
	}
	return keys, true
}

// TestSweeperSweep: a sweep forgets a replica missing from every live pool
// past the grace, logging its route id, and runs the forget hook; it
// decides nothing while a live member has no pool.
func TestSweeperSweep(t *testing.T) {
	f := newTestFleet(t)
	register(t, f, "127.0.0.1:1")
	register(t, f, "127.0.0.1:2")
	pools := &testPools{m: map[string][]string{}}
	var forgot []string
	core, logs := observer.New(zapcore.InfoLevel)
	const grace = time.Hour // the goroutine never sweeps during the test
	c := StartSweeper(f, pools.listed, func(_ selection.Slot, key string) { forgot = append(forgot, key) }, grace, zap.New(core))
	defer c.Stop()
	c.Join("a", grace, zap.New(core))
	c.Join("b", grace, zap.New(core))
	pools.set("a", "127.0.0.1:2")

	past := time.Now().Add(2 * grace)
	c.Sweep(past) // b has no pool yet
	if _, ok := f.Router().Lookup("127.0.0.1:1"); !ok {
		t.Fatal("a replica departed while a live member had no pool")
	}
	pools.set("b")
	c.Sweep(past)
	if _, ok := f.Router().Lookup("127.0.0.1:1"); ok {
		t.Fatal("127.0.0.1:1 is still registered past the grace, listed by no pool")
	}
	if _, ok := f.Router().Lookup("127.0.0.1:2"); !ok {
		t.Fatal("a listed replica departed")
	}
	if len(forgot) != 1 || forgot[0] != "127.0.0.1:1" {
		t.Errorf("forget hook ran for %v, want [127.0.0.1:1]", forgot)
	}
	e := logs.FilterMessage("replica left the fleet: its index and slot are freed").All()
	if len(e) != 1 {
		t.Fatalf("%d departure lines, want 1", len(e))
	}
	fields := e[0].ContextMap()
	if fields["replica"] != "127.0.0.1:1" || fields["fleet"] != DefaultStateKey || fields["route_id"] != RouteID(f.Secret(), "127.0.0.1:1") {
		t.Errorf("departure line fields %v", fields)
	}
	if got := c.Sweeps(); got != 2 {
		t.Errorf("Sweeps() = %d, want 2", got)
	}
	if c.Leave("a") {
		t.Error("Leave(a) reports the last member, b is live")
	}
	if !c.Leave("b") {
		t.Error("Leave(b) does not report the last member")
	}
}

// TestSweepers: the sweeper runs from the first member's Join to the last
// one's Leave, sweeping on its own every quarter of the grace; once stopped
// its forget hook no longer runs.
func TestSweepers(t *testing.T) {
	f := newTestFleet(t)
	register(t, f, "127.0.0.1:1")
	pools := &testPools{m: map[string][]string{"p": {"127.0.0.1:1"}, "q": {"127.0.0.1:1"}}}
	var mu sync.Mutex
	forgot := 0
	forget := func(selection.Slot, string) { mu.Lock(); forgot++; mu.Unlock() }
	var ss Sweepers[*Fleet, string]
	starts := 0
	start := func() *Sweeper[string] {
		starts++
		return StartSweeper(f, pools.listed, forget, 40*time.Millisecond, zap.NewNop())
	}
	ss.Join(f, "p", 40*time.Millisecond, zap.NewNop(), start)
	ss.Join(f, "q", 40*time.Millisecond, zap.NewNop(), start)
	if starts != 1 {
		t.Fatalf("%d sweepers started for one fleet, want 1", starts)
	}
	c := ss.Get(f)
	if c == nil {
		t.Fatal("no sweeper after Join")
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Sweeps() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not sweep on its own")
		}
		time.Sleep(time.Millisecond)
	}
	if _, ok := f.Router().Lookup("127.0.0.1:1"); !ok {
		t.Fatal("a listed replica departed")
	}
	ss.Leave(f, "p")
	if ss.Get(f) != c {
		t.Fatal("the sweeper stopped with a member left")
	}
	ss.Leave(f, "q")
	if ss.Get(f) != nil {
		t.Fatal("the sweeper runs after its last member left")
	}
	n := c.Sweeps()
	if !f.Unregister("127.0.0.1:1") {
		t.Fatal("Unregister: not registered")
	}
	mu.Lock()
	defer mu.Unlock()
	if forgot != 0 {
		t.Errorf("the stopped sweeper's forget hook ran %d times", forgot)
	}
	if c.Sweeps() != n {
		t.Errorf("a stopped sweeper swept")
	}
}
