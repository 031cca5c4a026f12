package fleetsim

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestRestartSnapshotKeepsCachedShare measures the cached-prompt share of
// the first minute after a ramjet restart, with and without the snapshot,
// against the same minute without a restart (engines keep their caches in
// every case). RAMJET_RESTART_SCALE sets the workloads' scale (default
// 0.25; bench/RESULTS.md quotes 1).
func TestRestartSnapshotKeepsCachedShare(t *testing.T) {
	scale := 0.25
	if s := os.Getenv("RAMJET_RESTART_SCALE"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatal(err)
		}
		scale = v
	}
	const replicas = 8
	for _, name := range []string{"locality", "agent-fleet", "shared-prefix"} {
		t.Run(name, func(t *testing.T) {
			w := generate(t, name, workload.Options{Seed: 1, Replicas: replicas, Scale: scale})
			base := runOne(t, w, "ramjet", replicas, 1)
			last := 0.0
			for _, r := range base.Records {
				last = max(last, r.Sent)
			}
			// Restart at a third of the run, so that the index is warm and
			// a minute of traffic follows.
			at := last / 3
			if last-at < 60 {
				t.Skipf("%s at scale %g lasts %.0fs: no minute after a restart", name, scale, last)
			}
			run := func(snap bool) (*Result, *Restart) {
				p, err := NewRestart(selection.Config{}, time.Duration(at*float64(time.Second)), snap)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Run(Config{Workload: w, Replicas: replicas, Policy: p, Salt: 1})
				if err != nil {
					t.Fatal(err)
				}
				if p.Restarted < 0 {
					t.Fatal("no restart happened")
				}
				return res, p
			}
			cold, pc := run(false)
			warm, pw := run(true)
			from := pc.Restarted.Seconds()
			if d := pw.Restarted.Seconds(); d != from {
				t.Fatalf("restarts at %.3fs and %.3fs: the runs diverged before the restart", from, d)
			}
			none, n := CachedShare(base, from, from+60)
			c, _ := CachedShare(cold, from, from+60)
			s, _ := CachedShare(warm, from, from+60)
			t.Logf("%s scale %g, %d replicas, restart at %.1fs, %d requests in the minute after: cached share no restart %.3f, restart cold %.3f, restart with snapshot %.3f (snapshot %d bytes)",
				name, scale, replicas, from, n, none, c, s, pw.SnapshotBytes)
			if s < c {
				t.Errorf("with the snapshot the first minute's cached share %.3f is below the cold start's %.3f", s, c)
			}
		})
	}
}
