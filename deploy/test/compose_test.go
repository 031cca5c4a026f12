// Package test holds the Docker tests of the deployment surface: the images
// built by deploy/docker/build.sh, the Compose stacks under deploy/compose
// brought up on the real Docker engine, and `docker-compose config` of every
// Compose file. They need a Docker engine, so they run only with
// RAMJET_TEST_COMPOSE=1:
//
//	deploy/test/compose-e2e.sh
//
// (which checks for Docker and sets it). Published ports bind 127.0.0.1
// only, on ports Docker picks, so the tests run beside anything else.
package test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"go.yaml.in/yaml/v3"
)

const model = "qwen3-32b"

// requireCompose skips unless RAMJET_TEST_COMPOSE=1 and fails when it is
// set but Docker is missing (the test was asked for by hand).
func requireCompose(t *testing.T) {
	t.Helper()
	if os.Getenv("RAMJET_TEST_COMPOSE") != "1" {
		t.Skip("Docker test: run deploy/test/compose-e2e.sh (or set RAMJET_TEST_COMPOSE=1 with a Docker engine running)")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Fatalf("RAMJET_TEST_COMPOSE=1 but no Docker engine answers: %v\n%s", err, out)
	}
}

// composeCommand is docker-compose (v1, what Debian ships) or the
// `docker compose` plugin.
func composeCommand(t *testing.T) []string {
	t.Helper()
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	if err := exec.Command("docker", "compose", "version").Run(); err == nil {
		return []string{"docker", "compose"}
	}
	return nil
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

var (
	buildOnce sync.Once
	buildErr  error
)

// buildImages runs deploy/docker/build.sh once per test binary, unless
// RAMJET_SKIP_IMAGE_BUILD=1 (images built already).
func buildImages(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		if os.Getenv("RAMJET_SKIP_IMAGE_BUILD") == "1" {
			return
		}
		start := time.Now()
		cmd := exec.Command(filepath.Join(repoRoot(t), "deploy/docker/build.sh"))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		buildErr = cmd.Run()
		t.Logf("images built in %v", time.Since(start).Round(time.Second))
	})
	if buildErr != nil {
		t.Fatalf("deploy/docker/build.sh: %v", buildErr)
	}
}

// stack is one Compose project brought up for a test.
type stack struct {
	t       *testing.T
	compose []string
	dir     string
	project string
}

