package edge

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// sink keeps the churn of BenchmarkReadBodyLarge alive past the compiler.
var sink []byte

// BenchmarkReadBodyLarge reads a 256 KiB body (ReadBody, the reader
// drained as a transport would, Release) beside an engine-like churn of
// 3 MiB of garbage per request (the overhead bench's echo engine
// allocates about that: io.ReadAll and a JSON decode of the same body),
// which runs the garbage collector every few requests. B/op is what
// ramjet's read allocates besides the churn's 3 MiB.
func BenchmarkReadBodyLarge(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 256<<10)
	rd := bytes.NewReader(payload)
	r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1/chat/completions", io.NopCloser(rd))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		sink = make([]byte, 3<<20)
		rd.Reset(payload)
		r.Body, r.ContentLength = io.NopCloser(rd), int64(len(payload))
		body, br, err := ReadBody(r, 1<<20, nil)
		if err != nil {
			b.Fatal(err)
		}
		if n, _ := io.Copy(io.Discard, br); n != int64(len(payload)) {
			b.Fatalf("read %d bytes back", n)
		}
		br.Close()
		body.Release()
	}
}
