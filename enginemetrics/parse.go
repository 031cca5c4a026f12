package enginemetrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine is the kind of engine a /metrics page came from.
type Engine uint8

// The engines Parse understands.
const (
	EngineUnknown Engine = iota
	EngineVLLM
	EngineSGLang
)

var engineNames = [...]string{"unknown", "vllm", "sglang"}

func (e Engine) String() string {
	if int(e) < len(engineNames) {
		return engineNames[e]
	}
	return "unknown"
}

// MarshalText makes an Engine a JSON string.
func (e Engine) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// The series Parse reads. vLLM (v1 engine, prometheus_client text
// exposition): every series carries model_name and engine (the
// data-parallel rank); counters are exposed with their _total suffix.
const (
	VLLMRunning        = "vllm:num_requests_running"
	VLLMWaiting        = "vllm:num_requests_waiting"
	VLLMKVUsage        = "vllm:kv_cache_usage_perc"
	VLLMKVUsageLegacy  = "vllm:gpu_cache_usage_perc" // before vLLM v0.10
	VLLMCacheConfig    = "vllm:cache_config_info"    // labels block_size, num_gpu_blocks
	VLLMSpecDrafts     = "vllm:spec_decode_num_drafts_total"
	VLLMSpecDraftToks  = "vllm:spec_decode_num_draft_tokens_total"
	VLLMSpecAccepted   = "vllm:spec_decode_num_accepted_tokens_total"
	VLLMSpecPerPos     = "vllm:spec_decode_num_accepted_tokens_per_pos_total" // label position
	vllmRankLabel      = "engine"
	vllmPositionLabel  = "position"
	vllmBlockSizeLabel = "block_size"
	vllmBlocksLabel    = "num_gpu_blocks"
)

// SGLang (python/sglang/srt/metrics/collector.py): series carry
// model_name, engine_type, tp_rank, pp_rank, moe_ep_rank and, with data
// parallelism, dp_rank. SGLang reports speculative decoding only as
// gauges of the last batch (acceptance rate and length), no counters.
const (
	SGLangRunning      = "sglang:num_running_reqs"
	SGLangWaiting      = "sglang:num_queue_reqs"
	SGLangKVUsage      = "sglang:token_usage"
	SGLangUsedTokens   = "sglang:num_used_tokens"
	SGLangCapacity     = "sglang:max_total_num_tokens"
	SGLangAcceptRate   = "sglang:spec_accept_rate"
	SGLangAcceptLength = "sglang:spec_accept_length"
	sglangRankLabel    = "dp_rank"
)

// Bounds on what one page may describe: ranks per engine and draft
// positions. Past them Parse fails (no engine has that many).
const (
	MaxRanks        = 1024
	MaxSpecPosition = 64
	// maxCount bounds gauge and counter values (2^53: exact in a float64).
	maxCount = 1 << 53
)

// ErrNoEngineMetrics is returned for a page that is valid Prometheus text
// but carries neither vLLM's nor SGLang's running-requests gauge.
var ErrNoEngineMetrics = errors.New("no vLLM or SGLang load metrics")

// Metrics is what one engine's /metrics page says, per data-parallel rank.
type Metrics struct {
	Engine Engine `json:"engine"`
	// Ranks are sorted by Rank. An engine without rank labels has one
	// entry with Rank -1.
	Ranks []RankMetrics `json:"ranks"`
}

