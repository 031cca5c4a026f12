package kvindex

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Exact-placement canaries check the index against the engines themselves.
// Each round, one replica (in turn) is asked for a one-token completion of a
// prompt of known token ids, fixed per replica. Before sending it the canary
// reads the index's overlap for those tokens on that replica; the engine's
// usage.prompt_tokens_details.cached_tokens then tells how many it really
// held. The first round warms the prefix; later rounds check that the index
// followed it (kept it, or saw it evicted).

// CanaryTarget is one replica a canary probes.
type CanaryTarget struct {
	// Replica is the handle in the Index.
	Replica Replica
	// BaseURL is the engine's OpenAI base, e.g. "http://10.0.0.5:8000".
	BaseURL string
	// Header is added to the replica's requests (e.g. X-data-parallel-rank).
	Header http.Header
}

// CanaryConfig configures a Canary. Zero values take the defaults.
type CanaryConfig struct {
	// Model is the model name sent with each probe. Required.
	Model string
	// Interval is the time between two probes (each probes one replica).
	// Default 30s.
	Interval time.Duration
	// Timeout bounds one probe. Default 5s.
	Timeout time.Duration
	// Blocks is the canary prefix length in blocks. Default 4.
	Blocks int
	// Client sends the probes; default http.DefaultClient's transport.
	Client *http.Client
	// Header is added to every probe (e.g. the upstream Authorization).
	Header http.Header
}

func (c *CanaryConfig) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = 30 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Blocks <= 0 {
		c.Blocks = 4
	}
	if c.Client == nil {
		c.Client = &http.Client{}
	}
}

// CanaryResult is one probe's outcome, in tokens.
type CanaryResult struct {
	Replica   Replica
	Fresh     bool // the replica's feed was trusted when probed
	Predicted int  // the index's overlap before the probe
	Actual    int  // the engine's cached_tokens
}

// Canary runs exact-placement probes. Safe for concurrent use.
type Canary struct {
	x       *Index
	cfg     CanaryConfig
	targets []CanaryTarget // under mu (setTargets: a template's replicas)

	mu     sync.Mutex
	next   int
	cancel context.CancelFunc
	wg     sync.WaitGroup

	probes, exact, errs, unsupported atomic.Uint64
	absErr                           atomic.Uint64
}

// NewCanary returns a Canary probing targets against x.
func NewCanary(x *Index, targets []CanaryTarget, cfg CanaryConfig) (*Canary, error) {
	if len(targets) == 0 {
		return nil, errors.New("kvindex: canary needs at least one target")
	}
	c, err := newCanary(x, cfg)
	if err == nil {
		c.targets = targets
	}
	return c, err
}

func newCanary(x *Index, cfg CanaryConfig) (*Canary, error) {
	cfg.setDefaults()
	if cfg.Model == "" {
		return nil, errors.New("kvindex: canary model is required")
	}
	return &Canary{x: x, cfg: cfg}, nil
}

// setTargets replaces the targets with the engines of bases.
func (c *Canary) setTargets(bases []preciseBase) {
	targets := make([]CanaryTarget, len(bases))
	for i, b := range bases {
		targets[i] = CanaryTarget{Replica: b.r, BaseURL: b.url, Header: b.hdr}
	}
	c.mu.Lock()
	c.targets = targets
	c.mu.Unlock()
}

// Tokens returns the canary prompt of replica r: Blocks full blocks plus
// half a block, so that the engine's cache can hit every full block (an
// engine always computes at least the last prompt token). Token ids are in
// [1000, 31000), valid for common vocabularies.
func (c *Canary) Tokens(r Replica) []uint32 {
	bs := c.x.BlockSize()
	n := c.cfg.Blocks*bs + max(bs/2, 1)
	toks := make([]uint32, n)
	var b [12]byte
	copy(b[:], "rjcanary")
	b[8] = byte(r)
	b[9] = byte(r >> 8)
	h := xxhash.Sum64(b[:])
	for i := range toks {
		h = h*6364136223846793005 + 1442695040888963407
		toks[i] = 1000 + uint32((h>>33)%30000)
	}
	return toks
}

