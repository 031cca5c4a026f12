package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/dustin/go-humanize"

	"github.com/ramjet-llm/ramjet/selection"
)

// OpenAI error types and codes written by ramjet. Clients of the OpenAI API
// dispatch on the HTTP status and on error.type / error.code.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"

	CodeInvalidJSON      = "invalid_json"
	CodeInvalidType      = "invalid_type"
	CodeBodyTooLarge     = "request_too_large"
	CodeModelNotFound    = "model_not_found"
	CodeNoReplica        = "no_replica_available"
	CodeUpstreamFailed   = "upstream_error"
	CodeUpstreamTimeout  = "upstream_timeout"
	CodeInternal         = "internal_error"
	CodeUnknownURL       = "unknown_url"
	CodeUnsupportedMedia = "unsupported_media_type"
)

// Error is an error in the OpenAI wire shape:
//
//	{"error":{"message":"...","type":"...","param":null,"code":"..."}}
//
// It is what every HTTP error that ramjet itself produces looks like to a
// client. Param is null unless the error is about one request field.
type Error struct {
	// Status is the HTTP status code; it is not part of the JSON body.
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *Error) Error() string {
	return strconv.Itoa(e.Status) + " " + e.Message
}

// NewError builds an Error; an empty param or code becomes JSON null.
func NewError(status int, typ, code, param, msg string) *Error {
	e := &Error{Status: status, Message: msg, Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// Write writes e as an OpenAI-shaped JSON error response. Headers already
// set on w (for example by the client-facing route) are kept, except the
// ones describing a body that is being replaced.
func Write(w http.ResponseWriter, e *Error) {
	body, err := json.Marshal(struct {
		Error *Error `json:"error"`
	}{e})
	if err != nil { // cannot happen: only strings
		body = []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	h := w.Header()
	h.Del("Content-Encoding")
	h.Del("Content-Range")
	h.Del("Etag")
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}

// FromRequestError is the 400 for a body selection.Parse refused: code
// invalid_json for malformed JSON (or nesting deeper than
// selection.MaxDepth), invalid_type for a field of the wrong type; param
// names the field when known.
func FromRequestError(err error) *Error {
	var re *selection.RequestError
	if !errors.As(err, &re) {
		return NewError(http.StatusBadRequest, TypeInvalidRequest, CodeInvalidJSON, "",
			"the request body could not be parsed")
	}
	if re.Syntax {
		return NewError(http.StatusBadRequest, TypeInvalidRequest, CodeInvalidJSON, re.Param,
			fmt.Sprintf("the request body is not valid JSON: %s (at byte %d)", re.Msg, re.Offset))
	}
	return NewError(http.StatusBadRequest, TypeInvalidRequest, CodeInvalidType, re.Param,
		fmt.Sprintf("invalid request: %s (at byte %d)", re.Msg, re.Offset))
}

// FromStatus is the OpenAI-shaped error the client sees for a handler
// chain that failed with HTTP status status (no upstream, engine
// unreachable, timeout...). It never carries the original error text,
// which may name an upstream address.
func FromStatus(status int) *Error {
	switch {
	case status == http.StatusServiceUnavailable:
		return NewError(status, TypeServer, CodeNoReplica, "",
			"no inference replica is available to serve this request; retry later")
	case status == http.StatusBadGateway:
		return NewError(status, TypeServer, CodeUpstreamFailed, "",
			"the inference engine could not be reached or failed to answer")
	case status == http.StatusGatewayTimeout:
		return NewError(status, TypeServer, CodeUpstreamTimeout, "",
			"the inference engine did not answer in time")
	case status == http.StatusRequestEntityTooLarge:
		return NewError(status, TypeInvalidRequest, CodeBodyTooLarge, "",
			"the request body is too large")
	case status == 499: // Caddy's "client closed request"
		return NewError(status, TypeInvalidRequest, "client_closed_request", "",
			"the client closed the request before the answer was complete")
	case status >= 400 && status < 500:
		msg := http.StatusText(status)
		if msg == "" {
			msg = "the request was refused"
		}
		return NewError(status, TypeInvalidRequest, "", "", msg)
	default:
		return NewError(status, TypeServer, CodeInternal, "", "internal error")
	}
}

// TooLarge is the 413 for a body over limit bytes.
func TooLarge(limit int64) *Error {
	return NewError(http.StatusRequestEntityTooLarge, TypeInvalidRequest, CodeBodyTooLarge, "",
		fmt.Sprintf("the request body is larger than the limit of %s", humanize.IBytes(uint64(limit))))
}

// ModelNotFound is the 404 for a model the fleet does not serve.
func ModelNotFound(model string) *Error {
	return NewError(http.StatusNotFound, TypeInvalidRequest, CodeModelNotFound, "model",
		fmt.Sprintf("The model `%s` does not exist.", model))
}

// NotFoundRoute is the 404 for a path outside the allowed ones.
func NotFoundRoute() *Error {
	return NewError(http.StatusNotFound, TypeInvalidRequest, CodeUnknownURL, "",
		"Unknown request URL. This server serves only the OpenAI API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models) and /health.")
}

// StreamCutEvent ends an SSE stream the engine cut: an OpenAI-shaped error
// in an "error" event (the OpenAI SDKs turn a data object with an "error"
// field into a stream error).
var StreamCutEvent = func() []byte {
	e := NewError(http.StatusBadGateway, TypeServer, CodeUpstreamFailed, "",
		"the engine stopped before the end of the response")
	b, _ := json.Marshal(struct {
		Error *Error `json:"error"`
	}{e})
	return []byte("event: error\ndata: " + string(b) + "\n\n")
}()