// RankMetrics is one data-parallel rank's figures (or the whole engine's,
// Rank -1). Counts are whole numbers.
type RankMetrics struct {
	// Rank is the engine's data-parallel rank (vLLM's engine label,
	// SGLang's dp_rank), -1 when the engine does not label it or for a
	// total over ranks.
	Rank int `json:"rank"`
	// Running and Waiting are the requests in the running batch and in
	// the waiting queue.
	Running int64 `json:"running"`
	Waiting int64 `json:"waiting"`
	// KVUsage is the used share of the KV cache in [0,1]; HasKVUsage is
	// false when the engine did not report it.
	KVUsage    float64 `json:"kv_usage"`
	HasKVUsage bool    `json:"has_kv_usage"`
	// KVCapacityTokens is the KV cache's capacity in tokens, 0 when
	// unknown: vLLM's cache_config_info num_gpu_blocks x block_size,
	// SGLang's max_total_num_tokens.
	KVCapacityTokens int64 `json:"kv_capacity_tokens"`
	// KVUsedTokens is the KV cache's used tokens: SGLang's
	// num_used_tokens, else KVUsage x KVCapacityTokens (0 when either is
	// unknown).
	KVUsedTokens int64 `json:"kv_used_tokens"`
	// BlockSize and NumGPUBlocks are vLLM's cache_config_info labels (0
	// when absent).
	BlockSize    int64 `json:"block_size,omitempty"`
	NumGPUBlocks int64 `json:"num_gpu_blocks,omitempty"`
	// Spec is speculative decoding, when the engine reports it.
	Spec SpecDecode `json:"spec_decode"`
}

// SpecDecode are an engine's speculative-decoding figures. vLLM's are
// cumulative counters (compare two snapshots for a window); SGLang's are
// gauges of recent batches.
type SpecDecode struct {
	// Counters is true when vLLM's spec_decode counters were present.
	Counters bool `json:"counters"`
	// Drafts, DraftTokens and AcceptedTokens are vLLM's
	// spec_decode_num_drafts_total, _num_draft_tokens_total and
	// _num_accepted_tokens_total.
	Drafts         uint64 `json:"drafts"`
	DraftTokens    uint64 `json:"draft_tokens"`
	AcceptedTokens uint64 `json:"accepted_tokens"`
	// AcceptedPerPos[p] is spec_decode_num_accepted_tokens_per_pos_total
	// at position p (0-based), nil when not reported.
	AcceptedPerPos []uint64 `json:"accepted_per_pos,omitempty"`
	// AcceptRate and AcceptLength are SGLang's spec_accept_rate and
	// spec_accept_length gauges; HasAcceptRate reports their presence.
	AcceptRate    float64 `json:"accept_rate,omitempty"`
	AcceptLength  float64 `json:"accept_length,omitempty"`
	HasAcceptRate bool    `json:"has_accept_rate,omitempty"`
}

// Parse reads a Prometheus text exposition page (format 0.0.4) and
// extracts the engine's figures. It reads all of r: bound r (Scraper does).
// Malformed text, out-of-range values and pages without engine load
// metrics are errors.
func Parse(r io.Reader) (Metrics, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("reading metrics: %w", err)
	}
	return ParseBytes(b)
}

// ParseBytes is Parse of a page in memory. Only the lines of the series
// it reads (their samples and their # HELP and # TYPE lines) go through
// expfmt's parser: an engine's page is mostly histograms it does not use.
func ParseBytes(page []byte) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(appendWanted(make([]byte, 0, 4096), page)))
	if err != nil {
		return Metrics{}, fmt.Errorf("parsing metrics: %w", err)
	}
	return FromFamilies(fams)
}

// wanted reports whether Parse reads the series named name.
func wanted(name []byte) bool {
	switch string(name) {
	case VLLMRunning, VLLMWaiting, VLLMKVUsage, VLLMKVUsageLegacy, VLLMCacheConfig, VLLMSpecDrafts,
		VLLMSpecDraftToks, VLLMSpecAccepted, VLLMSpecPerPos, SGLangRunning, SGLangWaiting, SGLangKVUsage,
		SGLangUsedTokens, SGLangCapacity, SGLangAcceptRate, SGLangAcceptLength:
		return true
	}
	return false
}

