package enginemetrics

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// bigPage is a vLLM page of realistic size: the test page plus 16
// histograms of 30 buckets for two engines (vLLM v1 exports about that
// many: TTFT, inter-token, e2e, queue, prefill, decode, prompt and output
// length, iteration tokens...), about 150 KB.
func bigPage(t testing.TB) []byte {
	var sb strings.Builder
	sb.WriteString(readTestdata(t, "vllm_dp2.txt"))
	for h := range 16 {
		name := fmt.Sprintf("vllm:histogram_number_%d_seconds", h)
		fmt.Fprintf(&sb, "# HELP %s A histogram vLLM exports.\n# TYPE %s histogram\n", name, name)
		for e := range 2 {
			for b := range 30 {
				fmt.Fprintf(&sb, "%s_bucket{engine=\"%d\",le=\"%g\",model_name=\"Qwen/Qwen3-32B\"} %d.0\n", name, e, float64(b)*0.25, b*7)
			}
			fmt.Fprintf(&sb, "%s_bucket{engine=\"%d\",le=\"+Inf\",model_name=\"Qwen/Qwen3-32B\"} 300.0\n", name, e)
			fmt.Fprintf(&sb, "%s_count{engine=\"%d\",model_name=\"Qwen/Qwen3-32B\"} 300.0\n", name, e)
			fmt.Fprintf(&sb, "%s_sum{engine=\"%d\",model_name=\"Qwen/Qwen3-32B\"} 1234.5\n", name, e)
		}
	}
	return []byte(sb.String())
}

// parseUnfiltered is ParseBytes without the line filter: the whole page
// through expfmt.
func parseUnfiltered(page []byte) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return Metrics{}, err
	}
	return FromFamilies(fams)
}

// The filter changes nothing in what Parse finds.
func TestParseFilterSame(t *testing.T) {
	page := bigPage(t)
	a, err := ParseBytes(page)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseUnfiltered(page)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) {
		t.Fatalf("filtered %+v\nunfiltered %+v", a, b)
	}
}

// BenchmarkParseBig compares the filtered parse with the whole-page one,
// interleaved in one run: go test ./enginemetrics -run XXX -bench ParseBig -count 5.
func BenchmarkParseBig(b *testing.B) {
	page := bigPage(b)
	for _, bb := range []struct {
		name string
		fn   func([]byte) (Metrics, error)
	}{{"filtered", ParseBytes}, {"unfiltered", parseUnfiltered}} {
		b.Run(bb.name, func(b *testing.B) {
			b.SetBytes(int64(len(page)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bb.fn(page); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
