package fleetsim

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// SuiteConfig describes a set of runs: every policy on every workload.
type SuiteConfig struct {
	// Workloads to run, by name (workload.Names).
	Workloads []string
	// Traces are further workloads to run after the named ones (a replayed
	// trace file, see workload.ReadWith); their Replicas, when set, win as
	// for the named ones.
	Traces []*workload.Workload
	// Policies to run, by name (PolicyNames).
	Policies []string
	Replicas int
	// Seed seeds the workload generators and the peers' random choices.
	Seed uint64
	// Scale scales the larger workloads (see workload.Options).
	Scale float64
	// Ramjet is ramjet's configuration (zero fields: selection defaults).
	Ramjet selection.Config
	// Engine is the engine model of every replica.
	Engine engine.Config
	// Parallel bounds concurrent runs; 0 means GOMAXPROCS.
	Parallel int
}

// WorkloadResult holds one workload's rows (policies in order, then the
// oracle) and the full results behind them.
type WorkloadResult struct {
	Workload *workload.Workload
	Rows     []Summary
	Results  []*Result
}

// RunSuite runs every policy on every workload. Runs are independent and
// each is deterministic, so running them in parallel changes nothing but
// the wall time.
func RunSuite(sc SuiteConfig) ([]WorkloadResult, error) {
	if sc.Parallel <= 0 {
		sc.Parallel = runtime.GOMAXPROCS(0)
	}
	out := make([]WorkloadResult, len(sc.Workloads)+len(sc.Traces))
	type job struct{ w, p int }
	var jobs []job
	for wi := range out {
		var wl *workload.Workload
		if wi < len(sc.Workloads) {
			var err error
			wl, err = workload.Generate(sc.Workloads[wi], workload.Options{Seed: sc.Seed, Replicas: sc.Replicas, Scale: sc.Scale})
			if err != nil {
				return nil, err
			}
		} else {
			wl = sc.Traces[wi-len(sc.Workloads)]
		}
		out[wi].Workload = wl
		out[wi].Rows = make([]Summary, len(sc.Policies))
		out[wi].Results = make([]*Result, len(sc.Policies))
		for pi := range sc.Policies {
			jobs = append(jobs, job{wi, pi})
		}
	}
	salt := sc.Seed
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, sc.Parallel)
	for ji, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			pol, err := NewPolicy(sc.Policies[j.p], sc.Seed, sc.Ramjet)
			if err != nil {
				errs[ji] = err
				return
			}
			res, err := Run(Config{
				Workload: out[j.w].Workload, Replicas: sc.Replicas, Engine: sc.Engine,
				Policy: pol, Salt: salt,
			})
			if err != nil {
				errs[ji] = fmt.Errorf("%s on %s: %w", sc.Policies[j.p], out[j.w].Workload.Name, err)
				return
			}
			out[j.w].Results[j.p] = res
			out[j.w].Rows[j.p] = Summarize(res)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	ec := sc.Engine
	ec.SetDefaults()
	for wi := range out {
		wl := out[wi].Workload
		share, _, _ := OracleShare(wl, salt, ec.BlockSize)
		n := sc.Replicas
		if wl.Replicas > 0 {
			n = wl.Replicas
		}
		pooled, _, _ := PooledOracleShare(wl, salt, ec.BlockSize, n*ec.TotalBlocks())
		for i := range out[wi].Rows {
			out[wi].Rows[i].OracleShare, out[wi].Rows[i].PooledShare = share, pooled
		}
		out[wi].Rows = append(out[wi].Rows, Summary{
			Policy: Oracle, Workload: wl.Name, Replicas: n, CachedShare: share,
			OracleShare: share, PooledShare: pooled,
		})
		CompareToPeers(out[wi].Rows)
	}
	return out, nil
}

// SeedsResult is one workload's outcome over several seeds: the rows of
// each seed (policies in order, then the oracle) and their aggregate.
type SeedsResult struct {
	Workload *workload.Workload // the first seed's
	Seeds    []uint64
	PerSeed  [][]Summary
	Rows     []SeedSummary
	// First holds the first seed's full results (for plots).
	First []*Result
}

// RunSeeds runs the suite once per seed (sc.Seed is replaced) and
// aggregates each policy's figures over the seeds: median, min and max.
func RunSeeds(sc SuiteConfig, seeds []uint64) ([]SeedsResult, error) {
	if len(seeds) == 0 {
		seeds = []uint64{sc.Seed}
	}
	var out []SeedsResult
	for k, seed := range seeds {
		sc.Seed = seed
		res, err := RunSuite(sc)
		if err != nil {
			return nil, fmt.Errorf("seed %d: %w", seed, err)
		}
		if k == 0 {
			out = make([]SeedsResult, len(res))
			for i, wr := range res {
				out[i] = SeedsResult{Workload: wr.Workload, Seeds: seeds, First: wr.Results}
			}
		}
		for i, wr := range res {
			out[i].PerSeed = append(out[i].PerSeed, wr.Rows)
		}
	}
	for i := range out {
		out[i].Rows = Aggregate(out[i].PerSeed)
	}
	return out, nil
}
