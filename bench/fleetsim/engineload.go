package fleetsim

import (
	"math"
	"time"

	"github.com/ramjet-llm/ramjet/enginemetrics"
)

// RamjetEngineLoad, when positive, makes the ramjet policies scrape the
// simulated engines at that interval (RamjetSetup.EngineLoad), as the
// module's engine_metrics does; fleetsim's -engine-load sets it.
var RamjetEngineLoad time.Duration

// engineScraper is a Policy that reads the engines' metrics on an
// interval. Run calls ScrapeEngines before every event with the event's
// time; nothing in the fleet changes between two events, so the figures
// read then are the ones a scrape at the last interval boundary saw.
type engineScraper interface {
	ScrapeEngines(now time.Duration, fleet []*Replica)
}

var _ engineScraper = (*Ramjet)(nil)

// simEpoch is the wall-clock time of simulated time 0, for snapshots.
var simEpoch = time.Unix(0, 0)

// ScrapeEngines is the module's engine_metrics path over the simulated
// fleet: when an interval boundary passed since the last scrape, each
// engine's running and waiting requests, KV usage and capacity (what
// vLLM's /metrics reports) and this policy's own reservations become an
// enginemetrics.Snapshot at that boundary, fused (enginemetrics.Fuse) and
// handed to the router (External.Apply), as module/engines.go does after
// each scrape. A no-op unless RamjetSetup.EngineLoad is set. Several
// ramjet instances in front of one fleet (each its own Ramjet) call it
// with the same fleet: each then sees the others' requests.
func (p *Ramjet) ScrapeEngines(now time.Duration, fleet []*Replica) {
	p.now = now // the router's clock (lingering context)
	iv := p.setup.EngineLoad
	if iv <= 0 || now < p.nextScrape {
		return
	}
	if err := p.ensure(fleet); err != nil {
		return
	}
	at := now / iv * iv
	p.nextScrape = at + iv
	scraped := simEpoch.Add(at)
	for i, rep := range fleet {
		s := p.cands[i].Slot
		in, pend := p.rt.Load(s)
		m := enginemetrics.RankMetrics{Rank: -1, Running: int64(rep.Running()), Waiting: int64(rep.Waiting()),
			KVUsage: rep.KVUsage(), HasKVUsage: true, KVCapacityTokens: int64(rep.KVCapacity)}
		m.KVUsedTokens = int64(math.Round(m.KVUsage * float64(m.KVCapacityTokens)))
		sn := enginemetrics.Snapshot{Engine: enginemetrics.EngineVLLM, Metrics: m, ScrapedAt: scraped, AttemptedAt: scraped,
			Result: enginemetrics.ResultOK, StaleAfter: 3 * iv,
			Local: enginemetrics.Local{Inflight: in, PendingPrefill: pend, ResidentTokens: p.rt.Resident(s)}}
		ext := enginemetrics.Fuse(sn, simEpoch.Add(now))
		ext.Apply(p.rt, s)
		p.extSeen += ext.Requests()
	}
	p.scrapes++
}

// Scrapes is how many scrapes ScrapeEngines took.
func (p *Ramjet) Scrapes() int { return p.scrapes }

// ExternalSeen sums the external requests of every replica over every
// scrape: zero when this policy is the only router in front of the fleet.
func (p *Ramjet) ExternalSeen() int64 { return p.extSeen }
