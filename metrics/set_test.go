package metrics

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/dashboard"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/usage"
)

func TestOutcomeOf(t *testing.T) {
	tests := []struct {
		name                string
		status              int
		canceled, noReplica bool
		want                string
	}{
		{name: "ok", status: 200, want: OutcomeOK},
		{name: "redirect", status: 307, want: OutcomeOK},
		{name: "bad request", status: 400, want: OutcomeClientError},
		{name: "not found", status: 404, want: OutcomeClientError},
		{name: "engine error", status: 500, want: OutcomeUpstreamError},
		{name: "bad gateway", status: 502, want: OutcomeUpstreamError},
		{name: "nothing written", status: 0, want: OutcomeUpstreamError},
		{name: "no replica", status: 503, noReplica: true, want: OutcomeNoReplica},
		{name: "client went away", status: 200, canceled: true, want: OutcomeCanceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OutcomeOf(tt.status, tt.canceled, tt.noReplica); got != tt.want {
				t.Errorf("OutcomeOf(%d, %v, %v) = %q, want %q", tt.status, tt.canceled, tt.noReplica, got, tt.want)
			}
		})
	}
}

// TestMetricsLint feeds a private metric set every kind of observation and
// lints the result.
func TestMetricsLint(t *testing.T) {
	snap := func() []fleetstate.Snapshot {
		return []fleetstate.Snapshot{{Key: "default", IndexEntries: 10, IndexBytes: 4096, IndexBudget: 1 << 20,
			Replicas: []fleetstate.ReplicaSnapshot{{ID: "00aa", Inflight: 2, PendingPrefill: 300, Load: 2348, Known: true, Healthy: true, Available: true}}}}
	}
	m := NewSet(snap, catalog.NewNames(4))
	d := selection.Decision{Index: 0, Reason: selection.ReasonTieBreak, Tie: selection.TieRendezvous, Overlap: 128}
	m.ObserveSelection("00aa", d, false, 20*time.Microsecond)
	l := m.StartRequest("00aa", "m")
	now := time.Now()
	m.EndRequest(l, &Exchange{Upstream: "00aa", Model: "m", Status: 200, Stream: true, Start: now,
		FirstByte: now.Add(50 * time.Millisecond), End: now.Add(time.Second),
		Usage: usage.Usage{PromptTokens: 100, CachedTokens: 64, CompletionTokens: 5}, HasUsage: true})
	probs, err := testutil.GatherAndLint(m.Own)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(m.Fleet); n != 20 { // 9 fleet (the learn queue's two counters, other instances seen and the density included) + 11 for its one replica
		t.Errorf("fleet collector emitted %d series, want 20", n)
	}
	mfs, err := m.Own.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "ramjet_") {
			t.Errorf("series %s is not ramjet_*", mf.GetName())
		}
	}
}

func TestResponseTail(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   bool
	}{
		{name: "done in one write", chunks: []string{"data: {\"x\":1}\n\ndata: [DONE]\n\n"}, want: true},
		{name: "done split", chunks: []string{"data: {}\n\ndata: [DO", "NE]", "\n\n"}, want: true},
		{name: "done byte by byte", chunks: strings.Split("data: [DONE]\n\n", ""), want: true},
		{name: "cut mid-stream", chunks: []string{"data: {\"x\":1}\n\n", "data: {\"x\":"}, want: false},
		{name: "nothing", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o Response
			for _, c := range tt.chunks {
				o.Write([]byte(c))
			}
			if got := o.Complete(false); got != tt.want {
				t.Errorf("complete = %v, want %v (tail %q)", got, tt.want, o.tail[:o.tailLen])
			}
		})
	}
}

