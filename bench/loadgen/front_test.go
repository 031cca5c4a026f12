package loadgen_test

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/ramjet-llm/ramjet/bench/loadgen"
)

func backend(t *testing.T, name string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Backend", name)
		io.WriteString(w, name+" "+r.URL.Path)
	}))
	t.Cleanup(s.Close)
	return s
}

func get(t *testing.T, c *http.Client, url string) (string, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Get("X-Backend"), string(b)
}

func TestFrontRoundRobin(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	a, b, c := backend(t, "a"), backend(t, "b"), backend(t, "c")
	f, err := loadgen.StartFront([]string{a.Listener.Addr().String(), b.Listener.Addr().String(), c.Listener.Addr().String()}, loadgen.FrontRoundRobin, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(f.Addr(), "127.0.0.1:") {
		t.Errorf("front listens on %s", f.Addr())
	}
	cl := &http.Client{Transport: &http.Transport{}}
	var got []string
	for range 6 {
		h, body := get(t, cl, f.URL()+"/models")
		if body != h+" /v1/models" {
			t.Errorf("backend %s answered %q", h, body)
		}
		got = append(got, h)
	}
	if s := strings.Join(got, ""); s != "abcabc" {
		t.Errorf("backends in order %q, want abcabc", s)
	}
	for i, n := range f.Counts() {
		if n != 2 {
			t.Errorf("backend %d: %d requests, want 2", i, n)
		}
	}
	cl.CloseIdleConnections()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b.Close()
	c.Close()
	goleak.VerifyNone(t, opts)
}

func TestFrontRandomUsesEveryBackend(t *testing.T) {
	a, b := backend(t, "a"), backend(t, "b")
	f, err := loadgen.StartFront([]string{a.Listener.Addr().String(), b.Listener.Addr().String()}, loadgen.FrontRandom, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cl := &http.Client{Transport: &http.Transport{}}
	defer cl.CloseIdleConnections()
	seen := map[string]int{}
	for range 40 {
		h, _ := get(t, cl, f.URL()+"/models")
		seen[h]++
	}
	if seen["a"] == 0 || seen["b"] == 0 {
		t.Errorf("random front: %v", seen)
	}
}

// A streamed response passes through unbuffered: the client reads the
// first event while the backend still holds the second back.
func TestFrontStreams(t *testing.T) {
	release := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
	}))
	defer s.Close()
	f, err := loadgen.StartFront([]string{s.Listener.Addr().String()}, loadgen.FrontRoundRobin, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cl := &http.Client{Transport: &http.Transport{}}
	defer cl.CloseIdleConnections()
	resp, err := cl.Get(f.URL() + "/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(release)
	rest, err := io.ReadAll(rd)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

func TestFrontRejectsBadBackends(t *testing.T) {
	for _, b := range [][]string{nil, {"http://127.0.0.1:1"}, {""}} {
		if f, err := loadgen.StartFront(b, loadgen.FrontRoundRobin, 1); err == nil {
			f.Close()
			t.Errorf("%q: no error", b)
		}
	}
	// A backend that is gone: the client gets a 502 and the front counts it.
	gone := httptest.NewServer(http.NotFoundHandler())
	addr := gone.Listener.Addr().String()
	gone.Close()
	f, err := loadgen.StartFront([]string{addr}, loadgen.FrontRoundRobin, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cl := &http.Client{Transport: &http.Transport{}}
	defer cl.CloseIdleConnections()
	resp, err := cl.Get(f.URL() + "/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n, last := f.Errors(); resp.StatusCode != http.StatusBadGateway || n != 1 || last == "" {
		t.Errorf("status %d, errors %d %q", resp.StatusCode, n, last)
	}
	if _, err := loadgen.ParseFrontPolicy("dns"); err == nil {
		t.Error("ParseFrontPolicy(dns): no error")
	}
}