// up starts the stack in deploy/compose/<name> under a project name unique
// to this run and tears it down (volumes included) when the test ends.
func up(t *testing.T, name string) *stack {
	t.Helper()
	compose := composeCommand(t)
	if compose == nil {
		t.Fatal("neither docker-compose nor the docker compose plugin is installed")
	}
	s := &stack{t: t, compose: compose, dir: filepath.Join(repoRoot(t), "deploy/compose", name),
		project: fmt.Sprintf("rjtest-%s-%d", strings.ReplaceAll(name, "-", ""), os.Getpid())}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := s.run("logs", "--no-color", "--tail", "60")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := s.run("down", "-v", "--remove-orphans", "-t", "10"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	if out, err := s.run("up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	return s
}

func (s *stack) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	full := append(append(append([]string(nil), s.compose[1:]...), "-p", s.project), args...)
	cmd := exec.CommandContext(ctx, s.compose[0], full...)
	cmd.Dir = s.dir
	// Empty host ports: Docker picks free ones on 127.0.0.1.
	cmd.Env = append(os.Environ(), "RAMJET_HTTP_PORT=", "RAMJET_METRICS_PORT=", "RAMJET_HTTPS_PORT=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// port returns the 127.0.0.1 address Docker published for the service's
// container port.
func (s *stack) port(service string, port int, proto string) string {
	s.t.Helper()
	out, err := s.run("port", "--protocol", proto, service, fmt.Sprint(port))
	if err != nil {
		s.t.Fatalf("compose port %s %d/%s: %v\n%s", service, port, proto, err, out)
	}
	addr := strings.TrimSpace(out)
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" {
		s.t.Fatalf("%s %d/%s published on %q, want 127.0.0.1 only", service, port, proto, addr)
	}
	return addr
}

func (s *stack) container(service string) string {
	s.t.Helper()
	out, err := s.run("ps", "-q", service)
	if err != nil || strings.TrimSpace(out) == "" {
		s.t.Fatalf("compose ps -q %s: %v\n%s", service, err, out)
	}
	return strings.TrimSpace(out)
}

func (s *stack) must(args ...string) {
	s.t.Helper()
	if out, err := s.run(args...); err != nil {
		s.t.Fatalf("compose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// eventually polls cond every 200ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v (last: %s)", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type healthAnswer struct {
	Status  string `json:"status"`
	Healthy int    `json:"healthy"`
	Total   int    `json:"total"`
}

func getHealth(hc *http.Client, base string) (healthAnswer, *http.Response, error) {
	var h healthAnswer
	resp, err := hc.Get(base + "/health")
	if err != nil {
		return h, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return h, resp, err
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, resp, fmt.Errorf("health %q: %w", b, err)
	}
	return h, resp, nil
}

func waitHealth(t *testing.T, hc *http.Client, base, want string, healthy int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "/health "+want, func() (bool, string) {
		h, _, err := getHealth(hc, base)
		if err != nil {
			return false, err.Error()
		}
		return h.Status == want && (healthy < 0 || h.Healthy == healthy), fmt.Sprintf("%+v", h)
	})
}

func synthetic(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s paragraph %d: the operator keeps the fleet warm and the prefixes routed. ", seed, i)
	}
	return b.String()
}

var weatherTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name:        "get_weather",
	Description: openai.String("Current weather of a city"),
	Parameters: shared.FunctionParameters{
		"type":       "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}},
		"required":   []string{"city"},
	},
})

// exercise runs the acceptance scenario against a stack whose client base
// URL is base (through hc) and whose ops port is metricsBase.
func exercise(t *testing.T, s *stack, hc *http.Client, base, metricsBase string, engines int) {
	waitHealth(t, hc, base, "ok", engines, 90*time.Second)

	cl := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(hc), option.WithMaxRetries(0), option.WithRequestTimeout(60*time.Second))
	ctx := context.Background()

	t.Run("chat and cached second turn", func(t *testing.T) {
		msgs := []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(synthetic("compose e2e system "+s.project, 6000)),
			openai.UserMessage("First question: what is routed where?"),
		}
		first, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(16)})
		if err != nil {
			t.Fatalf("first turn: %v", err)
		}
		if len(first.Choices) != 1 || first.Choices[0].Message.Content == "" {
			t.Fatalf("first turn answered %+v", first.Choices)
		}
		msgs = append(msgs, openai.AssistantMessage(first.Choices[0].Message.Content),
			openai.UserMessage("Second question: and the next turn?"))
		second, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(16)})
		if err != nil {
			t.Fatalf("second turn: %v", err)
		}
		c1, c2 := first.Usage.PromptTokensDetails.CachedTokens, second.Usage.PromptTokensDetails.CachedTokens
		t.Logf("cached_tokens: first turn %d of %d, second turn %d of %d", c1, first.Usage.PromptTokens, c2, second.Usage.PromptTokens)
		if c2 <= c1 || c2 < first.Usage.PromptTokens/2 {
			t.Errorf("cached_tokens did not rise on the second turn: %d then %d (prompt %d)", c1, c2, first.Usage.PromptTokens)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		stream := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream a short answer.")},
			MaxTokens: openai.Int(24), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if chunks < 3 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens != 24 {
			t.Errorf("stream: %d chunks, content %q, usage %+v", chunks, acc.Choices[0].Message.Content, acc.Usage)
		}
	})

	t.Run("tool call", func(t *testing.T) {
		res, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")},
			MaxTokens: openai.Int(40), Tools: []openai.ChatCompletionToolUnionParam{weatherTool},
			ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
		})
		if err != nil {
			t.Fatalf("tool call: %v", err)
		}
		calls := res.Choices[0].Message.ToolCalls
		if len(calls) != 1 || calls[0].Function.Name != "get_weather" || !json.Valid([]byte(calls[0].Function.Arguments)) {
			t.Fatalf("tool calls %+v, finish %q", calls, res.Choices[0].FinishReason)
		}
		if res.Choices[0].FinishReason != "tool_calls" {
			t.Errorf("finish_reason %q, want tool_calls", res.Choices[0].FinishReason)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		resp, err := http.Get(metricsBase + "/metrics")
		if err != nil {
			t.Fatalf("GET /metrics: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{"ramjet_requests_total{", `outcome="ok"`, "ramjet_cached_prompt_tokens_total{",
			"ramjet_upstream_healthy{", "ramjet_routing_decisions_total{"} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("engine stopped and started, no request fails", func(t *testing.T) {
		var sent, failed atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < 5000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					_, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model,
						Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(synthetic(fmt.Sprintf("load %d %d", w, i%7), 400))},
						MaxTokens: openai.Int(4)})
					sent.Add(1)
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
				}
			}(w)
		}
		defer func() { close(stop); wg.Wait() }()
		eventually(t, 30*time.Second, "traffic flowing", func() (bool, string) { return sent.Load() >= 10, fmt.Sprint(sent.Load()) })

		// The engine dies (SIGKILL, as in a crash or an OOM kill): requests
		// it had not answered are retried on another engine. A graceful
		// `stop` (SIGTERM) makes the simulator answer its in-flight requests
		// with 503 (bench/enginesim), which the proxy must pass on.
		s.must("kill", "-s", "SIGKILL", "engine-2")
		s.must("stop", "-t", "1", "engine-2") // marks it stopped: no restart by the policy
		waitHealth(t, hc, base, "degraded", engines-1, 60*time.Second)
		mark := sent.Load()
		eventually(t, 60*time.Second, "traffic while degraded", func() (bool, string) { return sent.Load() >= mark+20, fmt.Sprint(sent.Load() - mark) })
		s.must("start", "engine-2")
		waitHealth(t, hc, base, "ok", engines, 60*time.Second)
		mark = sent.Load()
		eventually(t, 60*time.Second, "traffic after recovery", func() (bool, string) { return sent.Load() >= mark+10, fmt.Sprint(sent.Load() - mark) })

		close(stop)
		wg.Wait()
		stop = make(chan struct{})
		t.Logf("%d requests across stop/start, %d failed", sent.Load(), failed.Load())
		if n := failed.Load(); n != 0 {
			t.Errorf("%d of %d requests failed; first: %v", n, sent.Load(), firstErr.Load())
		}
	})
}

