package module

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
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(Models{})
	httpcaddyfile.RegisterHandlerDirective("ramjet_models", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(Models)
		err := m.UnmarshalCaddyfile(h.Dispenser)
		return m, err
	})
	httpcaddyfile.RegisterDirectiveOrder("ramjet_models", httpcaddyfile.Before, "reverse_proxy")
}

// Defaults and bounds of the model list.
const (
	// DefaultModelsTimeout bounds one fetch of all engines' model lists.
	DefaultModelsTimeout = 2 * time.Second
	// DefaultModelsCache is how long a merged model list is served before
	// the engines are asked again.
	DefaultModelsCache = 5 * time.Second
	// modelsStale is how long the last good list is served when no engine
	// answers.
	modelsStale = 5 * time.Minute
	// modelsRetry is the least time between two fetches caused by requests
	// naming a model the fleet does not list.
	modelsRetry = time.Second
	// maxModelsBody bounds one engine's /v1/models answer.
	maxModelsBody = 1 << 20
	// maxListedModels bounds the merged list.
	maxListedModels = 1024
)

// Models answers GET /v1/models (and GET /v1/models/{id}) for a ramjet route
// (module http.handlers.ramjet_models): it asks every engine for its model
// list, in parallel and with a timeout, merges and de-duplicates them, and
// rewrites the metadata so that no engine filesystem path (vLLM's "root"),
// host or port leaks. Kept per model: id, object, created, owned_by,
// max_model_len, and parent when the parent is itself a listed model (a
// LoRA adapter's base). The merged list is cached briefly and shared with
// the ramjet_guard of the same upstreams (its unknown-model check).
type Models struct {
	// Upstreams are the dial addresses (host:port) of the engines. A
	// repeated address (a data-parallel rank) is asked once.
	Upstreams []string `json:"upstreams,omitempty"`

	// UpstreamToken is the bearer token sent to the engines; placeholders
	// such as {env.RJ_UPSTREAM_TOKEN} are resolved at provisioning.
	UpstreamToken string `json:"upstream_token,omitempty"`

	// ClientTokens, when set, are the API keys clients must present; see
	// ramjet_guard.
	ClientTokens string `json:"client_tokens,omitempty"`

	// Timeout bounds one fetch of all engines' lists. Default 2s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Cache is how long a merged list is served before the engines are
	// asked again. Default 5s.
	Cache caddy.Duration `json:"cache,omitempty"`

	fleet  *fleetModels
	fleetK string
	auth   clientAuth
	finder *proxyFinder
}

