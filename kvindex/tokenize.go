package kvindex

import (
	"bytes"
	"container/list"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// TokenizeRequest is what the preflight sends to an engine's /tokenize:
// either a chat (Messages, with Tools) or a completions Prompt. The raw JSON
// values are copied from the client's body as they are.
type TokenizeRequest struct {
	Model    string
	Messages json.RawMessage
	Tools    json.RawMessage
	Prompt   json.RawMessage
	// NoGenerationPrompt renders a chat without the assistant header that
	// would open the reply (add_generation_prompt false): the tokens of a
	// conversation prefix (the message-prefix cache).
	NoGenerationPrompt bool
}

// MarshalJSON builds vLLM's /tokenize body: {"model","messages","tools",
// "add_generation_prompt":true} for a chat (false with
// NoGenerationPrompt), {"model","prompt"} otherwise.
func (r TokenizeRequest) MarshalJSON() ([]byte, error) {
	type chat struct {
		Model               string          `json:"model"`
		Messages            json.RawMessage `json:"messages"`
		Tools               json.RawMessage `json:"tools,omitempty"`
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
	}
	type prompt struct {
		Model  string          `json:"model"`
		Prompt json.RawMessage `json:"prompt"`
	}
	if len(r.Messages) > 0 {
		return json.Marshal(chat{r.Model, r.Messages, r.Tools, !r.NoGenerationPrompt})
	}
	return json.Marshal(prompt{r.Model, r.Prompt})
}

// TokenizerConfig configures a Tokenizer. Zero values take the defaults.
type TokenizerConfig struct {
	// Timeout bounds how long a request waits for its preflight,
	// connection included. Default 100ms: past it routing falls back to
	// the estimate.
	Timeout time.Duration
	// LateTimeout bounds the preflight itself: one that missed Timeout
	// goes on until LateTimeout (measured from its start) so that its
	// answer still fills the cache and predicts the blocks of the replica
	// the estimate chose (Precise.Preflight). Default 2s; never less than
	// Timeout.
	LateTimeout time.Duration
	// MaxConcurrent bounds the preflights in flight; past it a request
	// falls back at once instead of queueing. Default 64.
	MaxConcurrent int
	// CacheEntries bounds the cached tokenizations. Default 4096.
	CacheEntries int
	// CacheTokens bounds the token ids cached, in total. Default 1<<22
	// (16 MiB).
	CacheTokens int
	// MaxTokens is the longest tokenization accepted; longer responses are
	// refused (fallback). Default 1<<18.
	MaxTokens int
	// Client sends the requests; default a client with no redirects,
	// resolving host names with Resolver (nil: the system's).
	Client   *http.Client
	Resolver *net.Resolver
	// Header is added to every request (e.g. the upstream Authorization).
	Header http.Header
	// OnLatency, when set, observes the latency of every preflight sent.
	OnLatency func(time.Duration)
}

func (c *TokenizerConfig) setDefaults() {
	if c.Timeout <= 0 {
		c.Timeout = 100 * time.Millisecond
	}
	if c.LateTimeout <= 0 {
		c.LateTimeout = 2 * time.Second
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 64
	}
	if c.CacheEntries <= 0 {
		c.CacheEntries = 4096
	}
	if c.CacheTokens <= 0 {
		c.CacheTokens = 1 << 22
	}
	if c.MaxTokens <= 0 {
		c.MaxTokens = 1 << 18
	}
	if c.Client == nil {
		// Its own transport, keeping up to MaxConcurrent idle connections
		// per engine: the default transport keeps 2, so a burst of
		// preflights to one engine would dial (and tear down) a connection
		// each, which an overloaded engine answers slowest of all.
		c.Client = &http.Client{
			Transport: &http.Transport{
				DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second, Resolver: c.Resolver}).DialContext,
				MaxIdleConnsPerHost: c.MaxConcurrent,
				IdleConnTimeout:     90 * time.Second,
				ForceAttemptHTTP2:   true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		}
	}
}

// Fallback reasons of the tokenize preflight.
const (
	FallbackTimeout = iota // the engine did not answer in time
	FallbackBusy           // MaxConcurrent preflights already in flight
	FallbackError          // transport error, bad status or bad response
	FallbackSlow           // most recent preflights missed the timeout: not waited for
	numFallbacks
)

// FallbackReasons names the fallback reasons, by index, for metric labels.
var FallbackReasons = [numFallbacks]string{"timeout", "busy", "error", "slow"}

// ErrSlow is returned, without waiting, while most recent preflights took
// longer than the timeout (see Tokenizer.Slow); the preflight still runs.
var ErrSlow = fmt.Errorf("kvindex: tokenize preflights slower than the timeout, not waited for: %w", context.DeadlineExceeded)

