package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	benchstats "github.com/ramjet-llm/ramjet/bench/stats"
	"github.com/ramjet-llm/ramjet/deploy"
)

// Options configures a demo run. Zero fields take the defaults.
type Options struct {
	// Engines is the number of simulated engines. Default 4.
	Engines int
	// Listen is ramjet's client port. Default 127.0.0.1:8000.
	Listen string
	// OpsListen is the ops port (metrics, dashboard). Default 127.0.0.1:9090.
	OpsListen string
	// AdminListen is Caddy's admin API. Default 127.0.0.1:2019.
	// Run binds the three addresses itself and hands the sockets to Caddy,
	// so a port 0 takes a free port (the banner shows which).
	AdminListen string
	// Agents is the number of concurrent agent sessions. Default 8.
	Agents int
	// Apps is the number of distinct long system prompts the agents share.
	// Default 3.
	Apps int
	// TimeScale runs the engines faster than real time. Default 4.
	TimeScale float64
	// Duration stops the demo after this long; 0 runs until ctx ends.
	Duration time.Duration
	// Interval is the period of the live summary. Default 2s.
	Interval time.Duration
	// Out receives the banner and the live summary. Default os.Stdout.
	Out io.Writer
}

func (o *Options) setDefaults() {
	if o.Engines == 0 {
		o.Engines = 4
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:8000"
	}
	if o.OpsListen == "" {
		o.OpsListen = "127.0.0.1:9090"
	}
	if o.AdminListen == "" {
		o.AdminListen = "127.0.0.1:2019"
	}
	if o.Agents == 0 {
		o.Agents = 8
	}
	if o.Apps == 0 {
		o.Apps = 3
	}
	if o.TimeScale == 0 {
		o.TimeScale = 4
	}
	if o.Interval == 0 {
		o.Interval = 2 * time.Second
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
}

// Summary is what the workload saw through ramjet.
type Summary struct {
	Requests     int
	Errors       int
	PromptTokens int64
	CachedTokens int64
	// PerUpstream counts requests by X-Ramjet-Upstream route id.
	PerUpstream map[string]int
	// TTFTp50 is the median time to first token seen by the clients
	// (over the last 4096 requests, by stats.Percentile).
	TTFTp50 time.Duration
}

// CachedShare is the share of prompt tokens served from prefix cache.
func (s Summary) CachedShare() float64 {
	if s.PromptTokens == 0 {
		return 0
	}
	return float64(s.CachedTokens) / float64(s.PromptTokens)
}

func (s Summary) String() string {
	ids := make([]string, 0, len(s.PerUpstream))
	for id := range s.PerUpstream {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var per strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&per, " %s:%d", id, s.PerUpstream[id])
	}
	return fmt.Sprintf("requests %d  errors %d  cached prompt tokens %.1f%%  TTFT p50 %s  per replica:%s",
		s.Requests, s.Errors, 100*s.CachedShare(), s.TTFTp50.Round(time.Millisecond), per.String())
}

// stats collects the workload's results; bounded (TTFT samples in a ring).
type stats struct {
	mu   sync.Mutex
	sum  Summary
	ttft []time.Duration
	next int
}

const ttftSamples = 4096

func (st *stats) add(upstream string, prompt, cached int64, ttft time.Duration, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sum.Requests++
	if err != nil {
		st.sum.Errors++
		return
	}
	st.sum.PromptTokens += prompt
	st.sum.CachedTokens += cached
	if st.sum.PerUpstream == nil {
		st.sum.PerUpstream = map[string]int{}
	}
	st.sum.PerUpstream[upstream]++
	if len(st.ttft) < ttftSamples {
		st.ttft = append(st.ttft, ttft)
	} else {
		st.ttft[st.next] = ttft
		st.next = (st.next + 1) % ttftSamples
	}
}

func (st *stats) snapshot() Summary {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.sum
	s.PerUpstream = make(map[string]int, len(st.sum.PerUpstream))
	for k, v := range st.sum.PerUpstream {
		s.PerUpstream[k] = v
	}
	if len(st.ttft) > 0 {
		t := make([]float64, len(st.ttft))
		for i, d := range st.ttft {
			t[i] = float64(d)
		}
		slices.Sort(t)
		s.TTFTp50 = time.Duration(benchstats.Percentile(t, 50))
	}
	return s
}