// CaddyModule returns the Caddy module information.
func (Models) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.ramjet_models",
		New: func() caddy.Module { return new(Models) },
	}
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	ramjet_models <upstreams...> {
//	    upstream_token <token>
//	    client_tokens  <keys...>
//	    timeout        <duration>
//	    cache          <duration>
//	}
func (m *Models) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	m.Upstreams = append(m.Upstreams, splitList(d.RemainingArgs())...)
	seen := map[string]bool{}
	for d.NextBlock(0) {
		name := d.Val()
		if seen[name] {
			return d.Errf("duplicate option %q", name)
		}
		seen[name] = true
		args := d.RemainingArgs()
		var err error
		switch name {
		case "upstream_token":
			m.UpstreamToken, err = optionalArg(d, args)
		case "client_tokens":
			m.ClientTokens = strings.Join(args, ",")
		case "timeout":
			m.Timeout, err = parseDurationArg(d, args)
		case "cache":
			m.Cache, err = parseDurationArg(d, args)
		default:
			return d.Errf("unknown ramjet_models option %q", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Provision fills defaults and joins the shared model list.
func (m *Models) Provision(ctx caddy.Context) error {
	if err := CheckRetiredEnv(); err != nil {
		return err
	}
	if m.Timeout == 0 {
		m.Timeout = caddy.Duration(DefaultModelsTimeout)
	}
	if m.Cache == 0 {
		m.Cache = caddy.Duration(DefaultModelsCache)
	}
	m.auth = newClientAuth(m.ClientTokens)
	m.finder = &proxyFinder{ctx: ctx}
	f, key, err := acquireModelList(m.Upstreams, resolveSecret(m.UpstreamToken), time.Duration(m.Timeout))
	if err != nil {
		return err
	}
	m.fleet, m.fleetK = f, key
	return nil
}

// Validate rejects bad values, naming the field.
func (m *Models) Validate() error {
	switch {
	case len(m.Upstreams) == 0:
		return errors.New("upstreams: at least one upstream is required")
	case m.Timeout < 0:
		return fmt.Errorf("timeout must be positive, got %v", m.Timeout)
	case m.Cache < 0:
		return fmt.Errorf("cache must be >= 0, got %v", m.Cache)
	}
	return nil
}

// Cleanup releases the shared model list.
func (m *Models) Cleanup() error {
	if m.fleet != nil {
		_, _ = modelLists.Delete(m.fleetK)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler. It answers every request
// it sees; the route in front of it should match GET /v1/models*.
func (m *Models) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if ae := m.auth.check(r); ae != nil {
		WriteAPIError(w, ae)
		return nil
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		WriteAPIError(w, newAPIError(http.StatusMethodNotAllowed, errTypeInvalidRequest, "method_not_allowed", "",
			"only GET is allowed on "+r.URL.Path))
		return nil
	}
	list, err := m.fleet.models(r.Context(), time.Duration(m.Cache), m.healthy())
	if err != nil {
		WriteAPIError(w, newAPIError(http.StatusServiceUnavailable, errTypeServer, errCodeNoReplica, "",
			"no inference engine answered with its model list; retry later"))
		return nil
	}
	var body []byte
	if id, ok := strings.CutPrefix(strings.TrimSuffix(r.URL.Path, "/"), "/v1/models/"); ok && id != "" {
		card, found := list.find(id)
		if !found {
			WriteAPIError(w, newAPIError(http.StatusNotFound, errTypeInvalidRequest, errCodeModelNotFound, "model",
				fmt.Sprintf("The model `%s` does not exist.", id)))
			return nil
		}
		body, err = json.Marshal(card)
	} else {
		body, err = json.Marshal(list)
	}
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("encoding model list: %w", err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
	return nil
}

// healthy returns the dial addresses Caddy currently holds usable, from the
// reverse_proxy over the same engines, or nil (ask every engine) when there
// is no such proxy or none is usable.
func (m *Models) healthy() map[string]bool {
	want := map[string]bool{}
	for _, u := range m.Upstreams {
		want[dialOf(u)] = true
	}
	proxy := m.finder.find(func(ups reverseproxy.UpstreamPool) bool {
		seen := map[string]bool{}
		for _, u := range ups {
			if !want[u.Dial] {
				return false
			}
			seen[u.Dial] = true
		}
		return len(seen) == len(want)
	})
	if proxy == nil {
		return nil
	}
	ok := map[string]bool{}
	for _, u := range proxy.Upstreams {
		if u.Healthy() {
			ok[u.Dial] = true
		}
	}
	if len(ok) == 0 {
		return nil
	}
	return ok
}

// dialOf strips a scheme from an upstream address.
func dialOf(u string) string {
	if _, after, ok := strings.Cut(u, "://"); ok {
		return after
	}
	return u
}

// ModelCard is one model as ramjet lists it: the OpenAI fields plus vLLM's
// max_model_len. Nothing else an engine reports is passed on.
type ModelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Parent      *string `json:"parent,omitempty"`
	MaxModelLen *int64  `json:"max_model_len,omitempty"`
}

// ModelList is the merged answer of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"`
	Data   []ModelCard `json:"data"`
}

func (l *ModelList) find(id string) (ModelCard, bool) {
	for _, c := range l.Data {
		if c.ID == id {
			return c, true
		}
	}
	return ModelCard{}, false
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

// mergeModels merges the engines' lists in upstream order: first-seen order
// (engines list their base model first, and clients often take data[0]),
// de-duplicated by id, the smallest max_model_len and earliest created
// winning, parent kept only when it names a listed model.
func mergeModels(lists [][]engineModel) *ModelList {
	out := &ModelList{Object: "list", Data: []ModelCard{}}
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
			if len(out.Data) >= maxListedModels {
				continue
			}
			owner := em.OwnedBy
			if owner == "" || strings.ContainsAny(owner, "/:") {
				owner = "ramjet"
			}
			at[em.ID] = len(out.Data)
			out.Data = append(out.Data, ModelCard{
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

// fleetModels is the model list of one set of engines, shared through the
// modelLists pool by every handler of the same upstreams and token, so that a
// config reload keeps it.
type fleetModels struct {
	dials   []string
	token   string
	timeout time.Duration
	client  *http.Client

	mu        sync.Mutex
	list      *ModelList
	ids       map[string]bool
	fetchedAt time.Time // of list; zero when no engine ever answered
	triedAt   time.Time // of the last fetch attempt
	inflight  chan struct{}
	lastErr   error
}

var modelLists = caddy.NewUsagePool()

// acquireModelList returns the shared model list of these upstreams, creating it
// on first use. The caller must modelLists.Delete(key) in Cleanup.
func acquireModelList(upstreams []string, token string, timeout time.Duration) (*fleetModels, string, error) {
	dials := uniqueSorted(upstreams)
	if len(dials) == 0 {
		return nil, "", errors.New("upstreams: at least one upstream is required")
	}
	key := token + "\x00" + timeout.String() + "\x00" + strings.Join(dials, ",")
	v, _, err := modelLists.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &fleetModels{
			dials:   dials,
			token:   token,
			timeout: timeout,
			client: &http.Client{
				Timeout: timeout,
				Transport: &http.Transport{
					Proxy:               nil,
					MaxIdleConnsPerHost: 2,
					IdleConnTimeout:     30 * time.Second,
				},
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			},
		}, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("model list: %w", err)
	}
	return v.(*fleetModels), key, nil
}

// Destruct closes idle connections when the last handler lets go.
func (f *fleetModels) Destruct() error {
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

// models returns the merged list, fetching it when the cached one is older
// than maxAge. Concurrent callers share one fetch. When no engine answers,
// the last good list is served for up to modelsStale.
//
// healthy, when not nil, names the dial addresses worth asking: engines
// Caddy holds down are skipped, so that one that hangs does not stall every
// refresh for the whole timeout.
func (f *fleetModels) models(ctx context.Context, maxAge time.Duration, healthy map[string]bool) (*ModelList, error) {
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
		if f.list != nil && time.Since(f.fetchedAt) <= modelsStale {
			return f.list, nil
		}
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.list, nil
}

// knows reports whether model is in the fleet's list, and whether the list
// is known at all. A model missing from a list older than modelsRetry
// triggers one fetch (shared, rate-limited), so that a model an engine has
// just loaded is not refused for long.
func (f *fleetModels) knows(ctx context.Context, model string) (known, listed bool) {
	f.mu.Lock()
	known, listed = f.ids[model], f.list != nil
	stale := time.Since(f.triedAt) > modelsRetry
	f.mu.Unlock()
	if known || !stale {
		return known, listed
	}
	_ = f.refresh(ctx, nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ids[model], f.list != nil
}

// refresh fetches all lists once; callers arriving during a fetch wait for
// it instead of starting another.
func (f *fleetModels) refresh(ctx context.Context, healthy map[string]bool) error {
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
		f.ids = make(map[string]bool, len(list.Data))
		for _, c := range list.Data {
			f.ids[c.ID] = true
		}
	}
	f.inflight = nil
	f.mu.Unlock()
	close(ch)
	return err
}

// fetchAll asks every engine in parallel. It does not use the caller's
// context: a client that goes away must not cancel a fetch others wait for.
func (f *fleetModels) fetchAll(healthy map[string]bool) (*ModelList, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	lists := make([][]engineModel, len(f.dials))
	errs := make([]error, len(f.dials))
	var wg sync.WaitGroup
	for i, dial := range f.dials {
		if healthy != nil && !healthy[dialOf(dial)] {
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
	return mergeModels(lists), nil
}

func (f *fleetModels) fetchOne(ctx context.Context, dial string) ([]engineModel, error) {
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
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxModelsBody))
		return nil, fmt.Errorf("GET /v1/models: status %d", resp.StatusCode)
	}
	var body struct {
		Data []engineModel `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET /v1/models: decoding: %w", err)
	}
	if len(body.Data) > maxListedModels {
		body.Data = body.Data[:maxListedModels]
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

// Interface guards.
var (
	_ caddy.Provisioner           = (*Models)(nil)
	_ caddy.Validator             = (*Models)(nil)
	_ caddy.CleanerUpper          = (*Models)(nil)
	_ caddyhttp.MiddlewareHandler = (*Models)(nil)
	_ caddyfile.Unmarshaler       = (*Models)(nil)
	_ caddy.Destructor            = (*fleetModels)(nil)
)