// The slow-engine breaker: an exponentially weighted share of preflights
// that missed the timeout (weight 1/16 each); past slowEnter requests stop
// waiting, below slowLeave they wait again.
const (
	slowWeight = 1.0 / 16
	slowEnter  = 0.5
	slowLeave  = 0.25
)

// ErrBusy is returned when MaxConcurrent preflights are in flight.
var ErrBusy = errors.New("kvindex: tokenize preflights at their limit")

// Tokenizer turns requests into token ids with an engine's /tokenize, with
// a timeout, a concurrency limit, an LRU cache keyed by the request's prefix
// fingerprint, and one request in flight per key. Safe for concurrent use.
type Tokenizer struct {
	cfg TokenizerConfig
	sem chan struct{}

	mu       sync.Mutex
	lru      *list.List // of *tokEntry, most recent first
	byKey    map[uint64]*list.Element
	tokens   int
	inflight map[uint64]*tokCall

	hits, misses, shared atomic.Uint64
	fallbacks            [numFallbacks]atomic.Uint64

	// missShare is the weighted share of recent preflights that missed
	// the timeout, and slow whether requests stop waiting; both guarded
	// by mu.
	missShare float64
	slow      atomic.Bool
}

type tokEntry struct {
	key    uint64
	tokens []uint32
}

type tokCall struct {
	done   chan struct{}
	tokens []uint32 // set before done closes
	err    error
	then   []func([]uint32, error) // guarded by Tokenizer.mu
}

// NewTokenizer returns a Tokenizer.
func NewTokenizer(c TokenizerConfig) *Tokenizer {
	c.setDefaults()
	return &Tokenizer{cfg: c, sem: make(chan struct{}, c.MaxConcurrent), lru: list.New(),
		byKey: map[uint64]*list.Element{}, inflight: map[uint64]*tokCall{}}
}

// RequestKey is the exact cache key of a request: a hash of its model and
// raw prompt fields. Bodies that differ only in whitespace or key order get
// different keys (a cache miss, never a wrong answer).
func RequestKey(r TokenizeRequest) uint64 {
	var d xxhash.Digest
	d.Reset()
	for _, p := range [][]byte{[]byte(r.Model), r.Messages, r.Tools, r.Prompt} {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(p)))
		d.Write(n[:])
		d.Write(p)
	}
	if r.NoGenerationPrompt {
		d.Write([]byte{1})
	}
	return d.Sum64()
}

// FeaturesKey is a cache key from the router's fingerprint: its model and
// salt seed, its chained prefix blocks, and its length. It needs no second
// pass over the body, but two requests with the same key may differ in the
// sub-block tail of their prompt (or past the fingerprint bound), so the
// cached tokens can be wrong there: the exact overlap then errs by at most
// about one block. Prefer RequestKey where the raw body is at hand.
func FeaturesKey(f *selection.Features) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		d.Write(b[:])
	}
	put(f.Seed)
	put(uint64(f.Endpoint))
	put(uint64(f.PromptBytes))
	if f.Truncated {
		put(1)
	} else {
		put(0)
	}
	for _, h := range f.Blocks {
		put(h)
	}
	return d.Sum64()
}

// Tokenize returns the token ids of req as the engine at base (e.g.
// "http://10.0.0.5:8000") tokenizes it, from the cache when key was seen.
// The returned slice is shared: do not modify it. On error the caller
// falls back to the estimate; the reason is counted. A preflight that
// misses the timeout (or ctx) is not abandoned: it goes on for up to
// LateTimeout and fills the cache (see Start for its answer).
func (t *Tokenizer) Tokenize(ctx context.Context, base string, key uint64, req TokenizeRequest) ([]uint32, error) {
	toks, c, err := t.Start(base, key, req)
	if c == nil {
		return toks, err
	}
	return t.Wait(ctx, c)
}

// Call is one preflight in flight, shared by every caller of the same key.
type Call = tokCall

// Start returns the cached tokens of key, or starts (or joins) the
// preflight of req and returns its Call, or ErrBusy at MaxConcurrent. A
// started preflight runs on its own goroutine, bounded by
// max(Timeout, LateTimeout), whatever its callers do.
func (t *Tokenizer) Start(base string, key uint64, req TokenizeRequest) ([]uint32, *Call, error) {
	return t.start(base, key, req.body)
}

