package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/module"
	"github.com/ramjet-llm/ramjet/snapshot"
)

// switchFront is the address the load generator talks to across a
// restart: a reverse proxy to the running Caddy. Hold makes new requests
// wait and returns when those in flight completed (so that the stop is
// clean); Resume points it at the new Caddy and lets them go.
type switchFront struct {
	ln     net.Listener
	srv    *http.Server
	tr     *http.Transport
	gate   sync.RWMutex // held for reading by every request in flight
	target atomic.Pointer[url.URL]
}

func startSwitch(addr string) (*switchFront, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &switchFront{ln: ln, tr: &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024,
		IdleConnTimeout: 90 * time.Second, DisableCompression: true}}
	s.target.Store(&url.URL{Scheme: "http", Host: addr})
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(s.target.Load()) },
		Transport:     s.tr,
		FlushInterval: -1,
	}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body is read whole before proxying: an HTTP/1.x server closes
		// the request body once the response starts, and the transport,
		// still reading it for its EOF when the engine answers a stream,
		// would then drop the connection mid-stream (bench/loadgen's front
		// does the same).
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, loadgen.MaxFrontBody))
		if err != nil {
			code := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				code = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "switch: "+err.Error(), code)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		s.gate.RLock()
		defer s.gate.RUnlock()
		rp.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln) // ends at Close
	return s, nil
}

// URL is the OpenAI base URL of the switch.
func (s *switchFront) URL() string { return "http://" + s.ln.Addr().String() + "/v1" }

// Hold makes new requests wait and returns once none is in flight.
func (s *switchFront) Hold() { s.gate.Lock() }

// Resume sends the held and later requests to addr.
func (s *switchFront) Resume(addr string) {
	s.tr.CloseIdleConnections()
	s.target.Store(&url.URL{Scheme: "http", Host: addr})
	s.gate.Unlock()
}

func (s *switchFront) Close() error {
	err := s.srv.Close()
	s.tr.CloseIdleConnections()
	return err
}

// snapshotLoads is how many snapshots the process loaded so far (the
// sites run the default fleet).
func snapshotLoads() float64 {
	return testutil.ToFloat64(metrics.Snapshot().Loads.WithLabelValues(module.DefaultStateKey, snapshot.Loaded))
}
