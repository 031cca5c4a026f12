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
	w, err := workload.Generate("burst", workload.Options{Seed: 4})
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
