package kvindex

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
)

// referenceTokenizeDecode is the decoding before the fast path: encoding/json
// into []int64, then the same checks.
func referenceTokenizeDecode(b []byte, maxTokens int) ([]uint32, error) {
	var out struct {
		Tokens []int64 `json:"tokens"`
		Count  *int    `json:"count"`
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&out); err != nil {
		return nil, err
	}
	if len(out.Tokens) > maxTokens {
		return nil, fmt.Errorf("too many")
	}
	if out.Count != nil && *out.Count != len(out.Tokens) {
		return nil, fmt.Errorf("count")
	}
	toks := make([]uint32, len(out.Tokens))
	for i, v := range out.Tokens {
		if v < 0 || v > 1<<32-1 {
			return nil, fmt.Errorf("range")
		}
		toks[i] = uint32(v)
	}
	return toks, nil
}

var tokRespCases = []struct {
	name, body string
	fast       bool // the fast path decides it
}{
	{"vllm", `{"count":3,"max_model_len":131072,"tokens":[1,22,333],"token_strs":null}`, true},
	{"spaces and order", " {\n \"token_strs\" : [\"a]\\\"}\", \"b\"] ,\"tokens\" : [ 0 , 4294967295 ] , \"count\" : 2 } ", true},
	{"nested other fields", `{"meta":{"a":[1,{"b":"}"}],"c":true,"d":-1.5e3},"tokens":[7]}`, true},
	{"no count", `{"tokens":[5,6]}`, true},
	{"empty", `{"tokens":[],"count":0}`, true},
	{"count mismatch", `{"tokens":[1,2],"count":3}`, true},
	{"trailing data", `{"tokens":[1]} garbage`, true},
	{"null tokens", `{"tokens":null,"count":0}`, false},
	{"no tokens", `{"count":0}`, false},
	{"empty object", `{}`, false},
	{"negative", `{"tokens":[-1]}`, false},
	{"too large", `{"tokens":[4294967296]}`, false},
	{"fraction", `{"tokens":[1.0]}`, false},
	{"exponent", `{"tokens":[1e2]}`, false},
	{"leading zero", `{"tokens":[01]}`, false},
	{"escaped key", `{"tok\u0065ns":[1,2]}`, false},
	{"repeated tokens", `{"tokens":[1],"tokens":[2,3]}`, false},
	{"repeated count", `{"count":1,"count":1,"tokens":[1]}`, false},
	{"truncated", `{"tokens":[1,2`, false},
	{"not json", `<html>`, false},
	{"string id", `{"tokens":["1"]}`, false},
	{"null count", `{"tokens":[1],"count":null}`, false},
}

// TestTokenizeResponseDecode: the fast path and encoding/json agree on
// every shape, and the fast path takes the common ones.
func TestTokenizeResponseDecode(t *testing.T) {
	for _, tc := range tokRespCases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, fast := scanTokenizeResponse([]byte(tc.body))
			if fast != tc.fast {
				t.Errorf("fast path %v, want %v", fast, tc.fast)
			}
			got, err := decodeTokenizeResponse([]byte(tc.body), 1<<18)
			want, werr := referenceTokenizeDecode([]byte(tc.body), 1<<18)
			if (err != nil) != (werr != nil) || !slices.Equal(got, want) {
				t.Fatalf("got %v, %v; encoding/json %v, %v", got, err, want, werr)
			}
		})
	}
	if _, err := decodeTokenizeResponse([]byte(`{"tokens":[1,2,3]}`), 2); err == nil {
		t.Error("more than maxTokens accepted")
	}
}

func FuzzTokenizeResponse(f *testing.F) {
	for _, tc := range tokRespCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeTokenizeResponse(b, 1<<18)
		want, werr := referenceTokenizeDecode(b, 1<<18)
		if (err != nil) != (werr != nil) || !slices.Equal(got, want) {
			t.Fatalf("%q: got %v, %v; encoding/json %v, %v", b, got, err, want, werr)
		}
	})
}

// vllmTokenizeBody is a vLLM-shaped /tokenize answer of n token ids.
func vllmTokenizeBody(n int) []byte {
	b := []byte(`{"count":` + strconv.Itoa(n) + `,"max_model_len":131072,"tokens":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(i*7919%151000), 10)
	}
	return append(b, `],"token_strs":null}`...)
}

// TestTokenizeResponseAllocs: one allocation, the result.
func TestTokenizeResponseAllocs(t *testing.T) {
	b := vllmTokenizeBody(8192)
	if n := testing.AllocsPerRun(50, func() {
		if _, err := decodeTokenizeResponse(b, 1<<18); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Fatalf("%v allocations, want 1", n)
	}
}

func BenchmarkTokenizeResponse(b *testing.B) {
	for _, n := range []int{512, 8192, 65536} {
		body := vllmTokenizeBody(n)
		b.Run(fmt.Sprintf("tokens=%d/scan", n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeTokenizeResponse(body, 1<<18); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("tokens=%d/encoding_json", n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := referenceTokenizeDecode(body, 1<<18); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