// Start probes one replica every Interval until ctx ends or Close.
func (c *Canary) Start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		return
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(c.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.Probe(ctx) // counted; errors need no other handling
			}
		}
	}()
}

// Close stops the probes and waits for the one in flight.
func (c *Canary) Close() error {
	c.mu.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}

// Probe probes the next replica in turn and records the outcome.
func (c *Canary) Probe(ctx context.Context) (CanaryResult, error) {
	c.mu.Lock()
	if len(c.targets) == 0 {
		c.mu.Unlock()
		return CanaryResult{}, errors.New("kvindex: no canary target yet")
	}
	tg := c.targets[c.next%len(c.targets)]
	c.next++
	c.mu.Unlock()
	return c.ProbeTarget(ctx, tg)
}

// ProbeTarget probes one replica and records the outcome.
func (c *Canary) ProbeTarget(ctx context.Context, tg CanaryTarget) (CanaryResult, error) {
	toks := c.Tokens(tg.Replica)
	res := CanaryResult{Replica: tg.Replica, Fresh: c.x.Fresh(tg.Replica)}
	keys := c.x.Keys(make([]uint64, 0, len(toks)/c.x.BlockSize()), 0, toks)
	out := make([]int, c.x.NumReplicas())
	c.x.Overlap(keys, out)
	res.Predicted = out[tg.Replica]

	actual, err := c.send(ctx, tg, toks)
	if err != nil {
		c.errs.Add(1)
		return res, err
	}
	if actual < 0 {
		c.unsupported.Add(1)
		return res, errors.New("kvindex: engine does not report cached_tokens")
	}
	res.Actual = actual
	// Only probes of a trusted feed measure the index; others say nothing.
	if res.Fresh {
		c.probes.Add(1)
		if res.Predicted == res.Actual {
			c.exact.Add(1)
		}
		d := res.Predicted - res.Actual
		c.absErr.Add(uint64(max(d, -d)))
	}
	return res, nil
}

// send posts the one-token completion and returns cached_tokens (-1 when
// the engine does not report it).
func (c *Canary) send(ctx context.Context, tg CanaryTarget, toks []uint32) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	body, err := json.Marshal(map[string]any{"model": c.cfg.Model, "prompt": toks,
		"max_tokens": 1, "temperature": 0, "stream": false})
	if err != nil {
		return 0, fmt.Errorf("canary request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		strings.TrimSuffix(tg.BaseURL, "/")+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("canary request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, h := range []http.Header{c.cfg.Header, tg.Header} {
		for k, v := range h {
			req.Header[k] = v
		}
	}
	resp, err := c.cfg.Client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("canary: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("canary: status %d", resp.StatusCode)
	}
	var out struct {
		Usage struct {
			Details *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return 0, fmt.Errorf("canary response: %w", err)
	}
	if out.Usage.Details == nil || out.Usage.Details.Cached == nil {
		return -1, nil
	}
	return *out.Usage.Details.Cached, nil
}

// Accuracy is the share of probes of fresh replicas whose prediction was
// exact, and the number of such probes; NaN-free: 0 probes give (0, 0).
func (c *Canary) Accuracy() (float64, uint64) {
	n := c.probes.Load()
	if n == 0 {
		return 0, 0
	}
	return float64(c.exact.Load()) / float64(n), n
}

// MeanAbsError is the mean |predicted − actual| in tokens over the probes
// Accuracy counts.
func (c *Canary) MeanAbsError() float64 {
	n := c.probes.Load()
	if n == 0 {
		return 0
	}
	return float64(c.absErr.Load()) / float64(n)
}

// Errors counts probes that failed (transport, status, response), and
// Unsupported those whose engine did not report cached_tokens.
func (c *Canary) Errors() uint64      { return c.errs.Load() }
func (c *Canary) Unsupported() uint64 { return c.unsupported.Load() }
