package fleetsim

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// MultiSuiteConfig describes a multi-router comparison: every policy
// (MultiPolicyNames) with every instance count on every workload.
type MultiSuiteConfig struct {
	// Workloads to run, by name (workload.Names); Traces are further
	// workloads (replayed trace files).
	Workloads []string
	Traces    []*workload.Workload
	// Policies are MultiPolicyNames entries.
	Policies []string
	// Routers are the instance counts (e.g. 1, 2, 4). A sync variant is
	// not run with one instance: that is its base policy, whose
	// single-instance row is added when the policies do not list it.
	Routers []int
	// Front splits the traffic over the instances.
	Front    Front
	Replicas int
	Scale    float64
	// Ramjet is ramjet's configuration (zero fields: selection defaults).
	Ramjet selection.Config
	// Engine is the engine model of every replica.
	Engine engine.Config
	// Parallel bounds concurrent runs; 0 means GOMAXPROCS.
	Parallel int
	// Progress, when set, gets one line per finished run.
	Progress io.Writer
}

// MultiRow is one (policy, instance count) row over seeds, with its
// figures relative to one instance of the same base policy (the sync
// variants to their base policy's single instance).
type MultiRow struct {
	SeedSummary
	Base    string `json:"base_policy"`
	Routers int    `json:"routers"`
	Front   string `json:"front"`
	// VsOne holds median ratios against the base policy's one instance:
	// cached share (>= 1 is no loss), TTFT p50/p99 and output tok/s; 0
	// when that row was not run (Routers without 1).
	VsOne struct {
		CachedShare float64 `json:"cached_share"`
		TTFTp50     float64 `json:"ttft_p50"`
		TTFTp99     float64 `json:"ttft_p99"`
		OutputTPS   float64 `json:"output_tokens_per_s"`
	} `json:"vs_one_instance"`
	// Dispatched is the first seed's request count per instance.
	Dispatched []int `json:"dispatched_first_seed"`
}

// MultiResult is one workload's rows.
type MultiResult struct {
	Workload *workload.Workload // the first seed's
	Rows     []MultiRow
}

type multiRun struct {
	pol     string
	routers int
}

