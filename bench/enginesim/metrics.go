package enginesim

import (
	"github.com/prometheus/client_golang/prometheus"
)

// vLLM's histogram buckets for time to first token (seconds).
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// vLLM's histogram buckets for request latency (seconds).
var latencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
	30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

var labels = []string{"model_name", "engine"}

var (
	descRunning = prometheus.NewDesc("vllm:num_requests_running",
		"Number of requests in model execution batches.", labels, nil)
	descWaiting = prometheus.NewDesc("vllm:num_requests_waiting",
		"Number of requests waiting to be processed.", labels, nil)
	descKVUsage = prometheus.NewDesc("vllm:kv_cache_usage_perc",
		"KV-cache usage. 1 means 100 percent usage.", labels, nil)
	descQueries = prometheus.NewDesc("vllm:prefix_cache_queries_total",
		"Prefix cache queries, in terms of number of queried tokens.", labels, nil)
	descHits = prometheus.NewDesc("vllm:prefix_cache_hits_total",
		"Prefix cache hits, in terms of number of cached tokens.", labels, nil)
	descPrompt = prometheus.NewDesc("vllm:prompt_tokens_total",
		"Number of prefill tokens processed.", labels, nil)
	descGen = prometheus.NewDesc("vllm:generation_tokens_total",
		"Number of generation tokens processed.", labels, nil)
	descSuccess = prometheus.NewDesc("vllm:request_success_total",
		"Count of successfully processed requests.", labels, nil)
	descPreempt = prometheus.NewDesc("vllm:num_preemptions_total",
		"Cumulative number of preemption from the engine.", labels, nil)
	descDrafts = prometheus.NewDesc("vllm:spec_decode_num_drafts_total",
		"Number of spec decoding drafts.", labels, nil)
	descDraftTok = prometheus.NewDesc("vllm:spec_decode_num_draft_tokens_total",
		"Number of draft tokens.", labels, nil)
	descAccepted = prometheus.NewDesc("vllm:spec_decode_num_accepted_tokens_total",
		"Number of accepted tokens.", labels, nil)
	descPerPos = prometheus.NewDesc("vllm:spec_decode_num_accepted_tokens_per_pos_total",
		"Accepted tokens per draft position.", append(append([]string(nil), labels...), "position"), nil)
	descCacheCfg = prometheus.NewDesc("vllm:cache_config_info",
		"Information of the LLMEngine CacheConfig.", []string{"block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"}, nil)
)

func (s *Server) initMetrics() {
	prefix, hl := "vllm:", labels
	var c prometheus.Collector = rankCollector{s}
	if s.opts.Metrics == MetricsSGLang {
		prefix, hl = "sglang:", []string{"model_name", "dp_rank"}
		c = newSGLangCollector(s)
	}
	s.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    prefix + "time_to_first_token_seconds",
		Help:    "Histogram of time to first token in seconds (simulated engine time).",
		Buckets: ttftBuckets,
	}, hl)
	s.e2e = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    prefix + "e2e_request_latency_seconds",
		Help:    "Histogram of e2e request latency in seconds (simulated engine time).",
		Buckets: latencyBuckets,
	}, hl)
	s.reg.MustRegister(s.ttft, s.e2e, c)
}

var _ prometheus.Collector = rankCollector{}

// rankCollector reads every rank's engine at scrape time.
type rankCollector struct{ s *Server }

func (c rankCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descWaiting, descKVUsage, descQueries, descHits,
		descPrompt, descGen, descSuccess, descPreempt, descDrafts, descDraftTok, descAccepted, descPerPos, descCacheCfg} {
		ch <- d
	}
}

