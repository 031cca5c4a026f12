package selection

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func snapshotRouter(t *testing.T, keys ...string) *Router {
	t.Helper()
	rt, err := NewRouter(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := rt.Register(k); err != nil {
			t.Fatal(err)
		}
	}
	return rt
}

func chain(base uint64, n int) []uint64 {
	b := make([]uint64, n)
	for i := range b {
		b[i] = base + uint64(i)
	}
	return b
}

func TestExportImportKeepsBeliefsByKey(t *testing.T) {
	a := snapshotRouter(t, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
	prompts := map[string][][]uint64{
		"127.0.0.1:1": {chain(100, 8), chain(200, 3)},
		"127.0.0.1:2": {chain(300, 5)},
		"127.0.0.1:3": {chain(100, 4), chain(400, 6)},
	}
	for key, ps := range prompts {
		s, _ := a.Lookup(key)
		for _, p := range ps {
			a.Index().Learn(p, s)
		}
	}
	exp := a.ExportIndex(0)
	if len(exp) != 3 {
		t.Fatalf("exported %d replicas, want 3", len(exp))
	}

	// Another process: other slots, one replica gone, one new.
	b := snapshotRouter(t, "127.0.0.1:9", "127.0.0.1:3", "127.0.0.1:1")
	reps, blocks := b.ImportIndex(exp)
	if reps != 2 || blocks != 8+3+4+6 {
		t.Fatalf("imported %d replicas, %d blocks; want 2, 21", reps, blocks)
	}
	for _, key := range []string{"127.0.0.1:1", "127.0.0.1:3"} {
		sa, _ := a.Lookup(key)
		sb, _ := b.Lookup(key)
		for _, p := range prompts[key] {
			var da, db [MaxReplicas]int32
			var in SlotSet
			in.Add(sa)
			a.Index().Depths(p, in, &da)
			in = SlotSet{}
			in.Add(sb)
			b.Index().Depths(p, in, &db)
			if da[sa] != db[sb] || db[sb] != int32(len(p)) {
				t.Errorf("%s: depth %d after import, %d before, want %d", key, db[sb], da[sa], len(p))
			}
		}
	}
	s9, _ := b.Lookup("127.0.0.1:9")
	if h := b.Index().Held(s9); h != 0 {
		t.Errorf("new replica holds %d blocks, want 0", h)
	}
	// Each replica's eviction order survives: exporting again gives the
	// same lists.
	want := map[string][]uint64{}
	for _, e := range exp {
		if e.Key != "127.0.0.1:2" {
			want[e.Key] = e.Blocks
		}
	}
	got := map[string][]uint64{}
	for _, e := range b.ExportIndex(0) {
		got[e.Key] = e.Blocks
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("re-export (-want +got):\n%s", diff)
	}
}

func TestExportIndexBound(t *testing.T) {
	rt := snapshotRouter(t, "127.0.0.1:1", "127.0.0.1:2")
	s1, _ := rt.Lookup("127.0.0.1:1")
	s2, _ := rt.Lookup("127.0.0.1:2")
	rt.Index().Learn(chain(1000, 30), s1)
	rt.Index().Learn(chain(2000, 10), s2)
	exp := rt.ExportIndex(20)
	got := map[string]int{}
	total := 0
	for _, e := range exp {
		got[e.Key] = len(e.Blocks)
		total += len(e.Blocks)
		// The most recent blocks are kept: a prompt's head is the most
		// recent (Learn touches last to first), so the last exported is
		// the chain's first block.
		if last := e.Blocks[len(e.Blocks)-1]; last != 1000 && last != 2000 {
			t.Errorf("%s: most recent exported block %d, want the chain's head", e.Key, last)
		}
	}
	if total > 20 || got["127.0.0.1:1"] != 15 || got["127.0.0.1:2"] != 5 {
		t.Errorf("bounded export = %v (total %d), want 15 and 5", got, total)
	}
}

func TestImportIndexAppliesCapacity(t *testing.T) {
	a := snapshotRouter(t, "127.0.0.1:1")
	s, _ := a.Lookup("127.0.0.1:1")
	a.Index().Learn(chain(1, 40), s)
	b := snapshotRouter(t, "127.0.0.1:1")
	sb, _ := b.Lookup("127.0.0.1:1")
	b.Index().SetCapacity(sb, 10)
	b.ImportIndex(a.ExportIndex(0))
	if h := b.Index().Held(sb); h != 10 {
		t.Fatalf("held %d blocks after import, want the capacity 10", h)
	}
	var d [MaxReplicas]int32
	var in SlotSet
	in.Add(sb)
	b.Index().Depths(chain(1, 40), in, &d)
	if d[sb] != 10 {
		t.Fatalf("depth %d, want the 10 most recent (leading) blocks", d[sb])
	}
}

// TestImportIndexInChunksKeepsOrder: an import of many chunks (its most
// recent beliefs added first, then all in order) ends with each replica's
// exported order, and a capacity keeps the most recent ones.
func TestImportIndexInChunksKeepsOrder(t *testing.T) {
	keys := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"}
	a := snapshotRouter(t, keys...)
	for p := range 4 * 3000 / 16 {
		s, _ := a.Lookup(keys[p%len(keys)])
		a.Index().Learn(chain(uint64(p)<<20, 16), s)
	}
	exp := a.ExportIndex(0)
	if n := len(exp) * len(exp[0].Blocks); n <= 4*importChunk {
		t.Fatalf("%d beliefs: not enough chunks to test", n)
	}
	b := snapshotRouter(t, keys...)
	s3, _ := b.Lookup(keys[3])
	b.Index().SetCapacity(s3, 1000)
	if reps, blocks := b.ImportIndex(exp); reps != 4 || blocks != 12000 {
		t.Fatalf("imported %d replicas, %d blocks, want 4, 12000", reps, blocks)
	}
	want := exp
	want[3].Blocks = want[3].Blocks[len(want[3].Blocks)-1000:]
	if diff := cmp.Diff(want, b.ExportIndex(0)); diff != "" {
		t.Fatalf("re-export (-want +got):\n%s", diff)
	}
}