func (sc MultiSuiteConfig) runs() []multiRun {
	var out []multiRun
	seen := map[multiRun]bool{}
	add := func(r multiRun) {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, p := range sc.Policies {
		for _, k := range sc.Routers {
			if base, ok := strings.CutSuffix(p, SyncSuffix); ok && k == 1 {
				add(multiRun{base, 1})
				continue
			}
			add(multiRun{p, k})
		}
	}
	return out
}

// RunMultiSeeds runs the multi-router comparison once per seed (workloads
// generated with the seed, peers' and fronts' random choices seeded with
// it, the synthesised content salted with it) and aggregates every row
// over the seeds: median, min and max.
func RunMultiSeeds(sc MultiSuiteConfig, seeds []uint64) ([]MultiResult, error) {
	if sc.Parallel <= 0 {
		sc.Parallel = runtime.GOMAXPROCS(0)
	}
	if len(seeds) == 0 {
		return nil, fmt.Errorf("multi: no seeds")
	}
	runs := sc.runs()
	nw := len(sc.Workloads) + len(sc.Traces)
	// ws[s][w] is workload w under seed s.
	ws := make([][]*workload.Workload, len(seeds))
	for si, seed := range seeds {
		ws[si] = make([]*workload.Workload, nw)
		for wi := range nw {
			if wi < len(sc.Workloads) {
				w, err := workload.Generate(sc.Workloads[wi], workload.Options{Seed: seed, Replicas: sc.Replicas, Scale: sc.Scale})
				if err != nil {
					return nil, err
				}
				ws[si][wi] = w
			} else {
				ws[si][wi] = sc.Traces[wi-len(sc.Workloads)]
			}
		}
	}
	// sums[w][s][r] is run r's summary on workload w under seed s.
	sums := make([][][]Summary, nw)
	disp := make([][][]int, nw)
	for wi := range sums {
		sums[wi] = make([][]Summary, len(seeds))
		for si := range seeds {
			sums[wi][si] = make([]Summary, len(runs))
		}
		disp[wi] = make([][]int, len(runs))
	}
	ec := sc.Engine
	ec.SetDefaults()
	type job struct{ w, s, r int }
	// A sync variant's instances share one state, so it routes exactly
	// as its base policy's one instance (TestMultiOneInstanceIsTheSingle
	// proves it, record for record): its rows are that run's, not run
	// again. synced[ri] is the base run's index, -1 for the others.
	synced := make([]int, len(runs))
	for ri, run := range runs {
		synced[ri] = -1
		if base, ok := strings.CutSuffix(run.pol, SyncSuffix); ok {
			synced[ri] = slices.Index(runs, multiRun{base, 1})
		}
	}
	var jobs []job
	for wi := range nw {
		for si := range seeds {
			for ri := range runs {
				if synced[ri] < 0 {
					jobs = append(jobs, job{wi, si, ri})
				}
			}
		}
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, sc.Parallel)
	for ji, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			seed, run, w := seeds[j.s], runs[j.r], ws[j.s][j.w]
			pol, err := NewMulti(run.pol, run.routers, sc.Front, seed, sc.Ramjet)
			if err != nil {
				errs[ji] = err
				return
			}
			res, err := Run(Config{Workload: w, Replicas: sc.Replicas, Engine: sc.Engine, Policy: pol, Salt: seed})
			if err != nil {
				errs[ji] = fmt.Errorf("%s on %s, seed %d: %w", pol.Name(), w.Name, seed, err)
				return
			}
			s := Summarize(res)
			s.ttfts = nil
			n := res.Replicas
			s.OracleShare, _, _ = OracleShare(w, seed, ec.BlockSize)
			s.PooledShare, _, _ = PooledOracleShare(w, seed, ec.BlockSize, n*ec.TotalBlocks())
			sums[j.w][j.s][j.r] = s
			if sc.Progress != nil {
				fmt.Fprintf(sc.Progress, "fleetsim: %s on %s (%d replicas), seed %d: %.1fs%s\n", pol.Name(), w.Name, n, seed, res.Wall.Seconds(), foreignShares(pol))
			}
			if j.s == 0 {
				disp[j.w][j.r] = multiOf(pol).Dispatched
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for wi := range nw {
		for ri, b := range synced {
			if b < 0 {
				continue
			}
			for si := range seeds {
				s := sums[wi][si][b]
				s.Policy = fmt.Sprintf("%s x%d %s", runs[ri].pol, runs[ri].routers, sc.Front)
				sums[wi][si][ri] = s
			}
			disp[wi][ri] = nil
		}
	}
	out := make([]MultiResult, nw)
	for wi := range out {
		agg := Aggregate(sums[wi])
		rows := make([]MultiRow, len(runs))
		one := map[string]SeedSummary{}
		for ri, run := range runs {
			if run.routers == 1 {
				one[run.pol] = agg[ri]
			}
		}
		for ri, run := range runs {
			base, _ := strings.CutSuffix(run.pol, SyncSuffix)
			r := MultiRow{SeedSummary: agg[ri], Base: base, Routers: run.routers, Front: sc.Front.String(), Dispatched: disp[wi][ri]}
			r.VsBest = nil
			if b, ok := one[base]; ok {
				r.VsOne.CachedShare = finiteRatio(r.CachedShare.Median, b.CachedShare.Median)
				r.VsOne.TTFTp50 = finiteRatio(r.TTFTp50.Median, b.TTFTp50.Median)
				r.VsOne.TTFTp99 = finiteRatio(r.TTFTp99.Median, b.TTFTp99.Median)
				r.VsOne.OutputTPS = finiteRatio(r.OutputTPS.Median, b.OutputTPS.Median)
			}
			rows[ri] = r
		}
		out[wi] = MultiResult{Workload: ws[0][wi], Rows: rows}
	}
	return out, nil
}

// finiteRatio is a/b, 1 when both are 0 (e.g. no cached tokens either
// way) and 0 (no figure) when only b is.
func finiteRatio(a, b float64) float64 {
	switch {
	case b != 0:
		return a / b
	case a == 0:
		return 1
	}
	return 0
}

// multiOf returns the Multi behind a NewMulti policy.
// foreignShares is, for a multi-router run whose instances keep the others'
// prefill estimate ("fp"), each instance's foreign share rho
// (ForeignPrefill.Share) and its counted runs, for the progress line ("" for
// the others).
func foreignShares(p Policy) string {
	m := multiOf(p)
	if m == nil {
		return ""
	}
	var b strings.Builder
	for _, q := range m.inst {
		if rp, ok := q.(*RamjetPrecise); ok && rp.fp != nil {
			_, runs := rp.fp.Counted()
			fmt.Fprintf(&b, " %.3f/%d", rp.fp.Share(), runs)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "; foreign rho/runs per instance:" + b.String()
}

func multiOf(p Policy) *Multi {
	switch m := p.(type) {
	case *Multi:
		return m
	case multiHashes:
		return m.Multi
	}
	return nil
}

// MultiAcceptance is issue 13's bar for several instances against one:
// at least this share of one instance's cached share and at most this
// factor of its TTFT p50 and p99.
const (
	MultiAcceptCachedShare = 0.95
	MultiAcceptTTFT        = 1.1
)

// Accepted reports whether a row meets MultiAcceptance against its base
// policy's single instance (always true for one instance).
func (r MultiRow) Accepted() bool {
	return r.VsOne.CachedShare >= MultiAcceptCachedShare && r.VsOne.TTFTp50 <= MultiAcceptTTFT && r.VsOne.TTFTp99 <= MultiAcceptTTFT
}

// WriteMultiTable writes one workload's multi-router rows as a markdown
// table: each figure the median over seeds (min-max), then its ratio to
// one instance of the same base policy.
func WriteMultiTable(w io.Writer, title string, rows []MultiRow) {
	fmt.Fprintf(w, "### %s\n\n", title)
	fmt.Fprintln(w, "Median over seeds (min-max); x1 = ratio to one instance of the same policy (cached share >= 0.95 and TTFT <= 1.10 meet issue 13's bar).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| policy | instances | cached share | x1 | TTFT p50 (s) | x1 | TTFT p99 (s) | x1 | output tok/s | x1 | replicas used | max/mean load | failed | bar |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	f := Spread.Format
	x := func(v float64) string {
		if v == 0 || math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	for _, r := range rows {
		bar := ""
		if r.Routers > 1 && r.VsOne.CachedShare != 0 {
			bar = "no"
			if r.Accepted() {
				bar = "yes"
			}
		}
		name := r.Policy
		if i := strings.Index(name, " x"); i >= 0 {
			name = name[:i]
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s/%d | %s | %s | %s |\n",
			name, r.Routers, f(r.CachedShare, 3), x(r.VsOne.CachedShare), f(r.TTFTp50, 3), x(r.VsOne.TTFTp50),
			f(r.TTFTp99, 2), x(r.VsOne.TTFTp99), f(r.OutputTPS, 0), x(r.VsOne.OutputTPS),
			f(r.ReplicasUsed, 0), r.Replicas, f(r.MaxMeanLoad, 2), f(r.Failed, 0), bar)
	}
	if len(rows) > 0 {
		fmt.Fprintf(w, "\noracle cached share: infinite cache %s, pooled LRU of the fleet's KV %s\n", f(rows[0].OracleShare, 3), f(rows[0].PooledShare, 3))
	}
	fmt.Fprintln(w)
}
