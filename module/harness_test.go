package module

// The one Caddy test harness of the module tests: an in-process Caddy on
// listeners the test binds itself (127.0.0.1:0, handed over to Caddy, so
// no port is ever "found free, closed and rebound"), stopped so that
// nothing of it outlives the test, and the one eventually helper.
//
// Entry points:
//   - startCaddy / startObsCaddy: a JSON config built from proxyOpts (the
//     ramjet handler and policy in front of the given upstreams; with an
//     ops server for metrics and the dashboard for startObsCaddy);
//   - startCaddyfile: a Caddyfile with {ADDR} and {ADMIN} placeholders;
//   - loadCaddyfile / mustLoad: a Caddyfile such as deploy/Caddyfile with
//     RJ_* environment variables (RJ_LISTEN and RJ_METRICS_LISTEN are set
//     to handed-over listeners).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// eventually polls cond every 10ms until it holds, and fails the test
// after 20s (generous: the suite must pass on a loaded machine; a passing
// condition returns at once).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !poll(20*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// obsEventually is eventually under the name the observability tests
// call it by.
var obsEventually = eventually

// poll evaluates cond every 10ms until it holds (true) or d passes
// (false).
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// testNetwork is the Caddy network type of handed-over listeners: Caddy
// asked to listen on "ramjettest/127.0.0.1:PORT" serves on the listener a
// test bound on that address (listenLocal), through Caddy's plugin network
// hook (caddy.RegisterNetwork).
const testNetwork = "ramjettest"

func init() { caddy.RegisterNetwork(testNetwork, handedOver) }

// handover maps "127.0.0.1:PORT" to its *sharedTestListener.
var handover sync.Map

// handedOver is the caddy.ListenerFunc of testNetwork: a fresh view of the
// listener bound at host:port. A config reload takes a second view before
// the old config closes its own, as Caddy's listener pool does.
func handedOver(_ context.Context, _, host, port string, portOffset uint, _ net.ListenConfig) (any, error) {
	if portOffset != 0 {
		return nil, fmt.Errorf("%s: port ranges are not supported", testNetwork)
	}
	v, ok := handover.Load(net.JoinHostPort(host, port))
	if !ok {
		return nil, fmt.Errorf("%s: no listener handed over on %s", testNetwork, net.JoinHostPort(host, port))
	}
	return v.(*sharedTestListener).view(), nil
}

// listenLocal binds 127.0.0.1:0 for Caddy and returns the address; the
// listener closes when the test ends (after Caddy stopped: cleanups run
// last-in first-out).
func listenLocal(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedTestListener{ln: ln.(*net.TCPListener)}
	addr := ln.Addr().String()
	handover.Store(addr, s)
	t.Cleanup(func() {
		handover.Delete(addr)
		ln.Close()
	})
	return addr
}

// caddyAddr is the Caddy listen address of a handed-over listener.
func caddyAddr(addr string) string { return testNetwork + "/" + addr }

// sharedTestListener is one bound socket that several Caddy servers (the
// old and the new config during a reload) accept on. One goroutine
// accepts on the socket and queues each connection; the open views take
// them from the queue. A connection a view takes after it was closed goes
// back to the queue for the next server, so that no connection is handed
// to a server that is shutting down (as ramjet_handover does in
// production; a plain shared Accept loses such a connection when the old
// server's Shutdown has already found it idle-free).
type sharedTestListener struct {
	ln    *net.TCPListener
	start sync.Once
	conns chan net.Conn // accepted, not yet taken by a view
	done  chan struct{} // closed when the socket's Accept failed for good
	err   error         // that failure, read after done
}

func (s *sharedTestListener) view() net.Listener {
	s.start.Do(func() {
		s.conns, s.done = make(chan net.Conn, 64), make(chan struct{})
		go s.acceptLoop()
	})
	return &testListenerView{s: s, closing: make(chan struct{})}
}

func (s *sharedTestListener) acceptLoop() {
	defer close(s.done)
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.err = err
			return
		}
		s.conns <- c
	}
}

// testListenerView is one server's handle: Close stops its Accept without
// closing the socket (like Caddy's fakeCloseListener).
type testListenerView struct {
	s       *sharedTestListener
	once    sync.Once
	closing chan struct{}
}

func (v *testListenerView) Accept() (net.Conn, error) {
	select {
	case <-v.closing:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-v.s.conns:
		select {
		case <-v.closing:
			// Closed while the connection was on its way: the next
			// server takes it.
			v.s.conns <- c
			return nil, net.ErrClosed
		default:
			return c, nil
		}
	case <-v.closing:
		return nil, net.ErrClosed
	case <-v.s.done:
		return nil, v.s.err
	}
}

func (v *testListenerView) Close() error {
	v.once.Do(func() { close(v.closing) })
	return nil
}