// start is Start with the request's body built by body, only when a call
// is sent.
func (t *Tokenizer) start(base string, key uint64, body func() []byte) ([]uint32, *Call, error) {
	t.mu.Lock()
	if el, ok := t.byKey[key]; ok {
		t.lru.MoveToFront(el)
		toks := el.Value.(*tokEntry).tokens
		t.mu.Unlock()
		t.hits.Add(1)
		return toks, nil, nil
	}
	if c, ok := t.inflight[key]; ok {
		t.mu.Unlock()
		t.shared.Add(1)
		return nil, c, nil
	}
	select {
	case t.sem <- struct{}{}:
	default:
		t.mu.Unlock()
		t.fallbacks[FallbackBusy].Add(1)
		return nil, nil, ErrBusy
	}
	c := &tokCall{done: make(chan struct{})}
	t.inflight[key] = c
	t.mu.Unlock()
	t.misses.Add(1)
	// The body is built here, not in the goroutine: a request's fields
	// slice the client's body, whose buffer is the request's and may be
	// recycled once it ends, while the call may outlive it.
	go t.run(c, base, key, body())
	return nil, c, nil
}

func (t *Tokenizer) run(c *tokCall, base string, key uint64, body []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), max(t.cfg.Timeout, t.cfg.LateTimeout))
	start := time.Now()
	tokens, err := t.fetch(ctx, base, body)
	missed := err != nil || time.Since(start) > t.cfg.Timeout
	cancel()
	<-t.sem
	t.mu.Lock()
	t.noteOutcome(missed)
	delete(t.inflight, key)
	if err == nil {
		t.put(key, tokens)
	}
	c.tokens, c.err = tokens, err
	close(c.done)
	fns := c.then
	c.then = nil
	t.mu.Unlock()
	for _, fn := range fns {
		fn(tokens, err)
	}
}

// noteOutcome updates the slow-engine breaker with one preflight's outcome.
func (t *Tokenizer) noteOutcome(missed bool) {
	v := 0.0
	if missed {
		v = 1
	}
	t.missShare += slowWeight * (v - t.missShare)
	switch {
	case t.missShare > slowEnter:
		t.slow.Store(true)
	case t.missShare < slowLeave:
		t.slow.Store(false)
	}
}

// Slow reports whether most recent preflights missed the timeout, so that
// requests no longer wait for theirs (Wait returns ErrSlow at once while
// the preflight goes on: its answer still predicts, see Precise.Preflight,
// and its latency still counts, so waiting resumes once the engines answer
// in time again).
func (t *Tokenizer) Slow() bool { return t.slow.Load() }

// Wait waits for c, at most Timeout (or until ctx ends): the tokens, or
// the error that makes the caller fall back (counted). While Slow it does
// not wait for a preflight still in flight.
func (t *Tokenizer) Wait(ctx context.Context, c *Call) ([]uint32, error) {
	if t.slow.Load() {
		select {
		case <-c.done:
		default:
			t.fallbacks[FallbackSlow].Add(1)
			return nil, ErrSlow
		}
	}
	timer := time.NewTimer(t.cfg.Timeout)
	defer timer.Stop()
	select {
	case <-c.done:
		if c.err != nil {
			t.countFallback(c.err)
		}
		return c.tokens, c.err
	case <-ctx.Done():
		t.countFallback(ctx.Err())
		return nil, ctx.Err()
	case <-timer.C:
		t.fallbacks[FallbackTimeout].Add(1)
		return nil, context.DeadlineExceeded
	}
}

// Then calls fn with c's outcome once it is known: at once (on the calling
// goroutine) when c is done, else on the preflight's goroutine when it
// ends. fn must not block.
func (t *Tokenizer) Then(c *Call, fn func([]uint32, error)) {
	t.mu.Lock()
	select {
	case <-c.done:
		t.mu.Unlock()
		fn(c.tokens, c.err)
		return
	default:
	}
	c.then = append(c.then, fn)
	t.mu.Unlock()
}

func (t *Tokenizer) countFallback(err error) {
	if errors.Is(err, context.DeadlineExceeded) {
		t.fallbacks[FallbackTimeout].Add(1)
	} else {
		t.fallbacks[FallbackError].Add(1)
	}
}

// Cached returns the cached tokens of key, if any, without a preflight
// (counted as a cache hit). Callers that would have to parse the request
// to build a TokenizeRequest can try it first.
func (t *Tokenizer) Cached(key uint64) ([]uint32, bool) {
	t.mu.Lock()
	el, ok := t.byKey[key]
	if ok {
		t.lru.MoveToFront(el)
	}
	t.mu.Unlock()
	if !ok {
		return nil, false
	}
	t.hits.Add(1)
	return el.Value.(*tokEntry).tokens, true
}

