package module

import (
	"context"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// sims is a fleet of engine simulators (bench/enginesim) on 127.0.0.1.
type sims []*enginesim.Server

// startSims starts n simulators with options o (TimeScale defaults to 20:
// twenty simulated seconds per wall second). They stop when the test ends.
func startSims(t testing.TB, n int, o enginesim.Options) sims {
	t.Helper()
	if o.TimeScale == 0 && !o.Instant {
		o.TimeScale = 20
	}
	if o.Model == "" {
		o.Model = "qwen3-8b"
	}
	out := make(sims, n)
	for i := range out {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := enginesim.Start(ctx, o)
		cancel()
		if err != nil {
			t.Fatalf("starting engine simulator: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		out[i] = s
	}
	return out
}

// dials lists the simulators' dial addresses.
func (ss sims) dials() []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Addr()
	}
	return out
}

// byRouteID returns the index of the simulator whose replica has the
// opaque route id id in the default fleet, or -1.
func (ss sims) byRouteID(id string) int {
	f := lookupFleet("")
	if f == nil {
		return -1
	}
	for i, s := range ss {
		if f.RouteID(s.Addr()) == id {
			return i
		}
	}
	return -1
}

// requests is the number of generation requests each simulator received.
func (ss sims) requests() []int {
	out := make([]int, len(ss))
	for i, s := range ss {
		for _, r := range s.Stats() {
			out[i] += int(r.Requests)
		}
	}
	return out
}

// busy is the number of sequences running or waiting on all simulators.
func (ss sims) busy() int {
	n := 0
	for _, s := range ss {
		for _, r := range s.Stats() {
			n += r.Engine.Running + r.Engine.Waiting
		}
	}
	return n
}