func (v *testListenerView) Addr() net.Addr { return v.s.ln.Addr() }

// proxyOpts shapes the Caddy config of an end-to-end test (startCaddy,
// startObsCaddy).
type proxyOpts struct {
	// Policy is the lb_policy JSON object (without "policy"); nil means {}.
	Policy map[string]any
	// Health enables active health checks on /health (see healthChecks).
	Health bool
	// Retries sets load_balancing.retries.
	Retries int
	// NoHandler leaves out the ramjet handler (policy only).
	NoHandler bool
	// Matcher adds a ramjet_body matcher with these model globs on the
	// proxy route; requests that do not match get a 404.
	Matcher []string
	// Tag is a response header value (X-Test-Config) the route sets, to
	// make two configs differ.
	Tag string
	// HeaderUp adds a header_up operation (X-Test-Up: 1) to the proxy, so
	// that Caddy rebuilds request headers on every attempt.
	HeaderUp bool
	// NoKeepAlive makes the proxy dial every request anew, so that an
	// engine refusing connections fails at dial time (never on a pooled
	// connection it just closed, which Caddy does not retry for a POST).
	NoKeepAlive bool
	// SampleInterval of the dashboard on the ops server; "" leaves the
	// default.
	SampleInterval string
}

// obsOpts is the observability tests' name for proxyOpts.
type obsOpts = proxyOpts

// healthChecks are the active health checks of the test configs: fast
// enough that a test sees an engine go down within a few hundred
// milliseconds, tolerant enough that a loaded machine (load average 20 on
// 2 cores) does not mark a healthy engine down: a check may take 5s, and
// it takes two failures in a row.
func healthChecks() map[string]any {
	return map[string]any{"active": map[string]any{
		"uri": "/health", "interval": "100ms", "timeout": "5s", "fails": 2, "passes": 1,
	}}
}

// testCaddy is a Caddy instance run in-process on 127.0.0.1.
type testCaddy struct {
	t      testing.TB
	client string // client server address, 127.0.0.1:port
	ops    string // ops server (metrics, dashboard), "" without one
	admin  string // admin endpoint, "" when disabled
	ups    []string
}

// obsCaddy is the observability tests' name for testCaddy.
type obsCaddy = testCaddy

// startCaddy loads a config proxying to ups (dial addresses) and stops
// Caddy when the test ends.
func startCaddy(t testing.TB, ups []string, o proxyOpts) *testCaddy {
	t.Helper()
	c := &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t), ups: ups}
	c.load(c.config(o))
	return c
}

// startObsCaddy is startCaddy with an ops server: Caddy's metrics handler
// on /metrics and the ramjet dashboard on every other path.
func startObsCaddy(t testing.TB, ups []string, o obsOpts) *obsCaddy {
	t.Helper()
	c := &testCaddy{t: t, client: listenLocal(t), ops: listenLocal(t), admin: listenLocal(t), ups: ups}
	c.load(c.config(o))
	return c
}

// load loads cfg and registers the stop.
func (c *testCaddy) load(cfg []byte) {
	c.t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		c.t.Fatalf("loading caddy config: %v", err)
	}
	c.t.Cleanup(func() { stopCaddy(c.t) })
}

