package module

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/selection"
)

// VarRequest is the Caddy vars key (caddyhttp.GetVar) under which ramjet
// keeps its per-request state, a *reqState. The body matcher, the lb_policy
// and the ramjet handler all attach to the same one; use requestState(r)
// rather than reading the var directly.
const VarRequest = "ramjet.request"

// DefaultMaxBodyBytes bounds how much of a request body ramjet reads to
// fingerprint it: 16 MiB.
const DefaultMaxBodyBytes = 16 << 20

// errBodyTooLarge is kept in reqState.bodyErr when the body is larger than
// the configured bound; the body is then forwarded untouched.
var errBodyTooLarge = errors.New("request body larger than max_body_bytes")

// reqState is ramjet's state for one request. It is created by whichever
// ramjet module sees the request first (matcher, handler or policy) and
// lives in the vars under VarRequest.
//
// Concurrency: the fields without atomics are written and read only on the
// request's own goroutine (matcher, handler, Select). finish may run on
// another goroutine (context.AfterFunc when the client goes away), so the
// reservation is an atomic pointer and the body is reference counted.
type reqState struct {
	// body holds the request body and its parsed features; nil until read.
	// Written only by readBody on the request goroutine. Take a reference
	// (acquireBody) before using its bytes or features: the request may
	// end (client gone) at any time, on another goroutine.
	body *bodyBuf
	// bodyGen is body's generation when this request got it: a pooled
	// buffer recycled to another request has moved on (acquireBody).
	bodyGen uint64
	// owner holds the request's own reference on body until finish takes
	// and drops it (the only field of the body that finish touches).
	owner atomic.Pointer[bodyBuf]
	// bodyErr is why the body could not be read (errBodyTooLarge, I/O).
	bodyErr error
	// bodyRead reports that ramjet tried to read the body.
	bodyRead bool
	// origReader is the reader the matcher put back into the original
	// request, so that Select can tell whether it is still untouched.
	origReader *bodyReader

	// featErr is the parse error of the body (a *selection.RequestError for
	// malformed JSON or a wrong field type); nil when the features are good.
	featErr error

	// Filled by Select for the last attempt.
	fleet      *fleet
	decision   selection.Decision
	slot       selection.Slot
	replica    string            // replica key: "addr" or "addr#rank"
	routeID    string            // opaque id sent in X-Ramjet-Upstream
	routeIDHdr []string          // the same, as a shared header value; never modify
	model      string            // interned model name ("" when unknown)
	fallback   bool              // the fallback policy chose (no usable features)
	attempts   int               // Select calls for this request (1 + retries)
	tried      selection.SlotSet // slots picked by earlier attempts
	// pending: the outcome of the attempt to slot is not reported to the
	// outlier detector yet; poolSize is the size of its pool (outlier.go).
	pending  bool
	poolSize int
	// metrics is the request's metrics observer (metrics.go), for Select.
	metrics *metricsObserver
	// baseHeader is the request header map of the first attempt.
	baseHeader http.Header

	// route holds the preflight's token ids and the first attempt's
	// reservation (policy.go).
	route routeState

	res  atomic.Pointer[selection.Reservation]
	done atomic.Bool
	stop func() bool // stops the context.AfterFunc
}

// requestState returns the request's reqState, creating it (and arranging
// its release when the request context ends) on first use.
func requestState(r *http.Request) *reqState {
	if st, ok := caddyhttp.GetVar(r.Context(), VarRequest).(*reqState); ok {
		return st
	}
	st := &reqState{slot: -1}
	st.stop = context.AfterFunc(r.Context(), st.finish)
	caddyhttp.SetVar(r.Context(), VarRequest, st)
	return st
}

// lookupRequest returns the request's reqState or nil.
func lookupRequest(r *http.Request) *reqState {
	st, _ := caddyhttp.GetVar(r.Context(), VarRequest).(*reqState)
	return st
}

func (st *reqState) markTried(s selection.Slot) { st.tried.Add(s) }

func (st *reqState) wasTried(s selection.Slot) bool { return st.tried.Has(s) }

