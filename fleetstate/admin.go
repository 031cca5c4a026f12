package fleetstate

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/ramjet-llm/ramjet/selection"
)

// Fleets is the answer of GET /ramjet/fleet.
type Fleets struct {
	Fleets []State `json:"fleets"`
}

// FleetsOf is the answer of GET /ramjet/fleet for snaps: every fleet, or
// only the one named want when want is not empty (ok false when none is).
func FleetsOf(snaps []Snapshot, want string) (out Fleets, ok bool) {
	out.Fleets = []State{}
	for _, s := range snaps {
		if want == "" || want == s.Key {
			out.Fleets = append(out.Fleets, s.State())
		}
	}
	return out, want == "" || len(out.Fleets) > 0
}

// ReadExplain reads a POST /ramjet/explain request: the endpoint of its
// path query (default /v1/chat/completions) and its body, at most max
// bytes. On error, status is the HTTP status to answer with.
func ReadExplain(w http.ResponseWriter, r *http.Request, max int64) (ep selection.Endpoint, body []byte, status int, err error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		p = "/v1/chat/completions"
	}
	ep = selection.EndpointForPath(p)
	if ep == selection.EndpointUnknown {
		return ep, nil, http.StatusBadRequest, fmt.Errorf("path %q is not a chat, completions or responses route", p)
	}
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return ep, nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body larger than %d bytes", max)
		}
		return ep, nil, http.StatusBadRequest, fmt.Errorf("reading request body: %w", err)
	}
	return ep, body, http.StatusOK, nil
}
