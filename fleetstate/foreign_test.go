package fleetstate

import (
	"testing"

	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/kvindex"
)

// foreign_prefill: on by default with kv, with or without engine_metrics;
// "on" needs kv; "off" turns it off; other words are rejected.
func TestForeignPrefillOn(t *testing.T) {
	kv, em := &kvindex.Settings{}, &enginemetrics.Settings{}
	tests := []struct {
		name string
		s    PolicySettings
		want bool
	}{
		{"none", PolicySettings{}, false},
		{"kv", PolicySettings{KV: kv}, true},
		{"engine_metrics", PolicySettings{EngineMetrics: em}, false},
		{"both", PolicySettings{KV: kv, EngineMetrics: em}, true},
		{"both, off", PolicySettings{KV: kv, EngineMetrics: em, ForeignPrefill: "off"}, false},
		{"both, on", PolicySettings{KV: kv, EngineMetrics: em, ForeignPrefill: "on"}, true},
		{"kv, off", PolicySettings{KV: kv, ForeignPrefill: "off"}, false},
	}
	for _, tt := range tests {
		if got := tt.s.ForeignPrefillOn(); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	for _, tt := range []struct {
		s  PolicySettings
		ok bool
	}{
		{PolicySettings{ForeignPrefill: "off"}, true},
		{PolicySettings{KV: kv, ForeignPrefill: "on"}, true},
		{PolicySettings{ForeignPrefill: "on"}, false},
		{PolicySettings{KV: kv, ForeignPrefill: "yes"}, false},
	} {
		s := tt.s
		s.SetDefaults()
		if err := s.Validate(); (err == nil) != tt.ok {
			t.Errorf("foreign_prefill %q (kv %v): error %v", tt.s.ForeignPrefill, tt.s.KV != nil, err)
		}
	}
}
