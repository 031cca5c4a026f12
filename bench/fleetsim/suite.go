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
	out := make([]WorkloadResult, len(sc.Workloads))
	type job struct{ w, p int }
	var jobs []job
	for wi, name := range sc.Workloads {
		wl, err := workload.Generate(name, workload.Options{Seed: sc.Seed, Replicas: sc.Replicas, Scale: sc.Scale})
		if err != nil {
			return nil, err
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
				errs[ji] = fmt.Errorf("%s on %s: %w", sc.Policies[j.p], sc.Workloads[j.w], err)
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
	bs := sc.Engine.BlockSize
	if bs == 0 {
		bs = engine.DefaultConfig().BlockSize
	}
	for wi := range out {
		wl := out[wi].Workload
		share, _, _ := OracleShare(wl, salt, bs)
		n := sc.Replicas
		if wl.Replicas > 0 {
			n = wl.Replicas
		}
		out[wi].Rows = append(out[wi].Rows, Summary{Policy: Oracle, Workload: wl.Name, Replicas: n, CachedShare: share})
		CompareToPeers(out[wi].Rows)
	}
	return out, nil
}
