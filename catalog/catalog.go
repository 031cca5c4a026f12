package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of the catalogue.
const (
	// Stale is how long the last good list is served when no engine
	// answers.
	Stale = 5 * time.Minute
	// Retry is the least time between two fetches caused by requests
	// naming a model the fleet does not list.
	Retry = time.Second
	// MaxBody bounds one engine's /v1/models answer.
	MaxBody = 1 << 20
	// MaxListed bounds the merged list.
	MaxListed = 1024
)

// DialOf strips a scheme from an upstream address.
func DialOf(u string) string {
	if _, after, ok := strings.Cut(u, "://"); ok {
		return after
	}
	return u
}

// Card is one model as ramjet lists it: the OpenAI fields plus vLLM's
// max_model_len. Nothing else an engine reports is passed on.
type Card struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Parent      *string `json:"parent,omitempty"`
	MaxModelLen *int64  `json:"max_model_len,omitempty"`
}

// List is the merged answer of GET /v1/models.
type List struct {
	Object string `json:"object"`
	Data   []Card `json:"data"`
}

// Find returns the card of model id.
func (l *List) Find(id string) (Card, bool) {
	for _, c := range l.Data {
		if c.ID == id {
			return c, true
		}
	}
	return Card{}, false
}

// engineModel is what is read from an engine's list; fields not named here
// (root, permission, ...) are never decoded.
type engineModel struct {
	ID          string          `json:"id"`
	Created     int64           `json:"created"`
	OwnedBy     string          `json:"owned_by"`
	Parent      *string         `json:"parent"`
	MaxModelLen json.RawMessage `json:"max_model_len"`
}

// merge merges the engines' lists in upstream order: first-seen order
// (engines list their base model first, and clients often take data[0]),
// de-duplicated by id, the smallest max_model_len and earliest created
// winning, parent kept only when it names a listed model.
func merge(lists [][]engineModel) *List {
	out := &List{Object: "list", Data: []Card{}}
	at := map[string]int{}
	for _, l := range lists {
		for _, em := range l {
			if em.ID == "" {
				continue
			}
			var mml *int64
			if len(em.MaxModelLen) > 0 {
				var v int64
				if json.Unmarshal(em.MaxModelLen, &v) == nil && v > 0 {
					mml = &v
				}
			}
			if i, ok := at[em.ID]; ok {
				c := &out.Data[i]
				if mml != nil && (c.MaxModelLen == nil || *mml < *c.MaxModelLen) {
					c.MaxModelLen = mml
				}
				if em.Created > 0 && (c.Created == 0 || em.Created < c.Created) {
					c.Created = em.Created
				}
				if c.Parent == nil && em.Parent != nil {
					c.Parent = em.Parent
				}
				continue
			}
			if len(out.Data) >= MaxListed {
				continue
			}
			owner := em.OwnedBy
			if owner == "" || strings.ContainsAny(owner, "/:") {
				owner = "ramjet"
			}
			at[em.ID] = len(out.Data)
			out.Data = append(out.Data, Card{
				ID: em.ID, Object: "model", Created: em.Created, OwnedBy: owner,
				Parent: em.Parent, MaxModelLen: mml,
			})
		}
	}
	for i := range out.Data {
		c := &out.Data[i]
		if c.Parent != nil {
			if _, ok := at[*c.Parent]; !ok || *c.Parent == c.ID {
				c.Parent = nil
			}
		}
	}
	return out
}

// Catalog is the model list of one set of engines. Safe for concurrent
// use.
type Catalog struct {
	dials   []string
	token   string
	timeout time.Duration
	client  *http.Client

	mu        sync.Mutex
	list      *List
	ids       atomic.Pointer[Names] // the listed models (set with list; read without the lock)
	fetchedAt time.Time             // of list; zero when no engine ever answered
	triedAt   time.Time             // of the last fetch attempt
	inflight  chan struct{}
	lastErr   error
}