// TestComposeSimulated brings up deploy/compose/simulated (ramjet and 8
// simulated engines) and runs the acceptance scenario over plain HTTP.
func TestComposeSimulated(t *testing.T) {
	requireCompose(t)
	buildImages(t)
	s := up(t, "simulated")
	base := "http://" + s.port("ramjet", 8000, "tcp")
	metrics := "http://" + s.port("ramjet", 9090, "tcp")
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer hc.CloseIdleConnections()
	exercise(t, s, hc, base, metrics, 8)

	t.Run("container health and image", func(t *testing.T) {
		id := s.container("ramjet")
		eventually(t, 60*time.Second, "docker HEALTHCHECK healthy", func() (bool, string) {
			out, err := exec.Command("docker", "inspect", "--format", "{{.State.Health.Status}}", id).CombinedOutput()
			return err == nil && strings.TrimSpace(string(out)) == "healthy", strings.TrimSpace(string(out))
		})
		out, err := exec.Command("docker", "inspect", "--format", "{{.Config.User}} {{index .Config.Labels \"org.opencontainers.image.version\"}} {{index .Config.Labels \"io.ramjet.caddy.version\"}}", id).CombinedOutput()
		if err != nil {
			t.Fatalf("docker inspect: %v\n%s", err, out)
		}
		f := strings.Fields(string(out))
		if len(f) != 3 || f[0] != "10001:10001" || f[1] == "unknown" || !strings.HasPrefix(f[2], "v2.") {
			t.Errorf("image user/labels: %q", out)
		}
		ver, err := exec.Command("docker", "run", "--rm", "ramjet:latest", "version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(ver), "ramjet "+f[1]+" (commit ") || !strings.Contains(string(ver), "Caddy "+f[2]) {
			t.Errorf("ramjet version in the image: %v %q", err, ver)
		}
	})
}

// TestComposeHTTPS brings up deploy/compose/https (`tls internal` on
// 127.0.0.1) and runs the same scenario over HTTPS, trusting Caddy's local
// root taken from the container, with HTTP/2 negotiated.
func TestComposeHTTPS(t *testing.T) {
	requireCompose(t)
	buildImages(t)
	s := up(t, "https")
	addr := s.port("ramjet", 8443, "tcp")
	metrics := "http://" + s.port("ramjet", 9090, "tcp")
	id := s.container("ramjet")

	root := filepath.Join(t.TempDir(), "root.crt")
	eventually(t, 60*time.Second, "local CA root written", func() (bool, string) {
		out, err := exec.Command("docker", "cp", id+":/data/caddy/pki/authorities/local/root.crt", root).CombinedOutput()
		return err == nil, string(out)
	})
	pemBytes, err := os.ReadFile(root)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		t.Fatalf("root.crt is not PEM: %q", pemBytes)
	}
	// The site is https://localhost:8443 in the container; dial the
	// published 127.0.0.1 port whatever the URL says.
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, addr)
		},
	}
	hc := &http.Client{Transport: tr}
	defer hc.CloseIdleConnections()
	_, port, _ := net.SplitHostPort(addr)
	base := "https://localhost:" + port

	// Not trusted without the local root.
	plain := &http.Client{Transport: &http.Transport{DialContext: tr.DialContext}, Timeout: 10 * time.Second}
	if _, err := plain.Get(base + "/health"); err == nil || !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Errorf("without the local root: %v, want a certificate verification error", err)
	}

	eventually(t, 60*time.Second, "HTTPS /health answers", func() (bool, string) {
		_, resp, err := getHealth(hc, base)
		if err != nil {
			return false, err.Error()
		}
		return resp.Proto == "HTTP/2.0", resp.Proto
	})
	_, resp, err := getHealth(hc, base)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Proto != "HTTP/2.0" || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
		t.Errorf("protocol %s, ALPN %v: want HTTP/2", resp.Proto, resp.TLS)
	}
	if alt := resp.Header.Get("Alt-Svc"); !strings.Contains(alt, `h3=":8443"`) {
		t.Errorf("Alt-Svc %q does not advertise HTTP/3 on 8443", alt)
	}
	exercise(t, s, hc, base, metrics, 3)

	// HTTP/3 over the published UDP port, same root.
	udp := s.port("ramjet", 8443, "udp")
	h3 := &http3.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS13},
		Dial: func(ctx context.Context, _ string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			return quic.DialAddrEarly(ctx, udp, tlsCfg, cfg)
		},
	}
	defer h3.Close()
	h3c := &http.Client{Transport: h3, Timeout: 20 * time.Second}
	eventually(t, 30*time.Second, "HTTP/3 /health", func() (bool, string) {
		h, resp, err := getHealth(h3c, base)
		if err != nil {
			return false, err.Error()
		}
		return resp.ProtoMajor == 3 && h.Status == "ok", fmt.Sprintf("%s %+v", resp.Proto, h)
	})

	// The container's probe asks https://localhost:8443/health, trusting
	// the local root under /data.
	eventually(t, 60*time.Second, "docker HEALTHCHECK healthy over HTTPS", func() (bool, string) {
		out, err := exec.Command("docker", "inspect", "--format", "{{.State.Health.Status}}", id).CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == "healthy", strings.TrimSpace(string(out))
	})
}

