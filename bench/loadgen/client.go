package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// DefaultUpstreamHeader is the response header ramjet sets to the opaque
// id of the replica that served a request.
const DefaultUpstreamHeader = "X-Ramjet-Upstream"

// ReceivedHeader is the engine simulator's response header with the wall
// time it read the request (enginesim.ReceivedHeader), for Result.Routed.
const ReceivedHeader = "X-Sim-Received"

// TokenizedHeader is the engine simulator's response header with when a
// /tokenize call for the request's messages was served
// (enginesim.TokenizedHeader), for Result.TokenizeStart and TokenizeEnd.
const TokenizedHeader = "X-Sim-Tokenized"

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ClientConfig configures a Client. Zero values take the defaults named on
// each field.
type ClientConfig struct {
	// BaseURL is the OpenAI API base, e.g. http://127.0.0.1:8000/v1.
	BaseURL string
	// APIKey is sent as a bearer token; default "loadgen".
	APIKey string
	// Model is the model name sent with every request; default "sim".
	Model string
	// Timeout bounds one request from send to the end of its stream;
	// default 5m.
	Timeout time.Duration
	// UpstreamHeader is the response header recorded as the upstream;
	// default X-Ramjet-Upstream.
	UpstreamHeader string
	// MaxConns bounds the connections per host; default 1024.
	MaxConns int
	// MaxResponseBytes bounds one response body; default 64 MiB.
	MaxResponseBytes int64
	// IgnoreEOS asks vLLM/SGLang-style engines to generate exactly
	// max_tokens tokens (the "ignore_eos" extension), so output lengths
	// follow the trace.
	IgnoreEOS bool
	// KeepReply keeps the streamed reply text (bounded by MaxReplyBytes)
	// so that the next turn of a session can carry it.
	MaxReplyBytes int
}

func (c *ClientConfig) setDefaults() {
	if c.APIKey == "" {
		c.APIKey = "loadgen"
	}
	if c.Model == "" {
		c.Model = "sim"
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Minute
	}
	if c.UpstreamHeader == "" {
		c.UpstreamHeader = DefaultUpstreamHeader
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = 64 << 20
	}
	if c.MaxReplyBytes <= 0 {
		c.MaxReplyBytes = 1 << 20
	}
}

// Client sends streaming chat completions through the official OpenAI Go
// SDK and measures them. It is safe for concurrent use.
type Client struct {
	cfg  ClientConfig
	sdk  openai.Client
	http *http.Client
}

// NewClient builds a Client with its own connection pool.
func NewClient(cfg ClientConfig) (*Client, error) {
	cfg.setDefaults()
	if cfg.BaseURL == "" {
		return nil, errors.New("client: base URL is empty")
	}
	tr := &http.Transport{
		Proxy:                 nil, // benchmarks talk to the endpoint given, never a proxy from the environment
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          cfg.MaxConns,
		MaxIdleConnsPerHost:   cfg.MaxConns,
		MaxConnsPerHost:       cfg.MaxConns,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: cfg.Timeout,
		DisableCompression:    true,
	}
	hc := &http.Client{Transport: tr}
	base := strings.TrimSuffix(cfg.BaseURL, "/") + "/"
	sdk := openai.NewClient(
		option.WithBaseURL(base),
		option.WithAPIKey(cfg.APIKey),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0), // every attempt is measured; a retry would hide an error
	)
	return &Client{cfg: cfg, sdk: sdk, http: hc}, nil
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Config returns the client's configuration with defaults filled.
func (c *Client) Config() ClientConfig { return c.cfg }

// Params builds the SDK request for msgs asking for maxTokens output
// tokens. It is deterministic: the same messages give the same JSON.
func (c *Client) Params(msgs []Message, maxTokens int) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    c.cfg.Model,
		Messages: make([]openai.ChatCompletionMessageParamUnion, 0, len(msgs)),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{
			IncludeUsage: openai.Bool(true),
		},
	}
	if maxTokens > 0 {
		p.MaxTokens = openai.Int(int64(maxTokens))
	}
	for _, m := range msgs {
		switch m.Role {
		case "system":
			p.Messages = append(p.Messages, openai.SystemMessage(m.Content))
		case "assistant":
			p.Messages = append(p.Messages, openai.AssistantMessage(m.Content))
		default:
			p.Messages = append(p.Messages, openai.UserMessage(m.Content))
		}
	}
	return p
}