// New returns the catalogue of the engines at upstreams (host:port or a
// base URL; a repeated address, a data-parallel rank, is asked once),
// asked with token as bearer token and timeout per fetch.
func New(upstreams []string, token string, timeout time.Duration) (*Catalog, error) {
	dials := uniqueSorted(upstreams)
	if len(dials) == 0 {
		return nil, errors.New("upstreams: at least one upstream is required")
	}
	return &Catalog{
		dials:   dials,
		token:   token,
		timeout: timeout,
		client: &http.Client{
			Timeout: timeout,
			// Model lists are fetched once per cache period: a connection
			// per fetch costs nothing, and none is left idle behind a
			// fetch that finishes after Close (a reload, a stop).
			Transport: &http.Transport{
				Proxy:             nil,
				DisableKeepAlives: true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// Key identifies the catalogue New(upstreams, token, timeout) returns, to
// share it between handlers of the same engines.
func Key(upstreams []string, token string, timeout time.Duration) string {
	return token + "\x00" + timeout.String() + "\x00" + strings.Join(uniqueSorted(upstreams), ",")
}

// Close closes the idle connections.
func (f *Catalog) Close() error {
	f.client.CloseIdleConnections()
	return nil
}

func uniqueSorted(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// Models returns the merged list, fetching it when the cached one is older
// than maxAge. Concurrent callers share one fetch. When no engine answers,
// the last good list is served for up to Stale.
//
// healthy, when not nil, names the dial addresses worth asking: engines
// Caddy holds down are skipped, so that one that hangs does not stall every
// refresh for the whole timeout.
func (f *Catalog) Models(ctx context.Context, maxAge time.Duration, healthy map[string]bool) (*List, error) {
	f.mu.Lock()
	if f.list != nil && time.Since(f.fetchedAt) <= maxAge {
		l := f.list
		f.mu.Unlock()
		return l, nil
	}
	f.mu.Unlock()
	if err := f.refresh(ctx, healthy); err != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.list != nil && time.Since(f.fetchedAt) <= Stale {
			return f.list, nil
		}
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.list, nil
}

// Knows reports whether model is in the fleet's list, and whether the list
// is known at all. A model missing from a list older than Retry
// triggers one fetch (shared, rate-limited), so that a model an engine has
// just loaded is not refused for long.
func (f *Catalog) Knows(ctx context.Context, model string) (known, listed bool) {
	if f.has(model) {
		return true, true // every routed request's case: no lock, no clock
	}
	f.mu.Lock()
	known, listed = f.has(model), f.list != nil
	stale := time.Since(f.triedAt) > Retry
	f.mu.Unlock()
	if known || !stale {
		return known, listed
	}
	_ = f.refresh(ctx, nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.has(model), f.list != nil
}

// has reports whether model is in the last list fetched.
func (f *Catalog) has(model string) bool {
	ids := f.ids.Load()
	return ids != nil && ids.Has(model)
}

// refresh fetches all lists once; callers arriving during a fetch wait for
// it instead of starting another.
func (f *Catalog) refresh(ctx context.Context, healthy map[string]bool) error {
	f.mu.Lock()
	if ch := f.inflight; ch != nil {
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.lastErr
	}
	ch := make(chan struct{})
	f.inflight = ch
	f.triedAt = time.Now()
	f.mu.Unlock()

	list, err := f.fetchAll(healthy)

	f.mu.Lock()
	f.lastErr = err
	if err == nil {
		f.list = list
		f.fetchedAt = time.Now()
		ids := make([]string, len(list.Data))
		for i, c := range list.Data {
			ids[i] = c.ID
		}
		f.ids.Store(NewNames(MaxListed, ids...))
	}
	f.inflight = nil
	f.mu.Unlock()
	close(ch)
	return err
}

// fetchAll asks every engine in parallel. It does not use the caller's
// context: a client that goes away must not cancel a fetch others wait for.
func (f *Catalog) fetchAll(healthy map[string]bool) (*List, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	lists := make([][]engineModel, len(f.dials))
	errs := make([]error, len(f.dials))
	var wg sync.WaitGroup
	for i, dial := range f.dials {
		if healthy != nil && !healthy[DialOf(dial)] {
			errs[i] = errors.New("held down by Caddy's health checks")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lists[i], errs[i] = f.fetchOne(ctx, dial)
		}()
	}
	wg.Wait()
	answered := 0
	for _, err := range errs {
		if err == nil {
			answered++
		}
	}
	if answered == 0 {
		return nil, fmt.Errorf("model list: no engine answered: %w", errors.Join(errs...))
	}
	return merge(lists), nil
}

func (f *Catalog) fetchOne(ctx context.Context, dial string) ([]engineModel, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstreamURL(dial)+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxBody))
		return nil, fmt.Errorf("GET /v1/models: status %d", resp.StatusCode)
	}
	var body struct {
		Data []engineModel `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, MaxBody)).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET /v1/models: decoding: %w", err)
	}
	if len(body.Data) > MaxListed {
		body.Data = body.Data[:MaxListed]
	}
	return body.Data, nil
}

// upstreamURL turns a dial address into a base URL. Upstreams in a ramjet
// route are plain host:port (or a scheme-prefixed address, kept).
func upstreamURL(dial string) string {
	if strings.Contains(dial, "://") {
		return strings.TrimSuffix(dial, "/")
	}
	return "http://" + dial
}

// ParseModelCheck reads model_check: on or off.
func ParseModelCheck(v string) (string, error) {
	if v != "on" && v != "off" {
		return "", fmt.Errorf("must be on or off, got %q", v)
	}
	return v, nil
}