// TestComposeConfig runs `docker-compose config` on every Compose file
// (a copy of its directory, with the *.env.example files as the env
// files), and checks that every published port binds 127.0.0.1 except the
// public HTTPS front's 80 and 443. It needs only docker-compose, no engine.
func TestComposeConfig(t *testing.T) {
	compose := composeCommand(t)
	if compose == nil {
		t.Skip("docker-compose (or the docker compose plugin) is not installed: apt-get install docker-compose")
	}
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy/compose/*/docker-compose.yml"))
	if err != nil || len(files) < 6 {
		t.Fatalf("compose files %v: %v", files, err)
	}
	for _, f := range files {
		name := filepath.Base(filepath.Dir(f))
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			entries, err := os.ReadDir(filepath.Dir(f))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(filepath.Dir(f), e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				dst := strings.TrimSuffix(e.Name(), ".example")
				if err := os.WriteFile(filepath.Join(dir, dst), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(compose[0], append(compose[1:], "config")...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "RAMJET_HTTP_PORT=8000", "RAMJET_METRICS_PORT=9090", "RAMJET_HTTPS_PORT=8443")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("compose config: %v\n%s", err, stderr.String())
			}
			var cfg struct {
				Services map[string]struct {
					Ports   []any              `yaml:"ports"`
					Restart string             `yaml:"restart"`
					Env     map[string]*string `yaml:"environment"`
				} `yaml:"services"`
			}
			if err := yaml.Unmarshal(out, &cfg); err != nil {
				t.Fatalf("compose config output: %v\n%s", err, out)
			}
			rj, ok := cfg.Services["ramjet"]
			if !ok {
				t.Fatal("no ramjet service")
			}
			if rj.Env["RJ_UPSTREAM"] == nil || *rj.Env["RJ_UPSTREAM"] == "" {
				t.Error("ramjet has no RJ_UPSTREAM")
			}
			for svc, s := range cfg.Services {
				if s.Restart != "unless-stopped" {
					t.Errorf("%s: restart %q, want unless-stopped", svc, s.Restart)
				}
				for _, p := range s.Ports {
					spec := fmt.Sprint(p)
					if m, ok := p.(map[string]any); ok {
						spec = fmt.Sprintf("%v:%v:%v", m["host_ip"], m["published"], m["target"])
					}
					public := name == "https-acme" && (strings.Contains(spec, ":80:") || strings.Contains(spec, ":443:"))
					if !public && !strings.HasPrefix(spec, "127.0.0.1:") {
						t.Errorf("%s publishes %s beyond 127.0.0.1", svc, spec)
					}
				}
			}
			published := fmt.Sprint(rj.Ports)
			for _, want := range []string{"9090"} {
				if !strings.Contains(published, want) {
					t.Errorf("ramjet ports %s lack %s", published, want)
				}
			}
		})
	}
}
