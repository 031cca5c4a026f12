package fleetstate

import (
	"sort"
	"time"

	"github.com/ramjet-llm/ramjet/enginemetrics"
)

// EngineStates is the /ramjet/fleet view of a scraper's snapshots at now,
// by upstream id (replicas without one are left out).
func EngineStates(snaps []enginemetrics.Snapshot, now time.Time) []EngineState {
	out := make([]EngineState, 0, len(snaps))
	for _, sn := range snaps {
		if sn.ID == "" {
			continue
		}
		es := EngineState{Upstream: sn.ID, State: sn.State(now).String(), Result: sn.Result.String(),
			Engine: sn.Engine.String(), Metrics: sn.Metrics, ConsecutiveFailures: sn.Failures,
			Local: sn.Local, External: enginemetrics.Fuse(sn, now)}
		if sn.AttemptedAt.IsZero() {
			es.Result = ""
		}
		if !sn.ScrapedAt.IsZero() {
			t := sn.ScrapedAt
			es.ScrapedAt, es.AgeSeconds = &t, now.Sub(t).Seconds()
		}
		out = append(out, es)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Upstream < out[j].Upstream })
	return out
}
