package module

import (
	"bytes"
	"context"
	"errors"
	"io"

	"strings"
	"testing"
	"testing/iotest"
)

// TestReadBody reads bodies through readers that return data in odd
// pieces or fail, and checks that the next reader always sees exactly the
// bytes the client sent, followed by the same error if any.
func TestReadBody(t *testing.T) {
	body := []byte(strings.Repeat("0123456789abcdef", 1000)) // 16000 bytes
	errBoom := errors.New("boom")
	tests := []struct {
		name    string
		reader  func() io.Reader
		length  int64 // ContentLength; -1 unknown
		limit   int64
		wantErr error // st.bodyErr
		tailErr error // error after the bytes when reading r.Body again
	}{
		{"whole", func() io.Reader { return bytes.NewReader(body) }, int64(len(body)), 1 << 20, nil, nil},
		{"unknown length", func() io.Reader { return bytes.NewReader(body) }, -1, 1 << 20, nil, nil},
		{"one byte at a time", func() io.Reader { return iotest.OneByteReader(bytes.NewReader(body)) }, -1, 1 << 20, nil, nil},
		{"half reads", func() io.Reader { return iotest.HalfReader(bytes.NewReader(body)) }, -1, 1 << 20, nil, nil},
		{"data with EOF", func() io.Reader { return iotest.DataErrReader(bytes.NewReader(body)) }, -1, 1 << 20, nil, nil},
		{"exactly the limit", func() io.Reader { return bytes.NewReader(body) }, -1, int64(len(body)), nil, nil},
		{"one over the limit", func() io.Reader { return bytes.NewReader(body) }, -1, int64(len(body)) - 1, errBodyTooLarge, nil},
		{"declared over the limit", func() io.Reader { return bytes.NewReader(body) }, int64(len(body)), 100, errBodyTooLarge, nil},
		{"error midway", func() io.Reader {
			return io.MultiReader(bytes.NewReader(body[:5000]), iotest.ErrReader(errBoom))
		}, -1, 1 << 20, errBoom, errBoom},
		{"no progress", func() io.Reader { return zeroReader{} }, -1, 1 << 20, io.ErrNoProgress, io.ErrNoProgress},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := newTestRequest(ctx, nil)
			r.Body, r.ContentLength = io.NopCloser(tt.reader()), tt.length
			st := requestState(r)
			st.readBody(r, tt.limit)
			if !errors.Is(st.bodyErr, tt.wantErr) {
				t.Fatalf("body error %v, want %v", st.bodyErr, tt.wantErr)
			}
			if tt.wantErr == nil && (st.body == nil || !bytes.Equal(st.body.buf, body)) {
				t.Fatal("buffered body differs")
			}
			got, err := io.ReadAll(r.Body)
			if !errors.Is(err, tt.tailErr) {
				t.Fatalf("next reader error %v, want %v", err, tt.tailErr)
			}
			want := body
			if tt.tailErr != nil {
				want = want[:len(got)]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("next reader got %d bytes, want %d identical", len(got), len(want))
			}
			// A second read is a no-op: the body is read once.
			st.readBody(r, tt.limit)
		})
	}
}

type zeroReader struct{}

func (zeroReader) Read([]byte) (int, error) { return 0, nil }

// TestBodyBufRefs checks the reference counting that returns buffers to
// the pool only when no reader and no request holds them.
func TestBodyBufRefs(t *testing.T) {
	b := getBodyBuf()
	b.buf = append(b.buf[:0], "abc"...)
	r1 := b.newReader()
	r2 := b.newReader()
	if got := b.refs.Load(); got != 3 {
		t.Fatalf("refs %d, want 3", got)
	}
	if !r1.untouched() {
		t.Fatal("fresh reader touched")
	}
	if out, _ := io.ReadAll(r1); string(out) != "abc" || r1.untouched() {
		t.Fatalf("read %q", out)
	}
	r1.Close()
	r1.Close() // once only
	if got := b.refs.Load(); got != 2 {
		t.Fatalf("refs after closing a reader twice: %d, want 2", got)
	}
	if _, err := r1.Read(make([]byte, 1)); err != io.ErrClosedPipe {
		t.Fatalf("read after close: %v", err)
	}
	b.release() // the request's reference
	if !b.acquire() {
		t.Fatal("acquire failed while a reader holds the buffer")
	}
	b.release()
	r2.Close()
	if b.acquire() {
		t.Fatal("acquire succeeded on a released buffer")
	}
}

// TestAcquireBodyRecycled checks that a request whose body buffer went
// back to the pool and on to another request cannot take it again.
func TestAcquireBodyRecycled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := newTestRequest(ctx, []byte(`{"model":"a"}`))
	st := requestState(r)
	st.readBody(r, 1<<20)
	b := st.acquireBody()
	if b == nil {
		t.Fatal("no body")
	}
	b.release()
	r.Body.Close() // the transport is done with it
	st.finish()    // the request ends: the buffer returns to the pool
	cancel()
	// Simulate the pool handing the same buffer to another request.
	b.gen.Add(1)
	b.refs.Store(1)
	if got := st.acquireBody(); got != nil {
		t.Fatal("acquired a buffer recycled to another request")
	}
	if n := b.refs.Load(); n != 1 {
		t.Fatalf("refs %d after the failed acquire, want 1", n)
	}
}
