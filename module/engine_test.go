package module

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testEngine is a minimal OpenAI-compatible engine on 127.0.0.1 that
// records what it receives. Streaming responses can be held before the
// first chunk (gate, a prefill that waits) or after it (hold).
type testEngine struct {
	id   int
	addr string
	srv  *http.Server

	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header

	healthy  atomic.Bool
	canceled atomic.Int32
	active   atomic.Int32

	// gate, when set, is waited on before the first byte of a response.
	gate atomic.Pointer[chan struct{}]
	// hold, when set, is waited on after the first chunk of a stream.
	hold atomic.Pointer[chan struct{}]
	// arrived is signalled (non-blocking) when a request arrives.
	arrived chan int
}

func startEngines(t testing.TB, n int) []*testEngine {
	t.Helper()
	es := make([]*testEngine, n)
	arrived := make(chan int, 1024)
	for i := range es {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e := &testEngine{id: i, addr: ln.Addr().String(), arrived: arrived}
		e.healthy.Store(true)
		e.srv = &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
		go e.srv.Serve(ln)
		t.Cleanup(func() { e.srv.Close() })
		es[i] = e
	}
	return es
}

func dials(es []*testEngine) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.addr
	}
	return out
}

func (e *testEngine) requests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.bodies)
}

func (e *testEngine) lastBody() ([]byte, http.Header) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.bodies) == 0 {
		return nil, nil
	}
	return e.bodies[len(e.bodies)-1], e.headers[len(e.headers)-1]
}

func (e *testEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if !e.healthy.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
		return
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"e%d"}]}`, e.id)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	e.headers = append(e.headers, r.Header.Clone())
	e.mu.Unlock()
	e.active.Add(1)
	defer e.active.Add(-1)
	select {
	case e.arrived <- e.id:
	default:
	}
	w.Header().Set("X-Engine", fmt.Sprint(e.id))
	if g := e.gate.Load(); g != nil {
		select {
		case <-*g:
		case <-r.Context().Done():
			e.canceled.Add(1)
			return
		case <-time.After(10 * time.Second):
		}
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c%d","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"engine %d"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`, e.id, e.id)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(content string) {
		fmt.Fprintf(w, "data: {\"id\":\"c%d\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", e.id, content)
		http.NewResponseController(w).Flush()
	}
	chunk(fmt.Sprintf("engine %d", e.id))
	if h := e.hold.Load(); h != nil {
		select {
		case <-*h:
		case <-r.Context().Done():
			e.canceled.Add(1)
			return
		case <-time.After(10 * time.Second):
		}
	}
	chunk(" done")
	io.WriteString(w, "data: [DONE]\n\n")
}
