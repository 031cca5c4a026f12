package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// target is one way to reach the engines.
type target struct {
	name string
	url  string // OpenAI base URL, .../v1
}

// scenario is one request shape.
type scenario struct {
	name        string
	promptBytes int
	stream      bool
	maxTokens   int
}

// cell accumulates one (scenario, target) measurement across rounds.
type cell struct {
	hist    loadgen.Histogram
	ok      int
	errors  int
	elapsed time.Duration
	bytes   int64
	sample  string
	cpu     time.Duration // process CPU time (user+system) spent in the cell
	// The process's heap allocations (bytes, objects) in the cell.
	allocBytes, allocs uint64
	// goroutines is how many goroutines the process started in the cell.
	goroutines uint64
}

// bench runs the interleaved measurement.
type bench struct {
	targets     []target
	scenarios   []scenario
	concurrency int
	rounds      int
	round       time.Duration
	bodies      int
	model       string
	client      *http.Client
	cells       map[[2]string]*cell
}

// bodiesFor builds n distinct request bodies of the scenario's size, all
// synthesised from numbers (bench/workload tokens rendered by loadgen):
// body i is a system prompt of group i plus a short user turn.
func (b *bench) bodiesFor(sc scenario) [][]byte {
	out := make([][]byte, b.bodies)
	synth := workload.Synth{Salt: uint64(len(sc.name))<<32 | uint64(sc.promptBytes)}
	tokens := max(1, sc.promptBytes/4-16)
	for i := range out {
		var ids []uint32
		ids = synth.GroupTokens(ids, i, 0, tokens)
		sys := string(loadgen.AppendText(nil, ids))
		ids = synth.SessionTokens(ids[:0], i, 0, 16)
		user := string(loadgen.AppendText(nil, ids))
		body := map[string]any{
			"model": b.model,
			"messages": []map[string]string{
				{"role": "system", "content": sys},
				{"role": "user", "content": user},
			},
			"max_tokens": sc.maxTokens,
			"stream":     sc.stream,
		}
		if sc.stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		out[i], _ = json.Marshal(body)
	}
	return out
}

func newHTTPClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        conns * 4,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// run measures every scenario against every target, interleaved: each
// round runs every (scenario, target) pair for b.round with b.concurrency
// closed-loop clients, rotating the target order from round to round so
// that no target always runs first or last.
func (b *bench) run(ctx context.Context, progress io.Writer) error {
	b.cells = make(map[[2]string]*cell)
	bodies := make(map[string][][]byte)
	for _, sc := range b.scenarios {
		bodies[sc.name] = b.bodiesFor(sc)
		for _, t := range b.targets {
			b.cells[[2]string{sc.name, t.name}] = &cell{}
		}
	}
	// Warm up connections and the proxies' state once per pair.
	for _, sc := range b.scenarios {
		for _, t := range b.targets {
			if err := b.once(ctx, t, sc, bodies[sc.name][0]); err != nil {
				return fmt.Errorf("warm-up %s via %s: %w", sc.name, t.name, err)
			}
		}
	}
	total := b.rounds * len(b.scenarios) * len(b.targets)
	step := 0
	for r := range b.rounds {
		for _, sc := range b.scenarios {
			for k := range b.targets {
				t := b.targets[(k+r)%len(b.targets)]
				if ctx.Err() != nil {
					return ctx.Err()
				}
				b.measure(ctx, t, sc, bodies[sc.name], b.cells[[2]string{sc.name, t.name}])
				step++
				if progress != nil {
					fmt.Fprintf(progress, "\roverhead: %d/%d steps", step, total)
				}
			}
		}
	}
	if progress != nil {
		fmt.Fprintln(progress)
	}
	return nil
}

// once sends one request and checks it succeeded.
func (b *bench) once(ctx context.Context, t target, sc scenario, body []byte) error {
	_, n, err := b.do(ctx, t, body)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("empty response")
	}
	return nil
}

// do sends one request and reads the whole response.
func (b *bench) do(ctx context.Context, t target, body []byte) (time.Duration, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<20))
	resp.Body.Close()
	el := time.Since(start)
	if err != nil {
		return el, n, err
	}
	if resp.StatusCode != http.StatusOK {
		return el, n, fmt.Errorf("status %d", resp.StatusCode)
	}
	return el, n, nil
}

