package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// FrontPolicy is how a Front picks the backend of each request.
type FrontPolicy int

const (
	// FrontRoundRobin deals requests to the backends in turn.
	FrontRoundRobin FrontPolicy = iota
	// FrontRandom draws each request's backend at random.
	FrontRandom
)

// ParseFrontPolicy parses "rr" or "random".
func ParseFrontPolicy(s string) (FrontPolicy, error) {
	switch s {
	case "rr":
		return FrontRoundRobin, nil
	case "random":
		return FrontRandom, nil
	}
	return 0, fmt.Errorf("unknown front policy %q (want rr or random)", s)
}

func (p FrontPolicy) String() string {
	if p == FrontRandom {
		return "random"
	}
	return "rr"
}

// Front is a small HTTP front balancer for benchmarks: the plain load
// balancer (an L7 balancer, or a Kubernetes Service) in front of several
// router instances. It picks a backend per request, knows nothing of the
// request's content, and streams responses through unbuffered. It listens
// on 127.0.0.1 only.
type Front struct {
	ln       net.Listener
	srv      *http.Server
	tr       *http.Transport
	backends []*url.URL
	policy   FrontPolicy
	next     atomic.Uint64
	counts   []atomic.Int64

	mu      sync.Mutex
	rng     *rand.Rand
	errs    int64
	lastErr string

	done chan struct{}
	err  error
}

// StartFront binds 127.0.0.1 (a port the kernel picks) and serves a front
// over backends (host:port of HTTP servers) with policy; seed drives
// FrontRandom. Close stops it.
func StartFront(backends []string, policy FrontPolicy, seed uint64) (*Front, error) {
	if len(backends) == 0 {
		return nil, errors.New("front: no backends")
	}
	f := &Front{
		policy: policy,
		counts: make([]atomic.Int64, len(backends)),
		rng:    rand.New(rand.NewPCG(seed, 0x66726f6e74)),
		done:   make(chan struct{}),
		tr: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	for _, b := range backends {
		u, err := url.Parse("http://" + b)
		if err != nil || u.Host == "" || strings.Contains(b, "/") {
			return nil, fmt.Errorf("front: backend %q: want host:port", b)
		}
		f.backends = append(f.backends, u)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			i := pr.In.Context().Value(backendKey{}).(int)
			pr.SetURL(f.backends[i])
			pr.Out.Host = pr.In.Host
		},
		Transport:     f.tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			f.noteErr(err.Error())
			http.Error(w, "front: "+err.Error(), http.StatusBadGateway)
		},
		// What the proxy logs (a body copy cut short) is counted instead.
		ErrorLog: log.New(errWriter{f}, "", 0),
	}
	f.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The body is read whole before proxying: an HTTP/1.x server may
			// close the request body once the response starts, and a
			// backend that answers before the proxy's transport has seen
			// the body's EOF would then lose the connection mid-stream.
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxFrontBody))
			if err != nil {
				f.noteErr("reading the request body: " + err.Error())
				http.Error(w, "front: "+err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			i := f.pick()
			f.counts[i].Add(1)
			proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), backendKey{}, i)))
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("front listen: %w", err)
	}
	f.ln = ln
	go func() {
		defer close(f.done)
		if err := f.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			f.err = err
		}
	}()
	return f, nil
}

type backendKey struct{}

// MaxFrontBody bounds a request body through a Front.
const MaxFrontBody = 64 << 20

func (f *Front) noteErr(msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs++
	f.lastErr = msg
}

// errWriter counts the proxy's log lines as errors.
type errWriter struct{ f *Front }

func (w errWriter) Write(b []byte) (int, error) {
	w.f.noteErr(strings.TrimSpace(string(b)))
	return len(b), nil
}

// Errors returns how many proxy errors (a backend unreachable, a response
// cut short) the front saw, and the last one's message.
func (f *Front) Errors() (int64, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errs, f.lastErr
}

func (f *Front) pick() int {
	if f.policy == FrontRandom {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.rng.IntN(len(f.backends))
	}
	return int((f.next.Add(1) - 1) % uint64(len(f.backends)))
}

// Addr is the front's listen address (127.0.0.1:port).
func (f *Front) Addr() string { return f.ln.Addr().String() }

// URL is the OpenAI base URL through the front.
func (f *Front) URL() string { return "http://" + f.Addr() + "/v1" }

// Counts returns the requests sent to each backend so far.
func (f *Front) Counts() []int64 {
	out := make([]int64, len(f.counts))
	for i := range f.counts {
		out[i] = f.counts[i].Load()
	}
	return out
}

// Close stops accepting, closes every connection (in-flight requests
// fail) and the idle backend connections, and waits for the server
// goroutine.
func (f *Front) Close() error {
	err := f.srv.Close()
	<-f.done
	f.tr.CloseIdleConnections()
	if err == nil {
		err = f.err
	}
	return err
}