// stopCaddy stops the in-process Caddy and waits until nothing of it is
// left: no idle client connection (they would keep server connections
// open), no server or admin endpoint, no background shutdown. caddy.Stop
// alone returns while the old servers still drain in the background (it
// waits only when the process exits), which left goroutines of
// caddyhttp.(*App).stop and net/http.(*Server).Shutdown behind the last
// test for goleak to find.
func stopCaddy(t testing.TB) {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	// An empty config with the admin endpoint disabled stops the servers
	// and the admin endpoint; Stop alone keeps the latter.
	if err := caddy.Load(stopConfig, true); err != nil {
		t.Errorf("unloading caddy: %v", err)
	}
	if err := caddy.Stop(); err != nil {
		t.Errorf("stopping caddy: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
	if !poll(30*time.Second, func() bool { return shutdownStacks() == "" }) {
		t.Errorf("caddy servers still shutting down 30s after stop (a request of the test still open?):\n%s", shutdownStacks())
	}
}

// shutdownStacks returns the stacks of goroutines still running a Caddy
// server shutdown, "" when there are none.
func shutdownStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "caddyhttp.(*App).stop") || strings.Contains(g, "net/http.(*Server).Shutdown") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

func (c *testCaddy) config(o proxyOpts) []byte {
	pol := map[string]any{"policy": "ramjet"}
	for k, v := range o.Policy {
		pol[k] = v
	}
	var upstreams []map[string]any
	for _, u := range c.ups {
		upstreams = append(upstreams, map[string]any{"dial": u})
	}
	lb := map[string]any{"selection_policy": pol}
	if o.Retries > 0 {
		lb["retries"] = o.Retries
	}
	proxy := map[string]any{
		"handler":        "reverse_proxy",
		"upstreams":      upstreams,
		"load_balancing": lb,
		"flush_interval": -1,
	}
	if o.NoKeepAlive {
		proxy["transport"] = map[string]any{"protocol": "http", "keep_alive": map[string]any{"enabled": false}}
	}
	if o.HeaderUp {
		proxy["headers"] = map[string]any{"request": map[string]any{"set": map[string]any{"X-Test-Up": []string{"1"}}}}
	}
	if o.Health {
		proxy["health_checks"] = healthChecks()
	}
	var handlers []any
	if o.Tag != "" {
		handlers = append(handlers, map[string]any{"handler": "headers",
			"response": map[string]any{"set": map[string]any{"X-Test-Config": []string{o.Tag}}}})
	}
	if !o.NoHandler {
		handlers = append(handlers, map[string]any{"handler": "ramjet_observe"})
	}
	handlers = append(handlers, proxy)
	route := map[string]any{"handle": handlers}
	routes := []any{route}
	if o.Matcher != nil {
		route["match"] = []any{map[string]any{"ramjet_body": map[string]any{"models": o.Matcher}}}
		routes = append(routes, map[string]any{"handle": []any{map[string]any{
			"handler": "static_response", "status_code": 404, "body": "no match"}}})
	}
	server := func(addr string, routes []any) map[string]any {
		return map[string]any{
			"listen":              []string{caddyAddr(addr)},
			"routes":              routes,
			"automatic_https":     map[string]any{"disable": true},
			"protocols":           []string{"h1", "h2c"},
			"idle_timeout":        "30s",
			"max_header_bytes":    1 << 20,
			"read_header_timeout": "10s",
		}
	}
	servers := map[string]any{"ramjet": server(c.client, routes)}
	if c.ops != "" {
		dash := map[string]any{"handler": "ramjet_dashboard"}
		if o.SampleInterval != "" {
			dash["sample_interval"] = o.SampleInterval
		}
		servers["ops"] = server(c.ops, []any{
			map[string]any{"match": []any{map[string]any{"path": []string{"/metrics"}}},
				"handle": []any{map[string]any{"handler": "metrics"}}},
			map[string]any{"handle": []any{dash}},
		})
	}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": caddyAddr(c.admin), "config": map[string]any{"persist": false}},
		"logging": quietLogs(),
		"apps": map[string]any{"http": map[string]any{
			// Bounds a stop or a reload; nothing in the tests streams
			// across one.
			"grace_period": "5s",
			"servers":      servers,
		}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// stopConfig is the empty config a stop loads: no app, no admin endpoint.
var stopConfig = []byte(`{"admin":{"disabled":true,"config":{"persist":false}},` +
	`"logging":{"logs":{"default":{"level":"ERROR"}}}}`)

func quietLogs() map[string]any {
	return map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}}
}

// reload posts a new config to the admin API (POST /load). No wait for
// readiness is needed, here or after a start: Caddy serves on listeners
// bound before it loaded the config.
func (c *testCaddy) reload(o proxyOpts) {
	c.t.Helper()
	postLoad(c.t, c.admin, c.config(o))
	// The old config's servers share the handed-over sockets with the new
	// ones and keep accepting until their shutdown closes them; they close
	// their connections as they go. A client reusing one (or a connection
	// the old server accepted meanwhile) would fail a POST, which Go's
	// transport does not retry. Wait until the old servers are gone, then
	// start afresh. (Clients of a real reload see the same resets: issue
	// 15's reload item.)
	if !poll(30*time.Second, func() bool { return shutdownStacks() == "" }) {
		c.t.Fatalf("the old config's servers still shutting down 30s after a reload:\n%s", shutdownStacks())
	}
	http.DefaultClient.CloseIdleConnections()
}

// postLoad posts cfg to the Caddy admin API at admin (POST /load).
func postLoad(t testing.TB, admin string, cfg []byte) {
	t.Helper()
	resp, err := http.Post("http://"+admin+"/load", "application/json", bytes.NewReader(cfg))
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /load: %s: %s", resp.Status, b)
	}
}

func (c *testCaddy) url(path string) string { return "http://" + c.client + path }

// post sends body to path on the client server and returns the response
// with its body read.
func (c *testCaddy) post(path, body string) (*http.Response, []byte) {
	c.t.Helper()
	return c.do(http.MethodPost, c.url(path), body)
}

// do sends a request and returns the response with its body read.
func (c *testCaddy) do(method, url, body string) (*http.Response, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading %s: %v", url, err)
	}
	return resp, b
}

// chat posts a chat completion to the client server.
func (c *testCaddy) chat(body string) (*http.Response, []byte) {
	c.t.Helper()
	return c.do(http.MethodPost, c.url("/v1/chat/completions"), body)
}

