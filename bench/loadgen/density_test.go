package loadgen

import (
	"strings"
	"testing"
)

func TestGate(t *testing.T) {
	mk := func(n int, got func(i int) int) []densitySample {
		s := make([]densitySample, n)
		for i := range s {
			s[i] = densitySample{want: 1000, got: got(i), messages: 2}
		}
		return s
	}
	tests := []struct {
		name    string
		give    []densitySample
		over    Overhead
		wantErr string
	}{
		{name: "exact", give: mk(20, func(int) int { return 1000 })},
		{name: "within tolerance", give: mk(20, func(i int) int { return 1010 + i })},
		{name: "template overhead calibrated", give: mk(20, func(int) int { return 1014 }), over: Overhead{Fixed: 4, PerMessage: 5, Calibrated: true}},
		{name: "median drift (tokenizer 1.5x denser)", give: mk(20, func(int) int { return 1500 }), wantErr: "median prompt-token drift +50.0%"},
		{name: "median drift down", give: mk(20, func(int) int { return 700 }), wantErr: "median prompt-token drift -30.0%"},
		{name: "tail drift (history lost)", give: mk(20, func(i int) int {
			if i%5 == 0 {
				return 400
			}
			return 1000
		}), wantErr: "p95 prompt-token drift 60.0%"},
		{name: "no samples", wantErr: "0 requests reported prompt_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Gate{}.Check(measureDensity(tt.give, tt.over))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("want pass, got %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("want error containing %q, got %v", tt.wantErr, err)
			}
		})
	}
}

func TestFitLine(t *testing.T) {
	a, b := fitLine([]float64{1, 2, 3, 5}, []float64{9, 14, 19, 29})
	if d := a - 4; d*d > 1e-9 {
		t.Fatalf("a = %v, want 4", a)
	}
	if d := b - 5; d*d > 1e-9 {
		t.Fatalf("b = %v, want 5", b)
	}
	a, b = fitLine([]float64{3, 3}, []float64{10, 12})
	if a != 11 || b != 0 {
		t.Fatalf("constant x: a=%v b=%v, want 11, 0", a, b)
	}
}