// Run starts the fleet and ramjet, drives the workload until ctx ends or
// Duration passes, prints a live summary, stops everything and returns the
// final summary.
func Run(ctx context.Context, o Options) (Summary, error) {
	o.setDefaults()
	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}

	engines := make([]*enginesim.Server, 0, o.Engines)
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	addrs := make([]string, 0, o.Engines)
	for range o.Engines {
		e, err := enginesim.Start(context.Background(), enginesim.Options{TimeScale: o.TimeScale})
		if err != nil {
			return Summary{}, fmt.Errorf("starting a simulated engine: %w", err)
		}
		engines = append(engines, e)
		addrs = append(addrs, e.Addr())
	}

	var lns []net.Listener
	for _, a := range []*string{&o.Listen, &o.OpsListen, &o.AdminListen} {
		ln, err := net.Listen("tcp", *a)
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return Summary{}, fmt.Errorf("listen: %w", err)
		}
		lns = append(lns, ln)
		*a = ln.Addr().String()
	}
	env := map[string]string{
		"RJ_UPSTREAM":        strings.Join(addrs, ","),
		"RJ_LISTEN":          o.Listen,
		"RJ_METRICS_LISTEN":  o.OpsListen,
		"RJ_ADMIN_LISTEN":    o.AdminListen,
		"RJ_ROUTE_ID_SECRET": "ramjet-demo",
		"RJ_HEALTH_INTERVAL": "1s",
	}
	cfg, err := deploy.Adapt(env)
	if err == nil {
		cfg, err = quietLogs(cfg)
	}
	if err != nil {
		for _, ln := range lns {
			ln.Close()
		}
		return Summary{}, err
	}
	if err := caddyrun.LoadOn(cfg, lns...); err != nil {
		return Summary{}, fmt.Errorf("starting ramjet: %w", err)
	}
	defer caddyrun.Stop() //nolint:errcheck // best effort at exit

	base := "http://" + o.Listen
	fmt.Fprintf(o.Out, `ramjet demo: %d simulated engines (%s), %d agents over %d shared system prompts.

  OpenAI API   %s/v1    (try: curl %s/v1/models)
  health       %s/health
  metrics      http://%s/metrics
  dashboard    http://%s/
  admin        http://%s/ramjet/fleet

Ctrl-C stops everything.

`, o.Engines, strings.Join(addrs, " "), o.Agents, o.Apps, base, base, base, o.OpsListen, o.OpsListen, o.AdminListen)

	if err := waitReady(ctx, base+"/health"); err != nil {
		return Summary{}, err
	}

	var st stats
	var wg sync.WaitGroup
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("demo"), option.WithMaxRetries(0))
	for i := range o.Agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runAgent(ctx, client, i, i%o.Apps, &st)
		}()
	}
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			fmt.Fprintln(o.Out, st.snapshot())
		}
	}
	wg.Wait()
	final := st.snapshot()
	fmt.Fprintf(o.Out, "\nfinal: %s\n", final)
	return final, nil
}

// quietLogs keeps Caddy's own logs to errors, so the live summary stays
// readable (a client closing its stream right after the usage chunk makes
// Caddy warn about an incomplete response).
func quietLogs(cfg []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		return nil, fmt.Errorf("reading the adapted config: %w", err)
	}
	m["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}}
	return json.Marshal(m)
}

// waitReady polls url until it answers 200, for at most 10 seconds.
func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.New("ramjet did not become healthy within 10s")
}

// systemPrompt is app's long shared system prompt (synthetic, deterministic).
func systemPrompt(app int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "You are coding agent #%d of the ramjet demo. Follow these rules.\n", app)
	for i := range 120 {
		fmt.Fprintf(&b, "Rule %d.%d: read the file before you edit it, keep each change small, run the tests, and report what changed in one line.\n", app, i)
	}
	return b.String()
}

// runAgent works in sessions of up to six turns: each turn sends the whole
// conversation so far, streams the answer and appends it.
func runAgent(ctx context.Context, client openai.Client, agent, app int, st *stats) {
	rng := rand.New(rand.NewPCG(uint64(agent), 7))
	sys := systemPrompt(app)
	for session := 0; ctx.Err() == nil; session++ {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys)}
		for turn := 0; turn < 6 && ctx.Err() == nil; turn++ {
			msgs = append(msgs, openai.UserMessage(fmt.Sprintf(
				"Agent %d, session %d, step %d: open pkg/service/file_%d.go, find the failing test and fix it.",
				agent, session, turn, rng.IntN(1000))))
			reply, err := turnOnce(ctx, client, msgs, 32+rng.IntN(96), st)
			if err != nil {
				break
			}
			msgs = append(msgs, openai.AssistantMessage(reply))
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(200+rng.IntN(800)) * time.Millisecond):
			}
		}
	}
}

func turnOnce(ctx context.Context, client openai.Client, msgs []openai.ChatCompletionMessageParamUnion, maxTokens int, st *stats) (string, error) {
	var resp *http.Response
	start := time.Now()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "qwen3-32b",
		Messages:      msgs,
		MaxTokens:     openai.Int(int64(maxTokens)),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}, option.WithResponseInto(&resp))
	defer stream.Close()
	var reply strings.Builder
	var ttft time.Duration
	var prompt, cached int64
	for stream.Next() {
		c := stream.Current()
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			if ttft == 0 {
				ttft = time.Since(start)
			}
			reply.WriteString(c.Choices[0].Delta.Content)
		}
		if c.Usage.PromptTokens > 0 {
			prompt, cached = c.Usage.PromptTokens, c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	err := stream.Err()
	if ctx.Err() != nil {
		return "", ctx.Err() // stopped: not counted
	}
	upstream := ""
	if resp != nil {
		upstream = resp.Header.Get("X-Ramjet-Upstream")
	}
	st.add(upstream, prompt, cached, ttft, err)
	return reply.String(), err
}