func (c rankCollector) Collect(ch chan<- prometheus.Metric) {
	model := c.s.opts.Model
	cfg := c.s.opts.Engine
	for _, st := range c.s.Stats() {
		e, lv := st.Engine, []string{model, itoa(st.Rank)}
		// As vLLM v1: one info series per engine (data-parallel rank).
		ch <- prometheus.MustNewConstMetric(descCacheCfg, prometheus.GaugeValue, 1,
			itoa(cfg.BlockSize), itoa(cfg.TotalBlocks()), "True", itoa(st.Rank))
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		cnt := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
		}
		g(descRunning, float64(e.Running))
		g(descWaiting, float64(e.Waiting))
		g(descKVUsage, e.KVUsage)
		cnt(descQueries, e.PrefixQueries)
		cnt(descHits, e.PrefixHits)
		cnt(descPrompt, e.PromptTokens)
		cnt(descGen, e.GenerationTokens)
		cnt(descSuccess, e.Finished)
		cnt(descPreempt, e.Preemptions)
		cnt(descDrafts, e.SpecDrafts)
		cnt(descDraftTok, e.SpecDraftTokens)
		cnt(descAccepted, e.SpecAcceptedTokens)
		if cfg.SpecTokens > 0 {
			for p := range cfg.SpecTokens {
				var v uint64
				if p < len(e.SpecAcceptedPerPos) {
					v = e.SpecAcceptedPerPos[p]
				}
				ch <- prometheus.MustNewConstMetric(descPerPos, prometheus.CounterValue, float64(v), model, itoa(st.Rank), itoa(p))
			}
		}
	}
}

// sglangCollector exposes the simulated engines under SGLang's names
// (python/sglang/srt/metrics/collector.py) and labels: model_name,
// engine_type, tp_rank, pp_rank, moe_ep_rank, plus dp_rank with several
// ranks. Speculative decoding is reported as SGLang does, by gauges: the
// acceptance rate (accepted / draft tokens) and length (tokens per verify
// step, the bonus token included), here over the engine's whole run.
type sglangCollector struct {
	s                                                       *Server
	running, queue, usage, used, capacity, hitRate          *prometheus.Desc
	acceptRate, acceptLen, promptTok, genTok, requestsTotal *prometheus.Desc
}

func newSGLangCollector(s *Server) sglangCollector {
	l := []string{"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
	if s.opts.DP > 1 {
		l = append(l, "dp_rank")
	}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc("sglang:"+name, help, l, nil) }
	return sglangCollector{s: s,
		running:       d("num_running_reqs", "The number of running requests."),
		queue:         d("num_queue_reqs", "The number of requests in the waiting queue."),
		usage:         d("token_usage", "The token usage."),
		used:          d("num_used_tokens", "The number of used tokens."),
		capacity:      d("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
		hitRate:       d("cache_hit_rate", "The prefix cache hit rate."),
		acceptRate:    d("spec_accept_rate", "The average acceptance rate of speculative decoding."),
		acceptLen:     d("spec_accept_length", "The average acceptance length of speculative decoding."),
		promptTok:     d("prompt_tokens_total", "Number of prefill tokens processed."),
		genTok:        d("generation_tokens_total", "Number of generation tokens processed."),
		requestsTotal: d("num_requests_total", "Number of requests processed."),
	}
}

func (c sglangCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.queue, c.usage, c.used, c.capacity, c.hitRate,
		c.acceptRate, c.acceptLen, c.promptTok, c.genTok, c.requestsTotal} {
		ch <- d
	}
}

func (c sglangCollector) Collect(ch chan<- prometheus.Metric) {
	cfg := c.s.opts.Engine
	for _, st := range c.s.Stats() {
		e := st.Engine
		lv := []string{c.s.opts.Model, "unified", "0", "0", "0"}
		if c.s.opts.DP > 1 {
			lv = append(lv, itoa(st.Rank))
		}
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		cnt := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
		}
		g(c.running, float64(e.Running))
		g(c.queue, float64(e.Waiting))
		g(c.usage, e.KVUsage)
		g(c.used, float64(e.UsedBlocks*cfg.BlockSize))
		g(c.capacity, float64(e.TotalBlocks*cfg.BlockSize))
		hit := 0.0
		if e.PrefixQueries > 0 {
			hit = float64(e.PrefixHits) / float64(e.PrefixQueries)
		}
		g(c.hitRate, hit)
		if cfg.SpecTokens > 0 {
			rate, length := 0.0, 0.0
			if e.SpecDraftTokens > 0 {
				rate = float64(e.SpecAcceptedTokens) / float64(e.SpecDraftTokens)
			}
			if e.SpecDrafts > 0 {
				length = 1 + float64(e.SpecAcceptedTokens)/float64(e.SpecDrafts)
			}
			g(c.acceptRate, rate)
			g(c.acceptLen, length)
		}
		cnt(c.promptTok, e.PromptTokens)
		cnt(c.genTok, e.GenerationTokens)
		cnt(c.requestsTotal, e.Finished)
	}
}
