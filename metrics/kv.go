package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/kvindex"
)

// KVSource is one live precise-path service, as the kv collector reads it.
type KVSource struct {
	// Precise is the service: its index, tokenizer and canary.
	Precise *kvindex.Precise
	// Latency reads the tokenize preflights' latency histogram: the count
	// per upper bound, the sum in seconds and the count.
	Latency func() (buckets map[float64]uint64, sum float64, count uint64)
	// RouteID is the opaque route id of a replica key, "" when the replica
	// was not routed yet (its feed series are then left out: never label
	// with an address).
	RouteID func(key string) string
	// Foreign reads the other instances' prefill estimate's totals (the
	// tokens counted and the stored runs they came from); nil when
	// foreign_prefill is off.
	Foreign func() (tokens, runs uint64)
	// Fleet is the service's state key, the fleet label of its per-fleet
	// series.
	Fleet string
	// Decays reads the other instances' estimate's decay time constants
	// (selection.ForeignPrefill.Decays: its prefill, their resident
	// contexts; on false while foreign_prefill is off); nil: none.
	Decays func() (prefill, context time.Duration, on bool)
	// Share reads rho, the others' stored tokens over this instance's own
	// (selection.ForeignPrefill.Share), reported while Decays is on.
	Share func() float64
}

// kvCollector reads every live precise index at scrape time.
type kvCollector struct {
	sources func() []KVSource
}

// NewKVCollector returns the collector of the precise path's series
// (ramjet_kv_*, ramjet_tokenize_*), reading sources at every scrape. Create
// it once and register it into every config's metrics registry.
func NewKVCollector(sources func() []KVSource) prometheus.Collector {
	return kvCollector{sources: sources}
}

