package edge

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"testing"
)

// TestLargeBodyBufferSurvivesGC checks that the buffer of a large body is
// read into again by the next large body, across the garbage collections
// that empty the body pool, and that reading one then allocates nothing
// the size of the body.
func TestLargeBodyBufferSurvivesGC(t *testing.T) {
	payload := bytes.Repeat([]byte("x"), 256<<10)
	read := func(check bool) *Body { return readBack(t, payload, false, check) }
	b := read(true)
	first := &b.Bytes()[0]
	b.Release()
	runtime.GC()
	runtime.GC()
	b = read(true)
	if &b.Bytes()[0] != first {
		t.Error("a large body's buffer did not survive two collections")
	}
	b.Release()

	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	const n = 20
	for range n {
		runtime.GC()
		read(false).Release()
	}
	runtime.ReadMemStats(&ms1)
	// The request, reader and body structs are small; a fresh buffer per
	// read would be n * 256 KiB.
	if perRead := (ms1.TotalAlloc - ms0.TotalAlloc) / n; perRead > 64<<10 {
		t.Errorf("%d bytes allocated per large body read, want no fresh buffer", perRead)
	}
}

// TestKeptBuffersBounded checks the bound of the store of large buffers.
func TestKeptBuffersBounded(t *testing.T) {
	var held [][]byte
	for range 2 * keptMax {
		if b := takeBuf(keptMin); b != nil {
			held = append(held, b) // empty the store first
		}
	}
	defer func() {
		for _, b := range held {
			keepBuf(b)
		}
	}()
	if keepBuf(make([]byte, keptMin-1)) {
		t.Error("kept a small buffer")
	}
	n := 0
	for range 2 * keptMax {
		if keepBuf(make([]byte, 0, 1<<20)) {
			n++
		}
	}
	if want := KeptBuffersLimit / (1 << 20); n != want {
		t.Errorf("kept %d buffers of 1 MiB, want %d (KeptBuffersLimit)", n, want)
	}
	if kept.bytes > KeptBuffersLimit || len(kept.bufs) > keptMax {
		t.Errorf("store holds %d bytes in %d buffers, bound %d in %d", kept.bytes, len(kept.bufs), KeptBuffersLimit, keptMax)
	}
	if b := takeBuf(1<<20 + 1); b != nil {
		t.Error("took a buffer smaller than asked for")
	}
	if b := takeBuf(1 << 20); cap(b) != 1<<20 || len(b) != 0 {
		t.Errorf("took cap %d len %d, want an empty 1 MiB buffer", cap(b), len(b))
	}
	for b := takeBuf(keptMin); b != nil; b = takeBuf(keptMin) {
	}
	if kept.bytes != 0 {
		t.Errorf("store empty but counts %d bytes", kept.bytes)
	}
}

// TestChunkedBodyTakesKeptBuffer checks that a body of unknown length (no
// Content-Length: chunked) reads into a kept buffer too, rather than
// growing a fresh one, now that Release keeps large buffers apart from
// the pooled Body.
func TestChunkedBodyTakesKeptBuffer(t *testing.T) {
	payload := bytes.Repeat([]byte("y"), 128<<10)
	read := func(check bool) *Body { return readBack(t, payload, true, check) }
	read(true).Release() // its buffer is kept
	if n, _ := KeptBuffers(); n == 0 {
		t.Fatal("no buffer kept after a 128 KiB body")
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	const n = 10
	for range n {
		read(false).Release()
	}
	runtime.ReadMemStats(&ms1)
	if perRead := (ms1.TotalAlloc - ms0.TotalAlloc) / n; perRead > 64<<10 {
		t.Errorf("%d bytes allocated per chunked body read, want the kept buffer", perRead)
	}
}

// readBack reads payload as a request body with ReadBody (chunked: with no
// Content-Length), reads it back through the returned reader (check: and
// compares it with payload, else only counts it) and returns the Body,
// not yet released.
func readBack(t *testing.T, payload []byte, chunked, check bool) *Body {
	t.Helper()
	var src io.Reader = bytes.NewReader(payload)
	if chunked {
		src = io.NopCloser(src) // http.NewRequest then sets no length
	}
	r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1/chat/completions", src)
	if err != nil {
		t.Fatal(err)
	}
	if chunked {
		r.ContentLength = -1
	}
	b, rd, err := ReadBody(r, 1<<20, nil)
	if err != nil || b == nil {
		t.Fatalf("ReadBody: %v", err)
	}
	if check {
		if got, _ := io.ReadAll(rd); !bytes.Equal(got, payload) {
			t.Fatal("the reader does not give the body back")
		}
	} else if n, _ := io.Copy(io.Discard, rd); n != int64(len(payload)) {
		t.Fatalf("read %d bytes back, want %d", n, len(payload))
	}
	rd.Close()
	return b
}