// peek is Cached without counting a hit (the message-prefix lookups).
func (t *Tokenizer) peek(key uint64) ([]uint32, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.byKey[key]
	if !ok {
		return nil, false
	}
	t.lru.MoveToFront(el)
	return el.Value.(*tokEntry).tokens, true
}

// keep caches tokens under key unless key is cached already.
func (t *Tokenizer) keep(key uint64, tokens []uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byKey[key]; !ok {
		t.put(key, tokens)
	}
}

func (t *Tokenizer) put(key uint64, tokens []uint32) {
	if len(tokens) > t.cfg.CacheTokens {
		return
	}
	if el, ok := t.byKey[key]; ok { // a message prefix kept while its call ran
		t.lru.Remove(el)
		t.tokens -= len(el.Value.(*tokEntry).tokens)
	}
	t.byKey[key] = t.lru.PushFront(&tokEntry{key, tokens})
	t.tokens += len(tokens)
	for t.lru.Len() > t.cfg.CacheEntries || t.tokens > t.cfg.CacheTokens {
		el := t.lru.Back()
		e := el.Value.(*tokEntry)
		t.lru.Remove(el)
		delete(t.byKey, e.key)
		t.tokens -= len(e.tokens)
	}
}

// appendJSON appends the body MarshalJSON builds, with the raw fields
// copied as they are instead of validated and compacted (twice, by
// encoding/json): they are spans of a body the router parsed. A field that
// is not JSON makes the engine refuse the call (a fallback).
func (r TokenizeRequest) appendJSON(dst []byte) []byte {
	model, _ := json.Marshal(r.Model) // a string always marshals
	dst = append(append(append(dst, `{"model":`...), model...), ',')
	if len(r.Messages) == 0 {
		return append(append(append(dst, `"prompt":`...), r.Prompt...), '}')
	}
	dst = append(append(dst, `"messages":`...), r.Messages...)
	if len(r.Tools) > 0 {
		dst = append(append(dst, `,"tools":`...), r.Tools...)
	}
	if r.NoGenerationPrompt {
		return append(dst, `,"add_generation_prompt":false}`...)
	}
	return append(dst, `,"add_generation_prompt":true}`...)
}

// body is the /tokenize request body of r (appendJSON).
func (r TokenizeRequest) body() []byte {
	return r.appendJSON(make([]byte, 0, len(r.Model)+len(r.Messages)+len(r.Tools)+len(r.Prompt)+64))
}

func (t *Tokenizer) fetch(ctx context.Context, base string, body []byte) ([]uint32, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokenize request: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	for k, v := range t.cfg.Header {
		hr.Header[k] = v
	}
	start := time.Now()
	resp, err := t.cfg.Client.Do(hr)
	if t.cfg.OnLatency != nil {
		defer func() { t.cfg.OnLatency(time.Since(start)) }()
	}
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("tokenize: status %d", resp.StatusCode)
	}
	// A token id takes at most 11 bytes of JSON; allow some slack.
	limit := int64(t.cfg.MaxTokens)*12 + 4096
	buf := respBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledResp {
			buf.Reset()
			respBufs.Put(buf)
		}
	}()
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1)); err != nil {
		return nil, fmt.Errorf("tokenize response: %w", err)
	}
	if int64(buf.Len()) > limit {
		return nil, fmt.Errorf("tokenize response: more than %d tokens", t.cfg.MaxTokens)
	}
	return decodeTokenizeResponse(buf.Bytes(), t.cfg.MaxTokens)
}

// respBufs pools the buffers tokenize responses are read into; buffers
// past maxPooledResp are left to the collector.
var respBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledResp = 1 << 20

// CloseIdle closes the client's idle connections (Precise.Close calls it).
func (t *Tokenizer) CloseIdle() { t.cfg.Client.CloseIdleConnections() }

// CacheHits, CacheMisses and Shared count lookups answered from the cache,
// preflights sent, and callers that waited on another's identical preflight.
func (t *Tokenizer) CacheHits() uint64   { return t.hits.Load() }
func (t *Tokenizer) CacheMisses() uint64 { return t.misses.Load() }
func (t *Tokenizer) Shared() uint64      { return t.shared.Load() }

// Fallbacks counts preflights that failed for reason (FallbackTimeout,
// FallbackBusy, FallbackError).
func (t *Tokenizer) Fallbacks(reason int) uint64 { return t.fallbacks[reason].Load() }

// CacheLen is the number of cached tokenizations and their total tokens.
func (t *Tokenizer) CacheLen() (entries, tokens int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len(), t.tokens
}