// Do sends one streaming chat completion and measures it. keepReply keeps
// the reply text (bounded) in the result for a following turn. Do returns
// when the stream ends, fails, times out or ctx is done; it never blocks
// past the configured timeout.
func (c *Client) Do(ctx context.Context, msgs []Message, maxTokens int, keepReply bool) Result {
	var res Result
	parent := ctx
	ctx, cancel := context.WithTimeoutCause(ctx, c.cfg.Timeout, context.DeadlineExceeded)
	defer cancel()

	var status int
	var upstream, received, tokenized string
	limit := c.cfg.MaxResponseBytes
	capture := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		resp, err := next(req)
		if resp != nil {
			status = resp.StatusCode
			upstream = resp.Header.Get(c.cfg.UpstreamHeader)
			received = resp.Header.Get(ReceivedHeader)
			tokenized = resp.Header.Get(TokenizedHeader)
			if resp.Body != nil {
				resp.Body = &limitedBody{rc: resp.Body, left: limit}
			}
		}
		return resp, err
	}
	opts := []option.RequestOption{option.WithMiddleware(capture)}
	if c.cfg.IgnoreEOS && maxTokens > 0 {
		opts = append(opts, option.WithJSONSet("ignore_eos", true))
	}

	params := c.Params(msgs, maxTokens)
	start := time.Now()
	stream := c.sdk.Chat.Completions.NewStreaming(ctx, params, opts...)
	defer stream.Close()

	var reply strings.Builder
	last := start
	for stream.Next() {
		chunk := stream.Current()
		now := time.Now()
		if chunk.JSON.Usage.Valid() && chunk.Usage.JSON.PromptTokens.Valid() {
			res.UsageSeen = true
			res.PromptTokens = int(chunk.Usage.PromptTokens)
			res.OutputTokens = int(chunk.Usage.CompletionTokens)
			res.CachedTokens = int(chunk.Usage.PromptTokensDetails.CachedTokens)
		}
		if !hasOutput(&chunk) {
			continue
		}
		if res.Chunks == 0 {
			res.TTFT = now.Sub(start)
		} else if len(res.itl) < maxITLPerRequest {
			res.itl = append(res.itl, now.Sub(last))
		}
		last = now
		res.Chunks++
		if keepReply && reply.Len() < c.cfg.MaxReplyBytes {
			for _, ch := range chunk.Choices {
				reply.WriteString(ch.Delta.Content)
			}
		}
	}
	res.E2E = time.Since(start)
	res.Status = status
	res.Upstream = upstream
	if ns, err := strconv.ParseInt(received, 10, 64); err == nil && ns > 0 {
		res.Routed = time.Unix(0, ns).Sub(start)
	}
	if a, b, ok := strings.Cut(tokenized, ","); ok {
		t0, err0 := strconv.ParseInt(a, 10, 64)
		t1, err1 := strconv.ParseInt(b, 10, 64)
		if err0 == nil && err1 == nil {
			res.TokenizeStart, res.TokenizeEnd = time.Unix(0, t0).Sub(start), time.Unix(0, t1).Sub(start)
		}
	}
	if err := stream.Err(); err != nil {
		res.Err = classify(ctx, err)
		if parent.Err() != nil && (res.Err == ErrTimeout || res.Err == ErrCanceled || res.Err == ErrOther) {
			res.Err = ErrCanceled // the run stopped, not this request's timeout
		}
		var se *ssestream.StreamError
		if res.Err == ErrOther && errors.As(err, &se) {
			res.Err = ErrStream
		}
		res.ErrMsg = truncate(err.Error(), 300)
		return res
	}
	if ctx.Err() != nil { // the stream ended because the deadline or the run stopped
		res.Err = ErrTimeout
		if parent.Err() != nil {
			res.Err = ErrCanceled
		}
		res.ErrMsg = ctx.Err().Error()
		return res
	}
	switch {
	case res.Chunks == 0:
		res.Err = ErrNoTokens
		res.ErrMsg = fmt.Sprintf("stream ended without output (status %d)", status)
	case !res.UsageSeen:
		res.Err = ErrNoUsage
		res.ErrMsg = "stream ended without a usage chunk (stream_options.include_usage ignored?)"
	}
	if keepReply {
		res.reply = reply.String()
		if len(res.reply) > c.cfg.MaxReplyBytes {
			res.reply = res.reply[:c.cfg.MaxReplyBytes]
		}
	}
	return res
}

// maxITLPerRequest bounds the inter-token gaps kept for one request.
const maxITLPerRequest = 1 << 16

// hasOutput reports whether a chunk carries generated output: content,
// a refusal, a tool-call delta or reasoning text (reasoning_content or
// reasoning, as vLLM and SGLang send it).
func hasOutput(c *openai.ChatCompletionChunk) bool {
	for i := range c.Choices {
		d := &c.Choices[i].Delta
		if d.Content != "" || d.Refusal != "" || len(d.ToolCalls) > 0 {
			return true
		}
		for _, k := range [...]string{"reasoning_content", "reasoning"} {
			if f, ok := d.JSON.ExtraFields[k]; ok && f.Valid() && f.Raw() != `""` && f.Raw() != "null" {
				return true
			}
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// limitedBody fails a read past its limit instead of buffering without
// bound.
type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errBodyTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
