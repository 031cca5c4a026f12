package module

import (
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestSpillBandWired runs spill_band through the whole configuration path
// (Caddyfile -> JSON -> Provision): on by default with kv and
// engine_metrics both on (several instances on the precise path reading
// the same engine scrape, where the band was measured to win) and with kv
// and foreign_prefill (its default with kv), off otherwise
// unless set, off with "off"; the policy's router and the one
// explain and the dashboard score with (Fleet.Router) apply the same
// options, and a reload without the band takes it off again.
func TestSpillBandWired(t *testing.T) {
	// Nothing listens on these: the feeds and the scrapes only retry.
	const kv = "kv_events 127.0.0.1:9 tcp://127.0.0.1:9\n"
	const em = "engine_metrics 1h\n"
	// With kv the precise path keeps IndexShare off (QueueExtra at its
	// default, as without kv).
	precise := func(o selection.Options) selection.Options { o.IndexShare = -1; return o }
	on := precise(selection.Options{ColdSpill: true, SpillBand: fleetstate.DefaultSpillBand})
	tests := []struct {
		name, block string
		want        selection.Options
	}{
		{"bare", "", selection.Options{}},
		{"kv only, foreign_prefill by default", kv, on},
		{"kv only, foreign_prefill off", kv + "foreign_prefill off\n", precise(selection.Options{})},
		{"engine_metrics only", em, selection.Options{}},
		{"kv and engine_metrics", kv + em, on},
		{"kv and engine_metrics, off", kv + em + "spill_band off\n", precise(selection.Options{})},
		{"kv and engine_metrics, wider", kv + em + "spill_band 4096\n", precise(selection.Options{ColdSpill: true, SpillBand: 4096})},
		{"set alone", "spill_band 2048\n", selection.Options{ColdSpill: true, SpillBand: 2048}},
		{"index_share and queue_extra off", "index_share off\nqueue_extra off\n", selection.Options{IndexShare: -1, QueueExtra: -1}},
		{"index_share and queue_extra set", "index_share 0.6\nqueue_extra 3\n", selection.Options{IndexShare: 0.6, QueueExtra: 3}},
		{"kv with index_share set", kv + "foreign_prefill off\nindex_share 0.8\n", selection.Options{IndexShare: 0.8}},
		{"kv with queue_extra off", kv + "foreign_prefill off\nqueue_extra off\n", selection.Options{IndexShare: -1, QueueExtra: -1}},
		{"fixed_density", "fixed_density\n", selection.Options{FixedDensity: true}},
		{"fixed_density false", "fixed_density false\n", selection.Options{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "spillband_" + strings.NewReplacer(" ", "_", ",", "").Replace(tt.name)
			rt, explain := provisionSpill(t, "ramjet {\n state_key "+key+"\n instance_id ramjet-1\n "+tt.block+"}")
			if got := rt.Options(); got != tt.want {
				t.Errorf("router options %+v, want %+v", got, tt.want)
			}
			if got := explain.Options(); got != tt.want {
				t.Errorf("explain's router options %+v, want %+v", got, tt.want)
			}
			if rt.Instance() != selection.InstancePosition("ramjet-1") {
				t.Errorf("instance position %x, want ramjet-1's", rt.Instance())
			}
		})
	}
	if _, err := provisionSpillErr(t, "ramjet {\n spill_band -2\n}"); err == nil || !strings.Contains(err.Error(), "spill_band") {
		t.Errorf("spill_band -2: error %v, want one naming spill_band", err)
	}
	for _, bad := range []string{"index_share 1.5", "index_share -0.5", "queue_extra -2"} {
		name := strings.Fields(bad)[0]
		if _, err := provisionSpillErr(t, "ramjet {\n "+bad+"\n}"); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v, want one naming %s", bad, err, name)
		}
	}
}

// TestSpillBandReload provisions one state with the band, then (a reload)
// without it: the second policy's router and explain's lose it, on the
// same index.
func TestSpillBandReload(t *testing.T) {
	p1, err := provisionKeep(t, "ramjet {\n state_key spillband_reload\n spill_band 1024\n}")
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Cleanup()
	if p1.rt.Options().SpillBand != 1024 {
		t.Fatalf("first policy: %+v", p1.rt.Options())
	}
	p2, err := provisionKeep(t, "ramjet {\n state_key spillband_reload\n}")
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Cleanup()
	if p2.rt.Options() != (selection.Options{}) || p2.fleet.Router().Options() != (selection.Options{}) {
		t.Errorf("after the reload: router %+v, explain %+v; want none", p2.rt.Options(), p2.fleet.Router().Options())
	}
	if p2.rt.Index() != p1.rt.Index() {
		t.Error("the reload started a new index")
	}
}

func provisionSpill(t *testing.T, block string) (rt, explain *selection.Router) {
	t.Helper()
	p, err := provisionKeep(t, block)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	return p.rt, p.fleet.Router()
}

func provisionSpillErr(t *testing.T, block string) (*RamjetSelection, error) {
	t.Helper()
	p, err := provisionKeep(t, block)
	if err == nil {
		p.Cleanup()
	}
	return p, err
}