func TestResponseCanceled(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		err        error
		clientGone bool
		body       string
		want       bool
	}{
		{name: "closed before the headers", status: StatusClientClosed, want: true},
		{name: "complete", status: 200},
		{name: "aborted mid-stream", status: 200, err: http.ErrAbortHandler, body: "data: {}\n\n", want: true},
		{name: "client left after the end marker", status: 200, err: context.Canceled, body: "data: [DONE]\n\n"},
		{name: "client left after an error status", status: 502, err: errors.New("x"), clientGone: true, want: true},
		{name: "upstream error, client still there", status: 502, err: errors.New("x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o Response
			o.WriteHeader(tt.status, http.Header{"Content-Type": {"text/event-stream"}})
			o.Write([]byte(tt.body))
			if got := o.Canceled(tt.status, tt.err, tt.clientGone, false); got != tt.want {
				t.Errorf("Canceled = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestResponseFirstFromStart: with Start set, First is Start plus the
// monotonic time to the first body byte, so that TTFT (First minus Start)
// is what time.Now would have given; without it First is time.Now's.
func TestResponseFirstFromStart(t *testing.T) {
	for _, withStart := range []bool{true, false} {
		before := time.Now()
		var o Response
		if withStart {
			o.Start = before
		}
		o.WriteHeader(200, http.Header{"Content-Type": {"text/event-stream"}})
		o.Write(nil) // no byte: no first byte yet
		if !o.First.IsZero() {
			t.Fatalf("withStart=%v: First set by an empty write", withStart)
		}
		o.Write([]byte("data: {}\n\n"))
		after := time.Now()
		if o.First.Before(before) || o.First.After(after) {
			t.Errorf("withStart=%v: First %v outside [%v, %v]", withStart, o.First, before, after)
		}
		if ttft := o.First.Sub(before); ttft < 0 || ttft > after.Sub(before) {
			t.Errorf("withStart=%v: TTFT %v outside [0, %v]", withStart, ttft, after.Sub(before))
		}
		first := o.First
		o.Write([]byte("data: [DONE]\n\n"))
		if o.First != first {
			t.Errorf("withStart=%v: First moved on a later write", withStart)
		}
	}
}

// TestResponseFirstOnlyForStreams: a body that is not a stream reads no
// clock for its first byte (First stays zero; only a stream's TTFT reads
// it), and the exchange it fills reports the same histograms and record
// fields as one with First set would: TTFT is a stream's only.
func TestResponseFirstOnlyForStreams(t *testing.T) {
	var o Response
	o.Start = time.Now()
	o.WriteHeader(200, http.Header{"Content-Type": {"application/json"}})
	o.Write([]byte(`{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`))
	if !o.First.IsZero() {
		t.Fatalf("First %v set for a JSON body", o.First)
	}
	var x Exchange
	o.Fill(&x, 200, nil, false)
	if x.Stream || !x.FirstByte.IsZero() || !x.HasUsage || x.Usage.PromptTokens != 12 {
		t.Fatalf("filled %+v", x)
	}
}

// TestEndModelLabel: a request whose model Models held when it started
// ends under that name without asking Models again; any other ends as
// before: Add for a success, Label otherwise, "other" sent as a name
// included (it joins on a success while there is room).
func TestEndModelLabel(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(3, "known"))
	for i, tc := range []struct {
		model   string
		status  int
		want    string
		held    int
		started bool // the Inflight says the model was held
	}{
		{"known", 200, "known", 1, true},
		{"known", 500, "known", 1, true},
		{"new", 500, catalog.Other, 1, false}, // an error adds no name
		{"new", 200, "new", 2, false},
		{"new", 200, "new", 2, true},
		{catalog.Other, 200, catalog.Other, 3, false}, // joins as a name
		{"late", 200, catalog.Other, 3, false},        // full
		{"", 200, "", 3, false},
	} {
		in := m.StartRequest("", tc.model)
		if in.known != tc.started {
			t.Errorf("%d %q: Inflight.known %v, want %v", i, tc.model, in.known, tc.started)
		}
		if got, _ := m.end(in, &Exchange{Model: tc.model, Status: tc.status}); got != tc.want || m.Models.Len() != tc.held {
			t.Errorf("%d %q status %d: label %q with %d names held, want %q with %d", i, tc.model, tc.status, got, m.Models.Len(), tc.want, tc.held)
		}
	}
}

func TestRecentBounded(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	for i := range dashboard.RecentLen + 50 {
		m.recent.add(&Exchange{Start: time.UnixMilli(int64(i)), Upstream: "u", Selected: true}, "m", 2)
	}
	l := m.RecentRecords()
	if len(l) != dashboard.RecentLen {
		t.Fatalf("%d records kept, want %d", len(l), dashboard.RecentLen)
	}
	if l[0].Time != dashboard.RecentLen+49 || l[len(l)-1].Time != 50 {
		t.Errorf("order: newest %d, oldest %d", l[0].Time, l[len(l)-1].Time)
	}
	if l[0].Model != "m" || l[0].Outcome != OutcomeUpstreamError || l[0].Upstream != "u" {
		t.Errorf("record %+v", l[0])
	}
	m.Reset()
	if len(m.RecentRecords()) != 0 {
		t.Error("Reset kept records")
	}
}
