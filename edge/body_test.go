package edge

import (
	"io"
	"testing"
)

// TestBodyRefs checks the reference counting that returns buffers to
// the pool only when no reader and no request holds them.
func TestBodyRefs(t *testing.T) {
	b := GetBody()
	b.buf = append(b.buf[:0], "abc"...)
	r1 := b.NewReader(nil)
	r2 := b.NewReader(nil)
	if got := b.refs.Load(); got != 3 {
		t.Fatalf("refs %d, want 3", got)
	}
	if !r1.Untouched() {
		t.Fatal("fresh reader touched")
	}
	if out, _ := io.ReadAll(r1); string(out) != "abc" || r1.Untouched() {
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
	b.Release() // the request's reference
	if !b.Acquire() {
		t.Fatal("acquire failed while a reader holds the buffer")
	}
	b.Release()
	r2.Close()
	if b.Acquire() {
		t.Fatal("acquire succeeded on a released buffer")
	}
}

// TestAcquireGenRecycled checks that a request whose body buffer went
// back to the pool and on to another request cannot take it again.
func TestAcquireGenRecycled(t *testing.T) {
	b := GetBody()
	gen := b.Gen()
	if !b.AcquireGen(gen) {
		t.Fatal("acquire failed on a held buffer")
	}
	b.Release()
	b.Release() // the request ends: the buffer returns to the pool
	// Simulate the pool handing the same buffer to another request.
	b.gen.Add(1)
	b.refs.Store(1)
	if b.AcquireGen(gen) {
		t.Fatal("acquired a buffer recycled to another request")
	}
	if n := b.refs.Load(); n != 1 {
		t.Fatalf("refs %d after the failed acquire, want 1", n)
	}
}
