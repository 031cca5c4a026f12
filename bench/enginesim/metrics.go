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
	descCacheCfg = prometheus.NewDesc("vllm:cache_config_info",
		"Information of the LLMEngine CacheConfig.", []string{"block_size", "num_gpu_blocks", "enable_prefix_caching"}, nil)
)

func (s *Server) initMetrics() {
	s.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vllm:time_to_first_token_seconds",
		Help:    "Histogram of time to first token in seconds (simulated engine time).",
		Buckets: ttftBuckets,
	}, labels)
	s.e2e = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vllm:e2e_request_latency_seconds",
		Help:    "Histogram of e2e request latency in seconds (simulated engine time).",
		Buckets: latencyBuckets,
	}, labels)
	s.reg.MustRegister(s.ttft, s.e2e, rankCollector{s})
}

var _ prometheus.Collector = rankCollector{}

// rankCollector reads every rank's engine at scrape time.
type rankCollector struct{ s *Server }

func (c rankCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descWaiting, descKVUsage, descQueries, descHits,
		descPrompt, descGen, descSuccess, descPreempt, descDrafts, descDraftTok, descAccepted, descCacheCfg} {
		ch <- d
	}
}

func (c rankCollector) Collect(ch chan<- prometheus.Metric) {
	model := c.s.opts.Model
	cfg := c.s.opts.Engine
	ch <- prometheus.MustNewConstMetric(descCacheCfg, prometheus.GaugeValue, 1,
		itoa(cfg.BlockSize), itoa(cfg.TotalBlocks()), "True")
	for _, st := range c.s.Stats() {
		e, lv := st.Engine, []string{model, itoa(st.Rank)}
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
	}
}
