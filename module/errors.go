package module

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/selection"
)

// OpenAI error types and codes written by ramjet. Clients of the OpenAI API
// dispatch on the HTTP status and on error.type / error.code.
const (
	errTypeInvalidRequest = "invalid_request_error"
	errTypeServer         = "server_error"

	errCodeInvalidJSON      = "invalid_json"
	errCodeInvalidType      = "invalid_type"
	errCodeBodyTooLarge     = "request_too_large"
	errCodeModelNotFound    = "model_not_found"
	errCodeNoReplica        = "no_replica_available"
	errCodeUpstreamFailed   = "upstream_error"
	errCodeUpstreamTimeout  = "upstream_timeout"
	errCodeInternal         = "internal_error"
	errCodeUnknownURL       = "unknown_url"
	errCodeUnsupportedMedia = "unsupported_media_type"
)

// APIError is an error in the OpenAI wire shape:
//
//	{"error":{"message":"...","type":"...","param":null,"code":"..."}}
//
// It is what every HTTP error that ramjet itself produces looks like to a
// client. Param is null unless the error is about one request field.
type APIError struct {
	// Status is the HTTP status code; it is not part of the JSON body.
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *APIError) Error() string {
	return strconv.Itoa(e.Status) + " " + e.Message
}

// newAPIError builds an APIError; an empty param or code becomes JSON null.
func newAPIError(status int, typ, code, param, msg string) *APIError {
	e := &APIError{Status: status, Message: msg, Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// WriteAPIError writes e as an OpenAI-shaped JSON error response. Headers
// already set on w (for example by the client-facing route) are kept, except
// the ones describing a body that is being replaced.
func WriteAPIError(w http.ResponseWriter, e *APIError) {
	body, err := json.Marshal(struct {
		Error *APIError `json:"error"`
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

// requestErrorAPI is the 400 for a body selection.Parse refused: code
// invalid_json for malformed JSON (or nesting deeper than
// selection.MaxDepth), invalid_type for a field of the wrong type; param
// names the field when known.
func requestErrorAPI(err error) *APIError {
	var re *selection.RequestError
	if !errors.As(err, &re) {
		return newAPIError(http.StatusBadRequest, errTypeInvalidRequest, errCodeInvalidJSON, "",
			"the request body could not be parsed")
	}
	if re.Syntax {
		return newAPIError(http.StatusBadRequest, errTypeInvalidRequest, errCodeInvalidJSON, re.Param,
			fmt.Sprintf("the request body is not valid JSON: %s (at byte %d)", re.Msg, re.Offset))
	}
	return newAPIError(http.StatusBadRequest, errTypeInvalidRequest, errCodeInvalidType, re.Param,
		fmt.Sprintf("invalid request: %s (at byte %d)", re.Msg, re.Offset))
}

// apiErrorFromHandler turns an error returned by the rest of the handler
// chain (reverse_proxy and friends) into the OpenAI-shaped error the client
// sees. The original error text is never shown: it may carry an upstream
// address (Caddy's "dial tcp 10.0.0.5:8000: connection refused").
func apiErrorFromHandler(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	status := http.StatusInternalServerError
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		status = he.StatusCode
	}
	switch {
	case status == http.StatusServiceUnavailable:
		return newAPIError(status, errTypeServer, errCodeNoReplica, "",
			"no inference replica is available to serve this request; retry later")
	case status == http.StatusBadGateway:
		return newAPIError(status, errTypeServer, errCodeUpstreamFailed, "",
			"the inference engine could not be reached or failed to answer")
	case status == http.StatusGatewayTimeout:
		return newAPIError(status, errTypeServer, errCodeUpstreamTimeout, "",
			"the inference engine did not answer in time")
	case status == http.StatusRequestEntityTooLarge:
		return newAPIError(status, errTypeInvalidRequest, errCodeBodyTooLarge, "",
			"the request body is too large")
	case status == 499: // Caddy's "client closed request"
		return newAPIError(status, errTypeInvalidRequest, "client_closed_request", "",
			"the client closed the request before the answer was complete")
	case status >= 400 && status < 500:
		msg := http.StatusText(status)
		if msg == "" {
			msg = "the request was refused"
		}
		return newAPIError(status, errTypeInvalidRequest, "", "", msg)
	default:
		return newAPIError(status, errTypeServer, errCodeInternal, "", "internal error")
	}
}
