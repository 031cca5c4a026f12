package metrics

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/usage"
)

// Response accounts one response as it streams to the client: its status,
// whether it is a stream, the time of its first body byte, the usage the
// engine reports in the body (read by a usage.Scanner as the body streams
// past) and its last bytes, to see the SSE end marker. Its methods are
// called on the request's goroutine; the zero value is ready, Reset makes
// it so again (keeping the scanner's buffers).
type Response struct {
	// Status is the final status written, Stream reports a
	// text/event-stream body, First the time of the first body byte of a
	// stream (zero when none was written, and for a body that is not a
	// stream: TTFT is a stream's, and the clock read is saved).
	Status int
	Stream bool
	First  time.Time
	// Start, when set (the request's start, from time.Now), makes First
	// Start plus the monotonic time since: one clock read on the first
	// byte instead of time.Now's two. First is then for differences with
	// times that carry a monotonic reading (TTFT), as Fill's callers use it.
	Start time.Time

	scan  bool
	usage usage.Scanner
	// tail holds the last bytes of the body, to see the SSE end marker.
	tail    [16]byte
	tailLen int
}

// sseDone is the marker of a complete chat/completions stream.
var sseDone = []byte("data: [DONE]")

// WriteHeader records the final status and headers.
func (o *Response) WriteHeader(status int, h http.Header) {
	o.Status = status
	o.Stream = strings.HasPrefix(edge.HeaderValue(h, "Content-Type"), "text/event-stream")
	// Only an uncompressed successful body carries readable usage.
	o.scan = status < 300 && edge.HeaderValue(h, "Content-Encoding") == ""
}

// Write reads one chunk of body (p is only read during the call).
func (o *Response) Write(p []byte) {
	if o.Stream && o.First.IsZero() && len(p) > 0 {
		if o.Start.IsZero() {
			o.First = time.Now()
		} else {
			o.First = o.Start.Add(time.Since(o.Start))
		}
	}
	if o.scan {
		o.usage.Write(p)
	}
	if len(p) >= len(o.tail) {
		o.tailLen = copy(o.tail[:], p[len(p)-len(o.tail):])
	} else {
		keep := min(o.tailLen, len(o.tail)-len(p))
		copy(o.tail[:], o.tail[o.tailLen-keep:o.tailLen])
		o.tailLen = keep + copy(o.tail[keep:], p)
	}
}

// Usage is the usage the body reported, if it was read and had one.
func (o *Response) Usage() (usage.Usage, bool) {
	if !o.scan {
		return usage.Usage{}, false
	}
	return o.usage.Result()
}

// Complete reports that the body reached its end marker: the SSE [DONE],
// or a usage object (the last chunk of a stream with include_usage, the
// response.completed event, the end of a JSON body).
func (o *Response) Complete(hasUsage bool) bool {
	return hasUsage || bytes.Contains(o.tail[:o.tailLen], sseDone)
}

// StatusClientClosed is the status Caddy records when the client went
// away before the response headers (nginx's 499).
const StatusClientClosed = 499

// Canceled reports that the client went away before the response ended.
// status is the status the request ended with, err the handler chain's
// error and clientGone that the request's context ended. Caddy records
// 499 when that happens before the headers, and aborts the handler
// (http.ErrAbortHandler) after them; a client that closes right after the
// end marker got a complete response.
func (o *Response) Canceled(status int, err error, clientGone, hasUsage bool) bool {
	switch {
	case status == StatusClientClosed:
		return true
	case err == nil: // clientGone is not read without an error (callers may skip finding it)
		return false
	}
	if clientGone || errors.Is(err, context.Canceled) || errors.Is(err, http.ErrAbortHandler) {
		return !(status < 300 && o.Complete(hasUsage))
	}
	return false
}

// Fill sets the response side of x: stream, first byte, status (the one
// the request ended with), usage and whether the client went away first
// (Canceled; err is the handler chain's error, clientGone that the
// request's context ended).
func (o *Response) Fill(x *Exchange, status int, err error, clientGone bool) {
	x.Stream, x.FirstByte, x.Status = o.Stream, o.First, status
	x.Usage, x.HasUsage = o.Usage()
	x.Canceled = o.Canceled(status, err, clientGone, x.HasUsage)
}

// Reset readies o for another response.
func (o *Response) Reset() {
	o.usage.Reset()
	// Field by field: the scanner is not copied out and back.
	o.Status, o.Stream, o.First, o.Start, o.scan, o.tail, o.tailLen = 0, false, time.Time{}, time.Time{}, false, [16]byte{}, 0
}