// measure runs b.concurrency closed-loop clients against t for b.round.
func (b *bench) measure(ctx context.Context, t target, sc scenario, bodies [][]byte, c *cell) {
	ctx, cancel := context.WithTimeout(ctx, b.round)
	defer cancel()
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	cpu0 := processCPU()
	bytes0, objects0 := heapCounters()
	gor0 := goroutinesCreated()
	start := time.Now()
	for range b.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local loadgen.Histogram
			ok, bad := 0, 0
			var nbytes int64
			var sample string
			for ctx.Err() == nil {
				body := bodies[int(next.Add(1))%len(bodies)]
				el, n, err := b.do(context.WithoutCancel(ctx), t, body)
				if err != nil {
					bad++
					if sample == "" {
						sample = err.Error()
					}
					continue
				}
				ok++
				nbytes += n
				local.Record(el)
			}
			mu.Lock()
			c.hist.Merge(&local)
			c.ok += ok
			c.errors += bad
			c.bytes += nbytes
			if c.sample == "" {
				c.sample = sample
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.elapsed += time.Since(start)
	c.cpu += processCPU() - cpu0
	bytes1, objects1 := heapCounters()
	c.allocBytes += bytes1 - bytes0
	c.allocs += objects1 - objects0
	c.goroutines += goroutinesCreated() - gor0
}

// row is one line of the result table.
type row struct {
	Scenario    string             `json:"scenario"`
	Concurrency int                `json:"concurrency"`
	Targets     map[string]measure `json:"targets"`
	// Ratios of ramjet (c) to round_robin (b) and to direct (a).
	RPSCB float64 `json:"rps_c_over_b"`
	P50CB float64 `json:"p50_c_over_b"`
	P99CB float64 `json:"p99_c_over_b"`
	RPSCA float64 `json:"rps_c_over_a"`
	P50CA float64 `json:"p50_c_over_a"`
	P99CA float64 `json:"p99_c_over_a"`
	// CPUCB is ramjet's process CPU per request over round_robin's; the
	// process holds the clients and engines too, which cost the same for
	// both, so the proxy's own share of the difference is larger.
	CPUCB float64 `json:"cpu_per_req_c_over_b"`
	// Parts (-parts, -spin): each measured target but direct's req/s over
	// round_robin's and its process CPU per request minus round_robin's
	// (µs), ramjet included.
	PartsRPSOverB   map[string]float64 `json:"parts_rps_over_b,omitempty"`
	PartsCPUExtraUS map[string]float64 `json:"parts_cpu_extra_us,omitempty"`
}

type measure struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	RPS      float64 `json:"rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	// CPUPerReq is the process CPU time (clients, proxy, engines: user and
	// system) per successful request, in microseconds. Unlike throughput
	// and latency it does not depend on how much CPU other processes of
	// the machine take.
	CPUPerReq float64 `json:"cpu_us_per_req"`
	// AllocBytesPerReq and AllocsPerReq are the process's heap allocations
	// per successful request. Like CPUPerReq they hold the clients' and
	// engines' share, the same for every target, and the process's
	// background work (a few objects per request of jitter at c=16); unlike
	// it they barely move with the machine's load, so the difference
	// between two targets is what the proxy allocates differently.
	AllocBytesPerReq float64 `json:"alloc_bytes_per_req"`
	AllocsPerReq     float64 `json:"allocs_per_req"`
	// GoroutinesPerReq is how many goroutines the process started per
	// successful request (net/http's per-connection and background-read
	// goroutines, a proxy's own); like the allocations it barely moves
	// with the machine's load, and each is a wake-up of another thread
	// when a core is idle (c=1).
	GoroutinesPerReq float64 `json:"goroutines_per_req"`
	Sample           string  `json:"error_sample,omitempty"`
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func (b *bench) rows(direct, rr, rj string) []row {
	var out []row
	for _, sc := range b.scenarios {
		r := row{Scenario: sc.name, Concurrency: b.concurrency, Targets: make(map[string]measure)}
		for _, t := range b.targets {
			c := b.cells[[2]string{sc.name, t.name}]
			r.Targets[t.name] = measure{
				Requests: c.ok, Errors: c.errors,
				RPS: ratio(float64(c.ok), c.elapsed.Seconds()),
				P50: float64(c.hist.Quantile(0.5)) / 1e6, P99: float64(c.hist.Quantile(0.99)) / 1e6,
				CPUPerReq:        ratio(float64(c.cpu.Microseconds()), float64(c.ok)),
				AllocBytesPerReq: ratio(float64(c.allocBytes), float64(c.ok)),
				AllocsPerReq:     ratio(float64(c.allocs), float64(c.ok)),
				GoroutinesPerReq: ratio(float64(c.goroutines), float64(c.ok)),
				Sample:           c.sample,
			}
		}
		a, bb, c := r.Targets[direct], r.Targets[rr], r.Targets[rj]
		r.RPSCB, r.P50CB, r.P99CB = ratio(c.RPS, bb.RPS), ratio(c.P50, bb.P50), ratio(c.P99, bb.P99)
		r.RPSCA, r.P50CA, r.P99CA = ratio(c.RPS, a.RPS), ratio(c.P50, a.P50), ratio(c.P99, a.P99)
		r.CPUCB = ratio(c.CPUPerReq, bb.CPUPerReq)
		if len(r.Targets) > len(names3(direct, rr, rj, r.Targets)) && bb.Requests > 0 {
			r.PartsRPSOverB, r.PartsCPUExtraUS = map[string]float64{}, map[string]float64{}
			for n, m := range r.Targets {
				if n == direct || n == rr {
					continue
				}
				r.PartsRPSOverB[n] = ratio(m.RPS, bb.RPS)
				r.PartsCPUExtraUS[n] = m.CPUPerReq - bb.CPUPerReq
			}
		}
		out = append(out, r)
	}
	return out
}

// names3 lists which of the three main targets are in ts.
func names3(direct, rr, rj string, ts map[string]measure) []string {
	var out []string
	for _, n := range []string{direct, rr, rj} {
		if _, ok := ts[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// partsMarkdown renders the -parts columns of rows: each target's req/s
// over round_robin's and its extra CPU per request.
func partsMarkdown(rows []row) string {
	var names []string
	for _, n := range []string{nameRRGuard, nameRRGuardObserve, nameRRSpin, nameRamjet} {
		if len(rows) > 0 {
			if _, ok := rows[0].PartsRPSOverB[n]; ok {
				names = append(names, n)
			}
		}
	}
	var sb strings.Builder
	sb.WriteString("| scenario |")
	for _, n := range names {
		fmt.Fprintf(&sb, " %s / round_robin req/s | %s extra cpu µs/req |", n, n)
	}
	sb.WriteString("\n|---|" + strings.Repeat("---:|", 2*len(names)) + "\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s |", r.Scenario)
		for _, n := range names {
			fmt.Fprintf(&sb, " %.2f | %.0f |", r.PartsRPSOverB[n], r.PartsCPUExtraUS[n])
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// markdown renders rows as a Markdown table.
func markdown(rows []row, names [3]string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| scenario |")
	for _, n := range names {
		fmt.Fprintf(&sb, " %s req/s | %s p50 ms | %s p99 ms |", n, n, n)
	}
	for _, n := range names {
		fmt.Fprintf(&sb, " %s cpu µs/req |", n)
	}
	sb.WriteString(" c/b req/s | c/b p50 | c/b p99 | c/b cpu/req | c/a req/s | c/a p50 | c/a p99 | errors |\n|---|")
	sb.WriteString(strings.Repeat("---:|", 4*len(names)+8) + "\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s |", r.Scenario)
		errs := 0
		for _, n := range names {
			m := r.Targets[n]
			errs += m.Errors
			fmt.Fprintf(&sb, " %.0f | %.2f | %.2f |", m.RPS, m.P50, m.P99)
		}
		for _, n := range names {
			fmt.Fprintf(&sb, " %.0f |", r.Targets[n].CPUPerReq)
		}
		fmt.Fprintf(&sb, " %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d |\n", r.RPSCB, r.P50CB, r.P99CB, r.CPUCB, r.RPSCA, r.P50CA, r.P99CA, errs)
	}
	return sb.String()
}