// chatBody renders a chat request body.
func chatBody(model string, stream bool, msgs ...[2]string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	m := make([]msg, len(msgs))
	for i, x := range msgs {
		m[i] = msg{x[0], x[1]}
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": m, "stream": stream, "max_tokens": 16})
	return string(b)
}

// longText is deterministic filler of about n bytes.
func longText(seed string, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "%s sentence %d of the shared context. ", seed, i)
	}
	return sb.String()
}

// startCaddyfile adapts a Caddyfile (with {ADDR} and {ADMIN} standing for
// the client and admin addresses) and loads it.
func startCaddyfile(t testing.TB, src string) *testCaddy {
	t.Helper()
	c := &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t)}
	src = strings.NewReplacer("{ADDR}", c.client, "{ADMIN}", c.admin).Replace(src)
	cfg, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v", err)
	}
	for _, w := range warns {
		t.Logf("Caddyfile warning: %s", w.String())
	}
	cfg, err = handOver(cfg, c.client, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	c.load(cfg)
	return c
}

// handOver rewrites an adapted config to serve on the handed-over
// listeners at addrs: every server listen address and the admin address
// whose port is one of theirs becomes that listener (the Caddyfile adapter
// turns a site "http://127.0.0.1:PORT" into a listener on ":PORT"); it
// also turns off config persistence and quiets the logs.
func handOver(cfg []byte, addrs ...string) ([]byte, error) {
	byPort := map[string]string{}
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, err
		}
		byPort[port] = a
	}
	swap := func(s string) string {
		na, err := caddy.ParseNetworkAddress(s)
		if err != nil || na.IsUnixNetwork() || na.StartPort != na.EndPort {
			return s
		}
		if a, ok := byPort[fmt.Sprint(na.StartPort)]; ok {
			return caddyAddr(a)
		}
		return s
	}
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		return nil, fmt.Errorf("decoding the adapted config: %w", err)
	}
	admin, _ := m["admin"].(map[string]any)
	if admin == nil {
		admin = map[string]any{}
	}
	if l, ok := admin["listen"].(string); ok {
		admin["listen"] = swap(l)
	}
	admin["config"] = map[string]any{"persist": false} // no autosave.json from tests
	m["admin"] = admin
	m["logging"] = quietLogs()
	apps, _ := m["apps"].(map[string]any)
	httpApp, _ := apps["http"].(map[string]any)
	servers, _ := httpApp["servers"].(map[string]any)
	for _, s := range servers {
		srv, _ := s.(map[string]any)
		ls, _ := srv["listen"].([]any)
		for i, l := range ls {
			if s, ok := l.(string); ok {
				ls[i] = swap(s)
			}
		}
	}
	return json.Marshal(m)
}

// proxy is an in-process Caddy started from a Caddyfile with RJ_* settings
// (loadCaddyfile).
type proxy struct {
	base    string   // http://127.0.0.1:port, the client server
	metrics string   // http://127.0.0.1:port, the ops server
	addrs   []string // the handed-over listeners, for handOver on a reload
}

// loadCaddyfile adapts src under env (RJ_LISTEN and RJ_METRICS_LISTEN on
// handed-over listeners, no admin endpoint unless env sets one, and the
// grace period of a stop bounded to 5s unless env sets one) and loads it.
// It returns the load error instead of failing, for the tests that expect
// one.
func loadCaddyfile(t *testing.T, src string, env map[string]string) (*proxy, error) {
	t.Helper()
	listen, mlisten := listenLocal(t), listenLocal(t)
	all := map[string]string{
		"RJ_LISTEN":         listen,
		"RJ_METRICS_LISTEN": mlisten,
		"RJ_ADMIN_LISTEN":   "off",
		"RJ_GRACE_PERIOD":   "5s",
	}
	for k, v := range env {
		all[k] = v
	}
	for k, v := range all {
		t.Setenv(k, v)
	}
	setListenPorts(t)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		return nil, fmt.Errorf("adapting: %w", err)
	}
	if cfg, err = handOver(cfg, listen, mlisten); err != nil {
		return nil, err
	}
	if err := caddy.Load(cfg, true); err != nil {
		// A failed load may have started and stopped servers.
		stopCaddy(t)
		return nil, err
	}
	t.Cleanup(func() { stopCaddy(t) })
	return &proxy{base: "http://" + listen, metrics: "http://" + mlisten, addrs: []string{listen, mlisten}}, nil
}

func mustLoad(t *testing.T, src string, env map[string]string) *proxy {
	t.Helper()
	p, err := loadCaddyfile(t, src, env)
	if err != nil {
		t.Fatalf("loading config: %v", err)
	}
	return p
}

// deployCaddyfile is the production configuration, deploy/Caddyfile.
func deployCaddyfile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../deploy/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