// appendWanted appends to dst the lines of page that belong to wanted
// series: samples whose name is wanted and "# HELP" / "# TYPE" lines of
// wanted names. Lines that are not Prometheus text at all are kept, so
// that garbage still fails to parse.
func appendWanted(dst, page []byte) []byte {
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		l := bytes.TrimLeft(line, " \t")
		if len(l) == 0 || l[0] == '\n' {
			continue
		}
		var name []byte
		if l[0] == '#' {
			rest, ok := bytes.CutPrefix(l, []byte("# HELP "))
			if !ok {
				rest, ok = bytes.CutPrefix(l, []byte("# TYPE "))
			}
			if !ok {
				continue // a comment
			}
			name = metricName(rest)
		} else {
			name = metricName(l)
			if len(name) == 0 {
				dst = append(dst, line...) // not a sample line: let the parser reject it
				continue
			}
		}
		if wanted(name) {
			dst = append(dst, line...)
			if line[len(line)-1] != '\n' {
				dst = append(dst, '\n')
			}
		}
	}
	return dst
}

// metricName returns the leading metric name of b ([a-zA-Z_:][a-zA-Z0-9_:]*),
// empty when b does not start with one followed by '{', a blank or the end.
func metricName(b []byte) []byte {
	i := 0
	for i < len(b) {
		c := b[i]
		if c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' {
			i++
			continue
		}
		break
	}
	if i == 0 || i < len(b) && b[i] != '{' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		return nil
	}
	return b[:i]
}

// FromFamilies extracts the engine's figures from parsed metric families
// (keyed by name, as expfmt returns them).
func FromFamilies(fams map[string]*dto.MetricFamily) (Metrics, error) {
	b := builder{fams: fams, ranks: map[int]*RankMetrics{}}
	switch {
	case fams[VLLMRunning] != nil:
		b.engine, b.rankLabel = EngineVLLM, vllmRankLabel
		b.vllm()
	case fams[SGLangRunning] != nil:
		b.engine, b.rankLabel = EngineSGLang, sglangRankLabel
		b.sglang()
	default:
		return Metrics{}, ErrNoEngineMetrics
	}
	if b.err != nil {
		return Metrics{}, b.err
	}
	return b.result(), nil
}

// builder accumulates ranks; the first error sticks.
type builder struct {
	fams      map[string]*dto.MetricFamily
	engine    Engine
	rankLabel string
	ranks     map[int]*RankMetrics
	// capacity from cache_config_info by rank (-1: unlabelled).
	blockSize, blocks map[int]int64
	err               error
}

func (b *builder) fail(name string, err error) {
	if b.err == nil {
		b.err = fmt.Errorf("%s: %w", name, err)
	}
}

func (b *builder) rank(m *dto.Metric) (*RankMetrics, bool) {
	r := -1
	if v, ok := label(m, b.rankLabel); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= MaxRanks {
			b.fail(b.rankLabel, fmt.Errorf("label %q is not a rank in [0,%d)", v, MaxRanks))
			return nil, false
		}
		r = n
	}
	rm := b.ranks[r]
	if rm == nil {
		rm = &RankMetrics{Rank: r}
		b.ranks[r] = rm
	}
	return rm, true
}

