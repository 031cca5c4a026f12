package edge

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/ramjet-llm/ramjet/selection"
)

// ErrTooLarge is returned by ReadBody for a body larger than its bound;
// the body is then forwarded untouched.
var ErrTooLarge = errors.New("request body larger than max_body_bytes")

// Body is a pooled request body with its one parse. It is reference
// counted: the request holds one reference until it ends, every Reader
// handed to a transport holds one until it is closed, and code that uses
// the bytes or features off the request goroutine's critical path takes
// one with Acquire. At zero it returns to the pool, and Gen moves on.
type Body struct {
	buf    []byte
	feat   selection.Features
	parsed bool
	x      selection.Extractor
	ep     selection.Endpoint
	err    error // the parse error of feat
	refs   atomic.Int32
	gen    atomic.Uint64 // bumped every time the buffer leaves the pool
}

// maxPooledBody is the largest buffer returned to the pool; bigger ones
// are left to the garbage collector so that one huge body does not pin
// memory.
const maxPooledBody = 1 << 20

var bodyPool = sync.Pool{New: func() any { return new(Body) }}

// Buffers of keptMin bytes or more are kept apart from bodyPool, which
// every second garbage collection empties: behind an engine that
// allocates a few MiB per request (a JSON decoder) that is every few
// requests, and a 256 KiB body then paid for a fresh buffer (its
// allocation, and a page fault per page the runtime had returned to the
// OS while the body was read into it) about once in 14 requests at 32 in
// flight (bench/RESULTS.md, "The overhead rows at 0.95x"). At most
// KeptBuffersLimit bytes and keptMax buffers are kept, whatever the
// traffic.
const (
	keptMin = 64 << 10
	keptMax = 64
)

// KeptBuffersLimit is the most memory the store of large body buffers
// holds (at most keptMax buffers).
const KeptBuffersLimit = 16 << 20

var kept struct {
	mu    sync.Mutex
	bufs  [][]byte
	bytes int
}

// KeptBuffers reports the large body buffers kept for the next requests
// and their bytes (ramjet_body_buffers_kept, _kept_bytes).
func KeptBuffers() (n, bytes int) {
	kept.mu.Lock()
	defer kept.mu.Unlock()
	return len(kept.bufs), kept.bytes
}

// keepBuf keeps buf for takeBuf, and reports whether it did (false when
// it is small or the store is full).
func keepBuf(buf []byte) bool {
	c := cap(buf)
	if c < keptMin {
		return false
	}
	kept.mu.Lock()
	defer kept.mu.Unlock()
	if len(kept.bufs) == keptMax || kept.bytes+c > KeptBuffersLimit {
		return false
	}
	kept.bufs = append(kept.bufs, buf[:0])
	kept.bytes += c
	return true
}

// takeBuf returns a kept buffer of capacity n or more (the most recently
// kept that fits), emptied, or nil.
func takeBuf(n int) []byte {
	if n < keptMin {
		return nil
	}
	kept.mu.Lock()
	defer kept.mu.Unlock()
	for i := len(kept.bufs) - 1; i >= 0; i-- {
		if b := kept.bufs[i]; cap(b) >= n {
			last := len(kept.bufs) - 1
			kept.bufs[i] = kept.bufs[last]
			kept.bufs[last] = nil
			kept.bufs = kept.bufs[:last]
			kept.bytes -= cap(b)
			return b
		}
	}
	return nil
}

// GetBody returns an empty pooled Body holding one reference.
func GetBody() *Body {
	b := bodyPool.Get().(*Body)
	b.gen.Add(1)
	b.refs.Store(1)
	return b
}

// Bytes is the body. Valid while a reference is held.
func (b *Body) Bytes() []byte { return b.buf }

// Gen is the body's generation: it changes every time the buffer is
// recycled to another request.
func (b *Body) Gen() uint64 { return b.gen.Load() }