var (
	kvEntriesDesc = prometheus.NewDesc("ramjet_kv_index_entries",
		"Entries (replica, block) held by the precise index.", nil, nil)
	kvBytesDesc = prometheus.NewDesc("ramjet_kv_index_bytes",
		"Accounted memory of the precise index, in bytes.", nil, nil)
	kvPredictedDesc = prometheus.NewDesc("ramjet_kv_index_predicted_entries",
		"Predicted entries (routed, not yet confirmed by an event).", nil, nil)
	kvTemplateFeedsDesc = prometheus.NewDesc("ramjet_kv_template_feeds",
		"Live event feeds started from the kv_events template, one per replica of the fleet without a kv_events line of its own.", nil, nil)
	kvOwnGoneDesc = prometheus.NewDesc("ramjet_kv_index_own_remembered_entries",
		"(replica, block) pairs this router sent that the index lost, remembered to keep them marked as its own when the engine stores them again (bounded by 4 x max_predicted).", nil, nil)
	kvEventsDesc = prometheus.NewDesc("ramjet_kv_events_applied_total",
		"KV cache events applied to the precise index.", nil, nil)
	kvDecodeErrDesc = prometheus.NewDesc("ramjet_kv_events_decode_errors_total",
		"KV event messages dropped because they could not be decoded.", nil, nil)
	kvGapsDesc = prometheus.NewDesc("ramjet_kv_events_gaps_total",
		"Sequence gaps seen on the KV event feeds.", nil, nil)
	kvReplayedDesc = prometheus.NewDesc("ramjet_kv_events_replayed_total",
		"KV event messages recovered from the engines' replay sockets.", nil, nil)
	kvEvictionsDesc = prometheus.NewDesc("ramjet_kv_index_evictions_total",
		"Precise index entries evicted to stay within max_entries.", nil, nil)
	kvOrphansDesc = prometheus.NewDesc("ramjet_kv_index_orphans_total",
		"BlockStored events dropped because their parent block was unknown.", nil, nil)
	kvUnknownRemovalsDesc = prometheus.NewDesc("ramjet_kv_index_unknown_removals_total",
		"BlockRemoved hashes the precise index did not hold.", nil, nil)
	kvRemovedDesc = prometheus.NewDesc("ramjet_kv_index_removed_total",
		"Blocks removed from the precise index by BlockRemoved events.", nil, nil)
	kvSkippedDesc = prometheus.NewDesc("ramjet_kv_index_skipped_total",
		"KV events or blocks ignored: unknown kinds, other tiers or groups, invalid block sizes, non-chain blocks.",
		nil, nil)
	kvSizeMismatchDesc = prometheus.NewDesc("ramjet_kv_index_block_size_mismatches_total",
		"BlockStored events whose block size differs from the configured block_size.", nil, nil)
	kvNonChainDesc = prometheus.NewDesc("ramjet_kv_index_non_chain_blocks_total",
		"Blocks skipped because their BlockStored event was provably not one chain under its parent.", nil, nil)
	kvInflightDesc = prometheus.NewDesc("ramjet_kv_index_inflight_entries",
		"(replica, block) pairs of this router's requests in flight, which tell its stored runs from other instances' (kept with the foreign estimate's OwnInflight; bounded by 4 x max_predicted).", nil, nil)
	kvInflightDroppedDesc = prometheus.NewDesc("ramjet_kv_index_inflight_dropped_total",
		"(replica, block) pairs of requests in flight not kept because 4 x max_predicted were.", nil, nil)
	kvPredDroppedDesc = prometheus.NewDesc("ramjet_kv_index_predictions_dropped_total",
		"Predicted entries dropped before their request ended because max_predicted were live.", nil, nil)
	kvTokLateDesc = prometheus.NewDesc("ramjet_tokenize_late_total",
		"Tokenize preflights that missed the timeout, by outcome: predicted (their tokens predicted the chosen replica's blocks), after_end, failed, unrouted.",
		[]string{"outcome"}, nil)
	kvForeignTokDesc = prometheus.NewDesc("ramjet_kv_foreign_prefill_tokens_total",
		"Prompt tokens the engines stored beyond this instance's own pending prefill: other instances' prefill, counted as load (foreign_prefill).", nil, nil)
	kvForeignRunsDesc = prometheus.NewDesc("ramjet_kv_foreign_prefill_runs_total",
		"BlockStored runs of at least a prefill chunk's size counted, wholly or in part, as other instances' prefill (foreign_prefill).", nil, nil)
	kvReplayFailDesc = prometheus.NewDesc("ramjet_kv_replay_failures_total",
		"Replay requests that did not recover every missed KV event message.", nil, nil)
	kvHealthyDesc = prometheus.NewDesc("ramjet_kv_feed_healthy",
		"1 when the replica's KV event stores land in the precise index; 0 when they do not (routed by the estimate).",
		[]string{"upstream"}, nil)
	kvFencesDesc = prometheus.NewDesc("ramjet_kv_fences_total",
		"Replicas fenced (entries dropped, routed by the estimate until events flow), by reason.",
		[]string{"reason"}, nil)
	kvFreshDesc = prometheus.NewDesc("ramjet_kv_feed_fresh",
		"1 when the replica's KV event feed is trusted and its exact overlap is used.",
		[]string{"upstream"}, nil)
	kvCompleteDesc = prometheus.NewDesc("ramjet_kv_feed_complete",
		"1 when the precise index followed the replica's cache from its start.",
		[]string{"upstream"}, nil)
	kvConnectedDesc = prometheus.NewDesc("ramjet_kv_feed_connected",
		"1 when the replica's KV event connection is up.", []string{"upstream"}, nil)
	kvDecisionsDesc = prometheus.NewDesc("ramjet_kv_decisions_total",
		"Routing decisions by how overlap was known: precise (exact, from the index) or approximate.",
		[]string{"mode"}, nil)
	kvTokFallbackDesc = prometheus.NewDesc("ramjet_tokenize_fallbacks_total",
		"Tokenize preflights that failed, by reason; the request was routed by the estimate.",
		[]string{"reason"}, nil)
	kvTokCacheDesc = prometheus.NewDesc("ramjet_tokenize_requests_total",
		"Tokenize lookups: answered from the cache, sent, or joined to an identical one in flight.",
		[]string{"result"}, nil)
	kvTokLatencyDesc = prometheus.NewDesc("ramjet_tokenize_duration_seconds",
		"Latency of the tokenize preflights sent to engines.", nil, nil)
	kvCanaryAccDesc = prometheus.NewDesc("ramjet_kv_canary_accuracy",
		"Share of exact-placement canaries whose predicted cached tokens matched the engine's.", nil, nil)
	kvCanaryErrDesc = prometheus.NewDesc("ramjet_kv_canary_abs_error_tokens",
		"Mean absolute error of the canaries' predicted cached tokens.", nil, nil)
	kvForeignDecayDesc = prometheus.NewDesc("ramjet_kv_foreign_decay_seconds",
		"Decay time constant of the other instances' estimates (foreign_prefill), learned from this instance's own requests: of their prefill (estimate=\"prefill\", the engines' time for a few thousand prompt tokens) and of their resident contexts (estimate=\"context\", a multiple of a request's mean life; 0: not counted). Only while foreign_prefill is on.",
		[]string{"fleet", "estimate"}, nil)
	kvForeignShareDesc = prometheus.NewDesc("ramjet_kv_foreign_share",
		"The prompt tokens the engines stored for other instances over those stored for this instance's own requests, so far (foreign_prefill's rho: about the number of other instances behind a front that deals requests evenly; 0 alone). foreign_prefill queues scales the others' unseen queues by it. Only while foreign_prefill is on.",
		[]string{"fleet"}, nil)
	kvCanaryProbesDesc = prometheus.NewDesc("ramjet_kv_canary_probes_total",
		"Exact-placement canary probes by outcome: measured, failed, or unsupported by the engine.",
		[]string{"outcome"}, nil)
)

