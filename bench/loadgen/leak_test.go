package loadgen_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// TestRunLeaksNoGoroutines: a run, its progress bar and its client leave
// no goroutine behind once the client is closed.
func TestRunLeaksNoGoroutines(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	sim, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: 50})
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.Generate("burst", workload.Options{Seed: 4, Scale: 0.125})
	if err != nil {
		t.Fatal(err)
	}
	client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: sim.URL() + "/v1", Model: "sim", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var bar progressSink
	rep, err := loadgen.Run(context.Background(), loadgen.RunConfig{
		Trace: w.Trace, Client: client, Synth: loadgen.Synthesizer{Synth: workload.Synth{Salt: 4}}, Progress: &bar,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != len(w.Trace) {
		t.Fatalf("completed %d of %d", rep.Completed, len(w.Trace))
	}
	client.Close()
	sim.Close()
	goleak.VerifyNone(t, opts)
}

// progressSink counts progress-bar writes.
type progressSink struct{ n int }

func (p *progressSink) Write(b []byte) (int, error) { p.n++; return len(b), nil }

// TestRunTurnsWithoutDependency: a trace may send a session's next turn
// without waiting for the previous one; it then carries the synthetic
// stand-in for the reply not yet received, and both complete.
func TestRunTurnsWithoutDependency(t *testing.T) {
	sim, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	tr := workload.Trace{
		{ID: 0, After: -1, Session: 0, Turn: 0, Group: 0, Prefix: 64, Input: 200, Output: 20},
		{ID: 1, After: -1, Session: 0, Turn: 1, Group: 0, Prefix: 64, Input: 300, Output: 20},
		{ID: 2, After: 1, Session: 0, Turn: 2, Group: 0, Prefix: 64, Input: 400, Output: 20},
	}
	client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: sim.URL() + "/v1", Model: "sim", Timeout: 10 * time.Second, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	rep, err := loadgen.Run(context.Background(), loadgen.RunConfig{Trace: tr, Client: client, Synth: loadgen.Synthesizer{Synth: workload.Synth{Salt: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 3 {
		t.Fatalf("completed %d of 3: %v %v", rep.Completed, rep.Errors, rep.ErrorSamples)
	}
	if err := (loadgen.Gate{MaxMedianDrift: 0.1, MaxP95Drift: 0.1}).Check(rep.Density); err != nil {
		t.Fatal(err)
	}
}
