package fleetstate

import (
	"testing"

	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

func TestSpillOptions(t *testing.T) {
	kv, em := &kvindex.Settings{}, &enginemetrics.Settings{}
	// With kv the precise path keeps IndexShare off (QueueExtra at its
	// default, as on the approximate path).
	on := selection.Options{ColdSpill: true, SpillBand: DefaultSpillBand, IndexShare: -1}
	precise := selection.Options{IndexShare: -1}
	tests := []struct {
		name string
		s    PolicySettings
		want selection.Options
	}{
		{"none", PolicySettings{}, selection.Options{}},
		{"kv (with foreign_prefill, its default there)", PolicySettings{KV: kv}, on},
		{"kv, foreign_prefill off", PolicySettings{KV: kv, ForeignPrefill: "off"}, precise},
		{"engine_metrics", PolicySettings{EngineMetrics: em}, selection.Options{}},
		{"both", PolicySettings{KV: kv, EngineMetrics: em}, on},
		{"both, off", PolicySettings{KV: kv, EngineMetrics: em, SpillBand: -1}, precise},
		{"set", PolicySettings{SpillBand: 512}, selection.Options{ColdSpill: true, SpillBand: 512}},
		{"index_share and queue_extra off", PolicySettings{IndexShare: -1, QueueExtra: -1}, selection.Options{IndexShare: -1, QueueExtra: -1}},
		{"kv, index_share and queue_extra set", PolicySettings{KV: kv, ForeignPrefill: "off", IndexShare: 0.5, QueueExtra: 4},
			selection.Options{IndexShare: 0.5, QueueExtra: 4}},
		{"engine_metrics agree", PolicySettings{EngineMetrics: &enginemetrics.Settings{Agree: true}}, selection.Options{AgreeExt: true}},
		{"both, agree", PolicySettings{KV: kv, EngineMetrics: &enginemetrics.Settings{Agree: true}},
			selection.Options{ColdSpill: true, SpillBand: DefaultSpillBand, AgreeExt: true, IndexShare: -1}},
		{"engine_metrics overflow", PolicySettings{EngineMetrics: &enginemetrics.Settings{Overflow: true}}, selection.Options{EngineOverflow: true}},
		{"engine_metrics queue", PolicySettings{KV: kv, EngineMetrics: &enginemetrics.Settings{Queue: 32768, QueueSat: 0.25}},
			selection.Options{ColdSpill: true, SpillBand: DefaultSpillBand, EngineQueue: 32768, EngineQueueSat: 0.25, IndexShare: -1}},
		{"kv, queue_extra off", PolicySettings{KV: kv, ForeignPrefill: "off", QueueExtra: -1}, selection.Options{IndexShare: -1, QueueExtra: -1}},
	}
	for _, tt := range tests {
		if got := tt.s.SpillOptions(); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
	for _, band := range []int{-1, 0, 1, 4096} {
		s := PolicySettings{SpillBand: band}
		s.SetDefaults()
		if err := s.Validate(); err != nil {
			t.Errorf("spill_band %d: %v", band, err)
		}
	}
	s := PolicySettings{SpillBand: -2}
	s.SetDefaults()
	if err := s.Validate(); err == nil {
		t.Error("spill_band -2 accepted")
	}
	for _, v := range [][2]float64{{-1, -1}, {0, 0}, {0.5, 4}, {1, 0.5}} {
		s := PolicySettings{IndexShare: v[0], QueueExtra: v[1]}
		s.SetDefaults()
		if err := s.Validate(); err != nil {
			t.Errorf("index_share %v, queue_extra %v: %v", v[0], v[1], err)
		}
	}
	for _, s := range []PolicySettings{{IndexShare: 1.5}, {IndexShare: -0.5}, {QueueExtra: -2}} {
		s.SetDefaults()
		if err := s.Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

// TestTuneOptions: the options reach the Router Tune returns and the one
// explain scores with, on the same state; Tune alone (a policy without
// them) takes them off again.
func TestTuneOptions(t *testing.T) {
	f, err := New("k", "p", selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	o := selection.Options{ColdSpill: true, SpillBand: 1024}
	rt, err := f.TuneOptions(selection.Config{}, o)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Options() != o || f.Router() != rt || rt.Index() != f.Base().Index() {
		t.Errorf("TuneOptions: options %+v, explain's router the same %v, shared index %v", rt.Options(), f.Router() == rt, rt.Index() == f.Base().Index())
	}
	rt, err = f.Tune(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if rt.Options() != (selection.Options{}) || f.Router().Options() != (selection.Options{}) {
		t.Errorf("Tune after TuneOptions: %+v / %+v, want none", rt.Options(), f.Router().Options())
	}
}
