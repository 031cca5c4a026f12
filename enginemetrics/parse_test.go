package enginemetrics

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseVLLMDataParallel(t *testing.T) {
	m, err := Parse(strings.NewReader(readTestdata(t, "vllm_dp2.txt")))
	if err != nil {
		t.Fatal(err)
	}
	want := Metrics{Engine: EngineVLLM, Ranks: []RankMetrics{
		{Rank: 0, Running: 7, Waiting: 2, KVUsage: 0.5, HasKVUsage: true,
			KVCapacityTokens: 12288 * 16, KVUsedTokens: 12288 * 8, BlockSize: 16, NumGPUBlocks: 12288,
			Spec: SpecDecode{Counters: true, Drafts: 100, DraftTokens: 300, AcceptedTokens: 180,
				AcceptedPerPos: []uint64{90, 60, 30}}},
		{Rank: 1, Running: 3, Waiting: 0, KVUsage: 0.25, HasKVUsage: true,
			KVCapacityTokens: 8192 * 16, KVUsedTokens: 8192 * 4, BlockSize: 16, NumGPUBlocks: 8192,
			Spec: SpecDecode{Counters: true, Drafts: 50, DraftTokens: 150, AcceptedTokens: 60,
				AcceptedPerPos: []uint64{40, 20, 0}}},
	}}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Fatalf("Parse (-want +got):\n%s", diff)
	}
	tot := m.Total()
	wantTot := RankMetrics{Rank: -1, Running: 10, Waiting: 2, HasKVUsage: true,
		KVUsage:          (0.5*12288 + 0.25*8192) / (12288 + 8192),
		KVCapacityTokens: 20480 * 16, KVUsedTokens: 12288*8 + 8192*4, BlockSize: 16, NumGPUBlocks: 20480,
		Spec: SpecDecode{Counters: true, Drafts: 150, DraftTokens: 450, AcceptedTokens: 240,
			AcceptedPerPos: []uint64{130, 80, 30}}}
	if diff := cmp.Diff(wantTot, tot); diff != "" {
		t.Fatalf("Total (-want +got):\n%s", diff)
	}
	if r, ok := m.Rank(1); !ok || r.Running != 3 {
		t.Fatalf("Rank(1) = %+v, %v", r, ok)
	}
	if _, ok := m.Rank(2); ok {
		t.Fatal("Rank(2) of a two-rank engine reported")
	}
}

func TestParseSGLang(t *testing.T) {
	m, err := Parse(strings.NewReader(readTestdata(t, "sglang.txt")))
	if err != nil {
		t.Fatal(err)
	}
	want := Metrics{Engine: EngineSGLang, Ranks: []RankMetrics{{Rank: -1, Running: 5, Waiting: 4,
		KVUsage: 0.28, HasKVUsage: true, KVCapacityTokens: 161721, KVUsedTokens: 45284,
		Spec: SpecDecode{AcceptRate: 0.6, AcceptLength: 2.8, HasAcceptRate: true}}}}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Fatalf("Parse (-want +got):\n%s", diff)
	}
	// A single unlabelled engine answers for rank 0 and for the whole.
	if r, ok := m.Rank(0); !ok || r.Running != 5 || r.Rank != 0 {
		t.Fatalf("Rank(0) = %+v, %v", r, ok)
	}
	if r, ok := m.Rank(-1); !ok || r.Waiting != 4 {
		t.Fatalf("Rank(-1) = %+v, %v", r, ok)
	}
}