// each calls fn with every sample of family name and its rank; several
// samples of one rank (other label values: tensor-parallel ranks, models)
// are all passed, and the callers keep the largest value.
func (b *builder) each(name string, fn func(rm *RankMetrics, m *dto.Metric, v float64)) {
	mf := b.fams[name]
	if mf == nil {
		return
	}
	for _, m := range mf.GetMetric() {
		v, ok := value(m)
		if !ok {
			b.fail(name, errors.New("not a gauge, counter or untyped sample"))
			return
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxCount {
			b.fail(name, fmt.Errorf("value %v out of range", v))
			return
		}
		rm, ok := b.rank(m)
		if !ok {
			return
		}
		fn(rm, m, v)
	}
}

func (b *builder) count(name string, set func(rm *RankMetrics) *int64) {
	b.each(name, func(rm *RankMetrics, _ *dto.Metric, v float64) {
		p := set(rm)
		*p = max(*p, int64(math.Round(v)))
	})
}

func (b *builder) counter(name string, set func(rm *RankMetrics) *uint64) {
	b.each(name, func(rm *RankMetrics, _ *dto.Metric, v float64) {
		rm.Spec.Counters = true
		p := set(rm)
		*p = max(*p, uint64(math.Round(v)))
	})
}

func (b *builder) usage(name string) {
	b.each(name, func(rm *RankMetrics, _ *dto.Metric, v float64) {
		v = min(v, 1)
		if !rm.HasKVUsage || v > rm.KVUsage {
			rm.KVUsage = v
		}
		rm.HasKVUsage = true
	})
}

func (b *builder) vllm() {
	b.count(VLLMRunning, func(rm *RankMetrics) *int64 { return &rm.Running })
	b.count(VLLMWaiting, func(rm *RankMetrics) *int64 { return &rm.Waiting })
	if b.fams[VLLMKVUsage] != nil {
		b.usage(VLLMKVUsage)
	} else {
		b.usage(VLLMKVUsageLegacy)
	}
	b.counter(VLLMSpecDrafts, func(rm *RankMetrics) *uint64 { return &rm.Spec.Drafts })
	b.counter(VLLMSpecDraftToks, func(rm *RankMetrics) *uint64 { return &rm.Spec.DraftTokens })
	b.counter(VLLMSpecAccepted, func(rm *RankMetrics) *uint64 { return &rm.Spec.AcceptedTokens })
	b.each(VLLMSpecPerPos, func(rm *RankMetrics, m *dto.Metric, v float64) {
		ps, _ := label(m, vllmPositionLabel)
		p, err := strconv.Atoi(ps)
		if err != nil || p < 0 || p >= MaxSpecPosition {
			b.fail(VLLMSpecPerPos, fmt.Errorf("position %q not in [0,%d)", ps, MaxSpecPosition))
			return
		}
		rm.Spec.Counters = true
		for len(rm.Spec.AcceptedPerPos) <= p {
			rm.Spec.AcceptedPerPos = append(rm.Spec.AcceptedPerPos, 0)
		}
		rm.Spec.AcceptedPerPos[p] = max(rm.Spec.AcceptedPerPos[p], uint64(math.Round(v)))
	})
	// cache_config_info: an info gauge; its labels are the configuration
	// ("None" until the engine sized its cache).
	if mf := b.fams[VLLMCacheConfig]; mf != nil {
		b.blockSize, b.blocks = map[int]int64{}, map[int]int64{}
		for _, m := range mf.GetMetric() {
			r := -1
			if v, ok := label(m, vllmRankLabel); ok && v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 || n >= MaxRanks {
					b.fail(VLLMCacheConfig, fmt.Errorf("label %q is not a rank in [0,%d)", v, MaxRanks))
					return
				}
				r = n
			}
			if bs, ok := intLabel(m, vllmBlockSizeLabel); ok {
				b.blockSize[r] = bs
			}
			if nb, ok := intLabel(m, vllmBlocksLabel); ok {
				b.blocks[r] = nb
			}
		}
	}
}

func (b *builder) sglang() {
	b.count(SGLangRunning, func(rm *RankMetrics) *int64 { return &rm.Running })
	b.count(SGLangWaiting, func(rm *RankMetrics) *int64 { return &rm.Waiting })
	b.usage(SGLangKVUsage)
	b.count(SGLangUsedTokens, func(rm *RankMetrics) *int64 { return &rm.KVUsedTokens })
	b.count(SGLangCapacity, func(rm *RankMetrics) *int64 { return &rm.KVCapacityTokens })
	b.each(SGLangAcceptRate, func(rm *RankMetrics, _ *dto.Metric, v float64) {
		rm.Spec.AcceptRate, rm.Spec.HasAcceptRate = max(rm.Spec.AcceptRate, min(v, 1)), true
	})
	b.each(SGLangAcceptLength, func(rm *RankMetrics, _ *dto.Metric, v float64) {
		rm.Spec.AcceptLength, rm.Spec.HasAcceptRate = max(rm.Spec.AcceptLength, v), true
	})
}

