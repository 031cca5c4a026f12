package metrics

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/usage"
)

// The set's collectors report the store of large body buffers: after a
// 128 KiB body is read and released its buffer is kept, and the gauges
// say what edge.KeptBuffers says, with the store's bound.
func TestBodyBuffersCollector(t *testing.T) {
	payload := bytes.Repeat([]byte("x"), 128<<10)
	r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1/chat/completions", bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	b, rd, err := edge.ReadBody(r, 1<<20, nil)
	if err != nil || b == nil {
		t.Fatalf("ReadBody: %v", err)
	}
	if n, _ := io.Copy(io.Discard, rd); n != int64(len(payload)) {
		t.Fatalf("read %d bytes back", n)
	}
	rd.Close()
	b.Release()

	reg := prometheus.NewRegistry()
	reg.MustRegister(bodyBuffers{})
	n, bytes := edge.KeptBuffers()
	if n < 1 || bytes < len(payload) {
		t.Fatalf("store holds %d buffers of %d bytes after a 128 KiB body, want it kept", n, bytes)
	}
	for name, want := range map[string]float64{
		"ramjet_body_buffers_kept":             float64(n),
		"ramjet_body_buffers_kept_bytes":       float64(bytes),
		"ramjet_body_buffers_kept_limit_bytes": float64(edge.KeptBuffersLimit),
	} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() == name {
				found = true
				if got := mf.GetMetric()[0].GetGauge().GetValue(); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
		}
		if !found {
			t.Errorf("%s not gathered", name)
		}
	}
	if c := testutil.CollectAndCount(bodyBuffers{}); c != 3 {
		t.Errorf("%d series, want 3", c)
	}
}

// The free-list collector reports every list edge.NewFreeList made, by
// name: what it holds, its bound, how objects were taken and returned.
func TestFreeListsCollector(t *testing.T) {
	l := edge.NewFreeList[[32]byte]("metrics_test", 2)
	xs := []*[32]byte{l.Get(), l.Get(), l.Get()}
	for _, x := range xs {
		l.Put(x)
	}
	l.Get()
	l.Keep()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(freeLists{})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key, mine := mf.GetName(), false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "pool" {
					mine = lp.GetValue() == "metrics_test"
				} else {
					key += "/" + lp.GetValue()
				}
			}
			if mine {
				got[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	want := map[string]float64{
		"ramjet_free_list_objects": 1, "ramjet_free_list_limit": 2,
		"ramjet_free_list_gets_total/made": 3, "ramjet_free_list_gets_total/reused": 1,
		"ramjet_free_list_returns_total/pooled": 2, "ramjet_free_list_returns_total/dropped": 1,
		"ramjet_free_list_returns_total/kept": 1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// The usage-layout collector reports the answer layouts the usage package
// keeps and their bound: a scanner that read one answer keeps its layout.
func TestUsageLayoutsCollector(t *testing.T) {
	var s usage.Scanner
	s.Write([]byte(`{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}}`))
	if r, ok := s.Result(); !ok || r.PromptTokens != 12 || r.CachedTokens != 8 {
		t.Fatalf("Result %+v, %v", r, ok)
	}
	n := usage.Layouts()
	if n < 1 || n > usage.MaxLayouts {
		t.Fatalf("%d layouts kept after an answer, want 1..%d", n, usage.MaxLayouts)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(usageLayouts{})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
	}
	if got["ramjet_usage_layouts"] != float64(n) || got["ramjet_usage_layouts_limit"] != float64(usage.MaxLayouts) {
		t.Errorf("gathered %v, want %d layouts of at most %d", got, n, usage.MaxLayouts)
	}
	if probs, err := testutil.CollectAndLint(usageLayouts{}); err != nil || len(probs) > 0 {
		t.Errorf("lint: %v %v", probs, err)
	}
}
