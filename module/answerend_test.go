package module

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

func init() {
	caddy.RegisterModule(endStall{})
	httpcaddyfile.RegisterHandlerDirective("ramjet_test_end_stall", func(httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return endStall{}, nil
	})
}

// endStalls is what endStall waits for: the test client's word that it has
// read the whole answer.
var endStalls = make(chan struct{}, 1)

// endStall is a handler (tests only) that, once the chain behind it
// returned, waits until the client has read the whole answer: an end of
// the request that the client's answer must not wait for. It fails the
// wait after 20 s (the client never got the answer before the chain's
// end).
type endStall struct{}

func (endStall) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.ramjet_test_end_stall", New: func() caddy.Module { return new(endStall) }}
}

func (endStall) UnmarshalCaddyfile(*caddyfile.Dispenser) error { return nil }

var endStallTimeouts = make(chan struct{}, 16)

func (endStall) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	err := next.ServeHTTP(w, r)
	select {
	case <-endStalls:
	case <-time.After(20 * time.Second):
		endStallTimeouts <- struct{}{}
	}
	return err
}

// TestAnswerBeforeChainEnd: through a real Caddy, a small non-streamed
// answer (the engine declares its length) reaches an HTTP/1.1 client before
// the handler chain returns, with reverse_proxy's default flush_interval
// (observe.Writer.complete) as with deploy's flush_interval -1
// (reverse_proxy flushes every write itself), and the bytes the client
// receives are those of an answer sent at the chain's end: the engine's
// Content-Length, not chunked, the same body, the connection kept for the
// next request. Behind a handler that declares no length (respond) the
// answer is not flushed early: net/http adds the length at the end.
func TestAnswerBeforeChainEnd(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{Instant: true})
	tests := []struct {
		name  string
		proxy string
		early bool
	}{
		{"flush_interval default", "reverse_proxy " + ss[0].Addr() + " {\n\t\t\tlb_policy ramjet\n\t\t}", true},
		{"flush_interval -1", "reverse_proxy " + ss[0].Addr() + " {\n\t\t\tlb_policy ramjet\n\t\t\tflush_interval -1\n\t\t}", true},
		{"respond", `respond "{\"ok\":true}" 200`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stall := "ramjet_test_end_stall"
			if !tt.early {
				stall = ""
			}
			c := startCaddyfile(t, `{
	admin {ADMIN}
	auto_https off
	log {
		level ERROR
	}
}

http://{ADDR} {
	route {
		`+stall+`
		ramjet_guard `+ss[0].Addr()+` {
			model_check off
		}
		ramjet_observe
		`+tt.proxy+`
	}
}
`)
			conn, err := net.Dial("tcp", c.client)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
			br := bufio.NewReader(conn)
			body := chatBody("qwen3-8b", false, [2]string{"user", "hello"})
			for i := range 2 { // the second request on the same connection
				fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", c.client, len(body), body)
				resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				got, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatalf("request %d: reading the answer: %v", i, err)
				}
				if tt.early {
					endStalls <- struct{}{}
				}
				if resp.StatusCode != 200 || resp.ContentLength != int64(len(got)) || len(resp.TransferEncoding) != 0 || resp.Close ||
					!strings.HasPrefix(string(got), "{") {
					t.Errorf("request %d: status %d, length %d for %d bytes, transfer encoding %v, close %v, body %.40q",
						i, resp.StatusCode, resp.ContentLength, len(got), resp.TransferEncoding, resp.Close, got)
				}
			}
			select {
			case <-endStallTimeouts:
				t.Error("the client received the answer only after the handler chain returned")
			default:
			}
		})
	}
}