// setReservation replaces the reservation, releasing the earlier one (a
// retry). If the request already finished, the new one is released at once.
func (st *reqState) setReservation(res *selection.Reservation) {
	if old := st.res.Swap(res); old != nil {
		old.Release()
	}
	if st.done.Load() {
		if r := st.res.Swap(nil); r != nil {
			r.Release()
		}
	}
}

// releaseReservation ends the current reservation, if any.
func (st *reqState) releaseReservation() {
	if r := st.res.Swap(nil); r != nil {
		r.Release()
	}
}

// prefillDone marks the current reservation's prompt as computed.
func (st *reqState) prefillDone() {
	if r := st.res.Load(); r != nil {
		r.PrefillDone()
	}
}

// finish ends the request: releases its reservation and its hold on the
// body buffer. Safe to call more than once, from any goroutine.
func (st *reqState) finish() {
	if !st.done.CompareAndSwap(false, true) {
		return
	}
	st.releaseReservation()
	if b := st.owner.Swap(nil); b != nil {
		b.release()
	}
}

// acquireBody takes a reference on the request's body and returns it, or
// nil when there is none or the request already ended and the buffer went
// back to the pool. Release it with release when done.
func (st *reqState) acquireBody() *bodyBuf {
	b := st.body
	if b == nil || !b.acquire() {
		return nil
	}
	if b.gen.Load() != st.bodyGen {
		// Recycled to another request meanwhile: not ours any more.
		b.release()
		return nil
	}
	return b
}

// features returns the parsed features for extractor x, or nil when the
// body is missing, too large or malformed (st.featErr then holds the
// *selection.RequestError). See parse.
func (st *reqState) features(x selection.Extractor, ep selection.Endpoint) *selection.Features {
	f, err := st.parse(x, ep)
	if err != nil {
		return nil
	}
	return f
}

// parse parses the body with selection's parser once per request and
// keeps the result in the body buffer: the guard, the body matcher and the
// policy all call it, and only the first call parses. A later call with
// another extractor or endpoint (a policy whose block size differs from
// sharedExtractor's) parses again; the validation result is the same, as
// it does not depend on the extractor. It returns (nil, nil) when there is
// no body. The caller must hold a reference on the body (acquireBody) while
// it uses the result.
func (st *reqState) parse(x selection.Extractor, ep selection.Endpoint) (*selection.Features, error) {
	b := st.body
	if b == nil {
		return nil, errNoBody
	}
	if !b.parsed || b.x != x || b.ep != ep {
		if cap(b.feat.Blocks) < x.MaxBlocks() {
			b.feat = *x.NewFeatures()
		}
		st.featErr = x.Parse(ep, b.buf, &b.feat)
		b.parsed, b.x, b.ep = true, x, ep
		bodyParses.Add(1)
	}
	if st.featErr != nil {
		return nil, st.featErr
	}
	return &b.feat, nil
}

// bodyParses counts the bodies parsed by this process: the tests check
// that a request through guard, matcher and policy costs one.
var bodyParses atomic.Int64

// errNoBody: the request has no body that was read (none, too large, or
// an I/O error: see bodyErr).
var errNoBody = errors.New("no request body")

// defaultExtractor parses bodies when no ramjet policy is provisioned.
var defaultExtractor = func() selection.Extractor {
	var c selection.Config
	c.SetDefaults()
	return selection.NewExtractor(c)
}()

// sharedExtractor is the extractor the guard and the body matcher parse
// with: the one of the policy of the default state (DefaultStateKey), so
// that its Select finds the features already parsed. A policy with another
// block size or state key parses again in Select.
func sharedExtractor() selection.Extractor {
	if f := lookupFleet(""); f != nil {
		return f.Base().Extractor()
	}
	return defaultExtractor
}

