package module

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// httpsDeploy is deploy/compose/https/Caddyfile (`tls internal`,
// ramjet_handover) in front of engine simulators, with its client port
// on a handed-over 127.0.0.1 listener (RJ_SITE_NAME 127.0.0.1: Caddy's
// internal CA issues a certificate for that address only) and its
// certificates in a temporary storage.
type httpsDeploy struct {
	*deployWithAdmin
	base string         // https://127.0.0.1:port
	pool *x509.CertPool // trusts the internal CA's root
}

// loadHTTPSDeploy loads deploy/compose/https/Caddyfile in front of ups.
// HTTP/3 is left out (it needs a UDP socket, which the handed-over
// listeners are not); HTTP/1.1 and h2 are served as in the container.
func loadHTTPSDeploy(t *testing.T, ups []string) *httpsDeploy {
	t.Helper()
	src, err := os.ReadFile("../deploy/compose/https/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	storage := t.TempDir()
	d := loadAdmin(t, string(src), map[string]string{
		"RJ_UPSTREAM":   strings.Join(ups, ","),
		"RJ_SITE_NAME":  "127.0.0.1",
		"RJ_HTTPS_PORT": "{LISTEN_PORT}",
	}, func(cfg map[string]any) {
		cfg["storage"] = map[string]any{"module": "file_system", "root": storage}
		servers := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
		for _, s := range servers {
			srv := s.(map[string]any)
			if _, ok := srv["protocols"]; ok {
				srv["protocols"] = []string{"h1", "h2"}
			}
		}
	})
	h := &httpsDeploy{deployWithAdmin: d, base: "https://" + strings.TrimPrefix(d.base, "http://")}
	root := filepath.Join(storage, "pki", "authorities", "local", "root.crt")
	var pem []byte
	eventually(t, "the internal CA's root certificate", func() bool {
		pem, err = os.ReadFile(root)
		return err == nil
	})
	h.pool = x509.NewCertPool()
	if !h.pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", root)
	}
	// The site's certificate is issued in the background.
	tr := h.transport("http/1.1")
	defer tr.CloseIdleConnections()
	eventually(t, "the site's certificate", func() bool {
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(h.base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return h
}

// transport is a client transport trusting the internal CA that
// negotiates proto ("http/1.1" or "h2").
func (h *httpsDeploy) transport(proto string) *http.Transport {
	tr := &http.Transport{
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
		TLSClientConfig:     &tls.Config{RootCAs: h.pool, NextProtos: []string{proto}},
	}
	if proto == "h2" {
		tr.ForceAttemptHTTP2 = true
	}
	return tr
}

// sdkStreamer is client i streaming with the official OpenAI Go SDK over
// tr, without SDK retries: a stream counts as done when a chunk carried a
// finish_reason and the stream ended without an error.
func sdkStreamer(i int, tr *http.Transport, base, model string) streamClient {
	cl := openai.NewClient(
		option.WithBaseURL(base+"/v1/"),
		option.WithAPIKey("test"),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(60*time.Second),
		option.WithHTTPClient(&http.Client{Transport: tr}),
	)
	return streamClient{
		stream: func(ctx context.Context, k int) error {
			s := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model:     model,
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("sdk client %d request %d", i, k))},
				MaxTokens: openai.Int(8),
			})
			defer s.Close()
			chunks, finished := 0, false
			for s.Next() {
				chunks++
				for _, c := range s.Current().Choices {
					finished = finished || c.FinishReason != ""
				}
			}
			if err := s.Err(); err != nil {
				return fmt.Errorf("sdk stream after %d chunks: %w", chunks, err)
			}
			if !finished {
				return fmt.Errorf("sdk stream ended without a finish_reason after %d chunks", chunks)
			}
			return nil
		},
		close: tr.CloseIdleConnections,
	}
}

// TestReloadTLSUnderStreamingLoad: deploy/compose/https/Caddyfile (`tls
// internal`, ramjet_handover) under 16 streaming clients without retries
// (8 on net/http, 8 on the official OpenAI Go SDK with retries off), all
// negotiating http/1.1 (the wrapper hands their TLS keep-alive connections
// to the new config) or all h2 (the old server's GOAWAY; Go's transport
// moves the streams it did not send yet to a new connection), while the
// admin API reloads the config 6 times: no request fails. Issue 15, TLS.
func TestReloadTLSUnderStreamingLoad(t *testing.T) {
	for _, proto := range []string{"http/1.1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			ss := startSims(t, 4, enginesim.Options{})
			h := loadHTTPSDeploy(t, ss.dials())
			probe := h.transport(proto)
			resp, err := (&http.Client{Transport: probe}).Get(h.base + "/health")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			probe.CloseIdleConnections()
			if resp.TLS == nil || resp.TLS.NegotiatedProtocol != proto {
				t.Fatalf("the probe negotiated %+v, want %s", resp.TLS, proto)
			}
			const n = 16
			var st trafficStats
			counts, stop := runClients(t, n, &st, func(i int) streamClient {
				if i%2 == 0 {
					return httpStreamer(i, h.transport(proto), h.base, ss[0].Model())
				}
				return sdkStreamer(i, h.transport(proto), h.base, ss[0].Model())
			})
			defer stop()
			reloadsUnderLoad(t, h.deployWithAdmin, &st, n, counts, stop)
		})
	}
}