func (b *builder) result() Metrics {
	out := Metrics{Engine: b.engine, Ranks: make([]RankMetrics, 0, len(b.ranks))}
	for _, rm := range b.ranks {
		if b.engine == EngineVLLM {
			bs, okb := b.blockSize[rm.Rank]
			if !okb {
				bs = b.blockSize[-1]
			}
			nb, okn := b.blocks[rm.Rank]
			if !okn {
				nb = b.blocks[-1]
			}
			rm.BlockSize, rm.NumGPUBlocks = bs, nb
			if bs > 0 && nb > 0 && bs <= maxCount/nb {
				rm.KVCapacityTokens = bs * nb
			}
		}
		if rm.KVUsedTokens == 0 && rm.HasKVUsage && rm.KVCapacityTokens > 0 {
			rm.KVUsedTokens = int64(math.Round(rm.KVUsage * float64(rm.KVCapacityTokens)))
		}
		out.Ranks = append(out.Ranks, *rm)
	}
	sort.Slice(out.Ranks, func(i, j int) bool { return out.Ranks[i].Rank < out.Ranks[j].Rank })
	// A rank -1 entry next to labelled ranks only carries unlabelled
	// series of a labelled engine: fold it away when it holds no load.
	if len(out.Ranks) > 1 && out.Ranks[0].Rank == -1 && out.Ranks[0].Running == 0 && out.Ranks[0].Waiting == 0 && !out.Ranks[0].HasKVUsage {
		out.Ranks = out.Ranks[1:]
	}
	return out
}

// Rank returns rank r's figures. r -1 returns Total. An engine that labels
// no ranks answers rank 0 with its only entry (a single-rank engine).
func (m Metrics) Rank(r int) (RankMetrics, bool) {
	if r < 0 {
		return m.Total(), len(m.Ranks) > 0
	}
	for _, rm := range m.Ranks {
		if rm.Rank == r {
			return rm, true
		}
	}
	if r == 0 && len(m.Ranks) == 1 && m.Ranks[0].Rank == -1 {
		rm := m.Ranks[0]
		rm.Rank = 0
		return rm, true
	}
	return RankMetrics{}, false
}

// Total sums the ranks: requests, capacity and used tokens add up, KV
// usage is the capacity-weighted mean (the plain mean when capacity is
// unknown), spec-decode counters add up position by position.
func (m Metrics) Total() RankMetrics {
	if len(m.Ranks) == 1 {
		t := m.Ranks[0]
		t.Rank = -1
		return t
	}
	t := RankMetrics{Rank: -1}
	var usage, weight float64
	n := 0
	for _, rm := range m.Ranks {
		t.Running += rm.Running
		t.Waiting += rm.Waiting
		t.KVCapacityTokens += rm.KVCapacityTokens
		t.KVUsedTokens += rm.KVUsedTokens
		t.BlockSize = max(t.BlockSize, rm.BlockSize)
		t.NumGPUBlocks += rm.NumGPUBlocks
		if rm.HasKVUsage {
			t.HasKVUsage = true
			w := float64(rm.KVCapacityTokens)
			if w == 0 {
				w = 1
			}
			usage += rm.KVUsage * w
			weight += w
		}
		s := &t.Spec
		s.Counters = s.Counters || rm.Spec.Counters
		s.Drafts += rm.Spec.Drafts
		s.DraftTokens += rm.Spec.DraftTokens
		s.AcceptedTokens += rm.Spec.AcceptedTokens
		for p, v := range rm.Spec.AcceptedPerPos {
			for len(s.AcceptedPerPos) <= p {
				s.AcceptedPerPos = append(s.AcceptedPerPos, 0)
			}
			s.AcceptedPerPos[p] += v
		}
		if rm.Spec.HasAcceptRate {
			s.HasAcceptRate = true
			s.AcceptRate += rm.Spec.AcceptRate
			s.AcceptLength += rm.Spec.AcceptLength
			n++
		}
	}
	if weight > 0 {
		t.KVUsage = usage / weight
	}
	if n > 0 {
		t.Spec.AcceptRate /= float64(n)
		t.Spec.AcceptLength /= float64(n)
	}
	return t
}

func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// intLabel reads a positive integer label ("None" and garbage: absent).
func intLabel(m *dto.Metric, name string) (int64, bool) {
	v, ok := label(m, name)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 || n > maxCount {
		return 0, false
	}
	return n, true
}
