package module

import (
	"bytes"
	"context"
	"errors"
	"io"

	"strings"
	"testing"
	"testing/iotest"

	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/observe"
	"github.com/ramjet-llm/ramjet/selection"
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
		{"one over the limit", func() io.Reader { return bytes.NewReader(body) }, -1, int64(len(body)) - 1, edge.ErrTooLarge, nil},
		{"declared over the limit", func() io.Reader { return bytes.NewReader(body) }, int64(len(body)), 100, edge.ErrTooLarge, nil},
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
			st := requestState(nil, r)
			st.readBody(r, tt.limit)
			if !errors.Is(st.bodyErr, tt.wantErr) {
				t.Fatalf("body error %v, want %v", st.bodyErr, tt.wantErr)
			}
			if tt.wantErr == nil && (st.body == nil || !bytes.Equal(st.body.Bytes(), body)) {
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

// TestMarkTried: the slots of every attempt are in the set a retry
// filters by, the first one's kept without a set until a second attempt.
func TestMarkTried(t *testing.T) {
	for _, first := range []selection.Slot{0, 5, 1023} {
		st := &reqState{}
		st.markTried(first)
		if st.tried != nil {
			t.Fatalf("first attempt (slot %d) allocated a set", first)
		}
		set := st.triedSet()
		if !set.Has(first) {
			t.Errorf("slot %d of the first attempt not in the set", first)
		}
		st.markTried(7)
		if !st.tried.Has(first) || !st.tried.Has(7) || st.triedSet() != set {
			t.Errorf("after a retry to 7: set %v, want slots %d and 7", *st.tried, first)
		}
	}
	if st := (&reqState{}); st.triedSet().Has(0) {
		t.Error("no attempt yet, slot 0 in the set")
	}
}

// TestOwnedStateFromWriter: a state handed down as the owner of the
// request's writer (a guard or handler in front) is found there, with no
// context lookup (the writer's request below has other vars); once
// recycled it is not, and the context's vars decide again.
func TestOwnedStateFromWriter(t *testing.T) {
	r := newTestRequest(context.Background(), nil)
	st, created := ownedState(nil, r)
	if !created {
		t.Fatal("first lookup: want a new state")
	}
	var ow observe.Writer
	ow.Init(nil, nil)
	ow.SetOwner(st)
	other := newTestRequest(context.Background(), nil) // its vars know no state
	if got, created := ownedState(&ow, other); got != st || created {
		t.Fatalf("through the writer: got %p created %v, want %p not created", got, created, st)
	}
	if got := requestState(&ow, other); got != st {
		t.Fatalf("requestState through the writer: got %p, want %p", got, st)
	}
	if got, created := ownedState(&ow, r); got != st || created {
		t.Fatalf("same request: got %p created %v, want %p not created", got, created, st)
	}
	st.recycle(true) // pooled: the writer's owner is no longer this request's
	got, created := ownedState(&ow, other)
	if !created {
		t.Fatal("after recycle: want a new state from other's vars")
	}
	if got2, created2 := ownedState(nil, other); got2 != got || created2 {
		t.Fatal("other's vars do not hold the state created for it")
	}
	got.recycle(true)
}
