package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/openai/openai-go/v3"
)

// ErrorKind names why a request did not complete. The empty kind means it
// completed.
type ErrorKind string

// The error kinds, a bounded set.
const (
	ErrNone     ErrorKind = ""
	ErrConnect  ErrorKind = "connect"   // dial, refused, reset before a response
	ErrTimeout  ErrorKind = "timeout"   // the per-request timeout expired
	ErrCanceled ErrorKind = "canceled"  // the run was stopped
	ErrHTTP4xx  ErrorKind = "http_4xx"  // the server answered 400-499 (but 429)
	ErrHTTP429  ErrorKind = "http_429"  // the server answered 429
	ErrHTTP5xx  ErrorKind = "http_5xx"  // the server answered 500-599
	ErrStream   ErrorKind = "stream"    // the stream broke or carried an error event
	ErrNoTokens ErrorKind = "no_tokens" // the stream ended without any output token
	ErrNoUsage  ErrorKind = "no_usage"  // the stream ended without a usage chunk
	ErrOther    ErrorKind = "other"
)

// Result is what one request did. Durations are measured on the client
// from the moment the request was handed to the HTTP client.
type Result struct {
	// Index is the request's position in the trace.
	Index int `json:"index"`
	// Session and Turn identify the conversation turn.
	Session int `json:"session"`
	Turn    int `json:"turn"`
	// Scheduled is when the trace wanted the request sent, Sent when it was
	// sent, both since the start of the run.
	Scheduled time.Duration `json:"scheduled_ns"`
	Sent      time.Duration `json:"sent_ns"`
	// TTFT is the time to the first output token (content, reasoning or
	// tool-call delta); E2E the time to the end of the stream.
	TTFT time.Duration `json:"ttft_ns"`
	E2E  time.Duration `json:"e2e_ns"`
	// Chunks is the number of chunks that carried output.
	Chunks int `json:"chunks"`
	// WantPrompt and WantOutput are the token counts the trace asked for.
	WantPrompt int `json:"want_prompt_tokens"`
	WantOutput int `json:"want_output_tokens"`
	// PromptTokens, CachedTokens and OutputTokens are the server's usage.
	PromptTokens int  `json:"prompt_tokens"`
	CachedTokens int  `json:"cached_tokens"`
	OutputTokens int  `json:"output_tokens"`
	UsageSeen    bool `json:"usage_seen"`
	// Routed is the wall time from the send to the engine's receipt of
	// the request (the engine simulator's X-Sim-Received response header:
	// the router's hold, a precise router's preflight wait included); 0
	// without the header.
	Routed time.Duration `json:"routed_ns,omitempty"`
	// TokenizeStart and TokenizeEnd are when an engine served a /tokenize
	// call for the request's messages, from the send (the engine
	// simulator's X-Sim-Tokenized header, with a TokenizeLog): a router's
	// preflight. One that ended before Routed and began after the send
	// was waited for; 0 without the header.
	TokenizeStart time.Duration `json:"tokenize_start_ns,omitempty"`
	TokenizeEnd   time.Duration `json:"tokenize_end_ns,omitempty"`
	// Upstream is the upstream header the response carried, if any.
	Upstream string `json:"upstream,omitempty"`
	// Status is the HTTP status, 0 when no response arrived.
	Status int `json:"status"`
	// Err is why the request failed, empty when it completed; ErrMsg
	// carries the detail.
	Err    ErrorKind `json:"error,omitempty"`
	ErrMsg string    `json:"error_message,omitempty"`

	// itl holds the gaps between output chunks until the collector folds
	// them into its histogram.
	itl []time.Duration
	// messages is how many chat messages the request carried.
	messages int
	// reply is the streamed assistant text, kept only when the next turn
	// of the session needs it.
	reply string
}

// OK reports whether the request completed.
func (r *Result) OK() bool { return r.Err == ErrNone }

// classify maps an error from the SDK or the stream to its kind.
func classify(ctx context.Context, err error) ErrorKind {
	if err == nil {
		return ErrNone
	}
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.StatusCode == http.StatusTooManyRequests:
			return ErrHTTP429
		case apiErr.StatusCode >= 500:
			return ErrHTTP5xx
		case apiErr.StatusCode >= 400:
			return ErrHTTP4xx
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return ErrTimeout
	case errors.Is(err, context.Canceled):
		if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return ErrTimeout
		}
		return ErrCanceled
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return ErrConnect
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return ErrConnect
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, errBodyTooLarge) {
		return ErrStream
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return ErrTimeout
	}
	return ErrOther
}

var errBodyTooLarge = fmt.Errorf("response body exceeds the limit")