// readBody reads r's body once, bounded by limit, into a pooled buffer
// kept in st, and restores r.Body so that the next reader sees identical
// bytes. It is a no-op after the first call. On success st.body is set; on
// a body over the limit st.bodyErr is errBodyTooLarge and r.Body yields the
// bytes already read followed by the rest.
func (st *reqState) readBody(r *http.Request, limit int64) {
	if st.bodyRead {
		return
	}
	st.bodyRead = true
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	if r.ContentLength > limit {
		st.bodyErr = errBodyTooLarge
		return
	}
	b := getBodyBuf()
	n, err := readBounded(r.Body, b, limit, r.ContentLength)
	switch {
	case err != nil:
		// Give the next reader what was read and the same error.
		r.Body = &partialBody{head: append([]byte(nil), b.buf[:n]...), tail: r.Body, err: err}
		b.release()
		st.bodyErr = err
		return
	case int64(n) > limit:
		r.Body = &partialBody{head: append([]byte(nil), b.buf[:n]...), tail: r.Body}
		b.release()
		st.bodyErr = errBodyTooLarge
		return
	}
	// The reader holds its own reference, so that the bytes outlive the
	// request's hold as long as a transport may read them.
	st.origReader = b.newReader()
	r.Body = st.origReader
	st.body, st.bodyGen = b, b.gen.Load()
	st.owner.Store(b)
	if st.done.Load() && st.owner.CompareAndSwap(b, nil) {
		// The request ended meanwhile and finish missed the buffer.
		b.release()
	}
}

// readBounded reads src into b.buf up to limit+1 bytes (so that an
// oversized body is detected) and returns how many bytes it holds. A
// clean EOF is not an error.
func readBounded(src io.Reader, b *bodyBuf, limit, hint int64) (int, error) {
	buf := b.buf[:0]
	if hint > 0 && int64(cap(buf)) < hint+1 {
		buf = make([]byte, 0, hint+1)
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

// bodyBuf is a pooled request body with its parsed features. It is
// reference counted: the reqState holds one reference until the request
// ends, every reader handed to a transport holds one until it is closed,
// and code that uses the bytes or features off the request goroutine's
// critical path takes one with acquire. At zero it returns to the pool.
type bodyBuf struct {
	buf    []byte
	feat   selection.Features
	parsed bool
	x      selection.Extractor
	ep     selection.Endpoint
	refs   atomic.Int32
	gen    atomic.Uint64 // bumped every time the buffer leaves the pool
}

// maxPooledBody is the largest buffer returned to the pool; bigger ones
// are left to the garbage collector so that one huge body does not pin
// memory.
const maxPooledBody = 1 << 20

var bodyPool = sync.Pool{New: func() any { return new(bodyBuf) }}

func getBodyBuf() *bodyBuf {
	b := bodyPool.Get().(*bodyBuf)
	b.gen.Add(1)
	b.refs.Store(1)
	return b
}

// acquire takes a reference; it fails once the buffer was released.
func (b *bodyBuf) acquire() bool {
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

// release drops a reference and recycles the buffer at zero.
func (b *bodyBuf) release() {
	if b.refs.Add(-1) != 0 {
		return
	}
	if cap(b.buf) > maxPooledBody {
		return
	}
	b.buf = b.buf[:0]
	b.feat.Reset()
	b.parsed = false
	bodyPool.Put(b)
}

// newReader returns a reader over the whole body that holds a reference
// until it is closed (or detached).
func (b *bodyBuf) newReader() *bodyReader {
	b.refs.Add(1)
	return &bodyReader{b: b}
}

// bodyReader reads a bodyBuf from the start. Close (or detach) drops its
// reference exactly once; reading after that returns io.ErrClosedPipe.
type bodyReader struct {
	b     *bodyBuf
	off   int
	state atomic.Int32 // 0 unread, 1 read from, 2 closed
}

func (r *bodyReader) Read(p []byte) (int, error) {
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
func (r *bodyReader) WriteTo(w io.Writer) (int64, error) {
	if r.state.Load() == 2 {
		return 0, io.ErrClosedPipe
	}
	r.state.CompareAndSwap(0, 1)
	n, err := w.Write(r.b.buf[r.off:])
	r.off += n
	return int64(n), err
}

// Close drops the reader's reference.
func (r *bodyReader) Close() error {
	if r.state.Swap(2) != 2 {
		r.b.release()
	}
	return nil
}

// untouched reports that nothing read from or closed r yet.
func (r *bodyReader) untouched() bool { return r.state.Load() == 0 }

// Len is the number of unread bytes.
func (r *bodyReader) Len() int { return len(r.b.buf) - r.off }

var _ io.WriterTo = (*bodyReader)(nil)