func (kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{kvEntriesDesc, kvBytesDesc, kvPredictedDesc, kvOwnGoneDesc, kvEventsDesc,
		kvDecodeErrDesc, kvGapsDesc, kvReplayedDesc, kvEvictionsDesc, kvFencesDesc, kvFreshDesc,
		kvCompleteDesc, kvConnectedDesc, kvDecisionsDesc, kvTokFallbackDesc, kvTokCacheDesc,
		kvTokLatencyDesc, kvCanaryAccDesc, kvCanaryErrDesc, kvCanaryProbesDesc, kvOrphansDesc,
		kvUnknownRemovalsDesc, kvRemovedDesc, kvSkippedDesc, kvSizeMismatchDesc, kvNonChainDesc,
		kvReplayFailDesc, kvHealthyDesc, kvPredDroppedDesc, kvInflightDesc, kvInflightDroppedDesc, kvTokLateDesc, kvForeignTokDesc, kvForeignRunsDesc, kvForeignDecayDesc, kvForeignShareDesc, kvTemplateFeedsDesc} {
		ch <- d
	}
}

func (c kvCollector) Collect(ch chan<- prometheus.Metric) {
	states := c.sources()
	if len(states) == 0 {
		return
	}
	var entries, bytes, predicted, ownGone, inflight, tmplFeeds int64
	var flyDropped uint64
	var events, decodeErr, gaps, replayed, evictions, precise, approx, hits, misses, shared uint64
	var orphans, unknownRm, removed, skipped, sizeMismatch, nonChain, replayFail, predDropped uint64
	var foreignTok, foreignRuns uint64
	var late [len(kvindex.LateOutcomeNames)]uint64
	fences := make([]uint64, len(kvindex.FenceReasons))
	var fallbacks [len(kvindex.FallbackReasons)]uint64
	var canaries bool
	var probes, exact, probeErrs, unsupported uint64
	var absErr float64
	buckets := map[float64]uint64{}
	var sum float64
	var count uint64
	seen := map[string]bool{}
	var reps []kvindex.ReplicaStats
	for _, k := range states {
		x, tk := k.Precise.Index(), k.Precise.Tokenizer()
		entries += x.Entries()
		bytes += x.Bytes()
		predicted += int64(x.Predicted())
		ownGone += int64(x.OwnRemembered())
		inflight += int64(x.Inflight())
		flyDropped += x.InflightDropped()
		tmplFeeds += int64(k.Precise.TemplateFeeds())
		events += x.EventsApplied()
		decodeErr += x.DecodeErrors()
		gaps += x.Gaps()
		replayed += x.Replayed()
		evictions += x.Evictions()
		orphans += x.Orphans()
		unknownRm += x.UnknownRemovals()
		removed += x.Removed()
		skipped += x.Skipped()
		sizeMismatch += x.BlockSizeMismatches()
		nonChain += x.NonChain()
		replayFail += x.ReplayFailures()
		predDropped += x.PredictionsDropped()
		for i, why := range kvindex.FenceReasons {
			fences[i] += x.Fences(why)
		}
		for i := range late {
			late[i] += k.Precise.LateOutcomes(i)
		}
		if k.Foreign != nil {
			t, r := k.Foreign()
			foreignTok += t
			foreignRuns += r
		}
		if k.Decays != nil { // one source per state key (kvLive)
			if p, c, on := k.Decays(); on {
				ch <- prometheus.MustNewConstMetric(kvForeignDecayDesc, prometheus.GaugeValue, p.Seconds(), k.Fleet, "prefill")
				ch <- prometheus.MustNewConstMetric(kvForeignDecayDesc, prometheus.GaugeValue, c.Seconds(), k.Fleet, "context")
				if k.Share != nil {
					ch <- prometheus.MustNewConstMetric(kvForeignShareDesc, prometheus.GaugeValue, k.Share(), k.Fleet)
				}
			}
		}
		pd, ad := k.Precise.Decisions()
		precise += pd
		approx += ad
		for i := range fallbacks {
			fallbacks[i] += tk.Fallbacks(i)
		}
		hits += tk.CacheHits()
		misses += tk.CacheMisses()
		shared += tk.Shared()
		b, s, c := k.Latency()
		for le, n := range b {
			buckets[le] += n
		}
		sum += s
		count += c
		if c := k.Precise.Canary(); c != nil {
			canaries = true
			acc, n := c.Accuracy()
			probes += n
			exact += uint64(acc*float64(n) + 0.5)
			absErr += c.MeanAbsError() * float64(n)
			probeErrs += c.Errors()
			unsupported += c.Unsupported()
		}
		reps = x.AppendReplicaStats(reps[:0])
		for _, st := range reps {
			id := k.RouteID(st.ID)
			if id == "" || seen[id] {
				continue // never label with an address; not routed yet
			}
			seen[id] = true
			ch <- prometheus.MustNewConstMetric(kvFreshDesc, prometheus.GaugeValue, b2f(st.Fresh), id)
			ch <- prometheus.MustNewConstMetric(kvCompleteDesc, prometheus.GaugeValue, b2f(st.Complete), id)
			ch <- prometheus.MustNewConstMetric(kvConnectedDesc, prometheus.GaugeValue, b2f(st.Connected), id)
			ch <- prometheus.MustNewConstMetric(kvHealthyDesc, prometheus.GaugeValue, b2f(st.Healthy), id)
		}
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	gauge(kvEntriesDesc, float64(entries))
	gauge(kvBytesDesc, float64(bytes))
	gauge(kvPredictedDesc, float64(predicted))
	gauge(kvOwnGoneDesc, float64(ownGone))
	gauge(kvInflightDesc, float64(inflight))
	gauge(kvTemplateFeedsDesc, float64(tmplFeeds))
	counter(kvEventsDesc, events)
	counter(kvDecodeErrDesc, decodeErr)
	counter(kvGapsDesc, gaps)
	counter(kvReplayedDesc, replayed)
	counter(kvEvictionsDesc, evictions)
	counter(kvOrphansDesc, orphans)
	counter(kvUnknownRemovalsDesc, unknownRm)
	counter(kvRemovedDesc, removed)
	counter(kvSkippedDesc, skipped)
	counter(kvSizeMismatchDesc, sizeMismatch)
	counter(kvNonChainDesc, nonChain)
	counter(kvReplayFailDesc, replayFail)
	counter(kvPredDroppedDesc, predDropped)
	counter(kvInflightDroppedDesc, flyDropped)
	counter(kvForeignTokDesc, foreignTok)
	counter(kvForeignRunsDesc, foreignRuns)
	for i, o := range kvindex.LateOutcomeNames {
		counter(kvTokLateDesc, late[i], o)
	}
	for i, why := range kvindex.FenceReasons {
		counter(kvFencesDesc, fences[i], why.String())
	}
	counter(kvDecisionsDesc, precise, "precise")
	counter(kvDecisionsDesc, approx, "approximate")
	for i, reason := range kvindex.FallbackReasons {
		counter(kvTokFallbackDesc, fallbacks[i], reason)
	}
	counter(kvTokCacheDesc, hits, "cache_hit")
	counter(kvTokCacheDesc, misses, "sent")
	counter(kvTokCacheDesc, shared, "shared")
	ch <- prometheus.MustNewConstHistogram(kvTokLatencyDesc, count, sum, buckets)
	if canaries {
		acc, mae := 0.0, 0.0
		if probes > 0 {
			acc, mae = float64(exact)/float64(probes), absErr/float64(probes)
		}
		gauge(kvCanaryAccDesc, acc)
		gauge(kvCanaryErrDesc, mae)
		counter(kvCanaryProbesDesc, probes, "measured")
		counter(kvCanaryProbesDesc, probeErrs, "failed")
		counter(kvCanaryProbesDesc, unsupported, "unsupported")
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