// Acquire takes a reference; it fails once the buffer was released.
func (b *Body) Acquire() bool {
	for {
		n := b.refs.Load()
		if n <= 0 {
			return false
		}
		if b.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// AcquireGen takes a reference if the body is still at generation gen
// (not recycled to another request since), and reports whether it did.
func (b *Body) AcquireGen(gen uint64) bool {
	if !b.Acquire() {
		return false
	}
	if b.gen.Load() != gen {
		// Recycled to another request meanwhile: not the caller's any more.
		b.Release()
		return false
	}
	return true
}

// Release drops a reference and recycles the buffer at zero.
func (b *Body) Release() {
	if b.refs.Add(-1) != 0 {
		return
	}
	if cap(b.buf) > maxPooledBody {
		return
	}
	if keepBuf(b.buf) {
		b.buf = nil
	}
	b.buf = b.buf[:0]
	b.feat.Reset()
	b.parsed = false
	b.err = nil
	bodyPool.Put(b)
}

// Parse parses the body with selection's parser once and keeps the
// result: a later call with the same extractor and endpoint returns it
// again, one with another (a policy whose block size differs) parses
// again; the validation result is the same, as it does not depend on the
// extractor. fresh reports that this call parsed. The caller must hold a
// reference while it uses the result.
func (b *Body) Parse(x selection.Extractor, ep selection.Endpoint) (f *selection.Features, fresh bool, err error) {
	if !b.parsed || b.x != x || b.ep != ep {
		if cap(b.feat.Blocks) < x.MaxBlocks() {
			b.feat = *x.NewFeatures()
		}
		b.err = x.Parse(ep, b.buf, &b.feat)
		b.parsed, b.x, b.ep = true, x, ep
		fresh = true
	}
	if b.err != nil {
		return nil, fresh, b.err
	}
	return &b.feat, fresh, nil
}

// ReadBody reads r's body once, bounded by limit, into a pooled Body
// holding one reference for the caller, and replaces r.Body by a Reader
// over it (with its own reference; into, when not nil, is the storage
// for it), so that the next reader sees identical bytes. It returns a nil
// Body when r has none, and ErrTooLarge or the read error when the body
// is over the limit or could not be read: r.Body then yields the bytes
// already read followed by the rest (and the same error).
func ReadBody(r *http.Request, limit int64, into *Reader) (*Body, *Reader, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil, nil
	}
	if r.ContentLength > limit {
		return nil, nil, ErrTooLarge
	}
	b := GetBody()
	n, err := ReadBounded(r.Body, b, limit, r.ContentLength)
	switch {
	case err != nil:
		// Give the next reader what was read and the same error.
		r.Body = &partialBody{head: append([]byte(nil), b.buf[:n]...), tail: r.Body, err: err}
		b.Release()
		return nil, nil, err
	case int64(n) > limit:
		r.Body = &partialBody{head: append([]byte(nil), b.buf[:n]...), tail: r.Body}
		b.Release()
		return nil, nil, ErrTooLarge
	}
	rd := b.NewReader(into)
	r.Body = rd
	return b, rd, nil
}

// ReadBounded reads src into b up to limit+1 bytes (so that an oversized
// body is detected) and returns how many bytes it holds. hint is the
// expected length (Content-Length), or <= 0. A clean EOF is not an error.
func ReadBounded(src io.Reader, b *Body, limit, hint int64) (int, error) {
	buf := b.buf[:0]
	switch {
	case hint > 0 && int64(cap(buf)) < hint+1:
		if buf = takeBuf(int(hint + 1)); buf == nil {
			buf = make([]byte, 0, hint+1)
		}
	case hint <= 0 && cap(buf) == 0:
		// No length (a chunked body): a kept buffer if there is one, as
		// the pooled Body's own was before Release kept it apart.
		buf = takeBuf(keptMin)
	}
	empty := 0
	for int64(len(buf)) <= limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		room := cap(buf) - len(buf)
		if int64(room) > limit+1-int64(len(buf)) {
			room = int(limit + 1 - int64(len(buf)))
		}
		n, err := src.Read(buf[len(buf) : len(buf)+room])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if n == 0 && err == nil {
			if empty++; empty >= 100 {
				err = io.ErrNoProgress
			}
		} else {
			empty = 0
		}
		if err != nil {
			b.buf = buf
			return len(buf), err
		}
	}
	b.buf = buf
	return len(buf), nil
}

// partialBody replays the bytes read before giving up on a body (too large
// or an error) and then the rest of the original body.
type partialBody struct {
	head []byte
	tail io.ReadCloser
	err  error
}

func (p *partialBody) Read(q []byte) (int, error) {
	if len(p.head) > 0 {
		n := copy(q, p.head)
		p.head = p.head[n:]
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.tail.Read(q)
}

func (p *partialBody) Close() error { return p.tail.Close() }

// NewReader returns a reader over the whole body that holds a reference
// until it is closed. into, when not nil, is an unused Reader to set up
// (the caller's storage, so that the first reader of a request costs no
// allocation).
func (b *Body) NewReader(into *Reader) *Reader {
	b.refs.Add(1)
	if into == nil {
		into = new(Reader)
	}
	into.b = b
	return into
}

// Reader reads a Body from the start. Close drops its reference exactly
// once; reading after that returns io.ErrClosedPipe.
type Reader struct {
	b     *Body
	off   int
	state atomic.Int32 // 0 unread, 1 read from, 2 closed
}

func (r *Reader) Read(p []byte) (int, error) {
	if r.state.Load() == 2 {
		return 0, io.ErrClosedPipe
	}
	r.state.CompareAndSwap(0, 1)
	if r.off >= len(r.b.buf) {
		return 0, io.EOF
	}
	n := copy(p, r.b.buf[r.off:])
	r.off += n
	return n, nil
}

// WriteTo lets io.Copy skip an intermediate buffer.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	if r.state.Load() == 2 {
		return 0, io.ErrClosedPipe
	}
	r.state.CompareAndSwap(0, 1)
	n, err := w.Write(r.b.buf[r.off:])
	r.off += n
	return int64(n), err
}

// Close drops the reader's reference.
func (r *Reader) Close() error {
	if r.state.Swap(2) != 2 {
		r.b.Release()
	}
	return nil
}

// Untouched reports that nothing read from or closed r yet.
func (r *Reader) Untouched() bool { return r.state.Load() == 0 }

// Len is the number of unread bytes.
func (r *Reader) Len() int { return len(r.b.buf) - r.off }

var _ io.WriterTo = (*Reader)(nil)