func TestParseCases(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    *Metrics
		wantErr string
	}{
		{
			name: "legacy gpu_cache_usage_perc, no cache_config, no rank labels",
			give: "vllm:num_requests_running{model_name=\"m\"} 2\nvllm:num_requests_waiting{model_name=\"m\"} 1\n" +
				"vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.125\n",
			want: &Metrics{Engine: EngineVLLM, Ranks: []RankMetrics{{Rank: -1, Running: 2, Waiting: 1, KVUsage: 0.125, HasKVUsage: true}}},
		},
		{
			name: "cache_config_info before the cache is sized",
			give: "vllm:num_requests_running{engine=\"0\"} 0\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\",engine=\"0\"} 1\n",
			want: &Metrics{Engine: EngineVLLM, Ranks: []RankMetrics{{Rank: 0, BlockSize: 16}}},
		},
		{
			name: "unlabelled cache_config_info applies to every rank",
			give: "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"1\"} 1\n" +
				"vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"100\"} 1\n",
			want: &Metrics{Engine: EngineVLLM, Ranks: []RankMetrics{
				{Rank: 0, Running: 1, BlockSize: 32, NumGPUBlocks: 100, KVCapacityTokens: 3200},
				{Rank: 1, Running: 1, BlockSize: 32, NumGPUBlocks: 100, KVCapacityTokens: 3200}}},
		},
		{
			name: "usage above one is clamped; tensor-parallel duplicates keep the largest",
			give: "sglang:num_running_reqs{tp_rank=\"0\"} 3\nsglang:num_running_reqs{tp_rank=\"1\"} 4\nsglang:token_usage 1.5\n",
			want: &Metrics{Engine: EngineSGLang, Ranks: []RankMetrics{{Rank: -1, Running: 4, KVUsage: 1, HasKVUsage: true}}},
		},
		{
			name: "sglang data parallel",
			give: "sglang:num_running_reqs{dp_rank=\"0\"} 1\nsglang:num_running_reqs{dp_rank=\"1\"} 2\n" +
				"sglang:max_total_num_tokens{dp_rank=\"0\"} 1000\nsglang:max_total_num_tokens{dp_rank=\"1\"} 1000\n" +
				"sglang:token_usage{dp_rank=\"0\"} 0.5\nsglang:token_usage{dp_rank=\"1\"} 0.1\n",
			want: &Metrics{Engine: EngineSGLang, Ranks: []RankMetrics{
				{Rank: 0, Running: 1, KVCapacityTokens: 1000, KVUsage: 0.5, HasKVUsage: true, KVUsedTokens: 500},
				{Rank: 1, Running: 2, KVCapacityTokens: 1000, KVUsage: 0.1, HasKVUsage: true, KVUsedTokens: 100}}},
		},
		{name: "empty page", give: "", wantErr: ErrNoEngineMetrics.Error()},
		{name: "another exporter", give: "# TYPE go_goroutines gauge\ngo_goroutines 12\n", wantErr: ErrNoEngineMetrics.Error()},
		{name: "garbage", give: "<html><body>502 Bad Gateway</body></html>", wantErr: "parsing metrics"},
		{name: "binary", give: "\x00\x01\x02\xff\xfe", wantErr: "parsing metrics"},
		{name: "truncated line", give: "vllm:num_requests_running{engine=\"0\"", wantErr: "parsing metrics"},
		{name: "negative", give: "vllm:num_requests_running -1\n", wantErr: "out of range"},
		{name: "NaN", give: "vllm:num_requests_running NaN\n", wantErr: "out of range"},
		{name: "infinite", give: "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_waiting +Inf\n", wantErr: "out of range"},
		{name: "huge", give: "vllm:num_requests_running 1e300\n", wantErr: "out of range"},
		{name: "rank not a number", give: "vllm:num_requests_running{engine=\"x\"} 1\n", wantErr: "is not a rank"},
		{name: "rank too large", give: "vllm:num_requests_running{engine=\"100000\"} 1\n", wantErr: "is not a rank"},
		{name: "position out of range", give: "vllm:num_requests_running 1\nvllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"99\"} 1\n", wantErr: "position"},
		{name: "position missing", give: "vllm:num_requests_running 1\nvllm:spec_decode_num_accepted_tokens_per_pos_total 1\n", wantErr: "position"},
		{name: "histogram where a gauge belongs", give: "# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running_count 1\nvllm:num_requests_running_sum 1\nvllm:num_requests_running_bucket{le=\"+Inf\"} 1\n", wantErr: ErrNoEngineMetrics.Error()},
		{name: "summary where a gauge belongs", give: "# TYPE vllm:num_requests_running summary\nvllm:num_requests_running{quantile=\"0.5\"} 1\n", wantErr: "not a gauge"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q (got %+v)", err, tt.wantErr, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(*tt.want, got); diff != "" {
				t.Fatalf("Parse (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := Parse(strings.NewReader("")); !errors.Is(err, ErrNoEngineMetrics) {
		t.Fatalf("empty page: %v, want ErrNoEngineMetrics", err)
	}
}

func BenchmarkParseVLLM(b *testing.B) {
	page := readTestdata(b, "vllm_dp2.txt")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(strings.NewReader(page)); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm_dp2.txt", "sglang.txt"} {
		f.Add(readTestdata(f, name))
	}
	f.Add("vllm:num_requests_running{engine=\"0\"} 1\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"9223372036854775807\"} 1\n")
	f.Add("sglang:num_running_reqs{dp_rank=\"3\"} 1e15\n")
	f.Add("# TYPE x counter\nx_total 1\n")
	f.Fuzz(func(t *testing.T, page string) {
		m, err := Parse(strings.NewReader(page))
		if err != nil {
			return
		}
		if m.Engine == EngineUnknown || len(m.Ranks) == 0 || len(m.Ranks) > MaxRanks {
			t.Fatalf("accepted page with engine %v and %d ranks", m.Engine, len(m.Ranks))
		}
		for _, rm := range m.Ranks {
			if rm.Running < 0 || rm.Waiting < 0 || rm.KVCapacityTokens < 0 || rm.KVUsedTokens < 0 ||
				rm.KVUsage < 0 || rm.KVUsage > 1 || len(rm.Spec.AcceptedPerPos) > MaxSpecPosition {
				t.Fatalf("out-of-range figures accepted: %+v", rm)
			}
		}
		tot := m.Total()
		if tot.KVUsage < 0 || tot.KVUsage > 1+1e-9 {
			t.Fatalf("total usage %v", tot.KVUsage)
		}
	})
}
